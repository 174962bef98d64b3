//! Concurrency stress: 8 producers × 10⁶ labeled observations while another thread predicts
//! and a third refits. Totals must equal the serial totals bit for bit, every round must add
//! up, and no prediction may mix two coefficient vectors.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use av_core::estimator::RoundStats;
use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView, Update};

const K: usize = 4;
const ROWS: usize = 500;
const PRODUCERS: usize = 8;

/// One deterministic batch: every row verifies all K drafts and accepts `r % (K + 1)`.
fn batch(seed: u64) -> Batch {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let features = (0..ROWS * K)
        .map(|_| (next() * 16.0 - 6.0) as f32)
        .collect();
    let predictions = (0..ROWS * K)
        .map(|_| (0.05 + 0.9 * next()) as f32)
        .collect();
    let admitted = vec![K as i64; ROWS];
    let accepted = (0..ROWS).map(|r| (r % (K + 1)) as i64).collect();
    (features, predictions, admitted, accepted)
}

type Batch = (Vec<f32>, Vec<f32>, Vec<i64>, Vec<i64>);

/// Producer `t`'s share of the calls: `calls` observes of the batches from `t · calls` on, with
/// `halfway` called before the second half.
fn produce(
    estimator: &AcceptanceEstimator,
    batches: &[Batch],
    (t, calls): (usize, usize),
    halfway: impl Fn(),
) {
    for i in 0..calls {
        if i == calls / 2 {
            halfway();
        }
        let (f, p, ad, ac) = &batches[(t * calls + i) % batches.len()];
        estimator
            .observe(
                MatrixView::new("f", f, ROWS, K).unwrap(),
                ad,
                ac,
                Some(MatrixView::new("p", p, ROWS, K).unwrap()),
            )
            .unwrap();
    }
}

fn merge(total: &mut RoundStats, part: &RoundStats) {
    for (t, p) in total.positions.iter_mut().zip(&part.positions) {
        t.merge(p);
    }
}

#[test]
fn eight_producers_a_predictor_and_a_refitter() {
    // vLLM's update: the test sums the rounds' IRLS moments.
    let mut config = EstimatorConfig::new(K).with_update(Update::Vllm);
    config.refit_interval = Some(u64::MAX); // only the refitter thread ends rounds
    let estimator = AcceptanceEstimator::new(config.clone()).unwrap();
    let batches: Vec<_> = (0..16).map(batch).collect();
    let per_batch: u64 = {
        let (f, p, ad, ac) = &batches[0];
        let s = estimator
            .step_stats(
                MatrixView::new("f", f, ROWS, K).unwrap(),
                ad,
                ac,
                Some(MatrixView::new("p", p, ROWS, K).unwrap()),
            )
            .unwrap();
        s.total_count()
    };
    let calls_per_producer = 1_000_000u64.div_ceil(per_batch) as usize;

    // The serial reference: every call's statistics summed on one thread.
    let mut serial = RoundStats::new(K);
    for call in 0..calls_per_producer * PRODUCERS {
        let (f, p, ad, ac) = &batches[call % batches.len()];
        let s = estimator
            .step_stats(
                MatrixView::new("f", f, ROWS, K).unwrap(),
                ad,
                ac,
                Some(MatrixView::new("p", p, ROWS, K).unwrap()),
            )
            .unwrap();
        merge(&mut serial, &s);
    }

    let done = AtomicBool::new(false);
    // The rounds the refitter has ended: each producer waits halfway until there are two, so
    // refits interleave with the observes however the threads are scheduled (on two cores the
    // producers could otherwise finish before the refitter first runs).
    let rounds = Mutex::new(Vec::new());
    let published = Mutex::new(BTreeMap::new());
    let seen = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|t| {
                let (estimator, batches, rounds) = (&estimator, &batches, &rounds);
                let halfway = move || {
                    while rounds.lock().unwrap().len() < 2 {
                        std::thread::yield_now();
                    }
                };
                scope.spawn(move || produce(estimator, batches, (t, calls_per_producer), halfway))
            })
            .collect();
        scope.spawn(|| {
            while !done.load(Ordering::Acquire) {
                let report = estimator.refit();
                let c = estimator.coefficients();
                published.lock().unwrap().insert(c.version, c);
                rounds
                    .lock()
                    .unwrap()
                    .push(report.update.as_vllm().unwrap().round.clone());
                std::thread::yield_now();
            }
        });
        scope.spawn(|| {
            // Features 0 and 1 per position: outputs σ(β_k) and σ(ω + β_k) of one vector.
            let probe = [[0.0f64; K], [1.0f64; K]].concat();
            let mut out = vec![0.0f32; 2 * K];
            while !done.load(Ordering::Acquire) {
                estimator
                    .predict(MatrixView::new("f", &probe, 2, K).unwrap(), &mut out)
                    .unwrap();
                seen.lock().unwrap().push(out.clone());
            }
        });
        for p in producers {
            p.join().unwrap();
        }
        done.store(true, Ordering::Release);
    });

    // Totals: every round the refitter took, plus the open round, equal the serial sum.
    let mut total = estimator.round_stats();
    let rounds = rounds.into_inner().unwrap();
    for round in &rounds {
        merge(&mut total, round);
    }
    assert_eq!(total, serial);
    assert!(total.total_count() >= PRODUCERS as u64 * 1_000_000);
    assert!(
        rounds.len() > 1,
        "the refitter must have ended rounds during the run"
    );
    for round in &rounds {
        // Every round is a whole number of calls: counts add up per call.
        assert_eq!(round.total_count() % per_batch, 0);
    }

    // No prediction mixes two coefficient vectors: each matches one published (or the initial)
    // vector on every position.
    let mut vectors: Vec<_> = published.into_inner().unwrap().into_values().collect();
    vectors.push(av_core::estimator::Coefficients {
        slope: config.init_slope,
        intercepts: vec![config.init_intercept; K],
        version: 0,
    });
    // The predictor runs for the whole test, so `seen` can hold millions of outputs and the
    // refitter thousands of vectors: look each output up in a set of the vectors' outputs
    // instead of comparing every pair.
    let sigmoid = av_core::estimator::internals::probability;
    let bits = |out: &[f32]| out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let expected: std::collections::HashSet<Vec<u32>> = vectors
        .iter()
        .map(|c| {
            let out: Vec<f32> = (0..K)
                .map(|k| sigmoid(c.intercepts[k]))
                .chain((0..K).map(|k| sigmoid(c.slope + c.intercepts[k])))
                .collect();
            bits(&out)
        })
        .collect();
    let seen = seen.into_inner().unwrap();
    assert!(!seen.is_empty());
    for out in seen {
        assert!(
            expected.contains(&bits(&out)),
            "prediction {out:?} mixes coefficient vectors"
        );
    }
}

/// The `map` update under the same load: 8 producers × 10⁶ labels while a refitter ends rounds
/// (and the producers' own steps fit within them). Every label lands in exactly one round's
/// histograms: the rounds plus the open one equal the serial sum bit for bit, and every round
/// is a whole number of calls.
#[test]
fn eight_producers_and_a_refitter_lose_no_label_under_map() {
    let mut config = EstimatorConfig::map(K);
    config.refit_interval = Some(u64::MAX);
    let estimator = AcceptanceEstimator::new(config).unwrap();
    let batches: Vec<_> = (0..16).map(batch).collect();
    let step = |i: usize| {
        let (f, p, ad, ac) = &batches[i % batches.len()];
        estimator
            .step_histogram(
                MatrixView::new("f", f, ROWS, K).unwrap(),
                ad,
                ac,
                Some(MatrixView::new("p", p, ROWS, K).unwrap()),
            )
            .unwrap()
    };
    let per_batch = step(0).total_count();
    let calls_per_producer = 1_000_000u64.div_ceil(per_batch) as usize;
    let mut serial = av_core::estimator::HistogramStats::new(K, step(0).bins);
    let calls = calls_per_producer * PRODUCERS;
    for i in 0..batches.len() {
        // Calls `i`, `i + len`, `i + 2·len`, … below `calls` use batch `i`.
        let times = (calls + batches.len() - 1 - i) / batches.len();
        let one = step(i);
        for _ in 0..times {
            serial.merge(&one);
        }
    }
    let done = AtomicBool::new(false);
    let rounds = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|t| {
                let (estimator, batches) = (&estimator, &batches);
                scope.spawn(move || produce(estimator, batches, (t, calls_per_producer), || {}))
            })
            .collect();
        scope.spawn(|| {
            while !done.load(Ordering::Acquire) {
                let report = estimator.refit();
                rounds
                    .lock()
                    .unwrap()
                    .push(report.update.as_map().unwrap().round.clone().unwrap());
                std::thread::yield_now();
            }
        });
        for p in producers {
            p.join().unwrap();
        }
        done.store(true, Ordering::Release);
    });
    let mut total = estimator.round_histogram().unwrap();
    let rounds = rounds.into_inner().unwrap();
    for round in &rounds {
        total.merge(round);
        assert_eq!(round.total_count() % per_batch, 0);
    }
    assert_eq!(total, serial);
    assert!(total.total_count() >= PRODUCERS as u64 * 1_000_000);
    assert!(rounds.len() > 1, "the refitter must have ended rounds");
    let state = estimator.state();
    assert!(AcceptanceEstimator::from_state(&state).is_ok());
}
