//! One decode step's verdicts: the checks of a step's arguments and its statistics (IRLS
//! moments or histograms), which the update rule adds to its open round.

use super::accumulator::RoundStats;
use super::batch::{batch_stats_into, Predictions};
use super::histogram::{Binning, HistogramStats, StepHistogram};
use super::labels::{counts_valid, validate_counts};
use super::update::{dispatch, Step, UpdateRule};
use super::{AcceptanceEstimator, Common};
use crate::error::{Error, Result};
use crate::matrix::MatrixView;

/// Features located per block by observe's binning (whole rows of at most
/// [`EstimatorConfig::MAX_POSITIONS`](super::EstimatorConfig::MAX_POSITIONS) features).
const LOCATE_BLOCK: usize = 512;

/// A step bins its labeled features one by one when they are at most one in this many of its
/// features, and else locates every feature in a vectorized pass: the pass costs about 7
/// instructions a feature on AVX2, locating one feature alone about 25, and checking that a
/// feature is finite under 1 (so one by one wins below about one labeled feature in four).
const SPARSE_RATIO: usize = 4;

/// Whether every value of `source` passes `ok`, in one branch-free pass that vectorizes, on
/// the widest vectors the CPU has ([`crate::simd`]; a yes or no, the same on every variant).
#[inline]
fn all_pass<T: Copy + Into<f64>>(source: &[T], ok: impl Fn(f64) -> bool) -> bool {
    all_pass_at(crate::simd::level(), source, ok)
}

/// [`all_pass`] on the variant for `level`, which must be one this CPU runs
/// ([`crate::simd::available`]).
#[inline]
fn all_pass_at<T: Copy + Into<f64>>(
    level: crate::simd::Level,
    source: &[T],
    ok: impl Fn(f64) -> bool,
) -> bool {
    crate::simd::dispatch!(
        level,
        avx512: x86::all_pass_avx512(source, ok),
        avx2: x86::all_pass_avx2(source, ok),
        baseline: all_pass_baseline(source, ok),
    )
}

/// The body of every [`all_pass`] variant.
#[inline(always)]
fn all_pass_baseline<T: Copy + Into<f64>>(source: &[T], ok: impl Fn(f64) -> bool) -> bool {
    source
        .iter()
        .fold(true, |all, &value| all & ok(value.into()))
}

/// The number of labeled drafts of a step ([`num_labeled`](super::labels::num_labeled) summed
/// over its requests) if every request's counts are possible ([`counts_valid`]), else `None`:
/// one branch-free pass on the widest vectors the CPU has (as [`all_pass`]).
#[inline]
fn count_labels(num_admitted: &[i64], num_accepted: &[i64], k: usize) -> Option<usize> {
    count_labels_at(crate::simd::level(), num_admitted, num_accepted, k)
}

/// [`count_labels`] on the variant for `level` (one this CPU runs).
#[inline]
fn count_labels_at(
    level: crate::simd::Level,
    num_admitted: &[i64],
    num_accepted: &[i64],
    k: usize,
) -> Option<usize> {
    crate::simd::dispatch!(
        level,
        avx512: x86::count_labels_avx512(num_admitted, num_accepted, k),
        avx2: x86::count_labels_avx2(num_admitted, num_accepted, k),
        baseline: count_labels_baseline(num_admitted, num_accepted, k),
    )
}

/// The body of every [`count_labels`] variant.
#[inline(always)]
fn count_labels_baseline(num_admitted: &[i64], num_accepted: &[i64], k: usize) -> Option<usize> {
    // `num_labeled` without a branch: the accepted drafts, and the first rejection if any.
    // Wrapping: impossible counts give any sum, and `None`.
    let (valid, labels) = num_admitted.iter().zip(num_accepted).fold(
        (true, 0u64),
        |(valid, labels), (&admitted, &accepted)| {
            let labeled = (accepted as u64).wrapping_add(u64::from(accepted < admitted));
            (
                valid & counts_valid(admitted, accepted, k),
                labels.wrapping_add(labeled),
            )
        },
    );
    valid.then_some(labels as usize)
}

/// The checks compiled for AVX2 and AVX-512 (the same code, wider vectors).
#[cfg(target_arch = "x86_64")]
mod x86 {
    crate::simd::wide_variants! {
        fn all_pass_avx2 / all_pass_avx512 [T: Copy + Into<f64>] (
            source: &[T],
            ok: impl Fn(f64) -> bool,
        ) -> bool {
            super::all_pass_baseline(source, ok)
        }

        fn count_labels_avx2 / count_labels_avx512 [] (
            admitted: &[i64],
            accepted: &[i64],
            k: usize,
        ) -> Option<usize> {
            super::count_labels_baseline(admitted, accepted, k)
        }
    }
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

/// Fails on the first non-finite feature.
pub(super) fn check_features<T: Copy + Into<f64>>(features: &[T]) -> Result<()> {
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

impl Common {
    /// The error for a step whose features or predictions failed a check: the first bad
    /// prediction, else the first bad feature (the order the checks have always had), else,
    /// when a second read finds none, that `argument` changed while the call read it.
    pub(super) fn culprit<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        step: Step<'_, T, P>,
        argument: &'static str,
    ) -> Error {
        check_predictions(step.predictions)
            .and_then(|()| check_features(step.features.data()))
            .err()
            .unwrap_or_else(|| changed_while_read(argument))
    }

    /// Fails on a given prediction outside `[0, 1]` (NaN included), naming the culprit.
    pub(super) fn check_given_predictions<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        step: Step<'_, T, P>,
    ) -> Result<()> {
        match &step.predictions {
            Some(given) if !all_pass(given.data(), |p| (0.0..=1.0).contains(&p)) => {
                Err(self.culprit(step, "predictions"))
            }
            _ => Ok(()),
        }
    }

    /// [`AcceptanceEstimator::step_stats`] of `step` into `scratch.stats`: its IRLS moments at
    /// the given predictions (at the current coefficients' without them), every argument
    /// checked. On an error `scratch.stats` holds nothing meaningful.
    pub(super) fn step_stats<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        step: Step<'_, T, P>,
        scratch: &mut StatsScratch,
    ) -> Result<()> {
        let k = self.config.num_positions;
        let StatsScratch {
            counts,
            intercepts,
            stats,
        } = scratch;
        self.checked_counts(step, counts)?;
        let (slope, _) = self.coefficients.read_into(intercepts);
        // Features and predictions are checked in one vectorized pass each and summed in place:
        // they are shared borrows, which cannot change during the call (the Python bindings
        // pass their own copies; the C ABI's callers must not write the buffers meanwhile).
        let features_ok = all_pass(step.features.data(), f64::is_finite);
        self.check_given_predictions(step)?;
        let given = match &step.predictions {
            Some(given) => Predictions::Given(given.data()),
            None => Predictions::Current { slope, intercepts },
        };
        if !features_ok {
            return Err(self.culprit(step, "features"));
        }
        batch_stats_into(
            k,
            step.features.data(),
            counts,
            given,
            self.config.max_log_odds,
            stats,
        );
        Ok(())
    }

    /// One step's histograms over `binning`'s bins, every argument checked (`predictions` are
    /// checked, and not used: the map fit recomputes every probability), built in `scratch`,
    /// which must be empty ([`StepHistogram::clear`]; the caller clears it after use, on an
    /// error too).
    pub(super) fn step_bins<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        step: Step<'_, T, P>,
        binning: &Binning,
        scratch: &mut StepScratch,
    ) -> Result<()> {
        let k = self.config.num_positions;
        self.check_shapes(step)?;
        self.check_given_predictions(step)?;
        let Some(labels) = count_labels(step.num_admitted, step.num_accepted, k) else {
            return Err(count_culprit(step, k));
        };
        let StepScratch {
            histogram,
            bin_of,
            offset_of,
        } = scratch;
        let features = step.features.data();
        if labels.saturating_mul(SPARSE_RATIO) <= features.len() {
            // Few drafts labeled: one vectorized check of every feature, then the labeled ones
            // located one by one (and checked again as they are read, so that no value the
            // check did not pass is binned). The same bins and offsets as the pass below: both
            // locate with `Binning::locate_branch_free`.
            let finite = all_pass(features, f64::is_finite)
                && histogram.locate_rows(binning, features, step.num_admitted, step.num_accepted);
            if !finite {
                return Err(self.culprit(step, "features"));
            }
            return Ok(());
        }
        // One read of each feature: every one is checked, and the labeled ones are binned from
        // the same read (a buffer another thread rewrites meanwhile can fail the call, never
        // get an unchecked value in). Blocks of whole rows: a vectorized pass locates every
        // feature of the block, then the labeled ones are added.
        let mut finite = true;
        let rows_per_block = (LOCATE_BLOCK / k).max(1);
        for ((block, admitted), accepted) in features
            .chunks(rows_per_block * k)
            .zip(step.num_admitted.chunks(rows_per_block))
            .zip(step.num_accepted.chunks(rows_per_block))
        {
            finite &= binning.locate_all(block, bin_of, offset_of);
            let located = block.len();
            histogram.add_rows(
                &bin_of[..located],
                &offset_of[..located],
                admitted,
                accepted,
            );
        }
        if !finite {
            return Err(self.culprit(step, "features"));
        }
        Ok(())
    }

    /// The shapes of one step: `features` `[R, K]`, `R` counts each, `predictions` (if given)
    /// `[R, K]`.
    fn check_shapes<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        step: Step<'_, T, P>,
    ) -> Result<()> {
        let k = self.config.num_positions;
        let Step {
            features,
            num_admitted,
            num_accepted,
            predictions,
        } = step;
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
        Ok(())
    }

    /// Shapes and counts of one step, validated (the culprit named in the order predictions,
    /// features, counts when a count is wrong).
    fn checked_counts<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        step: Step<'_, T, P>,
        counts: &mut Vec<(usize, usize)>,
    ) -> Result<()> {
        let k = self.config.num_positions;
        self.check_shapes(step)?;
        // One branch-free pass per input; the searches that name a culprit (in the order:
        // predictions, features, counts) run only on failure.
        let mut valid = true;
        counts.clear();
        counts.extend(step.num_admitted.iter().zip(step.num_accepted).map(
            |(&admitted, &accepted)| {
                valid &= counts_valid(admitted, accepted, k);
                (admitted as usize, accepted as usize)
            },
        ));
        if !valid {
            return Err(count_culprit(step, k));
        }
        Ok(())
    }
}

/// The error of a step with an impossible count: the first bad prediction, else the first bad
/// feature, else the first bad count (the order the checks name culprits in), else, when a
/// second read finds none, that the counts changed while the call read them.
fn count_culprit<T: Copy + Into<f64>, P: Copy + Into<f64>>(
    step: Step<'_, T, P>,
    k: usize,
) -> Error {
    let named = check_predictions(step.predictions)
        .and_then(|()| check_features(step.features.data()))
        .and_then(|()| {
            let counts = step.num_admitted.iter().zip(step.num_accepted);
            for (row, (&admitted, &accepted)) in counts.enumerate() {
                validate_counts(row, admitted, accepted, k)?;
            }
            Ok(())
        });
    named
        .err()
        .unwrap_or_else(|| changed_while_read("num_admitted"))
}

/// What observe's binning writes into: the step's histograms, and the bins and offsets of one
/// block of located features. The map update keeps one between calls, so that a step neither
/// allocates nor zero-fills the `K × B` bins (about 12 KB at the defaults).
#[derive(Debug)]
pub(super) struct StepScratch {
    /// The step's histograms (empty between uses).
    pub(super) histogram: StepHistogram,
    bin_of: Vec<u32>,
    offset_of: Vec<u64>,
}

impl StepScratch {
    /// An empty scratch for `num_positions` positions of `bins` bins.
    pub(super) fn new(num_positions: usize, bins: usize) -> Self {
        StepScratch {
            histogram: StepHistogram::new(num_positions, bins),
            bin_of: vec![0; LOCATE_BLOCK],
            offset_of: vec![0; LOCATE_BLOCK],
        }
    }
}

/// What the `vllm` update's observe computes into: the step's checked counts, the current
/// intercepts and the step's statistics. The update keeps one between calls, so that a step
/// does not allocate.
#[derive(Debug)]
pub(super) struct StatsScratch {
    counts: Vec<(usize, usize)>,
    intercepts: Vec<f64>,
    /// The last step's statistics (after a successful [`Common::step_stats`]).
    pub(super) stats: RoundStats,
}

impl StatsScratch {
    /// An empty scratch for `num_positions` positions.
    pub(super) fn new(num_positions: usize) -> Self {
        StatsScratch {
            counts: Vec::new(),
            intercepts: Vec::with_capacity(num_positions),
            stats: RoundStats::new(num_positions),
        }
    }
}

impl AcceptanceEstimator {
    /// One decode step's statistics without adding them anywhere: validates every argument and
    /// returns the IRLS moments [`observe`](Self::observe) accumulates under `vllm`.
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
    /// let estimator = AcceptanceEstimator::new(EstimatorConfig::vllm(4))?;
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
        let mut scratch = StatsScratch::new(self.common.config.num_positions);
        let step = Step {
            features,
            num_admitted,
            num_accepted,
            predictions,
        };
        self.common.step_stats(step, &mut scratch)?;
        Ok(scratch.stats)
    }

    /// One decode step's histograms without adding them anywhere: validates every argument
    /// (as [`step_stats`](Self::step_stats); `predictions` are checked, and not used: the
    /// `map` refit recomputes every probability) and returns what
    /// [`observe`](Self::observe) adds under `map`, over the configuration's `bins`.
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
        let config = &self.common.config;
        let step = Step {
            features,
            num_admitted,
            num_accepted,
            predictions,
        };
        let binning = Binning::new(config.max_log_odds, config.bins);
        let mut scratch = StepScratch::new(config.num_positions, config.bins);
        self.common.step_bins(step, &binning, &mut scratch)?;
        Ok(scratch.histogram.into_stats())
    }

    /// Folds one decode step of verdicts into the round (see [`step_stats`](Self::step_stats)
    /// for the arguments). Returns `true` when this call refitted: it completed a round, or
    /// (under `map`) it was the 1st, 2nd, 4th, … step of its round.
    ///
    /// Adds without the refit lock (the call a refit is due on takes it); on a bad argument
    /// nothing changes. The inputs are shared borrows: they must not change during the call
    /// (the Python bindings pass their own copies of the caller's arrays).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    ///
    /// let mut config = EstimatorConfig::vllm(2);
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
    /// // Under map (the default) the round's 1st, 2nd, 4th, … steps are fitted too.
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
        let step = Step {
            features,
            num_admitted,
            num_accepted,
            predictions,
        };
        dispatch!(&self.rule, rule => rule.observe(&self.common, step, true))
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
        let step = Step {
            features,
            num_admitted,
            num_accepted,
            predictions,
        };
        dispatch!(&self.rule, rule => rule.observe(&self.common, step, false)).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimator::labels::num_labeled;
    use crate::test_rng::XorShift;

    #[test]
    fn every_vector_unit_checks_like_one_value_at_a_time() {
        // The vectorized checks against a plain loop, on every vector unit this CPU has, for
        // lengths around the vector widths, with one bad value (or none) at every place.
        let mut rng = XorShift::new(31);
        let bad_values = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1e-300,
            1.0 + 1e-12,
        ];
        for level in crate::simd::available() {
            for len in [0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100] {
                let good: Vec<f64> = (0..len).map(|_| rng.unit_f64()).collect();
                for place in 0..=len {
                    for &bad in &bad_values {
                        let mut xs = good.clone();
                        if place < len {
                            xs[place] = bad;
                        }
                        let xs32: Vec<f32> = xs.iter().map(|&x| x as f32).collect();
                        let finite = |x: f64| x.is_finite();
                        let unit = |p: f64| (0.0..=1.0).contains(&p);
                        for ok in [&finite as &dyn Fn(f64) -> bool, &unit] {
                            let plain = xs.iter().all(|&x| ok(x));
                            assert_eq!(all_pass_at(level, &xs, ok), plain, "{level:?} {xs:?}");
                            let plain32 = xs32.iter().all(|&x| ok(f64::from(x)));
                            assert_eq!(all_pass_at(level, &xs32, ok), plain32, "{level:?}");
                        }
                    }
                }
                // Counts: every kind of impossible pair at every place.
                let k = 8usize;
                let admitted: Vec<i64> = (0..len).map(|_| (rng.next_u64() % 9) as i64).collect();
                let accepted: Vec<i64> = admitted
                    .iter()
                    .map(|&a| (rng.next_u64() % (a as u64 + 1)) as i64)
                    .collect();
                let labels: usize = admitted
                    .iter()
                    .zip(&accepted)
                    .map(|(&a, &c)| num_labeled(a as usize, c as usize))
                    .sum();
                assert_eq!(
                    count_labels_at(level, &admitted, &accepted, k),
                    Some(labels)
                );
                let bad_pairs = [(-1, 0), (3, -1), (2, 3), (9, 1), (i64::MIN, i64::MIN)];
                for place in 0..len {
                    for (bad_admitted, bad_accepted) in bad_pairs {
                        let (mut ad, mut ac) = (admitted.clone(), accepted.clone());
                        ad[place] = bad_admitted;
                        ac[place] = bad_accepted;
                        let counted = count_labels_at(level, &ad, &ac, k);
                        assert_eq!(counted, None, "{level:?} {place}");
                    }
                }
            }
        }
    }
}
