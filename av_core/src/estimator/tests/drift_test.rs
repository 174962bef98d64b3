//! The drift test's null distribution, by simulation.
//!
//! Under a stationary workload a round's score statistic `T = gᵀ(H + λI)⁻¹g`, taken at the
//! coefficients the round was collected under, is approximately χ² with `K + 1` degrees of
//! freedom (one slope and `K` intercepts). So the memory must be dropped in a fraction
//! `P(Z > drift_z)` of stationary rounds — the test's nominal false-alarm rate. Thresholds
//! with the wrong number of degrees of freedom (K instead of K + 1, say) miss that rate by a
//! wide margin at the levels checked here.

use super::common::{sigmoid, Rng};
use crate::estimator::accumulator::RoundStats;
use crate::estimator::memory::{drift_statistic, Memory};
use crate::estimator::refit::ArrowheadSystem;

/// One stationary round: `per_position` labels at each of `k` positions, drawn from the model
/// `σ(ω x + β_k)` the round is tested at.
fn null_round(rng: &mut Rng, slope: f64, intercepts: &[f64], per_position: usize) -> RoundStats {
    let mut stats = RoundStats::new(intercepts.len());
    for (k, &beta) in intercepts.iter().enumerate() {
        for _ in 0..per_position {
            let x = rng.uniform(-3.0, 5.0);
            let p = sigmoid(slope * x + beta);
            let y = rng.unit() < p;
            stats.positions[k].add_observation(x, p, y);
        }
    }
    stats
}

/// Standard normal upper tail `P(Z > z)` (Abramowitz–Stegun 26.2.17, |error| < 7.5e-8).
fn normal_tail(z: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.231_641_9 * z);
    let poly = t
        * (0.319_381_530
            + t * (-0.356_563_782
                + t * (1.781_477_937 + t * (-1.821_255_978 + t * 1.330_274_429))));
    (-z * z / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt() * poly
}

const ROUNDS: usize = 3000;

/// The fraction of `ROUNDS` stationary rounds in which `Memory::fold` drops the memory.
fn false_alarm_rate(k: usize, z: f64, seed: u64) -> f64 {
    let mut rng = Rng::new(seed);
    let slope = 0.55;
    let intercepts: Vec<f64> = (0..k).map(|i| 1.2 - 0.4 * i as f64).collect();
    let mut memory = Memory::new(k);
    for _ in 0..ROUNDS {
        let round = null_round(&mut rng, slope, &intercepts, 150);
        memory.fold(0.8, z, &round.to_float(), 1e-3, slope, &intercepts);
    }
    memory.resets as f64 / ROUNDS as f64
}

#[test]
fn the_statistic_has_k_plus_one_degrees_of_freedom() {
    // Mean ν and variance 2ν of χ²_ν, ν = K + 1, within sampling error (and far from ν = K).
    for k in [1usize, 4] {
        let mut rng = Rng::new(11 + k as u64);
        let intercepts: Vec<f64> = (0..k).map(|i| 1.0 - 0.3 * i as f64).collect();
        let values: Vec<f64> = (0..ROUNDS)
            .map(|_| {
                let round = null_round(&mut rng, 0.5, &intercepts, 150);
                drift_statistic(&ArrowheadSystem::from_round(&round.to_float(), 1e-3))
            })
            .collect();
        let nu = (k + 1) as f64;
        let mean = values.iter().sum::<f64>() / ROUNDS as f64;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / ROUNDS as f64;
        // Standard error of the mean: sqrt(2ν / ROUNDS) ≈ 0.026·sqrt(ν).
        assert!(
            (mean - nu).abs() < 0.15 * nu.sqrt(),
            "K={k}: mean {mean}, ν = {nu}"
        );
        assert!(
            (var / (2.0 * nu) - 1.0).abs() < 0.2,
            "K={k}: variance {var}, 2ν = {}",
            2.0 * nu
        );
    }
}

/// The cases both false-alarm tests check: `(K, drift_z, band)`. With ROUNDS = 3000 the
/// binomial standard error is at most 0.007 (z = 1) and 0.003 (z = 2); the bands are about four
/// of those wide on each side.
const CASES: [(usize, f64, f64); 4] = [
    (1, 1.0, 0.03),
    (3, 1.0, 0.03),
    (1, 2.0, 0.012),
    (3, 2.0, 0.012),
];

/// Checks that `rate(k, z)`, the fraction of stationary rounds that dropped the memory, is
/// within each case's band around the nominal `P(Z > z)`.
fn assert_nominal_rates(what: &str, rate: impl Fn(usize, f64) -> f64) {
    for (k, z, band) in CASES {
        let (nominal, rate) = (normal_tail(z), rate(k, z));
        assert!(
            (rate - nominal).abs() < band,
            "{what} K={k} drift_z={z}: memory dropped in {rate:.4} of stationary rounds, \
             nominal {nominal:.4}"
        );
    }
}

#[test]
fn the_memory_is_dropped_at_the_nominal_false_alarm_rate() {
    // Measured: 0.160 / 0.162 at z = 1 and 0.026 / 0.024 at z = 2 (K = 1 / K = 3); a threshold
    // with K degrees of freedom instead of K + 1 drops the memory in 0.375 / 0.271 and
    // 0.079 / 0.049 of them.
    assert_nominal_rates("vllm", |k, z| false_alarm_rate(k, z, 1000 + k as u64));
}

/// The fraction of `ROUNDS` stationary rounds in which a `map` estimator's round end drops its
/// memory, and the largest distance of its reference coefficients from the truth.
///
/// Every round is one observe of `rows` requests (`refit_interval = 1`), drafted at features on
/// a grid the histograms hold exactly (integers, so each bin's mean feature is the feature),
/// labeled by the model `σ(ω x + β)` the estimator's prior pins its reference to (the prior's
/// widths are tiny and centred on the truth), so the round's score statistic at the reference
/// is χ² with `K + 1` degrees of freedom as for `vllm`.
fn map_false_alarm_rate(k: usize, z: f64, seed: u64) -> (f64, f64) {
    use crate::{AcceptanceEstimator, EstimatorConfig, MatrixView};
    let (slope, intercept) = (0.5, 0.4);
    let mut config = EstimatorConfig::map(k);
    config.refit_interval = Some(1);
    config.drift_z = z;
    (config.init_slope, config.init_intercept) = (slope, intercept);
    config.prior_slope_sd = 1e-6;
    config.prior_level_sd = 1e-6;
    config.prior_trend_sd = 1e-6;
    config.prior_spread_sd = 1e-6;
    let estimator = AcceptanceEstimator::new(config).unwrap();
    let mut rng = Rng::new(seed);
    let rows = 400;
    let (mut features, mut accepted) = (vec![0.0f32; rows * k], vec![0i64; rows]);
    let mut drift = 0.0f64;
    for _ in 0..ROUNDS {
        for r in 0..rows {
            let mut leading = None;
            for position in 0..k {
                let x = rng.below(7) as f64 - 2.0;
                features[r * k + position] = x as f32;
                if leading.is_none() && rng.unit() >= sigmoid(slope * x + intercept) {
                    leading = Some(position as i64);
                }
            }
            accepted[r] = leading.unwrap_or(k as i64);
        }
        let view = MatrixView::new("features", &features, rows, k).unwrap();
        estimator
            .observe(
                view,
                &vec![k as i64; rows],
                &accepted,
                None::<MatrixView<'_, f32>>,
            )
            .unwrap();
        let c = estimator.coefficients();
        drift = c
            .intercepts
            .iter()
            .map(|b| (b - intercept).abs())
            .fold((c.slope - slope).abs(), f64::max)
            .max(drift);
    }
    let resets = estimator
        .state()
        .update
        .as_map()
        .expect("a map state")
        .memory
        .resets;
    (resets as f64 / ROUNDS as f64, drift)
}

#[test]
fn the_map_memory_is_dropped_at_the_nominal_false_alarm_rate() {
    // Measured at these seeds: 0.163 / 0.158 at z = 1 and 0.020 / 0.021 at z = 2 (K = 1 /
    // K = 3); a threshold with K degrees of freedom instead of K + 1 drops the memory in
    // 0.382 / 0.269 and 0.076 / 0.050 of them.
    assert_nominal_rates("map", |k, z| {
        let (rate, drift) = map_false_alarm_rate(k, z, 2000 + k as u64);
        assert!(
            drift < 1e-6,
            "K={k}: the reference left the truth by {drift}"
        );
        rate
    });
}
