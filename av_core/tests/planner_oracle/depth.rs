use super::budget::{
    beats, best_budget, bucket_map, floor_ratio, is_small, may_reach, search, Budget,
    BudgetBuffers, Drafts, StepCosts,
};
use super::order::Survivals;
use super::StepTokens;
use crate::cost_tables::CostTables;
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DepthMode {
    #[default]
    Batch,
    PerRequest,
}

impl DepthMode {
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

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DepthPlan {
    pub max_depth: usize,
    pub drafts: usize,
    pub budget: usize,
    pub expected_accepted_tokens: f64,
    pub predicted_cost_ms: f64,
}

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

fn fill_scheduled(d: usize, caps: &[usize], scheduled: &mut Vec<usize>) {
    scheduled.clear();
    scheduled.extend(caps.iter().map(|&c| c.min(d)));
}

#[derive(Clone, Copy)]
pub(crate) struct DepthRequest<'a> {
    pub(crate) cols: usize,
    pub(crate) caps: &'a [usize],
    pub(crate) step: &'a StepTokens,
    pub(crate) tables: &'a CostTables,
}

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
