//! The refit's Newton system against an independent dense solve.
//!
//! The estimator solves an arrowhead system `[[a, bᵀ], [b, diag(c)]] Δ = g` by Cholesky and
//! then damps and conditions the intercept steps on the damped slope step. Here the same round
//! is rebuilt from the raw observations as the dense `XᵀWX + λI` of the design rows
//! `[x, e_k]` (every entry, the slope/intercept couplings included, from its definition) and
//! solved by Gaussian elimination with pivoting; the damping is applied from the formula in
//! `refit.rs`'s module docs. A wrong sign or entry anywhere in the system, the conditioning or
//! the damping moves the estimator's coefficients away from this reference.

use super::common::{dense_solve, Rng};
use crate::estimator::accumulator::RoundStats;
use crate::estimator::refit::ArrowheadSystem;
use crate::estimator::Update;
use crate::{AcceptanceEstimator, EstimatorConfig, MatrixView};

/// One round of observations: features, draft-time predictions and verdicts.
struct Round {
    k: usize,
    features: Vec<f32>,
    predictions: Vec<f32>,
    admitted: Vec<i64>,
    accepted: Vec<i64>,
}

fn round(seed: u64, rows: usize, k: usize) -> Round {
    let mut rng = Rng::new(seed);
    let features = (0..rows * k)
        .map(|_| rng.uniform(-6.0, 8.0) as f32)
        .collect();
    let predictions = (0..rows * k)
        .map(|_| rng.uniform(0.05, 0.95) as f32)
        .collect();
    let admitted: Vec<i64> = (0..rows).map(|_| rng.below(k as u64 + 1) as i64).collect();
    // Acceptance more likely for confident drafts, so the slope has something to learn.
    let accepted = admitted
        .iter()
        .map(|&a| (rng.below(a as u64 + 1) as i64).max(if rng.unit() < 0.5 { a } else { 0 }))
        .collect();
    Round {
        k,
        features,
        predictions,
        admitted,
        accepted,
    }
}

/// The labeled observations `(position, x, p, y)` by the documented rule: positions before the
/// accepted count are accepted, the first one after them (if it was verified) is rejected.
fn labeled(r: &Round) -> Vec<(usize, f64, f64, f64)> {
    let mut out = Vec::new();
    for row in 0..r.admitted.len() {
        let (admitted, accepted) = (r.admitted[row] as usize, r.accepted[row] as usize);
        for pos in 0..r.k {
            let y = if pos < accepted {
                1.0
            } else if pos == accepted && accepted < admitted {
                0.0
            } else {
                continue;
            };
            let i = row * r.k + pos;
            let x = f64::from(r.features[i]).clamp(-40.0, 40.0);
            out.push((pos, x, f64::from(r.predictions[i]), y));
        }
    }
    out
}

/// The reference step: dense Newton solve, then damping `d` (slope by `N/(N+D)`, each
/// intercept conditioned on the damped slope step and damped by `n_k/(n_k+D)`).
fn reference_step(r: &Round, l2: f64, d: f64) -> (f64, Vec<f64>) {
    let k = r.k;
    let n = k + 1;
    let mut h = vec![0.0; n * n];
    let mut g = vec![0.0; n];
    let (mut counts, mut b, mut c, mut g1) =
        (vec![0.0; k], vec![0.0; k], vec![0.0; k], vec![0.0; k]);
    for (pos, x, p, y) in labeled(r) {
        let w = p * (1.0 - p);
        let residual = y - p;
        let mut row = vec![0.0; n];
        row[0] = x;
        row[pos + 1] = 1.0;
        for i in 0..n {
            g[i] += residual * row[i];
            for j in 0..n {
                h[i * n + j] += w * row[i] * row[j];
            }
        }
        counts[pos] += 1.0;
        b[pos] += w * x;
        c[pos] += w;
        g1[pos] += residual;
    }
    for i in 0..n {
        h[i * n + i] += l2;
    }
    let full = dense_solve(h, g);
    let total: f64 = counts.iter().sum();
    let slope_step = full[0] * total / (total + d);
    let intercepts = (0..k)
        .map(|pos| {
            if counts[pos] == 0.0 {
                return 0.0;
            }
            (g1[pos] - b[pos] * slope_step) / (c[pos] + l2) * counts[pos] / (counts[pos] + d)
        })
        .collect();
    (slope_step, intercepts)
}

fn config(k: usize, damping: f64) -> EstimatorConfig {
    // vLLM's update: these tests pin its damped Newton step.
    let mut config = EstimatorConfig::new(k).with_update(Update::Vllm);
    config.refit_interval = Some(u64::MAX);
    config.damping = damping;
    config.memory = 0.0;
    config.max_step = f64::INFINITY;
    config.max_slope = f64::INFINITY;
    config.max_intercept = f64::INFINITY;
    config
}

/// The estimator's coefficient change after observing `r` and refitting.
fn estimator_step(r: &Round, config: EstimatorConfig) -> (f64, Vec<f64>) {
    let k = r.k;
    let est = AcceptanceEstimator::new(config).unwrap();
    let before = est.coefficients();
    let rows = r.admitted.len();
    let features = MatrixView::new("features", &r.features, rows, k).unwrap();
    let predictions = MatrixView::new("predictions", &r.predictions, rows, k).unwrap();
    est.observe(features, &r.admitted, &r.accepted, Some(predictions))
        .unwrap();
    est.refit();
    let after = est.coefficients();
    let steps = after
        .intercepts
        .iter()
        .zip(&before.intercepts)
        .map(|(a, b)| a - b)
        .collect();
    (after.slope - before.slope, steps)
}

fn assert_close(what: &str, got: f64, want: f64) {
    let tolerance = 1e-7 * want.abs().max(1.0);
    assert!(
        (got - want).abs() <= tolerance,
        "{what}: estimator {got} vs dense reference {want}"
    );
}

#[test]
fn the_undamped_refit_is_the_dense_newton_step() {
    let mut checked = 0;
    for seed in 0..40u64 {
        let k = 1 + (seed as usize % 8);
        let r = round(seed, 96, k);
        let (want_slope, want) = reference_step(&r, 1e-3, 0.0);
        if 0.5 + want_slope < 0.0 {
            continue; // the non-negative-slope guard applies; not what this test checks
        }
        let (slope, got) = estimator_step(&r, config(k, 0.0));
        assert_close(&format!("seed {seed} K={k} slope step"), slope, want_slope);
        for (pos, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("seed {seed} K={k} intercept {pos} step"), *g, *w);
        }
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} rounds checked");
}

#[test]
fn the_damped_refit_follows_the_documented_damping() {
    for damping in [50.0, 7.5] {
        for seed in 100..130u64 {
            let k = 1 + (seed as usize % 6);
            let r = round(seed, 40, k);
            let (want_slope, want) = reference_step(&r, 1e-3, damping);
            if 0.5 + want_slope < 0.0 {
                continue;
            }
            let (slope, got) = estimator_step(&r, config(k, damping));
            assert_close(
                &format!("D={damping} seed {seed} slope step"),
                slope,
                want_slope,
            );
            for (pos, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_close(&format!("D={damping} seed {seed} intercept {pos}"), *g, *w);
            }
        }
    }
}

#[test]
fn the_arrowhead_solve_is_the_dense_solve_for_any_coupling_sign() {
    // Random SPD arrowheads with couplings of both signs, solved by the estimator's Cholesky
    // path and by dense elimination.
    let mut rng = Rng::new(7);
    for trial in 0..200 {
        let k = 1 + (trial % 12);
        let c: Vec<f64> = (0..k).map(|_| rng.uniform(0.5, 5.0)).collect();
        let b: Vec<f64> = (0..k).map(|_| rng.uniform(-2.0, 2.0)).collect();
        // a > Σ b²/c keeps the matrix positive definite.
        let schur: f64 = b.iter().zip(&c).map(|(b, c)| b * b / c).sum();
        let a = schur + rng.uniform(0.1, 3.0);
        let g0 = rng.uniform(-3.0, 3.0);
        let g1: Vec<f64> = (0..k).map(|_| rng.uniform(-3.0, 3.0)).collect();
        let system = ArrowheadSystem {
            a,
            b: b.clone(),
            c: c.clone(),
            g0,
            g1: g1.clone(),
            total: 100.0,
            counts: vec![10.0; k],
        };
        let n = k + 1;
        let mut dense = vec![0.0; n * n];
        dense[0] = a;
        for i in 0..k {
            dense[i + 1] = b[i];
            dense[(i + 1) * n] = b[i];
            dense[(i + 1) * n + i + 1] = c[i];
        }
        let want = dense_solve(dense, std::iter::once(g0).chain(g1).collect());
        let got = system.full_step().expect("positive definite");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("trial {trial} K={k} unknown {i}"), *g, *w);
        }
        // Undamped, the conditioned intercept steps are the full solution's intercepts.
        let step = system.damped_step(1e9, 0.0);
        assert_close(&format!("trial {trial} slope"), step.slope, want[0]);
        for (i, s) in step.intercepts.iter().enumerate() {
            assert_close(&format!("trial {trial} intercept {i}"), *s, want[i + 1]);
        }
    }
}

#[test]
fn default_damping_moves_a_round_of_d_observations_half_a_newton_step() {
    // `EstimatorConfig::damping` is documented as "a round with D observations moves a
    // coefficient half of a full Newton step", with D = vLLM's DAMPING_OBSERVATIONS = 50.
    // 50 observations at x = 0 with p = 0.5 (30 accepted): the slope learns nothing, and the
    // intercept must move by exactly half of g1 / (c + λ).
    const VLLM_DAMPING_OBSERVATIONS: usize = 50;
    let config = EstimatorConfig::new(1).with_update(Update::Vllm);
    let l2 = config.l2;
    let est = AcceptanceEstimator::new(config).unwrap();
    let before = est.coefficients().intercepts[0];
    let n = VLLM_DAMPING_OBSERVATIONS;
    let features = vec![0.0f32; n];
    let predictions = vec![0.5f32; n];
    let accepted: Vec<i64> = (0..n).map(|i| i64::from(i < 30)).collect();
    est.observe(
        MatrixView::new("features", &features, n, 1).unwrap(),
        &vec![1; n],
        &accepted,
        Some(MatrixView::new("predictions", &predictions, n, 1).unwrap()),
    )
    .unwrap();
    let mut reference = RoundStats::new(1);
    for &a in &accepted {
        reference.positions[0].add_observation(0.0, 0.5, a == 1);
    }
    let report = est.refit();
    assert_eq!(report.update.as_vllm().unwrap().round, reference);
    let g1 = 30.0 * 0.5 - 20.0 * 0.5;
    let c = n as f64 * 0.25;
    let full = g1 / (c + l2);
    let moved = est.coefficients().intercepts[0] - before;
    assert!(
        (moved - full / 2.0).abs() < 1e-12,
        "moved {moved}, half a Newton step is {}",
        full / 2.0
    );
    assert_eq!(
        est.coefficients().slope,
        EstimatorConfig::DEFAULT_INIT_SLOPE
    );
    // The step cap did not bind (this checks the damping, not the bounds).
    assert!(full / 2.0 < EstimatorConfig::DEFAULT_MAX_STEP);
}
