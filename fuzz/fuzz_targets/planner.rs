//! Arbitrary confidences, schedules and slots through the stateful planner: an error or a plan
//! that admits a prefix of each request within its schedule and sums to the budget; a rejected
//! call leaves the planner's memory unchanged. Never a panic.
#![no_main]

use av_core::cost_tables::CostTables;
use av_core::planner::{BudgetSource, StepTokens, VerificationPlanner};
use av_core::MatrixView;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let k = 1 + usize::from(data[0]) % 8;
    let rows = usize::from(data[1]) % 12;
    let slots_n = 1 + usize::from(data[2]) % 16;
    let source = if data[3] & 1 == 0 { BudgetSource::Previous } else { BudgetSource::Current };
    let tables = CostTables::new(
        (0..=16).map(|r| f64::from(r as u8) * 0.1).collect(),
        (0..=256).map(|t| 1.0 + f64::from((t / 32) as u8)).collect(),
    )
    .unwrap();
    let mut planner = VerificationPlanner::new(tables, slots_n, k, source).unwrap();
    let body = &data[8..];
    let byte = |i: usize| body.get(i).copied().unwrap_or(0);
    for round in 0..3 {
        let off = round * 97;
        let confidences: Vec<f64> = (0..rows * k)
            .map(|i| match byte(off + i) {
                255 => f64::NAN,
                254 => 1.5,
                b => f64::from(b) / 253.0,
            })
            .collect();
        let scheduled: Vec<i64> = (0..rows).map(|r| i64::from(byte(off + 50 + r) % 10) - 1).collect();
        let slots: Vec<i64> = (0..rows).map(|r| i64::from(byte(off + 70 + r) % 20)).collect();
        let step = StepTokens {
            num_non_draft_tokens: usize::from(byte(off + 90)) % 40,
            num_sampling_requests: usize::from(byte(off + 91)) % 16,
            max_draft_budget: None,
        };
        let before: Vec<Vec<f64>> = (0..slots_n)
            .map(|s| planner.previous_confidences(s).unwrap().to_vec())
            .collect();
        let mut admitted = vec![0i32; rows];
        let view = MatrixView::new("confidences", &confidences, rows, k).unwrap();
        match planner.plan(&slots, view, &scheduled, &step, &mut admitted) {
            Ok(plan) => {
                let total: i64 = admitted.iter().map(|&a| i64::from(a)).sum();
                assert_eq!(total as usize, plan.budget);
                for (a, s) in admitted.iter().zip(&scheduled) {
                    assert!(*a >= 0 && i64::from(*a) <= *s);
                }
            }
            Err(_) => {
                let after: Vec<Vec<f64>> = (0..slots_n)
                    .map(|s| planner.previous_confidences(s).unwrap().to_vec())
                    .collect();
                assert_eq!(before, after, "a rejected plan changed the planner");
            }
        }
    }
});
