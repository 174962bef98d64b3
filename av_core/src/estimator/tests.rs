use super::accumulator::PositionSums;
use super::accumulator::{RoundStats, MAX_COUNT};
use super::histogram::{Binning, HistogramStats, MAX_BIN_COUNT};
use super::memory::Memory;
// The checks of the estimator's internal systems against independent references (integration
// tests until those systems became private), sharing the integration tests' helpers.
#[path = "../../tests/common/mod.rs"]
mod common;
mod drift_test;
mod hot_paths;
mod memory_model;
mod newton_system;

use super::*;
use crate::error::Result;
use crate::matrix::MatrixView;
use crate::test_rng::XorShift;
use proptest::prelude::*;

/// vLLM's part of `state`, which must be one.
fn vllm(state: &mut EstimatorState) -> &mut VllmState {
    state.update.as_vllm_mut().expect("a vllm state")
}

/// The map update's part of `state`, which must be one.
fn map(state: &mut EstimatorState) -> &mut MapState {
    state.update.as_map_mut().expect("a map state")
}

fn view<T>(data: &[T], cols: usize) -> MatrixView<'_, T> {
    MatrixView::new("features", data, data.len() / cols, cols).unwrap()
}

const NO_PREDICTIONS: Option<MatrixView<'static, f32>> = None;

#[test]
fn cold_start_predicts_the_configured_curve() {
    let est = AcceptanceEstimator::new(EstimatorConfig::new(2).with_update(Update::Vllm)).unwrap();
    let mut out = [0.0f32; 4];
    est.predict(view(&[0.0f32, 2.0, -1.0, 100.0], 2), &mut out)
        .unwrap();
    // σ(0.5·x − 0.2) with the feature clamped to ±40 (σ itself: `logistic`'s tests).
    let expect = |x: f64| super::logistic::probability(0.5 * x - 0.2);
    assert_eq!(out, [expect(0.0), expect(2.0), expect(-1.0), expect(40.0)]);
}

#[test]
fn bad_config_is_rejected() {
    let mut c = EstimatorConfig::new(0).with_update(Update::Vllm);
    assert_eq!(c.validate().unwrap_err().argument, "num_positions");
    c.num_positions = 4;
    c.refit_interval = Some(0);
    assert_eq!(c.validate().unwrap_err().argument, "refit_interval");
    c.refit_interval = Some(1);
    c.damping = -1.0;
    assert_eq!(c.validate().unwrap_err().argument, "damping");
    c.damping = 1.0;
    c.l2 = f64::NAN;
    assert_eq!(c.validate().unwrap_err().argument, "l2");
}

#[test]
fn refits_every_interval() {
    // vLLM's schedule: one refit per round of `refit_interval` observes.
    let mut config = EstimatorConfig::new(3).with_update(Update::Vllm);
    config.refit_interval = Some(3);
    let est = AcceptanceEstimator::new(config).unwrap();
    let features = [1.0f32, 2.0, 3.0];
    let mut refits = vec![];
    for _ in 0..7 {
        refits.push(
            est.observe(view(&features, 3), &[3], &[2], NO_PREDICTIONS)
                .unwrap(),
        );
    }
    assert_eq!(refits, [false, false, true, false, false, true, false]);
    assert_eq!(est.num_refits(), 2);
    assert_eq!(est.steps_since_refit(), 1);
}

#[test]
fn map_fits_after_the_first_second_fourth_step_of_every_round_and_at_its_end() {
    let mut config = EstimatorConfig::map(3);
    config.refit_interval = Some(6);
    let est = AcceptanceEstimator::new(config).unwrap();
    let features = [1.0f32, 2.0, 3.0];
    let mut fits = vec![];
    for _ in 0..14 {
        fits.push(
            est.observe(view(&features, 3), &[3], &[2], NO_PREDICTIONS)
                .unwrap(),
        );
    }
    // Steps 1, 2, 4 of each round, and its end (6); the third round has had 2 steps.
    let round = [true, true, false, true, false, true];
    let expect: Vec<bool> = round.iter().cycle().take(14).copied().collect();
    assert_eq!(fits, expect);
    assert_eq!(est.num_refits(), 4 + 4 + 2);
    assert_eq!(est.steps_since_refit(), 2);
    // A fit within a round starts from the reference, so the coefficients after the round
    // are those of one fit of the round, whatever ran inside it.
    let once = AcceptanceEstimator::new(EstimatorConfig {
        refit_interval: Some(1 << 40),
        ..est.config().clone()
    })
    .unwrap();
    for _ in 0..6 {
        once.observe(view(&features, 3), &[3], &[2], NO_PREDICTIONS)
            .unwrap();
    }
    once.refit();
    let (a, b) = (
        once.coefficients(),
        AcceptanceEstimator::new(est.config().clone()).unwrap(),
    );
    for _ in 0..6 {
        b.observe(view(&features, 3), &[3], &[2], NO_PREDICTIONS)
            .unwrap();
    }
    let b = b.coefficients();
    assert_eq!(a.slope.to_bits(), b.slope.to_bits());
    assert_eq!(a.intercepts, b.intercepts);
}

#[test]
fn rejected_calls_change_nothing() {
    let est = AcceptanceEstimator::new(EstimatorConfig::new(2).with_update(Update::Vllm)).unwrap();
    est.observe(view(&[1.0f64, 2.0], 2), &[2], &[1], NO_PREDICTIONS)
        .unwrap();
    let before = est.state();
    let bad_calls: Vec<Result<bool>> = vec![
        est.observe(view(&[f64::NAN, 2.0], 2), &[2], &[1], NO_PREDICTIONS),
        est.observe(view(&[1.0f64, 2.0], 2), &[1], &[2], NO_PREDICTIONS),
        est.observe(view(&[1.0f64, 2.0], 2), &[3], &[1], NO_PREDICTIONS),
        est.observe(view(&[1.0f64, 2.0], 2), &[-1], &[0], NO_PREDICTIONS),
        est.observe(view(&[1.0f64, 2.0], 2), &[2, 2], &[1, 1], NO_PREDICTIONS),
        est.observe(
            view(&[1.0f64, 2.0], 2),
            &[2],
            &[1],
            Some(view(&[0.5f32, 1.5], 2)),
        ),
        est.observe(view(&[1.0f64, 2.0, 3.0], 3), &[2], &[1], NO_PREDICTIONS),
    ];
    for result in bad_calls {
        assert!(result.is_err());
    }
    assert_eq!(est.state(), before);
}

/// Deterministic pseudo-random observations for the properties below.
fn workload(seed: u64, rows: usize, k: usize) -> (Vec<f32>, Vec<i64>, Vec<i64>) {
    let mut rng = XorShift::new(seed.wrapping_add(0x9E37_79B9_7F4A_7C15));
    let mut next = || rng.next_u64();
    let features = (0..rows * k)
        .map(|_| (next() % 4000) as f32 / 100.0 - 20.0)
        .collect();
    let admitted: Vec<i64> = (0..rows)
        .map(|_| (next() % (k as u64 + 1)) as i64)
        .collect();
    let accepted = admitted
        .iter()
        .map(|&a| (next() % (a as u64 + 1)) as i64)
        .collect();
    (features, admitted, accepted)
}

proptest! {
    #[test]
    fn statistics_do_not_depend_on_row_order_or_split(
        seed in any::<u64>(), rows in 1usize..40, split in 0usize..40, k in 1usize..6,
    ) {
        let (features, admitted, accepted) = workload(seed, rows, k);
        let whole = AcceptanceEstimator::new(EstimatorConfig::new(k).with_update(Update::Vllm)).unwrap();
        whole.observe(view(&features, k), &admitted, &accepted, NO_PREDICTIONS).unwrap();

        // Reversed rows, split into two calls.
        let order: Vec<usize> = (0..rows).rev().collect();
        let f: Vec<f32> = order.iter().flat_map(|&r| features[r * k..(r + 1) * k].to_vec()).collect();
        let ad: Vec<i64> = order.iter().map(|&r| admitted[r]).collect();
        let ac: Vec<i64> = order.iter().map(|&r| accepted[r]).collect();
        let cut = split.min(rows);
        let parts = AcceptanceEstimator::new(EstimatorConfig::new(k).with_update(Update::Vllm)).unwrap();
        parts.observe(view(&f[..cut * k], k), &ad[..cut], &ac[..cut], NO_PREDICTIONS).unwrap();
        parts.observe(view(&f[cut * k..], k), &ad[cut..], &ac[cut..], NO_PREDICTIONS).unwrap();

        prop_assert_eq!(whole.round_stats(), parts.round_stats());
        whole.refit();
        parts.refit();
        let (a, b) = (whole.coefficients(), parts.coefficients());
        prop_assert_eq!(a.slope.to_bits(), b.slope.to_bits());
        for (x, y) in a.intercepts.iter().zip(&b.intercepts) {
            prop_assert_eq!(x.to_bits(), y.to_bits());
        }
    }

    #[test]
    fn state_round_trips(seed in any::<u64>(), rows in 0usize..20, k in 1usize..5) {
        let (features, admitted, accepted) = workload(seed, rows, k);
        let est = AcceptanceEstimator::new(EstimatorConfig::new(k).with_update(Update::Vllm)).unwrap();
        est.observe(view(&features, k), &admitted, &accepted, NO_PREDICTIONS).unwrap();
        est.refit();
        est.observe(view(&features, k), &admitted, &accepted, NO_PREDICTIONS).unwrap();
        let state = est.state();
        let back = AcceptanceEstimator::from_state(&state).unwrap();
        prop_assert_eq!(back.state(), state);
    }
}

#[test]
fn pooled_rounds_give_every_rank_the_bits_of_one_estimator() {
    for update in [Update::Vllm, Update::Map] {
        pooled_rounds_for(update);
    }
}

/// `add_round_stats` pools `vllm` rounds, `add_round_histogram` `map` ones.
fn pooled_rounds_for(update: Update) {
    let k = 3;
    let mut config = EstimatorConfig::new(k).with_update(Update::Vllm);
    config.update = update;
    config.refit_interval = Some(u64::MAX);
    let whole = AcceptanceEstimator::new(config.clone()).unwrap();
    let ranks: Vec<_> = (0..4)
        .map(|_| AcceptanceEstimator::new(config.clone()).unwrap())
        .collect();
    for round in 0..3u64 {
        for step in 0..8u64 {
            let (f, ad, ac) = workload(round * 100 + step, 12, k);
            whole
                .observe(view(&f, k), &ad, &ac, NO_PREDICTIONS)
                .unwrap();
            // Rows dealt round-robin to the ranks, in reverse order on odd ranks.
            for (r, rank) in ranks.iter().enumerate() {
                let mut rows: Vec<usize> = (r..12).step_by(4).collect();
                if r % 2 == 1 {
                    rows.reverse();
                }
                let rf: Vec<f32> = rows
                    .iter()
                    .flat_map(|&i| f[i * k..(i + 1) * k].to_vec())
                    .collect();
                let rad: Vec<i64> = rows.iter().map(|&i| ad[i]).collect();
                let rac: Vec<i64> = rows.iter().map(|&i| ac[i]).collect();
                rank.observe(view(&rf, k), &rad, &rac, NO_PREDICTIONS)
                    .unwrap();
            }
        }
        // Each rank adds the others' rounds (what an all-reduce gives, minus its own).
        let locals: Vec<RoundStats> = ranks.iter().map(|r| r.round_stats()).collect();
        let histograms: Vec<_> = ranks.iter().map(|r| r.round_histogram()).collect();
        for (r, rank) in ranks.iter().enumerate() {
            for o in 0..ranks.len() {
                if o != r {
                    match &histograms[o] {
                        None => rank.add_round_stats(&locals[o]).unwrap(),
                        Some(other) => rank.add_round_histogram(other).unwrap(),
                    }
                }
            }
            assert_eq!(rank.round_stats(), whole.round_stats());
            assert_eq!(rank.round_histogram(), whole.round_histogram());
        }
        whole.refit();
        let expect = whole.coefficients();
        for rank in &ranks {
            rank.refit();
            let got = rank.coefficients();
            assert_eq!(got.slope.to_bits(), expect.slope.to_bits());
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.intercepts), bits(&expect.intercepts));
        }
    }
}

#[test]
fn bad_round_stats_are_refused_and_change_nothing() {
    let est = AcceptanceEstimator::new(EstimatorConfig::new(2).with_update(Update::Vllm)).unwrap();
    est.observe(view(&[1.0f64, 2.0], 2), &[2], &[1], NO_PREDICTIONS)
        .unwrap();
    let before = est.state();
    let err = est.add_round_stats(&RoundStats::new(3)).unwrap_err();
    assert_eq!(err.argument, "round_stats");
    let mut negative = RoundStats::new(2);
    negative.positions[1].c = -1;
    assert!(est.add_round_stats(&negative).is_err());
    assert!(est
        .add_round_histogram(&HistogramStats::new(2, 64))
        .is_err());
    assert_eq!(est.state(), before);
    // The map update pools histograms only, and refuses impossible ones.
    let est = AcceptanceEstimator::new(EstimatorConfig::map(2)).unwrap();
    est.observe(view(&[1.0f64, 2.0], 2), &[2], &[1], NO_PREDICTIONS)
        .unwrap();
    let before = est.state();
    assert_eq!(
        est.add_round_stats(&RoundStats::new(2))
            .unwrap_err()
            .argument,
        "round_stats"
    );
    let mut more_accepted = HistogramStats::new(2, 64);
    more_accepted.accepted[3] = 1;
    let mut wrong_bins = est.round_histogram().unwrap();
    wrong_bins.bins = 32;
    for bad in [more_accepted, wrong_bins, HistogramStats::new(3, 64)] {
        assert_eq!(
            est.add_round_histogram(&bad).unwrap_err().argument,
            "round_stats"
        );
    }
    assert_eq!(est.state(), before);
}

#[test]
fn threads_give_the_serial_bits() {
    // Both rules; the map rule without scheduled fits, whose coefficients depend on which
    // steps the round holds when they run (the open round itself does not).
    let k = 4;
    let batches: Vec<_> = (0..64).map(|s| workload(s, 16, k)).collect();
    let mut map = EstimatorConfig::new(k).with_update(Update::Map);
    map.refit_interval = None;
    for config in [EstimatorConfig::new(k).with_update(Update::Vllm), map] {
        threads_give_the_serial_bits_of(config, &batches);
    }
}

fn threads_give_the_serial_bits_of(
    config: EstimatorConfig,
    batches: &[(Vec<f32>, Vec<i64>, Vec<i64>)],
) {
    let k = config.num_positions;
    let serial = AcceptanceEstimator::new(config.clone()).unwrap();
    for (f, ad, ac) in batches {
        serial.observe(view(f, k), ad, ac, NO_PREDICTIONS).unwrap();
    }
    let parallel = AcceptanceEstimator::new(config).unwrap();
    std::thread::scope(|scope| {
        for chunk in batches.chunks(16) {
            let parallel = &parallel;
            scope.spawn(move || {
                for (f, ad, ac) in chunk.iter().rev() {
                    parallel
                        .observe(view(f, k), ad, ac, NO_PREDICTIONS)
                        .unwrap();
                }
            });
        }
        scope.spawn(|| {
            let mut out = vec![0.0f32; 4 * k];
            for _ in 0..1000 {
                parallel
                    .predict(view(&vec![1.0f64; 4 * k], k), &mut out)
                    .unwrap();
            }
        });
    });
    assert_eq!(serial.state(), parallel.state());
}

/// `threads` threads each observing `per_thread` steps (a few rows each, some empty) at
/// `refit_interval`, while another thread reads the state.
fn contended(
    threads: usize,
    per_thread: usize,
    interval: u64,
    k: usize,
    update: Update,
) -> AcceptanceEstimator {
    let mut config = EstimatorConfig::new(k).with_update(Update::Vllm);
    config.refit_interval = Some(interval);
    config.update = update;
    let estimator = AcceptanceEstimator::new(config).unwrap();
    let batches: Vec<_> = (0..4).map(|s| workload(s, s as usize, k)).collect();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (estimator, batches) = (&estimator, &batches);
            scope.spawn(move || {
                for i in 0..per_thread {
                    let (f, ad, ac) = &batches[(t + i) % batches.len()];
                    estimator
                        .observe(view(f, k), ad, ac, NO_PREDICTIONS)
                        .unwrap();
                }
            });
        }
        scope.spawn(|| {
            for _ in 0..50 {
                let _ = estimator.state();
                std::thread::yield_now();
            }
        });
    });
    estimator
}

#[test]
fn any_number_of_observing_threads_keeps_the_serial_schedule() {
    // vLLM's schedule: a serial run of n observes refits ⌊n / interval⌋ times and leaves
    // n mod interval.
    for threads in [2, 3, 6, 8] {
        for interval in [1, 2, 3, 7, 1000] {
            let per_thread = 400;
            let estimator = contended(threads, per_thread, interval, 2, Update::Vllm);
            let n = (threads * per_thread) as u64;
            assert_eq!(
                (estimator.num_refits(), estimator.steps_since_refit()),
                (n / interval, n % interval),
                "{threads} threads at refit_interval {interval}"
            );
            // And it goes on exactly like a serial run: the next round is complete after
            // the rest of the interval.
            let (f, ad, ac) = workload(9, 1, 2);
            for _ in 0..(interval - n % interval) {
                estimator
                    .observe(view(&f, 2), &ad, &ac, NO_PREDICTIONS)
                    .unwrap();
            }
            assert_eq!(estimator.num_refits(), n / interval + 1);
            assert_eq!(estimator.steps_since_refit(), 0);
        }
    }
}

/// The fits a serial `map` run of `n` observes makes, counted by brute force: the step
/// with count `i` is the `((i − 1) mod interval) + 1`-th of its round, fitted when that is
/// the round's last or a power of two.
fn serial_map_fits(n: u64, interval: u64) -> u64 {
    (1..=n)
        .filter(|i| {
            let place = (i - 1) % interval + 1;
            place == interval || [1, 2, 4, 8, 16, 32, 64, 128, 256, 512].contains(&place)
        })
        .count() as u64
}

#[test]
fn any_number_of_observing_threads_keeps_the_serial_map_schedule() {
    assert_eq!(serial_map_fits(10, 6), 4 + 3); // 1, 2, 4, 6; then 7, 8, 10
    for threads in [2, 3, 8] {
        for interval in [1, 2, 3, 7, 1000] {
            let per_thread = 300;
            let estimator = contended(threads, per_thread, interval, 2, Update::Map);
            let n = (threads * per_thread) as u64;
            assert_eq!(
                (estimator.num_refits(), estimator.steps_since_refit()),
                (serial_map_fits(n, interval), n % interval),
                "{threads} threads at refit_interval {interval}"
            );
            let (f, ad, ac) = workload(9, 1, 2);
            let rest = interval - n % interval;
            for _ in 0..rest {
                estimator
                    .observe(view(&f, 2), &ad, &ac, NO_PREDICTIONS)
                    .unwrap();
            }
            assert_eq!(estimator.num_refits(), serial_map_fits(n + rest, interval));
            assert_eq!(estimator.steps_since_refit(), 0);
        }
    }
}

#[test]
fn a_manual_refit_racing_observers_leaves_a_count_below_the_interval() {
    let mut config = EstimatorConfig::new(3).with_update(Update::Vllm);
    config.refit_interval = Some(3);
    let estimator = AcceptanceEstimator::new(config).unwrap();
    let (f, ad, ac) = workload(4, 2, 3);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..500 {
                    estimator
                        .observe(view(&f, 3), &ad, &ac, NO_PREDICTIONS)
                        .unwrap();
                }
            });
        }
        scope.spawn(|| {
            for _ in 0..100 {
                estimator.refit();
            }
        });
    });
    assert!(estimator.steps_since_refit() < 3);
    let state = estimator.state();
    assert!(AcceptanceEstimator::from_state(&state).is_ok());
}

#[test]
fn add_step_refuses_statistics_no_observation_gives() {
    // add_step takes vLLM's IRLS moments (add_step_histogram is map's).
    let est = AcceptanceEstimator::new(EstimatorConfig::new(2).with_update(Update::Vllm)).unwrap();
    let (f, ad, ac) = workload(1, 5, 2);
    let stats = est
        .step_stats(view(&f, 2), &ad, &ac, NO_PREDICTIONS)
        .unwrap();
    let before = est.state();
    let mut wrong_length = stats.clone();
    wrong_length.positions.pop();
    let mut negative = stats.clone();
    negative.positions[0].c = -5;
    let mut huge = stats.clone();
    huge.positions[1].n = u64::MAX;
    for bad in [wrong_length, negative, huge] {
        assert_eq!(est.add_step(&bad).unwrap_err().argument, "stats");
    }
    assert_eq!(est.state(), before);
    assert!(!est.add_step(&stats).unwrap());
}

#[test]
fn add_step_histogram_refuses_histograms_no_observation_gives() {
    let est = AcceptanceEstimator::new(EstimatorConfig::map(2)).unwrap();
    let (f, ad, ac) = workload(1, 5, 2);
    let step = est
        .step_histogram(view(&f, 2), &ad, &ac, NO_PREDICTIONS)
        .unwrap();
    let before = est.state();
    let mut wrong_length = step.clone();
    wrong_length.count.pop();
    let mut too_many_accepted = step.clone();
    let occupied = step.count.iter().position(|&c| c > 0).unwrap();
    too_many_accepted.accepted[occupied] = step.count[occupied] + 1;
    let mut x_out_of_its_bin = step.clone();
    x_out_of_its_bin.x_sum[occupied] += 1 << 40;
    for bad in [wrong_length, too_many_accepted, x_out_of_its_bin] {
        assert_eq!(est.add_step_histogram(&bad).unwrap_err().argument, "stats");
    }
    assert_eq!(
        est.add_step(&RoundStats::new(2)).unwrap_err().argument,
        "stats"
    );
    assert_eq!(est.state(), before);
    assert!(est.add_step_histogram(&step).unwrap()); // the round's first step is fitted
    assert_eq!(est.round_histogram(), Some(step));
}

/// A valid state after a few refits with memory, for the corruption tests.
fn state_with_memory() -> EstimatorState {
    // vLLM's statistics and quadratic memory (map_state_with_memory is map's).
    let mut config = EstimatorConfig::new(3).with_update(Update::Vllm);
    config.memory = 0.9;
    config.refit_interval = Some(2);
    let est = AcceptanceEstimator::new(config).unwrap();
    for seed in 0..7 {
        let (f, ad, ac) = workload(seed, 12, 3);
        est.observe(view(&f, 3), &ad, &ac, NO_PREDICTIONS).unwrap();
    }
    let state = est.state();
    let vllm = state.update.as_vllm().unwrap();
    assert!(vllm.round.total_count() > 0 && vllm.memory.total > 0.0);
    state
}

/// Every counter a loaded state may carry at its bound keeps the estimator working, and
/// whatever it reaches from there saves and loads again (found by the state_bytes fuzz
/// target: a state with `num_refits = MAX_COUNT` refitted once and could not reload).
#[test]
fn states_at_the_loaders_limits_keep_working_and_reload() {
    let mut state = state_with_memory();
    let k = state.config.num_positions;
    state.num_refits = MAX_COUNT;
    vllm(&mut state).memory.resets = MAX_COUNT;
    for p in &mut vllm(&mut state).round.positions {
        p.n = MAX_COUNT;
    }
    let limit = MAX_COUNT as f64 * k as f64 / (1.0 - state.config.memory);
    let extra = limit - vllm(&mut state).memory.total;
    vllm(&mut state).memory.total += extra;
    vllm(&mut state).memory.counts[0] += extra;
    let est = AcceptanceEstimator::from_state(&state).unwrap();
    // A full round refuses one more observation and changes nothing.
    let (f, ad, ac) = workload(1, 4, k);
    assert!(ad.iter().any(|&a| a > 0));
    let error = est
        .observe(view(&f, k), &ad, &ac, NO_PREDICTIONS)
        .unwrap_err();
    assert_eq!(error.argument, "num_admitted", "{error}");
    assert_eq!(est.state(), state);
    let mut pooled = RoundStats::new(k);
    pooled.positions[0].add_observation(0.5, 0.5, true);
    assert_eq!(
        est.add_round_stats(&pooled).unwrap_err().argument,
        "round_stats"
    );
    assert_eq!(est.add_step(&pooled).unwrap_err().argument, "stats");
    assert_eq!(est.state(), state);
    // The full round folds into a memory at its bound; the counters saturate.
    est.refit();
    assert_eq!(est.num_refits(), MAX_COUNT);
    let reloaded = AcceptanceEstimator::from_bytes(&est.to_bytes()).unwrap();
    for _ in 0..3 {
        reloaded
            .observe(view(&f, k), &ad, &ac, NO_PREDICTIONS)
            .unwrap();
        reloaded.refit();
    }
    assert_eq!(reloaded.num_refits(), MAX_COUNT);
    let again = AcceptanceEstimator::from_bytes(&reloaded.to_bytes()).unwrap();
    assert_eq!(again.state(), reloaded.state());
}

/// A step count at its bound (manual refits, or an interval above the bound, never take it
/// down) stays there: the estimator keeps observing, and what it reaches saves and loads again
/// (found by review: one observe past 2^56 steps wrote a state its own loader refused).
#[test]
fn a_step_count_at_its_bound_saturates_and_reloads() {
    let cases = [
        (EstimatorConfig::new(3).with_update(Update::Vllm), None),
        (EstimatorConfig::map(3), None),
        (
            EstimatorConfig::new(3).with_update(Update::Vllm),
            Some(MAX_COUNT + 5),
        ),
        (EstimatorConfig::map(3), Some(u64::MAX)),
    ];
    for (mut config, interval) in cases {
        config.refit_interval = interval;
        let case = format!("{:?} {interval:?}", config.update);
        let mut state = AcceptanceEstimator::new(config).unwrap().state();
        state.steps_since_refit = MAX_COUNT;
        let est = AcceptanceEstimator::from_state(&state).unwrap();
        let (f, ad, ac) = workload(2, 6, 3);
        for _ in 0..3 {
            est.observe(view(&f, 3), &ad, &ac, NO_PREDICTIONS).unwrap();
        }
        // Counted (the round holds the observations), saturated, and no fit ran on its own.
        assert_eq!(est.steps_since_refit(), MAX_COUNT, "{case}");
        assert_eq!(est.num_refits(), 0, "{case}");
        assert!(est.round_counts().iter().sum::<u64>() > 0, "{case}");
        let again = AcceptanceEstimator::from_bytes(&est.to_bytes()).unwrap();
        assert_eq!(again.state(), est.state(), "{case}");
        est.refit();
        assert_eq!(
            (est.steps_since_refit(), est.num_refits()),
            (0, 1),
            "{case}"
        );
    }
}

#[test]
fn impossible_states_are_refused_by_name() {
    let valid = state_with_memory();
    assert!(AcceptanceEstimator::from_state(&valid).is_ok());
    type Corruption = fn(&mut EstimatorState);
    let cases: [(&str, Corruption); 15] = [
        ("round_stats", |s| vllm(s).round.positions[0].n = u64::MAX),
        ("round_stats", |s| {
            vllm(s).round.positions[0].n = MAX_COUNT + 1
        }),
        ("round_stats", |s| {
            vllm(s).round.positions[0].c = -vllm(s).round.positions[0].c - 1
        }),
        ("round_stats", |s| vllm(s).round.positions[0].a = -1),
        ("round_stats", |s| {
            let p = &mut vllm(s).round.positions[0];
            p.b = ((p.a as f64 * p.c as f64).sqrt() * 1.01) as i128 + p.n as i128 + 10;
        }),
        ("round_stats", |s| {
            let p = &mut vllm(s).round.positions[2];
            *p = PositionSums {
                g1: 1,
                ..PositionSums::default()
            };
        }),
        ("round_stats", |s| vllm(s).round.positions[1].g1 = i128::MAX),
        ("steps_since_refit", |s| {
            s.steps_since_refit = s.config.refit_interval.unwrap()
        }),
        ("num_refits", |s| s.num_refits = u64::MAX),
        ("steps_since_refit", |s| {
            s.config.refit_interval = Some(u64::MAX);
            s.steps_since_refit = u64::MAX - 1;
        }),
        ("memory", |s| vllm(s).memory.c[1] = -1.0),
        ("memory", |s| vllm(s).memory.counts[0] = -2.0),
        ("memory", |s| {
            vllm(s).memory.b[0] = (vllm(s).memory.a * vllm(s).memory.c[0]).sqrt() * 4.0
        }),
        ("memory", |s| vllm(s).memory.resets = s.num_refits + 1),
        ("memory", |s| vllm(s).memory.total *= 3.0),
    ];
    for (argument, corrupt) in cases {
        let mut state = valid.clone();
        corrupt(&mut state);
        let error = AcceptanceEstimator::from_state(&state).unwrap_err();
        assert_eq!(error.argument, argument, "{error}");
        // The same bytes are refused by `from_bytes` (and so by the C ABI's load).
        let bytes = crate::persist::estimator::encode(&state);
        assert_eq!(
            AcceptanceEstimator::from_bytes(&bytes)
                .unwrap_err()
                .argument,
            argument
        );
    }
    // A memoryless estimator keeps an empty memory.
    let mut state = valid.clone();
    state.config.memory = 0.0;
    assert_eq!(
        AcceptanceEstimator::from_state(&state)
            .unwrap_err()
            .argument,
        "memory"
    );
    vllm(&mut state).memory = Memory::new(3);
    assert!(AcceptanceEstimator::from_state(&state).is_ok());
}

/// A valid `map` state after a few rounds, with an open round and a drift reset.
fn map_state_with_memory() -> EstimatorState {
    let mut config = EstimatorConfig::map(3);
    config.refit_interval = Some(2);
    let est = AcceptanceEstimator::new(config).unwrap();
    for seed in 0..7 {
        let (f, ad, ac) = workload(seed, 12, 3);
        est.observe(view(&f, 3), &ad, &ac, NO_PREDICTIONS).unwrap();
    }
    let state = est.state();
    let map = state.update.as_map().unwrap();
    assert!(map.round.total_count() > 0 && !map.memory.is_empty());
    state
}

/// The `map` counterpart of `states_at_the_loaders_limits_keep_working_and_reload`: a
/// restored map state whose every bin sits at [`MAX_BIN_COUNT`], whose memory sits at its
/// geometric bound and whose counters sit at [`MAX_COUNT`] refuses what would pass the
/// bound (by name, nothing changed), refits, and whatever it reaches saves and loads again
/// (with the drift test on, which drops the memory, and off, which keeps it at its bound).
#[test]
fn map_states_at_the_loaders_limits_keep_working_and_reload() {
    for drift_z in [EstimatorConfig::DEFAULT_DRIFT_Z, f64::INFINITY] {
        let mut state = map_state_with_memory();
        state.config.drift_z = drift_z;
        let (k, bins) = (state.config.num_positions, state.config.bins);
        let (limit, gamma) = (state.config.max_log_odds, state.config.memory);
        let binning = Binning::new(limit, bins);
        let scale = (1u64 << super::histogram::X_FRACTION_BITS) as f64;
        state.num_refits = MAX_COUNT;
        let map = map(&mut state);
        map.memory.resets = MAX_COUNT;
        for index in 0..k * bins {
            let (lo, hi) = binning.offset_range(index % bins);
            let n = MAX_BIN_COUNT;
            map.round.count[index] = n;
            map.round.accepted[index] = n / 2;
            map.round.x_sum[index] = (n as f64 * (lo + hi) / 2.0 * scale) as u64;
        }
        let bound = MAX_COUNT as f64 * k as f64 / (1.0 - gamma);
        let extra = bound - map.memory.count.iter().sum::<f64>();
        let (lo, hi) = binning.offset_range(0);
        map.memory.count[0] += extra;
        map.memory.x_sum[0] = map.memory.count[0] * ((lo + hi) / 2.0 - limit);
        let est = AcceptanceEstimator::from_state(&state).unwrap();
        assert_eq!(est.state(), state);
        // A full round refuses one more label and changes nothing.
        let (f, ad, ac) = workload(1, 4, k);
        assert!(ad.iter().any(|&a| a > 0));
        let error = est
            .observe(view(&f, k), &ad, &ac, NO_PREDICTIONS)
            .unwrap_err();
        assert_eq!(error.argument, "num_admitted", "{error}");
        assert!(error.message.contains("refit first"), "{error}");
        let error = est
            .add_observations(view(&f, k), &ad, &ac, NO_PREDICTIONS)
            .unwrap_err();
        assert_eq!(error.argument, "num_admitted", "{error}");
        let step = est
            .step_histogram(view(&f, k), &ad, &ac, NO_PREDICTIONS)
            .unwrap();
        assert_eq!(
            est.add_round_histogram(&step).unwrap_err().argument,
            "round_stats"
        );
        assert_eq!(est.add_step_histogram(&step).unwrap_err().argument, "stats");
        assert_eq!(est.state(), state);
        // The full round folds into the memory (at its bound when the test keeps it); the
        // counters saturate; the state saves and loads again.
        est.refit();
        assert_eq!(est.num_refits(), MAX_COUNT);
        let after = est.state();
        let kept: f64 = after.update.as_map().unwrap().memory.count.iter().sum();
        assert!(kept <= bound * (1.0 + 1e-9), "{kept} > {bound}");
        if drift_z.is_infinite() {
            // γ·bound + the round: the memory was kept, discounted.
            assert!(kept > gamma * bound, "{kept} (the memory was dropped)");
        }
        let reloaded = AcceptanceEstimator::from_bytes(&est.to_bytes()).unwrap();
        assert_eq!(reloaded.state(), after);
        // The reservation of the ended round is gone: observes are accepted again.
        for _ in 0..3 {
            reloaded
                .observe(view(&f, k), &ad, &ac, NO_PREDICTIONS)
                .unwrap();
            reloaded.refit();
        }
        assert_eq!(reloaded.num_refits(), MAX_COUNT);
        let again = AcceptanceEstimator::from_bytes(&reloaded.to_bytes()).unwrap();
        assert_eq!(again.state(), reloaded.state());
        assert!(est.observe(view(&f, k), &ad, &ac, NO_PREDICTIONS).is_ok());
    }
}

#[test]
fn impossible_map_states_are_refused_by_name() {
    let valid = map_state_with_memory();
    assert!(AcceptanceEstimator::from_state(&valid).is_ok());
    fn occupied(s: &EstimatorState) -> usize {
        let round = &s.update.as_map().unwrap().round;
        round.count.iter().position(|&c| c > 0).unwrap()
    }
    type Corruption = fn(&mut EstimatorState);
    let cases: [(&str, Corruption); 13] = [
        ("update", |s| {
            let (config, slope) = (s.config.clone(), s.slope);
            s.update = UpdateState::fresh(Update::Vllm, &config, slope, &s.intercepts);
        }),
        ("update", |s| s.config.update = Update::Vllm),
        ("round_stats", |s| {
            let i = occupied(s);
            let m = map(s);
            m.round.accepted[i] = m.round.count[i] + 1;
        }),
        ("round_stats", |s| {
            let i = occupied(s);
            map(s).round.x_sum[i] += 1 << 36;
        }),
        ("round_stats", |s| {
            map(s).round.count.pop();
        }),
        ("memory", |s| map(s).memory.count[0] = -1.0),
        ("memory", |s| map(s).memory.x_sum[5] = f64::NAN),
        ("memory", |s| {
            let m = &mut map(s).memory;
            let i = m.count.iter().position(|&c| c > 0.0).unwrap();
            m.accepted[i] = m.count[i] * 2.0;
        }),
        ("memory", |s| map(s).memory.resets = s.num_refits + 1),
        ("fitted_labels", |s| {
            let m = map(s);
            m.fitted_labels = m.round.total_count() + 1;
        }),
        ("reference", |s| {
            map(s).reference.slope = -0.5;
        }),
        ("reference", |s| {
            map(s).reference.intercepts.push(0.0);
        }),
        ("bins", |s| s.config.bins = 0),
    ];
    for (argument, corrupt) in cases {
        let mut state = valid.clone();
        corrupt(&mut state);
        let error = AcceptanceEstimator::from_state(&state).unwrap_err();
        assert_eq!(error.argument, argument, "{error}");
        let bytes = crate::persist::estimator::encode(&state);
        let from_bytes = AcceptanceEstimator::from_bytes(&bytes).unwrap_err();
        // The bytes hold the update's part in the shape its configuration names: the other
        // update's part is no such shape, refused as saved data.
        let argument = if argument == "update" {
            "data"
        } else {
            argument
        };
        assert_eq!(from_bytes.argument, argument, "{from_bytes}");
    }
}

/// Random observations at the edges the bounds are about: features at and beyond the clamp,
/// tiny features (the fixed-point rounding of `w x²` then dominates), predictions at 0, 1/2
/// and 1.
fn edge_batch(seed: u64, rows: usize, k: usize) -> (Vec<f64>, Vec<i64>, Vec<i64>, Vec<f32>) {
    let mut rng = XorShift::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
    let specials = [0.0, 1e-9, -1e-7, 3e-6, 40.0, -40.0, 1e6, -1e6, 39.999, 0.5];
    let features = (0..rows * k)
        .map(|_| {
            let r = rng.next_u64();
            if r % 3 == 0 {
                specials[(r >> 8) as usize % specials.len()]
            } else {
                rng.unit_f64() * 100.0 - 50.0
            }
        })
        .collect();
    let predictions = (0..rows * k)
        .map(|_| match rng.next_u64() % 5 {
            0 => 0.0,
            1 => 1.0,
            2 => 0.5,
            _ => rng.unit_f64() as f32,
        })
        .collect();
    let admitted: Vec<i64> = (0..rows)
        .map(|_| (rng.next_u64() % (k as u64 + 1)) as i64)
        .collect();
    let accepted = admitted
        .iter()
        .map(|&a| (rng.next_u64() % (a as u64 + 1)) as i64)
        .collect();
    (features, admitted, accepted, predictions)
}

proptest! {
    #[test]
    fn every_state_observations_produce_is_accepted(
        seed in any::<u64>(),
        k in 1usize..6,
        steps in 1usize..12,
        rows in 0usize..40,
        memory in prop::sample::select(vec![0.0, 0.5, 0.95]),
        l2 in prop::sample::select(vec![0.0, 1e-3]),
        interval in 1u64..5,
        given in any::<bool>(),
    ) {
        let mut config = EstimatorConfig::new(k).with_update(Update::Vllm);
        config.memory = memory;
        config.l2 = l2;
        config.refit_interval = Some(interval);
        let est = AcceptanceEstimator::new(config).unwrap();
        for step in 0..steps {
            let (f, ad, ac, p) = edge_batch(seed ^ step as u64, rows, k);
            let predictions = given.then(|| view(&p, k));
            est.observe(view(&f, k), &ad, &ac, predictions).unwrap();
            let state = est.state();
            let back = AcceptanceEstimator::from_state(&state);
            prop_assert!(back.is_ok(), "{:?}", back.err());
            prop_assert!(AcceptanceEstimator::from_bytes(&est.to_bytes()).is_ok());
        }
    }

    #[test]
    fn arbitrary_statistics_are_refused_or_observe_stays_exact(
        a in prop_oneof![any::<i128>(), -(1i128 << 50)..(1i128 << 50)],
        b in prop_oneof![any::<i128>(), -(1i128 << 50)..(1i128 << 50)],
        c in prop_oneof![any::<i128>(), -(1i128 << 40)..(1i128 << 50)],
        g0 in prop_oneof![any::<i128>(), -(1i128 << 50)..(1i128 << 50)],
        g1 in prop_oneof![any::<i128>(), -(1i128 << 40)..(1i128 << 40)],
        n in prop_oneof![any::<u64>(), 0u64..100_000, Just(MAX_COUNT), Just(u64::MAX)],
    ) {
        let mut state = AcceptanceEstimator::new(EstimatorConfig::new(1).with_update(Update::Vllm)).unwrap().state();
        vllm(&mut state).round.positions[0] = PositionSums { a, b, c, g0, g1, n };
        if let Ok(est) = AcceptanceEstimator::from_state(&state) {
            // Accepted: the next observe adds without wrapping, or (a full round) is
            // refused and changes nothing, so what the estimator holds always reloads.
            let before = est.round_stats().positions[0];
            let result = est.observe(view(&[1.0f32], 1), &[1], &[1], NO_PREDICTIONS);
            let after = est.round_stats().positions[0];
            if before.n < MAX_COUNT {
                prop_assert!(result.is_ok());
                prop_assert_eq!(after.n, before.n + 1);
                prop_assert!(after.c >= before.c);
            } else {
                prop_assert_eq!(result.unwrap_err().argument, "num_admitted");
                prop_assert_eq!(after, before);
            }
            prop_assert!(AcceptanceEstimator::from_bytes(&est.to_bytes()).is_ok());
        }
    }
}
