//! The C entry points, called from Rust: they give the core's bits, and they refuse what the
//! C error-path tests (`examples/c/error_paths.c`) check from C.

#![cfg(feature = "capi")]

mod common;

use std::ptr::{null, null_mut};

use av_core::cost_tables::CostTables;
use av_core::planner::{BudgetSource, StepTokens, VerificationPlanner};
use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView, Update};
use av_core_capi::cost_tables::*;
use av_core_capi::estimator::*;
use av_core_capi::planner::*;
use av_core_capi::status::*;
use common::last_error;

const K: usize = 3;

/// Deterministic features, counts and predictions for `rows` requests.
fn batch(seed: u64, rows: usize) -> (Vec<f32>, Vec<i64>, Vec<i64>) {
    let mut state = seed;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let features = (0..rows * K)
        .map(|_| (next() % 4001) as f32 / 100.0 - 20.0)
        .collect();
    let admitted: Vec<i64> = (0..rows)
        .map(|_| (next() % (K as u64 + 1)) as i64)
        .collect();
    let accepted = admitted
        .iter()
        .map(|&a| (next() % (a as u64 + 1)) as i64)
        .collect();
    (features, admitted, accepted)
}

struct Estimator(*mut AvcEstimator);

impl Estimator {
    fn new(refit_interval: u64) -> Self {
        let mut config = std::mem::MaybeUninit::<AvcEstimatorConfig>::uninit();
        let mut handle = null_mut();
        // SAFETY: valid out-pointers to locals; config is initialized by the first call.
        unsafe {
            assert_eq!(avc_estimator_config_default(K, config.as_mut_ptr()), AVC_OK);
            let mut config = config.assume_init();
            config.refit_interval = refit_interval;
            assert_eq!(avc_estimator_new(&config, &mut handle), AVC_OK);
        }
        Estimator(handle)
    }

    fn observe(&self, features: &[f32], admitted: &[i64], accepted: &[i64]) -> AvcStatus {
        let rows = features.len() / K;
        // SAFETY: live handle; every slice is passed with its own length.
        unsafe {
            avc_estimator_observe(
                self.0,
                features.as_ptr(),
                rows,
                K,
                admitted.as_ptr(),
                admitted.len(),
                accepted.as_ptr(),
                accepted.len(),
                null(),
                0,
                null_mut(),
            )
        }
    }

    fn save(&self) -> Vec<u8> {
        let mut len = 0;
        // SAFETY: live handle; NULL buffer with cap 0 is the size query.
        let status = unsafe { avc_estimator_save(self.0, null_mut(), 0, &mut len) };
        assert_eq!(status, AVC_ERR_BUFFER_TOO_SMALL);
        let mut bytes = vec![0u8; len];
        // SAFETY: `bytes` has exactly `len` writable bytes.
        let status = unsafe { avc_estimator_save(self.0, bytes.as_mut_ptr(), len, &mut len) };
        assert_eq!(status, AVC_OK);
        bytes
    }
}

impl Drop for Estimator {
    fn drop(&mut self) {
        // SAFETY: the handle is live and no other call uses it any more.
        assert_eq!(unsafe { avc_estimator_free(self.0) }, AVC_OK);
    }
}

#[test]
fn observe_predict_and_save_give_the_cores_bits() {
    let core = AcceptanceEstimator::new(EstimatorConfig {
        refit_interval: Some(4),
        ..EstimatorConfig::new(K)
    })
    .unwrap();
    let capi = Estimator::new(4);
    for seed in 0..10 {
        let (features, admitted, accepted) = batch(seed, 5);
        let view = MatrixView::new("features", &features, 5, K).unwrap();
        core.observe::<f32, f32>(view, &admitted, &accepted, None)
            .unwrap();
        assert_eq!(capi.observe(&features, &admitted, &accepted), AVC_OK);

        let mut expected = vec![0.0f32; features.len()];
        core.predict(view, &mut expected).unwrap();
        let mut got = vec![f32::NAN; features.len()];
        // SAFETY: live handle; both arrays have rows * K elements.
        let status = unsafe {
            avc_estimator_predict(capi.0, features.as_ptr(), 5, K, got.as_mut_ptr(), got.len())
        };
        assert_eq!(status, AVC_OK);
        assert_eq!(
            got.iter().map(|p| p.to_bits()).collect::<Vec<_>>(),
            expected.iter().map(|p| p.to_bits()).collect::<Vec<_>>()
        );
    }
    assert_eq!(capi.save(), core.to_bytes());

    let bytes = capi.save();
    let mut loaded = null_mut();
    // SAFETY: `bytes` is readable for its length; `loaded` is a writable local.
    assert_eq!(
        unsafe { avc_estimator_load(bytes.as_ptr(), bytes.len(), &mut loaded) },
        AVC_OK
    );
    let loaded = Estimator(loaded);
    assert_eq!(loaded.save(), bytes);
}

#[test]
fn a_rejected_observe_changes_nothing_and_names_the_argument() {
    let estimator = Estimator::new(100);
    let (features, admitted, accepted) = batch(1, 4);
    assert_eq!(estimator.observe(&features, &admitted, &accepted), AVC_OK);
    let before = estimator.save();

    let mut nan = features.clone();
    nan[5] = f32::NAN;
    assert_eq!(estimator.observe(&nan, &admitted, &accepted), AVC_ERR_VALUE);
    assert_eq!(
        last_error(),
        "avc_estimator_observe: features: must be finite, got NaN at flat index 5"
    );
    assert_eq!(
        estimator.observe(&features, &admitted[..3], &accepted),
        AVC_ERR_VALUE
    );
    assert!(last_error().contains("num_admitted"), "{}", last_error());
    let too_many: Vec<i64> = admitted.iter().map(|&a| a + 1).collect();
    assert_eq!(
        estimator.observe(&features, &admitted, &too_many),
        AVC_ERR_VALUE
    );
    assert!(last_error().contains("num_accepted"), "{}", last_error());
    // SAFETY: NULL with a non-zero length is refused before any read.
    let status = unsafe {
        avc_estimator_observe(
            estimator.0,
            null(),
            4,
            K,
            admitted.as_ptr(),
            4,
            accepted.as_ptr(),
            4,
            null(),
            0,
            null_mut(),
        )
    };
    assert_eq!(status, AVC_ERR_NULL);
    assert_eq!(
        last_error(),
        "avc_estimator_observe: features: is NULL but its length is 12"
    );
    assert_eq!(estimator.save(), before);
}

#[test]
fn double_free_is_refused_without_reading_the_pointer() {
    let handle = Estimator::new(100);
    let raw = handle.0;
    drop(handle);
    // SAFETY: the registry lookup happens before any dereference, so a freed pointer is only
    // compared, never read.
    assert_eq!(unsafe { avc_estimator_free(raw) }, AVC_ERR_INVALID_HANDLE);
    assert!(last_error().contains("already freed"), "{}", last_error());
    // SAFETY: NULL is a documented no-op.
    assert_eq!(unsafe { avc_estimator_free(null_mut()) }, AVC_OK);
}

#[test]
fn the_planner_handle_plans_like_the_core_planner() {
    let draft = [
        AvcCostPoint { size: 1.0, ms: 0.5 },
        AvcCostPoint { size: 8.0, ms: 0.9 },
    ];
    let verify = [
        AvcCostPoint { size: 1.0, ms: 5.0 },
        AvcCostPoint {
            size: 16.0,
            ms: 5.5,
        },
        AvcCostPoint {
            size: 32.0,
            ms: 8.0,
        },
    ];
    let mut tables = null_mut();
    // SAFETY: both curves are readable for their lengths; `tables` is a writable local.
    let status = unsafe {
        avc_cost_tables_from_curves(
            draft.as_ptr(),
            2,
            verify.as_ptr(),
            3,
            8,
            40,
            16,
            &mut tables,
        )
    };
    assert_eq!(status, AVC_OK);
    let core_tables = CostTables::from_curves(
        &[(1.0, 0.5), (8.0, 0.9)],
        &[(1.0, 5.0), (16.0, 5.5), (32.0, 8.0)],
        8,
        40,
        16,
    )
    .unwrap();
    let mut core = VerificationPlanner::new(core_tables, 6, K, BudgetSource::Previous).unwrap();
    let mut planner = null_mut();
    // SAFETY: live tables; `planner` is a writable local.
    let status = unsafe { avc_planner_new(tables, 6, K, AVC_BUDGET_SOURCE_PREVIOUS, &mut planner) };
    assert_eq!(status, AVC_OK);
    // SAFETY: the planner holds its own copy; nothing else uses the tables.
    assert_eq!(unsafe { avc_cost_tables_free(tables) }, AVC_OK);

    let slots = [4i64, 0, 2, 5];
    let step = AvcStepTokens {
        num_non_draft_tokens: 4,
        num_sampling_requests: 4,
        max_draft_budget: usize::MAX,
    };
    for seed in 0..20u64 {
        let confidences: Vec<f32> = batch(seed, 4)
            .0
            .iter()
            .map(|x| 1.0 / (1.0 + (-x / 4.0).exp()))
            .collect();
        let scheduled: Vec<i64> = (0..4).map(|r| (seed as i64 + r) % (K as i64 + 1)).collect();
        let mut expected = [0i32; 4];
        let view = MatrixView::new("confidences", &confidences, 4, K).unwrap();
        let want = core
            .plan(
                &slots,
                view,
                &scheduled,
                &StepTokens::from(&step),
                &mut expected,
            )
            .unwrap();
        let mut admitted = [-1i32; 4];
        let mut plan = AvcVerificationPlan {
            budget: 0,
            expected_accepted_tokens: 0.0,
            predicted_cost_ms: 0.0,
        };
        // SAFETY: live planner; every array is passed with its own length.
        let status = unsafe {
            avc_planner_plan(
                planner,
                slots.as_ptr(),
                4,
                confidences.as_ptr(),
                4,
                K,
                scheduled.as_ptr(),
                4,
                &step,
                admitted.as_mut_ptr(),
                4,
                &mut plan,
            )
        };
        assert_eq!(status, AVC_OK, "{}", last_error());
        assert_eq!(admitted, expected);
        assert_eq!(plan.budget, want.budget);
        assert_eq!(
            plan.expected_accepted_tokens.to_bits(),
            want.expected_accepted_tokens.to_bits()
        );
        assert_eq!(
            plan.predicted_cost_ms.to_bits(),
            want.predicted_cost_ms.to_bits()
        );
    }
    // SAFETY: live planner, no other user.
    assert_eq!(unsafe { avc_planner_free(planner) }, AVC_OK);
}

#[test]
fn the_update_struct_chooses_the_update_and_the_map_settings() {
    let mut config = std::mem::MaybeUninit::<AvcEstimatorConfig>::uninit();
    let mut update = std::mem::MaybeUninit::<AvcEstimatorUpdate>::uninit();
    // SAFETY: valid out-pointers to locals, initialized by the calls.
    let (mut config, mut update) = unsafe {
        assert_eq!(avc_estimator_config_default(K, config.as_mut_ptr()), AVC_OK);
        assert_eq!(avc_estimator_update_default(update.as_mut_ptr()), AVC_OK);
        (config.assume_init(), update.assume_init())
    };
    assert_eq!(update.update, AVC_UPDATE_MAP); // the default
    assert_eq!(update.bins, EstimatorConfig::DEFAULT_BINS);
    config.refit_interval = 3;
    for (mode, core_config) in [
        (
            AVC_UPDATE_VLLM,
            EstimatorConfig::new(K).with_update(Update::Vllm),
        ),
        (AVC_UPDATE_MAP, EstimatorConfig::new(K)),
    ] {
        update.update = mode;
        update.prior_slope_sd = 0.25;
        let mut handle = null_mut();
        // SAFETY: initialized structs, a writable out-pointer.
        let status = unsafe { avc_estimator_new_with_update(&config, &update, &mut handle) };
        assert_eq!(status, AVC_OK, "{}", last_error());
        let capi = Estimator(handle);
        let core = AcceptanceEstimator::new(EstimatorConfig {
            refit_interval: Some(3),
            prior_slope_sd: 0.25,
            ..core_config
        })
        .unwrap();
        for seed in 0..7 {
            let (features, admitted, accepted) = batch(seed, 5);
            let view = MatrixView::new("features", &features, 5, K).unwrap();
            core.observe::<f32, f32>(view, &admitted, &accepted, None)
                .unwrap();
            assert_eq!(capi.observe(&features, &admitted, &accepted), AVC_OK);
        }
        assert_eq!(capi.save(), core.to_bytes());
        let mut back = std::mem::MaybeUninit::<AvcEstimatorUpdate>::uninit();
        // SAFETY: live handle, writable out-pointer.
        let back = unsafe {
            assert_eq!(avc_estimator_get_update(capi.0, back.as_mut_ptr()), AVC_OK);
            back.assume_init()
        };
        assert_eq!(back, update);
    }
    // An unknown update, or a bad map setting, is refused by name.
    for (corrupt, argument) in [
        ((|u| u.update = 7) as fn(&mut AvcEstimatorUpdate), "update"),
        (|u| u.bins = 0, "bins"),
        (|u| u.prior_spread_sd = -1.0, "prior_spread_sd"),
    ] {
        let mut bad = update;
        corrupt(&mut bad);
        let mut handle = null_mut();
        // SAFETY: as above.
        let status = unsafe { avc_estimator_new_with_update(&config, &bad, &mut handle) };
        assert_eq!(status, AVC_ERR_VALUE);
        assert!(handle.is_null());
        assert!(
            last_error().starts_with(&format!("avc_estimator_new_with_update: {argument}: ")),
            "{}",
            last_error()
        );
    }
}

/// The bytes of an estimator state that no sequence of observations can produce: with a count at
/// the end of `u64` in the open round, the next observe would wrap it.
fn impossible_state(corrupt: fn(&mut av_core::EstimatorState)) -> Vec<u8> {
    // vLLM's update: the corruptions below are of its IRLS moments and quadratic memory.
    let core = AcceptanceEstimator::new(EstimatorConfig::vllm(K)).unwrap();
    let (features, admitted, accepted) = batch(3, 6);
    let view = MatrixView::new("features", &features, 6, K).unwrap();
    core.observe::<f32, f32>(view, &admitted, &accepted, None)
        .unwrap();
    let mut state = core.state();
    corrupt(&mut state);
    av_core::persist::estimator::encode(&state)
}

/// vLLM's part of `state`, which must be one.
fn vllm(state: &mut av_core::EstimatorState) -> &mut av_core::VllmState {
    state.update.as_vllm_mut().expect("a vllm state")
}

#[test]
fn load_refuses_statistics_no_observations_can_produce() {
    type Corruption = fn(&mut av_core::EstimatorState);
    let cases: [(Corruption, &str); 4] = [
        (|s| vllm(s).round.positions[0].n = u64::MAX, "round_stats"),
        (|s| vllm(s).round.positions[0].c = -1, "round_stats"),
        (
            |s| s.steps_since_refit = s.config.refit_interval.unwrap(),
            "steps_since_refit",
        ),
        (|s| vllm(s).memory.c[0] = -1.0, "memory"),
    ];
    for (corrupt, argument) in cases {
        let bytes = impossible_state(corrupt);
        let mut loaded = null_mut();
        // SAFETY: `bytes` is readable for its length; `loaded` is a writable local.
        let status = unsafe { avc_estimator_load(bytes.as_ptr(), bytes.len(), &mut loaded) };
        assert_eq!(status, AVC_ERR_VALUE);
        assert!(loaded.is_null());
        assert!(
            last_error().starts_with(&format!("avc_estimator_load: {argument}: ")),
            "{}",
            last_error()
        );
    }
    // The same state before the corruption loads.
    let bytes = impossible_state(|_| {});
    let mut loaded = null_mut();
    // SAFETY: as above.
    let status = unsafe { avc_estimator_load(bytes.as_ptr(), bytes.len(), &mut loaded) };
    assert_eq!(status, AVC_OK, "{}", last_error());
    drop(Estimator(loaded));
}

impl Estimator {
    fn counters(&self) -> (u64, u64) {
        let (mut refits, mut steps) = (0, 0);
        // SAFETY: live handle, writable locals.
        let status = unsafe { avc_estimator_counters(self.0, &mut refits, &mut steps) };
        assert_eq!(status, AVC_OK);
        (refits, steps)
    }

    fn config(&self) -> AvcEstimatorConfig {
        let mut config = std::mem::MaybeUninit::<AvcEstimatorConfig>::uninit();
        // SAFETY: live handle, a writable out-pointer the call initializes.
        unsafe {
            assert_eq!(
                avc_estimator_get_config(self.0, config.as_mut_ptr()),
                AVC_OK
            );
            config.assume_init()
        }
    }
}

#[test]
fn refit_interval_zero_is_manual_and_refits_only_when_asked() {
    let capi = Estimator::new(0);
    let core = AcceptanceEstimator::new(EstimatorConfig {
        refit_interval: None,
        ..EstimatorConfig::new(K)
    })
    .unwrap();
    assert_eq!(capi.config().refit_interval, 0);
    for seed in 0..250 {
        let (features, admitted, accepted) = batch(seed, 4);
        assert_eq!(capi.observe(&features, &admitted, &accepted), AVC_OK);
        let view = MatrixView::new("features", &features, 4, K).unwrap();
        core.observe(view, &admitted, &accepted, None::<MatrixView<'_, f32>>)
            .unwrap();
    }
    assert_eq!(capi.counters(), (0, 250));
    // SAFETY: live handle.
    assert_eq!(unsafe { avc_estimator_refit(capi.0) }, AVC_OK);
    core.refit();
    assert_eq!(capi.counters(), (1, 0));
    assert_eq!(capi.save(), core.to_bytes());
}

#[test]
fn set_regularization_changes_later_refits_and_refuses_bad_values() {
    let capi = Estimator::new(5);
    let before = capi.config();
    for (l2, damping) in [(-1.0, 10.0), (0.5, f64::NAN), (f64::INFINITY, 1.0)] {
        // SAFETY: live handle.
        let status = unsafe { avc_estimator_set_regularization(capi.0, l2, damping) };
        assert_eq!(status, AVC_ERR_VALUE);
        assert_eq!(capi.config(), before);
    }
    assert!(
        last_error().starts_with("avc_estimator_set_regularization"),
        "{}",
        last_error()
    );
    // SAFETY: live handle.
    let status = unsafe { avc_estimator_set_regularization(capi.0, 0.25, 7.0) };
    assert_eq!(status, AVC_OK);
    let config = capi.config();
    assert_eq!((config.l2, config.damping), (0.25, 7.0));
    // Later refits are those of an estimator built with the new pair.
    let core = AcceptanceEstimator::new(EstimatorConfig {
        refit_interval: Some(5),
        l2: 0.25,
        damping: 7.0,
        ..EstimatorConfig::new(K)
    })
    .unwrap();
    for seed in 0..12 {
        let (features, admitted, accepted) = batch(seed, 6);
        assert_eq!(capi.observe(&features, &admitted, &accepted), AVC_OK);
        let view = MatrixView::new("features", &features, 6, K).unwrap();
        core.observe(view, &admitted, &accepted, None::<MatrixView<'_, f32>>)
            .unwrap();
    }
    // The default map update: per round of 5, fits after steps 1, 2, 4 and at its end; 12 steps
    // are two rounds (8) and steps 1, 2 of the third (2).
    assert_eq!(capi.counters(), (10, 2));
    assert_eq!(capi.save(), core.to_bytes());
}

/// The size query of `avc_estimator_save` for a new estimator with `update` and `bins` on 4
/// positions, before and after a few observations and refits.
fn saved_sizes(update: AvcUpdate, bins: usize) -> (usize, usize) {
    let mut config = std::mem::MaybeUninit::<AvcEstimatorConfig>::uninit();
    let mut settings = std::mem::MaybeUninit::<AvcEstimatorUpdate>::uninit();
    // SAFETY: valid out-pointers to locals, initialized by the calls.
    let (mut config, mut settings) = unsafe {
        assert_eq!(avc_estimator_config_default(4, config.as_mut_ptr()), AVC_OK);
        assert_eq!(avc_estimator_update_default(settings.as_mut_ptr()), AVC_OK);
        (config.assume_init(), settings.assume_init())
    };
    config.refit_interval = 2;
    (settings.update, settings.bins) = (update, bins);
    let mut handle = null_mut();
    // SAFETY: initialized structs, a writable out-pointer.
    let status = unsafe { avc_estimator_new_with_update(&config, &settings, &mut handle) };
    assert_eq!(status, AVC_OK, "{}", last_error());
    let estimator = Estimator(handle);
    let size = |estimator: &Estimator| {
        let mut len = 0;
        // SAFETY: live handle; NULL buffer with cap 0 is the size query.
        let status = unsafe { avc_estimator_save(estimator.0, null_mut(), 0, &mut len) };
        assert_eq!(status, AVC_ERR_BUFFER_TOO_SMALL);
        len
    };
    let before = size(&estimator);
    for seed in 0..5 {
        let features: Vec<f32> = (0..24)
            .map(|i| ((i * 7 + seed * 3) % 13) as f32 - 6.0)
            .collect();
        let (admitted, accepted) = ([4i64, 3, 2, 4, 1, 0], [2i64, 3, 0, 4, 1, 0]);
        // SAFETY: live handle; every slice is passed with its own length.
        let status = unsafe {
            avc_estimator_observe(
                estimator.0,
                features.as_ptr(),
                6,
                4,
                admitted.as_ptr(),
                6,
                accepted.as_ptr(),
                6,
                null(),
                0,
                null_mut(),
            )
        };
        assert_eq!(status, AVC_OK, "{}", last_error());
    }
    (before, size(&estimator))
}

#[test]
fn a_saved_states_size_depends_on_its_configuration_as_the_header_says() {
    // What is observed does not change it, so one size query serves every later save.
    let map = [16, 64, 256].map(|bins| saved_sizes(AVC_UPDATE_MAP, bins));
    for (before, after) in map {
        assert_eq!(before, after);
    }
    // A map estimator's grows with its bins, by 48 bytes per bin and position (three integer
    // and three float columns of 8 bytes) and the bytes of lengths written as varints: the
    // three float columns' lengths take a second byte from 128 entries on (64 bins), the
    // round's `bins` from 128 on (the configuration's is a fixed-width int). vLLM's update
    // keeps no histograms.
    assert_eq!(map[1].0 - map[0].0, 48 * 4 * (64 - 16) + 3);
    assert_eq!(map[2].0 - map[1].0, 48 * 4 * (256 - 64) + 1);
    let vllm = [16, 64, 256].map(|bins| saved_sizes(AVC_UPDATE_VLLM, bins));
    assert!(vllm.iter().all(|(before, after)| before == after));
    assert_eq!((vllm[1].0 - vllm[0].0, vllm[2].0 - vllm[1].0), (0, 0));
    // The header states the rule.
    let header = include_str!("../../include/av_core.h");
    let end = header.find("avc_status avc_estimator_save(").unwrap();
    let doc = header[header[..end].rfind("/**").unwrap()..end].replace("\n *", "");
    for rule in [
        "depends on the configuration only",
        "bins",
        "48 bytes per bin and position",
    ] {
        assert!(
            doc.contains(rule),
            "the header does not say {rule:?}:\n{doc}"
        );
    }
}
