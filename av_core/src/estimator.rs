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
//! statistics ([`crate::accumulator`]); every `refit_interval` steps a damped Newton step
//! ([`crate::refit`]) replaces the coefficients and the statistics start over.
//!
//! Concurrency: `predict`, `observe`, `refit` and the accessors take `&self` and may run on any
//! number of threads at once. Observations are accumulated lock-free and order-independently
//! (bit-identical results for the same set of observations); refits are serialized among
//! themselves; readers see either the old or the new coefficient vector, never a mix.

pub mod accumulator;
pub mod batch;
pub mod cholesky;
pub mod coefficients;
pub mod fixed_point;
pub mod histogram;
pub mod labels;
pub mod logistic;
pub mod map;
pub mod memory;
pub mod refit;
pub mod snapshot;

use crate::accumulator::{Accumulator, RoundStats, MAX_COUNT};
use crate::batch::{batch_stats, Predictions};
use crate::coefficients::{Coefficients, SharedCoefficients};
use crate::error::{ensure_finite, Error, Result};
use crate::histogram::{
    Binning, HistogramAccumulator, HistogramMemory, HistogramStats, MAX_BIN_COUNT,
};
use crate::labels::{num_labeled, validate_counts};
use crate::map::{FitBins, Prior, PriorWidths};
use crate::matrix::MatrixView;
use crate::memory::{chi_square_quantile, drift_statistic, Memory};
use crate::refit::{newton_step, ArrowheadSystem, Bounds, NewtonStep};
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};

/// How an estimator refits (see the [module documentation](self)).
///
/// # Example
///
/// ```rust
/// use av_core::estimator::Update;
///
/// assert_eq!(Update::default(), Update::Vllm);
/// assert_eq!(Update::parse("vllm"), Some(Update::Vllm));
/// assert_eq!(Update::Map.name(), "map");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Update {
    /// av_core's own update, opt-in (docs/estimator.md): per-position histograms, the MAP fit
    /// iterated to convergence under a prior centred on the cold start, refits after 1, 2, 4, …
    /// steps inside every round. Better log-loss on the shipped traces, but slower observes and
    /// refits than [`Update::Vllm`], so not the default.
    Map,
    /// vLLM 0.33.0's update, kept bit for bit (the default): IRLS moments of the round at the
    /// draft-time predictions, one damped Newton step per round (plus av_core's bounds, memory
    /// and drift test when configured).
    #[default]
    Vllm,
}

impl Update {
    /// The name the bindings use: `"map"` or `"vllm"`.
    pub fn name(self) -> &'static str {
        match self {
            Update::Map => "map",
            Update::Vllm => "vllm",
        }
    }

    /// The update named `name`, if any.
    pub fn parse(name: &str) -> Option<Update> {
        match name {
            "map" => Some(Update::Map),
            "vllm" => Some(Update::Vllm),
            _ => None,
        }
    }
}

/// Configuration of an [`AcceptanceEstimator`]. Defaults are vLLM 0.33.0's.
///
/// # Example
///
/// ```rust
/// use av_core::EstimatorConfig;
///
/// let mut config = EstimatorConfig::new(4);
/// assert_eq!(config.refit_interval, EstimatorConfig::DEFAULT_REFIT_INTERVAL);
/// assert_eq!((config.init_slope, config.init_intercept), (0.5, -0.2));
/// // Refit twice as often and remember past rounds, discounted by 0.9 per round.
/// config.refit_interval = 50;
/// config.memory = 0.9;
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct EstimatorConfig {
    /// Draft positions K (1 ≤ K ≤ [`EstimatorConfig::MAX_POSITIONS`]).
    pub num_positions: usize,
    /// Observe calls (decode steps) per round; a refit ends each round.
    pub refit_interval: u64,
    /// D: a round with D observations moves a coefficient half of a full Newton step.
    pub damping: f64,
    /// λ: ridge added to every diagonal entry of the Newton system.
    pub l2: f64,
    /// Cold-start slope ω.
    pub init_slope: f64,
    /// Cold-start intercept β_k, the same for every position.
    pub init_intercept: f64,
    /// Features are clamped to `[-max_log_odds, max_log_odds]`.
    pub max_log_odds: f64,
    /// Largest change of any coefficient in one refit (log-odds; `inf` = vLLM's unbounded step).
    pub max_step: f64,
    /// Largest slope (`inf` = unbounded).
    pub max_slope: f64,
    /// Largest absolute intercept (`inf` = unbounded).
    pub max_intercept: f64,
    /// γ: discount per round of the memory of past rounds' quadratic models (0 = vLLM's
    /// memoryless update; see [`crate::memory`]).
    pub memory: f64,
    /// Drift test threshold, in standard deviations of the round's χ² statistic: a round beyond
    /// it drops the memory (`inf` = never; see [`crate::memory`]).
    pub drift_z: f64,
    /// How the estimator refits: vLLM's [`Update::Vllm`] (the default) or av_core's
    /// [`Update::Map`] (opt-in).
    pub update: Update,
    /// `map`: bins per position over `[−max_log_odds, max_log_odds]` ([`crate::histogram`]).
    pub bins: usize,
    /// `map`: the prior's slope sd (`inf` = no slope prior; [`crate::map`]).
    pub prior_slope_sd: f64,
    /// `map`: the prior sd of the intercepts' common level (`inf` = unpenalized).
    pub prior_level_sd: f64,
    /// `map`: the prior sd of the intercepts' trend in depth (`0` = shrink toward the mean
    /// alone, `inf` = unpenalized).
    pub prior_trend_sd: f64,
    /// `map`: the prior sd of each intercept around the trend (`inf` = independent,
    /// unpenalized intercepts).
    pub prior_spread_sd: f64,
}

impl EstimatorConfig {
    /// Largest supported K (the Newton system has K + 1 ≤ 65 unknowns).
    pub const MAX_POSITIONS: usize = 64;
    /// vLLM refits every 100 decode steps.
    pub const DEFAULT_REFIT_INTERVAL: u64 = 100;
    /// vLLM's `DAMPING_OBSERVATIONS`.
    pub const DEFAULT_DAMPING: f64 = 50.0;
    /// vLLM's ridge `L2`.
    pub const DEFAULT_L2: f64 = 1e-3;
    /// Median slope fitted online across five model pairs (vLLM's cold start).
    pub const DEFAULT_INIT_SLOPE: f64 = 0.5;
    /// Median intercept fitted online across the same five pairs (vLLM's cold start).
    pub const DEFAULT_INIT_INTERCEPT: f64 = -0.2;
    /// vLLM's clamp of the log-odds feature.
    pub const DEFAULT_MAX_LOG_ODDS: f64 = 40.0;
    /// Upper bound on `max_log_odds`: keeps every accumulated term inside the fixed-point range.
    pub const MAX_LOG_ODDS_LIMIT: f64 = 100.0;
    /// Default step cap: healthy rounds move coefficients by a fraction of this, while one
    /// adversarial round can no longer throw an intercept to −10⁶ (see [`crate::refit::Bounds`]).
    pub const DEFAULT_MAX_STEP: f64 = 4.0;
    /// Default slope cap (fitted slopes across model pairs are 0.45–0.59).
    pub const DEFAULT_MAX_SLOPE: f64 = 10.0;
    /// Default drift test: a 0.1% false alarm per round under a stationary workload.
    pub const DEFAULT_DRIFT_Z: f64 = 3.09;
    /// Default intercept cap: σ(±15) is within 3e-7 of 0 or 1.
    pub const DEFAULT_MAX_INTERCEPT: f64 = 15.0;

    /// Default memory discount γ per round (`memory`), from the study in `docs/memory.md`: on
    /// both shipped traces, scored prequentially, higher AUC and lower log-loss than γ = 0 (90%
    /// bootstrap intervals over prompts exclude no change), less coefficient jitter over 20
    /// seeds, drift tracked as fast. Its lower ECE is within noise; γ = 0.9
    /// ranks better still but calibrates worse on the second trace. `0.0` is vLLM's memoryless
    /// update, which `av_core.vllm` always uses.
    pub const DEFAULT_MEMORY: f64 = 0.8;
    /// Default bins per position of the `map` update (docs/estimator.md: 32–256 measure the
    /// same; 16 is coarser).
    pub const DEFAULT_BINS: usize = crate::histogram::DEFAULT_BINS;
    /// Default slope sd of the `map` prior: real pairs fit 0.44–0.6, within one sd of 0.5.
    pub const DEFAULT_PRIOR_SLOPE_SD: f64 = PriorWidths::DEFAULT.slope_sd;
    /// Default sd of the intercepts' level in the `map` prior.
    pub const DEFAULT_PRIOR_LEVEL_SD: f64 = PriorWidths::DEFAULT.level_sd;
    /// Default sd of the intercepts' trend in depth in the `map` prior.
    pub const DEFAULT_PRIOR_TREND_SD: f64 = PriorWidths::DEFAULT.trend_sd;
    /// Default sd of each intercept around the trend in the `map` prior.
    pub const DEFAULT_PRIOR_SPREAD_SD: f64 = PriorWidths::DEFAULT.spread_sd;

    /// av_core's opt-in `map` update on `num_positions` positions: [`EstimatorConfig::new`]
    /// with `update = Update::Map` and the map defaults (bins, prior widths).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::estimator::Update;
    /// use av_core::EstimatorConfig;
    ///
    /// let config = EstimatorConfig::map(4);
    /// assert_eq!(config.update, Update::Map);
    /// assert_eq!(config.bins, EstimatorConfig::DEFAULT_BINS);
    /// ```
    pub fn map(num_positions: usize) -> Self {
        EstimatorConfig {
            update: Update::Map,
            ..EstimatorConfig::new(num_positions)
        }
    }

    /// The `map` prior's widths.
    pub fn prior_widths(&self) -> PriorWidths {
        PriorWidths {
            slope_sd: self.prior_slope_sd,
            level_sd: self.prior_level_sd,
            trend_sd: self.prior_trend_sd,
            spread_sd: self.prior_spread_sd,
        }
    }

    /// The defaults for `num_positions` draft positions.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::EstimatorConfig;
    ///
    /// let config = EstimatorConfig::new(3);
    /// assert_eq!(config.num_positions, 3);
    /// assert_eq!((config.damping, config.l2), (50.0, 1e-3));
    /// assert_eq!(config.memory, EstimatorConfig::DEFAULT_MEMORY); // 0.8; 0.0 is vLLM's update
    /// ```
    pub fn new(num_positions: usize) -> Self {
        EstimatorConfig {
            num_positions,
            refit_interval: Self::DEFAULT_REFIT_INTERVAL,
            damping: Self::DEFAULT_DAMPING,
            l2: Self::DEFAULT_L2,
            init_slope: Self::DEFAULT_INIT_SLOPE,
            init_intercept: Self::DEFAULT_INIT_INTERCEPT,
            max_log_odds: Self::DEFAULT_MAX_LOG_ODDS,
            max_step: Self::DEFAULT_MAX_STEP,
            max_slope: Self::DEFAULT_MAX_SLOPE,
            max_intercept: Self::DEFAULT_MAX_INTERCEPT,
            memory: Self::DEFAULT_MEMORY,
            drift_z: Self::DEFAULT_DRIFT_Z,
            update: Update::default(),
            bins: Self::DEFAULT_BINS,
            prior_slope_sd: Self::DEFAULT_PRIOR_SLOPE_SD,
            prior_level_sd: Self::DEFAULT_PRIOR_LEVEL_SD,
            prior_trend_sd: Self::DEFAULT_PRIOR_TREND_SD,
            prior_spread_sd: Self::DEFAULT_PRIOR_SPREAD_SD,
        }
    }

    /// vLLM 0.33.0's estimator (`OnlineAcceptanceEstimator`) for `num_positions` positions: the
    /// defaults' refit interval, damping, ridge, cold start and clamp (all vLLM's), with vLLM's
    /// memoryless (`memory = 0`) and unbounded (`max_step`, `max_slope`, `max_intercept` = `inf`)
    /// update. The preset `av_core.vllm` starts from (it keeps the default bounds unless asked
    /// for vLLM's exact update).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::EstimatorConfig;
    ///
    /// let vllm = EstimatorConfig::vllm(4);
    /// assert_eq!((vllm.refit_interval, vllm.damping, vllm.l2), (100, 50.0, 1e-3));
    /// assert_eq!((vllm.init_slope, vllm.init_intercept, vllm.max_log_odds), (0.5, -0.2, 40.0));
    /// assert_eq!((vllm.memory, vllm.max_step), (0.0, f64::INFINITY));
    /// assert!(vllm.validate().is_ok());
    /// ```
    pub fn vllm(num_positions: usize) -> Self {
        EstimatorConfig {
            memory: 0.0,
            max_step: f64::INFINITY,
            max_slope: f64::INFINITY,
            max_intercept: f64::INFINITY,
            ..Self::new(num_positions)
        }
    }

    /// The refit limits of this configuration.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::refit::Bounds;
    /// use av_core::EstimatorConfig;
    ///
    /// let bounds = EstimatorConfig::new(2).bounds();
    /// assert_eq!(bounds, Bounds { max_step: 4.0, max_slope: 10.0, max_intercept: 15.0 });
    /// ```
    pub fn bounds(&self) -> Bounds {
        Bounds {
            max_step: self.max_step,
            max_slope: self.max_slope,
            max_intercept: self.max_intercept,
        }
    }

    /// Checks every field, naming the first bad one.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::EstimatorConfig;
    ///
    /// let mut config = EstimatorConfig::new(4);
    /// assert!(config.validate().is_ok());
    /// config.memory = 1.0; // γ = 1 would never forget anything
    /// assert_eq!(config.validate().unwrap_err().argument, "memory");
    /// assert!(EstimatorConfig::new(65).validate().is_err()); // K ≤ MAX_POSITIONS = 64
    /// ```
    pub fn validate(&self) -> Result<()> {
        if self.num_positions == 0 || self.num_positions > Self::MAX_POSITIONS {
            return Err(Error::value(
                "num_positions",
                format!(
                    "must be between 1 and {}, got {}",
                    Self::MAX_POSITIONS,
                    self.num_positions
                ),
            ));
        }
        if self.refit_interval == 0 {
            return Err(Error::value("refit_interval", "must be at least 1, got 0"));
        }
        ensure_finite("damping", self.damping)?;
        if self.damping < 0.0 {
            return Err(Error::value(
                "damping",
                format!("must be non-negative, got {}", self.damping),
            ));
        }
        ensure_finite("l2", self.l2)?;
        if self.l2 < 0.0 {
            return Err(Error::value(
                "l2",
                format!("must be non-negative, got {}", self.l2),
            ));
        }
        ensure_finite("init_slope", self.init_slope)?;
        if self.init_slope < 0.0 {
            return Err(Error::value(
                "init_slope",
                format!("must be non-negative, got {}", self.init_slope),
            ));
        }
        ensure_finite("init_intercept", self.init_intercept)?;
        if !(self.max_log_odds > 0.0 && self.max_log_odds <= Self::MAX_LOG_ODDS_LIMIT) {
            return Err(Error::value(
                "max_log_odds",
                format!(
                    "must be in (0, {}], got {}",
                    Self::MAX_LOG_ODDS_LIMIT,
                    self.max_log_odds
                ),
            ));
        }
        for (argument, value) in [
            ("max_step", self.max_step),
            ("max_slope", self.max_slope),
            ("max_intercept", self.max_intercept),
        ] {
            if value.is_nan() || value <= 0.0 {
                return Err(Error::value(
                    argument,
                    format!("must be positive (inf for no limit), got {value}"),
                ));
            }
        }
        if self.drift_z.is_nan() || self.drift_z <= 0.0 {
            return Err(Error::value(
                "drift_z",
                format!(
                    "must be positive (inf disables the test), got {}",
                    self.drift_z
                ),
            ));
        }
        if !(0.0..1.0).contains(&self.memory) {
            return Err(Error::value(
                "memory",
                format!("must be in [0, 1), got {}", self.memory),
            ));
        }
        if self.init_slope > self.max_slope {
            return Err(Error::value(
                "init_slope",
                format!(
                    "must be at most max_slope = {}, got {}",
                    self.max_slope, self.init_slope
                ),
            ));
        }
        if self.init_intercept.abs() > self.max_intercept {
            return Err(Error::value(
                "init_intercept",
                format!(
                    "must be within ±max_intercept = {}, got {}",
                    self.max_intercept, self.init_intercept
                ),
            ));
        }
        if self.bins == 0 || self.bins > crate::histogram::MAX_BINS {
            return Err(Error::value(
                "bins",
                format!(
                    "must be between 1 and {}, got {}",
                    crate::histogram::MAX_BINS,
                    self.bins
                ),
            ));
        }
        for (argument, value, zero_allowed) in [
            ("prior_slope_sd", self.prior_slope_sd, false),
            ("prior_level_sd", self.prior_level_sd, false),
            ("prior_trend_sd", self.prior_trend_sd, true),
            ("prior_spread_sd", self.prior_spread_sd, false),
        ] {
            let ok = if zero_allowed {
                value >= 0.0
            } else {
                value > 0.0
            };
            if !ok {
                let rule = if zero_allowed {
                    "non-negative"
                } else {
                    "positive"
                };
                return Err(Error::value(
                    argument,
                    format!("must be {rule} (inf for no prior on it), got {value}"),
                ));
            }
        }
        Ok(())
    }
}

/// Everything an estimator is: config, coefficients, the open round and its counters.
/// [`AcceptanceEstimator::state`] and [`AcceptanceEstimator::from_state`] round-trip it bit-exactly.
///
/// # Example
///
/// ```rust
/// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
///
/// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
/// let features = MatrixView::new("features", &[1.0f32, 0.5], 1, 2)?;
/// estimator.observe(features, &[2], &[1], None::<MatrixView<'_, f32>>)?;
/// let state = estimator.state();
/// assert_eq!((state.slope, state.intercepts.clone()), (0.5, vec![-0.2, -0.2]));
/// assert_eq!((state.steps_since_refit, state.stats.total_count()), (1, 2));
/// // Under map (opt-in) the open round is histograms, and its first step is fitted.
/// let estimator = AcceptanceEstimator::new(EstimatorConfig::map(2))?;
/// estimator.observe(features, &[2], &[1], None::<MatrixView<'_, f32>>)?;
/// let state = estimator.state();
/// assert_eq!((state.num_refits, state.map.unwrap().round.total_count()), (1, 2));
/// # Ok::<(), av_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct EstimatorState {
    /// The configuration.
    pub config: EstimatorConfig,
    /// Slope ω.
    pub slope: f64,
    /// Intercepts β_k.
    pub intercepts: Vec<f64>,
    /// The open round's statistics.
    pub stats: RoundStats,
    /// Observe calls since the last refit.
    pub steps_since_refit: u64,
    /// Refits so far.
    pub num_refits: u64,
    /// The memory of past rounds (all zeros when `config.memory` is 0). `vllm` update only
    /// (empty under `map`).
    pub memory: Memory,
    /// The `map` update's state (`None` under `vllm`).
    pub map: Option<MapState>,
}

impl EstimatorState {
    /// The same estimator moved to `update`: the configuration (with `update` set) and the
    /// coefficients are kept; the open round, the memory of past rounds and the drift resets
    /// start over (neither update's statistics can be converted into the other's). An
    /// estimator already on `update` is returned unchanged.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::estimator::Update;
    /// use av_core::{AcceptanceEstimator, EstimatorConfig};
    ///
    /// let mut state = AcceptanceEstimator::new(EstimatorConfig::new(2))?.state();
    /// state.intercepts = vec![0.7, -0.1];
    /// let moved = state.clone().with_update(Update::Map);
    /// assert_eq!(moved.config.update, Update::Map);
    /// assert_eq!(moved.intercepts, [0.7, -0.1]);
    /// let estimator = AcceptanceEstimator::from_state(&moved)?;
    /// assert_eq!(estimator.coefficients().intercepts, [0.7, -0.1]);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn with_update(mut self, update: Update) -> EstimatorState {
        if self.config.update == update {
            return self;
        }
        let k = self.config.num_positions;
        self.config.update = update;
        self.stats = RoundStats::new(k);
        self.memory = Memory::new(k);
        self.steps_since_refit = 0;
        self.map = (update == Update::Map).then(|| MapState {
            reference_slope: self.slope,
            reference_intercepts: self.intercepts.clone(),
            round: HistogramStats::new(k, self.config.bins),
            memory: HistogramMemory::new(k, self.config.bins),
            fitted_labels: 0,
            resets: 0,
        });
        self
    }
}

/// The `map` update's part of an [`EstimatorState`].
#[derive(Clone, Debug, PartialEq)]
pub struct MapState {
    /// The slope published at the last round's end: every fit starts there, is bounded around
    /// it, and the drift test scores the round there.
    pub reference_slope: f64,
    /// The intercepts published at the last round's end.
    pub reference_intercepts: Vec<f64>,
    /// The open round's histograms.
    pub round: HistogramStats,
    /// The discounted histograms of past rounds.
    pub memory: HistogramMemory,
    /// The open round's labels that the last fit saw (a fit within the round is skipped while
    /// nothing new arrived).
    pub fitted_labels: u64,
    /// Rounds whose drift test dropped the memory.
    pub resets: u64,
}

/// What one refit consumed and did (see the example on [`AcceptanceEstimator::refit`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RefitReport {
    /// The round's statistics (now cleared from the estimator); all zeros under `map`.
    pub stats: RoundStats,
    /// The Newton step computed from them, before [`Bounds`] applied; under `map`, the fit's
    /// change from the reference coefficients, before the bounds.
    pub step: NewtonStep,
    /// `map`: the histograms the fit consumed (the round at a round's end; memory plus the
    /// open round within one). `None` under `vllm`.
    pub histogram: Option<HistogramStats>,
    /// `map`: the round's drift statistic at the reference coefficients (round ends only).
    pub drift_statistic: Option<f64>,
    /// `map`: Newton iterations of the fit (0 when the statistics held nothing new).
    pub iterations: u32,
}

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
/// for worker in workers {
///     assert!(!worker.join().unwrap()?); // no round completed yet
/// }
/// assert_eq!(estimator.steps_since_refit(), 4);
/// assert_eq!(estimator.round_stats().total_count(), 12);
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
}

/// Whether every value of `source` passes `ok`, in one branch-free pass that vectorizes.
#[inline]
fn all_pass<T: Copy + Into<f64>>(source: &[T], ok: impl Fn(f64) -> bool) -> bool {
    source
        .iter()
        .fold(true, |all, &value| all & ok(value.into()))
}

/// Fails on the first given prediction outside `[0, 1]` (or NaN).
fn check_predictions<P: Copy + Into<f64>>(predictions: Option<MatrixView<'_, P>>) -> Result<()> {
    let Some(predictions) = predictions else {
        return Ok(());
    };
    let in_range = |p: P| (0.0..=1.0).contains(&p.into());
    if all_pass(predictions.data(), |p| (0.0..=1.0).contains(&p)) {
        return Ok(());
    }
    let (index, p) = first_failure(predictions.data(), in_range);
    Err(Error::value(
        "predictions",
        format!("must be finite and in [0, 1], got {p} at flat index {index}"),
    ))
}

/// The error of a call whose input failed a check while being used but passed it when read
/// again: another thread wrote the buffer during the call.
fn changed_while_read(argument: &'static str) -> Error {
    Error::buffer_changed(argument)
}

/// The first element failing `ok`, with its index (called when one fails; `(0, NaN)` if none
/// does after all).
fn first_failure<T: Copy + Into<f64>>(data: &[T], ok: impl Fn(T) -> bool) -> (usize, f64) {
    data.iter()
        .enumerate()
        .find(|(_, &v)| !ok(v))
        .map_or((0, f64::NAN), |(i, &v)| (i, v.into()))
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
            let empty = Prior {
                precision: Vec::new(),
                mean: Vec::new(),
            };
            (empty, 0)
        };
        AcceptanceEstimator {
            coefficients: SharedCoefficients::new(slope, intercepts, num_refits),
            accumulator: Accumulator::new(if map { 0 } else { k }),
            histogram: HistogramAccumulator::new(k, bins),
            binning: Binning::new(config.max_log_odds, config.bins),
            prior,
            steps_since_refit: AtomicU64::new(steps_since_refit),
            refit_lock: Mutex::new(locked),
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EstimatorConfig {
        &self.config
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

    /// Adds another round's histograms to the open round, exactly (integers): the `map`
    /// counterpart of [`add_round_stats`](Self::add_round_stats), e.g. the other ranks' share
    /// of a round pooled across data-parallel ranks. Histograms no observations can produce
    /// ([`HistogramStats::validate`]) are refused, and so is a `vllm` estimator; on any error
    /// nothing is added.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let view = MatrixView::new("features", &[1.5f32, -0.5], 1, 2)?;
    /// let none = None::<MatrixView<'_, f32>>;
    /// let (rank0, rank1) = (
    ///     AcceptanceEstimator::new(EstimatorConfig::map(2))?,
    ///     AcceptanceEstimator::new(EstimatorConfig::map(2))?,
    /// );
    /// rank0.observe(view, &[2], &[1], none)?;
    /// rank1.observe(view, &[2], &[0], none)?;
    /// rank0.add_round_histogram(&rank1.round_histogram().unwrap())?;
    /// assert_eq!(rank0.round_counts(), [2, 1]); // rank 1's draft 2 followed a rejection
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn add_round_histogram(&self, round: &HistogramStats) -> Result<()> {
        if self.config.update != Update::Map {
            return Err(Error::value(
                "round_stats",
                "this estimator's update is vllm, which keeps IRLS moments, not histograms",
            ));
        }
        round.validate(
            "round_stats",
            self.config.num_positions,
            self.config.bins,
            self.config.max_log_odds,
        )?;
        self.add_to_histogram("round_stats", round)
    }

    /// Adds to the open `map` round unless a bin would pass [`MAX_BIN_COUNT`] labels (the bound
    /// a restored state must meet, which keeps every position within [`MAX_COUNT`] too, so that
    /// every state this estimator reaches saves and loads again); then nothing changes and the
    /// error names `argument`.
    fn add_to_histogram(&self, argument: &'static str, step: &HistogramStats) -> Result<()> {
        self.histogram.try_add(step).map_err(|(k, b)| {
            Error::value(
                argument,
                format!(
                    "would take position {k}, bin {b}'s count in this round past \
                     {MAX_BIN_COUNT} (refit first)"
                ),
            )
        })
    }

    /// Adds another round's statistics to the open round, exactly (fixed-point integers): for
    /// example the other ranks' share of a round pooled across data-parallel ranks, so that the
    /// next refit fits the pooled round. Statistics no sequence of observations can produce
    /// ([`RoundStats::validate`]: a negative weight sum, a count past the bound) are refused;
    /// on any error nothing is added.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let view = MatrixView::new("features", &[1.5f32, -0.5], 1, 2)?;
    /// // vLLM's update pools IRLS moments (add_round_histogram pools map's histograms).
    /// let (one, other) = (EstimatorConfig::new(2), EstimatorConfig::new(2));
    /// let (rank0, rank1) = (AcceptanceEstimator::new(one)?, AcceptanceEstimator::new(other)?);
    /// rank0.observe(view, &[2], &[1], None::<MatrixView<'_, f32>>)?;
    /// rank1.observe(view, &[2], &[0], None::<MatrixView<'_, f32>>)?;
    /// rank0.add_round_stats(&rank1.round_stats())?; // rank 0 now holds the pooled round
    /// assert_eq!(rank0.round_stats().total_count(), 3);
    /// assert!(rank0.add_round_stats(&av_core::accumulator::RoundStats::new(3)).is_err());
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn add_round_stats(&self, stats: &RoundStats) -> Result<()> {
        if self.config.update != Update::Vllm {
            return Err(Error::value(
                "round_stats",
                "this estimator's update is map, which keeps histograms \
                 (add_round_histogram), not IRLS moments",
            ));
        }
        // The same invariants a loaded state must satisfy: statistics no sequence of
        // observations could produce (a negative weight sum, a count past MAX_COUNT) are
        // refused before anything is added.
        stats.validate(
            "round_stats",
            self.config.num_positions,
            self.config.max_log_odds,
        )?;
        self.add_to_round("round_stats", stats)
    }

    /// Adds to the current round unless a position's count would pass [`MAX_COUNT`] (the
    /// bound a restored state must meet, so that every state this estimator reaches saves and
    /// loads again); then nothing changes and the error names `argument`.
    fn add_to_round(&self, argument: &'static str, stats: &RoundStats) -> Result<()> {
        self.accumulator.try_add(stats).map_err(|k| {
            Error::value(
                argument,
                format!(
                    "would take position {k}'s count in this round past {MAX_COUNT} \
                     (refit first)"
                ),
            )
        })
    }

    /// The drift test's statistic `T = gᵀ(H + λI)⁻¹g` of a round, with this estimator's ridge
    /// (see [`crate::memory`]): about χ² with K + 1 degrees of freedom while the coefficients the
    /// round was collected under still fit the workload, larger when they do not.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::accumulator::RoundStats;
    /// use av_core::{AcceptanceEstimator, EstimatorConfig};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(1))?;
    /// let mut round = RoundStats::new(1);
    /// round.positions[0].add_observation(1.0, 0.5, true);
    /// round.positions[0].add_observation(1.0, 0.5, false);
    /// assert_eq!(estimator.drift_statistic(&round), 0.0); // predictions match on average
    /// for _ in 0..8 {
    ///     round.positions[0].add_observation(1.0, 0.5, false);
    /// }
    /// assert!(estimator.drift_statistic(&round) > 5.0);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn drift_statistic(&self, stats: &RoundStats) -> f64 {
        drift_statistic(&ArrowheadSystem::from_round(
            &stats.to_float(),
            self.config.l2,
        ))
    }

    /// Fails on the first non-finite feature.
    fn check_features<T: Copy + Into<f64>>(&self, features: &[T]) -> Result<()> {
        let finite = |x: T| x.into().is_finite();
        if all_pass(features, f64::is_finite) {
            return Ok(());
        }
        let (index, x) = first_failure(features, finite);
        Err(Error::value(
            "features",
            format!("must be finite, got {x} at flat index {index}"),
        ))
    }

    /// The error for a step whose features or predictions failed a check: the first bad
    /// prediction, else the first bad feature (the order the checks have always had), else,
    /// when a second read finds none, that `argument` changed while the call read it.
    fn culprit<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        features: MatrixView<'_, T>,
        predictions: Option<MatrixView<'_, P>>,
        argument: &'static str,
    ) -> Error {
        check_predictions(predictions)
            .and_then(|()| self.check_features(features.data()))
            .err()
            .unwrap_or_else(|| changed_while_read(argument))
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

    /// One decode step's statistics without adding them anywhere: validates every argument and
    /// returns what [`observe`](Self::observe) would accumulate.
    ///
    /// `features` `[R, K]`; `num_admitted[r]` drafts of request `r` were verified and the first
    /// `num_accepted[r]` of them accepted; `predictions` `[R, K]` are the probabilities made at
    /// draft time, used as IRLS weights (without them the current coefficients predict).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(4))?;
    /// let features = MatrixView::new("features", &[3.0f32, 2.0, 1.0, 0.0], 1, 4)?;
    /// let stats = estimator.step_stats(features, &[4], &[1], None::<MatrixView<'_, f32>>)?;
    /// // One accepted draft and the first rejection are labeled; the rest say nothing.
    /// let counts: Vec<u64> = stats.positions.iter().map(|p| p.n).collect();
    /// assert_eq!(counts, [1, 1, 0, 0]);
    /// assert_eq!(estimator.round_stats().total_count(), 0); // nothing was added
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn step_stats<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        features: MatrixView<'_, T>,
        num_admitted: &[i64],
        num_accepted: &[i64],
        predictions: Option<MatrixView<'_, P>>,
    ) -> Result<RoundStats> {
        let k = self.config.num_positions;
        let counts = self.checked_counts(features, num_admitted, num_accepted, predictions)?;

        let mut intercepts = Vec::with_capacity(k);
        let (slope, _) = self.coefficients.read_into(&mut intercepts);
        // Features and predictions are checked in one vectorized pass each and summed in place:
        // they are shared borrows, which cannot change during the call (the Python bindings
        // pass their own copies; the C ABI's callers must not write the buffers meanwhile).
        let features_ok = all_pass(features.data(), f64::is_finite);
        let given = match &predictions {
            Some(given) => {
                if !all_pass(given.data(), |p| (0.0..=1.0).contains(&p)) {
                    return Err(self.culprit(features, predictions, "predictions"));
                }
                Predictions::Given(given.data())
            }
            None => Predictions::Current {
                slope,
                intercepts: &intercepts,
            },
        };
        if !features_ok {
            return Err(self.culprit(features, predictions, "features"));
        }
        Ok(batch_stats(
            k,
            features.data(),
            &counts,
            given,
            self.config.max_log_odds,
        ))
    }

    /// One decode step's histograms without adding them anywhere: validates every argument
    /// (as [`step_stats`](Self::step_stats); `predictions` are checked, and not used: the
    /// `map` refit recomputes every probability) and returns what
    /// [`observe`](Self::observe) adds under `map`.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::map(4))?;
    /// let features = MatrixView::new("features", &[3.0f32, 2.0, 1.0, 0.0], 1, 4)?;
    /// let step = estimator.step_histogram(features, &[4], &[1], None::<MatrixView<'_, f32>>)?;
    /// assert_eq!(step.position_counts(), [1, 1, 0, 0]);
    /// assert_eq!(step.accepted.iter().sum::<u64>(), 1);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn step_histogram<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        features: MatrixView<'_, T>,
        num_admitted: &[i64],
        num_accepted: &[i64],
        predictions: Option<MatrixView<'_, P>>,
    ) -> Result<HistogramStats> {
        let k = self.config.num_positions;
        let counts = self.checked_counts(features, num_admitted, num_accepted, predictions)?;
        if let Some(given) = &predictions {
            if !all_pass(given.data(), |p| (0.0..=1.0).contains(&p)) {
                return Err(self.culprit(features, predictions, "predictions"));
            }
        }
        // One read of each feature: every one is checked, and the labeled ones are binned from
        // the same read (a buffer another thread rewrites meanwhile can fail the call, never
        // get an unchecked value in).
        let mut step = HistogramStats::new(k, self.config.bins);
        let bins = self.config.bins;
        let mut finite = true;
        for (values, &(admitted, accepted)) in features.data().chunks_exact(k).zip(&counts) {
            let labeled = num_labeled(admitted, accepted);
            for (position, &value) in values.iter().enumerate() {
                let x: f64 = value.into();
                finite &= x.is_finite();
                if position < labeled {
                    let (bin, offset) = self.binning.locate(x);
                    let index = position * bins + bin;
                    step.count[index] += 1;
                    step.accepted[index] += u64::from(position < accepted);
                    step.x_sum[index] += offset;
                }
            }
        }
        if !finite {
            return Err(self.culprit(features, predictions, "features"));
        }
        Ok(step)
    }

    /// Shapes and counts of one step, validated (the culprit named in the order predictions,
    /// features, counts when a count is wrong).
    fn checked_counts<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        features: MatrixView<'_, T>,
        num_admitted: &[i64],
        num_accepted: &[i64],
        predictions: Option<MatrixView<'_, P>>,
    ) -> Result<Vec<(usize, usize)>> {
        let k = self.config.num_positions;
        features.expect_cols("features", k)?;
        let rows = features.rows();
        if num_admitted.len() != rows {
            return Err(Error::value(
                "num_admitted",
                format!(
                    "has {} entries, features have {rows} rows",
                    num_admitted.len()
                ),
            ));
        }
        if num_accepted.len() != rows {
            return Err(Error::value(
                "num_accepted",
                format!(
                    "has {} entries, features have {rows} rows",
                    num_accepted.len()
                ),
            ));
        }
        if let Some(predictions) = &predictions {
            predictions.expect_cols("predictions", k)?;
            predictions.expect_rows("predictions", rows)?;
        }
        // One branch-free pass per input; the searches that name a culprit (in the order:
        // predictions, features, counts) run only on failure.
        let mut valid = true;
        let counts: Vec<(usize, usize)> = num_admitted
            .iter()
            .zip(num_accepted)
            .map(|(&admitted, &accepted)| {
                valid &= (0 <= accepted) & (accepted <= admitted) & (admitted <= k as i64);
                (admitted as usize, accepted as usize)
            })
            .collect();
        if !valid {
            check_predictions(predictions)?;
            self.check_features(features.data())?;
            for row in 0..rows {
                validate_counts(row, num_admitted[row], num_accepted[row], k)?;
            }
            return Err(changed_while_read("num_admitted"));
        }
        Ok(counts)
    }

    /// Folds one decode step of verdicts into the round (see [`step_stats`](Self::step_stats)
    /// for the arguments). Returns `true` when this call completed a round and refitted.
    ///
    /// Adds without a lock (the call that completes a round takes the refit lock to end it); on
    /// a bad argument nothing changes. The inputs are shared borrows: they must not change
    /// during the call (the Python bindings pass their own copies of the caller's arrays).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let mut config = EstimatorConfig::new(2);
    /// config.refit_interval = 2;
    /// let estimator = AcceptanceEstimator::new(config)?;
    /// // Two requests: both drafts of the first accepted, the second's first draft rejected.
    /// let features = [1.8f32, 1.2, -0.7, 0.4];
    /// let view = MatrixView::new("features", &features, 2, 2)?;
    /// let none = None::<MatrixView<'_, f32>>;
    /// assert!(!estimator.observe(view, &[2, 2], &[2, 0], none)?);
    /// assert!(estimator.observe(view, &[2, 2], &[2, 0], none)?); // second step ends the round
    /// assert_eq!(estimator.num_refits(), 1);
    /// // A rejected call: more accepted than admitted.
    /// assert!(estimator.observe(view, &[1, 2], &[2, 0], none).is_err());
    /// assert_eq!(estimator.steps_since_refit(), 0);
    /// // Under map (opt-in) the round's 1st, 2nd, 4th, … steps are fitted too.
    /// let mut config = EstimatorConfig::map(2);
    /// config.refit_interval = 3;
    /// let estimator = AcceptanceEstimator::new(config)?;
    /// assert!(estimator.observe(view, &[2, 2], &[2, 0], none)?); // the round's 1st step: fit
    /// assert!(estimator.observe(view, &[2, 2], &[2, 0], none)?); // its 2nd: fit
    /// assert!(estimator.observe(view, &[2, 2], &[2, 0], none)?); // its 3rd ends the round
    /// assert_eq!(estimator.num_refits(), 3);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn observe<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        features: MatrixView<'_, T>,
        num_admitted: &[i64],
        num_accepted: &[i64],
        predictions: Option<MatrixView<'_, P>>,
    ) -> Result<bool> {
        match self.config.update {
            Update::Vllm => {
                let stats = self.step_stats(features, num_admitted, num_accepted, predictions)?;
                self.add_valid_step("num_admitted", &stats)
            }
            Update::Map => {
                let step =
                    self.step_histogram(features, num_admitted, num_accepted, predictions)?;
                self.add_to_histogram("num_admitted", &step)?;
                Ok(self.count_map_step())
            }
        }
    }

    /// [`observe`](Self::observe) without counting the step: the verdicts join the open round
    /// and the schedule does not move (no refit runs). For callers that run the schedule
    /// themselves, with [`refit`](Self::refit) and [`refit_within_round`](Self::refit_within_round)
    /// (`av_core.vllm`'s drop-in). Validated like `observe`; on a bad argument nothing changes.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
    /// let view = MatrixView::new("features", &[1.5f32, -0.5], 1, 2)?;
    /// estimator.add_observations(view, &[2], &[1], None::<MatrixView<'_, f32>>)?;
    /// assert_eq!((estimator.num_refits(), estimator.steps_since_refit()), (0, 0));
    /// assert_eq!(estimator.round_counts(), [1, 1]);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn add_observations<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        features: MatrixView<'_, T>,
        num_admitted: &[i64],
        num_accepted: &[i64],
        predictions: Option<MatrixView<'_, P>>,
    ) -> Result<()> {
        match self.config.update {
            Update::Vllm => {
                let stats = self.step_stats(features, num_admitted, num_accepted, predictions)?;
                self.add_to_round("num_admitted", &stats)?;
            }
            Update::Map => {
                let step =
                    self.step_histogram(features, num_admitted, num_accepted, predictions)?;
                self.add_to_histogram("num_admitted", &step)?;
            }
        }
        Ok(())
    }

    /// Adds one step's statistics and counts the step; refits when the round is complete.
    /// Returns `true` when this call refitted.
    ///
    /// With [`step_stats`](Self::step_stats) this splits `observe` in two, so the statistics can
    /// be computed off the critical path and added later. Statistics that no observations could
    /// give (the wrong number of positions, or failing [`RoundStats::validate`]) are refused and
    /// change nothing.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
    /// let features = MatrixView::new("features", &[2.0f32, 1.0], 1, 2)?;
    /// let stats = estimator.step_stats(features, &[2], &[2], None::<MatrixView<'_, f32>>)?;
    /// assert!(!estimator.add_step(&stats)?);
    /// assert_eq!(estimator.round_stats(), stats);
    /// let mut impossible = stats.clone();
    /// impossible.positions[0].c = -1; // a negative weight sum
    /// assert_eq!(estimator.add_step(&impossible).unwrap_err().argument, "stats");
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn add_step(&self, stats: &RoundStats) -> Result<bool> {
        if self.config.update != Update::Vllm {
            return Err(Error::value(
                "stats",
                "this estimator's update is map: add a step_histogram with add_step_histogram",
            ));
        }
        stats.validate("stats", self.config.num_positions, self.config.max_log_odds)?;
        self.add_valid_step("stats", stats)
    }

    /// The `map` counterpart of [`add_step`](Self::add_step): adds one step's histograms (from
    /// [`step_histogram`](Self::step_histogram)) and counts the step, refitting when the
    /// schedule says so. Histograms no observations could give, or a `vllm` estimator, are
    /// refused and change nothing.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::map(2))?;
    /// let features = MatrixView::new("features", &[2.0f32, 1.0], 1, 2)?;
    /// let step = estimator.step_histogram(features, &[2], &[2], None::<MatrixView<'_, f32>>)?;
    /// assert!(estimator.add_step_histogram(&step)?); // the first step of a round is fitted
    /// assert_eq!(estimator.round_histogram(), Some(step));
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn add_step_histogram(&self, step: &HistogramStats) -> Result<bool> {
        if self.config.update != Update::Map {
            return Err(Error::value(
                "stats",
                "this estimator's update is vllm: add step_stats with add_step",
            ));
        }
        step.validate(
            "stats",
            self.config.num_positions,
            self.config.bins,
            self.config.max_log_odds,
        )?;
        self.add_to_histogram("stats", step)?;
        Ok(self.count_map_step())
    }

    /// Counts one `map` step and runs what the schedule asks for: the round's end when the
    /// count reaches `refit_interval`, and a fit within the round when the step is the 1st,
    /// 2nd, 4th, 8th, … of its round. Returns `true` when it did either.
    ///
    /// As for `vllm` ([`add_valid_step`](Self::add_valid_step)), the schedule is the serial
    /// one whatever the interleaving: a step's place in its round is its count modulo the
    /// interval (round ends take whole intervals off the count), a thread whose step is due a
    /// fit waits for the lock rather than skipping, and each due point counts one refit. So
    /// after any concurrent run `num_refits` and `steps_since_refit` are a serial run's.
    fn count_map_step(&self) -> bool {
        let interval = self.config.refit_interval;
        let steps = self.steps_since_refit.fetch_add(1, Ordering::SeqCst) + 1;
        let place = (steps - 1) % interval + 1;
        let doubling = place < interval && place.is_power_of_two();
        if steps < interval && !doubling {
            return false;
        }
        let mut locked = self.lock();
        let Locked::Map(state) = &mut *locked else {
            return false;
        };
        let mut fitted = false;
        while self.steps_since_refit.load(Ordering::SeqCst) >= interval {
            self.steps_since_refit.fetch_sub(interval, Ordering::SeqCst);
            self.end_map_round(state);
            fitted = true;
        }
        if doubling {
            self.fit_within_round(state);
            fitted = true;
        }
        fitted
    }

    /// [`add_step`](Self::add_step) for statistics known to be valid (`step_stats` made them).
    ///
    /// The schedule is exactly the serial one whatever the interleaving: every observe counts
    /// one step, and whenever the count reaches `refit_interval` a refit ends the round and
    /// takes `refit_interval` steps off it. A thread whose step completed a round waits for a
    /// refit in progress (a few microseconds) instead of skipping its own, and then refits as
    /// long as whole rounds are counted; so when the calls are done, `num_refits` is
    /// `⌊steps / refit_interval⌋` and `steps_since_refit` the remainder, as in a serial run.
    /// The statistics themselves are still added without a lock.
    fn add_valid_step(&self, argument: &'static str, stats: &RoundStats) -> Result<bool> {
        self.add_to_round(argument, stats)?;
        let interval = self.config.refit_interval;
        let steps = self.steps_since_refit.fetch_add(1, Ordering::SeqCst) + 1;
        if steps < interval {
            return Ok(false);
        }
        // Our step completed a round. Whoever holds the lock drains every whole round counted
        // before it looks; a step counted after that look belongs to its own thread, which is
        // queued on the lock behind us. So no round is ever left without a refit.
        let mut locked = self.lock();
        let Locked::Vllm(memory) = &mut *locked else {
            return Ok(false);
        };
        let mut refitted = false;
        while self.steps_since_refit.load(Ordering::SeqCst) >= interval {
            self.steps_since_refit.fetch_sub(interval, Ordering::SeqCst);
            self.refit_locked(memory);
            refitted = true;
        }
        Ok(refitted)
    }

    /// Ends the round now: refits on whatever it holds and clears it. Returns the round's
    /// statistics and the Newton step computed from them (before the bounds applied).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(1))?;
    /// // Confident drafts (x = 3) accepted, unsure ones (x = -1) rejected.
    /// let features = [3.0f32, 3.0, 3.0, -1.0, -1.0, -1.0];
    /// let view = MatrixView::new("features", &features, 6, 1)?;
    /// estimator.observe(view, &[1; 6], &[1, 1, 1, 0, 0, 0], None::<MatrixView<'_, f32>>)?;
    /// let report = estimator.refit();
    /// assert_eq!(report.stats.total_count(), 6);
    /// assert!(report.step.slope > 0.0); // confidence predicts acceptance more sharply
    /// assert_eq!(estimator.coefficients().version, 1);
    /// assert_eq!(estimator.round_stats().total_count(), 0); // a new round
    /// // Under map the report holds the round's histograms and its drift statistic.
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::map(1))?;
    /// estimator.observe(view, &[1; 6], &[1, 1, 1, 0, 0, 0], None::<MatrixView<'_, f32>>)?;
    /// let report = estimator.refit();
    /// assert_eq!(report.histogram.unwrap().total_count(), 6);
    /// assert!(report.step.slope > 0.0 && report.drift_statistic.is_some());
    /// assert_eq!(estimator.round_counts(), [0]);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn refit(&self) -> RefitReport {
        let mut locked = self.lock();
        let steps = self.steps_since_refit.load(Ordering::SeqCst);
        self.steps_since_refit.fetch_sub(steps, Ordering::SeqCst);
        match &mut *locked {
            Locked::Vllm(memory) => self.refit_locked(memory),
            Locked::Map(state) => self.end_map_round(state),
        }
    }

    /// `map`: fits the memory plus the open round now, without ending the round (what the
    /// schedule does after the 1st, 2nd, 4th, … step of a round; for callers that run their
    /// own schedule, such as `av_core.vllm`'s drop-in). Counts one refit. A `vllm` estimator
    /// has no fit within a round and refuses.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let mut config = EstimatorConfig::map(1);
    /// config.refit_interval = 1 << 40;
    /// let estimator = AcceptanceEstimator::new(config)?;
    /// let view = MatrixView::new("features", &[3.0f32, 3.0, -2.0, -2.0], 4, 1)?;
    /// let none = None::<MatrixView<'_, f32>>;
    /// // Labels that arrive without a step counted (pooled from another rank, say).
    /// let pooled = estimator.step_histogram(view, &[1; 4], &[1, 1, 0, 0], none)?;
    /// estimator.add_round_histogram(&pooled)?;
    /// let report = estimator.refit_within_round()?;
    /// assert!(report.step.slope > 0.0 && report.iterations > 0);
    /// assert_eq!(estimator.round_counts(), [4]); // the round goes on
    /// // Nothing new since: the next fit within the round is skipped (but counted).
    /// assert_eq!(estimator.refit_within_round()?.iterations, 0);
    /// assert_eq!(estimator.num_refits(), 2);
    /// assert!(AcceptanceEstimator::new(EstimatorConfig::new(1))?.refit_within_round().is_err());
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn refit_within_round(&self) -> Result<RefitReport> {
        let mut locked = self.lock();
        match &mut *locked {
            Locked::Vllm(_) => Err(Error::value(
                "end_round",
                "this estimator's update is vllm, which refits only at a round's end",
            )),
            Locked::Map(state) => Ok(self.fit_within_round(state)),
        }
    }

    /// Publishes the coefficients the fit `theta` gives within the bounds around `reference`,
    /// as refit `version`; returns the step (`theta − reference`).
    fn publish_bounded(&self, reference: &[f64], theta: &[f64], version: u64) -> NewtonStep {
        let step = NewtonStep {
            slope: theta[0] - reference[0],
            intercepts: theta[1..]
                .iter()
                .zip(&reference[1..])
                .map(|(t, r)| t - r)
                .collect(),
        };
        let mut intercepts = reference[1..].to_vec();
        let slope = self
            .config
            .bounds()
            .apply(reference[0], &mut intercepts, &step);
        self.coefficients.write(slope, &intercepts, version);
        step
    }

    /// The `map` round's end (under the refit lock): the drift test of the round at the
    /// reference, the memory discounted (or dropped), the round added, the memory fitted from
    /// the reference, and the result the next round's reference. A round without labels only
    /// discounts the memory. Depends only on the memory and the round's observations, not on
    /// the fits within the round.
    fn end_map_round(&self, state: &mut MapFit) -> RefitReport {
        let k = self.config.num_positions;
        self.histogram.drain_into(&mut state.base);
        let round = std::mem::replace(&mut state.base, HistogramStats::new(k, self.config.bins));
        self.histogram.end_round(&round);
        state.fitted_labels = 0;
        let current = self.coefficients.read();
        let version = (current.version + 1).min(MAX_COUNT); // saturates: every state reloads
        let mut report = RefitReport {
            stats: RoundStats::new(k),
            step: NewtonStep {
                slope: 0.0,
                intercepts: vec![0.0; k],
            },
            histogram: None,
            drift_statistic: None,
            iterations: 0,
        };
        if round.total_count() == 0 {
            state.memory.decay(self.config.memory);
            self.coefficients
                .write(current.slope, &current.intercepts, version);
        } else {
            let statistic = map::score_statistic(
                &map::round_bins(&round, &self.binning),
                &state.reference,
                self.config.l2,
            );
            let drifted = statistic > chi_square_quantile(k + 1, self.config.drift_z);
            state.memory.decay(self.config.memory);
            if drifted {
                state.memory.clear();
                state.resets = (state.resets + 1).min(MAX_COUNT);
            }
            state.memory.add_round(&round, &self.binning);
            let bins = FitBins::gather(Some(&state.memory), None, &self.binning, k);
            let fit = map::fit(&bins, &self.prior, &state.reference, self.config.l2);
            report.step = self.publish_bounded(&state.reference, &fit.theta, version);
            report.drift_statistic = Some(statistic);
            report.iterations = fit.iterations;
        }
        report.histogram = Some(round);
        let published = self.coefficients.read();
        state.reference.clear();
        state.reference.push(published.slope);
        state.reference.extend(&published.intercepts);
        report
    }

    /// A `map` fit within the round (under the refit lock): memory plus the open round so far,
    /// from the reference; skipped (the same coefficients, one more refit counted) when the
    /// open round holds no label the last fit did not see.
    fn fit_within_round(&self, state: &mut MapFit) -> RefitReport {
        let k = self.config.num_positions;
        self.histogram.drain_into(&mut state.base);
        let labels = state.base.total_count();
        let current = self.coefficients.read();
        let version = (current.version + 1).min(MAX_COUNT); // saturates: every state reloads
        let mut report = RefitReport {
            stats: RoundStats::new(k),
            step: NewtonStep {
                slope: 0.0,
                intercepts: vec![0.0; k],
            },
            histogram: None,
            drift_statistic: None,
            iterations: 0,
        };
        if labels > state.fitted_labels {
            let bins = FitBins::gather(Some(&state.memory), Some(&state.base), &self.binning, k);
            let fit = map::fit(&bins, &self.prior, &state.reference, self.config.l2);
            report.step = self.publish_bounded(&state.reference, &fit.theta, version);
            report.iterations = fit.iterations;
            state.fitted_labels = labels;
        } else {
            self.coefficients
                .write(current.slope, &current.intercepts, version);
        }
        report
    }

    fn refit_locked(&self, memory: &mut Memory) -> RefitReport {
        let stats = self.accumulator.take();
        let mut intercepts = Vec::with_capacity(self.config.num_positions);
        let (slope, version) = self.coefficients.read_into(&mut intercepts);
        let (l2, damping) = (self.config.l2, self.config.damping);
        let float_stats = stats.to_float();
        let step = if self.config.memory == 0.0 {
            newton_step(slope, &float_stats, l2, damping)
        } else {
            let (gamma, z) = (self.config.memory, self.config.drift_z);
            match memory.fold(gamma, z, &float_stats, l2, slope, &intercepts) {
                Some(system) => system.damped_step(slope, damping),
                None => NewtonStep {
                    slope: 0.0,
                    intercepts: vec![0.0; self.config.num_positions],
                },
            }
        };
        let slope = self.config.bounds().apply(slope, &mut intercepts, &step);
        // The count saturates at the bound a restored state must meet (no run gets there: a
        // refit every microsecond would take two thousand years), so every state reloads.
        self.coefficients
            .write(slope, &intercepts, (version + 1).min(MAX_COUNT));
        RefitReport {
            stats,
            step,
            histogram: None,
            drift_statistic: None,
            iterations: 0,
        }
    }

    /// The full state, consistent at one instant (observations racing the call land either in
    /// it or after it, never half).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::map(2))?;
    /// let view = MatrixView::new("features", &[0.9f32, -0.3], 1, 2)?;
    /// estimator.observe(view, &[2], &[0], None::<MatrixView<'_, f32>>)?;
    /// let state = estimator.state();
    /// assert_eq!(state.map.unwrap().round.total_count(), 1);
    /// assert_eq!(state.config, *estimator.config());
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn state(&self) -> EstimatorState {
        let k = self.config.num_positions;
        let mut locked = self.lock();
        let (stats, memory, map) = match &mut *locked {
            Locked::Vllm(memory) => (self.accumulator.snapshot(), memory.clone(), None),
            Locked::Map(state) => {
                self.histogram.drain_into(&mut state.base);
                let map = MapState {
                    reference_slope: state.reference[0],
                    reference_intercepts: state.reference[1..].to_vec(),
                    round: state.base.clone(),
                    memory: state.memory.clone(),
                    fitted_labels: state.fitted_labels,
                    resets: state.resets,
                };
                (RoundStats::new(k), Memory::new(k), Some(map))
            }
        };
        let coefficients = self.coefficients.read();
        EstimatorState {
            config: self.config.clone(),
            slope: coefficients.slope,
            intercepts: coefficients.intercepts,
            stats,
            steps_since_refit: self.steps_since_refit.load(Ordering::SeqCst),
            num_refits: coefficients.version,
            memory,
            map,
        }
    }

    /// The state as versioned, checksummed bytes ([`crate::snapshot`]).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(4))?;
    /// let bytes = estimator.to_bytes();
    /// assert!(bytes.starts_with(b"AVCORE\0E"));
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn to_bytes(&self) -> Vec<u8> {
        crate::snapshot::encode(&self.state())
    }

    /// Rebuilds an estimator from [`to_bytes`](Self::to_bytes); corrupt, truncated or
    /// future-version data is refused.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
    /// let view = MatrixView::new("features", &[1.5f32, 0.2], 1, 2)?;
    /// estimator.observe(view, &[2], &[1], None::<MatrixView<'_, f32>>)?;
    /// estimator.refit();
    /// let bytes = estimator.to_bytes();
    /// let restored = AcceptanceEstimator::from_bytes(&bytes)?;
    /// assert_eq!(restored.state(), estimator.state()); // bit-exact
    /// assert!(AcceptanceEstimator::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::from_state(&crate::snapshot::decode(bytes)?)
    }

    /// Rebuilds an estimator from [`state`](Self::state), validating every field.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig};
    ///
    /// let mut state = AcceptanceEstimator::new(EstimatorConfig::new(3))?.state();
    /// state.intercepts = vec![1.2, 0.4, -0.5]; // e.g. coefficients fitted offline
    /// let estimator = AcceptanceEstimator::from_state(&state)?;
    /// assert_eq!(estimator.coefficients().intercepts, [1.2, 0.4, -0.5]);
    /// state.slope = -1.0; // a negative slope is never valid
    /// assert_eq!(AcceptanceEstimator::from_state(&state).unwrap_err().argument, "slope");
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn from_state(state: &EstimatorState) -> Result<Self> {
        state.config.validate()?;
        let k = state.config.num_positions;
        ensure_finite("slope", state.slope)?;
        if state.slope < 0.0 {
            return Err(Error::value(
                "slope",
                format!("must be non-negative, got {}", state.slope),
            ));
        }
        if state.intercepts.len() != k {
            return Err(Error::value(
                "intercepts",
                format!(
                    "expected {k} entries for num_positions = {k}, got {}",
                    state.intercepts.len()
                ),
            ));
        }
        if state.slope > state.config.max_slope {
            return Err(Error::value(
                "slope",
                format!(
                    "must be at most max_slope = {}, got {}",
                    state.config.max_slope, state.slope
                ),
            ));
        }
        for &b in &state.intercepts {
            ensure_finite("intercepts", b)?;
            if b.abs() > state.config.max_intercept {
                return Err(Error::value(
                    "intercepts",
                    format!(
                        "must be within ±max_intercept = {}, got {b}",
                        state.config.max_intercept
                    ),
                ));
            }
        }
        let config = &state.config;
        let map = match (config.update, &state.map) {
            (Update::Vllm, None) => None,
            (Update::Map, Some(map)) => Some(map),
            (update, _) => {
                return Err(Error::value(
                    "map",
                    format!(
                        "an estimator with update = {} {} the map update's state",
                        update.name(),
                        if update == Update::Map {
                            "needs"
                        } else {
                            "has no"
                        }
                    ),
                ))
            }
        };
        // Bit for bit (a -0.0 is not the empty memory: it would not re-encode to its bytes).
        let empty_memory = |m: &Memory| {
            let bits = |values: &[f64]| values.iter().all(|v| v.to_bits() == 0);
            let lengths = Memory::new(k);
            m.b.len() == lengths.b.len()
                && m.c.len() == lengths.c.len()
                && m.rhs.len() == lengths.rhs.len()
                && m.counts.len() == lengths.counts.len()
                && bits(&[m.a, m.total])
                && bits(&m.b)
                && bits(&m.c)
                && bits(&m.rhs)
                && bits(&m.counts)
                && m.resets == 0
        };
        if map.is_some() && (state.stats != RoundStats::new(k) || !empty_memory(&state.memory)) {
            return Err(Error::value(
                "round_stats",
                "must be empty under update = map (its round is kept as histograms)",
            ));
        }
        state
            .stats
            .validate("round_stats", k, config.max_log_odds)?;
        // A serial run refits as soon as the count reaches the interval, so the count left over
        // is always below it (a larger one would make every later observe refit).
        if state.steps_since_refit >= config.refit_interval {
            return Err(Error::value(
                "steps_since_refit",
                format!(
                    "= {} must be below refit_interval = {}",
                    state.steps_since_refit, config.refit_interval
                ),
            ));
        }
        if state.steps_since_refit > MAX_COUNT {
            return Err(Error::value(
                "steps_since_refit",
                format!("= {} exceeds {MAX_COUNT}", state.steps_since_refit),
            ));
        }
        if state.num_refits > MAX_COUNT {
            return Err(Error::value(
                "num_refits",
                format!("= {} exceeds {MAX_COUNT}", state.num_refits),
            ));
        }
        state
            .memory
            .validate(k, config.memory, config.max_log_odds, state.num_refits)?;
        let locked = match map {
            None => Locked::Vllm(state.memory.clone()),
            Some(map) => Locked::Map(Self::checked_map_state(config, map, state.num_refits)?),
        };
        let estimator = Self::assemble(
            state.config.clone(),
            state.slope,
            &state.intercepts,
            state.num_refits,
            state.steps_since_refit,
            locked,
        );
        if config.update == Update::Vllm {
            estimator.accumulator.add(&state.stats);
        }
        if let Some(map) = map {
            estimator.histogram.reserve(&map.round);
        }
        Ok(estimator)
    }

    /// Validates the `map` part of a state.
    fn checked_map_state(
        config: &EstimatorConfig,
        map: &MapState,
        num_refits: u64,
    ) -> Result<MapFit> {
        let k = config.num_positions;
        ensure_finite("reference", map.reference_slope)?;
        if !(0.0..=config.max_slope).contains(&map.reference_slope) {
            return Err(Error::value(
                "reference",
                format!(
                    "slope must be in [0, max_slope = {}], got {}",
                    config.max_slope, map.reference_slope
                ),
            ));
        }
        if map.reference_intercepts.len() != k {
            return Err(Error::value(
                "reference",
                format!(
                    "expected {k} intercepts, got {}",
                    map.reference_intercepts.len()
                ),
            ));
        }
        for &b in &map.reference_intercepts {
            if !(b.is_finite() && b.abs() <= config.max_intercept) {
                return Err(Error::value(
                    "reference",
                    format!(
                        "intercepts must be finite and within ±max_intercept = {}, got {b}",
                        config.max_intercept
                    ),
                ));
            }
        }
        map.round
            .validate("round_stats", k, config.bins, config.max_log_odds)?;
        map.memory
            .validate(k, config.bins, config.memory, config.max_log_odds)?;
        let labels = map.round.total_count();
        if map.fitted_labels > labels {
            return Err(Error::value(
                "fitted_labels",
                format!(
                    "= {} exceeds the open round's {labels} labels",
                    map.fitted_labels
                ),
            ));
        }
        if map.resets > num_refits {
            return Err(Error::value(
                "memory",
                format!(
                    "{} resets but only {num_refits} refits (each reset is one refit)",
                    map.resets
                ),
            ));
        }
        Ok(MapFit {
            reference: std::iter::once(map.reference_slope)
                .chain(map.reference_intercepts.iter().copied())
                .collect(),
            base: map.round.clone(),
            memory: map.memory.clone(),
            fitted_labels: map.fitted_labels,
            resets: map.resets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accumulator::PositionSums;
    use crate::test_rng::XorShift;
    use proptest::prelude::*;

    fn view<T>(data: &[T], cols: usize) -> MatrixView<'_, T> {
        MatrixView::new("features", data, data.len() / cols, cols).unwrap()
    }

    const NO_PREDICTIONS: Option<MatrixView<'static, f32>> = None;

    #[test]
    fn cold_start_predicts_the_configured_curve() {
        let est = AcceptanceEstimator::new(EstimatorConfig::new(2)).unwrap();
        let mut out = [0.0f32; 4];
        est.predict(view(&[0.0f32, 2.0, -1.0, 100.0], 2), &mut out)
            .unwrap();
        // σ(0.5·x − 0.2) with the feature clamped to ±40 (σ itself: `logistic`'s tests).
        let expect = |x: f64| crate::logistic::probability(0.5 * x - 0.2);
        assert_eq!(out, [expect(0.0), expect(2.0), expect(-1.0), expect(40.0)]);
    }

    #[test]
    fn bad_config_is_rejected() {
        let mut c = EstimatorConfig::new(0);
        assert_eq!(c.validate().unwrap_err().argument, "num_positions");
        c.num_positions = 4;
        c.refit_interval = 0;
        assert_eq!(c.validate().unwrap_err().argument, "refit_interval");
        c.refit_interval = 1;
        c.damping = -1.0;
        assert_eq!(c.validate().unwrap_err().argument, "damping");
        c.damping = 1.0;
        c.l2 = f64::NAN;
        assert_eq!(c.validate().unwrap_err().argument, "l2");
    }

    #[test]
    fn refits_every_interval() {
        // vLLM's schedule: one refit per round of `refit_interval` observes.
        let mut config = EstimatorConfig::new(3);
        config.refit_interval = 3;
        let est = AcceptanceEstimator::new(config).unwrap();
        let features = [1.0f32, 2.0, 3.0];
        let mut refits = vec![];
        for _ in 0..7 {
            refits.push(
                est.observe(view(&features, 3), &[3], &[2], NO_PREDICTIONS)
                    .unwrap(),
            );
        }
        assert_eq!(refits, [false, false, true, false, false, true, false]);
        assert_eq!(est.num_refits(), 2);
        assert_eq!(est.steps_since_refit(), 1);
    }

    #[test]
    fn map_fits_after_the_first_second_fourth_step_of_every_round_and_at_its_end() {
        let mut config = EstimatorConfig::map(3);
        config.refit_interval = 6;
        let est = AcceptanceEstimator::new(config).unwrap();
        let features = [1.0f32, 2.0, 3.0];
        let mut fits = vec![];
        for _ in 0..14 {
            fits.push(
                est.observe(view(&features, 3), &[3], &[2], NO_PREDICTIONS)
                    .unwrap(),
            );
        }
        // Steps 1, 2, 4 of each round, and its end (6); the third round has had 2 steps.
        let round = [true, true, false, true, false, true];
        let expect: Vec<bool> = round.iter().cycle().take(14).copied().collect();
        assert_eq!(fits, expect);
        assert_eq!(est.num_refits(), 4 + 4 + 2);
        assert_eq!(est.steps_since_refit(), 2);
        // A fit within a round starts from the reference, so the coefficients after the round
        // are those of one fit of the round, whatever ran inside it.
        let once = AcceptanceEstimator::new(EstimatorConfig {
            refit_interval: 1 << 40,
            ..est.config().clone()
        })
        .unwrap();
        for _ in 0..6 {
            once.observe(view(&features, 3), &[3], &[2], NO_PREDICTIONS)
                .unwrap();
        }
        once.refit();
        let (a, b) = (
            once.coefficients(),
            AcceptanceEstimator::new(est.config().clone()).unwrap(),
        );
        for _ in 0..6 {
            b.observe(view(&features, 3), &[3], &[2], NO_PREDICTIONS)
                .unwrap();
        }
        let b = b.coefficients();
        assert_eq!(a.slope.to_bits(), b.slope.to_bits());
        assert_eq!(a.intercepts, b.intercepts);
    }

    #[test]
    fn rejected_calls_change_nothing() {
        let est = AcceptanceEstimator::new(EstimatorConfig::new(2)).unwrap();
        est.observe(view(&[1.0f64, 2.0], 2), &[2], &[1], NO_PREDICTIONS)
            .unwrap();
        let before = est.state();
        let bad_calls: Vec<Result<bool>> = vec![
            est.observe(view(&[f64::NAN, 2.0], 2), &[2], &[1], NO_PREDICTIONS),
            est.observe(view(&[1.0f64, 2.0], 2), &[1], &[2], NO_PREDICTIONS),
            est.observe(view(&[1.0f64, 2.0], 2), &[3], &[1], NO_PREDICTIONS),
            est.observe(view(&[1.0f64, 2.0], 2), &[-1], &[0], NO_PREDICTIONS),
            est.observe(view(&[1.0f64, 2.0], 2), &[2, 2], &[1, 1], NO_PREDICTIONS),
            est.observe(
                view(&[1.0f64, 2.0], 2),
                &[2],
                &[1],
                Some(view(&[0.5f32, 1.5], 2)),
            ),
            est.observe(view(&[1.0f64, 2.0, 3.0], 3), &[2], &[1], NO_PREDICTIONS),
        ];
        for result in bad_calls {
            assert!(result.is_err());
        }
        assert_eq!(est.state(), before);
    }

    /// Deterministic pseudo-random observations for the properties below.
    fn workload(seed: u64, rows: usize, k: usize) -> (Vec<f32>, Vec<i64>, Vec<i64>) {
        let mut rng = XorShift::new(seed.wrapping_add(0x9E37_79B9_7F4A_7C15));
        let mut next = || rng.next_u64();
        let features = (0..rows * k)
            .map(|_| (next() % 4000) as f32 / 100.0 - 20.0)
            .collect();
        let admitted: Vec<i64> = (0..rows)
            .map(|_| (next() % (k as u64 + 1)) as i64)
            .collect();
        let accepted = admitted
            .iter()
            .map(|&a| (next() % (a as u64 + 1)) as i64)
            .collect();
        (features, admitted, accepted)
    }

    proptest! {
        #[test]
        fn statistics_do_not_depend_on_row_order_or_split(
            seed in any::<u64>(), rows in 1usize..40, split in 0usize..40, k in 1usize..6,
        ) {
            let (features, admitted, accepted) = workload(seed, rows, k);
            let whole = AcceptanceEstimator::new(EstimatorConfig::new(k)).unwrap();
            whole.observe(view(&features, k), &admitted, &accepted, NO_PREDICTIONS).unwrap();

            // Reversed rows, split into two calls.
            let order: Vec<usize> = (0..rows).rev().collect();
            let f: Vec<f32> = order.iter().flat_map(|&r| features[r * k..(r + 1) * k].to_vec()).collect();
            let ad: Vec<i64> = order.iter().map(|&r| admitted[r]).collect();
            let ac: Vec<i64> = order.iter().map(|&r| accepted[r]).collect();
            let cut = split.min(rows);
            let parts = AcceptanceEstimator::new(EstimatorConfig::new(k)).unwrap();
            parts.observe(view(&f[..cut * k], k), &ad[..cut], &ac[..cut], NO_PREDICTIONS).unwrap();
            parts.observe(view(&f[cut * k..], k), &ad[cut..], &ac[cut..], NO_PREDICTIONS).unwrap();

            prop_assert_eq!(whole.round_stats(), parts.round_stats());
            whole.refit();
            parts.refit();
            let (a, b) = (whole.coefficients(), parts.coefficients());
            prop_assert_eq!(a.slope.to_bits(), b.slope.to_bits());
            for (x, y) in a.intercepts.iter().zip(&b.intercepts) {
                prop_assert_eq!(x.to_bits(), y.to_bits());
            }
        }

        #[test]
        fn state_round_trips(seed in any::<u64>(), rows in 0usize..20, k in 1usize..5) {
            let (features, admitted, accepted) = workload(seed, rows, k);
            let est = AcceptanceEstimator::new(EstimatorConfig::new(k)).unwrap();
            est.observe(view(&features, k), &admitted, &accepted, NO_PREDICTIONS).unwrap();
            est.refit();
            est.observe(view(&features, k), &admitted, &accepted, NO_PREDICTIONS).unwrap();
            let state = est.state();
            let back = AcceptanceEstimator::from_state(&state).unwrap();
            prop_assert_eq!(back.state(), state);
        }
    }

    #[test]
    fn pooled_rounds_give_every_rank_the_bits_of_one_estimator() {
        for update in [Update::Vllm, Update::Map] {
            pooled_rounds_for(update);
        }
    }

    /// `add_round_stats` pools `vllm` rounds, `add_round_histogram` `map` ones.
    fn pooled_rounds_for(update: Update) {
        let k = 3;
        let mut config = EstimatorConfig::new(k);
        config.update = update;
        config.refit_interval = u64::MAX;
        let whole = AcceptanceEstimator::new(config.clone()).unwrap();
        let ranks: Vec<_> = (0..4)
            .map(|_| AcceptanceEstimator::new(config.clone()).unwrap())
            .collect();
        for round in 0..3u64 {
            for step in 0..8u64 {
                let (f, ad, ac) = workload(round * 100 + step, 12, k);
                whole
                    .observe(view(&f, k), &ad, &ac, NO_PREDICTIONS)
                    .unwrap();
                // Rows dealt round-robin to the ranks, in reverse order on odd ranks.
                for (r, rank) in ranks.iter().enumerate() {
                    let mut rows: Vec<usize> = (r..12).step_by(4).collect();
                    if r % 2 == 1 {
                        rows.reverse();
                    }
                    let rf: Vec<f32> = rows
                        .iter()
                        .flat_map(|&i| f[i * k..(i + 1) * k].to_vec())
                        .collect();
                    let rad: Vec<i64> = rows.iter().map(|&i| ad[i]).collect();
                    let rac: Vec<i64> = rows.iter().map(|&i| ac[i]).collect();
                    rank.observe(view(&rf, k), &rad, &rac, NO_PREDICTIONS)
                        .unwrap();
                }
            }
            // Each rank adds the others' rounds (what an all-reduce gives, minus its own).
            let locals: Vec<RoundStats> = ranks.iter().map(|r| r.round_stats()).collect();
            let histograms: Vec<_> = ranks.iter().map(|r| r.round_histogram()).collect();
            for (r, rank) in ranks.iter().enumerate() {
                for o in 0..ranks.len() {
                    if o != r {
                        match &histograms[o] {
                            None => rank.add_round_stats(&locals[o]).unwrap(),
                            Some(other) => rank.add_round_histogram(other).unwrap(),
                        }
                    }
                }
                assert_eq!(rank.round_stats(), whole.round_stats());
                assert_eq!(rank.round_histogram(), whole.round_histogram());
            }
            whole.refit();
            let expect = whole.coefficients();
            for rank in &ranks {
                rank.refit();
                let got = rank.coefficients();
                assert_eq!(got.slope.to_bits(), expect.slope.to_bits());
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.intercepts), bits(&expect.intercepts));
            }
        }
    }

    #[test]
    fn bad_round_stats_are_refused_and_change_nothing() {
        let est = AcceptanceEstimator::new(EstimatorConfig::new(2)).unwrap();
        est.observe(view(&[1.0f64, 2.0], 2), &[2], &[1], NO_PREDICTIONS)
            .unwrap();
        let before = est.state();
        let err = est.add_round_stats(&RoundStats::new(3)).unwrap_err();
        assert_eq!(err.argument, "round_stats");
        let mut negative = RoundStats::new(2);
        negative.positions[1].c = -1;
        assert!(est.add_round_stats(&negative).is_err());
        assert!(est
            .add_round_histogram(&HistogramStats::new(2, 64))
            .is_err());
        assert_eq!(est.state(), before);
        // The map update pools histograms only, and refuses impossible ones.
        let est = AcceptanceEstimator::new(EstimatorConfig::map(2)).unwrap();
        est.observe(view(&[1.0f64, 2.0], 2), &[2], &[1], NO_PREDICTIONS)
            .unwrap();
        let before = est.state();
        assert_eq!(
            est.add_round_stats(&RoundStats::new(2))
                .unwrap_err()
                .argument,
            "round_stats"
        );
        let mut more_accepted = HistogramStats::new(2, 64);
        more_accepted.accepted[3] = 1;
        let mut wrong_bins = est.round_histogram().unwrap();
        wrong_bins.bins = 32;
        for bad in [more_accepted, wrong_bins, HistogramStats::new(3, 64)] {
            assert_eq!(
                est.add_round_histogram(&bad).unwrap_err().argument,
                "round_stats"
            );
        }
        assert_eq!(est.state(), before);
    }

    #[test]
    fn threads_give_the_serial_bits() {
        let k = 4;
        let batches: Vec<_> = (0..64).map(|s| workload(s, 16, k)).collect();
        let serial = AcceptanceEstimator::new(EstimatorConfig::new(k)).unwrap();
        for (f, ad, ac) in &batches {
            serial.observe(view(f, k), ad, ac, NO_PREDICTIONS).unwrap();
        }
        let parallel = AcceptanceEstimator::new(EstimatorConfig::new(k)).unwrap();
        std::thread::scope(|scope| {
            for chunk in batches.chunks(16) {
                let parallel = &parallel;
                scope.spawn(move || {
                    for (f, ad, ac) in chunk.iter().rev() {
                        parallel
                            .observe(view(f, k), ad, ac, NO_PREDICTIONS)
                            .unwrap();
                    }
                });
            }
            scope.spawn(|| {
                let mut out = vec![0.0f32; 4 * k];
                for _ in 0..1000 {
                    parallel
                        .predict(view(&vec![1.0f64; 4 * k], k), &mut out)
                        .unwrap();
                }
            });
        });
        assert_eq!(serial.state(), parallel.state());
    }

    /// `threads` threads each observing `per_thread` steps (a few rows each, some empty) at
    /// `refit_interval`, while another thread reads the state.
    fn contended(
        threads: usize,
        per_thread: usize,
        interval: u64,
        k: usize,
        update: Update,
    ) -> AcceptanceEstimator {
        let mut config = EstimatorConfig::new(k);
        config.refit_interval = interval;
        config.update = update;
        let estimator = AcceptanceEstimator::new(config).unwrap();
        let batches: Vec<_> = (0..4).map(|s| workload(s, s as usize, k)).collect();
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (estimator, batches) = (&estimator, &batches);
                scope.spawn(move || {
                    for i in 0..per_thread {
                        let (f, ad, ac) = &batches[(t + i) % batches.len()];
                        estimator
                            .observe(view(f, k), ad, ac, NO_PREDICTIONS)
                            .unwrap();
                    }
                });
            }
            scope.spawn(|| {
                for _ in 0..50 {
                    let _ = estimator.state();
                    std::thread::yield_now();
                }
            });
        });
        estimator
    }

    #[test]
    fn any_number_of_observing_threads_keeps_the_serial_schedule() {
        // vLLM's schedule: a serial run of n observes refits ⌊n / interval⌋ times and leaves
        // n mod interval.
        for threads in [2, 3, 6, 8] {
            for interval in [1, 2, 3, 7, 1000] {
                let per_thread = 400;
                let estimator = contended(threads, per_thread, interval, 2, Update::Vllm);
                let n = (threads * per_thread) as u64;
                assert_eq!(
                    (estimator.num_refits(), estimator.steps_since_refit()),
                    (n / interval, n % interval),
                    "{threads} threads at refit_interval {interval}"
                );
                // And it goes on exactly like a serial run: the next round is complete after
                // the rest of the interval.
                let (f, ad, ac) = workload(9, 1, 2);
                for _ in 0..(interval - n % interval) {
                    estimator
                        .observe(view(&f, 2), &ad, &ac, NO_PREDICTIONS)
                        .unwrap();
                }
                assert_eq!(estimator.num_refits(), n / interval + 1);
                assert_eq!(estimator.steps_since_refit(), 0);
            }
        }
    }

    /// The fits a serial `map` run of `n` observes makes, counted by brute force: the step
    /// with count `i` is the `((i − 1) mod interval) + 1`-th of its round, fitted when that is
    /// the round's last or a power of two.
    fn serial_map_fits(n: u64, interval: u64) -> u64 {
        (1..=n)
            .filter(|i| {
                let place = (i - 1) % interval + 1;
                place == interval || [1, 2, 4, 8, 16, 32, 64, 128, 256, 512].contains(&place)
            })
            .count() as u64
    }

    #[test]
    fn any_number_of_observing_threads_keeps_the_serial_map_schedule() {
        assert_eq!(serial_map_fits(10, 6), 4 + 3); // 1, 2, 4, 6; then 7, 8, 10
        for threads in [2, 3, 8] {
            for interval in [1, 2, 3, 7, 1000] {
                let per_thread = 300;
                let estimator = contended(threads, per_thread, interval, 2, Update::Map);
                let n = (threads * per_thread) as u64;
                assert_eq!(
                    (estimator.num_refits(), estimator.steps_since_refit()),
                    (serial_map_fits(n, interval), n % interval),
                    "{threads} threads at refit_interval {interval}"
                );
                let (f, ad, ac) = workload(9, 1, 2);
                let rest = interval - n % interval;
                for _ in 0..rest {
                    estimator
                        .observe(view(&f, 2), &ad, &ac, NO_PREDICTIONS)
                        .unwrap();
                }
                assert_eq!(estimator.num_refits(), serial_map_fits(n + rest, interval));
                assert_eq!(estimator.steps_since_refit(), 0);
            }
        }
    }

    #[test]
    fn a_manual_refit_racing_observers_leaves_a_count_below_the_interval() {
        let mut config = EstimatorConfig::new(3);
        config.refit_interval = 3;
        let estimator = AcceptanceEstimator::new(config).unwrap();
        let (f, ad, ac) = workload(4, 2, 3);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..500 {
                        estimator
                            .observe(view(&f, 3), &ad, &ac, NO_PREDICTIONS)
                            .unwrap();
                    }
                });
            }
            scope.spawn(|| {
                for _ in 0..100 {
                    estimator.refit();
                }
            });
        });
        assert!(estimator.steps_since_refit() < 3);
        let state = estimator.state();
        assert!(AcceptanceEstimator::from_state(&state).is_ok());
    }

    #[test]
    fn add_step_refuses_statistics_no_observation_gives() {
        // add_step takes vLLM's IRLS moments (add_step_histogram is map's).
        let est = AcceptanceEstimator::new(EstimatorConfig::new(2)).unwrap();
        let (f, ad, ac) = workload(1, 5, 2);
        let stats = est
            .step_stats(view(&f, 2), &ad, &ac, NO_PREDICTIONS)
            .unwrap();
        let before = est.state();
        let mut wrong_length = stats.clone();
        wrong_length.positions.pop();
        let mut negative = stats.clone();
        negative.positions[0].c = -5;
        let mut huge = stats.clone();
        huge.positions[1].n = u64::MAX;
        for bad in [wrong_length, negative, huge] {
            assert_eq!(est.add_step(&bad).unwrap_err().argument, "stats");
        }
        assert_eq!(est.state(), before);
        assert!(!est.add_step(&stats).unwrap());
    }

    #[test]
    fn add_step_histogram_refuses_histograms_no_observation_gives() {
        let est = AcceptanceEstimator::new(EstimatorConfig::map(2)).unwrap();
        let (f, ad, ac) = workload(1, 5, 2);
        let step = est
            .step_histogram(view(&f, 2), &ad, &ac, NO_PREDICTIONS)
            .unwrap();
        let before = est.state();
        let mut wrong_length = step.clone();
        wrong_length.count.pop();
        let mut too_many_accepted = step.clone();
        let occupied = step.count.iter().position(|&c| c > 0).unwrap();
        too_many_accepted.accepted[occupied] = step.count[occupied] + 1;
        let mut x_out_of_its_bin = step.clone();
        x_out_of_its_bin.x_sum[occupied] += 1 << 40;
        for bad in [wrong_length, too_many_accepted, x_out_of_its_bin] {
            assert_eq!(est.add_step_histogram(&bad).unwrap_err().argument, "stats");
        }
        assert_eq!(
            est.add_step(&RoundStats::new(2)).unwrap_err().argument,
            "stats"
        );
        assert_eq!(est.state(), before);
        assert!(est.add_step_histogram(&step).unwrap()); // the round's first step is fitted
        assert_eq!(est.round_histogram(), Some(step));
    }

    /// A valid state after a few refits with memory, for the corruption tests.
    fn state_with_memory() -> EstimatorState {
        // vLLM's statistics and quadratic memory (map_state_with_memory is map's).
        let mut config = EstimatorConfig::new(3);
        config.memory = 0.9;
        config.refit_interval = 2;
        let est = AcceptanceEstimator::new(config).unwrap();
        for seed in 0..7 {
            let (f, ad, ac) = workload(seed, 12, 3);
            est.observe(view(&f, 3), &ad, &ac, NO_PREDICTIONS).unwrap();
        }
        let state = est.state();
        assert!(state.stats.total_count() > 0 && state.memory.total > 0.0);
        state
    }

    /// Every counter a loaded state may carry at its bound keeps the estimator working, and
    /// whatever it reaches from there saves and loads again (found by the state_bytes fuzz
    /// target: a state with `num_refits = MAX_COUNT` refitted once and could not reload).
    #[test]
    fn states_at_the_loaders_limits_keep_working_and_reload() {
        let mut state = state_with_memory();
        let k = state.config.num_positions;
        state.num_refits = MAX_COUNT;
        state.memory.resets = MAX_COUNT;
        for p in &mut state.stats.positions {
            p.n = MAX_COUNT;
        }
        let limit = MAX_COUNT as f64 * k as f64 / (1.0 - state.config.memory);
        let extra = limit - state.memory.total;
        state.memory.total += extra;
        state.memory.counts[0] += extra;
        let est = AcceptanceEstimator::from_state(&state).unwrap();
        // A full round refuses one more observation and changes nothing.
        let (f, ad, ac) = workload(1, 4, k);
        assert!(ad.iter().any(|&a| a > 0));
        let error = est
            .observe(view(&f, k), &ad, &ac, NO_PREDICTIONS)
            .unwrap_err();
        assert_eq!(error.argument, "num_admitted", "{error}");
        assert_eq!(est.state(), state);
        let mut pooled = RoundStats::new(k);
        pooled.positions[0].add_observation(0.5, 0.5, true);
        assert_eq!(
            est.add_round_stats(&pooled).unwrap_err().argument,
            "round_stats"
        );
        assert_eq!(est.add_step(&pooled).unwrap_err().argument, "stats");
        assert_eq!(est.state(), state);
        // The full round folds into a memory at its bound; the counters saturate.
        est.refit();
        assert_eq!(est.num_refits(), MAX_COUNT);
        let reloaded = AcceptanceEstimator::from_bytes(&est.to_bytes()).unwrap();
        for _ in 0..3 {
            reloaded
                .observe(view(&f, k), &ad, &ac, NO_PREDICTIONS)
                .unwrap();
            reloaded.refit();
        }
        assert_eq!(reloaded.num_refits(), MAX_COUNT);
        let again = AcceptanceEstimator::from_bytes(&reloaded.to_bytes()).unwrap();
        assert_eq!(again.state(), reloaded.state());
    }

    #[test]
    fn impossible_states_are_refused_by_name() {
        let valid = state_with_memory();
        assert!(AcceptanceEstimator::from_state(&valid).is_ok());
        type Corruption = fn(&mut EstimatorState);
        let cases: [(&str, Corruption); 15] = [
            ("round_stats", |s| s.stats.positions[0].n = u64::MAX),
            ("round_stats", |s| s.stats.positions[0].n = MAX_COUNT + 1),
            ("round_stats", |s| {
                s.stats.positions[0].c = -s.stats.positions[0].c - 1
            }),
            ("round_stats", |s| s.stats.positions[0].a = -1),
            ("round_stats", |s| {
                let p = &mut s.stats.positions[0];
                p.b = ((p.a as f64 * p.c as f64).sqrt() * 1.01) as i128 + p.n as i128 + 10;
            }),
            ("round_stats", |s| {
                let p = &mut s.stats.positions[2];
                *p = PositionSums {
                    g1: 1,
                    ..PositionSums::default()
                };
            }),
            ("round_stats", |s| s.stats.positions[1].g1 = i128::MAX),
            ("steps_since_refit", |s| {
                s.steps_since_refit = s.config.refit_interval
            }),
            ("num_refits", |s| s.num_refits = u64::MAX),
            ("steps_since_refit", |s| {
                s.config.refit_interval = u64::MAX;
                s.steps_since_refit = u64::MAX - 1;
            }),
            ("memory", |s| s.memory.c[1] = -1.0),
            ("memory", |s| s.memory.counts[0] = -2.0),
            ("memory", |s| {
                s.memory.b[0] = (s.memory.a * s.memory.c[0]).sqrt() * 4.0
            }),
            ("memory", |s| s.memory.resets = s.num_refits + 1),
            ("memory", |s| s.memory.total *= 3.0),
        ];
        for (argument, corrupt) in cases {
            let mut state = valid.clone();
            corrupt(&mut state);
            let error = AcceptanceEstimator::from_state(&state).unwrap_err();
            assert_eq!(error.argument, argument, "{error}");
            // The same bytes are refused by `from_bytes` (and so by the C ABI's load).
            let bytes = crate::snapshot::encode(&state);
            assert_eq!(
                AcceptanceEstimator::from_bytes(&bytes)
                    .unwrap_err()
                    .argument,
                argument
            );
        }
        // A memoryless estimator keeps an empty memory.
        let mut state = valid.clone();
        state.config.memory = 0.0;
        assert_eq!(
            AcceptanceEstimator::from_state(&state)
                .unwrap_err()
                .argument,
            "memory"
        );
        state.memory = Memory::new(3);
        assert!(AcceptanceEstimator::from_state(&state).is_ok());
    }

    /// A valid `map` state after a few rounds, with an open round and a drift reset.
    fn map_state_with_memory() -> EstimatorState {
        let mut config = EstimatorConfig::map(3);
        config.refit_interval = 2;
        let est = AcceptanceEstimator::new(config).unwrap();
        for seed in 0..7 {
            let (f, ad, ac) = workload(seed, 12, 3);
            est.observe(view(&f, 3), &ad, &ac, NO_PREDICTIONS).unwrap();
        }
        let state = est.state();
        let map = state.map.as_ref().unwrap();
        assert!(map.round.total_count() > 0 && !map.memory.is_empty());
        state
    }

    /// The `map` counterpart of `states_at_the_loaders_limits_keep_working_and_reload`: a
    /// restored map state whose every bin sits at [`MAX_BIN_COUNT`], whose memory sits at its
    /// geometric bound and whose counters sit at [`MAX_COUNT`] refuses what would pass the
    /// bound (by name, nothing changed), refits, and whatever it reaches saves and loads again
    /// (with the drift test on, which drops the memory, and off, which keeps it at its bound).
    #[test]
    fn map_states_at_the_loaders_limits_keep_working_and_reload() {
        for drift_z in [EstimatorConfig::DEFAULT_DRIFT_Z, f64::INFINITY] {
            let mut state = map_state_with_memory();
            state.config.drift_z = drift_z;
            let (k, bins) = (state.config.num_positions, state.config.bins);
            let (limit, gamma) = (state.config.max_log_odds, state.config.memory);
            let binning = Binning::new(limit, bins);
            let scale = (1u64 << crate::histogram::X_FRACTION_BITS) as f64;
            state.num_refits = MAX_COUNT;
            let map = state.map.as_mut().unwrap();
            map.resets = MAX_COUNT;
            for index in 0..k * bins {
                let (lo, hi) = binning.offset_range(index % bins);
                let n = MAX_BIN_COUNT;
                map.round.count[index] = n;
                map.round.accepted[index] = n / 2;
                map.round.x_sum[index] = (n as f64 * (lo + hi) / 2.0 * scale) as u64;
            }
            let bound = MAX_COUNT as f64 * k as f64 / (1.0 - gamma);
            let extra = bound - map.memory.count.iter().sum::<f64>();
            let (lo, hi) = binning.offset_range(0);
            map.memory.count[0] += extra;
            map.memory.x_sum[0] = map.memory.count[0] * ((lo + hi) / 2.0 - limit);
            let est = AcceptanceEstimator::from_state(&state).unwrap();
            assert_eq!(est.state(), state);
            // A full round refuses one more label and changes nothing.
            let (f, ad, ac) = workload(1, 4, k);
            assert!(ad.iter().any(|&a| a > 0));
            let error = est
                .observe(view(&f, k), &ad, &ac, NO_PREDICTIONS)
                .unwrap_err();
            assert_eq!(error.argument, "num_admitted", "{error}");
            assert!(error.message.contains("refit first"), "{error}");
            let error = est
                .add_observations(view(&f, k), &ad, &ac, NO_PREDICTIONS)
                .unwrap_err();
            assert_eq!(error.argument, "num_admitted", "{error}");
            let step = est
                .step_histogram(view(&f, k), &ad, &ac, NO_PREDICTIONS)
                .unwrap();
            assert_eq!(
                est.add_round_histogram(&step).unwrap_err().argument,
                "round_stats"
            );
            assert_eq!(est.add_step_histogram(&step).unwrap_err().argument, "stats");
            assert_eq!(est.state(), state);
            // The full round folds into the memory (at its bound when the test keeps it); the
            // counters saturate; the state saves and loads again.
            est.refit();
            assert_eq!(est.num_refits(), MAX_COUNT);
            let after = est.state();
            let kept: f64 = after.map.as_ref().unwrap().memory.count.iter().sum();
            assert!(kept <= bound * (1.0 + 1e-9), "{kept} > {bound}");
            if drift_z.is_infinite() {
                // γ·bound + the round: the memory was kept, discounted.
                assert!(kept > gamma * bound, "{kept} (the memory was dropped)");
            }
            let reloaded = AcceptanceEstimator::from_bytes(&est.to_bytes()).unwrap();
            assert_eq!(reloaded.state(), after);
            // The reservation of the ended round is gone: observes are accepted again.
            for _ in 0..3 {
                reloaded
                    .observe(view(&f, k), &ad, &ac, NO_PREDICTIONS)
                    .unwrap();
                reloaded.refit();
            }
            assert_eq!(reloaded.num_refits(), MAX_COUNT);
            let again = AcceptanceEstimator::from_bytes(&reloaded.to_bytes()).unwrap();
            assert_eq!(again.state(), reloaded.state());
            assert!(est.observe(view(&f, k), &ad, &ac, NO_PREDICTIONS).is_ok());
        }
    }

    #[test]
    fn impossible_map_states_are_refused_by_name() {
        let valid = map_state_with_memory();
        assert!(AcceptanceEstimator::from_state(&valid).is_ok());
        fn occupied(s: &EstimatorState) -> usize {
            let round = &s.map.as_ref().unwrap().round;
            round.count.iter().position(|&c| c > 0).unwrap()
        }
        type Corruption = fn(&mut EstimatorState);
        let cases: [(&str, Corruption); 14] = [
            ("map", |s| s.map = None),
            ("map", |s| s.config.update = Update::Vllm),
            ("round_stats", |s| s.stats.positions[0].n = 1),
            ("round_stats", |s| {
                let i = occupied(s);
                let m = s.map.as_mut().unwrap();
                m.round.accepted[i] = m.round.count[i] + 1;
            }),
            ("round_stats", |s| {
                let i = occupied(s);
                s.map.as_mut().unwrap().round.x_sum[i] += 1 << 36;
            }),
            ("round_stats", |s| {
                s.map.as_mut().unwrap().round.count.pop();
            }),
            ("memory", |s| s.map.as_mut().unwrap().memory.count[0] = -1.0),
            ("memory", |s| {
                s.map.as_mut().unwrap().memory.x_sum[5] = f64::NAN
            }),
            ("memory", |s| {
                let m = &mut s.map.as_mut().unwrap().memory;
                let i = m.count.iter().position(|&c| c > 0.0).unwrap();
                m.accepted[i] = m.count[i] * 2.0;
            }),
            ("memory", |s| {
                s.map.as_mut().unwrap().resets = s.num_refits + 1
            }),
            ("fitted_labels", |s| {
                let m = s.map.as_mut().unwrap();
                m.fitted_labels = m.round.total_count() + 1;
            }),
            ("reference", |s| {
                s.map.as_mut().unwrap().reference_slope = -0.5;
            }),
            ("reference", |s| {
                s.map.as_mut().unwrap().reference_intercepts.push(0.0);
            }),
            ("bins", |s| s.config.bins = 0),
        ];
        for (argument, corrupt) in cases {
            let mut state = valid.clone();
            corrupt(&mut state);
            let error = AcceptanceEstimator::from_state(&state).unwrap_err();
            assert_eq!(error.argument, argument, "{error}");
            let bytes = crate::snapshot::encode(&state);
            let from_bytes = AcceptanceEstimator::from_bytes(&bytes).unwrap_err();
            assert_eq!(from_bytes.argument, argument, "{from_bytes}");
        }
    }

    /// Random observations at the edges the bounds are about: features at and beyond the clamp,
    /// tiny features (the fixed-point rounding of `w x²` then dominates), predictions at 0, 1/2
    /// and 1.
    fn edge_batch(seed: u64, rows: usize, k: usize) -> (Vec<f64>, Vec<i64>, Vec<i64>, Vec<f32>) {
        let mut rng = XorShift::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let specials = [0.0, 1e-9, -1e-7, 3e-6, 40.0, -40.0, 1e6, -1e6, 39.999, 0.5];
        let features = (0..rows * k)
            .map(|_| {
                let r = rng.next_u64();
                if r % 3 == 0 {
                    specials[(r >> 8) as usize % specials.len()]
                } else {
                    rng.unit_f64() * 100.0 - 50.0
                }
            })
            .collect();
        let predictions = (0..rows * k)
            .map(|_| match rng.next_u64() % 5 {
                0 => 0.0,
                1 => 1.0,
                2 => 0.5,
                _ => rng.unit_f64() as f32,
            })
            .collect();
        let admitted: Vec<i64> = (0..rows)
            .map(|_| (rng.next_u64() % (k as u64 + 1)) as i64)
            .collect();
        let accepted = admitted
            .iter()
            .map(|&a| (rng.next_u64() % (a as u64 + 1)) as i64)
            .collect();
        (features, admitted, accepted, predictions)
    }

    proptest! {
        #[test]
        fn every_state_observations_produce_is_accepted(
            seed in any::<u64>(),
            k in 1usize..6,
            steps in 1usize..12,
            rows in 0usize..40,
            memory in prop::sample::select(vec![0.0, 0.5, 0.95]),
            l2 in prop::sample::select(vec![0.0, 1e-3]),
            interval in 1u64..5,
            given in any::<bool>(),
        ) {
            let mut config = EstimatorConfig::new(k);
            config.memory = memory;
            config.l2 = l2;
            config.refit_interval = interval;
            let est = AcceptanceEstimator::new(config).unwrap();
            for step in 0..steps {
                let (f, ad, ac, p) = edge_batch(seed ^ step as u64, rows, k);
                let predictions = given.then(|| view(&p, k));
                est.observe(view(&f, k), &ad, &ac, predictions).unwrap();
                let state = est.state();
                let back = AcceptanceEstimator::from_state(&state);
                prop_assert!(back.is_ok(), "{:?}", back.err());
                prop_assert!(AcceptanceEstimator::from_bytes(&est.to_bytes()).is_ok());
            }
        }

        #[test]
        fn arbitrary_statistics_are_refused_or_observe_stays_exact(
            a in prop_oneof![any::<i128>(), -(1i128 << 50)..(1i128 << 50)],
            b in prop_oneof![any::<i128>(), -(1i128 << 50)..(1i128 << 50)],
            c in prop_oneof![any::<i128>(), -(1i128 << 40)..(1i128 << 50)],
            g0 in prop_oneof![any::<i128>(), -(1i128 << 50)..(1i128 << 50)],
            g1 in prop_oneof![any::<i128>(), -(1i128 << 40)..(1i128 << 40)],
            n in prop_oneof![any::<u64>(), 0u64..100_000, Just(MAX_COUNT), Just(u64::MAX)],
        ) {
            let mut state = AcceptanceEstimator::new(EstimatorConfig::new(1)).unwrap().state();
            state.stats.positions[0] = PositionSums { a, b, c, g0, g1, n };
            if let Ok(est) = AcceptanceEstimator::from_state(&state) {
                // Accepted: the next observe adds without wrapping, or (a full round) is
                // refused and changes nothing, so what the estimator holds always reloads.
                let before = est.round_stats().positions[0];
                let result = est.observe(view(&[1.0f32], 1), &[1], &[1], NO_PREDICTIONS);
                let after = est.round_stats().positions[0];
                if before.n < MAX_COUNT {
                    prop_assert!(result.is_ok());
                    prop_assert_eq!(after.n, before.n + 1);
                    prop_assert!(after.c >= before.c);
                } else {
                    prop_assert_eq!(result.unwrap_err().argument, "num_admitted");
                    prop_assert_eq!(after, before);
                }
                prop_assert!(AcceptanceEstimator::from_bytes(&est.to_bytes()).is_ok());
            }
        }
    }
}
