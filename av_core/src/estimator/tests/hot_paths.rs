//! The hot paths' reused and stack buffers. Observe's step scratch, which the map update keeps
//! between calls: whatever a call leaves in it (a step that failed after binning part of its
//! rows, a step refused at the bound, a scratch another thread holds) never reaches a later
//! step's statistics, and sparse and dense steps bin alike. Predict's intercept pattern, on the
//! stack or allocated: every position gets its own intercept.

use super::{map, view, workload, NO_PREDICTIONS};
use crate::estimator::histogram::{Binning, MAX_BIN_COUNT};
use crate::estimator::update::Rule;
use crate::estimator::{AcceptanceEstimator, EstimatorConfig, EstimatorState};

/// A map estimator without scheduled refits (the open round is then the whole state).
fn manual_map(k: usize) -> AcceptanceEstimator {
    let mut config = EstimatorConfig::map(k);
    config.refit_interval = None;
    AcceptanceEstimator::new(config).unwrap()
}

/// The state after `steps`, observed on a fresh estimator (the reference: no failed call).
fn reference_state(k: usize, steps: &[(Vec<f32>, Vec<i64>, Vec<i64>)]) -> EstimatorState {
    let est = manual_map(k);
    for (f, ad, ac) in steps {
        est.observe(view(f, k), ad, ac, NO_PREDICTIONS).unwrap();
    }
    est.state()
}

/// A refused step: features, admitted, accepted, predictions, and the argument the error names.
type Refused<'a> = (&'a [f32], &'a [i64], &'a [i64], Option<&'a [f32]>, &'a str);

#[test]
fn a_step_that_fails_after_binning_leaves_nothing_for_the_next() {
    let k = 4;
    let good: Vec<_> = (0..3).map(|seed| workload(seed, 40, k)).collect();
    let expected = reference_state(k, &good);
    let (f, ad, ac) = workload(99, 40, k);
    assert!(ad.iter().sum::<i64>() > 0, "the failing steps label drafts");
    // The bad value sits in the last row: every earlier row was binned into the scratch.
    let mut nan = f.clone();
    *nan.last_mut().unwrap() = f32::NAN;
    let (mut too_many, mut negative) = (ac.clone(), ad.clone());
    *too_many.last_mut().unwrap() = ad[ad.len() - 1] + 1;
    *negative.last_mut().unwrap() = -1;
    let bad_predictions = vec![0.5f32; f.len()];
    let mut bad_predictions_last = bad_predictions.clone();
    *bad_predictions_last.last_mut().unwrap() = 1.5;
    let failures: [Refused<'_>; 4] = [
        (
            nan.as_slice(),
            ad.as_slice(),
            ac.as_slice(),
            None,
            "features",
        ),
        (
            f.as_slice(),
            ad.as_slice(),
            too_many.as_slice(),
            None,
            "num_accepted",
        ),
        (
            f.as_slice(),
            negative.as_slice(),
            ac.as_slice(),
            None,
            "num_admitted",
        ),
        (
            f.as_slice(),
            ad.as_slice(),
            ac.as_slice(),
            Some(bad_predictions_last.as_slice()),
            "predictions",
        ),
    ];
    for (features, admitted, accepted, predictions, culprit) in failures {
        let est = manual_map(k);
        let predictions = predictions.map(|p| view(p, k));
        let error = est
            .observe(view(features, k), admitted, accepted, predictions)
            .unwrap_err();
        assert_eq!(error.argument, culprit, "{error}");
        for (f, ad, ac) in &good {
            est.observe(view(f, k), ad, ac, NO_PREDICTIONS).unwrap();
        }
        assert_eq!(est.state(), expected, "after a call refused on {culprit}");
    }
    // The valid predictions of the same shape are accepted (the check above was the culprit).
    let est = manual_map(k);
    est.observe(view(&f, k), &ad, &ac, Some(view(&bad_predictions, k)))
        .unwrap();
}

#[test]
fn a_step_refused_at_the_bound_leaves_nothing_for_the_next() {
    // One full bin (position 0, the bin of x = 0) in a restored round: a step with a draft in
    // it is refused after the whole step was binned; the next step, clear of it, adds exactly
    // its own drafts.
    let k = 2;
    let est = manual_map(k);
    let mut state = est.state();
    let binning = Binning::new(state.config.max_log_odds, state.config.bins);
    let (full_bin, offset) = binning.locate(0.0);
    let round = &mut map(&mut state).round;
    round.count[full_bin] = MAX_BIN_COUNT;
    round.x_sum[full_bin] = offset * MAX_BIN_COUNT;
    let restored = || AcceptanceEstimator::from_state(&state).unwrap();
    let (est, reference) = (restored(), restored());
    // Row 0 lands in other bins; row 1's first draft in the full one.
    let refused = [5.0f32, -7.0, 0.0, 3.0];
    let error = est
        .observe(view(&refused, k), &[2, 2], &[2, 1], NO_PREDICTIONS)
        .unwrap_err();
    assert!(error.message.contains("refit first"), "{error}");
    let next = [9.0f32, 11.0, -12.0, 6.0];
    for e in [&est, &reference] {
        e.observe(view(&next, k), &[2, 1], &[1, 0], NO_PREDICTIONS)
            .unwrap();
    }
    assert_eq!(est.state(), reference.state());
}

#[test]
fn a_taken_scratch_is_replaced_by_a_new_one_with_the_same_bits() {
    let k = 3;
    let steps: Vec<_> = (0..4).map(|seed| workload(seed + 10, 25, k)).collect();
    let expected = reference_state(k, &steps);
    let est = manual_map(k);
    let Rule::Map(rule) = &est.rule else {
        panic!("a map estimator holds the map rule")
    };
    {
        // Another caller's step in progress: observe bins into a scratch of its own.
        let _held = rule.scratch().lock().unwrap();
        for (f, ad, ac) in &steps[..2] {
            est.observe(view(f, k), ad, ac, NO_PREDICTIONS).unwrap();
        }
    }
    for (f, ad, ac) in &steps[2..] {
        est.observe(view(f, k), ad, ac, NO_PREDICTIONS).unwrap();
    }
    assert_eq!(est.state(), expected);
}

#[test]
fn sparse_and_dense_steps_bin_like_one_draft_at_a_time() {
    // Steps from nearly nothing labeled to everything labeled (either side of the point where
    // observe stops locating every feature), as f32 and f64, against histograms built one
    // labeled draft at a time with the scalar rule.
    let k = 8;
    let est = manual_map(k);
    let config = est.config().clone();
    let binning = Binning::new(config.max_log_odds, config.bins);
    let mut rng = crate::test_rng::XorShift::new(41);
    for rows in [1usize, 7, 64, 200] {
        for most in [0u64, 1, 2, 4, 8] {
            let features: Vec<f64> = (0..rows * k)
                .map(|_| (rng.unit_f64() - 0.5) * 100.0)
                .collect();
            let admitted: Vec<i64> = (0..rows)
                .map(|_| (rng.next_u64() % (most + 1)) as i64)
                .collect();
            let accepted: Vec<i64> = admitted
                .iter()
                .map(|&a| (rng.next_u64() % (a as u64 + 1)) as i64)
                .collect();
            let mut expected = crate::estimator::histogram::HistogramStats::new(k, config.bins);
            for row in 0..rows {
                for position in 0..k {
                    let label = crate::estimator::labels::label(
                        position,
                        admitted[row] as usize,
                        accepted[row] as usize,
                    );
                    if let Some(label) = label {
                        let x = features[row * k + position];
                        expected.add_observation(&binning, position, x, label);
                    }
                }
            }
            let got = est
                .step_histogram(view(&features, k), &admitted, &accepted, NO_PREDICTIONS)
                .unwrap();
            assert_eq!(got, expected, "{rows} rows, admitted ≤ {most}");
            let narrow: Vec<f32> = features.iter().map(|&x| x as f32).collect();
            let mut expected32 = crate::estimator::histogram::HistogramStats::new(k, config.bins);
            for row in 0..rows {
                let labeled = admitted[row].min(accepted[row] + 1) as usize;
                for position in 0..labeled {
                    let x = f64::from(narrow[row * k + position]);
                    let label = (position as i64) < accepted[row];
                    expected32.add_observation(&binning, position, x, label);
                }
            }
            let got = est
                .step_histogram(view(&narrow, k), &admitted, &accepted, NO_PREDICTIONS)
                .unwrap();
            assert_eq!(got, expected32, "f32, {rows} rows, admitted ≤ {most}");
            // observe adds the same (into an empty round: the round is the step).
            let fresh = manual_map(k);
            fresh
                .observe(view(&features, k), &admitted, &accepted, NO_PREDICTIONS)
                .unwrap();
            assert_eq!(fresh.state().update.as_map().unwrap().round, expected);
        }
    }
}

#[test]
fn predict_gives_each_position_its_intercept_at_every_k() {
    // Every K (patterns on the stack and, past 64 entries, allocated): each probability is the
    // scalar logistic of its own position's intercept.
    let mut rng = crate::test_rng::XorShift::new(43);
    for k in 1..=EstimatorConfig::MAX_POSITIONS {
        let mut state = AcceptanceEstimator::new(EstimatorConfig::map(k))
            .unwrap()
            .state();
        state.slope = 0.75;
        state.intercepts = (0..k).map(|_| rng.unit_f64() * 6.0 - 3.0).collect();
        let est = AcceptanceEstimator::from_state(&state).unwrap();
        let rows = 5;
        let features: Vec<f32> = (0..rows * k)
            .map(|_| (rng.unit_f64() * 20.0 - 10.0) as f32)
            .collect();
        let mut out = vec![0.0f32; rows * k];
        est.predict(view(&features, k), &mut out).unwrap();
        for (i, (&x, &p)) in features.iter().zip(&out).enumerate() {
            let z = 0.75 * f64::from(x) + state.intercepts[i % k];
            let expected = crate::estimator::logistic::probability(z);
            assert_eq!(p.to_bits(), expected.to_bits(), "K = {k}, flat index {i}");
        }
    }
}
