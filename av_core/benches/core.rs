//! Criterion benchmarks of the core's hot paths, without Python: the per-step statistics and
//! the lock-free accumulator (observe), the Cholesky Newton solve (refit), the map update's
//! end-of-round refit on a fresh round, and the planner.
//!
//! `cargo bench -p av_core` (not run in CI; `benches/run.py` holds the Python-side figures).

use av_core::cost_tables::CostTables;
use av_core::estimator::internals::{solve_spd, Accumulator};
use av_core::planner::{plan_verification, StepTokens};
use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use std::hint::black_box;

fn uniform(seed: u64) -> impl FnMut() -> f64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn observe(c: &mut Criterion) {
    let mut group = c.benchmark_group("observe");
    for (rows, k) in [(64usize, 8usize), (256, 8), (1024, 16)] {
        let mut next = uniform(1);
        let x: Vec<f32> = (0..rows * k)
            .map(|_| (next() * 12.0 - 4.0) as f32)
            .collect();
        let p: Vec<f32> = (0..rows * k)
            .map(|_| (0.05 + 0.9 * next()) as f32)
            .collect();
        let admitted = vec![k as i64; rows];
        let accepted: Vec<i64> = (0..rows)
            .map(|_| (next() * (k + 1) as f64) as i64)
            .collect();
        let mut config = EstimatorConfig::new(k);
        config.refit_interval = Some(u64::MAX);
        let est = AcceptanceEstimator::new(config).unwrap();
        let fv = MatrixView::new("features", &x, rows, k).unwrap();
        let pv = MatrixView::new("predictions", &p, rows, k).unwrap();
        group.bench_function(
            BenchmarkId::new("step_stats", format!("R={rows} K={k}")),
            |b| b.iter(|| est.step_stats(fv, &admitted, &accepted, Some(pv)).unwrap()),
        );
        let stats = est.step_stats(fv, &admitted, &accepted, Some(pv)).unwrap();
        let acc = Accumulator::new(k);
        group.bench_function(
            BenchmarkId::new("accumulator_add", format!("R={rows} K={k}")),
            |b| b.iter(|| acc.add(black_box(&stats))),
        );
    }
    group.finish();
}

fn cholesky(c: &mut Criterion) {
    let mut group = c.benchmark_group("cholesky");
    for k in [4usize, 8, 16, 32, 64] {
        let n = k + 1;
        let mut next = uniform(2);
        // An arrowhead X^T W X + lambda I, as the refit builds it.
        let mut matrix = vec![0.0; n * n];
        matrix[0] = 1e-3;
        for i in 1..n {
            let (w, x) = (0.25 * next(), 8.0 * next() - 4.0);
            matrix[0] += 40.0 * w * x * x;
            matrix[i] = 40.0 * w * x;
            matrix[i * n] = 40.0 * w * x;
            matrix[i * n + i] = 40.0 * w + 1e-3;
        }
        let rhs: Vec<f64> = (0..n).map(|_| next() - 0.5).collect();
        group.bench_function(BenchmarkId::from_parameter(format!("K={k}")), |b| {
            b.iter(|| {
                let (mut m, mut r) = (matrix.clone(), rhs.clone());
                assert!(solve_spd(&mut m, &mut r));
                r
            })
        });
    }
    group.finish();
}

/// The map update's end-of-round refit at K = 16, each on a fresh round: one observe of R = 256
/// requests (untimed) drawn from a pool of 16 steps of a logistic pair, then the timed refit
/// (memory decay and the drift test, the fold, the gather and Newton to convergence).
fn map_refit(c: &mut Criterion) {
    let mut group = c.benchmark_group("map_refit");
    for k in [8usize, 16] {
        let rows = 256;
        let mut next = uniform(3);
        let steps: Vec<(Vec<f32>, Vec<i64>)> = (0..16)
            .map(|_| {
                let x: Vec<f32> = (0..rows * k).map(|_| (next() * 7.5 - 3.0) as f32).collect();
                let accepted = (0..rows)
                    .map(|r| {
                        let accepted_at = |j: usize| {
                            let z = 0.55 * x[r * k + j] as f64 - 0.3 - 0.05 * j as f64;
                            1.0 / (1.0 + (-z).exp())
                        };
                        (0..k).take_while(|&j| next() < accepted_at(j)).count() as i64
                    })
                    .collect();
                (x, accepted)
            })
            .collect();
        let admitted = vec![k as i64; rows];
        let mut config = EstimatorConfig::new(k);
        config.refit_interval = Some(u64::MAX);
        let est = AcceptanceEstimator::new(config).unwrap();
        let mut step = 0usize;
        let mut observe_next = || {
            let (x, accepted) = &steps[step % steps.len()];
            step += 1;
            let view = MatrixView::new("features", x, rows, k).unwrap();
            est.add_observations(view, &admitted, accepted, None::<MatrixView<'_, f32>>)
                .unwrap();
        };
        for _ in 0..8 {
            observe_next();
            est.refit();
        }
        group.bench_function(BenchmarkId::from_parameter(format!("K={k}")), |b| {
            b.iter_batched(&mut observe_next, |()| est.refit(), BatchSize::PerIteration)
        });
    }
    group.finish();
}

fn planner(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_verification");
    for (rows, k) in [(64usize, 8usize), (256, 8), (1024, 16)] {
        let mut next = uniform(3);
        let conf: Vec<f64> = (0..rows * k).map(|_| 0.3 + 0.69 * next()).collect();
        let stale: Vec<f64> = (0..rows * k).map(|_| 0.3 + 0.69 * next()).collect();
        let scheduled = vec![k as i64; rows];
        let draft: Vec<f64> = (0..=rows).map(|r| 1.0 + 0.01 * r as f64).collect();
        let verify: Vec<f64> = (0..=rows * (k + 1))
            .map(|t| 5.0 + 0.004 * t as f64)
            .collect();
        let tables = CostTables::new(draft, verify).unwrap();
        let step = StepTokens {
            num_non_draft_tokens: rows,
            num_sampling_requests: rows,
            max_draft_budget: None,
        };
        let cv = MatrixView::new("confidences", &conf, rows, k).unwrap();
        let sv = MatrixView::new("budget_confidences", &stale, rows, k).unwrap();
        let mut admitted = vec![0i32; rows];
        group.bench_function(
            BenchmarkId::from_parameter(format!("R={rows} K={k}")),
            |b| {
                b.iter(|| {
                    plan_verification(cv, Some(sv), &scheduled, &step, &tables, &mut admitted)
                        .unwrap()
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, observe, cholesky, map_refit, planner);
criterion_main!(benches);
