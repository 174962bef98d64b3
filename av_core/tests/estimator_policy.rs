//! The estimator's policies that integrations run their own schedule with: manual refits
//! (`refit_interval: None`) and changeable regularisation (`set_regularization`), checked
//! against what they replace (an interval no run reaches, a rebuild from the state).

use av_core::persist::state_dict;
use av_core::persist::tree::Value;
use av_core::{AcceptanceEstimator, ErrorKind, EstimatorConfig, MatrixView, Update};

/// A deterministic decode step of `rows` requests on `k` positions.
fn step(seed: u64, rows: usize, k: usize) -> (Vec<f32>, Vec<i64>, Vec<i64>) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let features = (0..rows * k)
        .map(|_| (next() % 2001) as f32 / 100.0 - 10.0)
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

fn observe(estimator: &AcceptanceEstimator, seed: u64) -> bool {
    let k = estimator.num_positions();
    let (features, admitted, accepted) = step(seed, 5, k);
    let view = MatrixView::new("features", &features, 5, k).unwrap();
    estimator
        .observe(view, &admitted, &accepted, None::<MatrixView<'_, f32>>)
        .unwrap()
}

fn manual(config: EstimatorConfig) -> AcceptanceEstimator {
    AcceptanceEstimator::new(EstimatorConfig {
        refit_interval: None,
        ..config
    })
    .unwrap()
}

#[test]
fn a_manual_estimator_never_refits_on_its_own_and_refits_when_asked() {
    for config in [
        EstimatorConfig::new(3).with_update(Update::Vllm),
        EstimatorConfig::map(3),
    ] {
        let update = config.update;
        let estimator = manual(config);
        let cold = estimator.coefficients();
        for seed in 0..300 {
            assert!(
                !observe(&estimator, seed),
                "{update:?}: observe {seed} refitted"
            );
        }
        assert_eq!(estimator.num_refits(), 0);
        assert_eq!(estimator.steps_since_refit(), 300);
        assert_eq!(estimator.coefficients(), cold);
        let report = estimator.refit();
        assert_eq!(estimator.num_refits(), 1);
        assert_eq!(estimator.steps_since_refit(), 0);
        assert_ne!(
            estimator.coefficients().intercepts,
            cold.intercepts,
            "{update:?}"
        );
        match update {
            Update::Vllm => assert_eq!(
                report.update.as_vllm().unwrap().round.total_count(),
                estimator_labels(300, 3)
            ),
            Update::Map => {
                assert_eq!(
                    report
                        .update
                        .as_map()
                        .unwrap()
                        .round
                        .as_ref()
                        .unwrap()
                        .total_count(),
                    estimator_labels(300, 3)
                )
            }
        }
    }
}

/// The labels `steps` of [`step`] give on `k` positions (a position is labeled up to the
/// first rejection among the admitted).
fn estimator_labels(steps: u64, k: usize) -> u64 {
    (0..steps)
        .map(|seed| {
            let (_, admitted, accepted) = step(seed, 5, k);
            admitted
                .iter()
                .zip(&accepted)
                .map(|(&n, &a)| (a + i64::from(a < n)) as u64)
                .sum::<u64>()
        })
        .sum()
}

#[test]
fn manual_vllm_is_the_estimator_whose_interval_is_never_reached() {
    // What av_core.vllm did before the manual mode: an interval no run reaches.
    let far = AcceptanceEstimator::new(EstimatorConfig {
        refit_interval: Some(1 << 40),
        ..EstimatorConfig::new(2).with_update(Update::Vllm)
    })
    .unwrap();
    let manual = manual(EstimatorConfig::new(2).with_update(Update::Vllm));
    for seed in 0..40 {
        assert_eq!(observe(&far, seed), observe(&manual, seed));
        if seed % 9 == 8 {
            assert_eq!(far.refit(), manual.refit());
        }
    }
    let (mut a, b) = (far.state(), manual.state());
    a.config.refit_interval = None;
    assert_eq!(a, b);
}

#[test]
fn a_manual_state_round_trips_through_bytes_and_the_state_dict() {
    for config in [
        EstimatorConfig::new(2).with_update(Update::Vllm),
        EstimatorConfig::map(2),
    ] {
        let estimator = manual(config);
        for seed in 0..7 {
            observe(&estimator, seed);
        }
        let back = AcceptanceEstimator::from_bytes(&estimator.to_bytes()).unwrap();
        assert_eq!(back.config().refit_interval, None);
        assert_eq!(back.state(), estimator.state());
        assert_eq!(back.to_bytes(), estimator.to_bytes());
        let tree = state_dict::encode(&estimator.state());
        let config = tree.get("config").expect("a config");
        assert_eq!(config.get("refit_interval"), Some(&Value::None));
        let decoded = state_dict::decode(&tree, "state", av_core::ErrorKind::Value).unwrap();
        assert_eq!(decoded, estimator.state());
        // And it keeps going manual: the count goes on, no refit.
        assert!(!observe(&back, 99));
        assert_eq!((back.num_refits(), back.steps_since_refit()), (0, 8));
    }
}

#[test]
fn an_interval_of_zero_is_still_refused() {
    let config = EstimatorConfig {
        refit_interval: Some(0),
        ..EstimatorConfig::new(2).with_update(Update::Vllm)
    };
    let err = AcceptanceEstimator::new(config).unwrap_err();
    assert_eq!(
        (err.kind, err.argument),
        (ErrorKind::Value, "refit_interval")
    );
}

/// What `av_core.vllm` did before `set_regularization`: rebuild from the state with the two
/// fields changed.
fn rebuilt(estimator: &AcceptanceEstimator, l2: f64, damping: f64) -> AcceptanceEstimator {
    let mut state = estimator.state();
    state.config.l2 = l2;
    state.config.damping = damping;
    AcceptanceEstimator::from_state(&state).unwrap()
}

#[test]
fn set_regularization_is_the_rebuild_bit_for_bit() {
    let configs = [
        EstimatorConfig::new(3).with_update(Update::Vllm),
        EstimatorConfig {
            memory: 0.0,
            ..EstimatorConfig::vllm(3)
        },
        EstimatorConfig::map(3),
    ];
    for config in configs {
        let config = EstimatorConfig {
            refit_interval: Some(4),
            ..config
        };
        let changed = AcceptanceEstimator::new(config).unwrap();
        for seed in 0..9 {
            observe(&changed, seed);
        }
        for (round, (l2, damping)) in [(0.3, 5.0), (0.0, 0.0), (2.5, 400.0)]
            .into_iter()
            .enumerate()
        {
            let rebuild = rebuilt(&changed, l2, damping);
            changed.set_regularization(l2, damping).unwrap();
            assert_eq!(changed.config(), rebuild.config());
            assert_eq!(changed.to_bytes(), rebuild.to_bytes());
            for seed in 0..11 {
                let seed = 100 * round as u64 + seed;
                assert_eq!(observe(&changed, seed), observe(&rebuild, seed));
            }
            assert_eq!(changed.refit(), rebuild.refit());
            assert_eq!(changed.to_bytes(), rebuild.to_bytes());
            let stats = rebuild.round_stats();
            assert_eq!(
                changed.drift_statistic(&stats).to_bits(),
                rebuild.drift_statistic(&stats).to_bits()
            );
        }
    }
}

#[test]
fn set_regularization_refuses_bad_values_and_changes_nothing() {
    let estimator =
        AcceptanceEstimator::new(EstimatorConfig::new(2).with_update(Update::Vllm)).unwrap();
    observe(&estimator, 1);
    let before = estimator.to_bytes();
    for (l2, damping, argument) in [
        (-1e-3, 1.0, "l2"),
        (f64::NAN, 1.0, "l2"),
        (f64::INFINITY, 1.0, "l2"),
        (0.1, -1.0, "damping"),
        (0.1, f64::NAN, "damping"),
        (-1.0, -1.0, "damping"),
    ] {
        let err = estimator.set_regularization(l2, damping).unwrap_err();
        assert_eq!((err.kind, err.argument), (ErrorKind::Value, argument));
        assert_eq!(estimator.to_bytes(), before);
    }
}

#[test]
fn concurrent_setters_and_refits_see_whole_pairs() {
    let estimator = std::sync::Arc::new(manual(EstimatorConfig::new(2).with_update(Update::Vllm)));
    // Every pair ever set has damping = 2 l2, from the first one on.
    estimator.set_regularization(1.0, 2.0).unwrap();
    let writers: Vec<_> = (1..=4)
        .map(|t| {
            let estimator = std::sync::Arc::clone(&estimator);
            std::thread::spawn(move || {
                for i in 0..2000u32 {
                    let l2 = f64::from(t * 10_000 + i);
                    estimator.set_regularization(l2, 2.0 * l2).unwrap();
                }
            })
        })
        .collect();
    for seed in 0..200 {
        observe(&estimator, seed);
        estimator.refit();
        let config = estimator.config();
        assert_eq!(config.damping, 2.0 * config.l2, "a torn pair");
    }
    for writer in writers {
        writer.join().unwrap();
    }
    let config = estimator.config();
    assert_eq!(config.damping, 2.0 * config.l2);
}
