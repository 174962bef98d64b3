//! The online acceptance estimator.
//!
//! Predicts, for every drafted token, the probability that the target accepts it:
//! `p = σ(ω·x + β_k)` with `x = logit(q_max)` of the drafter's distribution at position `k`.
//! One slope is shared by all positions (it measures how well the drafter knows when it is
//! right, a property of the model pair) and each position has its own intercept (the base
//! acceptance rate, which falls with depth and with unpredictable content): `K + 1` parameters.
//!
//! The coefficients are fitted online from the target's own verdicts: every
//! [`AcceptanceEstimator::observe`] folds one decode step of labels into the round's sufficient
//! statistics ([`RoundStats`]); every `refit_interval` steps a damped Newton step
//! ([`NewtonStep`], capped by [`Bounds`]) replaces the coefficients and the statistics start
//! over.
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

pub use accumulator::{PositionSums, RoundStats, MAX_COUNT};
pub use coefficients::Coefficients;
pub use config::{EstimatorConfig, Update};
pub use fixed_point::FRACTION_BITS;
pub use histogram::{HistogramMemory, HistogramStats, MAX_BINS, MAX_BIN_COUNT, X_FRACTION_BITS};
pub use map::PriorWidths;
pub use memory::Memory;
pub use refit::{Bounds, NewtonStep};
pub use state::{EstimatorState, MapState, RefitReport};

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
use accumulator::Accumulator;
use coefficients::SharedCoefficients;
use histogram::{Binning, HistogramAccumulator};
use map::Prior;

/// The `map` update's state under the refit lock.
#[derive(Debug)]
struct MapFit {
    /// `θ = (ω, β)` published at the last round's end.
    reference: Vec<f64>,
    /// The open round drained from the accumulator so far.
    base: HistogramStats,
    memory: HistogramMemory,
    fitted_labels: u64,
    resets: u64,
}

/// What the refit lock guards.
#[derive(Debug)]
enum Locked {
    Vllm(Memory),
    Map(MapFit),
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
    config: EstimatorConfig,
    coefficients: SharedCoefficients,
    /// The open round under `vllm` (empty under `map`).
    accumulator: Accumulator,
    /// The open round under `map` (no bins under `vllm`).
    histogram: HistogramAccumulator,
    binning: Binning,
    /// The `map` prior (empty under `vllm`).
    prior: Prior,
    steps_since_refit: AtomicU64,
    /// Serializes refits and guards the memory of past rounds.
    refit_lock: Mutex<Locked>,
    /// `[l2, damping]`, changeable ([`AcceptanceEstimator::set_regularization`]): read once per
    /// refit, so a refit uses the old pair or the new one, never a mix (`config`'s own two
    /// fields are the construction values; [`AcceptanceEstimator::config`] shows these).
    regularization: Mutex<[f64; 2]>,
}

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
        let k = config.num_positions;
        let intercepts = vec![config.init_intercept; k];
        let locked = match config.update {
            Update::Vllm => Locked::Vllm(Memory::new(k)),
            Update::Map => Locked::Map(MapFit {
                reference: std::iter::once(config.init_slope)
                    .chain(intercepts.iter().copied())
                    .collect(),
                base: HistogramStats::new(k, config.bins),
                memory: HistogramMemory::new(k, config.bins),
                fitted_labels: 0,
                resets: 0,
            }),
        };
        Ok(Self::assemble(
            config.clone(),
            config.init_slope,
            &intercepts,
            0,
            0,
            locked,
        ))
    }

    fn assemble(
        config: EstimatorConfig,
        slope: f64,
        intercepts: &[f64],
        num_refits: u64,
        steps_since_refit: u64,
        locked: Locked,
    ) -> Self {
        let k = config.num_positions;
        let map = config.update == Update::Map;
        let (prior, bins) = if map {
            let widths = config.prior_widths();
            let prior = Prior::new(k, &widths, config.init_slope, config.init_intercept);
            (prior, config.bins)
        } else {
            (Prior::default(), 0)
        };
        AcceptanceEstimator {
            coefficients: SharedCoefficients::new(slope, intercepts, num_refits),
            accumulator: Accumulator::new(if map { 0 } else { k }),
            histogram: HistogramAccumulator::new(k, bins),
            binning: Binning::new(config.max_log_odds, config.bins),
            prior,
            steps_since_refit: AtomicU64::new(steps_since_refit),
            refit_lock: Mutex::new(locked),
            regularization: Mutex::new([config.l2, config.damping]),
            config,
        }
    }

    /// The configuration (with the current `l2` and `damping`,
    /// [`set_regularization`](Self::set_regularization)).
    pub fn config(&self) -> EstimatorConfig {
        let [l2, damping] = self.regularization();
        EstimatorConfig {
            l2,
            damping,
            ..self.config.clone()
        }
    }

    /// The current `[l2, damping]`.
    fn regularization(&self) -> [f64; 2] {
        *self
            .regularization
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
        *self
            .regularization
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = [l2, damping];
        Ok(())
    }

    /// Number of draft positions K.
    pub fn num_positions(&self) -> usize {
        self.config.num_positions
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
        self.coefficients.read()
    }

    /// Refits so far.
    pub fn num_refits(&self) -> u64 {
        self.coefficients.read().version
    }

    /// Observe calls since the last refit.
    pub fn steps_since_refit(&self) -> u64 {
        self.steps_since_refit.load(Ordering::SeqCst)
    }

    fn lock(&self) -> MutexGuard<'_, Locked> {
        // Nothing that holds the lock can panic halfway through updating the memory (plain
        // float arithmetic), so a poisoned lock still guards a consistent value.
        self.refit_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The open round's statistics (a consistent snapshot; the round goes on). Under `map`,
    /// where the round is kept as histograms ([`round_histogram`](Self::round_histogram)),
    /// all zeros.
    pub fn round_stats(&self) -> RoundStats {
        let _memory = self.lock();
        match self.config.update {
            Update::Vllm => self.accumulator.snapshot(),
            Update::Map => RoundStats::new(self.config.num_positions),
        }
    }

    /// The open round's histograms under `map` (a consistent snapshot; the round goes on);
    /// `None` under `vllm`.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::map(2))?;
    /// let view = MatrixView::new("features", &[1.5f32, -0.5], 1, 2)?;
    /// estimator.observe(view, &[2], &[1], None::<MatrixView<'_, f32>>)?;
    /// let round = estimator.round_histogram().expect("map keeps histograms");
    /// assert_eq!(round.position_counts(), [1, 1]);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn round_histogram(&self) -> Option<HistogramStats> {
        let mut locked = self.lock();
        match &mut *locked {
            Locked::Vllm(_) => None,
            Locked::Map(m) => {
                self.histogram.drain_into(&mut m.base);
                Some(m.base.clone())
            }
        }
    }

    /// The open round's labeled drafts per position (either update).
    pub fn round_counts(&self) -> Vec<u64> {
        match self.round_histogram() {
            Some(round) => round.position_counts(),
            None => self.round_stats().positions.iter().map(|p| p.n).collect(),
        }
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
        features.expect_cols("features", self.config.num_positions)?;
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
        self.check_features(features.data())?;
        let mut intercepts = Vec::with_capacity(self.config.num_positions);
        let (slope, _) = self.coefficients.read_into(&mut intercepts);
        let mut pattern = Vec::new();
        logistic::intercept_pattern(&intercepts, &mut pattern);
        let limit = self.config.max_log_odds;
        logistic::probabilities(features.data(), slope, &pattern, limit, out);
        Ok(())
    }
}
