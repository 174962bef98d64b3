//! Model-checks the concurrent protocols under every interleaving loom can produce: the
//! lock-free double buffer of the vllm update's accumulator, the map update's locked open
//! round, the coefficients' sequence lock and the refit schedules.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p av_core --release --test loom` (`.ci/run`
//! does, in its own target directory; about a minute to build, under a second to run). Without
//! `--cfg loom` this file is empty.
#![cfg(loom)]

use av_core::estimator::internals::{Accumulator, HistogramAccumulator, SharedCoefficients};
use av_core::estimator::{HistogramStats, PositionSums, RoundStats};
use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView, Update};
use loom::sync::Arc;
use loom::thread;

/// Exhaustive up to two preemptions per execution: the classic bound under which almost all
/// real concurrency bugs show up, and small enough to finish in seconds.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(f);
}

fn one(value: i128) -> RoundStats {
    // One statistic that carries into the high word, the rest zero (fewer atomic operations
    // for the model checker to interleave).
    RoundStats {
        positions: vec![PositionSums {
            a: value,
            n: 1,
            ..PositionSums::default()
        }],
    }
}

fn merge(total: &mut RoundStats, part: &RoundStats) {
    for (t, p) in total.positions.iter_mut().zip(&part.positions) {
        t.merge(p);
    }
}

#[test]
fn every_add_lands_in_exactly_one_round() {
    model(|| {
        let acc = Arc::new(Accumulator::new(1));
        let writer = {
            let acc = Arc::clone(&acc);
            thread::spawn(move || acc.add(&one(-(1 << 70))))
        };
        acc.add(&one(3));
        let mut total = acc.take();
        writer.join().unwrap();
        merge(&mut total, &acc.take());
        let mut expected = one(3);
        merge(&mut expected, &one(-(1 << 70)));
        assert_eq!(total, expected);
    });
}

#[test]
fn readers_never_see_a_mixed_coefficient_vector() {
    model(|| {
        let shared = Arc::new(SharedCoefficients::new(0.0, &[0.0, 0.0], 0));
        let writer = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || shared.write(1.0, &[1.0, 1.0], 1))
        };
        let c = shared.read();
        assert!(c.intercepts.iter().all(|&b| b == c.slope));
        assert_eq!(c.slope, c.version as f64);
        writer.join().unwrap();
    });
}

/// One decode step without verdicts: it counts toward the round like any other (and keeps the
/// statistics out of the model, which is about the schedule).
fn empty_step(estimator: &AcceptanceEstimator) {
    let features = MatrixView::<f32>::new("features", &[], 0, 1).unwrap();
    estimator
        .observe(features, &[], &[], None::<MatrixView<'_, f32>>)
        .unwrap();
}

#[test]
fn contended_observes_keep_the_serial_refit_schedule() {
    // Two threads, two steps each, a round of two: a serial run refits twice and ends with no
    // steps counted. The schedule that skipped a refit when the lock was busy could end with one
    // refit and two steps left over (and then refit at every later step).
    model(|| {
        // vLLM's schedule: one refit per round.
        let mut config = EstimatorConfig::new(1).with_update(Update::Vllm);
        config.refit_interval = Some(2);
        config.memory = 0.0;
        let estimator = Arc::new(AcceptanceEstimator::new(config).unwrap());
        let other = {
            let estimator = Arc::clone(&estimator);
            thread::spawn(move || {
                empty_step(&estimator);
                empty_step(&estimator);
            })
        };
        empty_step(&estimator);
        empty_step(&estimator);
        other.join().unwrap();
        assert_eq!(
            (estimator.num_refits(), estimator.steps_since_refit()),
            (2, 0)
        );
    });
}

/// One histogram bin holding `n` labels, `accepted` of them accepted.
fn bin(n: u64, accepted: u64) -> HistogramStats {
    HistogramStats {
        num_positions: 1,
        bins: 1,
        count: vec![n],
        accepted: vec![accepted],
        x_sum: vec![n * 3],
    }
}

#[test]
fn every_histogram_add_lands_in_exactly_one_drain() {
    // The map update's open round: adds (`try_add`, observe's path: the bound checked and the
    // bins added under the accumulator's lock) racing a drain.
    model(|| {
        let acc = Arc::new(HistogramAccumulator::new(1, 1));
        let writer = {
            let acc = Arc::clone(&acc);
            thread::spawn(move || acc.try_add(&bin(2, 1)).unwrap())
        };
        acc.try_add(&bin(5, 0)).unwrap();
        let mut first = HistogramStats::new(1, 1);
        acc.drain_into(&mut first);
        writer.join().unwrap();
        let mut total = first.clone();
        acc.drain_into(&mut total);
        assert_eq!(total, bin(7, 1));
        // The first drain held whole adds only.
        assert!([bin(5, 0), bin(7, 1)].contains(&first), "{first:?}");
    });
}

#[test]
fn racing_adds_never_pass_the_bin_bound_together() {
    // Two adds that each fit the bound but not together: exactly one lands, whole; the refused
    // one adds nothing. Once the round holding the winner ends, the loser's add fits again.
    use av_core::estimator::MAX_BIN_COUNT;
    model(|| {
        let acc = Arc::new(HistogramAccumulator::new(1, 1));
        acc.try_add(&bin(MAX_BIN_COUNT - 3, 0)).unwrap();
        let other = {
            let acc = Arc::clone(&acc);
            thread::spawn(move || acc.try_add(&bin(2, 2)).is_ok())
        };
        let mine = acc.try_add(&bin(3, 1)).is_ok();
        let theirs = other.join().unwrap();
        assert!(mine ^ theirs, "exactly one add fits: {mine} {theirs}");
        let mut round = HistogramStats::new(1, 1);
        acc.drain_into(&mut round);
        let expect = if mine {
            bin(MAX_BIN_COUNT, 1)
        } else {
            bin(MAX_BIN_COUNT - 1, 2)
        };
        assert_eq!(round.count, expect.count);
        assert_eq!(round.accepted, expect.accepted);
        acc.end_round(&round);
        assert_eq!(acc.try_add(&bin(3, 1)), Ok(()));
    });
}

#[test]
fn contended_observes_keep_the_serial_map_schedule() {
    // map: a round of two is fitted after its first step and at its end, so two threads of two
    // steps each count 4 refits and end with no step counted, like a serial run.
    model(|| {
        let mut config = EstimatorConfig::new(1).with_update(Update::Vllm);
        config.update = Update::Map;
        config.bins = 1;
        config.refit_interval = Some(2);
        let estimator = Arc::new(AcceptanceEstimator::new(config).unwrap());
        let other = {
            let estimator = Arc::clone(&estimator);
            thread::spawn(move || {
                empty_step(&estimator);
                empty_step(&estimator);
            })
        };
        empty_step(&estimator);
        empty_step(&estimator);
        other.join().unwrap();
        assert_eq!(
            (estimator.num_refits(), estimator.steps_since_refit()),
            (4, 0)
        );
    });
}

/// One map step of one request at `x`: its only draft labeled, accepted or not.
fn one_draft(estimator: &AcceptanceEstimator, x: f32, accepted: bool) {
    let features = MatrixView::new("features", std::slice::from_ref(&x), 1, 1).unwrap();
    estimator
        .observe(
            features,
            &[1],
            &[i64::from(accepted)],
            None::<MatrixView<'_, f32>>,
        )
        .unwrap();
}

#[test]
fn racing_map_observes_bin_in_the_kept_scratch_or_their_own() {
    // map observe bins into the scratch the estimator keeps, or into a new one while another
    // caller holds it: under every interleaving both steps land whole, and the kept scratch is
    // left empty (a later step adds exactly its own draft).
    model(|| {
        let mut config = EstimatorConfig::map(1);
        config.bins = 2;
        config.refit_interval = None;
        let estimator = Arc::new(AcceptanceEstimator::new(config).unwrap());
        let other = {
            let estimator = Arc::clone(&estimator);
            thread::spawn(move || one_draft(&estimator, -1.0, true))
        };
        one_draft(&estimator, 1.0, false);
        other.join().unwrap();
        one_draft(&estimator, 2.0, true);
        // Two bins over ±40: x < 0 in bin 0, x ≥ 0 in bin 1.
        let state = estimator.state();
        let round = &state.update.as_map().unwrap().round;
        assert_eq!(
            (round.count.as_slice(), round.accepted.as_slice()),
            (&[1, 2][..], &[1, 1][..])
        );
        // Offsets `(x + 40) · 2^16`: 39 in bin 0, 41 + 42 in bin 1.
        assert_eq!(round.x_sum, [39 << 16, 83 << 16]);
    });
}
