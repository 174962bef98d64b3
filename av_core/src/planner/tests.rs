//! Planner tests: hand cases from the issue, brute force over every budget and every prefix
//! allocation, error handling, and the stateful planner's bookkeeping.

use proptest::prelude::*;

use super::*;

/// A xorshift64 stream from `seed` (non-zero): the planner's unit tests' cheap, reproducible
/// draws.
pub(crate) fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

fn tables(draft_ms: Vec<f64>, verify_ms: Vec<f64>) -> CostTables {
    CostTables::new(draft_ms, verify_ms).unwrap()
}

fn view(data: &[f64], rows: usize, cols: usize) -> MatrixView<'_, f64> {
    MatrixView::new("confidences", data, rows, cols).unwrap()
}

fn step(t: usize, s: usize) -> StepTokens {
    StepTokens {
        num_non_draft_tokens: t,
        num_sampling_requests: s,
        max_draft_budget: None,
    }
}

fn assign(data: &[f64], rows: usize, cols: usize, sched: &[i64], budget: usize) -> Vec<i32> {
    let mut out = vec![-1; rows];
    assign_draft_budget(view(data, rows, cols), sched, budget, &mut out).unwrap();
    out
}

#[test]
fn issue_hand_cases() {
    // A cheap first draft, then a cost cliff: only the 0.9 slot pays.
    let t = tables(vec![0.0; 3], vec![1.0, 1.0, 1.0, 1.0, 100.0, 100.0, 100.0]);
    let conf = [0.1, 0.1, 0.9, 0.9];
    let b = choose_draft_budget(view(&conf, 2, 2), &[2, 2], &step(2, 2), &t).unwrap();
    assert_eq!(b, 1);
    // The logits cap bounds the budget.
    let flat = tables(vec![0.0; 3], vec![1.0; 7]);
    let capped = StepTokens {
        max_draft_budget: Some(2),
        ..step(2, 2)
    };
    assert_eq!(
        choose_draft_budget(view(&conf, 2, 2), &[2, 2], &capped, &flat).unwrap(),
        2
    );
    assert_eq!(
        choose_draft_budget(view(&conf, 2, 2), &[2, 2], &step(2, 2), &flat).unwrap(),
        4
    );
    // Ties go to the shallower position, then the lower request.
    assert_eq!(assign(&[1.0; 9], 3, 3, &[3, 3, 3], 4), vec![2, 1, 1]);
    // Capacities bound each request.
    assert_eq!(assign(&[1.0; 24], 3, 8, &[0, 1, 8], 5), vec![0, 1, 4]);
    // More budget than drafts admits everything.
    assert_eq!(assign(&[0.5; 6], 2, 3, &[1, 3], 100), vec![1, 3]);
    assert_eq!(assign(&[0.5; 6], 2, 3, &[1, 3], 0), vec![0, 0]);
}

#[test]
fn plan_reports_expected_tokens_and_cost() {
    let t = tables(vec![0.5, 0.5, 0.5], vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0]);
    let conf = [0.5, 0.5, 1.0, 0.25];
    let mut admitted = [0; 2];
    let plan = plan_verification(
        view(&conf, 2, 2),
        None::<MatrixView<'_, f64>>,
        &[2, 2],
        &step(2, 2),
        &t,
        &mut admitted,
    )
    .unwrap();
    assert_eq!(plan.budget, 3);
    // Survivals 1.0 (r1), 0.5 (r0), then a tie at 0.25, depth 1 both: the lower request wins.
    assert_eq!(admitted, [2, 1]);
    // s + 1.0 + 0.5 + 0.25
    assert_eq!(plan.expected_accepted_tokens, 3.75);
    assert_eq!(plan.predicted_cost_ms, 1.5);
    // Sized from other confidences (all zero): no budget, whatever the current ones say.
    let zeros = [0.0; 4];
    let plan = plan_verification(
        view(&conf, 2, 2),
        Some(view(&zeros, 2, 2)),
        &[2, 2],
        &step(2, 2),
        &t,
        &mut admitted,
    )
    .unwrap();
    assert_eq!((plan.budget, admitted), (0, [0, 0]));
    assert_eq!(plan.expected_accepted_tokens, 2.0);
}

#[test]
fn bad_inputs_name_the_argument() {
    let t = tables(vec![0.0; 3], vec![1.0; 5]);
    let ok = [0.5; 4];
    let check = |conf: &[f64], sched: &[i64], st: StepTokens, argument: &str| {
        let e = choose_draft_budget(view(conf, 2, 2), sched, &st, &t).unwrap_err();
        assert_eq!(e.argument, argument, "{e}");
    };
    check(
        &[0.5, f64::NAN, 0.5, 0.5],
        &[2, 2],
        step(0, 0),
        "confidences",
    );
    check(
        &[0.5, f64::INFINITY, 0.5, 0.5],
        &[2, 2],
        step(0, 0),
        "confidences",
    );
    check(&[0.5, 1.5, 0.5, 0.5], &[2, 2], step(0, 0), "confidences");
    check(&[0.5, -0.1, 0.5, 0.5], &[2, 2], step(0, 0), "confidences");
    check(&ok, &[2, -1], step(0, 0), "scheduled_drafts");
    check(&ok, &[2, 3], step(0, 0), "scheduled_drafts");
    check(&ok, &[2], step(0, 0), "scheduled_drafts");
    check(&ok, &[2, 2], step(1, 0), "num_non_draft_tokens");
    check(&ok, &[2, 2], step(usize::MAX, 0), "num_non_draft_tokens");
    check(&ok, &[2, 2], step(0, 3), "num_sampling_requests");
    let small = tables(vec![0.0; 2], vec![1.0; 5]);
    let e = choose_draft_budget(view(&ok, 2, 2), &[2, 2], &step(0, 0), &small).unwrap_err();
    assert_eq!(e.argument, "confidences");
    assert!(e.message.contains("max_num_reqs"), "{e}");
    let mut short = [0; 1];
    let e = assign_draft_budget(view(&ok, 2, 2), &[2, 2], 1, &mut short).unwrap_err();
    assert_eq!(e.argument, "admitted");
    let other = [0.5; 6];
    let mut out = [7; 2];
    let e = plan_verification(
        view(&ok, 2, 2),
        Some(view(&other, 2, 3)),
        &[2, 2],
        &step(0, 0),
        &t,
        &mut out,
    )
    .unwrap_err();
    assert_eq!(e.argument, "budget_confidences");
    assert_eq!(out, [7, 7], "a rejected call writes nothing");
    assert_eq!(
        BudgetSource::parse("stale").unwrap_err().argument,
        "budget_source"
    );
}

#[test]
fn stateful_planner_remembers_and_rejects_cleanly() {
    let t = tables(vec![0.0; 5], vec![1.0; 20]);
    let mut planner = VerificationPlanner::new(t, 4, 2, BudgetSource::Previous).unwrap();
    assert_eq!(planner.previous_confidences(3).unwrap(), &[1.0, 1.0]);
    let mut admitted = [0; 2];
    let conf = [0.5, 0.25, 0.75, 1.0];
    planner
        .plan(
            &[3, 1],
            view(&conf, 2, 2),
            &[2, 2],
            &step(2, 2),
            &mut admitted,
        )
        .unwrap();
    assert_eq!(planner.previous_confidences(3).unwrap(), &[0.5, 0.25]);
    assert_eq!(planner.previous_confidences(1).unwrap(), &[0.75, 1.0]);
    let before = planner.clone();
    for (slots, sched, argument) in [
        (vec![3, 3], vec![2, 2], "slots"),
        (vec![3, 4], vec![2, 2], "slots"),
        (vec![-1, 0], vec![2, 2], "slots"),
        (vec![0], vec![2, 2], "slots"),
        (vec![0, 1], vec![2, 5], "scheduled_drafts"),
    ] {
        let bad = [0.1, 0.2, 0.3, 0.4];
        let e = planner
            .plan(&slots, view(&bad, 2, 2), &sched, &step(2, 2), &mut admitted)
            .unwrap_err();
        assert_eq!(e.argument, argument);
        for slot in 0..4 {
            assert_eq!(
                planner.previous_confidences(slot).unwrap(),
                before.previous_confidences(slot).unwrap()
            );
        }
    }
    let nan = [0.1, f64::NAN, 0.3, 0.4];
    assert!(planner
        .plan(
            &[0, 1],
            view(&nan, 2, 2),
            &[2, 2],
            &step(2, 2),
            &mut admitted
        )
        .is_err());
    assert_eq!(planner.previous_confidences(1).unwrap(), &[0.75, 1.0]);
    planner.add_request(3).unwrap();
    assert_eq!(planner.previous_confidences(3).unwrap(), &[1.0, 1.0]);
    assert_eq!(planner.add_request(4).unwrap_err().argument, "slot");
    assert_eq!(
        VerificationPlanner::new(tables(vec![0.0], vec![1.0]), 1, 0, BudgetSource::Current)
            .unwrap_err()
            .argument,
        "num_positions"
    );
}

/// Slots that passed the check pass again after one comparison: every other list of slots is
/// checked in full, whatever passed before, and a list that failed fails again.
#[test]
fn slots_checked_once_still_reject_every_bad_list() {
    let t = tables(vec![0.0; 5], vec![1.0; 20]);
    let mut planner = VerificationPlanner::new(t, 4, 2, BudgetSource::Previous).unwrap();
    let conf = [0.5, 0.25, 0.75, 1.0];
    let mut admitted = [0; 2];
    let mut plan = |planner: &mut VerificationPlanner, slots: &[i64]| {
        planner
            .plan(
                slots,
                view(&conf, 2, 2),
                &[2, 2],
                &step(2, 2),
                &mut admitted,
            )
            .map(|_| ())
            .map_err(|e| (e.argument, e.to_string()))
    };
    plan(&mut planner, &[0, 1]).unwrap();
    plan(&mut planner, &[0, 1]).unwrap();
    for (bad, message) in [
        (vec![1i64, 1], "slots: [1] = 1 appears twice"),
        (vec![0, 4], "slots: [1] = 4 is outside 0..4"),
        (vec![-1, 0], "slots: [0] = -1 is outside 0..4"),
    ] {
        // The same bad list twice in a row (a failed check is not kept), then the good one.
        for _ in 0..2 {
            assert_eq!(
                plan(&mut planner, &bad),
                Err(("slots", message.to_owned())),
                "{bad:?}"
            );
        }
        plan(&mut planner, &[0, 1]).unwrap();
    }
    // Other slots of the same length pass, and the earlier ones pass again after them.
    plan(&mut planner, &[3, 2]).unwrap();
    plan(&mut planner, &[0, 1]).unwrap();
    // The depth decision shares the check: bad slots after good ones, good after bad.
    let tables = CostTables::new(vec![0.0, 1.0, 1.0, 1.0, 1.0], vec![1.0; 20])
        .unwrap()
        .with_drafter(crate::cost_tables::DrafterKind::Autoregressive, 2)
        .unwrap();
    let mut planner = VerificationPlanner::new(tables, 4, 2, BudgetSource::Previous).unwrap();
    let mut depths = [0; 2];
    let mut depth = |planner: &mut VerificationPlanner, slots: &[i64]| {
        planner
            .choose_draft_depth(slots, &[2, 2], &step(2, 2), DepthMode::Batch, &mut depths)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    depth(&mut planner, &[2, 3]).unwrap();
    assert_eq!(
        depth(&mut planner, &[3, 3]),
        Err("slots: [1] = 3 appears twice".to_owned())
    );
    assert_eq!(
        depth(&mut planner, &[3, 3]),
        Err("slots: [1] = 3 appears twice".to_owned())
    );
    depth(&mut planner, &[2, 3]).unwrap();
    // A copy checks its own slots.
    let mut copy = planner.clone();
    assert_eq!(
        depth(&mut copy, &[2, 2]),
        Err("slots: [1] = 2 appears twice".to_owned())
    );
}

#[test]
fn stateful_budget_reads_the_previous_step() {
    // Flat costs: the budget is every draft with a positive sizing survival.
    let t = tables(vec![0.0; 3], vec![1.0; 9]);
    let mut previous = VerificationPlanner::new(t.clone(), 2, 2, BudgetSource::Previous).unwrap();
    let mut current = VerificationPlanner::new(t, 2, 2, BudgetSource::Current).unwrap();
    let low = [0.0; 4];
    let high = [1.0; 4];
    let mut out = [0; 2];
    // First step: previous planner sees fresh slots (1.0), so it budgets all 4.
    let p = previous
        .plan(&[0, 1], view(&low, 2, 2), &[2, 2], &step(2, 2), &mut out)
        .unwrap();
    assert_eq!(p.budget, 4);
    let c = current
        .plan(&[0, 1], view(&low, 2, 2), &[2, 2], &step(2, 2), &mut out)
        .unwrap();
    assert_eq!(c.budget, 0);
    // Second step: the previous planner now remembers the zeros.
    let p = previous
        .plan(&[0, 1], view(&high, 2, 2), &[2, 2], &step(2, 2), &mut out)
        .unwrap();
    assert_eq!(p.budget, 0);
    let c = current
        .plan(&[0, 1], view(&high, 2, 2), &[2, 2], &step(2, 2), &mut out)
        .unwrap();
    assert_eq!((c.budget, out), (4, [2, 2]));
}

/// Every allocation `a_r ≤ scheduled[r]`; returns, per total `b`, the best sum of prefix
/// survivals (exact on dyadic inputs).
fn best_sums(conf: &[f64], cols: usize, sched: &[usize]) -> Vec<f64> {
    let total: usize = sched.iter().sum();
    let mut best = vec![f64::NEG_INFINITY; total + 1];
    let prefix: Vec<Vec<f64>> = sched
        .iter()
        .enumerate()
        .map(|(r, &n)| {
            let mut sums = vec![0.0];
            let mut s = 1.0;
            let mut acc = 0.0;
            for k in 0..n {
                s *= conf[r * cols + k];
                acc += s;
                sums.push(acc);
            }
            sums
        })
        .collect();
    let mut alloc = vec![0usize; sched.len()];
    loop {
        let b: usize = alloc.iter().sum();
        let sum: f64 = alloc.iter().enumerate().map(|(r, &a)| prefix[r][a]).sum();
        best[b] = best[b].max(sum);
        let mut r = 0;
        while r < alloc.len() && alloc[r] == sched[r] {
            alloc[r] = 0;
            r += 1;
        }
        if r == alloc.len() {
            return best;
        }
        alloc[r] += 1;
    }
}

fn dyadic_case() -> impl Strategy<Value = (usize, usize, Vec<f64>, Vec<usize>)> {
    (1usize..4, 1usize..4).prop_flat_map(|(rows, cols)| {
        (
            Just(rows),
            Just(cols),
            prop::collection::vec((0u32..=8).prop_map(|n| f64::from(n) / 8.0), rows * cols),
            prop::collection::vec(0usize..=cols, rows),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The budget is the first maximiser over every b and every prefix allocation; the
    /// assignment attains the best sum for its budget and is a prefix within capacities.
    #[test]
    fn budget_and_assignment_match_brute_force(
        (rows, cols, conf, sched) in dyadic_case(),
        s_seed in 0usize..4,
        draft in 0u32..4,
        verify_seed in prop::collection::vec(1u32..12, 13),
        cap in prop::option::of(0usize..10),
    ) {
        let total: usize = sched.iter().sum();
        let s = s_seed % (rows + 1);
        let t = rows;
        let verify: Vec<f64> = verify_seed.iter().map(|&v| f64::from(v) / 2.0).collect();
        let ct = tables(vec![f64::from(draft); rows + 1], verify.clone());
        let sched_i: Vec<i64> = sched.iter().map(|&n| n as i64).collect();
        let st = StepTokens { max_draft_budget: cap, ..step(t, s) };
        let budget = choose_draft_budget(view(&conf, rows, cols), &sched_i, &st, &ct).unwrap();

        let sums = best_sums(&conf, cols, &sched);
        let limit = cap.map_or(total, |c| c.min(total));
        let mut expected = 0;
        let ratio = |b: usize| (s as f64 + sums[b]) / (f64::from(draft) + verify[t + b]);
        for b in 1..=limit {
            if ratio(b) > ratio(expected) {
                expected = b;
            }
        }
        prop_assert_eq!(budget, expected);

        for b in 0..=total + 1 {
            let admitted = assign(&conf, rows, cols, &sched_i, b);
            let granted: usize = admitted.iter().map(|&a| a as usize).sum();
            prop_assert_eq!(granted, b.min(total));
            let mut got = 0.0;
            for r in 0..rows {
                prop_assert!(admitted[r] >= 0 && admitted[r] as usize <= sched[r]);
                let mut sv = 1.0;
                for k in 0..admitted[r] as usize {
                    sv *= conf[r * cols + k];
                    got += sv;
                }
            }
            prop_assert_eq!(got, sums[b.min(total)]);
        }
    }

    /// The assignment equals the explicit rank order: survival desc, depth asc, request asc.
    #[test]
    fn assignment_follows_the_tie_order(
        rows in 1usize..40,
        cols in 1usize..9,
        numerators in prop::collection::vec(0u32..=4, 360),
        sched_seed in prop::collection::vec(0usize..9, 40),
        budget_seed in 0usize..400,
    ) {
        let conf: Vec<f64> = (0..rows * cols).map(|i| f64::from(numerators[i]) / 4.0).collect();
        let sched: Vec<i64> = (0..rows).map(|r| (sched_seed[r] % (cols + 1)) as i64).collect();
        let total: usize = sched.iter().map(|&n| n as usize).sum();
        let budget = budget_seed % (total + 2);
        let mut slots = Vec::new();
        for r in 0..rows {
            let mut s = 1.0;
            for k in 0..sched[r] as usize {
                s *= conf[r * cols + k];
                slots.push((s, k, r));
            }
        }
        slots.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut expected = vec![0i32; rows];
        for &(_, _, r) in slots.iter().take(budget) {
            expected[r] += 1;
        }
        prop_assert_eq!(assign(&conf, rows, cols, &sched, budget), expected.clone());
        // The plan's assignment agrees when handed the same budget via a flat table.
        let ct = tables(vec![0.0; rows + 1], vec![1.0; total + 1]);
        let mut out = vec![0; rows];
        let plan = plan_verification(
            view(&conf, rows, cols), None::<MatrixView<'_, f64>>, &sched,
            &StepTokens { max_draft_budget: Some(budget), ..step(0, 0) }, &ct, &mut out,
        ).unwrap();
        let mut expected_plan = vec![0i32; rows];
        for &(_, _, r) in slots.iter().take(plan.budget) {
            expected_plan[r] += 1;
        }
        prop_assert_eq!(out, expected_plan);
    }
}

#[test]
fn a_bad_value_gone_when_read_again_is_a_buffer_changed_error() {
    // `probability_error` runs only after the survivals saw a value outside [0, 1]; when its
    // second read finds none, another thread rewrote the buffer meanwhile.
    let conf = [0.5, 0.25];
    let view = MatrixView::new("confidences", &conf, 1, 2).unwrap();
    let err = super::engine::probability_error("confidences", view);
    assert_eq!(
        (err.kind, err.argument),
        (crate::ErrorKind::BufferChanged, "confidences")
    );
    let bad = [0.5, 1.25];
    let view = MatrixView::new("confidences", &bad, 1, 2).unwrap();
    assert_eq!(
        super::engine::probability_error("confidences", view).kind,
        crate::ErrorKind::Value
    );
}

/// Every scheduled count in `0..=K` passes the range check and every other one, at either end
/// of `i64`, is named in the error, wherever it sits among valid counts.
#[test]
fn counts_outside_zero_to_k_are_refused_by_value() {
    let t = tables(vec![0.0; 5], vec![1.0; 64]);
    let conf = [0.5; 12];
    let edges = [
        i64::MIN,
        i64::MIN + 1,
        -2,
        -1,
        0,
        1,
        2,
        3,
        4,
        5,
        i64::MAX - 1,
        i64::MAX,
    ];
    for n in edges {
        for at in 0..4 {
            let mut counts = [3i64; 4];
            counts[at] = n;
            let got = choose_draft_budget(view(&conf, 4, 3), &counts, &step(4, 4), &t);
            if (0..=3).contains(&n) {
                assert!(got.is_ok(), "{n} at {at}: {got:?}");
            } else {
                let err = got.unwrap_err();
                assert_eq!(err.argument, "scheduled_drafts");
                assert!(err
                    .to_string()
                    .contains(&format!("[{at}] = {n} is outside 0..=3")));
            }
        }
    }
}
