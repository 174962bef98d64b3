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
mod tests {
    use super::*;
    use crate::test_rng::XorShift;

    /// A dense reference: the prior precision built by inverting the covariance
    /// `σ₀² 11ᵀ + σ₁² zzᵀ + σ_b² I` with Gauss–Jordan, independently of the closed form.
    fn precision_by_inversion(k: usize, w: &PriorWidths) -> Vec<f64> {
        let z: Vec<f64> = (0..k).map(|j| j as f64 - (k as f64 - 1.0) / 2.0).collect();
        let mut cov = vec![0.0; k * k];
        for i in 0..k {
            for j in 0..k {
                cov[i * k + j] = w.level_sd.powi(2)
                    + w.trend_sd.powi(2) * z[i] * z[j]
                    + if i == j { w.spread_sd.powi(2) } else { 0.0 };
            }
        }
        let mut inv = vec![0.0; k * k];
        for i in 0..k {
            inv[i * k + i] = 1.0;
        }
        for col in 0..k {
            let pivot = cov[col * k + col];
            for j in 0..k {
                cov[col * k + j] /= pivot;
                inv[col * k + j] /= pivot;
            }
            for row in 0..k {
                if row != col {
                    let f = cov[row * k + col];
                    for j in 0..k {
                        cov[row * k + j] -= f * cov[col * k + j];
                        inv[row * k + j] -= f * inv[col * k + j];
                    }
                }
            }
        }
        inv
    }

    #[test]
    fn the_closed_form_precision_inverts_the_hierarchical_covariance() {
        for k in [1usize, 2, 4, 7, 16] {
            for widths in [
                PriorWidths::DEFAULT,
                PriorWidths {
                    trend_sd: 0.0,
                    ..PriorWidths::DEFAULT
                },
                PriorWidths {
                    slope_sd: 0.3,
                    level_sd: 2.5,
                    trend_sd: 0.7,
                    spread_sd: 0.4,
                },
            ] {
                let prior = Prior::new(k, &widths, 0.5, -0.2);
                let want = precision_by_inversion(k, &widths);
                let dim = k + 1;
                for i in 0..k {
                    for j in 0..k {
                        let got = prior.precision()[(i + 1) * dim + j + 1];
                        let w = want[i * k + j];
                        assert!((got - w).abs() <= 1e-8 * (1.0 + w.abs()), "{k} {i} {j}");
                    }
                    assert_eq!(prior.precision()[i + 1], 0.0);
                }
            }
        }
        // Infinite widths are the limits: no prior at all.
        let none = PriorWidths {
            slope_sd: f64::INFINITY,
            level_sd: 1.0,
            trend_sd: 0.2,
            spread_sd: f64::INFINITY,
        };
        assert!(Prior::new(4, &none, 0.5, -0.2)
            .precision()
            .iter()
            .all(|&p| p == 0.0));
    }

    /// The dense reference of [`fit`]: the same iteration with the system assembled as a dense
    /// `(H + P + λI)_FF` and solved by Cholesky (how the fit was first written).
    fn fit_dense(bins: &FitBins, prior: &Prior, start: &[f64], l2: f64) -> Fit {
        let k = bins.num_positions();
        let dim = k + 1;
        let precision = prior.precision();
        let mut theta = start.to_vec();
        let mut free: Vec<bool> = std::iter::once(true)
            .chain((0..k).map(|position| bins.has_labels(position)))
            .collect();
        let mut iterations = 0;
        while iterations < MAX_ITERATIONS {
            iterations += 1;
            let t = terms(bins, &theta);
            let index: Vec<usize> = (0..dim).filter(|&i| free[i]).collect();
            if index.is_empty() {
                break;
            }
            let (mut matrix, mut rhs) = (Vec::new(), Vec::new());
            for &i in &index {
                let row = &precision[i * dim..(i + 1) * dim];
                let pull: f64 = (0..dim).map(|j| row[j] * (theta[j] - prior.mean[j])).sum();
                rhs.push(t.g[i] - pull);
                for &j in &index {
                    let hessian = match (i, j) {
                        (0, 0) => t.h00,
                        (0, j) => t.h0k[j - 1],
                        (i, 0) => t.h0k[i - 1],
                        (i, j) if i == j => t.hkk[i - 1],
                        _ => 0.0,
                    };
                    matrix.push(hessian + row[j] + if i == j { l2 } else { 0.0 });
                }
            }
            if !crate::estimator::cholesky::solve_spd(&mut matrix, &mut rhs)
                || !rhs.iter().all(|d| d.is_finite())
            {
                break;
            }
            let largest = rhs.iter().fold(0.0f64, |m, d| m.max(d.abs()));
            if largest > ITERATION_CAP {
                rhs.iter_mut().for_each(|d| *d *= ITERATION_CAP / largest);
            }
            for (&i, &d) in index.iter().zip(&rhs) {
                theta[i] += d;
            }
            if theta[0] < 0.0 {
                theta[0] = 0.0;
                free[0] = false;
            }
            if largest < TOLERANCE {
                break;
            }
        }
        Fit { theta, iterations }
    }

    /// Random histograms of `k` positions, some left empty, labels from a logistic curve whose
    /// slope may be 0 or negative (so the fit's slope can hit its bound).
    fn random_bins(rng: &mut XorShift, k: usize, binning: &Binning) -> FitBins {
        let mut round = HistogramStats::new(k, binning.bins());
        let slope = rng.unit_f64() * 1.6 - 0.4;
        let empty = rng.next_u64() % (k as u64 + 1);
        for _ in 0..(20 + rng.next_u64() % 800) {
            let position = (rng.next_u64() % k as u64) as usize;
            if (position as u64) < empty && k > 1 {
                continue;
            }
            let x = rng.unit_f64() * 16.0 - 6.0;
            let p = 1.0 / (1.0 + (-(slope * x + 0.8 - 0.3 * position as f64)).exp());
            round.add_observation(binning, position, x, rng.unit_f64() < p);
        }
        FitBins::gather(None, Some(&round), binning, k)
    }

    fn random_widths(rng: &mut XorShift) -> PriorWidths {
        let mut pick = |values: &[f64]| values[(rng.next_u64() % values.len() as u64) as usize];
        PriorWidths {
            slope_sd: pick(&[0.15, 0.05, 1.0, f64::INFINITY]),
            level_sd: pick(&[1.0, 0.3, 5.0, f64::INFINITY]),
            trend_sd: pick(&[0.2, 0.0, 1.0, f64::INFINITY]),
            spread_sd: pick(&[0.1, 0.02, 0.5, f64::INFINITY]),
        }
    }

    #[test]
    fn the_structured_step_solves_the_dense_system() {
        // Against the dense (H + P + λI)_FF assembled entry by entry and solved by Cholesky, on
        // random Hessians, free sets (the slope held or not, positions without labels) and
        // prior widths, the infinite and zero limits included.
        let binning = Binning::new(40.0, 64);
        let mut rng = XorShift::new(7);
        for case in 0..400 {
            let k = 1 + (rng.next_u64() % 16) as usize;
            let bins = random_bins(&mut rng, k, &binning);
            let prior = Prior::new(k, &random_widths(&mut rng), 0.5, -0.2);
            let theta: Vec<f64> = (0..=k).map(|_| rng.unit_f64() * 2.0 - 1.0).collect();
            let t = terms(&bins, &theta);
            let mut free: Vec<bool> = std::iter::once(rng.next_u64() % 4 != 0)
                .chain((0..k).map(|j| bins.has_labels(j)))
                .collect();
            if case % 7 == 0 {
                free[1 + (rng.next_u64() % k as u64) as usize] = false;
            }
            let l2 = [1e-3, 0.0, 0.5][case % 3];
            let r: Vec<f64> = (0..=k).map(|_| rng.unit_f64() * 20.0 - 10.0).collect();
            let dim = k + 1;
            let precision = prior.precision();
            let index: Vec<usize> = (0..dim).filter(|&i| free[i]).collect();
            let mut matrix = Vec::new();
            for &i in &index {
                for &j in &index {
                    let hessian = match (i, j) {
                        (0, 0) => t.h00,
                        (0, j) => t.h0k[j - 1],
                        (i, 0) => t.h0k[i - 1],
                        (i, j) if i == j => t.hkk[i - 1],
                        _ => 0.0,
                    };
                    let ridge = if i == j { l2 } else { 0.0 };
                    matrix.push(hessian + precision[i * dim + j] + ridge);
                }
            }
            let dense_matrix = matrix.clone();
            let mut dense: Vec<f64> = index.iter().map(|&i| r[i]).collect();
            let solved = crate::estimator::cholesky::solve_spd(&mut matrix, &mut dense);
            let step = newton_step(&t, &prior, &free, l2, &r);
            assert_eq!(step.is_some(), solved, "case {case}");
            let Some(step) = step else { continue };
            for (i, &d) in step.iter().enumerate() {
                if !free[i] {
                    assert_eq!(d, 0.0, "case {case}: fixed coordinate {i} moved");
                }
            }
            // The residual of the dense system at the structured step, relative to its scale.
            let n = index.len();
            let scale = dense_matrix.iter().fold(0.0f64, |m, v| m.max(v.abs()))
                * step.iter().fold(0.0f64, |m, v| m.max(v.abs()))
                + r.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for row in 0..n {
                let lhs: f64 = (0..n)
                    .map(|col| dense_matrix[row * n + col] * step[index[col]])
                    .sum();
                let want = r[index[row]];
                assert!(
                    (lhs - want).abs() <= 1e-10 * scale,
                    "case {case} row {row}: {lhs} vs {want}"
                );
            }
            for (row, &i) in index.iter().enumerate() {
                let d = dense[row];
                assert!(
                    (step[i] - d).abs() <= 1e-8 * (1.0 + d.abs()),
                    "case {case}, coordinate {i}: {} vs {d}",
                    step[i]
                );
            }
        }
    }

    #[test]
    fn the_system_that_is_not_positive_definite_is_refused() {
        // Without prior and ridge: a position whose Hessian vanishes (a zero pivot), and a
        // slope coupled more strongly than its curvature allows (a negative Schur complement);
        // the dense Cholesky refuses both too. A ridge makes the first definite again.
        let none = PriorWidths {
            slope_sd: f64::INFINITY,
            level_sd: f64::INFINITY,
            trend_sd: f64::INFINITY,
            spread_sd: f64::INFINITY,
        };
        let prior = Prior::new(2, &none, 0.5, -0.2);
        let (all, r) = ([true; 3], [1.0; 3]);
        let zero_pivot = Terms {
            g: vec![0.0; 3],
            h00: 1.0,
            h0k: vec![0.0, 0.0],
            hkk: vec![0.0, 1.0],
        };
        assert!(newton_step(&zero_pivot, &prior, &all, 0.0, &r).is_none());
        assert!(newton_step(&zero_pivot, &prior, &all, 1e-3, &r).is_some());
        let indefinite = Terms {
            h0k: vec![2.0, 0.0],
            hkk: vec![1.0, 1.0],
            ..zero_pivot
        };
        assert!(newton_step(&indefinite, &prior, &all, 0.0, &r).is_none());
        let mut dense = [1.0, 2.0, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 1.0];
        assert!(!crate::estimator::cholesky::solve_spd(
            &mut dense,
            &mut [1.0; 3]
        ));
        // Holding the slope leaves a definite intercept block.
        assert!(newton_step(&indefinite, &prior, &[false, true, true], 0.0, &r).is_some());
    }

    #[test]
    fn the_score_statistic_is_the_dense_arrowheads() {
        // Against the statistic of the same arrowhead solved by a dense Cholesky (the drift
        // test's shared `drift_statistic`), positions without labels included.
        use crate::estimator::memory::drift_statistic;
        use crate::estimator::refit::ArrowheadSystem;
        let binning = Binning::new(40.0, 64);
        let mut rng = XorShift::new(5);
        for case in 0..200 {
            let k = 1 + (rng.next_u64() % 16) as usize;
            let bins = random_bins(&mut rng, k, &binning);
            let theta: Vec<f64> = (0..=k).map(|_| rng.unit_f64() * 2.0 - 1.0).collect();
            let l2 = [1e-3, 0.5][case % 2];
            let t = terms(&bins, &theta);
            let dense = drift_statistic(&ArrowheadSystem {
                a: t.h00 + l2,
                b: t.h0k.clone(),
                c: t.hkk.iter().map(|c| c + l2).collect(),
                g0: t.g[0],
                g1: t.g[1..].to_vec(),
                total: 0.0,
                counts: vec![0.0; k],
            });
            let ours = score_statistic(&bins, &theta, l2);
            assert!(
                (ours - dense).abs() <= 1e-9 * (1.0 + dense.abs()),
                "case {case}: {ours} vs {dense}"
            );
        }
        // Without a ridge, a position with no label leaves the system singular: ∞, as before.
        let mut round = HistogramStats::new(2, 64);
        round.add_observation(&binning, 0, 1.0, true);
        let bins = FitBins::gather(None, Some(&round), &binning, 2);
        assert_eq!(score_statistic(&bins, &[0.5, 0.0, 0.0], 0.0), f64::INFINITY);
    }

    #[test]
    fn the_fit_matches_its_dense_reference() {
        let binning = Binning::new(40.0, 64);
        let mut rng = XorShift::new(11);
        for case in 0..200 {
            let k = 1 + (rng.next_u64() % 16) as usize;
            let bins = random_bins(&mut rng, k, &binning);
            let prior = Prior::new(k, &random_widths(&mut rng), 0.5, -0.2);
            let start: Vec<f64> = (0..=k).map(|_| rng.unit_f64() * 2.0 - 1.0).collect();
            let l2 = [1e-3, 0.0][case % 2];
            let (ours, dense) = (
                fit(&bins, &prior, &start, l2),
                fit_dense(&bins, &prior, &start, l2),
            );
            for (a, b) in ours.theta.iter().zip(&dense.theta) {
                assert!(
                    (a - b).abs() <= 1e-8 * (1.0 + b.abs()),
                    "case {case}: {a} vs {b}"
                );
            }
            assert!(
                ours.iterations.abs_diff(dense.iterations) <= 1,
                "case {case}: {} vs {} iterations",
                ours.iterations,
                dense.iterations
            );
        }
    }

    #[test]
    fn the_fit_solves_the_map_equations() {
        // At the returned θ the penalized score vanishes (to the tolerance), checked on random
        // histograms with a dense evaluation of the score independent of `terms`.
        let binning = Binning::new(40.0, 64);
        for seed in 0..20u64 {
            let mut rng = XorShift::new(seed + 1);
            let k = 1 + (seed % 5) as usize;
            let mut round = HistogramStats::new(k, 64);
            for _ in 0..400 {
                let position = (rng.next_u64() % k as u64) as usize;
                let x = rng.unit_f64() * 12.0 - 4.0;
                let p = 1.0 / (1.0 + (-(0.55 * x + 0.3 - 0.2 * position as f64)).exp());
                round.add_observation(&binning, position, x, rng.unit_f64() < p);
            }
            let bins = FitBins::gather(None, Some(&round), &binning, k);
            let prior = Prior::new(k, &PriorWidths::DEFAULT, 0.5, -0.2);
            let start: Vec<f64> = std::iter::once(0.5).chain(vec![-0.2; k]).collect();
            let result = fit(&bins, &prior, &start, 0.0);
            assert!(result.iterations < MAX_ITERATIONS, "seed {seed}");
            let theta = &result.theta;
            let dim = k + 1;
            let mut score = vec![0.0; dim];
            for position in 0..k {
                for i in bins.starts[position]..bins.starts[position + 1] {
                    let z = theta[0] * bins.x[i] + theta[position + 1];
                    let r = bins.a[i] - bins.n[i] / (1.0 + (-z).exp());
                    score[0] += r * bins.x[i];
                    score[position + 1] += r;
                }
            }
            for (i, s) in score.iter().enumerate() {
                let pull: f64 = (0..dim)
                    .map(|j| prior.precision()[i * dim + j] * (theta[j] - prior.mean[j]))
                    .sum();
                assert!((s - pull).abs() < 1e-6, "seed {seed}, coordinate {i}");
            }
        }
    }

    /// `terms` as it was written before its groups were vectorized: lane `i % 4` per bin of
    /// the whole groups, the remainder's bin `i` on lane `i − whole`, one bin at a time.
    fn terms_one_bin_at_a_time(bins: &FitBins, theta: &[f64]) -> Terms {
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
            let whole = n.len() / LANES * LANES;
            for i in 0..n.len() {
                let l = if i < whole { i % LANES } else { i - whole };
                let e = exp_neg(slope * x[i] + beta);
                let p = 1.0 / (1.0 + e);
                let q = e * p;
                let w = n[i] * p * q;
                let r = a[i] - n[i] * p;
                let wx = w * x[i];
                g0[l] += r * x[i];
                h00[l] += wx * x[i];
                r_sum[l] += r;
                wx_sum[l] += wx;
                w_sum[l] += w;
            }
            out.g[position + 1] = combine(r_sum);
            out.h0k[position] = combine(wx_sum);
            out.hkk[position] = combine(w_sum);
        }
        out.g[0] = combine(g0);
        out.h00 = combine(h00);
        out
    }

    #[test]
    fn every_variant_of_terms_gives_the_bits_of_one_bin_at_a_time() {
        let binning = Binning::new(40.0, 64);
        let bits = |t: &Terms| {
            let mut all = vec![t.h00.to_bits()];
            all.extend(t.g.iter().chain(&t.h0k).chain(&t.hkk).map(|v| v.to_bits()));
            all
        };
        for seed in 0..30u64 {
            let mut rng = XorShift::new(seed + 7);
            let k = 1 + (seed % 7) as usize;
            let mut round = HistogramStats::new(k, 64);
            // From a handful of labels (positions with 0–3 bins: only the remainder) to many.
            for _ in 0..(seed * seed * 3) {
                let position = (rng.next_u64() % k as u64) as usize;
                let x = (rng.unit_f64() - 0.4) * 30.0;
                round.add_observation(&binning, position, x, rng.unit_f64() < 0.6);
            }
            let mut memory = HistogramMemory::new(k, 64);
            memory.add_round(&round, &binning);
            memory.decay(0.8);
            let bins = FitBins::gather(Some(&memory), Some(&round), &binning, k);
            let theta: Vec<f64> = (0..=k).map(|i| 0.5 - 0.3 * i as f64).collect();
            let want = bits(&terms_one_bin_at_a_time(&bins, &theta));
            for level in crate::simd::available() {
                assert_eq!(
                    bits(&terms_at(level, &bins, &theta)),
                    want,
                    "{level:?}, {seed}"
                );
            }
            assert_eq!(bits(&terms(&bins, &theta)), want);
        }
    }

    #[test]
    fn positions_without_labels_keep_their_intercept_bit_for_bit() {
        let binning = Binning::new(40.0, 64);
        let mut round = HistogramStats::new(3, 64);
        for i in 0..30 {
            round.add_observation(&binning, 0, f64::from(i) / 5.0 - 2.0, i % 3 != 0);
        }
        let bins = FitBins::gather(None, Some(&round), &binning, 3);
        let prior = Prior::new(3, &PriorWidths::DEFAULT, 0.5, -0.2);
        let start = [0.5, -0.2, 0.123_456_789, -1.75];
        let result = fit(&bins, &prior, &start, 1e-3);
        assert_ne!(result.theta[1], -0.2);
        assert_eq!(result.theta[2].to_bits(), start[2].to_bits());
        assert_eq!(result.theta[3].to_bits(), start[3].to_bits());
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn priorwidths_example() {
        use crate::estimator::map::{Prior, PriorWidths};

        let prior = Prior::new(1, &PriorWidths::DEFAULT, 0.5, -0.2);
        // K = 1: β = level + ε, so its precision is 1 / (σ₀² + σ_b²).
        assert!((prior.precision()[3] - 1.0 / (1.0 + 0.01)).abs() < 1e-12);
        assert!((prior.precision()[0] - 1.0 / 0.0225).abs() < 1e-9); // 1 / 0.15²
        assert_eq!(prior.mean, [0.5, -0.2]);
    }

    #[test]
    fn gather_example() {
        use crate::estimator::histogram::{Binning, HistogramStats};
        use crate::estimator::map::FitBins;

        let binning = Binning::new(40.0, 64);
        let mut round = HistogramStats::new(2, 64);
        round.add_observation(&binning, 1, 2.0, true); // bin 33: [1.25, 2.5)
        round.add_observation(&binning, 1, 2.4, false);
        let bins = FitBins::gather(None, Some(&round), &binning, 2);
        assert_eq!(bins.starts, [0, 0, 1]); // one non-empty bin, at position 1
        assert_eq!((bins.n[0], bins.a[0]), (2.0, 1.0));
        assert!((bins.x[0] - 2.2).abs() < 1e-4);
    }

    #[test]
    fn terms_example() {
        use crate::estimator::histogram::{Binning, HistogramStats};
        use crate::estimator::map::{terms, FitBins};

        let binning = Binning::new(40.0, 64);
        let mut round = HistogramStats::new(1, 64);
        round.add_observation(&binning, 0, 0.0, true);
        round.add_observation(&binning, 0, 0.0, false);
        let bins = FitBins::gather(None, Some(&round), &binning, 1);
        let t = terms(&bins, &[0.5, 0.0]); // p = 1/2 at x = 0
        assert_eq!((t.g[1], t.hkk[0]), (0.0, 0.5)); // r = 1 − 2·½; w = 2·¼
    }

    #[test]
    fn fit_example() {
        use crate::estimator::histogram::{Binning, HistogramStats};
        use crate::estimator::map::{fit, FitBins, Prior, PriorWidths};

        // Confident drafts accepted, unsure ones rejected: the slope rises from the prior's 0.5.
        let binning = Binning::new(40.0, 64);
        let mut round = HistogramStats::new(1, 64);
        for _ in 0..50 {
            round.add_observation(&binning, 0, 4.0, true);
            round.add_observation(&binning, 0, -4.0, false);
        }
        let bins = FitBins::gather(None, Some(&round), &binning, 1);
        let prior = Prior::new(1, &PriorWidths::DEFAULT, 0.5, -0.2);
        let result = fit(&bins, &prior, &[0.5, -0.2], 1e-3);
        assert!(result.theta[0] > 0.5 && result.iterations <= 16);
    }
}
