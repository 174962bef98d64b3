//! State written by earlier releases still loads, bit for bit.
//!
//! `tests/data/` holds bytes and text written by av_core 0.1.0 (commit 3bbb4ad, before the
//! persistence module existed) from the recipes below: planner states without and with a
//! draft-depth table (format version 1, where the depth table was found from the length of what
//! followed the confidences), cost-table JSON without and with a depth table, and an estimator
//! state. Each test loads the old bytes and checks that the state is exactly the one the recipe
//! builds today: the same state (for planners, the same encoding by this build), and it plans
//! and predicts the next steps identically. (`tests/persist/test_legacy_states.py` loads the
//! states of further earlier builds.)

use av_core::cost_tables::{CostTables, DrafterKind};
use av_core::persist::{frame, Kind, FRAME_LEN};
use av_core::planner::{BudgetSource, DepthMode, Exploration, StepTokens, VerificationPlanner};
use av_core::{AcceptanceEstimator, ErrorKind, EstimatorConfig, MatrixView, Update};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/");

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{DATA}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Tables from curves with a capture limit: step entries, interpolated ones, floored ones.
fn recipe_tables() -> CostTables {
    let draft = [(1.0, 0.31), (4.0, 0.47), (16.0, 1.13)];
    let verify = [
        (1.0, 7.1),
        (8.0, 7.9),
        (32.0, 9.3),
        (96.0, 15.7),
        (160.0, 23.05),
    ];
    CostTables::from_curves(&draft, &verify, 16, 200, 32).unwrap()
}

fn recipe_depth_tables() -> CostTables {
    recipe_tables()
        .with_draft_depth_curve(&[(1.0, 0.41), (2.0, 0.77), (4.0, 1.6)], 4)
        .unwrap()
}

fn step(rows: usize) -> StepTokens {
    StepTokens {
        num_non_draft_tokens: rows + 3,
        num_sampling_requests: rows,
        max_draft_budget: None,
    }
}

/// Confidences that vary by step, row and position (exact binary fractions and a few others).
fn confidences(round: usize, rows: usize, k: usize) -> Vec<f32> {
    (0..rows * k)
        .map(|i| {
            let x = ((i * 7 + round * 13) % 29) as f32 / 29.0;
            0.05 + 0.9 * x
        })
        .collect()
}

/// A planner after a few steps: exploration on, a non-trivial step count, remembered
/// confidences that differ from slot to slot and a slot reset by `add_request`.
fn recipe_planner(tables: CostTables, source: BudgetSource) -> VerificationPlanner {
    let k = 4;
    let mut planner = VerificationPlanner::new(tables, 12, k, source).unwrap();
    planner.set_exploration(Exploration::new("exploration", 0.25, 0xDEC0_DE5E_ED00_0001).unwrap());
    let slots = [0i64, 3, 4, 7, 11];
    for round in 0..9 {
        let conf = confidences(round, slots.len(), k);
        let view = MatrixView::new("confidences", &conf, slots.len(), k).unwrap();
        let scheduled = [4i64, 3, 4, (round % 5) as i64, 2];
        let mut admitted = [0i32; 5];
        planner
            .plan(&slots, view, &scheduled, &step(slots.len()), &mut admitted)
            .unwrap();
    }
    planner.add_request(4).unwrap();
    planner
}

fn recipe_estimator() -> AcceptanceEstimator {
    // 0.1.0's estimator is the `vllm` update, still the default (`map` is opt-in).
    let mut config = EstimatorConfig::new(3).with_update(Update::Vllm);
    config.refit_interval = Some(4);
    config.memory = 0.5;
    let estimator = AcceptanceEstimator::new(config).unwrap();
    for round in 0..11 {
        let x: Vec<f32> = (0..6)
            .map(|i| ((i * 5 + round * 3) % 11) as f32 / 2.0 - 2.5)
            .collect();
        let admitted = [3i64, (round % 4) as i64];
        let accepted = [(round % 3) as i64, (round % 2) as i64];
        estimator
            .observe::<f32, f32>(
                MatrixView::new("features", &x, 2, 3).unwrap(),
                &admitted,
                &accepted,
                None,
            )
            .unwrap();
    }
    estimator
}

/// Plans a few more steps on both planners and checks they agree exactly (plans, admitted
/// counts, depth decisions and what they remember).
fn continue_identically(mut a: VerificationPlanner, mut b: VerificationPlanner) {
    let slots = [1i64, 3, 4, 11];
    for round in 20..26 {
        let conf = confidences(round, slots.len(), 4);
        let view = MatrixView::new("confidences", &conf, slots.len(), 4).unwrap();
        let (mut x, mut y) = ([0i32; 4], [0i32; 4]);
        let scheduled = [4i64, 4, 2, 3];
        let pa = a.plan(&slots, view, &scheduled, &step(4), &mut x).unwrap();
        let pb = b.plan(&slots, view, &scheduled, &step(4), &mut y).unwrap();
        assert_eq!((pa, x), (pb, y), "round {round}");
        if a.cost_tables().draft_depth_ms().is_some() {
            let (mut da, mut db) = ([0i32; 4], [0i32; 4]);
            let caps = [4i64; 4];
            let qa = a
                .choose_draft_depth(&slots, &caps, &step(4), DepthMode::PerRequest, &mut da)
                .unwrap();
            let qb = b
                .choose_draft_depth(&slots, &caps, &step(4), DepthMode::PerRequest, &mut db)
                .unwrap();
            assert_eq!((qa, da), (qb, db), "round {round}");
        }
    }
    for slot in 0..12 {
        assert_eq!(
            a.previous_confidences(slot).unwrap(),
            b.previous_confidences(slot).unwrap()
        );
    }
}

fn check_planner(name: &str, expected: VerificationPlanner) {
    let bytes = fixture(name);
    assert_eq!(&bytes[..8], b"AVCORE\0P", "{name}");
    assert_eq!(
        bytes[8..12],
        1u32.to_le_bytes(),
        "{name} is a version-1 state"
    );
    let loaded = VerificationPlanner::from_bytes(&bytes).unwrap();
    assert_eq!(loaded.to_bytes(), expected.to_bytes(), "{name}");
    assert_eq!(loaded.cost_tables(), expected.cost_tables());
    assert_eq!(loaded.exploration(), expected.exploration());
    assert_eq!(loaded.budget_source(), expected.budget_source());
    assert_eq!(
        (loaded.num_slots(), loaded.num_positions()),
        (expected.num_slots(), expected.num_positions())
    );
    continue_identically(loaded, expected);
}

#[test]
fn version_1_planner_bytes_load_bit_for_bit() {
    check_planner(
        "planner_v1.bin",
        recipe_planner(recipe_tables(), BudgetSource::Previous),
    );
}

#[test]
fn version_1_planner_bytes_with_a_depth_table_load_bit_for_bit() {
    check_planner(
        "planner_v1_depth.bin",
        recipe_planner(recipe_depth_tables(), BudgetSource::Current),
    );
}

/// Version 1 found a depth table from what followed the confidences: a length word and that
/// many entries. A length that does not match the entries after it is refused by its value.
#[test]
fn a_version_1_depth_table_whose_length_does_not_match_is_refused() {
    let bytes = fixture("planner_v1_depth.bin");
    let payload = &bytes[FRAME_LEN - 4..bytes.len() - 4];
    let depth_len = recipe_depth_tables().draft_depth_ms().unwrap().len() as u64;
    let at = payload.len() - 8 * depth_len as usize - 8; // the depth table's length word
    assert_eq!(payload[at..at + 8], depth_len.to_le_bytes());
    for len in [0, depth_len - 1, depth_len + 1, u64::MAX] {
        let mut edited = payload.to_vec();
        edited[at..at + 8].copy_from_slice(&len.to_le_bytes());
        let err = VerificationPlanner::from_bytes(&frame(Kind::Planner, 1, &edited)).unwrap_err();
        assert_eq!((err.kind, err.argument), (ErrorKind::State, "data"));
        let expected = format!("draft-depth table length {len} does not match the data");
        assert_eq!(err.message, expected);
    }
}

#[test]
fn cost_table_json_loads_bit_for_bit_and_is_written_the_same() {
    for (name, tables) in [
        ("cost_tables.json", recipe_tables()),
        ("cost_tables_depth.json", recipe_depth_tables()),
        (
            "cost_tables_drafter.json",
            CostTables::new(
                vec![0.0, 1e-300, 0.1, 2.5],
                vec![1e-6, 0.3, 12345.678, 1e22],
            )
            .unwrap()
            .with_drafter(DrafterKind::Parallel, 3)
            .unwrap(),
        ),
    ] {
        let text = String::from_utf8(fixture(name)).unwrap();
        let loaded = CostTables::from_json(&text).unwrap();
        assert_eq!(loaded, tables, "{name}");
        for (a, b) in loaded.verify_ms().iter().zip(tables.verify_ms()) {
            assert_eq!(a.to_bits(), b.to_bits(), "{name}");
        }
        assert_eq!(tables.to_json(), text, "{name}: the JSON writer changed");
    }
}

#[test]
fn version_1_estimator_bytes_load_bit_for_bit() {
    let bytes = fixture("estimator_v1.bin");
    assert_eq!(&bytes[..8], b"AVCORE\0E");
    let expected = recipe_estimator();
    let loaded = AcceptanceEstimator::from_bytes(&bytes).unwrap();
    assert_eq!(loaded.state(), expected.state());
    // This build writes it in its own format, which reads back to the same state.
    let again = AcceptanceEstimator::from_bytes(&loaded.to_bytes()).unwrap();
    assert_eq!(again.state(), expected.state());
    let x = [0.5f32, -1.0, 3.0, 2.0, 0.0, -4.0];
    let (mut p, mut q) = ([0.0f32; 6], [0.0f32; 6]);
    loaded
        .predict(MatrixView::new("features", &x, 2, 3).unwrap(), &mut p)
        .unwrap();
    expected
        .predict(MatrixView::new("features", &x, 2, 3).unwrap(), &mut q)
        .unwrap();
    assert_eq!(p.map(f32::to_bits), q.map(f32::to_bits));
}
