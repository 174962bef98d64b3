//! What an estimator is and what a refit did: [`EstimatorState`] (with [`MapState`]), its
//! capture and its validated restore, and [`RefitReport`].

use super::accumulator::{RoundStats, MAX_COUNT};
use super::histogram::{HistogramMemory, HistogramStats};
use super::memory::Memory;
use super::refit::NewtonStep;
use super::{AcceptanceEstimator, EstimatorConfig, Locked, MapFit, Update};
use crate::error::{ensure_finite, Error, Result};
use crate::sync::Ordering;

/// Everything an estimator is: config, coefficients, the open round and its counters.
/// [`AcceptanceEstimator::state`] and [`AcceptanceEstimator::from_state`] round-trip it bit-exactly.
///
/// # Example
///
/// ```rust
/// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView, Update};
///
/// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2).with_update(Update::Vllm))?;
/// let features = MatrixView::new("features", &[1.0f32, 0.5], 1, 2)?;
/// estimator.observe(features, &[2], &[1], None::<MatrixView<'_, f32>>)?;
/// let state = estimator.state();
/// assert_eq!((state.slope, state.intercepts.clone()), (0.5, vec![-0.2, -0.2]));
/// assert_eq!((state.steps_since_refit, state.stats.total_count()), (1, 2));
/// // Under map (the default) the open round is histograms, and its first step is fitted.
/// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
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
    /// let moved = state.clone().with_update(Update::Map); // what it drops is not checked:
    /// // `AcceptanceEstimator::from_state_with_update` validates the state as saved first
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
    /// The Newton step computed from them, before [`Bounds`](crate::estimator::Bounds) applied;
    /// under `map`, the fit's change from the reference coefficients, before the bounds.
    pub step: NewtonStep,
    /// `map`: the histograms the fit consumed (the round at a round's end; memory plus the
    /// open round within one). `None` under `vllm`.
    pub histogram: Option<HistogramStats>,
    /// `map`: the round's drift statistic at the reference coefficients (round ends only).
    pub drift_statistic: Option<f64>,
    /// `map`: Newton iterations of the fit (0 when the statistics held nothing new).
    pub iterations: u32,
}

impl AcceptanceEstimator {
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
    /// assert_eq!(state.config, estimator.config());
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
            config: self.config(),
            slope: coefficients.slope,
            intercepts: coefficients.intercepts,
            stats,
            steps_since_refit: self.steps_since_refit.load(Ordering::SeqCst),
            num_refits: coefficients.version,
            memory,
            map,
        }
    }

    /// The state as versioned, checksummed bytes ([`crate::persist::estimator`]).
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
        crate::persist::estimator::encode(&self.state())
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
        Self::from_state(&crate::persist::estimator::decode(bytes)?)
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
        Self::validated(state)
    }

    /// Rebuilds an estimator from `state` moved to `update` ([`EstimatorState::with_update`]):
    /// the state is validated whole as saved first, so a corrupt round or memory is refused
    /// even though the move drops it.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, Update};
    ///
    /// let state = AcceptanceEstimator::new(EstimatorConfig::new(2))?.state();
    /// let vllm = AcceptanceEstimator::from_state_with_update(&state, Update::Vllm)?;
    /// assert_eq!(vllm.config().update, Update::Vllm);
    /// let mut corrupt = state.clone();
    /// corrupt.map.as_mut().unwrap().memory.count[0] = f64::NAN;
    /// assert!(AcceptanceEstimator::from_state_with_update(&corrupt, Update::Vllm).is_err());
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn from_state_with_update(state: &EstimatorState, update: Update) -> Result<Self> {
        let as_saved = Self::validated(state)?;
        if update == state.config.update {
            return Ok(as_saved);
        }
        Self::validated(&state.clone().with_update(update))
    }

    fn validated(state: &EstimatorState) -> Result<Self> {
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
        if let Some(interval) = config
            .refit_interval
            .filter(|&i| state.steps_since_refit >= i)
        {
            return Err(Error::value(
                "steps_since_refit",
                format!(
                    "= {} must be below refit_interval = {interval}",
                    state.steps_since_refit
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
