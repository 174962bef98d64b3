//! The planner's decisions against a frozen copy of the algorithms they were first released
//! with (`tests/planner_oracle/`), bit for bit: budgets, admitted counts, depths, expected tokens,
//! predicted costs, errors, and every remembered confidence of the stateful planner after each
//! call of a random sequence.
//!
//! The production planner is tuned for speed (shared passes, selections instead of bucket
//! histograms, cached survivals); the oracle is the plain version kept as the reference. Both
//! read the same public types (`CostTables`, `MatrixView`, `Error`); the oracle's own
//! `StepTokens`, `DepthMode`, `BudgetSource` and `Exploration` are converted field by field.
//!
//! Workloads cover what changes a decision's bits: ties (dyadic and repeated confidences, where
//! the first maximum and the tie order decide), survivals below a rounding unit of `E` (where
//! the summation order decides), zeros, `-0.0`, subnormals, `K = 1`, `R = 0` and `1`, large `R`,
//! budget caps at 0, at the total and in between, non-monotone and flat cost tables, depth
//! tables of every kind, exploration off, rare and always, both budget sources, float32 and
//! float64 inputs, and invalid calls (whose errors must match too).

#[path = "common/mod.rs"]
mod common;

/// The crate paths the oracle's files were written against, pointing at the public types.
mod matrix {
    pub use av_core::MatrixView;
}
mod cost_tables {
    pub use av_core::cost_tables::*;
}
mod error {
    pub use av_core::{Error, ErrorKind, Result};
}

#[allow(dead_code, clippy::all)]
#[path = "planner_oracle/mod.rs"]
mod oracle;

use av_core::cost_tables::{CostTables, DrafterKind};
use av_core::planner::{self as planner, BudgetSource, DepthMode, Exploration, StepTokens};
use av_core::MatrixView;
use common::Rng;

fn oracle_step(step: &StepTokens) -> oracle::StepTokens {
    oracle::StepTokens {
        num_non_draft_tokens: step.num_non_draft_tokens,
        num_sampling_requests: step.num_sampling_requests,
        max_draft_budget: step.max_draft_budget,
    }
}

fn oracle_mode(mode: DepthMode) -> oracle::DepthMode {
    match mode {
        DepthMode::Batch => oracle::DepthMode::Batch,
        DepthMode::PerRequest => oracle::DepthMode::PerRequest,
    }
}

fn oracle_source(source: BudgetSource) -> oracle::BudgetSource {
    match source {
        BudgetSource::Previous => oracle::BudgetSource::Previous,
        BudgetSource::Current => oracle::BudgetSource::Current,
    }
}

/// A result as comparable bits: the numbers' bit patterns, or the error's kind and text.
fn bits<T: std::fmt::Debug, E: std::borrow::Borrow<av_core::Error>>(
    result: &Result<T, E>,
) -> String {
    match result {
        Ok(value) => format!("{value:?}"),
        Err(error) => {
            let error = error.borrow();
            format!("error {:?}: {error}", error.kind)
        }
    }
}

fn plan_bits(plan: &av_core::Result<planner::VerificationPlan>) -> String {
    bits(&plan.as_ref().map(|p| {
        (
            p.budget,
            p.expected_accepted_tokens.to_bits(),
            p.predicted_cost_ms.to_bits(),
        )
    }))
}

fn oracle_plan_bits(plan: &av_core::Result<oracle::VerificationPlan>) -> String {
    bits(&plan.as_ref().map(|p| {
        (
            p.budget,
            p.expected_accepted_tokens.to_bits(),
            p.predicted_cost_ms.to_bits(),
        )
    }))
}

fn depth_bits(plan: &av_core::Result<planner::DepthPlan>) -> String {
    bits(&plan.as_ref().map(|p| {
        (
            p.max_depth,
            p.drafts,
            p.budget,
            p.expected_accepted_tokens.to_bits(),
            p.predicted_cost_ms.to_bits(),
        )
    }))
}

fn oracle_depth_bits(plan: &av_core::Result<oracle::DepthPlan>) -> String {
    bits(&plan.as_ref().map(|p| {
        (
            p.max_depth,
            p.drafts,
            p.budget,
            p.expected_accepted_tokens.to_bits(),
            p.predicted_cost_ms.to_bits(),
        )
    }))
}

// --- workloads ---------------------------------------------------------------------------------

const WIDTHS: [usize; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24];

/// One confidence of a workload's style.
fn confidence(rng: &mut Rng, style: u64) -> f64 {
    match style {
        // As an estimator predicts them: mostly 0.5–0.99.
        0 => 1.0 - 0.6 * rng.unit() * rng.unit(),
        1 => rng.unit(),
        // Exact binary fractions: every sum is exact, ties are common.
        2 => rng.below(17) as f64 / 16.0,
        3 => [0.0, 0.25, 0.5, 0.75, 1.0][rng.below(5) as usize],
        // Survivals far below a rounding unit of E.
        4 => {
            if rng.below(4) == 0 {
                1.0
            } else {
                10f64.powf(-rng.uniform(1.0, 6.0))
            }
        }
        // Edges.
        5 => [
            0.0,
            -0.0,
            1.0,
            5e-324,
            1e-300,
            0.5,
            1.0 - 1e-16,
            0.999,
            1e-17,
        ][rng.below(9) as usize],
        // Repeated values: ties across requests.
        6 => [0.9, 0.9, 0.9, 0.7][rng.below(4) as usize],
        _ => {
            if rng.below(3) == 0 {
                1.0
            } else {
                rng.uniform(0.95, 1.0)
            }
        }
    }
}

const STYLES: u64 = 8;

fn matrix(rng: &mut Rng, rows: usize, cols: usize) -> Vec<f64> {
    let style = rng.below(STYLES);
    let mixed = rng.below(4) == 0;
    (0..rows * cols)
        .map(|_| {
            let style = if mixed { rng.below(STYLES) } else { style };
            confidence(rng, style)
        })
        .collect()
}

fn counts(rng: &mut Rng, rows: usize, cols: usize) -> Vec<i64> {
    match rng.below(4) {
        0 | 1 => vec![cols as i64; rows],
        2 => (0..rows)
            .map(|_| rng.below(cols as u64 + 1) as i64)
            .collect(),
        _ => (0..rows)
            .map(|_| {
                if rng.below(3) == 0 {
                    0
                } else {
                    cols as i64 - rng.below(2) as i64
                }
            })
            .collect(),
    }
}

/// Random cost tables covering `rows` requests and `tokens` tokens, with or without a depth
/// table of width `cols`.
fn tables(rng: &mut Rng, rows: usize, tokens: usize, cols: usize) -> CostTables {
    let max_reqs = rows + rng.below(3) as usize * rng.below(64) as usize;
    let max_tokens = tokens + rng.below(3) as usize * rng.below(512) as usize;
    let draft_base = [0.0, 0.5, 1.0, 3.0][rng.below(4) as usize];
    let draft_slope = [0.0, 0.001, 0.01][rng.below(3) as usize];
    let draft: Vec<f64> = (0..=max_reqs)
        .map(|r| draft_base + draft_slope * r as f64)
        .collect();
    let verify: Vec<f64> = match rng.below(6) {
        0 => vec![rng.uniform(0.5, 10.0); max_tokens + 1],
        1 => (0..=max_tokens)
            .map(|t| 5.0 + 0.004 * t as f64 + if t > 512 { 1.0 + 0.008 * t as f64 } else { 0.0 })
            .collect(),
        2 => {
            // Captured sizes: a step function.
            let mut level = 6.0;
            (0..=max_tokens)
                .map(|t| {
                    if t.is_power_of_two() {
                        level += 0.25;
                    }
                    level
                })
                .collect()
        }
        3 => {
            // Not monotone: a dip.
            let mut v: Vec<f64> = (0..=max_tokens).map(|t| 2.0 + 0.01 * t as f64).collect();
            let dip = rng.below(max_tokens as u64 + 1) as usize;
            v[dip] = 0.5;
            v
        }
        4 => (0..=max_tokens)
            .map(|t| f64::from(1 + (t as u32 % 7)) / 4.0 + t as f64 / 8.0)
            .collect(),
        _ => {
            let capture = [1usize, 2, 4, 8, 16, 32, 64, 128, 256, 512];
            let mut points: Vec<(f64, f64)> = capture
                .iter()
                .map(|&n| (n as f64, 6.0 + 0.004 * n as f64))
                .collect();
            points.extend(
                [768usize, 1024, 2048, 4096]
                    .iter()
                    .map(|&n| (n as f64, 7.0 + 0.012 * n as f64)),
            );
            let d: Vec<(f64, f64)> = [1usize, 8, 64, 256]
                .iter()
                .map(|&n| (n as f64, 1.0 + 0.002 * n as f64))
                .collect();
            let tables =
                CostTables::from_curves(&d, &points, max_reqs.max(1), max_tokens.max(1), 512)
                    .unwrap();
            return with_depth(rng, tables, cols);
        }
    };
    with_depth(rng, CostTables::new(draft, verify).unwrap(), cols)
}

fn with_depth(rng: &mut Rng, tables: CostTables, cols: usize) -> CostTables {
    match rng.below(4) {
        0 => tables,
        1 => tables.with_drafter(DrafterKind::Parallel, cols).unwrap(),
        2 => tables
            .with_drafter(DrafterKind::Autoregressive, cols)
            .unwrap(),
        _ => {
            let mut shape = vec![0.0];
            let mut level = 0.0;
            for _ in 0..cols {
                level += [0.0, 0.5, 1.0, 2.5][rng.below(4) as usize];
                shape.push(level);
            }
            tables.with_draft_depth(shape).unwrap()
        }
    }
}

fn step(rng: &mut Rng, rows: usize, total: usize) -> StepTokens {
    let t = [rows, 0, rows + rng.below(300) as usize][rng.below(3) as usize];
    let s = [rows, 0, rng.below(rows as u64 + 1) as usize][rng.below(3) as usize];
    let cap = match rng.below(6) {
        0 => Some(0),
        1 => Some(total),
        2 => Some(rng.below(total as u64 + 2) as usize),
        3 => Some(usize::MAX),
        _ => None,
    };
    StepTokens {
        num_non_draft_tokens: t,
        num_sampling_requests: s,
        max_draft_budget: cap,
    }
}

fn rows_for(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0 => rng.below(2) as usize,
        1..=4 => 1 + rng.below(64) as usize,
        5..=8 => 64 + rng.below(400) as usize,
        _ => 1000 + rng.below(3000) as usize,
    }
}

fn to_f32(values: &[f64]) -> Vec<f32> {
    values.iter().map(|&v| v as f32).collect()
}

/// Occasionally spoils one entry, so the errors are compared too.
fn spoil(rng: &mut Rng, values: &mut [f64], counts: &mut [i64], cols: usize) {
    if rng.below(25) != 0 || values.is_empty() {
        return;
    }
    let i = rng.below(values.len() as u64) as usize;
    match rng.below(4) {
        0 => values[i] = f64::NAN,
        1 => values[i] = 1.5,
        2 => values[i] = -0.25,
        _ => {
            if !counts.is_empty() {
                counts[i % counts.len()] = cols as i64 + 1;
            }
        }
    }
}

// --- stateless calls ---------------------------------------------------------------------------

/// Every stateless call on one random workload, through float64 or float32 views.
fn check_stateless(seed: u64) {
    let mut rng = Rng::new(seed);
    let cols = WIDTHS[rng.below(WIDTHS.len() as u64) as usize];
    let rows = rows_for(&mut rng);
    let mut conf = matrix(&mut rng, rows, cols);
    let mut stale = matrix(&mut rng, rows, cols);
    let mut sched = counts(&mut rng, rows, cols);
    spoil(&mut rng, &mut conf, &mut sched, cols);
    if rng.below(30) == 0 && !stale.is_empty() {
        stale[0] = f64::NAN;
    }
    let total: usize = sched
        .iter()
        .map(|&n| n.clamp(0, cols as i64) as usize)
        .sum();
    let step = step(&mut rng, rows, total);
    let tokens = step.num_non_draft_tokens + total + rng.below(2) as usize;
    let tables = tables(&mut rng, rows.max(1), tokens, cols);
    let budget = rng.below(total as u64 + 3) as usize;
    let context = format!("seed {seed}: R = {rows}, K = {cols}, step {step:?}");
    let (c32, s32) = (to_f32(&conf), to_f32(&stale));
    macro_rules! compare {
        ($conf:expr, $stale:expr) => {{
            let view = MatrixView::new("confidences", $conf, rows, cols).unwrap();
            let stale_view = MatrixView::new("budget_confidences", $stale, rows, cols).unwrap();
            let ostep = oracle_step(&step);

            let ours = planner::choose_draft_budget(view, &sched, &step, &tables);
            let theirs = oracle::choose_draft_budget(view, &sched, &ostep, &tables);
            assert_eq!(bits(&ours), bits(&theirs), "choose_draft_budget, {context}");

            let (mut a, mut b) = (vec![-1i32; rows], vec![-1i32; rows]);
            let ours = planner::assign_draft_budget(view, &sched, budget, &mut a);
            let theirs = oracle::assign_draft_budget(view, &sched, budget, &mut b);
            assert_eq!(bits(&ours), bits(&theirs), "assign_draft_budget, {context}");
            assert_eq!(a, b, "assign_draft_budget({budget}), {context}");

            for sized in [None, Some(stale_view)] {
                let (mut a, mut b) = (vec![-1i32; rows], vec![-1i32; rows]);
                let ours = planner::plan_verification(view, sized, &sched, &step, &tables, &mut a);
                let theirs =
                    oracle::plan_verification(view, sized, &sched, &ostep, &tables, &mut b);
                assert_eq!(
                    plan_bits(&ours),
                    oracle_plan_bits(&theirs),
                    "plan_verification (budget from {}), {context}",
                    if sized.is_some() { "other" } else { "current" }
                );
                assert_eq!(a, b, "plan_verification admitted, {context}");
            }

            for mode in [DepthMode::Batch, DepthMode::PerRequest] {
                let (mut a, mut b) = (vec![-1i32; rows], vec![-1i32; rows]);
                let ours = planner::choose_draft_depth(view, &sched, &step, &tables, mode, &mut a);
                let theirs = oracle::choose_draft_depth(
                    view,
                    &sched,
                    &ostep,
                    &tables,
                    oracle_mode(mode),
                    &mut b,
                );
                assert_eq!(
                    depth_bits(&ours),
                    oracle_depth_bits(&theirs),
                    "choose_draft_depth {mode:?}, {context}"
                );
                assert_eq!(a, b, "choose_draft_depth {mode:?} depths, {context}");
            }
        }};
    }
    match rng.below(3) {
        0 => compare!(&c32[..], &s32[..]),
        1 => compare!(&conf[..], &s32[..]),
        _ => compare!(&conf[..], &stale[..]),
    }
}

#[test]
fn stateless_calls_match_the_oracle_bit_for_bit() {
    let cases = if cfg!(debug_assertions) { 600 } else { 4000 };
    for seed in 0..cases {
        check_stateless(seed);
    }
}

/// The budget-limited cases that decide on summation order: many survivals below a rounding
/// unit of `E` in one bucket, under flat verification costs.
#[test]
fn sub_ulp_survivals_decide_as_the_oracle_does() {
    for (rows, cols, tiny) in [(2048, 8, 1e-17), (4096, 16, 3e-18), (300, 4, 1e-16)] {
        let mut conf = vec![1.0; rows * cols];
        for (i, c) in conf.iter_mut().enumerate() {
            if i % cols == 1 {
                *c = tiny * (1.0 + (i % 7) as f64 / 64.0);
            }
        }
        let sched = vec![cols as i64; rows];
        let total = rows * cols;
        let tables = CostTables::new(vec![0.0; rows + 1], vec![1.0; rows + total + 1]).unwrap();
        let step = StepTokens {
            num_non_draft_tokens: rows,
            num_sampling_requests: rows,
            max_draft_budget: None,
        };
        let view = MatrixView::new("confidences", &conf[..], rows, cols).unwrap();
        let ours = planner::choose_draft_budget(view, &sched, &step, &tables);
        let theirs = oracle::choose_draft_budget(view, &sched, &oracle_step(&step), &tables);
        assert_eq!(bits(&ours), bits(&theirs), "R = {rows}, K = {cols}");
        let (mut a, mut b) = (vec![0; rows], vec![0; rows]);
        let ours = planner::plan_verification(view, Some(view), &sched, &step, &tables, &mut a);
        let theirs = oracle::plan_verification(
            view,
            Some(view),
            &sched,
            &oracle_step(&step),
            &tables,
            &mut b,
        );
        assert_eq!(plan_bits(&ours), oracle_plan_bits(&theirs));
        assert_eq!(a, b);
    }
}

// --- the stateful planner ----------------------------------------------------------------------

/// A random sequence of calls on a fresh planner and on the oracle's, compared after each call
/// (outputs, errors and every slot's remembered confidences).
fn check_sequence(seed: u64) {
    let mut rng = Rng::new(seed ^ 0x5EED_0000);
    let cols = WIDTHS[rng.below(WIDTHS.len() as u64) as usize];
    let num_slots = 1 + rows_for(&mut rng).min(1500);
    let source = if rng.below(3) == 0 {
        BudgetSource::Current
    } else {
        BudgetSource::Previous
    };
    let tokens = num_slots * (cols + 2) + 300;
    let tables = tables(&mut rng, num_slots, tokens, cols);
    let mut ours = planner::VerificationPlanner::new(tables.clone(), num_slots, cols, source)
        .expect("a valid planner");
    let mut theirs =
        oracle::VerificationPlanner::new(tables, num_slots, cols, oracle_source(source)).unwrap();
    let context = |call: usize| format!("seed {seed}, call {call}: K = {cols}, slots {num_slots}");
    let mut depths_hint: Option<(Vec<i64>, Vec<i32>)> = None;
    for call in 0..12 {
        let rows = (rng.below(num_slots as u64 + 1) as usize).min(num_slots);
        let mut slots: Vec<i64> = (0..num_slots as i64).collect();
        for i in 0..rows {
            let j = i + rng.below((num_slots - i) as u64) as usize;
            slots.swap(i, j);
        }
        slots.truncate(rows);
        if rng.below(40) == 0 && rows > 1 {
            slots[1] = slots[0]; // a duplicate: both refuse it
        }
        let total = rows * cols;
        let step = step(&mut rng, rows, total);
        let ostep = oracle_step(&step);
        match rng.below(10) {
            0 => {
                let p = [0.0, 0.01, 0.3, 1.0][rng.below(4) as usize];
                let s = rng.next_u64();
                ours.set_exploration(Exploration::new("exploration", p, s).unwrap());
                theirs.set_exploration(oracle::Exploration::new("exploration", p, s).unwrap());
            }
            1 => {
                let slot = rng.below(num_slots as u64 + 1) as usize;
                assert_eq!(
                    bits(&ours.add_request(slot)),
                    bits(&theirs.add_request(slot)),
                    "add_request, {}",
                    context(call)
                );
            }
            2 => {
                ours.count_step();
                theirs.count_step();
            }
            3 | 4 => {
                let caps = counts(&mut rng, rows, cols);
                let mode = if rng.below(4) == 0 {
                    DepthMode::PerRequest
                } else {
                    DepthMode::Batch
                };
                let (mut a, mut b) = (vec![-1i32; rows], vec![-1i32; rows]);
                let x = ours.choose_draft_depth(&slots, &caps, &step, mode, &mut a);
                let y = theirs.choose_draft_depth(&slots, &caps, &ostep, oracle_mode(mode), &mut b);
                assert_eq!(
                    depth_bits(&x),
                    oracle_depth_bits(&y),
                    "choose_draft_depth {mode:?}, {}",
                    context(call)
                );
                assert_eq!(a, b, "depths, {}", context(call));
                if x.is_ok() {
                    depths_hint = Some((slots.clone(), a));
                }
            }
            _ => {
                // Plan the slots the last depth decision drafted for, with its depths, or others.
                let (slots, sched) = match depths_hint.take() {
                    Some((s, d)) if rng.below(3) != 0 => {
                        (s, d.into_iter().map(i64::from).collect())
                    }
                    _ => (slots, counts(&mut rng, rows, cols)),
                };
                let rows = slots.len();
                let mut conf = matrix(&mut rng, rows, cols);
                let mut sched = sched;
                spoil(&mut rng, &mut conf, &mut sched, cols);
                let c32 = to_f32(&conf);
                let remember = rng.below(6) == 0;
                let (mut a, mut b) = (vec![-1i32; rows], vec![-1i32; rows]);
                macro_rules! run {
                    ($data:expr) => {{
                        let view = MatrixView::new("confidences", $data, rows, cols).unwrap();
                        if remember {
                            let x = ours.remember(&slots, view, &sched);
                            let y = theirs.remember(&slots, view, &sched);
                            assert_eq!(bits(&x), bits(&y), "remember, {}", context(call));
                        } else {
                            let x = ours.plan(&slots, view, &sched, &step, &mut a);
                            let y = theirs.plan(&slots, view, &sched, &ostep, &mut b);
                            assert_eq!(
                                plan_bits(&x),
                                oracle_plan_bits(&y),
                                "plan, {}",
                                context(call)
                            );
                            assert_eq!(a, b, "admitted, {}", context(call));
                        }
                    }};
                }
                if rng.below(2) == 0 {
                    run!(&c32[..])
                } else {
                    run!(&conf[..])
                }
            }
        }
        for slot in 0..num_slots {
            let x = ours.previous_confidences(slot).unwrap();
            let y = theirs.previous_confidences(slot).unwrap();
            let (x, y): (Vec<u64>, Vec<u64>) = (
                x.iter().map(|v| v.to_bits()).collect(),
                y.iter().map(|v| v.to_bits()).collect(),
            );
            assert_eq!(x, y, "remembered slot {slot}, {}", context(call));
        }
    }
}

#[test]
fn stateful_sequences_match_the_oracle_bit_for_bit() {
    let cases = if cfg!(debug_assertions) { 150 } else { 1000 };
    for seed in 0..cases {
        check_sequence(seed);
    }
}
