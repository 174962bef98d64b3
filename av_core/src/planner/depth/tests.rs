//! Unit tests of the drafting-depth decision.

use proptest::prelude::*;

use crate::cost_tables::{CostTables, DrafterKind};
use crate::planner::{
    choose_draft_depth, BudgetSource, DepthMode, Exploration, StepTokens, VerificationPlanner,
};
use crate::MatrixView;

/// The first maximum of `e / c` over candidates in order, compared as quotients.
fn first_max(candidates: &[(f64, f64)]) -> usize {
    let mut best = 0;
    for (i, &(e, c)) in candidates.iter().enumerate() {
        if e / c > candidates[best].0 / candidates[best].1 {
            best = i;
        }
    }
    best
}

fn survivals(conf: &[f64], cols: usize) -> Vec<f64> {
    conf.chunks(cols)
        .flat_map(|row| {
            row.iter().scan(1.0, |acc, &p| {
                *acc *= p;
                Some(*acc)
            })
        })
        .collect()
}

/// Batch mode by brute force: every depth, every budget, sorted sums.
fn brute_batch(
    conf: &[f64],
    cols: usize,
    caps: &[usize],
    step: &StepTokens,
    tables: &CostTables,
) -> (usize, f64) {
    let surv = survivals(conf, cols);
    let (t, s) = (step.num_non_draft_tokens, step.num_sampling_requests as f64);
    let deepest = caps.iter().copied().max().unwrap_or(0);
    let mut per_depth = vec![(s, tables.verify_ms()[t])];
    for d in 1..=deepest {
        let sched: Vec<usize> = caps.iter().map(|&c| c.min(d)).collect();
        let mut values: Vec<f64> = sched
            .iter()
            .enumerate()
            .flat_map(|(r, &n)| surv[r * cols..r * cols + n].to_vec())
            .collect();
        values.sort_by(|a, b| b.total_cmp(a));
        let limit = step
            .max_draft_budget
            .map_or(values.len(), |c| c.min(values.len()));
        let draft = tables.step_draft_cost_ms(&sched, &mut Vec::new()).unwrap();
        let mut e = s;
        let mut options = vec![(s, draft + tables.verify_ms()[t])];
        for (b, v) in values[..limit].iter().enumerate() {
            e += v;
            options.push((e, draft + tables.verify_ms()[t + b + 1]));
        }
        per_depth.push(options[first_max(&options)]);
    }
    let d = first_max(&per_depth);
    (d, per_depth[d].0 / per_depth[d].1)
}

/// Batch mode over rows of `cols` confidences against [`brute_batch`]: the same ratio, the
/// deepest depth drafted, and each request's depth.
fn batch_matches_brute_force(
    conf: &[f64],
    cols: usize,
    caps: &[usize],
    step: &StepTokens,
    tables: &CostTables,
) -> Result<(), TestCaseError> {
    let rows = caps.len();
    let caps_i: Vec<i64> = caps.iter().map(|&c| c as i64).collect();
    let mut depths = vec![0; rows];
    let view = MatrixView::new("c", conf, rows, cols).unwrap();
    let plan =
        choose_draft_depth(view, &caps_i, step, tables, DepthMode::Batch, &mut depths).unwrap();
    let (d, ratio) = brute_batch(conf, cols, caps, step, tables);
    let got = plan.expected_accepted_tokens / plan.predicted_cost_ms;
    prop_assert!((got - ratio).abs() <= 1e-12 * ratio, "{got} vs {ratio}");
    prop_assert_eq!(
        plan.max_depth,
        depths.iter().copied().max().unwrap_or(0) as usize
    );
    let expected: Vec<i32> = caps.iter().map(|&c| c.min(d) as i32).collect();
    prop_assert_eq!(depths, expected);
    Ok(())
}

fn tables_for(kind: DrafterKind, cols: usize, rows: usize, verify: Vec<f64>) -> CostTables {
    let draft: Vec<f64> = (0..=rows).map(|r| 1.0 + r as f64 / 4.0).collect();
    CostTables::new(draft, verify)
        .unwrap()
        .with_drafter(kind, cols)
        .unwrap()
}

/// Tables of these drafting, verification and drafting-by-depth costs.
fn priced_by_depth(draft: Vec<f64>, verify: Vec<f64>, depth_ms: Vec<f64>) -> CostTables {
    CostTables::new(draft, verify)
        .unwrap()
        .with_draft_depth(depth_ms)
        .unwrap()
}

#[test]
fn depth_zero_full_and_in_between() {
    // Autoregressive, 1 ms per position at full depth 4 for 2 requests; flat verification.
    let tables = CostTables::new(vec![0.0, 4.0, 4.0], vec![6.0; 11])
        .unwrap()
        .with_drafter(DrafterKind::Autoregressive, 4)
        .unwrap();
    let step = StepTokens {
        num_non_draft_tokens: 2,
        num_sampling_requests: 2,
        max_draft_budget: None,
    };
    let mut depths = [9; 2];
    // Survivals .9, .45, .09, .009: the first two positions pay for their 1 ms passes
    // (ratio (2 + 2.7) / 8 beats 2/6 and (2 + 2.88)/9), the third does not.
    let conf = [0.9, 0.5, 0.2, 0.1, 0.9, 0.5, 0.2, 0.1];
    let view = MatrixView::new("c", &conf, 2, 4).unwrap();
    let plan =
        choose_draft_depth(view, &[4, 4], &step, &tables, DepthMode::Batch, &mut depths).unwrap();
    assert_eq!(depths, [2, 2]);
    assert_eq!(plan.max_depth, 2);
    assert_eq!(plan.drafts, 4);
    assert_eq!(plan.budget, 4);
    assert!((plan.expected_accepted_tokens - (2.0 + 2.0 * 1.35)).abs() < 1e-12);
    assert_eq!(plan.predicted_cost_ms, 2.0 + 6.0);
    // Capped requests never draft past their cap; a cap of 0 never drafts.
    choose_draft_depth(view, &[1, 0], &step, &tables, DepthMode::Batch, &mut depths).unwrap();
    assert_eq!(depths, [1, 0]);
    // A block drafter pays its pass once: all four positions are worth it.
    let block = CostTables::new(vec![0.0, 4.0, 4.0], vec![6.0; 11])
        .unwrap()
        .with_drafter(DrafterKind::Parallel, 4)
        .unwrap();
    choose_draft_depth(view, &[4, 4], &step, &block, DepthMode::Batch, &mut depths).unwrap();
    assert_eq!(depths, [4, 4]);
}

#[test]
fn per_request_depth_follows_each_request() {
    // Each request in the drafter's batch adds 1 ms at full depth.
    let tables = CostTables::new(vec![0.0, 1.0, 2.0], vec![6.0; 11])
        .unwrap()
        .with_drafter(DrafterKind::Autoregressive, 4)
        .unwrap();
    let step = StepTokens {
        num_non_draft_tokens: 2,
        num_sampling_requests: 2,
        max_draft_budget: None,
    };
    // Request 0 is confident, request 1 hopeless.
    let conf = [0.99, 0.99, 0.99, 0.99, 0.01, 0.5, 0.5, 0.5];
    let view = MatrixView::new("c", &conf, 2, 4).unwrap();
    let mut depths = [0; 2];
    let plan = choose_draft_depth(
        view,
        &[4, 4],
        &step,
        &tables,
        DepthMode::PerRequest,
        &mut depths,
    )
    .unwrap();
    assert_eq!(depths, [4, 0]);
    assert_eq!(plan.drafts, 4);
    // The batch mode must draft request 1 as deep as request 0.
    choose_draft_depth(view, &[4, 4], &step, &tables, DepthMode::Batch, &mut depths).unwrap();
    assert_eq!(depths, [4, 4]);
}

#[test]
fn errors_name_the_argument_and_leave_depths() {
    let plain = CostTables::new(vec![0.0; 3], vec![1.0; 9]).unwrap();
    let step = StepTokens {
        num_non_draft_tokens: 2,
        num_sampling_requests: 2,
        max_draft_budget: None,
    };
    let conf = [0.5; 4];
    let view = MatrixView::new("c", &conf, 2, 2).unwrap();
    let mut depths = [7; 2];
    let err = choose_draft_depth(view, &[2, 2], &step, &plain, DepthMode::Batch, &mut depths)
        .unwrap_err();
    assert_eq!(err.argument, "cost_tables");
    let shallow = plain
        .clone()
        .with_drafter(DrafterKind::Parallel, 1)
        .unwrap();
    let err = choose_draft_depth(
        view,
        &[2, 2],
        &step,
        &shallow,
        DepthMode::Batch,
        &mut depths,
    )
    .unwrap_err();
    assert_eq!(err.argument, "cost_tables");
    // A table deeper than the confidences would misprice full depth: refused as well, by
    // the planner, the stateless plan and the stateful planner's constructor.
    let deep = plain
        .clone()
        .with_drafter(DrafterKind::Parallel, 3)
        .unwrap();
    let err =
        choose_draft_depth(view, &[2, 2], &step, &deep, DepthMode::Batch, &mut depths).unwrap_err();
    assert_eq!(err.argument, "cost_tables");
    let none = None::<MatrixView<'_, f64>>;
    let err = crate::planner::plan_verification(view, none, &[2, 2], &step, &deep, &mut [0; 2])
        .unwrap_err();
    assert_eq!(err.argument, "cost_tables");
    let err = VerificationPlanner::new(deep, 4, 2, BudgetSource::Previous).unwrap_err();
    assert_eq!(err.argument, "cost_tables");
    let tables = plain.with_drafter(DrafterKind::Parallel, 2).unwrap();
    for (caps, argument) in [([3i64, 0], "max_depths"), ([-1, 0], "max_depths")] {
        let err = choose_draft_depth(view, &caps, &step, &tables, DepthMode::Batch, &mut depths)
            .unwrap_err();
        assert_eq!(err.argument, argument);
    }
    let err =
        choose_draft_depth(view, &[2, 2], &step, &tables, DepthMode::Batch, &mut [0]).unwrap_err();
    assert_eq!(err.argument, "depths");
    let bad = [0.5, 1.5, 0.5, 0.5];
    let err = choose_draft_depth(
        MatrixView::new("c", &bad, 2, 2).unwrap(),
        &[2, 2],
        &step,
        &tables,
        DepthMode::Batch,
        &mut depths,
    )
    .unwrap_err();
    assert_eq!(err.argument, "confidences");
    assert_eq!(depths, [7, 7]);
}

#[test]
fn stateful_depth_reads_remembered_rows_and_changes_nothing() {
    let tables = CostTables::new(vec![0.0, 4.0, 4.0, 4.0], vec![10.0; 16])
        .unwrap()
        .with_drafter(DrafterKind::Autoregressive, 3)
        .unwrap();
    let mut planner = VerificationPlanner::new(tables, 4, 3, BudgetSource::Previous).unwrap();
    planner.set_exploration(Exploration::OFF);
    let step = StepTokens {
        num_non_draft_tokens: 2,
        num_sampling_requests: 2,
        max_draft_budget: None,
    };
    let conf = [0.9, 0.1, 0.1, 0.9, 0.1, 0.1];
    let view = MatrixView::new("c", &conf, 2, 3).unwrap();
    planner
        .plan(&[1, 3], view, &[3, 3], &step, &mut [0; 2])
        .unwrap();
    let before = planner.to_bytes();
    let mut depths = [0; 2];
    planner
        .choose_draft_depth(&[1, 3], &[3, 3], &step, DepthMode::Batch, &mut depths)
        .unwrap();
    assert_eq!(depths, [1, 1]);
    assert_eq!(planner.to_bytes(), before);
    // A shallower step only overwrites the drafted positions.
    let next = [0.2, 0.0, 0.0, 0.2, 0.0, 0.0];
    let view = MatrixView::new("c", &next, 2, 3).unwrap();
    planner
        .plan(&[1, 3], view, &[1, 1], &step, &mut [0; 2])
        .unwrap();
    assert_eq!(planner.previous_confidences(1).unwrap(), [0.2, 0.1, 0.1]);
    // Errors: duplicates, out of range, length; none changes the state.
    let before = planner.to_bytes();
    for (slots, caps, argument) in [
        (&[1i64, 1][..], &[3i64, 3][..], "slots"),
        (&[1, 4], &[3, 3], "slots"),
        (&[1, 2], &[3], "max_depths"),
    ] {
        let err = planner
            .choose_draft_depth(slots, caps, &step, DepthMode::Batch, &mut depths)
            .unwrap_err();
        assert_eq!(err.argument, argument);
    }
    // The marks were reset: slot 1 is usable again.
    planner
        .choose_draft_depth(&[1, 2], &[3, 3], &step, DepthMode::Batch, &mut depths)
        .unwrap();
    assert_eq!(planner.to_bytes(), before);
    // Persistence keeps the depth table.
    let back = VerificationPlanner::from_bytes(&before).unwrap();
    assert_eq!(back.cost_tables(), planner.cost_tables());
}

#[test]
fn exploration_steps_draft_whole_blocks_for_explorers_only() {
    // Drafting is far too expensive: without exploration nothing is ever drafted.
    let tables = CostTables::new(vec![100.0; 65], vec![10.0; 64 * 4 + 65])
        .unwrap()
        .with_drafter(DrafterKind::Autoregressive, 4)
        .unwrap();
    let mut planner = VerificationPlanner::new(tables, 64, 4, BudgetSource::Previous).unwrap();
    planner.set_exploration(Exploration::new("exploration", 0.1, 3).unwrap());
    let step = StepTokens {
        num_non_draft_tokens: 64,
        num_sampling_requests: 64,
        max_draft_budget: None,
    };
    let slots: Vec<i64> = (0..64).collect();
    let conf = vec![0.01; 64 * 4];
    let (mut exploring_steps, mut explorers) = (0, 0);
    for _ in 0..200 {
        let mut depths = vec![0; 64];
        planner
            .choose_draft_depth(&slots, &[4; 64], &step, DepthMode::Batch, &mut depths)
            .unwrap();
        assert!(depths.iter().all(|&d| d == 0 || d == 4));
        let sched: Vec<i64> = depths.iter().map(|&d| i64::from(d)).collect();
        let view = MatrixView::new("c", &conf, 64, 4).unwrap();
        let mut admitted = vec![0; 64];
        planner
            .plan(&slots, view, &sched, &step, &mut admitted)
            .unwrap();
        // The budget alone admits nothing: what is verified is exactly the explorers'
        // whole blocks, and only explorers drafted.
        assert_eq!(admitted, depths);
        let n = depths.iter().filter(|&&d| d == 4).count();
        exploring_steps += usize::from(n > 0);
        explorers += n;
    }
    assert!((5..50).contains(&exploring_steps), "{exploring_steps}");
    // About 6.4 explorers in an exploration step, far fewer than the batch.
    assert!(explorers < 20 * exploring_steps, "{explorers}");
}

#[test]
fn a_depth_only_engine_draws_what_a_planning_engine_draws() {
    // Drafting is far too expensive: only exploration drafts. Engine A plans verification with
    // the planner; engine B plans it elsewhere (remember + count_step). Both make the same
    // decisions every step, and these are exactly the draws `coming_explorers` reported.
    let tables = CostTables::new(vec![100.0; 33], vec![10.0; 32 * 4 + 33])
        .unwrap()
        .with_drafter(DrafterKind::Autoregressive, 4)
        .unwrap();
    let mut a = VerificationPlanner::new(tables, 32, 4, BudgetSource::Previous).unwrap();
    a.set_exploration(Exploration::new("exploration", 0.2, 11).unwrap());
    let mut b = a.clone();
    let step = StepTokens {
        num_non_draft_tokens: 32,
        num_sampling_requests: 32,
        max_draft_budget: None,
    };
    let slots: Vec<i64> = (0..32).collect();
    let caps: Vec<i64> = (0..32).map(|r| r % 5).collect(); // caps 0..=4
    let conf = vec![0.01; 32 * 4];
    let (mut whole_steps, mut explorers_seen, mut trials, mut seen) = (0, 0, 0, Vec::new());
    for _ in 0..400 {
        let mut explorers = vec![false; 32];
        let whole = b.coming_explorers(&slots, &mut explorers).unwrap();
        let (mut da, mut db) = (vec![0; 32], vec![0; 32]);
        a.choose_draft_depth(&slots, &caps, &step, DepthMode::PerRequest, &mut da)
            .unwrap();
        b.choose_draft_depth(&slots, &caps, &step, DepthMode::PerRequest, &mut db)
            .unwrap();
        assert_eq!(da, db);
        // The batch drafts nothing, so only an exploration step's explorers draft: their caps.
        for r in 0..32 {
            let want = if whole && explorers[r] { caps[r] } else { 0 };
            assert_eq!(i64::from(db[r]), want, "request {r}");
        }
        let sched: Vec<i64> = db.iter().map(|&d| i64::from(d)).collect();
        let view = MatrixView::new("c", &conf, 32, 4).unwrap();
        a.plan(&slots, view, &sched, &step, &mut [0; 32]).unwrap();
        b.remember(&slots, view, &sched).unwrap();
        b.count_step();
        assert_eq!(a.to_bytes(), b.to_bytes()); // the same step count and memory
        whole_steps += usize::from(whole);
        if whole {
            explorers_seen += explorers.iter().filter(|&&e| e).count();
            trials += 32;
        }
        seen.push(explorers);
    }
    // Rates against the binomial law (ε = 0.2; about 5 standard deviations each way).
    assert!((40..=120).contains(&whole_steps), "{whole_steps}");
    let rate = explorers_seen as f64 / trials as f64;
    assert!((0.12..0.28).contains(&rate), "{rate}");
    // Without count_step the draws would repeat: they must not.
    assert!(seen.windows(2).filter(|w| w[0] == w[1]).count() < 5);
}

#[test]
fn explorers_draft_as_deep_as_the_batch_in_per_request_mode() {
    // Request 0 is confident, the others hopeless; drafting is cheap per position.
    let tables = CostTables::new(vec![0.0; 65], vec![10.0; 64 * 4 + 65])
        .unwrap()
        .with_drafter(DrafterKind::Autoregressive, 4);
    let tables = CostTables::new(
        (0..=64).map(|r| r as f64 * 0.1).collect(),
        tables.unwrap().verify_ms().to_vec(),
    )
    .unwrap()
    .with_drafter(DrafterKind::Autoregressive, 4)
    .unwrap();
    let mut planner = VerificationPlanner::new(tables, 64, 4, BudgetSource::Previous).unwrap();
    planner.set_exploration(Exploration::new("exploration", 0.3, 1).unwrap());
    let step = StepTokens {
        num_non_draft_tokens: 64,
        num_sampling_requests: 64,
        max_draft_budget: None,
    };
    let slots: Vec<i64> = (0..64).collect();
    let mut conf = vec![0.001; 64 * 4];
    conf[..4].fill(0.99);
    let view = MatrixView::new("c", &conf, 64, 4).unwrap();
    planner
        .plan(&slots, view, &[4; 64], &step, &mut vec![0; 64])
        .unwrap();
    let mut widened = 0;
    for _ in 0..20 {
        let mut depths = vec![0; 64];
        let plan = planner
            .choose_draft_depth(&slots, &[4; 64], &step, DepthMode::PerRequest, &mut depths)
            .unwrap();
        assert_eq!(
            plan.drafts,
            depths.iter().map(|&d| d as usize).sum::<usize>()
        );
        if depths[1..].iter().all(|&d| d == 4) {
            continue; // an exploration step
        }
        assert_eq!(depths[0], 4);
        assert!(depths[1..].iter().all(|&d| d == 0 || d == 4));
        widened += depths[1..].iter().filter(|&&d| d == 4).count();
        let sched: Vec<i64> = depths.iter().map(|&d| i64::from(d)).collect();
        planner
            .plan(&slots, view, &sched, &step, &mut vec![0; 64])
            .unwrap();
    }
    assert!(widened > 0);
}

#[test]
fn rejected_plans_change_nothing_and_explorers_are_priced_by_depth() {
    let tables = CostTables::new(vec![0.0, 8.0, 8.0], vec![1.0; 16])
        .unwrap()
        .with_drafter(DrafterKind::Autoregressive, 4)
        .unwrap();
    let mut planner = VerificationPlanner::new(tables, 4, 4, BudgetSource::Previous).unwrap();
    planner.set_exploration(Exploration::new("exploration", 1.0, 0).unwrap()); // every request explores
    let conf = [0.5; 8];
    let view = MatrixView::new("c", &conf, 2, 4).unwrap();
    let step = StepTokens {
        num_non_draft_tokens: 2,
        num_sampling_requests: 2,
        max_draft_budget: None,
    };
    let before = planner.to_bytes();
    let bad_step = StepTokens {
        num_sampling_requests: 3,
        ..step
    };
    for (slots, step) in [([1i64, 1], &step), ([1, 9], &step), ([1, 2], &bad_step)] {
        assert!(planner
            .plan(&slots, view, &[1, 1], step, &mut [0; 2])
            .is_err());
        assert_eq!(planner.to_bytes(), before, "{slots:?}");
    }
    // Depth 1 for both: explorers verify their whole (one-position) blocks, and drafting is
    // priced at one pass of the four, not at full depth.
    let plan = planner
        .plan(&[1, 2], view, &[1, 1], &step, &mut [0; 2])
        .unwrap();
    assert_eq!(plan.budget, 2);
    assert_eq!(plan.predicted_cost_ms, 8.0 / 4.0 + 1.0);
}

#[test]
fn remember_stores_drafted_positions_and_rejects_without_change() {
    let tables = CostTables::new(vec![0.0; 5], vec![1.0; 16]).unwrap();
    let mut planner = VerificationPlanner::new(tables, 4, 3, BudgetSource::Previous).unwrap();
    let conf = [0.5, 0.25, f64::NAN, 0.75, 2.0, -1.0];
    let view = MatrixView::new("c", &conf, 2, 3).unwrap();
    planner.remember(&[0, 3], view, &[2, 1]).unwrap();
    assert_eq!(planner.previous_confidences(0).unwrap(), [0.5, 0.25, 1.0]);
    assert_eq!(planner.previous_confidences(3).unwrap(), [0.75, 1.0, 1.0]);
    let before = planner.to_bytes();
    for (slots, sched, argument) in [
        (&[0i64, 0][..], &[1i64, 1][..], "slots"),
        (&[0, 4], &[1, 1], "slots"),
        (&[0], &[1, 1], "slots"),
        (&[0, 1], &[1], "scheduled_drafts"),
        (&[0, 1], &[4, 1], "scheduled_drafts"),
        (&[0, 1], &[3, 1], "confidences"), // the NaN is drafted now
        (&[0, 1], &[1, 2], "confidences"), // so is the 2.0
    ] {
        let err = planner.remember(slots, view, sched).unwrap_err();
        assert_eq!(err.argument, argument, "{slots:?} {sched:?}");
        assert_eq!(planner.to_bytes(), before);
    }
}

proptest! {
    /// On dyadic inputs every sum is exact, so the pruned search must equal brute force.
    #[test]
    fn batch_mode_equals_brute_force(
        rows in 1usize..48,
        cols in 1usize..7,
        numerators in prop::collection::vec(0u32..=8, 200),
        caps_seed in prop::collection::vec(0usize..8, 48),
        parallel in any::<bool>(),
        knee in 0usize..40,
        slope in 0u32..8,
        cap_seed in 0usize..100,
    ) {
        let conf: Vec<f64> =
            (0..rows * cols).map(|i| f64::from(numerators[i % 200]) / 8.0).collect();
        let caps: Vec<usize> = (0..rows).map(|r| caps_seed[r] % (cols + 1)).collect();
        let verify: Vec<f64> = (0..=rows * (cols + 1))
            .map(|t| 4.0 + t.saturating_sub(knee) as f64 * f64::from(slope) / 16.0)
            .collect();
        let kind = if parallel { DrafterKind::Parallel } else { DrafterKind::Autoregressive };
        let tables = tables_for(kind, cols, rows, verify);
        let step = StepTokens {
            num_non_draft_tokens: rows,
            num_sampling_requests: rows - cap_seed % 2,
            max_draft_budget: (cap_seed % 3 == 0).then_some(cap_seed % 17),
        };
        batch_matches_brute_force(&conf, cols, &caps, &step, &tables)?;
    }

    /// Batch mode where deep depths are priced out (verification flat up to a knee, then
    /// steep or one step up; drafting dearer with depth), so the decision stops adding columns once no
    /// deeper depth can reach the best depth so far: still brute force's depth and ratio,
    /// bit for bit on dyadic inputs. Confident first positions and fading later ones, as
    /// an estimator's predictions give, over more than the small-batch cut-off of slots.
    #[test]
    fn batch_mode_that_stops_early_equals_brute_force(
        rows in 65usize..160,
        cols in 3usize..9,
        numerators in prop::collection::vec(0u32..=8, 300),
        first_numerators in prop::collection::vec(5u32..=8, 300),
        knee in 0usize..3,
        steep in 1u32..64,
        draft_step in 0u32..8,
        cap_seed in 0usize..100,
        capped in any::<bool>(),
        step_shape in any::<bool>(),
    ) {
        let conf: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let n = if i % cols < 2 { first_numerators[i % 300] } else { numerators[i % 300] };
                f64::from(n) / 8.0
            })
            .collect();
        let caps: Vec<usize> = (0..rows)
            .map(|r| if capped && r % 7 == 3 { (r + cap_seed) % (cols + 1) } else { cols })
            .collect();
        let flat = (knee + 1) * rows;
        // Steep past the knee, or one step there and flat after it (where a deeper depth
        // can beat a shallower one that pays the step for little).
        let verify: Vec<f64> = (0..=rows * (cols + 2))
            .map(|t| match (step_shape, t > flat) {
                (_, false) => 6.0,
                (true, true) => 6.0 + f64::from(steep) / 4.0,
                (false, true) => 6.0 + (t - flat) as f64 * f64::from(steep) / 256.0,
            })
            .collect();
        let draft: Vec<f64> = (0..=rows).map(|r| 1.0 + r as f64 / 64.0).collect();
        let depth_ms: Vec<f64> =
            (0..=cols).map(|d| d as f64 * (1.0 + f64::from(draft_step) / 4.0)).collect();
        let tables = priced_by_depth(draft, verify, depth_ms);
        let step = StepTokens {
            num_non_draft_tokens: rows,
            num_sampling_requests: rows - cap_seed % 2,
            max_draft_budget: (cap_seed % 5 == 0).then_some(rows * (1 + cap_seed % 3)),
        };
        batch_matches_brute_force(&conf, cols, &caps, &step, &tables)?;
    }

    /// Batch mode under uneven prices, where a depth that is not kept can be followed by one
    /// that wins: drafting costs by depth that jump (up to 64 ms at one depth) and then stay
    /// flat, verification costs that dip (not monotone), step or climb steeply, drafting by
    /// request count that is free or dear, caps that differ by row, and budget caps. Dyadic
    /// inputs (exact sums): brute force's depth and ratio.
    #[test]
    fn batch_mode_under_uneven_prices_equals_brute_force(
        rows in 65usize..200,
        cols in 2usize..13,
        numerators in prop::collection::vec(0u32..=8, 300),
        depth_steps in prop::collection::vec(0usize..5, 12),
        verify_shape in 0u32..4,
        verify_seed in prop::collection::vec(0u32..64, 16),
        draft_unit in 0u32..3,
        caps_seed in prop::collection::vec(0usize..16, 200),
        caps_shape in 0u32..3,
        budget_seed in 0usize..1000,
    ) {
        let conf: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let n = numerators[i % 300];
                // The first position confident, as an estimator's predictions usually are.
                f64::from(if i % cols == 0 { n.max(6) } else { n }) / 8.0
            })
            .collect();
        let caps: Vec<usize> = (0..rows)
            .map(|r| match caps_shape {
                0 => cols,
                1 => caps_seed[r] % (cols + 1),
                _ => if r % 5 == 0 { caps_seed[r] % (cols + 1) } else { cols },
            })
            .collect();
        let tokens = rows * (cols + 2) + 1;
        let verify: Vec<f64> = (0..tokens)
            .map(|t| {
                let base = 6.0 + f64::from(verify_seed[0] % 8) / 4.0;
                match verify_shape {
                    // Dips every few tokens: not monotone.
                    0 => base + (t % 40) as f64 / 16.0 - f64::from(verify_seed[t % 16] % 4) / 4.0,
                    // Steps at powers of two (captured sizes).
                    1 => base + f64::from(t.max(1).ilog2()) * f64::from(verify_seed[1] % 16) / 4.0,
                    // Steep from the start.
                    2 => base + t as f64 * f64::from(1 + verify_seed[2] % 32) / 8.0,
                    // Flat.
                    _ => base,
                }
            })
            .collect();
        let draft: Vec<f64> = (0..=rows)
            .map(|r| f64::from(draft_unit) * (1.0 + r as f64 / 64.0))
            .collect();
        let mut level = 0.0;
        let depth_ms: Vec<f64> = std::iter::once(0.0)
            .chain((0..cols).map(|d| {
                level += [0.0, 0.25, 1.0, 4.0, 64.0][depth_steps[d]];
                level
            }))
            .collect();
        let tables = priced_by_depth(draft, verify, depth_ms);
        let step = StepTokens {
            num_non_draft_tokens: rows,
            num_sampling_requests: rows - budget_seed % 2,
            max_draft_budget: match budget_seed % 4 {
                0 => None,
                1 => Some(budget_seed % 40),
                2 => Some(rows + budget_seed % rows),
                _ => Some(usize::MAX),
            },
        };
        batch_matches_brute_force(&conf, cols, &caps, &step, &tables)?;
    }

    /// Batch mode over survivals crowded into a few buckets, as an estimator's predictions
    /// are when a position's predictions lie close together: each position's confidences
    /// within `width` of its own centre, and the positions past `remembered` at 1.0 (a slot
    /// whose deeper positions were never drafted keeps its first confidences), so one bucket
    /// spans hundreds of budgets. Rows up to a few hundred, K up to 16, verification flat up to
    /// a knee and then climbing: brute force's depth and ratio (not dyadic: the ratio to 1e-12).
    #[test]
    fn batch_mode_over_crowded_survivals_equals_brute_force(
        rows in 65usize..400,
        cols in 2usize..17,
        centres in prop::collection::vec(0.5f64..0.995, 16),
        width_exp in 2i32..6,
        remembered in 1usize..17,
        knee in 0usize..800,
        slope in 1u32..64,
        depth_unit in 0u32..16,
        seed in any::<u64>(),
    ) {
        let mut next = crate::planner::tests::xorshift(seed | 1);
        let width = 10f64.powi(-width_exp);
        let conf: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let j = i % cols;
                if j >= remembered {
                    return 1.0;
                }
                let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
                (centres[j] + (u - 0.5) * width).min(1.0)
            })
            .collect();
        let verify: Vec<f64> = (0..=rows * (cols + 2))
            .map(|t| 6.0 + t.saturating_sub(knee) as f64 * f64::from(slope) / 256.0)
            .collect();
        let draft: Vec<f64> = (0..=rows).map(|r| 1.0 + r as f64 / 64.0).collect();
        let depth_ms: Vec<f64> =
            (0..=cols).map(|d| d as f64 * f64::from(depth_unit) / 4.0).collect();
        let tables = priced_by_depth(draft, verify, depth_ms);
        let step = StepTokens {
            num_non_draft_tokens: rows,
            num_sampling_requests: rows,
            max_draft_budget: None,
        };
        batch_matches_brute_force(&conf, cols, &vec![cols; rows], &step, &tables)?;
    }

    /// Per-request mode: its ratio is the best over the survival-ordered prefixes of the
    /// slots above each depth (each prefix's cost recomputed from scratch), under costs that
    /// climb and under costs that also fall.
    #[test]
    fn per_request_mode_is_the_best_survival_prefix(
        rows in 1usize..16,
        cols in 1usize..6,
        numerators in prop::collection::vec(0u32..=8, 100),
        parallel in any::<bool>(),
        knee in 0usize..30,
        dips in any::<bool>(),
    ) {
        let conf: Vec<f64> =
            (0..rows * cols).map(|i| f64::from(numerators[i % 100]) / 8.0).collect();
        // Climbing past a knee, or also dipping every seventh token (costs that fall).
        let verify: Vec<f64> = (0..=rows * (cols + 1))
            .map(|t| {
                let dip = if dips && t % 7 == 3 { 3.0 } else { 0.0 };
                4.0 + t.saturating_sub(knee) as f64 / 8.0 - dip
            })
            .collect();
        let kind = if parallel { DrafterKind::Parallel } else { DrafterKind::Autoregressive };
        let tables = tables_for(kind, cols, rows, verify);
        let step = StepTokens {
            num_non_draft_tokens: rows,
            num_sampling_requests: rows,
            max_draft_budget: None,
        };
        let caps = vec![cols as i64; rows];
        let mut depths = vec![0; rows];
        let view = MatrixView::new("c", &conf, rows, cols).unwrap();
        let plan = choose_draft_depth(
            view, &caps, &step, &tables, DepthMode::PerRequest, &mut depths,
        ).unwrap();
        let surv = survivals(&conf, cols);
        let mut order: Vec<(f64, usize, usize)> = (0..rows * cols)
            .map(|i| (surv[i], i % cols, i / cols))
            .collect();
        order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut options = vec![(rows as f64, tables.verify_ms()[rows])];
        for d in 1..=cols {
            let allowed: Vec<&(f64, usize, usize)> = order.iter().filter(|o| o.1 < d).collect();
            for n in 1..=allowed.len() {
                let mut depth = vec![0usize; rows];
                for o in &allowed[..n] {
                    depth[o.2] += 1;
                }
                let e = rows as f64 + allowed[..n].iter().map(|o| o.0).sum::<f64>();
                let c = tables.step_draft_cost_ms(&depth, &mut Vec::new()).unwrap()
                    + tables.verify_ms()[rows + n];
                options.push((e, c));
            }
        }
        let pairs = options;
        let best = first_max(&pairs);
        let ratio = pairs[best].0 / pairs[best].1;
        let got = plan.expected_accepted_tokens / plan.predicted_cost_ms;
        prop_assert!((got - ratio).abs() <= 1e-12 * ratio, "{got} vs {ratio}");
        let got_depths: Vec<usize> = depths.iter().map(|&d| d as usize).collect();
        prop_assert_eq!(plan.drafts, got_depths.iter().sum::<usize>());
        prop_assert_eq!(plan.max_depth, *got_depths.iter().max().unwrap());
    }
}
