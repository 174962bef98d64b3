//! The map update (`update = "map"`, av_core's default; docs/estimator.md): per-position
//! histograms of the feature with exact counts ([`super::super::histogram`]), the MAP fit of the
//! memory plus the open round iterated to convergence under a prior centred on the cold start
//! ([`super::super::map`]), after the 1st, 2nd, 4th, … step of every round as well as at its
//! end. At a round's end the round's score at the reference coefficients (the ones published
//! at the last round's end) is the drift test, the memory is discounted (or dropped), the round
//! joins it, and the fit from the reference becomes the next reference.

use super::{RefitReport, Step, UpdateRule};
use crate::error::{ensure_finite, Error, Result};
use crate::estimator::accumulator::MAX_COUNT;
use crate::estimator::histogram::{
    Binning, HistogramAccumulator, HistogramMemory, HistogramStats, MAX_BIN_COUNT,
};
use crate::estimator::map::{self as fit, FitBins, Prior};
use crate::estimator::memory::chi_square_quantile;
use crate::estimator::observe::StepScratch;
use crate::estimator::refit::NewtonStep;
use crate::estimator::{Common, EstimatorConfig};
use crate::sync::{Mutex, MutexGuard};

/// The map update of an estimator.
#[derive(Debug)]
pub(in crate::estimator) struct MapUpdate {
    /// The open round's additions since the last drain.
    histogram: HistogramAccumulator,
    binning: Binning,
    prior: Prior,
    /// What refits change, behind the refit lock.
    fit: Mutex<Fit>,
    /// Where observe bins a step (empty between calls; a thread that finds it taken bins into
    /// a new one).
    scratch: Mutex<StepScratch>,
}

/// The map update's state under the refit lock.
#[derive(Debug)]
pub(in crate::estimator) struct Fit {
    /// `θ = (ω, β)` published at the last round's end.
    reference: Vec<f64>,
    /// The open round drained from the accumulator so far.
    round: HistogramStats,
    memory: HistogramMemory,
    fitted_labels: u64,
}

/// Coefficients without a version: the map update's reference.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reference {
    /// Slope ω.
    pub slope: f64,
    /// Intercepts β_k.
    pub intercepts: Vec<f64>,
}

/// The map update's part of an [`EstimatorState`](crate::EstimatorState) (saved as
/// `round_stats`, `reference`, `fitted_labels` and `memory_state`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MapState {
    /// The open round's histograms.
    #[serde(rename = "round_stats")]
    pub round: HistogramStats,
    /// The coefficients published at the last round's end: every fit starts there, is bounded
    /// around them, and the drift test scores the round there.
    pub reference: Reference,
    /// The open round's labels that the last fit saw (a fit within the round is skipped while
    /// nothing new arrived).
    #[serde(with = "crate::persist::fixed")]
    pub fitted_labels: u64,
    /// The discounted histograms of past rounds, and how often the drift test dropped them.
    #[serde(rename = "memory_state")]
    pub memory: HistogramMemory,
}

/// The map update's part of a [`RefitReport`].
#[derive(Clone, Debug, PartialEq)]
pub struct MapReport {
    /// The histograms the fit consumed at a round's end (the round); `None` within a round.
    pub round: Option<HistogramStats>,
    /// The round's drift statistic at the reference coefficients (round ends with labels).
    pub drift_statistic: Option<f64>,
    /// Newton iterations of the fit (0 when the statistics held nothing new).
    pub iterations: u32,
}

/// The error of an add refused because position `k`, bin `b` of the open round is full.
fn bin_full(argument: &'static str, (k, b): (usize, usize)) -> Error {
    Error::value(
        argument,
        format!(
            "would take position {k}, bin {b}'s count in this round past {MAX_BIN_COUNT} \
             (refit first)"
        ),
    )
}

impl MapUpdate {
    /// Adds `round` to the open round unless it is impossible ([`HistogramStats::validate`])
    /// or a bin would pass [`MAX_BIN_COUNT`] labels (the bound a restored state must meet,
    /// which keeps every position within [`MAX_COUNT`] too, so that every state this
    /// estimator reaches saves and loads again); then nothing changes and the error names
    /// `argument`.
    pub(in crate::estimator) fn add_round(
        &self,
        common: &Common,
        argument: &'static str,
        round: &HistogramStats,
    ) -> Result<()> {
        let config = &common.config;
        round.validate(
            argument,
            config.num_positions,
            config.bins,
            config.max_log_odds,
        )?;
        self.histogram
            .try_add(round)
            .map_err(|at| bin_full(argument, at))
    }

    /// The open round (a consistent snapshot; the round goes on).
    pub(in crate::estimator) fn round(&self) -> HistogramStats {
        let mut fit = self.lock();
        self.histogram.drain_into(&mut fit.round);
        fit.round.clone()
    }

    /// Publishes the coefficients the fit `theta` gives within the bounds around `reference`,
    /// as refit `version`; returns the step (`theta − reference`).
    fn publish_bounded(
        common: &Common,
        reference: &[f64],
        theta: &[f64],
        version: u64,
    ) -> NewtonStep {
        let step = NewtonStep {
            slope: theta[0] - reference[0],
            intercepts: theta[1..]
                .iter()
                .zip(&reference[1..])
                .map(|(t, r)| t - r)
                .collect(),
        };
        let mut intercepts = reference[1..].to_vec();
        let slope = common
            .config
            .bounds()
            .apply(reference[0], &mut intercepts, &step);
        common.coefficients.write(slope, &intercepts, version);
        step
    }
}

impl UpdateRule for MapUpdate {
    type State = MapState;
    type Locked = Fit;
    const FITS_WITHIN_ROUND: bool = true;

    fn new(config: &EstimatorConfig) -> Self {
        let k = config.num_positions;
        let reference = std::iter::once(config.init_slope)
            .chain(std::iter::repeat_n(config.init_intercept, k))
            .collect();
        Self::assemble(
            config,
            Fit {
                reference,
                round: HistogramStats::new(k, config.bins),
                memory: HistogramMemory::new(k, config.bins),
                fitted_labels: 0,
            },
        )
    }

    fn fresh_state(config: &EstimatorConfig, slope: f64, intercepts: &[f64]) -> MapState {
        let k = config.num_positions;
        MapState {
            round: HistogramStats::new(k, config.bins),
            reference: Reference {
                slope,
                intercepts: intercepts.to_vec(),
            },
            fitted_labels: 0,
            memory: HistogramMemory::new(k, config.bins),
        }
    }

    fn restore(config: &EstimatorConfig, state: &MapState, num_refits: u64) -> Result<Self> {
        let k = config.num_positions;
        let reference = &state.reference;
        ensure_finite("reference", reference.slope)?;
        if !(0.0..=config.max_slope).contains(&reference.slope) {
            return Err(Error::value(
                "reference",
                format!(
                    "slope must be in [0, max_slope = {}], got {}",
                    config.max_slope, reference.slope
                ),
            ));
        }
        if reference.intercepts.len() != k {
            return Err(Error::value(
                "reference",
                format!(
                    "expected {k} intercepts, got {}",
                    reference.intercepts.len()
                ),
            ));
        }
        for &b in &reference.intercepts {
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
        state
            .round
            .validate("round_stats", k, config.bins, config.max_log_odds)?;
        state
            .memory
            .validate(k, config.bins, config.memory, config.max_log_odds)?;
        let labels = state.round.total_count();
        if state.fitted_labels > labels {
            return Err(Error::value(
                "fitted_labels",
                format!(
                    "= {} exceeds the open round's {labels} labels",
                    state.fitted_labels
                ),
            ));
        }
        if state.memory.resets > num_refits {
            return Err(Error::value(
                "memory",
                format!(
                    "{} resets but only {num_refits} refits (each reset is one refit)",
                    state.memory.resets
                ),
            ));
        }
        let update = Self::assemble(
            config,
            Fit {
                reference: std::iter::once(reference.slope)
                    .chain(reference.intercepts.iter().copied())
                    .collect(),
                round: state.round.clone(),
                memory: state.memory.clone(),
                fitted_labels: state.fitted_labels,
            },
        );
        update.histogram.reserve(&state.round);
        Ok(update)
    }

    fn lock(&self) -> MutexGuard<'_, Fit> {
        crate::estimator::lock(&self.fit)
    }

    fn state(&self, fit: &mut Fit) -> MapState {
        self.histogram.drain_into(&mut fit.round);
        MapState {
            round: fit.round.clone(),
            reference: Reference {
                slope: fit.reference[0],
                intercepts: fit.reference[1..].to_vec(),
            },
            fitted_labels: fit.fitted_labels,
            memory: fit.memory.clone(),
        }
    }

    fn observe<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        common: &Common,
        step: Step<'_, T, P>,
        count_step: bool,
    ) -> Result<bool> {
        // The kept scratch, or a new one while another thread bins its step in it.
        let (mut kept, mut own) = (self.scratch.try_lock().ok(), None);
        let scratch = match kept.as_deref_mut() {
            Some(scratch) => scratch,
            None => own.insert(StepScratch::new(
                common.config.num_positions,
                common.config.bins,
            )),
        };
        let added = common
            .step_bins(step, &self.binning, scratch)
            .and_then(|()| {
                self.histogram
                    .try_add_step(&scratch.histogram)
                    .map_err(|at| bin_full("num_admitted", at))
            });
        scratch.histogram.clear();
        drop(kept);
        added?;
        Ok(count_step && common.count_step(self))
    }

    /// The round's end (under the refit lock): the drift test of the round at the reference,
    /// the memory discounted (or dropped), the round added, the memory fitted from the
    /// reference, and the result the next round's reference. A round without labels only
    /// discounts the memory. Depends only on the memory and the round's observations, not on
    /// the fits within the round.
    fn end_round(&self, common: &Common, state: &mut Fit) -> RefitReport {
        let config = &common.config;
        let k = config.num_positions;
        self.histogram.drain_into(&mut state.round);
        let round = std::mem::replace(&mut state.round, HistogramStats::new(k, config.bins));
        self.histogram.end_round(&round);
        state.fitted_labels = 0;
        let current = common.coefficients.read();
        let version = (current.version + 1).min(MAX_COUNT); // saturates: every state reloads
        let (step, drift_statistic, iterations) = if round.total_count() == 0 {
            state.memory.decay(config.memory);
            common
                .coefficients
                .write(current.slope, &current.intercepts, version);
            (NewtonStep::zero(k), None, 0)
        } else {
            let l2 = common.regularization()[0];
            let statistic = fit::score_statistic(
                &fit::round_bins(&round, &self.binning),
                &state.reference,
                l2,
            );
            let drifted = statistic > chi_square_quantile(k + 1, config.drift_z);
            state.memory.decay(config.memory);
            if drifted {
                state.memory.clear();
                state.memory.resets = (state.memory.resets + 1).min(MAX_COUNT);
            }
            state.memory.add_round(&round, &self.binning);
            let bins = FitBins::gather(Some(&state.memory), None, &self.binning, k);
            let fitted = fit::fit(&bins, &self.prior, &state.reference, l2);
            let step = Self::publish_bounded(common, &state.reference, &fitted.theta, version);
            (step, Some(statistic), fitted.iterations)
        };
        let published = common.coefficients.read();
        state.reference.clear();
        state.reference.push(published.slope);
        state.reference.extend(&published.intercepts);
        RefitReport {
            step,
            update: MapReport {
                round: Some(round),
                drift_statistic,
                iterations,
            }
            .into(),
        }
    }

    /// A fit within the round (under the refit lock): memory plus the open round so far, from
    /// the reference; skipped (the same coefficients, one more refit counted) when the open
    /// round holds no label the last fit did not see.
    fn fit_within_round(&self, common: &Common, state: &mut Fit) -> Option<RefitReport> {
        let k = common.config.num_positions;
        self.histogram.drain_into(&mut state.round);
        let labels = state.round.total_count();
        let current = common.coefficients.read();
        let version = (current.version + 1).min(MAX_COUNT); // saturates: every state reloads
        let (step, iterations) = if labels > state.fitted_labels {
            let bins = FitBins::gather(Some(&state.memory), Some(&state.round), &self.binning, k);
            let l2 = common.regularization()[0];
            let fitted = fit::fit(&bins, &self.prior, &state.reference, l2);
            state.fitted_labels = labels;
            let step = Self::publish_bounded(common, &state.reference, &fitted.theta, version);
            (step, fitted.iterations)
        } else {
            common
                .coefficients
                .write(current.slope, &current.intercepts, version);
            (NewtonStep::zero(k), 0)
        };
        Some(RefitReport {
            step,
            update: MapReport {
                round: None,
                drift_statistic: None,
                iterations,
            }
            .into(),
        })
    }

    fn round_counts(&self) -> Vec<u64> {
        self.round().position_counts()
    }
}

impl MapUpdate {
    /// The scratch observe bins into (for tests that hold it, as another caller would).
    #[cfg(test)]
    pub(in crate::estimator) fn scratch(&self) -> &Mutex<StepScratch> {
        &self.scratch
    }

    fn assemble(config: &EstimatorConfig, fit: Fit) -> Self {
        let k = config.num_positions;
        MapUpdate {
            histogram: HistogramAccumulator::new(k, config.bins),
            binning: Binning::new(config.max_log_odds, config.bins),
            prior: Prior::new(
                k,
                &config.prior_widths(),
                config.init_slope,
                config.init_intercept,
            ),
            fit: Mutex::new(fit),
            scratch: Mutex::new(StepScratch::new(k, config.bins)),
        }
    }
}
