//! Newton steps with memory across rounds: the discounted quadratic model of every past round.
//!
//! vLLM's refit fits each round from that round alone and forgets it, so the coefficients
//! wander by about one round's standard error from round to round. With memory `γ ∈ (0, 1)`
//! the estimator keeps, discounted by `γ` per round, the local quadratic model each round `s`
//! gave around the coefficients `θ_s` it was collected under:
//!
//! ```text
//! A = Σ_s γ^age (H_s + λI)          b = Σ_s γ^age ((H_s + λI) θ_s + g_s)
//! ```
//!
//! whose optimum solves `A θ* = b` — for γ → 1 a pooled IRLS over every round, for γ = 0
//! exactly this round's Newton step. The refit steps from the current `θ` toward it by solving
//! `A Δ = b − A θ` with the same arrowhead Cholesky, and then applies vLLM's damping and guards
//! with *discounted* counts: the slope step is damped by `N'/(N' + D)` with
//! `N' = Σ_s γ^age N_s`, each intercept step (conditioned on the damped slope step) by
//! `n'_k/(n'_k + D)` with `n'_k = Σ_s γ^age n_{k,s}`; a non-finite step is 0, the slope may not go
//! negative, and [`super::refit::Bounds`] cap the step and the range as usual. `A` is an
//! arrowhead (a sum of arrowheads), so the memory is `O(K)` numbers. A round with no
//! observations only decays the memory and leaves the coefficients alone.
//!
//! **Drift test.** Memory trades tracking speed for variance: after a workload switch it keeps
//! pulling toward the old optimum. So each round is first tested against the coefficients it was
//! collected under: if the workload has not changed, the round's score `g` (the gradient of its
//! log-likelihood at those coefficients) is approximately `N(0, H)`, and
//! `T = gᵀ (H + λI)⁻¹ g` is approximately χ² with `K + 1` degrees of freedom. When `T` exceeds
//! the χ² quantile at `drift_z` standard deviations (Wilson–Hilferty:
//! `ν (1 − 2/(9ν) + z √(2/(9ν)))³`, ν = K + 1; z = 3.09 is a 0.1% false alarm per round) the
//! memory is dropped before the round is folded in, so that round's refit is exactly the
//! memoryless (vLLM) step. While the coefficients are still converging `T` is large too, which
//! is harmless: the estimator then behaves like γ = 0 until it has settled.

use super::accumulator::{FloatStats, MAX_COUNT};
use super::refit::ArrowheadSystem;
use crate::error::{Error, Result};

/// The discounted sum of past rounds' quadratic models.
///
/// # Example
///
/// ```rust
/// use av_core::estimator::Memory;
///
/// let memory = Memory::new(4);
/// assert_eq!(memory.num_positions(), 4);
/// assert_eq!(memory.rhs.len(), 5); // slope first, then one entry per intercept
/// assert_eq!((memory.total, memory.resets), (0.0, 0));
/// ```
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Memory {
    /// Slope–slope entry of `A`.
    pub a: f64,
    /// Slope–intercept entries of `A`.
    pub b: Vec<f64>,
    /// Intercept diagonal of `A`.
    pub c: Vec<f64>,
    /// The vector `b` of the module docs, slope component first (`K + 1` entries).
    pub rhs: Vec<f64>,
    /// Discounted observation count behind the slope.
    pub total: f64,
    /// Discounted observation counts per position.
    pub counts: Vec<f64>,
    /// Rounds whose drift test dropped the memory.
    #[serde(with = "crate::persist::fixed")]
    pub resets: u64,
}

impl Memory {
    /// An empty memory for `num_positions` positions.
    pub fn new(num_positions: usize) -> Self {
        Memory {
            a: 0.0,
            b: vec![0.0; num_positions],
            c: vec![0.0; num_positions],
            rhs: vec![0.0; num_positions + 1],
            total: 0.0,
            counts: vec![0.0; num_positions],
            resets: 0,
        }
    }

    /// Number of positions.
    pub fn num_positions(&self) -> usize {
        self.b.len()
    }

    /// Checks that this memory could have been built by refits of an estimator with
    /// `num_positions` positions, memory discount `gamma`, features clamped to `±max_log_odds`
    /// and `num_refits` refits so far: the
    /// right lengths, finite values, all zeros when `gamma` is 0 (the memoryless refit never
    /// touches it), non-negative counts and weights, discounted counts that add up
    /// (`total = Σ counts`), a positive semi-definite `A` (a discounted sum of rounds'
    /// `XᵀWX + λI`: `c_k = 0` only with `b_k = 0`, and `a ≥ Σ b_k² / c_k`), and no more resets
    /// than refits. The sums are allowed their rounding (of the float arithmetic, and of the
    /// rounds' fixed-point statistics: half a unit per observation, amplified by at most
    /// `(1 + max_log_odds)²` in the Schur complement).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::estimator::Memory;
    ///
    /// let mut memory = Memory::new(2);
    /// assert!(memory.validate(2, 0.8, 40.0, 0).is_ok());
    /// memory.c[1] = -3.0; // a negative weight sum
    /// assert_eq!(memory.validate(2, 0.8, 40.0, 5).unwrap_err().argument, "memory");
    /// ```
    pub fn validate(
        &self,
        num_positions: usize,
        gamma: f64,
        max_log_odds: f64,
        num_refits: u64,
    ) -> Result<()> {
        let fail = |message: String| Err(Error::value("memory", message));
        let k = num_positions;
        if self.b.len() != k
            || self.c.len() != k
            || self.counts.len() != k
            || self.rhs.len() != k + 1
        {
            return fail(format!(
                "expected {k} positions ({} slope-and-intercept entries)",
                k + 1
            ));
        }
        let values = [self.a, self.total].into_iter().chain(
            self.b
                .iter()
                .chain(&self.c)
                .chain(&self.rhs)
                .chain(&self.counts)
                .copied(),
        );
        for value in values {
            if !value.is_finite() {
                return fail(format!("must be finite, got {value}"));
            }
        }
        if gamma == 0.0 && *self != Memory::new(k) {
            return fail("must be empty with memory = 0 (the memoryless refit keeps none)".into());
        }
        if self.resets > num_refits {
            return fail(format!(
                "{} resets but only {num_refits} refits (each reset is one refit)",
                self.resets
            ));
        }
        if self.a < 0.0 || self.total < 0.0 {
            return fail(format!(
                "a = {} and total = {} must be non-negative",
                self.a, self.total
            ));
        }
        // Rounds hold at most MAX_COUNT observations per position, so the discounted total
        // stays below the geometric bound MAX_COUNT·K / (1 − γ): γ·L + MAX_COUNT·K = L. The
        // slack covers the float rounding of each fold, so a state at the bound folds a full
        // round and still loads.
        let limit = MAX_COUNT as f64 * k as f64 / (1.0 - gamma) * (1.0 + 1e-9);
        if self.total > limit {
            return fail(format!("total = {} exceeds {limit}", self.total));
        }
        // A round's fixed-point sums are each off by up to half a unit per observation, so its
        // arrowhead is positive semi-definite only once that much is added to every c_k and
        // (scaled by the features' range) to a; summed over rounds, those margins are the
        // discounted counts times half a unit. Float rounding of the sums themselves is
        // relative.
        let tolerance = 1e-9;
        let half_unit = 0.5 / super::fixed_point::SCALE;
        let rounding = (1.0 + self.total) * 2.0 * half_unit * (1.0 + max_log_odds.abs()).powi(2);
        let mut schur = 0.0;
        let mut count_sum = 0.0;
        for position in 0..k {
            let (b, c, n) = (self.b[position], self.c[position], self.counts[position]);
            if c < 0.0 || n < 0.0 {
                return fail(format!(
                    "position {position}: c = {c} and counts = {n} must be non-negative"
                ));
            }
            let margin = c + n * half_unit;
            if margin == 0.0 {
                // A position no round labels any more decays geometrically, and with no ridge
                // (l2 = 0) its weight can underflow to zero a few multiplications before its
                // `b` (|b| ≤ max_log_odds·c): a subnormal `b` is that, not an impossible state.
                if b.abs() >= f64::MIN_POSITIVE {
                    return fail(format!(
                        "position {position}: b = {b} without weight (A is not positive \
                         semi-definite)"
                    ));
                }
            } else {
                schur += b * b / margin;
            }
            count_sum += n;
        }
        if schur > self.a * (1.0 + tolerance) + rounding {
            return fail(format!(
                "a = {} is below sum(b^2 / c) = {schur} (A is not positive semi-definite)",
                self.a
            ));
        }
        if (self.total - count_sum).abs() > tolerance * (1.0 + self.total.max(count_sum)) {
            return fail(format!(
                "total = {} is not the sum of the counts ({count_sum})",
                self.total
            ));
        }
        Ok(())
    }

    /// Whether every value of the memory is finite.
    fn is_finite(&self) -> bool {
        let mut columns = self
            .b
            .iter()
            .chain(&self.c)
            .chain(&self.rhs)
            .chain(&self.counts);
        self.a.is_finite() && self.total.is_finite() && columns.all(|v| v.is_finite())
    }

    fn decay(&mut self, gamma: f64) {
        self.a *= gamma;
        self.total *= gamma;
        for v in self
            .b
            .iter_mut()
            .chain(&mut self.c)
            .chain(&mut self.rhs)
            .chain(&mut self.counts)
        {
            *v *= gamma;
        }
    }

    /// Folds in the round `stats` collected under coefficients `(slope, intercepts)`, and returns
    /// the system whose damped step moves those coefficients toward the memory's optimum; `None`
    /// for a round without observations (which only decays the memory). With a finite
    /// `drift_z`, a round that fails the drift test first drops the memory (`self.resets` counts
    /// it).
    pub(crate) fn fold(
        &mut self,
        gamma: f64,
        drift_z: f64,
        stats: &FloatStats,
        l2: f64,
        slope: f64,
        intercepts: &[f64],
    ) -> Option<ArrowheadSystem> {
        self.decay(gamma);
        let round_total: f64 = stats.n.iter().sum();
        if round_total == 0.0 {
            return None;
        }
        let round = ArrowheadSystem::from_round(stats, l2);
        if drift_statistic(&round) > chi_square_quantile(intercepts.len() + 1, drift_z) {
            // Saturates with the refit count it is bounded by (see the estimator's refit).
            let resets = (self.resets + 1).min(MAX_COUNT);
            *self = Memory::new(intercepts.len());
            self.resets = resets;
        }
        // (H + λI) θ_s + g_s for this round.
        let mut rhs0 = round.a * slope + round.g0;
        for (k, &beta) in intercepts.iter().enumerate() {
            rhs0 += round.b[k] * beta;
            self.rhs[k + 1] += round.b[k] * slope + round.c[k] * beta + round.g1[k];
            self.b[k] += round.b[k];
            self.c[k] += round.c[k];
            self.counts[k] += round.counts[k];
        }
        self.rhs[0] += rhs0;
        self.a += round.a;
        self.total += round.total;
        if !self.is_finite() {
            // Coefficients and an `l2` at the edge of f64 (a loaded state may hold them) can
            // overflow the fold: the memory is dropped (counted as a reset) and this round gives
            // no step, so the state stays one that saves and loads.
            let resets = (self.resets + 1).min(MAX_COUNT);
            *self = Memory::new(intercepts.len());
            self.resets = resets;
            return None;
        }

        // The gradient of the memory's quadratic at the current coefficients: b − A θ.
        let mut g0 = self.rhs[0] - self.a * slope;
        let mut g1 = Vec::with_capacity(intercepts.len());
        for (k, &beta) in intercepts.iter().enumerate() {
            g0 -= self.b[k] * beta;
            g1.push(self.rhs[k + 1] - self.b[k] * slope - self.c[k] * beta);
        }
        Some(ArrowheadSystem {
            a: self.a,
            b: self.b.clone(),
            c: self.c.clone(),
            g0,
            g1,
            total: self.total,
            counts: self.counts.clone(),
        })
    }
}

/// `T = gᵀ (H + λI)⁻¹ g` of one round's system (∞ if the system cannot be solved).
pub fn drift_statistic(round: &ArrowheadSystem) -> f64 {
    let Some(solution) = round.full_step() else {
        return f64::INFINITY;
    };
    let g = std::iter::once(round.g0).chain(round.g1.iter().copied());
    g.zip(&solution).map(|(g, x)| g * x).sum()
}

/// The Wilson–Hilferty approximation of the χ² quantile with `dof` degrees of freedom at `z`
/// standard-normal deviations (∞ for an infinite `z`: the test never fires).
pub fn chi_square_quantile(dof: usize, z: f64) -> f64 {
    if z.is_infinite() {
        return f64::INFINITY;
    }
    let nu = dof as f64;
    let h = 2.0 / (9.0 * nu);
    nu * (1.0 - h + z * h.sqrt()).powi(3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::refit::newton_step;
    use crate::test_rng::XorShift;

    fn round(seed: u64, k: usize) -> FloatStats {
        let mut rng = XorShift::new(seed | 1);
        let mut next = || rng.unit_f64();
        let mut stats = FloatStats {
            a: vec![0.0; k],
            b: vec![0.0; k],
            c: vec![0.0; k],
            g0: vec![0.0; k],
            g1: vec![0.0; k],
            n: vec![0.0; k],
        };
        for position in 0..k {
            for _ in 0..50 {
                let x = next() * 10.0 - 3.0;
                let p = 1.0 / (1.0 + (-(0.5 * x - 0.2)).exp());
                let y = if next() < 0.6 { 1.0 } else { 0.0 };
                let w = p * (1.0 - p);
                stats.a[position] += w * x * x;
                stats.b[position] += w * x;
                stats.c[position] += w;
                stats.g0[position] += (y - p) * x;
                stats.g1[position] += y - p;
                stats.n[position] += 1.0;
            }
        }
        stats
    }

    #[test]
    fn a_fresh_memory_gives_this_rounds_newton_step() {
        let stats = round(3, 4);
        let (slope, intercepts) = (0.7, vec![0.1, -0.3, 0.5, 0.0]);
        let with_memory = Memory::new(4)
            .fold(0.9, f64::INFINITY, &stats, 1e-3, slope, &intercepts)
            .unwrap()
            .damped_step(slope, 50.0);
        let plain = newton_step(slope, &stats, 1e-3, 50.0);
        assert!((with_memory.slope - plain.slope).abs() < 1e-12);
        for (a, b) in with_memory.intercepts.iter().zip(&plain.intercepts) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }

    #[test]
    fn chi_square_quantile_is_close_to_the_tables() {
        // χ² quantiles at 0.999: 5 dof → 20.515, 9 dof → 27.877, 17 dof → 40.790.
        for (dof, table) in [(5, 20.515), (9, 27.877), (17, 40.790)] {
            let approx = chi_square_quantile(dof, 3.0902);
            assert!(
                (approx - table).abs() / table < 0.02,
                "{dof}: {approx} vs {table}"
            );
        }
        assert_eq!(chi_square_quantile(5, f64::INFINITY), f64::INFINITY);
    }

    #[test]
    fn empty_rounds_only_decay() {
        let mut memory = Memory::new(2);
        memory.fold(0.5, f64::INFINITY, &round(1, 2), 1e-3, 0.5, &[0.0, 0.0]);
        let before = memory.clone();
        let empty = FloatStats {
            a: vec![0.0; 2],
            b: vec![0.0; 2],
            c: vec![0.0; 2],
            g0: vec![0.0; 2],
            g1: vec![0.0; 2],
            n: vec![0.0; 2],
        };
        assert!(memory
            .fold(0.5, f64::INFINITY, &empty, 1e-3, 0.5, &[0.0, 0.0])
            .is_none());
        assert_eq!(memory.a, before.a * 0.5);
        assert_eq!(
            memory.counts,
            vec![before.counts[0] * 0.5, before.counts[1] * 0.5]
        );
    }

    #[test]
    fn the_memory_optimum_is_the_pooled_quadratics_optimum() {
        // Two rounds expanded at the same θ with γ = 1 must equal one round holding both.
        let (a, b) = (round(5, 3), round(6, 3));
        let both = FloatStats {
            a: a.a.iter().zip(&b.a).map(|(x, y)| x + y).collect(),
            b: a.b.iter().zip(&b.b).map(|(x, y)| x + y).collect(),
            c: a.c.iter().zip(&b.c).map(|(x, y)| x + y).collect(),
            g0: a.g0.iter().zip(&b.g0).map(|(x, y)| x + y).collect(),
            g1: a.g1.iter().zip(&b.g1).map(|(x, y)| x + y).collect(),
            n: a.n.iter().zip(&b.n).map(|(x, y)| x + y).collect(),
        };
        let theta = (0.5, vec![-0.2; 3]);
        let mut memory = Memory::new(3);
        memory.fold(1.0, f64::INFINITY, &a, 0.0, theta.0, &theta.1);
        let system = memory
            .fold(1.0, f64::INFINITY, &b, 0.0, theta.0, &theta.1)
            .unwrap();
        let pooled = ArrowheadSystem::from_round(&both, 0.0);
        let (x, y) = (system.damped_step(0.5, 0.0), pooled.damped_step(0.5, 0.0));
        assert!((x.slope - y.slope).abs() < 1e-9);
        for (u, v) in x.intercepts.iter().zip(&y.intercepts) {
            assert!((u - v).abs() < 1e-9);
        }
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn fold_example() {
        use crate::estimator::accumulator::RoundStats;
        use crate::estimator::memory::Memory;

        let mut round = RoundStats::new(1);
        for (x, y) in [(2.0, true), (1.0, true), (-1.0, false), (0.5, false)] {
            round.positions[0].add_observation(x, 0.5, y);
        }
        let mut memory = Memory::new(1);
        let (gamma, no_drift_test, l2) = (0.9, f64::INFINITY, 1e-3);
        let system = memory.fold(gamma, no_drift_test, &round.to_float(), l2, 0.5, &[-0.2]);
        let step = system
            .expect("the round has observations")
            .damped_step(0.5, 50.0);
        assert!(step.slope > 0.0); // confident drafts were the accepted ones
        assert_eq!(memory.total, 4.0);
        // An empty round only decays the memory.
        let empty = RoundStats::new(1).to_float();
        assert!(memory
            .fold(gamma, no_drift_test, &empty, l2, 0.5, &[-0.2])
            .is_none());
        assert!((memory.total - 3.6).abs() < 1e-12);
    }

    #[test]
    fn drift_statistic_example() {
        use crate::estimator::accumulator::RoundStats;
        use crate::estimator::memory::drift_statistic;
        use crate::estimator::refit::ArrowheadSystem;

        // Predictions that match the labels on average leave no score: T = 0.
        let mut round = RoundStats::new(1);
        round.positions[0].add_observation(1.0, 0.5, true);
        round.positions[0].add_observation(1.0, 0.5, false);
        let system = ArrowheadSystem::from_round(&round.to_float(), 1e-3);
        assert_eq!(drift_statistic(&system), 0.0);
        // Every draft rejected although predicted at 0.5: a positive statistic.
        round.positions[0].add_observation(1.0, 0.5, false);
        round.positions[0].add_observation(1.0, 0.5, false);
        assert!(drift_statistic(&ArrowheadSystem::from_round(&round.to_float(), 1e-3)) > 0.0);
    }

    #[test]
    fn chi_square_quantile_example() {
        use crate::estimator::memory::chi_square_quantile;

        // K = 4 positions: 5 degrees of freedom; the exact 99.9% quantile is 20.515.
        assert!((chi_square_quantile(5, 3.09) - 20.515).abs() < 0.5);
        assert_eq!(chi_square_quantile(5, f64::INFINITY), f64::INFINITY);
    }
}
