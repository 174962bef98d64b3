//! What an estimator is: [`EstimatorState`], its capture and its validated restore.

use super::accumulator::MAX_COUNT;
use super::update::{dispatch, Rule, UpdateRule, UpdateState};
use super::{AcceptanceEstimator, Common, EstimatorConfig, Update};
use crate::error::{ensure_finite, Error, Result};
use crate::sync::Ordering;

/// Everything an estimator is: config, coefficients, the refit schedule's counters and the
/// update rule's part (its open round, its memory of past rounds).
/// [`AcceptanceEstimator::state`] and [`AcceptanceEstimator::from_state`] round-trip it
/// bit-exactly.
///
/// # Example
///
/// ```rust
/// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
///
/// let estimator = AcceptanceEstimator::new(EstimatorConfig::vllm(2))?;
/// let features = MatrixView::new("features", &[1.0f32, 0.5], 1, 2)?;
/// estimator.observe(features, &[2], &[1], None::<MatrixView<'_, f32>>)?;
/// let state = estimator.state();
/// assert_eq!((state.slope, state.intercepts.clone()), (0.5, vec![-0.2, -0.2]));
/// let vllm = state.update.as_vllm().unwrap();
/// assert_eq!((state.steps_since_refit, vllm.round.total_count()), (1, 2));
/// // Under map (the default) the open round is histograms, and its first step is fitted.
/// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
/// estimator.observe(features, &[2], &[1], None::<MatrixView<'_, f32>>)?;
/// let state = estimator.state();
/// let map = state.update.as_map().unwrap();
/// assert_eq!((state.num_refits, map.round.total_count()), (1, 2));
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
    /// Observe calls since the last refit.
    pub steps_since_refit: u64,
    /// Refits so far.
    pub num_refits: u64,
    /// The update rule's part: the one `config.update` names.
    pub update: UpdateState,
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
    /// use av_core::{AcceptanceEstimator, EstimatorConfig};
    ///
    /// let mut state = AcceptanceEstimator::new(EstimatorConfig::vllm(2))?.state();
    /// state.intercepts = vec![0.7, -0.1];
    /// let map = EstimatorConfig::map(2).update;
    /// let moved = state.clone().with_update(map); // what it drops is not checked:
    /// // `AcceptanceEstimator::from_state_with_update` validates the state as saved first
    /// assert_eq!((moved.config.update, moved.update.update()), (map, map));
    /// assert_eq!(moved.intercepts, [0.7, -0.1]);
    /// let estimator = AcceptanceEstimator::from_state(&moved)?;
    /// assert_eq!(estimator.coefficients().intercepts, [0.7, -0.1]);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn with_update(mut self, update: Update) -> EstimatorState {
        if self.config.update == update {
            return self;
        }
        self.config.update = update;
        self.steps_since_refit = 0;
        self.update = UpdateState::fresh(update, &self.config, self.slope, &self.intercepts);
        self
    }
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
    /// assert_eq!(estimator.round_counts().iter().sum::<u64>(), 1);
    /// assert_eq!(state.config, estimator.config());
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn state(&self) -> EstimatorState {
        dispatch!(&self.rule, rule => self.capture(rule))
    }

    /// [`state`](Self::state) of `rule`, read under its refit lock: no refit runs between the
    /// rule's part, the coefficients and the counters.
    fn capture<U: UpdateRule>(&self, rule: &U) -> EstimatorState {
        let mut locked = rule.lock();
        let update = rule.state(&mut locked).into();
        let coefficients = self.common.coefficients.read();
        EstimatorState {
            config: self.config(),
            slope: coefficients.slope,
            intercepts: coefficients.intercepts,
            steps_since_refit: self.common.steps_since_refit.load(Ordering::SeqCst),
            num_refits: coefficients.version,
            update,
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
    /// use av_core::{AcceptanceEstimator, EstimatorConfig};
    ///
    /// let state = AcceptanceEstimator::new(EstimatorConfig::map(2))?.state();
    /// let vllm = EstimatorConfig::vllm(2).update;
    /// let moved = AcceptanceEstimator::from_state_with_update(&state, vllm)?;
    /// assert_eq!(moved.config().update, vllm);
    /// let mut corrupt = state.clone();
    /// corrupt.update.as_map_mut().unwrap().memory.count[0] = f64::NAN;
    /// assert!(AcceptanceEstimator::from_state_with_update(&corrupt, vllm).is_err());
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
        let config = &state.config;
        config.validate()?;
        let k = config.num_positions;
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
        if state.slope > config.max_slope {
            return Err(Error::value(
                "slope",
                format!(
                    "must be at most max_slope = {}, got {}",
                    config.max_slope, state.slope
                ),
            ));
        }
        for &b in &state.intercepts {
            ensure_finite("intercepts", b)?;
            if b.abs() > config.max_intercept {
                return Err(Error::value(
                    "intercepts",
                    format!(
                        "must be within ±max_intercept = {}, got {b}",
                        config.max_intercept
                    ),
                ));
            }
        }
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
        Ok(AcceptanceEstimator {
            rule: Rule::restore(config, &state.update, state.num_refits)?,
            common: Common::new(
                config.clone(),
                state.slope,
                &state.intercepts,
                state.num_refits,
                state.steps_since_refit,
            ),
        })
    }
}
