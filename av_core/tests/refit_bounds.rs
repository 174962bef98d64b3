//! The refit's bounds as properties: no coefficient moves by more than `max_step` in one refit,
//! checked where the range clamps (`0 ≤ ω ≤ max_slope`, `|β| ≤ max_intercept`) cannot hide a
//! missing step cap: the ranges are wide and the coefficients far from their edges.

mod common;

use av_core::estimator::{Bounds, NewtonStep, Update};
use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
use proptest::prelude::*;

proptest! {
    #[test]
    fn no_coefficient_moves_more_than_max_step(
        max_step in 0.01f64..0.9,
        slope in 1.0f64..5.0,
        slope_step in -1e3f64..1e3,
        intercepts in proptest::collection::vec(-5.0f64..5.0, 1..6),
        intercept_steps in proptest::collection::vec(-1e3f64..1e3, 6),
    ) {
        // Ranges far wider than any step here: only the step cap can limit the change.
        let bounds = Bounds { max_step, max_slope: 1e6, max_intercept: 1e6 };
        let k = intercepts.len();
        let step = NewtonStep { slope: slope_step, intercepts: intercept_steps[..k].to_vec() };
        let mut after = intercepts.clone();
        let new_slope = bounds.apply(slope, &mut after, &step);
        prop_assert_eq!(new_slope, slope + slope_step.clamp(-max_step, max_step));
        prop_assert!((new_slope - slope).abs() <= max_step * (1.0 + 1e-12));
        for ((b, a), d) in intercepts.iter().zip(&after).zip(&step.intercepts) {
            prop_assert_eq!(*a, b + d.clamp(-max_step, max_step));
            prop_assert!((a - b).abs() <= max_step * (1.0 + 1e-12));
        }
    }

    #[test]
    fn the_range_never_lets_a_step_exceed_the_cap(
        max_step in 0.01f64..20.0,
        max_slope in 0.5f64..20.0,
        slope_fraction in 0.0f64..=1.0,
        slope_step in -1e6f64..1e6,
    ) {
        // Anywhere in the range, with clamping active or not, |Δω| ≤ max_step and ω stays in it.
        let slope = slope_fraction * max_slope;
        let bounds = Bounds { max_step, max_slope, max_intercept: 15.0 };
        let step = NewtonStep { slope: slope_step, intercepts: vec![] };
        let new_slope = bounds.apply(slope, &mut [], &step);
        prop_assert!((new_slope - slope).abs() <= max_step * (1.0 + 1e-12));
        prop_assert!((0.0..=max_slope).contains(&new_slope));
    }
}

/// An estimator on vLLM's update whose only active limit is the step cap.
fn capped(max_step: f64, init_slope: f64) -> AcceptanceEstimator {
    let mut config = EstimatorConfig::new(2).with_update(Update::Vllm);
    config.refit_interval = Some(u64::MAX);
    config.damping = 0.0;
    config.memory = 0.0;
    config.max_step = max_step;
    config.max_slope = 1e3;
    config.max_intercept = 1e3;
    config.init_slope = init_slope;
    AcceptanceEstimator::new(config).unwrap()
}

/// One round at position 0: of 100 drafts at `x = +x0` the first `hi` are accepted, of 100 at
/// `x = -x0` the first `lo`.
fn observe_round(est: &AcceptanceEstimator, x0: f32, hi: usize, lo: usize) {
    let rows = 200;
    let mut features = Vec::new();
    let mut accepted = Vec::new();
    for r in 0..rows {
        let (x, yes) = if r < 100 {
            (x0, r < hi)
        } else {
            (-x0, r - 100 < lo)
        };
        features.extend([x, 0.0]);
        accepted.push(i64::from(yes));
    }
    let view = MatrixView::new("features", &features, rows, 2).unwrap();
    est.observe(view, &vec![1; rows], &accepted, None::<MatrixView<'_, f32>>)
        .unwrap();
}

#[test]
fn a_refit_moves_the_slope_by_at_most_max_step_upward() {
    let est = capped(0.1, 0.5);
    // 90% accepted at x = 2, 10% at x = -2: the data ask for a much steeper slope.
    observe_round(&est, 2.0, 90, 10);
    let report = est.refit();
    assert!(
        report.step.slope > 0.4,
        "the round asks for a big step: {:?}",
        report.step
    );
    assert_eq!(est.coefficients().slope, 0.5 + 0.1);
}

#[test]
fn a_refit_moves_the_slope_by_at_most_max_step_downward() {
    // From ω = 5, far from 0, so the non-negativity clamp cannot stand in for the cap: 60%
    // accepted at x = 0.3 and 30% at x = -0.3 ask for a much flatter slope.
    let est = capped(0.1, 5.0);
    observe_round(&est, 0.3, 60, 30);
    let report = est.refit();
    assert!(
        report.step.slope < -0.4,
        "the round asks for a big step: {:?}",
        report.step
    );
    assert_eq!(est.coefficients().slope, 5.0 - 0.1);
}

#[test]
fn a_refit_moves_each_intercept_by_at_most_max_step() {
    let est = capped(0.25, 0.5);
    // Every draft rejected at x = 0: the intercept step asks for a large drop.
    let rows = 500;
    let features = vec![0.0f32; rows * 2];
    let view = MatrixView::new("features", &features, rows, 2).unwrap();
    est.observe(
        view,
        &vec![2; rows],
        &vec![0; rows],
        None::<MatrixView<'_, f32>>,
    )
    .unwrap();
    let before = est.coefficients().intercepts;
    let report = est.refit();
    assert!(report.step.intercepts[0] < -1.0, "{:?}", report.step);
    let after = est.coefficients().intercepts;
    assert_eq!(after[0], before[0] - 0.25);
    assert_eq!(after[1], before[1]); // never labeled: no step at all
}

/// The same limits on the `map` update, without a prior (so the fit asks for the data's step).
fn capped_map(max_step: f64, init_slope: f64) -> AcceptanceEstimator {
    let mut config = EstimatorConfig::map(2);
    config.refit_interval = Some(u64::MAX);
    config.max_step = max_step;
    config.max_slope = 1e3;
    config.max_intercept = 1e3;
    config.init_slope = init_slope;
    config.prior_slope_sd = f64::INFINITY;
    config.prior_spread_sd = f64::INFINITY;
    AcceptanceEstimator::new(config).unwrap()
}

#[test]
fn every_map_fit_stays_within_max_step_of_the_last_rounds_end() {
    // The fit within the round (after its first step) and the round's end both start from the
    // reference and are capped around it.
    let est = capped_map(0.1, 0.5);
    observe_round(&est, 2.0, 90, 10);
    assert_eq!(est.coefficients().slope, 0.5 + 0.1);
    assert_eq!(est.num_refits(), 1);
    let report = est.refit();
    assert!(report.step.slope > 0.4, "{:?}", report.step);
    assert_eq!(est.coefficients().slope, 0.5 + 0.1);
    // Downward, far from 0.
    let est = capped_map(0.1, 5.0);
    observe_round(&est, 0.3, 60, 30);
    let report = est.refit();
    assert!(report.step.slope < -0.4, "{:?}", report.step);
    assert_eq!(est.coefficients().slope, 5.0 - 0.1);
    // The intercepts: every draft rejected at x = 0.
    let est = capped_map(0.25, 0.5);
    let rows = 500;
    let features = vec![0.0f32; rows * 2];
    let view = MatrixView::new("features", &features, rows, 2).unwrap();
    let before = est.coefficients().intercepts;
    est.observe(
        view,
        &vec![2; rows],
        &vec![0; rows],
        None::<MatrixView<'_, f32>>,
    )
    .unwrap();
    let report = est.refit();
    assert!(report.step.intercepts[0] < -1.0, "{:?}", report.step);
    let after = est.coefficients().intercepts;
    assert_eq!(after[0], before[0] - 0.25);
    assert_eq!(after[1], before[1]); // never labeled: no step at all
                                     // The next round's fits are capped around the new reference.
    est.observe(
        view,
        &vec![2; rows],
        &vec![0; rows],
        None::<MatrixView<'_, f32>>,
    )
    .unwrap();
    assert_eq!(est.coefficients().intercepts[0], before[0] - 0.5);
}
