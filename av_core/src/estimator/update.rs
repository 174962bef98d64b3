//! The update rule: how an estimator turns the target's verdicts into coefficients.
//!
//! Each rule is one module that owns everything that belongs to it: its open round (the
//! statistics `observe` adds to), what it remembers of past rounds, its refits and what a refit
//! reports, and its part of the saved state.
//!
//! | rule | module | open round | memory | refits |
//! |---|---|---|---|---|
//! | [`Update::Vllm`] | [`vllm`] | IRLS moments, lock-free | quadratic models | one damped Newton step per round |
//! | [`Update::Map`] | [`map`] | per-position histograms | histograms | MAP fit to convergence, also within a round |
//!
//! An estimator holds one [`Rule`]; this file is the one place that tells the rules apart: the
//! enums over them ([`Rule`], [`UpdateState`], [`UpdateReport`]), the [`dispatch!`] that
//! calls the rule an estimator holds, and the few calls that exist for one rule only. Code
//! elsewhere is generic over [`UpdateRule`]. A third rule is one more module implementing
//! [`UpdateRule`] and one more variant in each enum here.

mod map;
mod vllm;

pub use map::{MapReport, MapState, Reference};
pub use vllm::{VllmReport, VllmState};

use super::accumulator::RoundStats;
use super::histogram::HistogramStats;
use super::refit::NewtonStep;
use super::{AcceptanceEstimator, Common, EstimatorConfig, Update};
use crate::error::{Error, Result};
use crate::matrix::MatrixView;
use crate::persist::tree::{from_value, to_value, Value};
use crate::sync::MutexGuard;

/// One decode step's verdicts, as `observe` takes them: `features` `[R, K]`, `num_admitted[r]`
/// drafts of request `r` verified and the first `num_accepted[r]` of them accepted, and the
/// draft-time `predictions` `[R, K]` if the caller kept them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Step<'a, T, P> {
    pub(super) features: MatrixView<'a, T>,
    pub(super) num_admitted: &'a [i64],
    pub(super) num_accepted: &'a [i64],
    pub(super) predictions: Option<MatrixView<'a, P>>,
}

/// What an update rule does for the estimator that holds it. The estimator keeps what every
/// rule shares ([`Common`]: the configuration, the published coefficients, the step count and
/// the refit schedule); the rule keeps the rest.
pub(super) trait UpdateRule: Sized {
    /// The rule's part of an [`EstimatorState`](super::EstimatorState).
    type State: Into<UpdateState>;
    /// What the rule's refit lock guards: the state refits change.
    type Locked;
    /// Whether the schedule also fits after the 1st, 2nd, 4th, … step of a round.
    const FITS_WITHIN_ROUND: bool;

    /// A cold start under `config`.
    fn new(config: &EstimatorConfig) -> Self;
    /// The rule's part of a cold state with coefficients `(slope, intercepts)`.
    fn fresh_state(config: &EstimatorConfig, slope: f64, intercepts: &[f64]) -> Self::State;
    /// The rule restored from its part of a saved state, every field validated (errors name
    /// the field); `num_refits` is the estimator's.
    fn restore(config: &EstimatorConfig, state: &Self::State, num_refits: u64) -> Result<Self>;
    /// Takes the refit lock (refits are serialized; the lock is held while the state is read).
    fn lock(&self) -> MutexGuard<'_, Self::Locked>;
    /// The rule's part of the state, under its lock (the open round joins it whole or not).
    fn state(&self, locked: &mut Self::Locked) -> Self::State;
    /// Checks and adds one step's verdicts to the open round, and counts the step on the
    /// schedule when `count_step`; `true` when that refitted. On an error nothing changes.
    fn observe<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        common: &Common,
        step: Step<'_, T, P>,
        count_step: bool,
    ) -> Result<bool>;
    /// Ends the round: refits on it and starts the next (under the lock).
    fn end_round(&self, common: &Common, locked: &mut Self::Locked) -> RefitReport;
    /// A fit within the open round (under the lock); `None` for a rule that fits only at a
    /// round's end (and does not [`FITS_WITHIN_ROUND`](Self::FITS_WITHIN_ROUND)).
    fn fit_within_round(&self, common: &Common, locked: &mut Self::Locked) -> Option<RefitReport>;
    /// The open round's labeled drafts per position.
    fn round_counts(&self) -> Vec<u64>;
}

/// The rule an estimator holds.
// One per estimator, held inline: the map rule's larger size costs nothing, where a box would
// put a pointer chase on every observe.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum Rule {
    Vllm(vllm::VllmUpdate),
    Map(map::MapUpdate),
}

/// Runs `$body` with `$rule` bound to the rule an estimator holds, whichever it is: the one
/// place that branches on the rule (each arm is the same generic code, monomorphized).
macro_rules! dispatch {
    ($rule:expr, $bound:ident => $body:expr) => {
        match $rule {
            $crate::estimator::update::Rule::Vllm($bound) => $body,
            $crate::estimator::update::Rule::Map($bound) => $body,
        }
    };
}
pub(super) use dispatch;

impl Rule {
    /// A cold start of the rule `config.update` names.
    pub(super) fn new(config: &EstimatorConfig) -> Self {
        match config.update {
            Update::Vllm => Rule::Vllm(UpdateRule::new(config)),
            Update::Map => Rule::Map(UpdateRule::new(config)),
        }
    }

    /// The rule of a saved state, which must be the one its configuration names.
    pub(super) fn restore(
        config: &EstimatorConfig,
        state: &UpdateState,
        num_refits: u64,
    ) -> Result<Self> {
        match (config.update, state) {
            (Update::Vllm, UpdateState::Vllm(s)) => {
                UpdateRule::restore(config, s, num_refits).map(Rule::Vllm)
            }
            (Update::Map, UpdateState::Map(s)) => {
                UpdateRule::restore(config, s, num_refits).map(Rule::Map)
            }
            (configured, held) => Err(Error::value(
                "update",
                format!(
                    "the configuration says update = {}, the state holds the {} update's \
                     statistics",
                    configured.name(),
                    held.update().name()
                ),
            )),
        }
    }
}

/// The update rule's part of an [`EstimatorState`](super::EstimatorState): the open round, the
/// memory of past rounds and whatever else the rule keeps.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum UpdateState {
    /// vLLM's update ([`VllmState`]).
    Vllm(VllmState),
    /// The map update ([`MapState`]).
    Map(MapState),
}

impl From<VllmState> for UpdateState {
    fn from(state: VllmState) -> Self {
        UpdateState::Vllm(state)
    }
}

impl From<MapState> for UpdateState {
    fn from(state: MapState) -> Self {
        UpdateState::Map(state)
    }
}

impl UpdateState {
    /// The rule this state belongs to.
    pub fn update(&self) -> Update {
        match self {
            UpdateState::Vllm(_) => Update::Vllm,
            UpdateState::Map(_) => Update::Map,
        }
    }

    /// vLLM's update's state, if this is one.
    pub fn as_vllm(&self) -> Option<&VllmState> {
        match self {
            UpdateState::Vllm(state) => Some(state),
            UpdateState::Map(_) => None,
        }
    }

    /// [`as_vllm`](Self::as_vllm), mutable.
    pub fn as_vllm_mut(&mut self) -> Option<&mut VllmState> {
        match self {
            UpdateState::Vllm(state) => Some(state),
            UpdateState::Map(_) => None,
        }
    }

    /// The map update's state, if this is one.
    pub fn as_map(&self) -> Option<&MapState> {
        match self {
            UpdateState::Map(state) => Some(state),
            UpdateState::Vllm(_) => None,
        }
    }

    /// [`as_map`](Self::as_map), mutable.
    pub fn as_map_mut(&mut self) -> Option<&mut MapState> {
        match self {
            UpdateState::Map(state) => Some(state),
            UpdateState::Vllm(_) => None,
        }
    }

    /// The state of the rule `update` from its tree (the fields [`UpdateState`]'s serialization
    /// writes), a key no field holds refused; errors name `argument` and the path.
    pub(crate) fn from_tree(
        update: Update,
        tree: &Value,
        argument: &'static str,
        kind: crate::ErrorKind,
    ) -> Result<Self> {
        Ok(match update {
            Update::Vllm => from_value::<VllmState>(tree, argument, kind)?.into(),
            Update::Map => from_value::<MapState>(tree, argument, kind)?.into(),
        })
    }

    /// A cold state of `update` with coefficients `(slope, intercepts)`: an empty open round,
    /// no memory.
    pub fn fresh(update: Update, config: &EstimatorConfig, slope: f64, intercepts: &[f64]) -> Self {
        match update {
            Update::Vllm => vllm::VllmUpdate::fresh_state(config, slope, intercepts).into(),
            Update::Map => map::MapUpdate::fresh_state(config, slope, intercepts).into(),
        }
    }
}

/// What one refit consumed and did (see the example on [`AcceptanceEstimator::refit`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RefitReport {
    /// The change computed for the coefficients, before [`Bounds`](super::Bounds) applied:
    /// vLLM's damped Newton step, or the map fit's change from the reference coefficients.
    pub step: NewtonStep,
    /// What the rule consumed and found.
    pub update: UpdateReport,
}

/// The rule's part of a [`RefitReport`].
#[derive(Clone, Debug, PartialEq)]
pub enum UpdateReport {
    /// vLLM's update ([`VllmReport`]).
    Vllm(VllmReport),
    /// The map update ([`MapReport`]).
    Map(MapReport),
}

impl From<VllmReport> for UpdateReport {
    fn from(report: VllmReport) -> Self {
        UpdateReport::Vllm(report)
    }
}

impl From<MapReport> for UpdateReport {
    fn from(report: MapReport) -> Self {
        UpdateReport::Map(report)
    }
}

impl UpdateReport {
    /// vLLM's update's report, if this is one.
    pub fn as_vllm(&self) -> Option<&VllmReport> {
        match self {
            UpdateReport::Vllm(report) => Some(report),
            UpdateReport::Map(_) => None,
        }
    }

    /// The map update's report, if this is one.
    pub fn as_map(&self) -> Option<&MapReport> {
        match self {
            UpdateReport::Map(report) => Some(report),
            UpdateReport::Vllm(_) => None,
        }
    }

    /// The round the refit consumed as its tree (the open round's shape in a state), if it
    /// reports one.
    pub(crate) fn round_tree(&self) -> Option<Value> {
        match self {
            UpdateReport::Vllm(report) => Some(to_value(&report.round)),
            UpdateReport::Map(report) => report.round.as_ref().map(to_value),
        }
    }

    /// The round's drift statistic (NaN when the refit computed none), by `estimator`'s ridge
    /// for vLLM's update, which computes it only when asked.
    pub fn drift_statistic(&self, estimator: &AcceptanceEstimator) -> f64 {
        match self {
            UpdateReport::Vllm(report) => estimator.drift_statistic(&report.round),
            UpdateReport::Map(report) => report.drift_statistic.unwrap_or(f64::NAN),
        }
    }

    /// Newton iterations of the fit (vLLM's update takes one step: 0).
    pub fn iterations(&self) -> u32 {
        match self {
            UpdateReport::Vllm(_) => 0,
            UpdateReport::Map(report) => report.iterations,
        }
    }
}

/// The calls that exist for one rule only: vLLM's update pools and adds IRLS moments, the map
/// update histograms.
impl AcceptanceEstimator {
    fn wrong_update(&self, argument: &'static str, instead: &str) -> Error {
        Error::value(
            argument,
            format!(
                "this estimator's update is {}, which keeps {instead}",
                self.common.config.update.name()
            ),
        )
    }

    /// The open round's statistics under `vllm` (a consistent snapshot; the round goes on);
    /// all zeros under `map`, whose round is kept as histograms
    /// ([`round_histogram`](Self::round_histogram)).
    pub fn round_stats(&self) -> RoundStats {
        match &self.rule {
            Rule::Vllm(rule) => rule.round(),
            Rule::Map(_) => RoundStats::new(self.common.config.num_positions),
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
        match &self.rule {
            Rule::Map(rule) => Some(rule.round()),
            Rule::Vllm(_) => None,
        }
    }

    /// Adds another round's statistics to the open round, exactly (fixed-point integers): for
    /// example the other ranks' share of a round pooled across data-parallel ranks, so that the
    /// next refit fits the pooled round. Statistics no sequence of observations can produce
    /// ([`RoundStats::validate`]: a negative weight sum, a count past the bound) are refused,
    /// and so is a `map` estimator ([`add_round_histogram`](Self::add_round_histogram)); on any
    /// error nothing is added.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let view = MatrixView::new("features", &[1.5f32, -0.5], 1, 2)?;
    /// let none = None::<MatrixView<'_, f32>>;
    /// let config = EstimatorConfig::vllm(2); // vLLM's update pools IRLS moments
    /// let (rank0, rank1) = (
    ///     AcceptanceEstimator::new(config.clone())?,
    ///     AcceptanceEstimator::new(config)?,
    /// );
    /// rank0.observe(view, &[2], &[1], none)?;
    /// rank1.observe(view, &[2], &[0], none)?;
    /// rank0.add_round_stats(&rank1.round_stats())?; // rank 0 now holds the pooled round
    /// assert_eq!(rank0.round_stats().total_count(), 3);
    /// assert!(rank0.add_round_stats(&av_core::estimator::RoundStats::new(3)).is_err());
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn add_round_stats(&self, stats: &RoundStats) -> Result<()> {
        match &self.rule {
            Rule::Vllm(rule) => rule.add_round(&self.common, "round_stats", stats),
            Rule::Map(_) => Err(self.wrong_update(
                "round_stats",
                "histograms (add_round_histogram), not IRLS moments",
            )),
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
        match &self.rule {
            Rule::Map(rule) => rule.add_round(&self.common, "round_stats", round),
            Rule::Vllm(_) => Err(self.wrong_update(
                "round_stats",
                "IRLS moments (add_round_stats), not histograms",
            )),
        }
    }

    /// Adds another round, as its tree (the open round's shape in a `state_dict`), to the open
    /// round of whichever rule this estimator runs; a tree of the other rule's shape, or with a
    /// key its shape does not hold, is refused naming `argument` and the key's path, and
    /// nothing is added.
    pub fn add_round_tree(&self, tree: &Value, argument: &'static str) -> Result<()> {
        let kind = crate::ErrorKind::Value;
        match &self.rule {
            Rule::Vllm(rule) => rule.add_round(
                &self.common,
                argument,
                &from_value::<RoundStats>(tree, argument, kind)?,
            ),
            Rule::Map(rule) => rule.add_round(
                &self.common,
                argument,
                &from_value::<HistogramStats>(tree, argument, kind)?,
            ),
        }
    }

    /// Adds one step's statistics and counts the step; refits when the round is complete.
    /// Returns `true` when this call refitted.
    ///
    /// With [`step_stats`](Self::step_stats) this splits `observe` in two, so the statistics can
    /// be computed off the critical path and added later. Statistics that no observations could
    /// give (the wrong number of positions, or failing [`RoundStats::validate`]), or a `map`
    /// estimator ([`add_step_histogram`](Self::add_step_histogram)), are refused and change
    /// nothing.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::vllm(2))?;
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
        match &self.rule {
            Rule::Vllm(rule) => {
                rule.add_round(&self.common, "stats", stats)?;
                Ok(self.common.count_step(rule))
            }
            Rule::Map(_) => Err(self.wrong_update(
                "stats",
                "histograms: add a step_histogram with add_step_histogram",
            )),
        }
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
        match &self.rule {
            Rule::Map(rule) => {
                rule.add_round(&self.common, "stats", step)?;
                Ok(self.common.count_step(rule))
            }
            Rule::Vllm(_) => {
                Err(self.wrong_update("stats", "IRLS moments: add step_stats with add_step"))
            }
        }
    }
}
