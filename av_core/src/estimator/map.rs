//! The `map` update: the maximum a posteriori fit of the histograms, by Newton iterated to
//! convergence (docs/estimator.md).
//!
//! For the statistics of the memory plus the open round ([`super::histogram`]), each non-empty
//! bin contributes `N` labeled drafts, `A` accepted, at the bin's mean feature `x̄`. With
//! `θ = (ω, β_0 … β_{K−1})`, the log-likelihood is `Σ_bins A log p + (N − A) log(1 − p)` with
//! `p = σ(ω x̄ + β_k)`, and the prior is Gaussian with mean `μ = (init_slope, init_intercept·1)`
//! and precision `P`:
//!
//! * `P₀₀ = prior_slope_sd⁻²` (real pairs fit slopes of 0.44–0.6), no slope–intercept terms;
//! * intercepts shrunk hierarchically toward a linear trend in depth,
//!   `β_k = level + trend·z_k + ε_k`, `z_k = k − (K−1)/2`, `level ~ N(init_intercept,
//!   σ₀²)`, `trend ~ N(0, σ₁²)`, `ε_k ~ N(0, σ_b²)`. Integrating level and trend out gives the
//!   intercept block `Λ = σ_b⁻² (I − c₀ 11ᵀ − c₁ zzᵀ)` with `c₀ = σ₀²/(σ_b² + Kσ₀²)` and
//!   `c₁ = σ₁²/(σ_b² + |z|²σ₁²)` (exact, since `1 ⊥ z`). An infinite width is no prior on that
//!   part; `σ₁ = 0` shrinks toward the mean alone.
//!
//! Each iteration computes, per bin, `p`, `w = N p(1 − p)`, `r = A − N p`; the score
//! `g = (Σ r x̄, Σ_b r per k)` and the arrowhead Hessian `(Σ w x̄², Σ_b w x̄, Σ_b w)`; then solves
//! `(H + P + λI)_FF Δ = (g − P(θ − μ))_F` over the free set `F` (the slope and every position
//! with a label: a position without one keeps its intercept), in `O(K)` by the system's
//! structure ([`newton_step`]: arrowhead plus the prior's rank-2 intercept block; the tests
//! hold it to a dense Cholesky of the same system). A step longer than
//! one log-odd in any coordinate is scaled back to one; a slope that would go negative is held
//! at 0 (and leaves `F`); the iteration stops when the longest step is below `10⁻⁶`, after 16
//! iterations, or when the system is not positive definite. `λ` (`l2`) only guards the
//! Hessian's diagonal; it does not enter the gradient, so it does not move the optimum.
//!
//! Every sum runs over the bins in ascending `(k, b)` order, in four lanes combined in a fixed
//! order, with a logistic that fuses nothing ([`super::logistic::exp_neg`]), and the solve is
//! a fixed sequence of plain float operations: the same statistics and starting point give the
//! same bits on every machine.

use super::histogram::{Binning, HistogramMemory, HistogramStats, X_SCALE};
use super::logistic::exp_neg;
use crate::simd;

/// Most Newton iterations of one fit.
pub const MAX_ITERATIONS: u32 = 16;
/// The fit has converged when no coordinate moves by this much in an iteration.
pub const TOLERANCE: f64 = 1e-6;
/// Largest change of any coefficient in one iteration (log-odds).
pub const ITERATION_CAP: f64 = 1.0;

/// The prior's standard deviations (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PriorWidths {
    /// Slope ω (`inf`: no slope prior).
    pub slope_sd: f64,
    /// The intercepts' common level σ₀ (`inf`: unpenalized).
    pub level_sd: f64,
    /// Their trend in depth σ₁ (`0`: toward the mean alone; `inf`: unpenalized).
    pub trend_sd: f64,
    /// Each intercept's spread around the trend σ_b (`inf`: independent, unpenalized
    /// intercepts).
    pub spread_sd: f64,
}

impl PriorWidths {
    /// The defaults of docs/estimator.md.
    pub const DEFAULT: PriorWidths = PriorWidths {
        slope_sd: 0.15,
        level_sd: 1.0,
        trend_sd: 0.2,
        spread_sd: 0.1,
    };
}

/// The prior: its mean and its precision `P`, held by its structure (module docs): the slope's
/// precision `P₀₀`, and the intercept block `τ (I − c₀ 11ᵀ − c₁ zzᵀ)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prior {
    /// `μ`, `K + 1` entries (slope first).
    pub mean: Vec<f64>,
    /// `P₀₀ = σ_ω⁻²` (0: no slope prior).
    pub slope_precision: f64,
    /// `τ = σ_b⁻²` (0: no intercept prior).
    pub tau: f64,
    /// `c₀`, the weight of the common level.
    pub c0: f64,
    /// `c₁`, the weight of the trend.
    pub c1: f64,
    /// `z_k = k − (K−1)/2`.
    pub z: Vec<f64>,
}

impl Prior {
    /// The prior for `num_positions` positions (widths already validated).
    pub fn new(
        num_positions: usize,
        widths: &PriorWidths,
        init_slope: f64,
        init_intercept: f64,
    ) -> Self {
        let k = num_positions;
        let kf = k as f64;
        let z: Vec<f64> = (0..k).map(|j| j as f64 - (kf - 1.0) / 2.0).collect();
        let slope_precision = if widths.slope_sd.is_finite() {
            1.0 / (widths.slope_sd * widths.slope_sd)
        } else {
            0.0
        };
        let (mut tau, mut c0, mut c1) = (0.0, 0.0, 0.0);
        if widths.spread_sd.is_finite() {
            let spread2 = widths.spread_sd * widths.spread_sd;
            tau = 1.0 / spread2;
            c0 = if widths.level_sd.is_finite() {
                let level2 = widths.level_sd * widths.level_sd;
                level2 / (spread2 + kf * level2)
            } else {
                1.0 / kf
            };
            let zz: f64 = z.iter().map(|v| v * v).sum();
            c1 = if k == 1 || widths.trend_sd == 0.0 {
                0.0
            } else if widths.trend_sd.is_finite() {
                let trend2 = widths.trend_sd * widths.trend_sd;
                trend2 / (spread2 + zz * trend2)
            } else {
                1.0 / zz
            };
        }
        let mut mean = vec![init_intercept; k + 1];
        mean[0] = init_slope;
        Prior {
            mean,
            slope_precision,
            tau,
            c0,
            c1,
            z,
        }
    }

    /// No prior on `num_positions` positions (`P = 0`, `μ = 0`).
    pub fn none(num_positions: usize) -> Self {
        Prior {
            mean: vec![0.0; num_positions + 1],
            z: vec![0.0; num_positions],
            ..Prior::default()
        }
    }

    /// `P` as a dense `(K+1)²` matrix, row-major, slope first (the tests' reference).
    #[cfg(test)]
    pub fn precision(&self) -> Vec<f64> {
        let k = self.z.len();
        let dim = k + 1;
        let mut precision = vec![0.0; dim * dim];
        precision[0] = self.slope_precision;
        if self.tau != 0.0 {
            for i in 0..k {
                for j in 0..k {
                    let identity = if i == j { 1.0 } else { 0.0 };
                    precision[(i + 1) * dim + j + 1] =
                        self.tau * (identity - self.c0 - self.c1 * self.z[i] * self.z[j]);
                }
            }
        }
        precision
    }

    /// `P d` for a deviation `d` from the mean (slope first), in `O(K)`.
    fn pull(&self, d: &[f64], out: &mut [f64]) {
        let intercepts = &d[1..];
        let level: f64 = intercepts.iter().sum();
        let trend: f64 = self.z.iter().zip(intercepts).map(|(z, d)| z * d).sum();
        out[0] = self.slope_precision * d[0];
        for ((o, &dk), &zk) in out[1..].iter_mut().zip(intercepts).zip(&self.z) {
            *o = self.tau * (dk - self.c0 * level - self.c1 * zk * trend);
        }
    }
}

/// The non-empty bins of a fit's statistics, gathered once in ascending `(k, b)` order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FitBins {
    /// Bins of position `k` are `starts[k]..starts[k + 1]`.
    pub starts: Vec<usize>,
    /// Labeled drafts `N`.
    pub n: Vec<f64>,
    /// Accepted drafts `A`.
    pub a: Vec<f64>,
    /// Mean feature `x̄`.
    pub x: Vec<f64>,
}

impl FitBins {
    /// The bins of `memory + round` (either may be absent; the layouts must match).
    pub fn gather(
        memory: Option<&HistogramMemory>,
        round: Option<&HistogramStats>,
        binning: &Binning,
        num_positions: usize,
    ) -> Self {
        let limit = binning.limit();
        // A round's bin as it adds to the memory's (`n`, `a`, `Σx` in feature units), when it
        // holds labels.
        let round_bin = |r: &HistogramStats, index: usize| {
            let count = r.count[index];
            (count != 0).then(|| {
                let c = count as f64;
                (
                    c,
                    r.accepted[index] as f64,
                    r.x_sum[index] as f64 / X_SCALE - limit * c,
                )
            })
        };
        // One loop per case, so that none tests which inputs it has per bin; the same
        // arithmetic in each (the sums start from the memory's values, or from 0).
        match (memory, round) {
            (Some(m), Some(r)) => Self::collect(num_positions, binning.bins(), |index| {
                let (mut n, mut a, mut x) = (m.count[index], m.accepted[index], m.x_sum[index]);
                if let Some((c, accepted, sum)) = round_bin(r, index) {
                    n += c;
                    a += accepted;
                    x += sum;
                }
                (n, a, x)
            }),
            (Some(m), None) => Self::collect(num_positions, binning.bins(), |index| {
                (m.count[index], m.accepted[index], m.x_sum[index])
            }),
            (None, Some(r)) => Self::collect(num_positions, binning.bins(), |index| {
                let (mut n, mut a, mut x) = (0.0, 0.0, 0.0);
                if let Some((c, accepted, sum)) = round_bin(r, index) {
                    n += c;
                    a += accepted;
                    x += sum;
                }
                (n, a, x)
            }),
            (None, None) => Self::collect(num_positions, binning.bins(), |_| (0.0, 0.0, 0.0)),
        }
    }

    /// The non-empty bins among `(n, a, Σx) = bin(k·B + b)`, in ascending `(k, b)` order.
    #[inline(always)]
    fn collect(num_positions: usize, bins: usize, bin: impl Fn(usize) -> (f64, f64, f64)) -> Self {
        let len = num_positions * bins;
        let mut out = FitBins {
            starts: Vec::with_capacity(num_positions + 1),
            n: Vec::with_capacity(len),
            a: Vec::with_capacity(len),
            x: Vec::with_capacity(len),
        };
        out.starts.push(0);
        for k in 0..num_positions {
            for index in k * bins..(k + 1) * bins {
                let (n, a, x) = bin(index);
                if n > 0.0 {
                    out.n.push(n);
                    out.a.push(a);
                    out.x.push(x / n);
                }
            }
            out.starts.push(out.n.len());
        }
        out
    }

    /// Positions K.
    pub fn num_positions(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Whether position `k` holds a label.
    pub fn has_labels(&self, k: usize) -> bool {
        self.starts[k + 1] > self.starts[k]
    }
}

/// The score and the arrowhead Hessian of the log-likelihood at one `θ`.
#[derive(Clone, Debug, PartialEq)]
pub struct Terms {
    /// Score, slope first (`K + 1`).
    pub g: Vec<f64>,
    /// `Σ w x̄²`.
    pub h00: f64,
    /// `Σ_b w x̄` per position.
    pub h0k: Vec<f64>,
    /// `Σ_b w` per position.
    pub hkk: Vec<f64>,
}

const LANES: usize = 4;

/// Sums four lanes in a fixed order.
#[inline(always)]
fn combine(lanes: [f64; LANES]) -> f64 {
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}

/// The score and Hessian of `bins` at `theta` (slope first).
///
/// Lane `l` of a position sums its bins `l, l + 4, …` of the whole groups of four, then the
/// remainder's bin `whole + l`; the lanes combine in a fixed order. Groups of four run as
/// fixed-size arrays, so they vectorize (on the variant for this CPU's vector unit:
/// [`crate::simd`]); the lanes and the operations in each are the same whatever the width, and
/// nothing fuses, so every variant gives the same bits.
pub fn terms(bins: &FitBins, theta: &[f64]) -> Terms {
    terms_at(simd::level(), bins, theta)
}

/// [`terms`] on the variant for `level`, which must be one this CPU runs.
pub(crate) fn terms_at(level: simd::Level, bins: &FitBins, theta: &[f64]) -> Terms {
    #[cfg(target_arch = "x86_64")]
    if level >= simd::Level::Avx2 {
        // SAFETY: `terms_avx2` only requires the CPU features it is compiled with (`avx2,fma`);
        // `level` is `Avx2` or wider only when `simd::available` confirmed both on this CPU
        // with `is_x86_feature_detected!`.
        return unsafe { x86::terms_avx2(bins, theta) };
    }
    let _ = level;
    terms_generic(bins, theta)
}

/// The kernel compiled for AVX2 (the same code, one 4-wide vector per group).
#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn terms_avx2(bins: &super::FitBins, theta: &[f64]) -> super::Terms {
        super::terms_generic(bins, theta)
    }
}

#[inline(always)]
fn terms_generic(bins: &FitBins, theta: &[f64]) -> Terms {
    let k = bins.num_positions();
    let slope = theta[0];
    let mut out = Terms {
        g: vec![0.0; k + 1],
        h00: 0.0,
        h0k: vec![0.0; k],
        hkk: vec![0.0; k],
    };
    let (mut g0, mut h00) = ([0.0; LANES], [0.0; LANES]);
    for position in 0..k {
        let beta = theta[position + 1];
        let range = bins.starts[position]..bins.starts[position + 1];
        let (n, a, x) = (
            &bins.n[range.clone()],
            &bins.a[range.clone()],
            &bins.x[range],
        );
        let (mut r_sum, mut wx_sum, mut w_sum) = ([0.0; LANES], [0.0; LANES], [0.0; LANES]);
        // One bin's terms, added to lane `l`'s sums.
        let mut add = |l: usize, n: f64, a: f64, x: f64, e: f64| {
            let p = 1.0 / (1.0 + e);
            let q = e * p; // 1 − p, without the cancellation
            let w = n * p * q;
            let r = a - n * p;
            let wx = w * x;
            g0[l] += r * x;
            h00[l] += wx * x;
            r_sum[l] += r;
            wx_sum[l] += wx;
            w_sum[l] += w;
        };
        let groups = n
            .chunks_exact(LANES)
            .zip(a.chunks_exact(LANES))
            .zip(x.chunks_exact(LANES));
        for ((n, a), x) in groups {
            let (n, a, x): (&[f64; LANES], &[f64; LANES], &[f64; LANES]) =
                (as_lanes(n), as_lanes(a), as_lanes(x));
            let mut e = [0.0; LANES];
            for l in 0..LANES {
                e[l] = exp_neg(slope * x[l] + beta); // e^(−z)
            }
            for l in 0..LANES {
                add(l, n[l], a[l], x[l], e[l]);
            }
        }
        let whole = n.len() / LANES * LANES;
        for i in whole..n.len() {
            add(i - whole, n[i], a[i], x[i], exp_neg(slope * x[i] + beta));
        }
        out.g[position + 1] = combine(r_sum);
        out.h0k[position] = combine(wx_sum);
        out.hkk[position] = combine(w_sum);
    }
    out.g[0] = combine(g0);
    out.h00 = combine(h00);
    out
}

/// A chunk of exactly [`LANES`] elements as an array.
#[inline(always)]
fn as_lanes(chunk: &[f64]) -> &[f64; LANES] {
    chunk
        .try_into()
        .expect("chunks_exact yields LANES elements")
}

/// The drift test's statistic `T = gᵀ (H + λI)⁻¹ g` of `bins` at `theta`: about χ² with `K + 1`
/// degrees of freedom while `theta` still fits the workload (∞ if the system cannot be solved).
/// The arrowhead is solved as the fit's step is, with no prior ([`newton_step`]).
pub fn score_statistic(bins: &FitBins, theta: &[f64], l2: f64) -> f64 {
    let t = terms(bins, theta);
    let k = bins.num_positions();
    match newton_step(&t, &Prior::none(k), &vec![true; k + 1], l2, &t.g) {
        Some(step) => t.g.iter().zip(&step).map(|(g, d)| g * d).sum(),
        None => f64::INFINITY,
    }
}

/// The outcome of [`fit`].
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    /// The fitted `θ`, slope first, before the estimator's bounds.
    pub theta: Vec<f64>,
    /// Newton iterations run.
    pub iterations: u32,
}

/// The Newton step of [`fit`]: solves `(H + P + λI)_FF Δ_F = r_F` for the free set `F`
/// (`free[i]`: coordinate `i`, slope first), `Δ = 0` elsewhere; `None` when the system is not
/// positive definite (or not finite).
///
/// The intercept block is `A = D − V C Vᵀ` with `D = diag(H_kk + τ + λ)`, `V = [1, z]` and
/// `C = τ diag(c₀, c₁)`, so by Woodbury `A⁻¹y = D⁻¹y + D⁻¹V C E⁻¹ Vᵀ D⁻¹ y` with the 2 × 2
/// `E = I − Vᵀ D⁻¹ V C`; the slope is then eliminated through its Schur complement
/// `a − bᵀ A⁻¹ b` (`a = H₀₀ + P₀₀ + λ`, `b = H₀ₖ`). `A` is positive definite exactly when
/// `D` is and `E` has a positive first pivot and determinant (`E` is similar to the symmetric
/// `I − C^½ Vᵀ D⁻¹ V C^½`), and the whole system when the Schur complement is positive too:
/// the conditions a dense Cholesky checks, in `O(K)` instead of `O(K³)`.
pub fn newton_step(
    t: &Terms,
    prior: &Prior,
    free: &[bool],
    l2: f64,
    r: &[f64],
) -> Option<Vec<f64>> {
    let k = t.hkk.len();
    let (c0, c1) = (prior.tau * prior.c0, prior.tau * prior.c1);
    let z = &prior.z;
    let mut inv_d = vec![0.0; k];
    let (mut w11, mut w12, mut w22) = (0.0, 0.0, 0.0);
    for j in (0..k).filter(|&j| free[j + 1]) {
        let d = t.hkk[j] + prior.tau + l2;
        if !(d > 0.0 && d.is_finite()) {
            return None;
        }
        inv_d[j] = 1.0 / d;
        w11 += inv_d[j];
        w12 += z[j] * inv_d[j];
        w22 += z[j] * z[j] * inv_d[j];
    }
    let (e11, e12, e21, e22) = (1.0 - w11 * c0, -w12 * c1, -w12 * c0, 1.0 - w22 * c1);
    let det = e11 * e22 - e12 * e21;
    if !(e11 > 0.0 && det > 0.0 && det.is_finite()) {
        return None;
    }
    // A⁻¹ y over the free intercepts (y[j] for intercept j; 0 off the free set).
    let solve = |y: &dyn Fn(usize) -> f64| -> Vec<f64> {
        let (mut q1, mut q2) = (0.0, 0.0);
        for j in (0..k).filter(|&j| free[j + 1]) {
            let t = y(j) * inv_d[j];
            q1 += t;
            q2 += z[j] * t;
        }
        let (r1, r2) = ((e22 * q1 - e12 * q2) / det, (e11 * q2 - e21 * q1) / det);
        (0..k)
            .map(|j| {
                if free[j + 1] {
                    (y(j) + c0 * r1 + c1 * r2 * z[j]) * inv_d[j]
                } else {
                    0.0
                }
            })
            .collect()
    };
    let a_g = solve(&|j| r[j + 1]);
    let mut step = vec![0.0; k + 1];
    if free[0] {
        let a_b = solve(&|j| t.h0k[j]);
        let on_free = |v: &[f64]| -> f64 {
            (0..k)
                .filter(|&j| free[j + 1])
                .map(|j| t.h0k[j] * v[j])
                .sum()
        };
        let schur = t.h00 + prior.slope_precision + l2 - on_free(&a_b);
        if !(schur > 0.0 && schur.is_finite()) {
            return None;
        }
        let slope = (r[0] - on_free(&a_g)) / schur;
        step[0] = slope;
        for j in 0..k {
            step[j + 1] = a_g[j] - slope * a_b[j];
        }
    } else {
        step[1..].copy_from_slice(&a_g);
    }
    step.iter().all(|d| d.is_finite()).then_some(step)
}

/// The MAP fit of `bins` under `prior`, by Newton from `start` (see the module docs).
pub fn fit(bins: &FitBins, prior: &Prior, start: &[f64], l2: f64) -> Fit {
    let k = bins.num_positions();
    let dim = k + 1;
    let mut theta = start.to_vec();
    let mut free: Vec<bool> = std::iter::once(true)
        .chain((0..k).map(|position| bins.has_labels(position)))
        .collect();
    let mut deviation = vec![0.0; dim];
    let mut rhs = vec![0.0; dim];
    let mut iterations = 0;
    while iterations < MAX_ITERATIONS {
        iterations += 1;
        let t = terms(bins, &theta);
        if !free.iter().any(|&f| f) {
            break;
        }
        for ((d, &value), &mean) in deviation.iter_mut().zip(&theta).zip(&prior.mean) {
            *d = value - mean;
        }
        prior.pull(&deviation, &mut rhs);
        for (r, &g) in rhs.iter_mut().zip(&t.g) {
            *r = g - *r;
        }
        let Some(mut step) = newton_step(&t, prior, &free, l2, &rhs) else {
            break;
        };
        let largest = step.iter().fold(0.0f64, |m, d| m.max(d.abs()));
        if largest > ITERATION_CAP {
            let scale = ITERATION_CAP / largest;
            step.iter_mut().for_each(|d| *d *= scale);
        }
        for ((value, &d), &is_free) in theta.iter_mut().zip(&step).zip(&free) {
            if is_free {
                *value += d;
            }
        }
        if theta[0] < 0.0 {
            // The slope may not go negative: hold it at 0 for the rest of the fit.
            theta[0] = 0.0;
            free[0] = false;
        }
        if largest < TOLERANCE {
            break;
        }
    }
    Fit { theta, iterations }
}

/// The bins of a round alone, for its drift test.
pub(crate) fn round_bins(round: &HistogramStats, binning: &Binning) -> FitBins {
    FitBins::gather(None, Some(round), binning, round.num_positions)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod examples;
