//! `BudgetSource::Previous` sizes the budget from the confidences remembered from the previous
//! step, never from the current ones: that is what keeps it lossless for autoregressive
//! drafters, whose later confidences reveal earlier draft tokens. As a property: two planners
//! in the same state, given the same step with different current confidences, choose the same
//! budget (the assignment, which may read the current confidences, can differ).

use av_core::cost_tables::CostTables;
use av_core::planner::{BudgetSource, Exploration, StepTokens, VerificationPlanner};
use av_core::MatrixView;
use proptest::prelude::*;

fn probabilities(n: usize) -> impl Strategy<Value = Vec<f64>> {
    proptest::collection::vec(prop_oneof![0.0f64..=1.0, Just(0.0), Just(1.0)], n)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_previous_budget_never_reads_the_current_confidences(
        (rows, k, remembered, current, other, scheduled, per_token, cap) in (1usize..8, 1usize..6)
            .prop_flat_map(|(rows, k)| (
                Just(rows),
                Just(k),
                probabilities(rows * k),
                probabilities(rows * k),
                probabilities(rows * k),
                proptest::collection::vec(0i64..=k as i64, rows),
                0.01f64..2.0,
                proptest::option::of(0usize..=rows * k),
            )),
    ) {
        let verify: Vec<f64> = (0..=rows * (k + 1)).map(|t| 1.0 + per_token * t as f64).collect();
        let tables = CostTables::new(vec![0.0; rows + 1], verify).unwrap();
        let mut planner = VerificationPlanner::new(tables, rows, k, BudgetSource::Previous).unwrap();
        planner.set_exploration(Exploration::OFF);
        let slots: Vec<i64> = (0..rows as i64).collect();
        let step = StepTokens {
            num_non_draft_tokens: rows,
            num_sampling_requests: rows,
            max_draft_budget: cap,
        };
        let mut admitted = vec![0i32; rows];
        let view = |data| MatrixView::new("confidences", data, rows, k).unwrap();
        planner.plan(&slots, view(&remembered), &vec![k as i64; rows], &step, &mut admitted).unwrap();
        let mut twin = planner.clone();
        let a = planner.plan(&slots, view(&current), &scheduled, &step, &mut admitted).unwrap();
        let b = twin.plan(&slots, view(&other), &scheduled, &step, &mut admitted).unwrap();
        prop_assert_eq!(a.budget, b.budget);
        prop_assert_eq!(a.predicted_cost_ms.to_bits(), b.predicted_cost_ms.to_bits());
    }
}
