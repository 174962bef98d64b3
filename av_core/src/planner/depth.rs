//! Drafting depth: how many positions to draft, decided before drafting.
//!
//! Trimming verification cannot recover what drafting already cost: an autoregressive drafter
//! pays one pass per drafted position, a block drafter one pass for any depth ≥ 1. So at high
//! load, where the best verification budget is near zero, a step that still drafts `K`
//! positions is slower than not speculating. The depth decision prices drafting in as well:
//! with survivals `S[r, j]` from confidences fixed *before* this step's drafts exist (the
//! previous step's, remembered per request), `s` sampling requests and `T` non-draft tokens,
//!
//! - **batch** mode drafts one depth `D` for every request (capped per request): for each `D`
//!   in `0..=K` it finds the best verification budget over the slots at positions `< D`,
//!   `max_b (s + Σ_{top b} S) / (draft(R, D) + verify_ms[T + b])`, and keeps the first `D`
//!   with the highest ratio. `D = 0` is "run the step without the drafter": `s / verify_ms[T]`.
//!   Cost: one bucket map serves every depth, with a histogram grown one position at a time;
//!   each depth's best ratio at bucket boundaries (attained by some budget) takes `O(buckets)`,
//!   and only depths whose bucket bound reaches the best of those get the budget planner's
//!   exact search. Depths within a bucket's width of each other are all searched.
//! - **per-request** mode drafts a prefix per request: for each number of drafter passes `D`,
//!   the slots at positions `< D` are taken in survival order (the order the verification
//!   planner admits them, so each request's slots form a prefix), and after `n` slots the step
//!   costs the drafting of exactly those prefixes (requests that stop leave the drafter's
//!   batch, [`CostTables::step_draft_cost_ms`]) plus `verify_ms[T + n]`; the first `(D, n)`
//!   with the highest ratio wins, and each request drafts its taken slots. Bounding `D` keeps
//!   one confident request from buying a deep pass for everyone's order; it is still a greedy
//!   over survival order, not a search over every depth vector. With a non-decreasing
//!   `draft_ms` it is never worse than batch mode under the same cost model: batch mode's best
//!   `(D, b)` is one of its candidates, at a drafting cost no higher.
//!
//! Lossless by construction: nothing here reads a token of the step it governs, and the
//! verification planner then decides what to verify among the drafted positions under its own
//! rule (`av_core.testing` checks the composition exactly).

use super::budget::{
    beats, best_budget, bucket_map, floor_ratio, is_small, may_reach, search, Budget,
    BudgetBuffers, Drafts, StepCosts,
};
use super::order::Survivals;
use super::StepTokens;
use crate::cost_tables::CostTables;
use crate::error::{Error, Result};

/// One depth for the batch, or one per request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DepthMode {
    /// Every request drafts the same depth (capped by its own maximum): the shape drafters run
    /// in lockstep (CUDA graphs, EAGLE's fixed-depth loop) can use.
    #[default]
    Batch,
    /// Each request drafts its own depth.
    PerRequest,
}

impl DepthMode {
    /// Parses `"batch"` or `"per_request"` (the names the bindings accept).
    ///
    /// ```rust
    /// use av_core::planner::DepthMode;
    ///
    /// assert_eq!(DepthMode::parse("per_request")?, DepthMode::PerRequest);
    /// assert_eq!(DepthMode::parse("deep").unwrap_err().argument, "mode");
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "batch" => Ok(DepthMode::Batch),
            "per_request" => Ok(DepthMode::PerRequest),
            other => Err(Error::value(
                "mode",
                format!("must be 'batch' or 'per_request', got {other:?}"),
            )),
        }
    }
}

/// What [`super::choose_draft_depth`] decided (the depths are written to the caller's buffer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DepthPlan {
    /// The deepest depth drafted by any request (0: the step runs without the drafter).
    pub max_depth: usize,
    /// Total positions to draft, the sum of the depths.
    pub drafts: usize,
    /// The verification budget the decision anticipates (the verification planner decides the
    /// real one once the drafts exist).
    pub budget: usize,
    /// `s +` the anticipated budget's survivals: the tokens the step is expected to emit.
    pub expected_accepted_tokens: f64,
    /// The drafting cost of the chosen depths plus `verify_ms[T + budget]`.
    pub predicted_cost_ms: f64,
}

/// Reusable buffers of the depth decision.
#[derive(Default)]
pub(crate) struct DepthBuffers {
    scheduled: Vec<usize>,
    counts: Vec<usize>,
    slots: Vec<Slot>,
    full_counts: Vec<u32>,
    full_sums: Vec<f64>,
    costs_by_depth: Vec<(usize, f64)>,
    pass_fractions: Vec<f64>,
}

#[derive(Clone, Copy)]
struct Slot {
    survival: f64,
    depth: u32,
    row: u32,
}

/// The drafts and drafting cost of every depth `0..=deepest` for requests capped at `caps`
/// (depth `d` drafts `min(d, caps[r])` per request), into `out[d]`. Pass `j` runs over the
/// `R_j` requests with `caps[r] ≥ j`, so the costs are prefix sums over `j` — the same sums, in
/// the same order, as [`CostTables::step_draft_cost_ms`] of each depth's counts.
fn depth_costs(
    caps: &[usize],
    deepest: usize,
    tables: &CostTables,
    rows_at_least: &mut Vec<usize>,
    out: &mut Vec<(usize, f64)>,
) {
    rows_at_least.clear();
    rows_at_least.resize(deepest + 2, 0);
    for &cap in caps {
        rows_at_least[cap] += 1;
    }
    for j in (1..=deepest).rev() {
        rows_at_least[j] += rows_at_least[j + 1];
    }
    let draft_ms = tables.draft_ms();
    out.clear();
    out.push((0, 0.0));
    let (mut drafts, mut cost, mut previous) = (0usize, 0.0f64, 0.0f64);
    for &rows in &rows_at_least[1..=deepest] {
        let fraction = tables.depth_fraction(out.len());
        drafts += rows;
        if rows > 0 {
            cost += draft_ms[rows] * (fraction - previous);
        }
        previous = fraction;
        out.push((drafts, cost));
    }
}

/// Fills `scheduled` with depth `d`'s counts, `min(d, caps[r])`.
fn fill_scheduled(d: usize, caps: &[usize], scheduled: &mut Vec<usize>) {
    scheduled.clear();
    scheduled.extend(caps.iter().map(|&c| c.min(d)));
}

/// What a drafting-depth decision is asked: rows of `cols` positions, row `r` capped at
/// `caps[r]` positions, in this step, priced by these tables.
#[derive(Clone, Copy)]
pub(crate) struct DepthRequest<'a> {
    pub(crate) cols: usize,
    pub(crate) caps: &'a [usize],
    pub(crate) step: &'a StepTokens,
    pub(crate) tables: &'a CostTables,
}

/// Batch mode over `survivals` for `request`; writes `depths`.
pub(crate) fn batch_depth(
    survivals: &mut Survivals,
    request: DepthRequest<'_>,
    buffers: &mut DepthBuffers,
    budget_buffers: &mut BudgetBuffers,
    depths: &mut [i32],
) -> DepthPlan {
    let DepthRequest {
        cols,
        caps,
        step,
        tables,
    } = request;
    let t = step.num_non_draft_tokens;
    let s = step.num_sampling_requests as f64;
    let verify = tables.verify_ms();
    let nondecreasing = tables.verify_is_nondecreasing();
    let deepest = caps.iter().copied().max().unwrap_or(0);
    let mut best = DepthPlan {
        max_depth: 0,
        drafts: 0,
        budget: 0,
        expected_accepted_tokens: s,
        predicted_cost_ms: verify[t],
    };
    let DepthBuffers {
        scheduled,
        counts,
        full_counts,
        full_sums,
        costs_by_depth,
        ..
    } = buffers;
    depth_costs(caps, deepest, tables, counts, costs_by_depth);
    let limit_of = |drafts: usize| step.max_draft_budget.map_or(drafts, |cap| cap.min(drafts));
    // Keeps the best ratio, and among equal ratios the smallest depth (in whatever order the
    // depths are offered).
    let offer = |best: &mut DepthPlan, d: usize, drafts: usize, draft_ms: f64, chosen: Budget| {
        let cost = draft_ms + verify[t + chosen.budget];
        let (e, c) = (chosen.expected_tokens, cost);
        let (best_e, best_c) = (best.expected_accepted_tokens, best.predicted_cost_ms);
        let better = beats(e, c, best_e, best_c);
        let tie_shallower = !better && !beats(best_e, best_c, e, c) && d < best.max_depth;
        if better || tie_shallower {
            *best = DepthPlan {
                max_depth: d,
                drafts,
                budget: chosen.budget,
                expected_accepted_tokens: e,
                predicted_cost_ms: c,
            };
        }
    };

    if deepest == 0 || is_small(survivals, survivals.count) {
        // Few slots: search every depth from scratch.
        for (d, &(drafts, draft_ms)) in costs_by_depth.iter().enumerate().skip(1) {
            let limit = limit_of(drafts);
            fill_scheduled(d, caps, scheduled);
            survivals.recount(cols, scheduled);
            let among = Drafts {
                survivals,
                cols,
                scheduled,
            };
            let costs = StepCosts {
                s,
                draft_ms,
                verify: &verify[t..=t + limit],
                verify_nondecreasing: nondecreasing,
            };
            let chosen = best_budget(among, costs, budget_buffers);
            offer(&mut best, d, drafts, draft_ms, chosen);
        }
        survivals.recount(cols, caps);
    } else {
        // One bucket map for every depth and a histogram grown one position at a time
        // (depth `d` adds the slots at `d - 1`), kept per depth. Pass 1: each depth's best
        // ratio at bucket boundaries (attained by some budget), in O(buckets). Pass 2: only
        // depths whose bucket bound reaches the best of those are searched exactly.
        let map = bucket_map(survivals);
        map.indices(survivals, &mut budget_buffers.indices);
        let buckets = map.len();
        full_counts.clear();
        full_counts.resize(buckets * deepest, 0);
        full_sums.clear();
        full_sums.resize(buckets * deepest, 0.0);
        let mut target = (s, verify[t]);
        let mut shapes = Vec::with_capacity(deepest);
        for d in 1..=deepest {
            let (done, rest) = full_counts.split_at_mut((d - 1) * buckets);
            let (done_sums, rest_sums) = full_sums.split_at_mut((d - 1) * buckets);
            let (hist, hist_sums) = (&mut rest[..buckets], &mut rest_sums[..buckets]);
            if d > 1 {
                hist.copy_from_slice(&done[(d - 2) * buckets..]);
                hist_sums.copy_from_slice(&done_sums[(d - 2) * buckets..]);
            }
            for (r, &cap) in caps.iter().enumerate() {
                if cap >= d {
                    let i = r * cols + d - 1;
                    let b = budget_buffers.indices[i] as usize;
                    hist[b] += 1;
                    hist_sums[b] += survivals.values[i];
                }
            }
            let (drafts, draft_ms) = costs_by_depth[d];
            let limit = limit_of(drafts);
            let costs = StepCosts {
                s,
                draft_ms,
                verify: &verify[t..=t + limit],
                verify_nondecreasing: nondecreasing,
            };
            let floor = (floor_ratio(hist, hist_sums, costs), 1.0);
            if beats(floor.0, floor.1, target.0, target.1) {
                target = floor;
            }
            shapes.push((d, drafts, limit, draft_ms, floor));
        }
        // Most promising first: the first exact searches raise the bar the others must reach.
        shapes.sort_by(|a, b| {
            let (ea, ca, eb, cb) = (a.4 .0, a.4 .1, b.4 .0, b.4 .1);
            (eb * ca).total_cmp(&(ea * cb)).then(a.0.cmp(&b.0))
        });
        for &(d, drafts, limit, draft_ms, _) in &shapes {
            let bar = if beats(
                best.expected_accepted_tokens,
                best.predicted_cost_ms,
                target.0,
                target.1,
            ) {
                (best.expected_accepted_tokens, best.predicted_cost_ms)
            } else {
                target
            };
            let range = (d - 1) * buckets..d * buckets;
            let costs = StepCosts {
                s,
                draft_ms,
                verify: &verify[t..=t + limit],
                verify_nondecreasing: nondecreasing,
            };
            let (hist, hist_sums) = (&full_counts[range.clone()], &full_sums[range]);
            if limit == 0 || !may_reach(hist, hist_sums, costs, bar) {
                continue;
            }
            budget_buffers.counts.clear();
            budget_buffers.counts.extend_from_slice(hist);
            budget_buffers.sums.clear();
            budget_buffers.sums.extend_from_slice(hist_sums);
            fill_scheduled(d, caps, scheduled);
            let among = Drafts {
                survivals,
                cols,
                scheduled,
            };
            let chosen = search(among, &map, costs, budget_buffers);
            offer(&mut best, d, drafts, draft_ms, chosen);
        }
    }
    for (out, &cap) in depths.iter_mut().zip(caps) {
        *out = cap.min(best.max_depth) as i32;
    }
    best
}

/// Per-request mode; writes `depths`.
pub(crate) fn per_request_depth(
    survivals: &Survivals,
    request: DepthRequest<'_>,
    buffers: &mut DepthBuffers,
    depths: &mut [i32],
) -> DepthPlan {
    let DepthRequest {
        cols,
        caps,
        step,
        tables,
    } = request;
    let t = step.num_non_draft_tokens;
    let s = step.num_sampling_requests as f64;
    let verify = tables.verify_ms();
    let draft_table = tables.draft_ms();
    let DepthBuffers {
        counts,
        slots,
        pass_fractions,
        ..
    } = buffers;
    let deepest = caps.iter().copied().max().unwrap_or(0);
    // Higher survival first, then shallower, then lower request: the verification planner's
    // admission order, under which every request's taken slots are a prefix. Listing the
    // slots shallow first, request by request, and sorting stably by survival alone gives
    // exactly that order (34 µs at R = 256, K = 8, against 39 µs for an unstable sort on all
    // three keys).
    slots.clear();
    for depth in 0..deepest {
        for (r, &n) in caps.iter().enumerate() {
            if depth < n {
                slots.push(Slot {
                    survival: survivals.values[r * cols + depth],
                    depth: depth as u32,
                    row: r as u32,
                });
            }
        }
    }
    slots.sort_by(|a, b| b.survival.total_cmp(&a.survival));
    // Pass `j`'s share of the full drafting cost, once per call (each is two divisions).
    pass_fractions.clear();
    pass_fractions.push(0.0);
    pass_fractions
        .extend((1..=deepest).map(|j| tables.depth_fraction(j) - tables.depth_fraction(j - 1)));
    // For each number of drafter passes `D`, the survival-ordered prefixes of the slots at
    // positions `< D`: the first (D, n) with the best ratio wins.
    let (mut best_d, mut best_n, mut best_e, mut best_c) = (0usize, 0usize, s, verify[t]);
    let mut best_max_depth = 0usize;
    for d in 1..=deepest {
        counts.clear();
        counts.resize(d + 1, 0); // counts[j]: requests drafting at least j positions
        let (mut e, mut draft_ms, mut n, mut max_depth) = (s, 0.0f64, 0usize, 0usize);
        for slot in slots.iter().filter(|slot| (slot.depth as usize) < d) {
            if step.max_draft_budget.is_some_and(|cap| n >= cap) {
                break;
            }
            let j = slot.depth as usize + 1;
            let before = counts[j];
            counts[j] += 1;
            let pass = pass_fractions[j];
            let was = if before > 0 { draft_table[before] } else { 0.0 };
            draft_ms += (draft_table[before + 1] - was) * pass;
            e += slot.survival;
            n += 1;
            max_depth = max_depth.max(j);
            let c = draft_ms + verify[t + n];
            if beats(e, c, best_e, best_c) {
                (best_d, best_n, best_e, best_c, best_max_depth) = (d, n, e, c, max_depth);
            }
        }
    }
    depths.fill(0);
    for slot in slots
        .iter()
        .filter(|slot| (slot.depth as usize) < best_d)
        .take(best_n)
    {
        depths[slot.row as usize] += 1;
    }
    DepthPlan {
        max_depth: best_max_depth,
        drafts: best_n,
        budget: best_n,
        expected_accepted_tokens: best_e,
        predicted_cost_ms: best_c,
    }
}

#[cfg(test)]
mod tests {
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

    fn tables_for(kind: DrafterKind, cols: usize, rows: usize, verify: Vec<f64>) -> CostTables {
        let draft: Vec<f64> = (0..=rows).map(|r| 1.0 + r as f64 / 4.0).collect();
        CostTables::new(draft, verify)
            .unwrap()
            .with_drafter(kind, cols)
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
        let plan = choose_draft_depth(view, &[4, 4], &step, &tables, DepthMode::Batch, &mut depths)
            .unwrap();
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
        let err = choose_draft_depth(view, &[2, 2], &step, &deep, DepthMode::Batch, &mut depths)
            .unwrap_err();
        assert_eq!(err.argument, "cost_tables");
        let none = None::<MatrixView<'_, f64>>;
        let err = crate::planner::plan_verification(view, none, &[2, 2], &step, &deep, &mut [0; 2])
            .unwrap_err();
        assert_eq!(err.argument, "cost_tables");
        let err = VerificationPlanner::new(deep, 4, 2, BudgetSource::Previous).unwrap_err();
        assert_eq!(err.argument, "cost_tables");
        let tables = plain.with_drafter(DrafterKind::Parallel, 2).unwrap();
        for (caps, argument) in [([3i64, 0], "max_depths"), ([-1, 0], "max_depths")] {
            let err =
                choose_draft_depth(view, &caps, &step, &tables, DepthMode::Batch, &mut depths)
                    .unwrap_err();
            assert_eq!(err.argument, argument);
        }
        let err = choose_draft_depth(view, &[2, 2], &step, &tables, DepthMode::Batch, &mut [0])
            .unwrap_err();
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
            let caps_i: Vec<i64> = caps.iter().map(|&c| c as i64).collect();
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
            let mut depths = vec![0; rows];
            let view = MatrixView::new("c", &conf, rows, cols).unwrap();
            let plan = choose_draft_depth(view, &caps_i, &step, &tables, DepthMode::Batch, &mut depths)
                .unwrap();
            let (d, ratio) = brute_batch(&conf, cols, &caps, &step, &tables);
            let got = plan.expected_accepted_tokens / plan.predicted_cost_ms;
            prop_assert!((got - ratio).abs() <= 1e-12 * ratio, "{got} vs {ratio}");
            prop_assert_eq!(plan.max_depth, depths.iter().copied().max().unwrap_or(0) as usize);
            let expected: Vec<i32> = caps.iter().map(|&c| c.min(d) as i32).collect();
            prop_assert_eq!(depths, expected);
        }

        /// Per-request mode: its ratio is the best over the survival-ordered prefixes of the
        /// slots above each depth (each prefix's cost recomputed from scratch).
        #[test]
        fn per_request_mode_is_the_best_survival_prefix(
            rows in 1usize..16,
            cols in 1usize..6,
            numerators in prop::collection::vec(0u32..=8, 100),
            parallel in any::<bool>(),
            knee in 0usize..30,
        ) {
            let conf: Vec<f64> =
                (0..rows * cols).map(|i| f64::from(numerators[i % 100]) / 8.0).collect();
            let verify: Vec<f64> =
                (0..=rows * (cols + 1)).map(|t| 4.0 + t.saturating_sub(knee) as f64 / 8.0).collect();
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
}
