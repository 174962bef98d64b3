//! One decode step's verdicts: the checks of a step's arguments, its statistics (or histograms)
//! and their addition to the open round.

use super::accumulator::{RoundStats, MAX_COUNT};
use super::batch::{batch_stats, Predictions};
use super::histogram::{HistogramStats, StepHistogram, MAX_BIN_COUNT};
use super::labels::{num_labeled, validate_counts};
use super::{AcceptanceEstimator, Update};
use crate::error::{Error, Result};
use crate::matrix::MatrixView;

/// Features located per block by observe's binning (whole rows of at most
/// [`EstimatorConfig::MAX_POSITIONS`](super::EstimatorConfig::MAX_POSITIONS) features).
const LOCATE_BLOCK: usize = 512;

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

/// The error of an add refused because position `k`, bin `b` of the open round is full.
fn bin_full(argument: &'static str, k: usize, b: usize) -> Error {
    Error::value(
        argument,
        format!(
            "would take position {k}, bin {b}'s count in this round past {MAX_BIN_COUNT} \
             (refit first)"
        ),
    )
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
        self.histogram
            .try_add(step)
            .map_err(|(k, b)| bin_full(argument, k, b))
    }

    /// [`add_to_histogram`](Self::add_to_histogram) for observe's own step histograms.
    fn add_step_to_histogram(&self, argument: &'static str, step: &StepHistogram) -> Result<()> {
        self.histogram
            .try_add_step(step)
            .map_err(|(k, b)| bin_full(argument, k, b))
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
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView, Update};
    ///
    /// let view = MatrixView::new("features", &[1.5f32, -0.5], 1, 2)?;
    /// // vLLM's update pools IRLS moments (add_round_histogram pools map's histograms).
    /// let config = EstimatorConfig::new(2).with_update(Update::Vllm);
    /// let (one, other) = (config.clone(), config);
    /// let (rank0, rank1) = (AcceptanceEstimator::new(one)?, AcceptanceEstimator::new(other)?);
    /// rank0.observe(view, &[2], &[1], None::<MatrixView<'_, f32>>)?;
    /// rank1.observe(view, &[2], &[0], None::<MatrixView<'_, f32>>)?;
    /// rank0.add_round_stats(&rank1.round_stats())?; // rank 0 now holds the pooled round
    /// assert_eq!(rank0.round_stats().total_count(), 3);
    /// assert!(rank0.add_round_stats(&av_core::estimator::RoundStats::new(3)).is_err());
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
    pub(super) fn add_to_round(&self, argument: &'static str, stats: &RoundStats) -> Result<()> {
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

    /// Fails on the first non-finite feature.
    pub(super) fn check_features<T: Copy + Into<f64>>(&self, features: &[T]) -> Result<()> {
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
        self.step_bins(features, num_admitted, num_accepted, predictions)
            .map(StepHistogram::into_stats)
    }

    /// [`step_histogram`](Self::step_histogram) with the bitmap of the occupied bins that
    /// [`HistogramAccumulator::try_add_step`](super::histogram::HistogramAccumulator::try_add_step)
    /// adds from (observe's path).
    fn step_bins<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        features: MatrixView<'_, T>,
        num_admitted: &[i64],
        num_accepted: &[i64],
        predictions: Option<MatrixView<'_, P>>,
    ) -> Result<StepHistogram> {
        let k = self.config.num_positions;
        let counts = self.checked_counts(features, num_admitted, num_accepted, predictions)?;
        if let Some(given) = &predictions {
            if !all_pass(given.data(), |p| (0.0..=1.0).contains(&p)) {
                return Err(self.culprit(features, predictions, "predictions"));
            }
        }
        // One read of each feature: every one is checked, and the labeled ones are binned from
        // the same read (a buffer another thread rewrites meanwhile can fail the call, never
        // get an unchecked value in). Blocks of whole rows: a vectorized pass locates every
        // feature of the block, then the labeled ones are added.
        let binning = self.binning;
        let bins = binning.bins();
        let mut step = StepHistogram::new(k, bins);
        let mut finite = true;
        let rows_per_block = (LOCATE_BLOCK / k).max(1);
        let (mut bin_of, mut offset_of) = ([0u32; LOCATE_BLOCK], [0u64; LOCATE_BLOCK]);
        for (block, block_counts) in features
            .data()
            .chunks(rows_per_block * k)
            .zip(counts.chunks(rows_per_block))
        {
            finite &= binning.locate_all(block, &mut bin_of, &mut offset_of);
            for (row, &(admitted, accepted)) in block_counts.iter().enumerate() {
                // The labeled drafts: the accepted ones, then the first rejection. The counts
                // are valid, so `labeled ≤ k`; `min` keeps the slices in range regardless.
                let labeled = num_labeled(admitted, accepted).min(k);
                let start = row * k;
                let located = bin_of[start..start + labeled]
                    .iter()
                    .zip(&offset_of[start..start + labeled]);
                for (position, (&bin, &offset)) in located.enumerate() {
                    step.add(position * bins + bin as usize, position < accepted, offset);
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
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView, Update};
    ///
    /// let mut config = EstimatorConfig::new(2).with_update(Update::Vllm);
    /// config.refit_interval = Some(2);
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
    /// config.refit_interval = Some(3);
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
                let step = self.step_bins(features, num_admitted, num_accepted, predictions)?;
                self.add_step_to_histogram("num_admitted", &step)?;
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
                let step = self.step_bins(features, num_admitted, num_accepted, predictions)?;
                self.add_step_to_histogram("num_admitted", &step)?;
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
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView, Update};
    ///
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2).with_update(Update::Vllm))?;
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
}
