//! The online acceptance estimator.
//!
//! Predicts, for every drafted token, the probability that the target accepts it:
//! `p = σ(ω·x + β_k)` with `x = logit(q_max)` of the drafter's distribution at position `k`.
//! One slope is shared by all positions (it measures how well the drafter knows when it is
//! right, a property of the model pair) and each position has its own intercept (the base
//! acceptance rate, which falls with depth and with unpredictable content): `K + 1` parameters.
//!
//! The coefficients are fitted online from the target's own verdicts: every
//! [`AcceptanceEstimator::observe`] folds one decode step of labels into the open round, and
//! the refit schedule (every `refit_interval` steps, and within a round for the rules that fit
//! there) replaces the coefficients, capped by [`Bounds`]. How a round is kept and fitted is
//! the estimator's *update rule* ([`Update`]), one module each under `update/`: vLLM's damped
//! Newton step on the round's IRLS moments ([`RoundStats`], [`NewtonStep`]) or av_core's MAP fit
//! of per-position histograms ([`HistogramStats`]). The estimator holds the rule it was built
//! with and what every rule shares (`Common`: the configuration, the published
//! coefficients, the step count).
//!
//! Concurrency: `predict`, `observe`, `refit` and the accessors take `&self` and may run on any
//! number of threads at once. Observations are accumulated order-independently (bit-identical
//! results for the same set of observations) without the refit lock: lock-free under `vllm`,
//! under `map` with one short lock per observe around the integer adds of its occupied bins
//! (binning runs outside it); refits are serialized among themselves; readers see either the
//! old or the new coefficient vector, never a mix.

mod accumulator;
mod batch;
mod cholesky;
mod coefficients;
mod fixed_point;
mod histogram;
mod labels;
mod logistic;
mod map;
mod memory;
mod refit;

mod config;
mod observe;
mod rounds;
mod state;
#[cfg(test)]
mod tests;
mod update;

pub use accumulator::{PositionSums, RoundStats, MAX_COUNT};
pub use coefficients::Coefficients;
pub use config::{EstimatorConfig, Update};
pub use fixed_point::FRACTION_BITS;
pub use histogram::{HistogramMemory, HistogramStats, MAX_BINS, MAX_BIN_COUNT, X_FRACTION_BITS};
pub use map::PriorWidths;
pub use memory::Memory;
pub use refit::{Bounds, NewtonStep};
pub use state::EstimatorState;
pub use update::{
    MapReport, MapState, Reference, RefitReport, UpdateReport, UpdateState, VllmReport, VllmState,
};

/// Not part of the API: hidden from the documentation, no stability promise. The concurrent
/// building blocks and kernels that the loom model (`tests/loom.rs`), the stress test
/// (`tests/stress.rs`) and the benchmarks (`benches/core.rs`) drive directly, which no public
/// type exposes.
#[doc(hidden)]
pub mod internals {
    pub use super::accumulator::Accumulator;
    pub use super::cholesky::solve_spd;
    pub use super::coefficients::SharedCoefficients;
    pub use super::histogram::HistogramAccumulator;
    pub use super::logistic::probability;
}

use crate::error::{Error, Result};
use crate::matrix::MatrixView;
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};
use coefficients::SharedCoefficients;
use update::{dispatch, Rule, UpdateRule};

/// What every update rule shares: the configuration, the published coefficients, the refit
/// schedule's step count and the changeable regularization. The rule the estimator holds
/// reads and writes it through `&self`.
#[derive(Debug)]
pub(crate) struct Common {
    config: EstimatorConfig,
    coefficients: SharedCoefficients,
    steps_since_refit: AtomicU64,
    /// `[l2, damping]`, changeable ([`AcceptanceEstimator::set_regularization`]): read once per
    /// refit, so a refit uses the old pair or the new one, never a mix (`config`'s own two
    /// fields are the construction values; [`AcceptanceEstimator::config`] shows these).
    regularization: Mutex<[f64; 2]>,
}

impl Common {
    fn new(
        config: EstimatorConfig,
        slope: f64,
        intercepts: &[f64],
        num_refits: u64,
        steps: u64,
    ) -> Self {
        Common {
            coefficients: SharedCoefficients::new(slope, intercepts, num_refits),
            steps_since_refit: AtomicU64::new(steps),
            regularization: Mutex::new([config.l2, config.damping]),
            config,
        }
    }

    /// The current `[l2, damping]`.
    fn regularization(&self) -> [f64; 2] {
        *lock(&self.regularization)
    }
}

/// Takes one of the estimator's locks. Nothing that holds one can panic halfway through what
/// it guards (plain float and integer arithmetic, copies), so a poisoned lock still guards a
/// consistent value.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The online acceptance estimator. See the [module documentation](self) for the model.
///
/// # Concurrency
///
/// Every method takes `&self`, and all of them — `predict`, `step_stats`, `observe`,
/// `add_step`, `refit`, `state`, `to_bytes` and the accessors — may run concurrently from any
/// number of threads; share one estimator through `&` or an `Arc` (it is `Send + Sync`, checked
/// at compile time). Observers add their statistics without a lock; the same set of
/// observations gives bit-identical statistics whatever the interleaving, and the refit
/// schedule is the serial one (after any concurrent run, `num_refits` and `steps_since_refit`
/// are what the same calls made one after another give). Refits (explicit, or the one an
/// `observe` completing a round triggers; that observe waits for a refit in progress) are
/// serialized among themselves; a `predict` racing a refit sees the old or the new
/// coefficients, never a mix.
///
/// # Example
///
/// ```rust
/// use std::sync::Arc;
/// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
///
/// let estimator = Arc::new(AcceptanceEstimator::new(EstimatorConfig::new(3))?);
/// let workers: Vec<_> = (0..4)
///     .map(|_| {
///         let estimator = Arc::clone(&estimator);
///         std::thread::spawn(move || {
///             let features = [2.5f32, 1.0, -0.5];
///             let view = MatrixView::new("features", &features, 1, 3).unwrap();
///             let mut p = [0.0f32; 3];
///             estimator.predict(view, &mut p).unwrap();
///             // The target verified all three drafts and accepted the first two.
///             estimator.observe(view, &[3], &[2], Some(MatrixView::new("p", &p, 1, 3).unwrap()))
///         })
///     })
///     .collect();
/// let mut refitted = 0;
/// for worker in workers {
///     refitted += usize::from(worker.join().unwrap()?);
/// }
/// // The map update (the default) fits after the 1st, 2nd and 4th step of every round.
/// assert_eq!((refitted, estimator.num_refits()), (3, 3));
/// assert_eq!(estimator.steps_since_refit(), 4); // no round completed yet
/// assert_eq!(estimator.round_counts(), [4, 4, 4]);
/// # Ok::<(), av_core::Error>(())
/// ```
#[derive(Debug)]
pub struct AcceptanceEstimator {
    common: Common,
    rule: Rule,
}

/// The longest intercept pattern `predict` keeps on the stack (512 bytes; a longer one, for a
/// K whose least common multiple with the lane count passes it, is allocated).
const PATTERN_ON_STACK: usize = 64;

impl AcceptanceEstimator {
    /// A cold-started estimator: slope `init_slope`, every intercept `init_intercept`. Fails if
    /// the configuration does not [validate](EstimatorConfig::validate).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(4))?;
    /// assert_eq!(estimator.num_positions(), 4);
    /// assert_eq!(estimator.coefficients().intercepts, [-0.2; 4]);
    /// assert_eq!((estimator.num_refits(), estimator.steps_since_refit()), (0, 0));
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn new(config: EstimatorConfig) -> Result<Self> {
        config.validate()?;
        let intercepts = vec![config.init_intercept; config.num_positions];
        Ok(AcceptanceEstimator {
            rule: Rule::new(&config),
            common: Common::new(config.clone(), config.init_slope, &intercepts, 0, 0),
        })
    }

    /// The configuration (with the current `l2` and `damping`,
    /// [`set_regularization`](Self::set_regularization)).
    pub fn config(&self) -> EstimatorConfig {
        let [l2, damping] = self.common.regularization();
        EstimatorConfig {
            l2,
            damping,
            ..self.common.config.clone()
        }
    }

    /// Changes the ridge `l2` and the damping of every later refit, as if the estimator had been
    /// built with them (bit for bit what rebuilding it from its [`state`](Self::state) with the
    /// two fields changed gives). Atomic: a refit running concurrently uses the old pair or the
    /// new one. A bad value (negative or not finite) is refused naming it, and nothing changes.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
    /// estimator.set_regularization(0.5, 10.0)?;
    /// assert_eq!((estimator.config().l2, estimator.config().damping), (0.5, 10.0));
    /// let err = estimator.set_regularization(-1.0, 10.0).unwrap_err();
    /// assert_eq!(err.argument, "l2");
    /// assert_eq!(estimator.config().l2, 0.5); // unchanged
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn set_regularization(&self, l2: f64, damping: f64) -> Result<()> {
        config::check_regularization(l2, damping)?;
        *lock(&self.common.regularization) = [l2, damping];
        Ok(())
    }

    /// Number of draft positions K.
    pub fn num_positions(&self) -> usize {
        self.common.config.num_positions
    }

    /// A consistent copy of the current coefficients.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
    /// let c = estimator.coefficients();
    /// assert_eq!((c.slope, c.intercepts, c.version), (0.5, vec![-0.2, -0.2], 0));
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn coefficients(&self) -> Coefficients {
        self.common.coefficients.read()
    }

    /// Refits so far.
    pub fn num_refits(&self) -> u64 {
        self.common.coefficients.read().version
    }

    /// Observe calls since the last refit.
    pub fn steps_since_refit(&self) -> u64 {
        self.common.steps_since_refit.load(Ordering::SeqCst)
    }

    /// The open round's labeled drafts per position (either update).
    pub fn round_counts(&self) -> Vec<u64> {
        dispatch!(&self.rule, rule => rule.round_counts())
    }

    /// Acceptance probabilities `σ(ω·x + β_k)` for features `[R, K]`, written to `out` (`R·K`).
    ///
    /// Features are clamped to `±max_log_odds` first; a non-finite feature, a wrong column
    /// count or a wrong `out` length is an error and leaves `out` untouched.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
    /// // Cold start σ(0.5·x − 0.2): x = 0.4 gives exactly 0.5; x = 100 is clamped to 40.
    /// let features = [0.4f64, 100.0, 40.0, -3.0];
    /// let mut p = [0.0f32; 4];
    /// estimator.predict(MatrixView::new("features", &features, 2, 2)?, &mut p)?;
    /// assert_eq!(p[0], 0.5);
    /// assert_eq!(p[1], p[2]);
    /// assert!(p[3] < 0.2);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn predict<T: Copy + Into<f64>>(
        &self,
        features: MatrixView<'_, T>,
        out: &mut [f32],
    ) -> Result<()> {
        let k = self.common.config.num_positions;
        features.expect_cols("features", k)?;
        if out.len() != features.data().len() {
            return Err(Error::value(
                "out",
                format!(
                    "has {} elements, features have {}",
                    out.len(),
                    features.data().len()
                ),
            ));
        }
        // The features are a shared borrow, which cannot change during the call (the Python
        // bindings pass their own copy; the C ABI's callers must not write the buffer meanwhile),
        // so one vectorized check and then the probabilities, both read in place.
        observe::check_features(features.data())?;
        // The intercepts repeated to a whole number of lanes, on the stack when they fit (every
        // K up to 8, and K = 16, 32, 64 among others): no allocation per call.
        let period = logistic::pattern_len(k);
        let mut on_stack = [0.0f64; PATTERN_ON_STACK];
        let mut on_heap = Vec::new();
        let pattern = if period <= PATTERN_ON_STACK {
            &mut on_stack[..period]
        } else {
            on_heap.resize(period, 0.0);
            &mut on_heap[..]
        };
        let (slope, _) = self.common.coefficients.read_into_slice(&mut pattern[..k]);
        logistic::repeat_intercepts(pattern, k);
        let limit = self.common.config.max_log_odds;
        logistic::probabilities(features.data(), slope, pattern, limit, out);
        Ok(())
    }
}
