//! Unit tests of the draft budget, against trying every budget.

use super::*;
use crate::matrix::MatrixView;
use proptest::prelude::*;

/// The budgets that may reach a bar, against testing each one: every budget before the
/// count may reach it and none after, on costs that never fall (flat runs, steps, a bar
/// reached by every budget or by none), and all of them when a product overflows.
#[test]
fn reachable_budgets_are_those_that_may_reach() {
    let mut next = crate::planner::tests::xorshift(0x51_7cc1_b727_220au64);
    for trial in 0..400 {
        let len = 1 + (next() % 300) as usize;
        let mut cost = (next() % 100) as f64 / 8.0;
        let verify: Vec<f64> = (0..len)
            .map(|_| {
                if next() % 3 == 0 {
                    cost += (next() % 50) as f64 / 16.0;
                }
                cost
            })
            .collect();
        let top = (next() % 4000) as f64 / 7.0;
        let draft_ms = (next() % 20) as f64 / 4.0;
        let bar = ((next() % 2000) as f64 / 3.0, 1.0 + (next() % 40) as f64);
        let n = reachable_budgets(top, draft_ms, &verify, bar);
        for (b, &v) in verify.iter().enumerate() {
            assert_eq!(
                may_reach((top, draft_ms + v), bar),
                b < n,
                "trial {trial} b {b}"
            );
        }
    }
    let huge = [1.0, 2.0, f64::MAX];
    assert_eq!(reachable_budgets(1e300, 0.0, &huge, (1e300, 1.0)), 3);
}

/// numpy's recipe written out: cumsum, quotients, first maximum.
fn reference(values: &[f64], s: f64, draft: f64, verify: &[f64]) -> usize {
    let mut e = vec![s];
    let mut cum = 0.0;
    for &v in values {
        cum += v;
        e.push(s + cum);
    }
    let q: Vec<f64> = e.iter().zip(verify).map(|(e, v)| e / (draft + v)).collect();
    let mut best = 0;
    for (i, &x) in q.iter().enumerate() {
        if x > q[best] {
            best = i;
        }
    }
    best
}

fn run(values: &[f64], s: f64, draft: f64, verify: &[f64]) -> usize {
    exact_scan(values, s, draft, verify).budget
}

#[test]
fn hand_cases() {
    // Flat costs: every positive survival pays for itself.
    assert_eq!(run(&[0.9, 0.5, 0.1], 1.0, 0.0, &[1.0; 4]), 3);
    // A cost cliff after one draft.
    assert_eq!(run(&[0.9, 0.81], 2.0, 0.0, &[1.0, 1.0, 100.0]), 1);
    // Zero survivals add nothing, so the first maximum stops before them.
    assert_eq!(run(&[0.5, 0.0, 0.0], 1.0, 0.0, &[1.0; 4]), 1);
    // Nothing to gain at all: b = 0.
    assert_eq!(run(&[0.0, 0.0], 0.0, 0.0, &[1.0; 3]), 0);
    // Exact tie between b = 0 and b = 1 in rounded quotients keeps the first.
    assert_eq!(run(&[1.0], 1.0, 0.0, &[1.0, 2.0]), 0);
    // Huge costs overflow the cross products; the quotient path still decides.
    assert_eq!(run(&[1.0], 1.0, 0.0, &[1e308, 1e307]), 1);
}

proptest! {
    #[test]
    fn exact_scan_matches_numpy_recipe_bit_for_bit(
        mut values in prop::collection::vec(
            prop_oneof![Just(0.0), Just(1.0), Just(0.25), 0.0f64..=1.0], 0..40),
        s in 0u32..6,
        draft in prop_oneof![Just(0.0), 0.0f64..5.0],
        verify_seed in prop::collection::vec(
            prop_oneof![Just(1.0), Just(2.0), 1e-6f64..10.0], 41),
    ) {
        values.sort_by(|a, b| b.total_cmp(a));
        let verify = &verify_seed[..values.len() + 1];
        prop_assert_eq!(
            run(&values, f64::from(s), draft, verify),
            reference(&values, f64::from(s), draft, verify)
        );
    }

    /// On dyadic inputs every sum is exact, so the pruned search must equal the full scan.
    #[test]
    fn pruned_search_equals_full_scan_on_exact_inputs(
        rows in 1usize..120,
        cols in 1usize..9,
        numerators in prop::collection::vec(0u32..=16, 1000),
        sched_seed in prop::collection::vec(0usize..9, 120),
        s_seed in 0usize..1000,
        draft in 0u32..8,
        steps in prop::collection::vec((1usize..300, 0u32..64), 1..6),
        sloped in any::<bool>(),
        dip in any::<bool>(),
        cap_seed in 0usize..2000,
        target_scale in prop_oneof![Just(1.0f64), Just(1.0 + 1e-9), Just(1.0 - 1e-9), 0.5f64..2.0],
    ) {
        let conf: Vec<f64> = (0..rows * cols)
            .map(|i| f64::from(numerators[i % numerators.len()]) / 16.0)
            .collect();
        let sched: Vec<usize> = (0..rows).map(|r| sched_seed[r] % (cols + 1)).collect();
        let view = MatrixView::new("c", &conf, rows, cols).unwrap();
        let mut surv = Survivals::default();
        prop_assert!(surv.compute(view, &sched));
        let limit = if cap_seed % 3 == 0 { cap_seed % (surv.count + 1) } else { surv.count };
        // Piecewise costs in exact binary fractions: steps, optionally sloped inside,
        // optionally with one dip (not monotone).
        let mut verify = Vec::with_capacity(limit + 1);
        let mut level = 1.0;
        let mut i = 0;
        while verify.len() <= limit {
            let (len, rise) = steps[i % steps.len()];
            for j in 0..len {
                verify.push(level + if sloped { j as f64 / 8.0 } else { 0.0 });
            }
            level += f64::from(rise) / 4.0 + if sloped { len as f64 / 8.0 } else { 0.0 };
            i += 1;
        }
        verify.truncate(limit + 1);
        if dip && limit > 2 {
            verify[limit / 2] = 0.5;
        }
        let nondecreasing = verify.windows(2).all(|w| w[0] <= w[1]);
        let s = (s_seed % (rows + 1)) as f64;
        let drafts = Drafts { survivals: &surv, cols, scheduled: &sched };
        let costs = StepCosts {
            s,
            draft_ms: f64::from(draft),
            verify: &verify,
            verify_nondecreasing: nondecreasing,
        };
        let pruned = best_budget(drafts, costs, &mut BudgetBuffers::default());
        if !is_small(&surv, limit) {
            // The depth decision's floor is the search's.
            let map = bucket_map(&surv);
            let (mut indices, mut counts, mut sums) = (Vec::new(), Vec::new(), Vec::new());
            map.count_and_sum(&surv, cols, &sched, &mut indices, &mut counts, &mut sums);
            let whole = bounds(&counts, &sums, costs, None).unwrap();
            let (e, c) = whole.floor;
            prop_assert_eq!((e / c).to_bits(), floor_ratio(&counts, &sums, costs).to_bits());
            // Against a target near the best ratio: the bounds the whole sweep gives, or
            // `None` only where every budget's ratio falls short of the target.
            let mut sorted = Vec::new();
            surv.gather(cols, &sched, &mut sorted);
            sorted.sort_by(|a, b| b.total_cmp(a));
            let full = exact_scan(&sorted[..limit], s, f64::from(draft), &verify);
            let best = full.expected_tokens / (f64::from(draft) + verify[full.budget]);
            let target = (best * target_scale, 1.0);
            match bounds(&counts, &sums, costs, Some(target)) {
                Some(found) => {
                    prop_assert_eq!(found.floor, whole.floor);
                    prop_assert_eq!(found.ceiling, whole.ceiling);
                }
                None => prop_assert!(best < target.0 * (1.0 - 2e-9), "{best} vs {target:?}"),
            }
        }
        let mut sorted = Vec::new();
        surv.gather(cols, &sched, &mut sorted);
        sorted.sort_by(|a, b| b.total_cmp(a));
        let full = exact_scan(&sorted[..limit], s, f64::from(draft), &verify);
        prop_assert_eq!(pruned.budget, full.budget);
        prop_assert_eq!(pruned.expected_tokens, full.expected_tokens);
        if full.budget > 0 {
            prop_assert_eq!(pruned.threshold, full.threshold);
        }
    }
}
