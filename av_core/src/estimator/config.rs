//! The estimator's configuration: [`EstimatorConfig`] and the [`Update`] it runs.

use serde::{Deserialize, Serialize};

use super::map::PriorWidths;
use super::refit::Bounds;
use crate::error::{ensure_finite, Error, Result};

/// How an estimator refits (see the [module documentation](crate::estimator)).
///
/// # Example
///
/// ```rust
/// use av_core::estimator::Update;
///
/// assert_eq!(Update::default(), Update::Map);
/// assert_eq!(Update::parse("vllm"), Some(Update::Vllm));
/// assert_eq!(Update::Map.name(), "map");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Update {
    /// av_core's own update (the default; docs/estimator.md): per-position histograms, the MAP
    /// fit iterated to convergence under a prior centred on the cold start, refits after 1, 2,
    /// 4, … steps inside every round. Calibrated from its first refit and after workload
    /// switches, where vLLM's one damped step per round starts low; observes as fast as
    /// [`Update::Vllm`], and refits slower (they iterate, once per doubling step).
    #[default]
    Map,
    /// vLLM 0.33.0's update, kept bit for bit (`av_core.vllm`'s default): IRLS moments of the round at the
    /// draft-time predictions, one damped Newton step per round (plus av_core's bounds, memory
    /// and drift test when configured).
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

    /// The update named `name`, or a value error for `argument` saying which names there are.
    pub fn named(name: &str, argument: &'static str) -> Result<Update> {
        Update::parse(name).ok_or_else(|| {
            Error::value(
                argument,
                format!("must be \"map\" or \"vllm\", got {name:?}"),
            )
        })
    }
}

impl std::str::FromStr for Update {
    type Err = Error;

    /// [`Update::named`], the error naming `update`.
    fn from_str(name: &str) -> Result<Update> {
        Update::named(name, "update")
    }
}

/// Configuration of an [`AcceptanceEstimator`](crate::AcceptanceEstimator). The refit interval,
/// damping, ridge, cold start and clamp are vLLM 0.33.0's; the update is av_core's
/// [`Update::Map`] ([`EstimatorConfig::vllm`] is vLLM's estimator).
///
/// The fields are the configuration's one declaration: their order is the constructor's
/// keywords' in the bindings, the saved state's fields derive from them (serde), and
/// [`EstimatorConfig::FIELD_DOCS`] gives each its line in the bindings. A field that applies to
/// one update only (`damping`, `bins`, the prior widths) is kept, and saved, under the other
/// too, so that moving a state between updates keeps it. A field added later carries
/// `#[serde(default = ...)]` with the behaviour from before it: every earlier state (bytes of
/// format 1 to 4, `state_dict` of version 1 or 2) then reads as that default, with no new
/// format version.
///
/// # Example
///
/// ```rust
/// use av_core::EstimatorConfig;
///
/// let mut config = EstimatorConfig::new(4);
/// assert_eq!(config.refit_interval, Some(EstimatorConfig::DEFAULT_REFIT_INTERVAL));
/// assert_eq!((config.init_slope, config.init_intercept), (0.5, -0.2));
/// // Refit twice as often and remember past rounds, discounted by 0.9 per round.
/// config.refit_interval = Some(50);
/// config.memory = 0.9;
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EstimatorConfig {
    /// Draft positions K (1 ≤ K ≤ [`EstimatorConfig::MAX_POSITIONS`]).
    pub num_positions: usize,
    /// Observe calls (decode steps) per round; a refit ends each round. `None`: manual, the
    /// estimator refits only when [`AcceptanceEstimator::refit`](crate::AcceptanceEstimator::refit) (or
    /// [`refit_within_round`](crate::AcceptanceEstimator::refit_within_round)) is called, observes
    /// only count their steps (for callers that run their own schedule, such as
    /// `av_core.vllm`'s drop-in).
    pub refit_interval: Option<u64>,
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
    /// memoryless update; see [`Memory`](crate::estimator::Memory) and `docs/memory.md`).
    pub memory: f64,
    /// Drift test threshold, in standard deviations of the round's χ² statistic: a round beyond
    /// it drops the memory (`inf` = never; see `docs/memory.md`).
    pub drift_z: f64,
    /// How the estimator refits: av_core's [`Update::Map`] (the default) or vLLM's
    /// [`Update::Vllm`].
    pub update: Update,
    /// `map`: bins per position over `[−max_log_odds, max_log_odds]`
    /// ([`HistogramStats`](crate::estimator::HistogramStats)).
    pub bins: usize,
    /// `map`: the prior's slope sd (`inf` = no slope prior; [`PriorWidths`]).
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
    /// adversarial round can no longer throw an intercept to −10⁶ (see [`Bounds`]).
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
    pub const DEFAULT_BINS: usize = super::histogram::DEFAULT_BINS;
    /// Default slope sd of the `map` prior: real pairs fit 0.44–0.6, within one sd of 0.5.
    pub const DEFAULT_PRIOR_SLOPE_SD: f64 = PriorWidths::DEFAULT.slope_sd;
    /// Default sd of the intercepts' level in the `map` prior.
    pub const DEFAULT_PRIOR_LEVEL_SD: f64 = PriorWidths::DEFAULT.level_sd;
    /// Default sd of the intercepts' trend in depth in the `map` prior.
    pub const DEFAULT_PRIOR_TREND_SD: f64 = PriorWidths::DEFAULT.trend_sd;
    /// Default sd of each intercept around the trend in the `map` prior.
    pub const DEFAULT_PRIOR_SPREAD_SD: f64 = PriorWidths::DEFAULT.spread_sd;

    /// One line on each field, in the fields' order: what the bindings show as each keyword's
    /// and attribute's documentation (a unit test holds it to the fields).
    pub const FIELD_DOCS: [(&'static str, &'static str); 18] = [
        ("num_positions", "Number of draft positions K."),
        (
            "refit_interval",
            "Observe calls per round (None: manual, a refit only when refit() is called).",
        ),
        ("damping", "Damping D, in observations."),
        ("l2", "Ridge λ."),
        ("init_slope", "Cold-start slope."),
        ("init_intercept", "Cold-start intercept (every position)."),
        ("max_log_odds", "Feature clamp."),
        ("max_step", "Largest change of a coefficient in one refit."),
        ("max_slope", "Largest slope."),
        ("max_intercept", "Largest absolute intercept."),
        (
            "memory",
            "Discount γ per round of the memory of past rounds (0 = vLLM's memoryless refit).",
        ),
        (
            "drift_z",
            "Drift test threshold (standard deviations); inf disables the test.",
        ),
        (
            "update",
            "How the estimator refits: \"map\" (av_core's) or \"vllm\" (vLLM's damped Newton step).",
        ),
        ("bins", "map: bins per position of the feature histograms."),
        ("prior_slope_sd", "map: the prior sd of the slope."),
        ("prior_level_sd", "map: the prior sd of the intercepts' level."),
        ("prior_trend_sd", "map: the prior sd of the intercepts' trend in depth."),
        (
            "prior_spread_sd",
            "map: the prior sd of each intercept around the trend.",
        ),
    ];

    /// How many fields (the first ones) format version 1 of a saved state holds: up to
    /// `drift_z`, everything av_core had before the map update.
    pub const VERSION_1_FIELDS: usize = 12;

    /// av_core's `map` update on `num_positions` positions: [`EstimatorConfig::new`] (whose
    /// update it is) with `update = Update::Map` spelled out, and the map defaults (bins, prior
    /// widths).
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

    /// This configuration with `update` (the other fields as they are).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::estimator::Update;
    /// use av_core::EstimatorConfig;
    ///
    /// let config = EstimatorConfig::new(4).with_update(Update::Vllm);
    /// assert_eq!(config.update, Update::Vllm);
    /// assert_eq!(config.memory, EstimatorConfig::DEFAULT_MEMORY);
    /// ```
    pub fn with_update(self, update: Update) -> Self {
        EstimatorConfig { update, ..self }
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
            refit_interval: Some(Self::DEFAULT_REFIT_INTERVAL),
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
    /// update ([`Update::Vllm`]). The preset `av_core.vllm` starts from (it keeps the default
    /// bounds unless asked for vLLM's exact update).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::EstimatorConfig;
    ///
    /// let vllm = EstimatorConfig::vllm(4);
    /// assert_eq!((vllm.refit_interval, vllm.damping, vllm.l2), (Some(100), 50.0, 1e-3));
    /// assert_eq!((vllm.init_slope, vllm.init_intercept, vllm.max_log_odds), (0.5, -0.2, 40.0));
    /// assert_eq!((vllm.memory, vllm.max_step), (0.0, f64::INFINITY));
    /// assert_eq!(vllm.update, av_core::estimator::Update::Vllm);
    /// assert!(vllm.validate().is_ok());
    /// ```
    pub fn vllm(num_positions: usize) -> Self {
        EstimatorConfig {
            update: Update::Vllm,
            memory: 0.0,
            max_step: f64::INFINITY,
            max_slope: f64::INFINITY,
            max_intercept: f64::INFINITY,
            ..Self::new(num_positions)
        }
    }

    /// What a state of format version 1 holds beyond its fields (`num_positions` to
    /// `drift_z`): vLLM's update (av_core had no other before the map update) at the default
    /// map settings (bins, prior widths). Every estimator before the map update was one of
    /// these, whatever the default update is.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::EstimatorConfig;
    ///
    /// let config = EstimatorConfig::version_1(3);
    /// assert_eq!(config.update, EstimatorConfig::vllm(3).update);
    /// assert_eq!(config.bins, EstimatorConfig::new(3).bins);
    /// assert!(config.is_version_1());
    /// assert!(!EstimatorConfig::new(3).is_version_1()); // the map update
    /// ```
    pub fn version_1(num_positions: usize) -> Self {
        EstimatorConfig::new(num_positions).with_update(Update::Vllm)
    }

    /// Whether format version 1 holds this configuration: vLLM's update, and the map settings
    /// bit for bit [`version_1`](Self::version_1)'s (the fields version 1 does not hold).
    pub fn is_version_1(&self) -> bool {
        let d = EstimatorConfig::version_1(self.num_positions);
        let map_settings = |c: &EstimatorConfig| {
            [
                c.prior_slope_sd,
                c.prior_level_sd,
                c.prior_trend_sd,
                c.prior_spread_sd,
            ]
            .map(f64::to_bits)
        };
        self.update == d.update && self.bins == d.bins && map_settings(self) == map_settings(&d)
    }

    /// The refit limits of this configuration.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::estimator::Bounds;
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
        if self.refit_interval == Some(0) {
            return Err(Error::value(
                "refit_interval",
                "must be at least 1 (None for manual refits), got 0",
            ));
        }
        check_regularization(self.l2, self.damping)?;
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
        if self.bins == 0 || self.bins > super::histogram::MAX_BINS {
            return Err(Error::value(
                "bins",
                format!(
                    "must be between 1 and {}, got {}",
                    super::histogram::MAX_BINS,
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

/// Checks the ridge `l2` and the damping: both finite and non-negative (damping first).
pub(crate) fn check_regularization(l2: f64, damping: f64) -> Result<()> {
    ensure_finite("damping", damping)?;
    if damping < 0.0 {
        return Err(Error::value(
            "damping",
            format!("must be non-negative, got {damping}"),
        ));
    }
    ensure_finite("l2", l2)?;
    if l2 < 0.0 {
        return Err(Error::value(
            "l2",
            format!("must be non-negative, got {l2}"),
        ));
    }
    Ok(())
}
