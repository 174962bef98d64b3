//! The end-of-round refit: one damped Newton (IRLS) step on the round's statistics.
//!
//! vLLM-compatible, step by step:
//!
//! 1. Solve `(H + λI) Δ = g` for the full Newton step, `H` the arrowhead `XᵀWX`, by Cholesky.
//! 2. Slope: `Δω ← Δω · N/(N + D)` with `N = Σ n_k`, because the shared slope learns from every
//!    position. Keep `Δω = 0` if it is not finite, or if `ω + Δω < 0`: a negative slope would
//!    say a more confident drafter is *less* likely to be right, which no drafter does; it only
//!    appears when a round's data are too thin to pin the slope.
//! 3. Intercepts, conditioned on that damped slope step:
//!    `Δβ_k = (g1_k − b_k Δω) / (c_k + λ) · n_k / (n_k + D)`; a non-finite `Δβ_k` is 0. Damping by
//!    the position's own count keeps thin deep positions learning slowly instead of freezing
//!    behind a minimum-sample gate.
//!
//! The caller then clears the statistics: each round fits its own window, which is what lets
//! the estimator follow a drifting workload.
//!
//! Past vLLM, [`Bounds`] cap each step and the coefficients' range. One confidently wrong round
//! (features near +30, every draft rejected) makes `w = p(1 − p)` tiny and the intercept step
//! `g1/c` enormous; with trimming on, a position pushed to −10⁶ is never verified again, never
//! labeled again, and never recovers. Bounded, it lands a few log-odds lower and the next labels
//! (the planner's exploration floor guarantees some) pull it back within a few rounds. The
//! defaults never bind on a healthy workload, where steps are a fraction of a log-odd.

use super::accumulator::FloatStats;
use super::cholesky::solve_spd;

/// The change a refit applies to the coefficients.
#[derive(Clone, Debug, PartialEq)]
pub struct NewtonStep {
    /// Damped, guarded slope change `Δω`.
    pub slope: f64,
    /// Damped intercept changes `Δβ_k`.
    pub intercepts: Vec<f64>,
}

impl NewtonStep {
    /// No change on `num_positions` positions.
    pub fn zero(num_positions: usize) -> Self {
        NewtonStep {
            slope: 0.0,
            intercepts: vec![0.0; num_positions],
        }
    }
}

/// A Newton system with the estimator's arrowhead structure, ridge included:
/// `[[a, bᵀ], [b, diag(c)]] Δ = [g0; g1]`, plus the observation counts that damp its step.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrowheadSystem {
    /// Slope–slope entry (`Σ a_k + λ`).
    pub a: f64,
    /// Slope–intercept entries `b_k`.
    pub b: Vec<f64>,
    /// Intercept diagonal (`c_k + λ`).
    pub c: Vec<f64>,
    /// Slope component of the right-hand side.
    pub g0: f64,
    /// Intercept components of the right-hand side.
    pub g1: Vec<f64>,
    /// Observations behind the slope (`N`).
    pub total: f64,
    /// Observations behind each intercept (`n_k`).
    pub counts: Vec<f64>,
}

impl ArrowheadSystem {
    /// One round's system: `XᵀWX + λI` and `Xᵀr` from its statistics.
    pub fn from_round(stats: &FloatStats, l2: f64) -> Self {
        ArrowheadSystem {
            a: stats.a.iter().sum::<f64>() + l2,
            b: stats.b.clone(),
            c: stats.c.iter().map(|c| c + l2).collect(),
            g0: stats.g0.iter().sum(),
            g1: stats.g1.clone(),
            total: stats.n.iter().sum(),
            counts: stats.n.clone(),
        }
    }

    /// The undamped solution `Δ` of the system by Cholesky (`[Δω, Δβ_1 … Δβ_K]`), or `None`
    /// when the matrix is not numerically positive definite.
    pub fn full_step(&self) -> Option<Vec<f64>> {
        let k = self.b.len();
        let n = k + 1;
        let mut matrix = vec![0.0; n * n];
        let mut rhs = vec![0.0; n];
        matrix[0] = self.a;
        rhs[0] = self.g0;
        for position in 0..k {
            let row = position + 1;
            matrix[row * n] = self.b[position];
            matrix[row] = self.b[position];
            matrix[row * n + row] = self.c[position];
            rhs[row] = self.g1[position];
        }
        solve_spd(&mut matrix, &mut rhs).then_some(rhs)
    }

    /// The damped, guarded step of this system from the current `slope` (steps 1–3 above).
    pub fn damped_step(&self, slope: f64, damping: f64) -> NewtonStep {
        let k = self.b.len();
        let full_slope_step = self.full_step().map_or(f64::NAN, |step| step[0]);

        let mut slope_step = full_slope_step * (self.total / (self.total + damping));
        if !slope_step.is_finite() || slope + slope_step < 0.0 {
            slope_step = 0.0;
        }

        let intercepts = (0..k)
            .map(|position| {
                let count = self.counts[position];
                let step = (self.g1[position] - self.b[position] * slope_step) / self.c[position]
                    * (count / (count + damping));
                if step.is_finite() {
                    step
                } else {
                    0.0
                }
            })
            .collect();
        NewtonStep {
            slope: slope_step,
            intercepts,
        }
    }
}

/// The damped Newton step from the current `slope` on a round's `stats`, with ridge `l2` (λ)
/// and `damping` (D, in observations): vLLM's update.
pub fn newton_step(slope: f64, stats: &FloatStats, l2: f64, damping: f64) -> NewtonStep {
    ArrowheadSystem::from_round(stats, l2).damped_step(slope, damping)
}

/// Limits on one refit: `|Δ| ≤ max_step` for every coefficient, `0 ≤ ω ≤ max_slope` and
/// `|β_k| ≤ max_intercept`. Infinite limits give vLLM's unbounded update.
///
/// # Example
///
/// ```rust
/// use av_core::estimator::{Bounds, NewtonStep};
///
/// // One confidently wrong round asks for a huge intercept drop; the bounds keep it to 4.
/// let bounds = Bounds { max_step: 4.0, max_slope: 10.0, max_intercept: 15.0 };
/// let step = NewtonStep { slope: -0.25, intercepts: vec![-1e6, 0.3] };
/// let mut intercepts = [-0.2, 14.9];
/// let slope = bounds.apply(0.5, &mut intercepts, &step);
/// assert_eq!(slope, 0.25);
/// assert_eq!(intercepts, [-4.2, 15.0]); // step capped at 4, range capped at 15
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    /// Largest change of any coefficient in one refit, in log-odds.
    pub max_step: f64,
    /// Largest slope.
    pub max_slope: f64,
    /// Largest absolute intercept.
    pub max_intercept: f64,
}

impl Bounds {
    /// No limits: exactly vLLM's update.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::estimator::{Bounds, NewtonStep};
    ///
    /// let step = NewtonStep { slope: 0.25, intercepts: vec![-1e6] };
    /// let mut intercepts = [-0.2];
    /// assert_eq!(Bounds::UNBOUNDED.apply(0.5, &mut intercepts, &step), 0.75);
    /// assert_eq!(intercepts, [-1e6 - 0.2]);
    /// ```
    pub const UNBOUNDED: Bounds = Bounds {
        max_step: f64::INFINITY,
        max_slope: f64::INFINITY,
        max_intercept: f64::INFINITY,
    };

    /// Applies `step` to `slope` and `intercepts` within the limits; returns the new slope.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::estimator::{Bounds, NewtonStep};
    ///
    /// let bounds = Bounds { max_step: 1.0, max_slope: 10.0, max_intercept: 15.0 };
    /// let step = NewtonStep { slope: -2.0, intercepts: vec![0.5] };
    /// let mut intercepts = [0.0];
    /// // The slope step is capped at -1 and the slope may not go negative.
    /// assert_eq!(bounds.apply(0.5, &mut intercepts, &step), 0.0);
    /// assert_eq!(intercepts, [0.5]);
    /// ```
    pub fn apply(&self, slope: f64, intercepts: &mut [f64], step: &NewtonStep) -> f64 {
        let limit = |delta: f64| delta.clamp(-self.max_step, self.max_step);
        for (beta, &delta) in intercepts.iter_mut().zip(&step.intercepts) {
            *beta = (*beta + limit(delta)).clamp(-self.max_intercept, self.max_intercept);
        }
        (slope + limit(step.slope)).clamp(0.0, self.max_slope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_cap_the_step_and_the_range() {
        let bounds = Bounds {
            max_step: 2.0,
            max_slope: 3.0,
            max_intercept: 5.0,
        };
        let step = NewtonStep {
            slope: 10.0,
            intercepts: vec![-1e6, 0.5, 3.0],
        };
        let mut intercepts = vec![-0.2, 1.0, 4.0];
        let slope = bounds.apply(2.5, &mut intercepts, &step);
        assert_eq!(slope, 3.0);
        assert_eq!(intercepts, vec![-2.2, 1.5, 5.0]);
        let mut same = vec![-0.2, 1.0, 4.0];
        assert_eq!(Bounds::UNBOUNDED.apply(2.5, &mut same, &step), 12.5);
        assert_eq!(same, vec![-0.2 - 1e6, 1.5, 7.0]);
    }

    fn stats(k: usize) -> FloatStats {
        FloatStats {
            a: vec![0.0; k],
            b: vec![0.0; k],
            c: vec![0.0; k],
            g0: vec![0.0; k],
            g1: vec![0.0; k],
            n: vec![0.0; k],
        }
    }

    #[test]
    fn damping_example_from_the_reference() {
        // b = 0, c = s, g1 = 0.5 s, a = 30 s, g0 = 2 s, n = 20 s on K = 4 (λ = 0 so the
        // closed form is exact): Δω = (2/30)·N/(N+50), N = 80 s; Δβ = 0.5·20s/(20s+50).
        let s = 3.0;
        let mut st = stats(4);
        st.c = vec![s; 4];
        st.g1 = vec![0.5 * s; 4];
        st.a = vec![30.0 * s / 4.0; 4];
        st.g0 = vec![2.0 * s / 4.0; 4];
        st.n = vec![20.0 * s; 4];
        let step = newton_step(0.5, &st, 0.0, 50.0);
        let total = 80.0 * s;
        assert!((step.slope - (2.0 / 30.0) * total / (total + 50.0)).abs() < 1e-15);
        for d in step.intercepts {
            assert!((d - 0.5 * 20.0 * s / (20.0 * s + 50.0)).abs() < 1e-15);
        }
    }

    #[test]
    fn empty_round_is_a_zero_step() {
        let step = newton_step(0.5, &stats(3), 1e-3, 50.0);
        assert_eq!(step.slope, 0.0);
        assert!(step.intercepts.iter().all(|&d| d == 0.0));
        // Without ridge the matrix is singular: the guards turn NaN into no step at all.
        let step = newton_step(0.5, &stats(3), 0.0, 0.0);
        assert_eq!(step.slope, 0.0);
        assert!(step.intercepts.iter().all(|&d| d == 0.0));
    }

    #[test]
    fn slope_may_not_go_negative() {
        let mut st = stats(1);
        st.a = vec![1.0];
        st.c = vec![1.0];
        st.g0 = vec![-10.0];
        st.n = vec![1000.0];
        let step = newton_step(0.5, &st, 1e-3, 50.0);
        assert_eq!(step.slope, 0.0);
        // The intercept step is then conditioned on Δω = 0.
        assert_eq!(step.intercepts[0], 0.0);
    }

    #[test]
    fn unreached_positions_get_exactly_zero() {
        let mut st = stats(3);
        st.a[0] = 5.0;
        st.b[0] = 1.0;
        st.c[0] = 2.0;
        st.g0[0] = 0.7;
        st.g1[0] = -0.4;
        st.n[0] = 40.0;
        let step = newton_step(0.5, &st, 1e-3, 50.0);
        assert!(step.slope != 0.0);
        assert_eq!(step.intercepts[1].to_bits() & !(1 << 63), 0);
        assert_eq!(step.intercepts[2].to_bits() & !(1 << 63), 0);
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn arrowheadsystem_example() {
        use crate::estimator::accumulator::RoundStats;
        use crate::estimator::refit::ArrowheadSystem;

        let mut round = RoundStats::new(2);
        round.positions[0].add_observation(2.0, 0.5, true);
        round.positions[1].add_observation(1.0, 0.5, false);
        let system = ArrowheadSystem::from_round(&round.to_float(), 1e-3);
        assert_eq!(system.a, 1.25 + 1e-3); // Σ w x² + λ
        assert_eq!(system.c, [0.25 + 1e-3, 0.25 + 1e-3]);
        assert_eq!((system.total, system.g1.clone()), (2.0, vec![0.5, -0.5]));
        // No damping: the full Newton step; D = 50 shrinks it by 2 / 52.
        let full = system.damped_step(0.5, 0.0);
        let damped = system.damped_step(0.5, 50.0);
        assert!(full.slope > 0.0);
        assert!((damped.slope - full.slope * 2.0 / 52.0).abs() < 1e-12);
    }

    #[test]
    fn newton_step_example() {
        use crate::estimator::accumulator::RoundStats;
        use crate::estimator::refit::newton_step;

        // Position 0 accepted twice at p = 0.5 (x = 0): the intercept moves up by
        // g1 / (c + λ) = 1 / 0.501, damped by n / (n + D) = 2 / 52; the slope learns nothing.
        let mut round = RoundStats::new(1);
        round.positions[0].add_observation(0.0, 0.5, true);
        round.positions[0].add_observation(0.0, 0.5, true);
        let step = newton_step(0.5, &round.to_float(), 1e-3, 50.0);
        assert_eq!(step.slope, 0.0);
        assert!((step.intercepts[0] - 1.0 / 0.501 * 2.0 / 52.0).abs() < 1e-12);
    }
}
