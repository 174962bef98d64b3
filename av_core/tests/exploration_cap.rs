//! Exploration never pushes a step past its draft cap: `VerificationPlanner::set_exploration`
//! documents that the extra whole-block verifications "never push the step past
//! `max_draft_budget` or the cost tables". Checked as a property over random steps with the
//! exploration floor at its most aggressive (probability 1, every request explores) and at
//! random probabilities, with costs steep enough that the budget alone trims.

use av_core::cost_tables::CostTables;
use av_core::planner::{BudgetSource, Exploration, StepTokens, VerificationPlanner};
use av_core::MatrixView;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    rows: usize,
    k: usize,
    steps: Vec<(Vec<f64>, Vec<i64>, usize)>,
    exploration: f64,
    seed: u64,
    per_token_ms: f64,
    source: BudgetSource,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..10, 1usize..6).prop_flat_map(|(rows, k)| {
        let step = (
            proptest::collection::vec(0.0f64..=1.0, rows * k),
            proptest::collection::vec(0i64..=k as i64, rows),
            0usize..=rows * k,
        );
        (
            proptest::collection::vec(step, 1..5),
            prop_oneof![Just(1.0), 0.0f64..=1.0],
            any::<u64>(),
            0.05f64..3.0,
            prop_oneof![Just(BudgetSource::Previous), Just(BudgetSource::Current)],
        )
            .prop_map(
                move |(steps, exploration, seed, per_token_ms, source)| Case {
                    rows,
                    k,
                    steps,
                    exploration,
                    seed,
                    per_token_ms,
                    source,
                },
            )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn exploration_never_exceeds_max_draft_budget(c in case()) {
        let (rows, k) = (c.rows, c.k);
        let tokens = rows * (k + 1);
        let verify: Vec<f64> = (0..=tokens).map(|t| 1.0 + c.per_token_ms * t as f64).collect();
        let tables = CostTables::new(vec![0.0; rows + 1], verify).unwrap();
        let mut planner = VerificationPlanner::new(tables, rows, k, c.source).unwrap();
        planner.set_exploration(Exploration::new("exploration", c.exploration, c.seed).unwrap());
        let slots: Vec<i64> = (0..rows as i64).collect();
        for (confidences, scheduled, cap) in &c.steps {
            let step = StepTokens {
                num_non_draft_tokens: rows,
                num_sampling_requests: rows,
                max_draft_budget: Some(*cap),
            };
            let view = MatrixView::new("confidences", confidences, rows, k).unwrap();
            let mut admitted = vec![-1i32; rows];
            let plan = planner.plan(&slots, view, scheduled, &step, &mut admitted).unwrap();
            let total: i64 = admitted.iter().map(|&a| i64::from(a)).sum();
            prop_assert!(total as usize <= *cap, "admitted {admitted:?} past the cap {cap}");
            prop_assert_eq!(plan.budget as i64, total);
            for (a, s) in admitted.iter().zip(scheduled) {
                prop_assert!(0 <= *a && i64::from(*a) <= *s, "admitted {a} of {s} scheduled");
            }
        }
    }

    #[test]
    fn exploration_stays_within_tables_sized_to_the_cap(c in case()) {
        // Tables that cover exactly the non-draft tokens plus the capped budget: exploring past
        // the cap would read past them.
        let (rows, k) = (c.rows, c.k);
        let slots: Vec<i64> = (0..rows as i64).collect();
        for (confidences, scheduled, cap) in &c.steps {
            let verify: Vec<f64> =
                (0..=rows + cap).map(|t| 1.0 + c.per_token_ms * t as f64).collect();
            let tables = CostTables::new(vec![0.0; rows + 1], verify).unwrap();
            let mut planner = VerificationPlanner::new(tables, rows, k, c.source).unwrap();
            planner.set_exploration(Exploration::new("exploration", c.exploration, c.seed).unwrap());
            let step = StepTokens {
                num_non_draft_tokens: rows,
                num_sampling_requests: rows,
                max_draft_budget: Some(*cap),
            };
            let view = MatrixView::new("confidences", confidences, rows, k).unwrap();
            let mut admitted = vec![-1i32; rows];
            let plan = planner.plan(&slots, view, scheduled, &step, &mut admitted).unwrap();
            prop_assert!(plan.budget <= *cap);
            prop_assert!(plan.predicted_cost_ms.is_finite());
        }
    }
}

#[test]
fn every_request_exploring_still_respects_the_cap() {
    // Four requests of four drafts, all exploring, a cap of 6: at most one whole block fits
    // beside whatever the budget admitted, never all four.
    let verify: Vec<f64> = (0..=20).map(|t| 1.0 + 0.5 * f64::from(t)).collect();
    let tables = CostTables::new(vec![0.0; 5], verify).unwrap();
    let mut planner = VerificationPlanner::new(tables, 4, 4, BudgetSource::Current).unwrap();
    planner.set_exploration(Exploration::new("exploration", 1.0, 3).unwrap());
    let confidences = [0.05; 16];
    let view = MatrixView::new("confidences", &confidences, 4, 4).unwrap();
    let step = StepTokens {
        num_non_draft_tokens: 4,
        num_sampling_requests: 4,
        max_draft_budget: Some(6),
    };
    let mut admitted = [0i32; 4];
    let plan = planner
        .plan(&[0, 1, 2, 3], view, &[4; 4], &step, &mut admitted)
        .unwrap();
    assert_eq!(admitted.iter().sum::<i32>() as usize, plan.budget);
    assert!(plan.budget <= 6, "{admitted:?}");
    assert_eq!(
        plan.budget, 4,
        "one request explores its whole block: {admitted:?}"
    );
}
