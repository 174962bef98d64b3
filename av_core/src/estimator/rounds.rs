//! The refit schedule and the refits: the round's end (`vllm` and `map`), the `map` fits within
//! a round, and the drift statistic.

use super::accumulator::{RoundStats, MAX_COUNT};
use super::histogram::HistogramStats;
use super::map::{self, FitBins};
use super::memory::{chi_square_quantile, drift_statistic, Memory};
use super::refit::{newton_step, ArrowheadSystem, NewtonStep};
use super::{AcceptanceEstimator, Locked, MapFit, RefitReport};
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
            self.regularization()[0],
        ))
    }

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

    /// Counts one `map` step and runs what the schedule asks for: the round's end when the
    /// count reaches `refit_interval`, and a fit within the round when the step is the 1st,
    /// 2nd, 4th, 8th, … of its round. Returns `true` when it did either.
    ///
    /// As for `vllm` ([`add_valid_step`](Self::add_valid_step)), the schedule is the serial
    /// one whatever the interleaving: a step's place in its round is its count modulo the
    /// interval (round ends take whole intervals off the count), a thread whose step is due a
    /// fit waits for the lock rather than skipping, and each due point counts one refit. So
    /// after any concurrent run `num_refits` and `steps_since_refit` are a serial run's.
    pub(super) fn count_map_step(&self) -> bool {
        let counted = self.count_one_step();
        let steps = counted.unwrap_or(MAX_COUNT);
        let Some(interval) = self.config.refit_interval else {
            return false; // manual: only refit() fits
        };
        let place = (steps - 1) % interval + 1;
        // A saturated count is no new place in the round: no fit within it.
        let doubling = counted.is_some() && place < interval && place.is_power_of_two();
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
    pub(super) fn add_valid_step(
        &self,
        argument: &'static str,
        stats: &RoundStats,
    ) -> Result<bool> {
        self.add_to_round(argument, stats)?;
        let steps = self.count_one_step().unwrap_or(MAX_COUNT);
        let Some(interval) = self.config.refit_interval else {
            return Ok(false); // manual: only refit() refits
        };
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
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView, Update};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(1).with_update(Update::Vllm))?;
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
    /// config.refit_interval = None; // manual: refits only when asked
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
    /// let vllm = EstimatorConfig::vllm(1);
    /// assert!(AcceptanceEstimator::new(vllm)?.refit_within_round().is_err());
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
            let l2 = self.regularization()[0];
            let statistic = map::score_statistic(
                &map::round_bins(&round, &self.binning),
                &state.reference,
                l2,
            );
            let drifted = statistic > chi_square_quantile(k + 1, self.config.drift_z);
            state.memory.decay(self.config.memory);
            if drifted {
                state.memory.clear();
                state.resets = (state.resets + 1).min(MAX_COUNT);
            }
            state.memory.add_round(&round, &self.binning);
            let bins = FitBins::gather(Some(&state.memory), None, &self.binning, k);
            let fit = map::fit(&bins, &self.prior, &state.reference, l2);
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
            let fit = map::fit(
                &bins,
                &self.prior,
                &state.reference,
                self.regularization()[0],
            );
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
        let [l2, damping] = self.regularization();
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
}
