//! The refit schedule, the same for every update rule: a round's end every `refit_interval`
//! steps, and (for the rules that fit within a round) a fit after its 1st, 2nd, 4th, … step;
//! the explicit refits; the drift statistic.

use super::accumulator::{RoundStats, MAX_COUNT};
use super::memory::drift_statistic;
use super::refit::ArrowheadSystem;
use super::update::{dispatch, RefitReport, UpdateRule};
use super::{AcceptanceEstimator, Common};
use crate::error::{Error, Result};
use crate::sync::Ordering;

impl AcceptanceEstimator {
    /// The drift test's statistic `T = gᵀ(H + λI)⁻¹g` of a round, with this estimator's ridge
    /// (see `docs/memory.md`): about χ² with K + 1 degrees of freedom while the coefficients the
    /// round was collected under still fit the workload, larger when they do not.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::estimator::RoundStats;
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
            self.common.regularization()[0],
        ))
    }
}

impl Common {
    /// Counts one step: the new count, or `None` when it already stood at [`MAX_COUNT`], the
    /// most a saved state may hold (manual refits, or an interval above it, never take it
    /// down), where it stays, so whatever the estimator reaches saves and loads again.
    fn count_one_step(&self) -> Option<u64> {
        self.steps_since_refit
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                (c < MAX_COUNT).then_some(c + 1)
            })
            .ok()
            .map(|c| c + 1)
    }

    /// Counts one step and runs what the schedule asks of `rule`: the round's end when the
    /// count reaches `refit_interval`, and, for a rule that fits within a round, a fit when the
    /// step is the 1st, 2nd, 4th, 8th, … of its round. Returns `true` when it did either.
    ///
    /// The schedule is exactly the serial one whatever the interleaving: a step's place in its
    /// round is its count modulo the interval (round ends take whole intervals off the count),
    /// and a thread whose step is due a refit waits for a refit in progress (a few
    /// microseconds) instead of skipping its own, then ends rounds as long as whole rounds are
    /// counted. So when the calls are done, `num_refits` and `steps_since_refit` are what the
    /// same calls made one after another give. The statistics themselves are added before,
    /// without the refit lock.
    pub(super) fn count_step<U: UpdateRule>(&self, rule: &U) -> bool {
        let counted = self.count_one_step();
        let steps = counted.unwrap_or(MAX_COUNT);
        let Some(interval) = self.config.refit_interval else {
            return false; // manual: only refit() refits
        };
        // A saturated count is no new place in the round: no fit within it.
        let within = U::FITS_WITHIN_ROUND && counted.is_some() && {
            let place = (steps - 1) % interval + 1;
            place < interval && place.is_power_of_two()
        };
        if steps < interval && !within {
            return false;
        }
        // Whoever holds the lock ends every whole round counted before it looks; a step counted
        // after that look belongs to its own thread, which is queued on the lock behind us. So
        // no round is ever left without a refit.
        let mut locked = rule.lock();
        let mut refitted = false;
        while self.steps_since_refit.load(Ordering::SeqCst) >= interval {
            self.steps_since_refit.fetch_sub(interval, Ordering::SeqCst);
            rule.end_round(self, &mut locked);
            refitted = true;
        }
        if within {
            refitted |= rule.fit_within_round(self, &mut locked).is_some();
        }
        refitted
    }

    /// [`AcceptanceEstimator::refit`] on `rule`.
    fn refit<U: UpdateRule>(&self, rule: &U) -> RefitReport {
        let mut locked = rule.lock();
        let steps = self.steps_since_refit.load(Ordering::SeqCst);
        self.steps_since_refit.fetch_sub(steps, Ordering::SeqCst);
        rule.end_round(self, &mut locked)
    }

    /// [`AcceptanceEstimator::refit_within_round`] on `rule`.
    fn refit_within_round<U: UpdateRule>(&self, rule: &U) -> Result<RefitReport> {
        let mut locked = rule.lock();
        rule.fit_within_round(self, &mut locked).ok_or_else(|| {
            Error::value(
                "end_round",
                format!(
                    "this estimator's update is {}, which refits only at a round's end",
                    self.config.update.name()
                ),
            )
        })
    }
}

impl AcceptanceEstimator {
    /// Ends the round now: refits on whatever it holds and clears it. Returns the step computed
    /// for the coefficients (before the bounds applied) and what the rule consumed.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::vllm(1))?;
    /// // Confident drafts (x = 3) accepted, unsure ones (x = -1) rejected.
    /// let features = [3.0f32, 3.0, 3.0, -1.0, -1.0, -1.0];
    /// let view = MatrixView::new("features", &features, 6, 1)?;
    /// estimator.observe(view, &[1; 6], &[1, 1, 1, 0, 0, 0], None::<MatrixView<'_, f32>>)?;
    /// let report = estimator.refit();
    /// assert_eq!(report.update.as_vllm().unwrap().round.total_count(), 6);
    /// assert!(report.step.slope > 0.0); // confidence predicts acceptance more sharply
    /// assert_eq!(estimator.coefficients().version, 1);
    /// assert_eq!(estimator.round_counts(), [0]); // a new round
    /// // Under map the report holds the round's histograms and its drift statistic.
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::map(1))?;
    /// estimator.observe(view, &[1; 6], &[1, 1, 1, 0, 0, 0], None::<MatrixView<'_, f32>>)?;
    /// let report = estimator.refit();
    /// let map = report.update.as_map().unwrap();
    /// assert_eq!(map.round.as_ref().unwrap().total_count(), 6);
    /// assert!(report.step.slope > 0.0 && map.drift_statistic.is_some());
    /// assert_eq!(estimator.round_counts(), [0]);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn refit(&self) -> RefitReport {
        dispatch!(&self.rule, rule => self.common.refit(rule))
    }

    /// Fits the memory plus the open round now, without ending the round, for a rule that fits
    /// within a round (`map`: what the schedule does after the 1st, 2nd, 4th, … step of a
    /// round; for callers that run their own schedule, such as `av_core.vllm`'s drop-in).
    /// Counts one refit. A `vllm` estimator has no fit within a round and refuses.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let mut config = EstimatorConfig::map(1);
    /// config.refit_interval = None; // manual: refits only when asked
    /// let estimator = AcceptanceEstimator::new(config)?;
    /// let view = MatrixView::new("features", &[3.0f32, 3.0, -2.0, -2.0], 4, 1)?;
    /// let none = None::<MatrixView<'_, f32>>;
    /// // Labels that arrive without a step counted (pooled from another rank, say).
    /// let pooled = estimator.step_histogram(view, &[1; 4], &[1, 1, 0, 0], none)?;
    /// estimator.add_round_histogram(&pooled)?;
    /// let report = estimator.refit_within_round()?;
    /// assert!(report.step.slope > 0.0 && report.update.iterations() > 0);
    /// assert_eq!(estimator.round_counts(), [4]); // the round goes on
    /// // Nothing new since: the next fit within the round is skipped (but counted).
    /// assert_eq!(estimator.refit_within_round()?.update.iterations(), 0);
    /// assert_eq!(estimator.num_refits(), 2);
    /// let vllm = EstimatorConfig::vllm(1);
    /// assert!(AcceptanceEstimator::new(vllm)?.refit_within_round().is_err());
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn refit_within_round(&self) -> Result<RefitReport> {
        dispatch!(&self.rule, rule => self.common.refit_within_round(rule))
    }
}
