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
//!   and only depths whose bound reaches the best of those get the budget planner's exact
//!   search. The bound is the buckets' (`E` at a bucket's end over its cheapest cost), then,
//!   for the buckets where that reaches, rank by rank (`E` at most the bucket's start plus the
//!   ranks times its largest value): survivals crowded into a few buckets (a position whose
//!   predictions lie close together) make each such bucket span hundreds of budgets, where the
//!   buckets' bound alone is loose by all of them. Depths within a bucket's width of each other
//!   are all searched.
//! - **per-request** mode drafts a prefix per request: for each number of drafter passes `D`,
//!   the slots at positions `< D` are taken in survival order (the order the verification
//!   planner admits them, so each request's slots form a prefix), and after `n` slots the step
//!   costs the drafting of exactly those prefixes (requests that stop leave the drafter's
//!   batch, [`CostTables::step_draft_cost_ms`]) plus `verify_ms[T + n]`; the first `(D, n)`
//!   with the highest ratio wins, and each request drafts its taken slots (with costs that
//!   never fall, a depth's scan stops once all of its survivals over the next slot's cost
//!   cannot reach the best so far). Bounding `D` keeps one confident request from buying a
//!   deep pass for everyone's order; it is still a greedy over survival order, not a search
//!   over every depth vector. With a non-decreasing
//!   `draft_ms` it is never worse than batch mode under the same cost model: batch mode's best
//!   `(D, b)` is one of its candidates, at a drafting cost no higher.
//!
//! Lossless by construction: nothing here reads a token of the step it governs, and the
//! verification planner then decides what to verify among the drafted positions under its own
//! rule (`av_core.testing` checks the composition exactly).

use super::budget::{
    all_fall_short, beats, bounds, bucket_map, exact_scan_of, is_small, largest_e, may_reach,
    reachable_budgets, search, Bounds, Budget, BudgetBuffers, Drafts, Histogram, StepCosts,
    COARSENESS,
};
use super::order::{most_buckets, reserve_len, BucketMap, Survivals};
use super::ranked::Ranked;
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
    slots: Vec<Ranked>,
    full_counts: Vec<u32>,
    full_sums: Vec<f64>,
    costs_by_depth: Vec<(usize, f64)>,
    pass_fractions: Vec<f64>,
    /// Per-request mode: the survivals of each position, summed over the requests.
    column_sums: Vec<f64>,
    shapes: Vec<Shape>,
    /// Every capped slot of a small batch decision: its survival's bits and its position.
    ranked: Vec<(u64, u32)>,
    /// The column scatter's scratch ([`scatter::add_column`]).
    listed: Vec<f64>,
    /// The running histogram before its last column, then the deeper depths' dominating
    /// histogram ([`deeper_fall_short`]).
    before_counts: Vec<u32>,
    before_sums: Vec<f64>,
}

impl DepthBuffers {
    /// Room for decisions over up to `rows` requests of `cols` positions without allocating:
    /// the batch decision keeps at most `cols` depths' histograms after the running one, each
    /// `buckets + SCRATCH` long.
    pub(crate) fn reserve(&mut self, rows: usize, cols: usize) {
        let slots = rows.saturating_mul(cols);
        let buckets = most_buckets(slots, COARSENESS);
        let histograms = (cols + 1).saturating_mul(buckets + scatter::SCRATCH);
        reserve_len(&mut self.scheduled, rows);
        reserve_len(&mut self.counts, cols + 2);
        reserve_len(&mut self.slots, slots);
        reserve_len(&mut self.full_counts, histograms);
        reserve_len(&mut self.full_sums, histograms);
        reserve_len(&mut self.costs_by_depth, cols + 1);
        reserve_len(&mut self.pass_fractions, cols + 1);
        reserve_len(&mut self.column_sums, cols);
        reserve_len(&mut self.shapes, cols);
        reserve_len(&mut self.ranked, slots);
        reserve_len(&mut self.listed, 2 * rows);
        reserve_len(&mut self.before_counts, buckets);
        reserve_len(&mut self.before_sums, buckets);
    }
}

/// A candidate depth of the batch decision: its drafts, largest budget, drafting cost and
/// bucket bounds.
#[derive(Clone, Copy)]
struct Shape {
    depth: usize,
    drafts: usize,
    limit: usize,
    draft_ms: f64,
    bounds: Bounds,
    /// Where its histogram starts in the depth buffers.
    histogram: usize,
}

/// The drafts and drafting cost of every depth `0..=deepest` for requests capped at `caps`
/// (depth `d` drafts `min(d, caps[r])` per request; `cap_counts[n]` requests are capped at `n`),
/// into `out[d]`. Pass `j` runs over the
/// `R_j` requests with `caps[r] ≥ j`, so the costs are prefix sums over `j` — the same sums, in
/// the same order, as [`CostTables::step_draft_cost_ms`] of each depth's counts. Leaves `R_j` in
/// `rows_at_least[j]` for `1 ≤ j ≤ deepest`.
fn depth_costs(
    cap_counts: &[usize],
    deepest: usize,
    tables: &CostTables,
    rows_at_least: &mut Vec<usize>,
    out: &mut Vec<(usize, f64)>,
) {
    rows_at_least.clear();
    rows_at_least.extend_from_slice(&cap_counts[..=deepest]);
    rows_at_least.push(0);
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

/// The largest cap (0 for no rows), read from the caps' histogram (`cap_counts[n]` rows capped
/// at `n`): a maximum over the rows' 64-bit caps costs a compare each, which baseline x86-64
/// emulates.
fn deepest_cap(cap_counts: &[usize]) -> usize {
    cap_counts.iter().rposition(|&rows| rows > 0).unwrap_or(0)
}

/// Whether every depth past `d` falls short of `target` (by more than twice the bounds' slack,
/// as [`all_fall_short`] proves it, rank by rank), from the running histogram of depth `d` and
/// that of depth `d - 1` (`before`, overwritten), bucketed by `map` (no scheduled survival above
/// `max`).
///
/// A deeper depth adds positions `d..` of some rows, and a row's survival at any of them is at
/// most its survival at `d - 1` (rows never increase). So the deeper depth's slots are
/// dominated, one by one, by depth `d`'s slots plus `copies = deepest - d` copies of column
/// `d - 1`'s: its `b`-th largest survival, and so its `E` at every budget, is at most theirs.
/// Its cost at budget `b` is at least `deeper.draft_ms` (the cheapest deeper drafting cost)
/// plus `verify_ms[T + b]`, over the budgets `deeper.verify` prices (up to the deepest
/// depth's limit, or fewer when the caller proved the dearer ones out of reach). If even that
/// dominating histogram, priced so, cannot reach the target, no deeper depth can; such a depth
/// would neither raise the target nor win (the answer is at least the target), so leaving it
/// out changes the time, never the answer. The column's sums are differences of running sums
/// (rounded: off by far less than the slack, relative to `E`).
fn deeper_fall_short(
    (counts, sums): (&[u32], &[f64]),
    (before_counts, before_sums): (&mut Vec<u32>, &mut Vec<f64>),
    copies: u32,
    (map, max): (&BucketMap, f64),
    deeper: StepCosts<'_>,
    target: (f64, f64),
) -> bool {
    let copies_f = f64::from(copies);
    for ((dominating, &count), (dominating_sum, &sum)) in before_counts
        .iter_mut()
        .zip(counts)
        .zip(before_sums.iter_mut().zip(sums))
    {
        // `count ≥ *dominating`: the running counts only grow. The caller checked that the
        // slots counted `copies + 1` times fit in `u32`.
        *dominating = count + copies * (count - *dominating);
        *dominating_sum = sum + copies_f * (sum - *dominating_sum);
    }
    all_fall_short((before_counts, before_sums), map, max, deeper, target)
}

/// Fills `scheduled` with depth `d`'s counts, `min(d, caps[r])`, for caps whose histogram is
/// `cap_counts` and whose largest is `deepest`: when every row is capped at `deepest` (the
/// usual case), one value for every row, with no 64-bit minimum per row (which baseline
/// x86-64 emulates).
fn fill_scheduled(
    d: usize,
    caps: &[usize],
    (cap_counts, deepest): (&[usize], usize),
    scheduled: &mut Vec<usize>,
) {
    scheduled.clear();
    if cap_counts[deepest] == caps.len() {
        scheduled.resize(caps.len(), deepest.min(d));
    } else {
        scheduled.extend(caps.iter().map(|&c| c.min(d)));
    }
}

/// What a drafting-depth decision is asked: rows of `cols` positions, row `r` capped at
/// `caps[r]` positions (`cap_counts[n]` rows at `n`, for `n` in `0..=cols`), in this step,
/// priced by these tables.
#[derive(Clone, Copy)]
pub(crate) struct DepthRequest<'a> {
    pub(crate) cols: usize,
    pub(crate) caps: &'a [usize],
    pub(crate) cap_counts: &'a [usize],
    pub(crate) step: &'a StepTokens,
    pub(crate) tables: &'a CostTables,
}

/// Batch mode over `survivals` for `request`; writes `depths`.
pub(crate) fn batch_depth(
    survivals: &Survivals,
    request: DepthRequest<'_>,
    buffers: &mut DepthBuffers,
    budget_buffers: &mut BudgetBuffers,
    depths: &mut [i32],
) -> DepthPlan {
    let DepthRequest {
        cols,
        caps,
        cap_counts,
        step,
        tables,
    } = request;
    let t = step.num_non_draft_tokens;
    let s = step.num_sampling_requests as f64;
    let verify = tables.verify_ms();
    let nondecreasing = tables.verify_is_nondecreasing();
    let deepest = deepest_cap(cap_counts);
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
        shapes,
        ranked,
        listed,
        before_counts,
        before_sums,
        ..
    } = buffers;
    depth_costs(cap_counts, deepest, tables, counts, costs_by_depth);
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
        // Few slots, or all equal: every depth is scanned exactly, in descending order. Depth
        // `d`'s slots are the capped slots at positions `< d`, so one sort of all capped slots
        // serves every depth: depth `d` scans the sorted slots of position `< d`, the values it
        // would sort on its own in the same order (equal values are interchangeable: the same
        // sums, the same first maximum and threshold).
        ranked.clear();
        for (row, &cap) in survivals.values.chunks_exact(cols.max(1)).zip(caps.iter()) {
            ranked.extend((0..).zip(&row[..cap]).map(|(j, &v)| (v.to_bits(), j)));
        }
        // Survivals are never negative nor NaN: their bit patterns order as their values.
        ranked.sort_unstable_by_key(|&(bits, _)| std::cmp::Reverse(bits));
        for (d, &(drafts, draft_ms)) in (1u32..).zip(&costs_by_depth[1..]) {
            let limit = limit_of(drafts);
            let sorted = ranked
                .iter()
                .filter(|&&(_, j)| j < d)
                .map(|&(bits, _)| f64::from_bits(bits));
            let chosen = exact_scan_of(sorted, s, draft_ms, &verify[t..=t + limit]);
            offer(&mut best, d as usize, drafts, draft_ms, chosen);
        }
    } else {
        // One bucket map for every depth and one histogram grown one position at a time
        // (depth `d` adds the slots at `d - 1`, slot by slot in row order: each bucket's sum is
        // formed by the same adds in the same order as a histogram built for depth `d` alone).
        // Pass 1: each depth's floor (its best ratio at a bucket boundary, attained by some
        // budget) and ceiling (a bound no budget of it exceeds), in one O(buckets) sweep of the
        // running histogram, which stops as soon as the depth provably cannot reach the best
        // floor so far (the target): such a depth is not kept, and its histogram is not
        // copied. Pass 2: only depths whose ceiling, and then whose ranks, reach the best floor
        // (and then the best ratio found) are searched exactly; a depth it skips is below the
        // answer by more than the bounds' slack, so which depths it skips cannot change the
        // answer, only the time.
        let map = bucket_map(survivals);
        let indices = &mut budget_buffers.indices;
        map.indices(survivals, indices);
        let buckets = map.len();
        // The running histogram sits in the first `buckets` entries, followed by the scatter's
        // scratch, and the kept depths' histograms after it, `stride` apart (each written whole
        // when its depth is kept); only the running one and its scratch are zeroed here.
        let stride = buckets + scatter::SCRATCH;
        if full_counts.len() < stride {
            full_counts.resize(stride, 0);
            full_sums.resize(stride, 0.0);
        }
        full_counts[..stride].fill(0);
        full_sums[..stride].fill(0.0);
        let mut target = (s, verify[t]);
        shapes.clear();
        // Whether the counts of the dominating histogram below fit in `u32` (each slot counted
        // at most `deepest` times).
        let dominating_fits = survivals.count.saturating_mul(deepest.max(1)) <= u32::MAX as usize;
        // `s` plus every survival, scheduled or not: no depth's `E` exceeds it (taken once,
        // when first needed).
        let mut every_survival = None;
        for d in 1..=deepest {
            let (hist, hist_sums) = (&mut full_counts[..stride], &mut full_sums[..stride]);
            if dominating_fits && d < deepest {
                before_counts.clear();
                before_counts.extend_from_slice(&hist[..buckets]);
                before_sums.clear();
                before_sums.extend_from_slice(&hist_sums[..buckets]);
            }
            // Column `d - 1`, request by request: slot `r·cols + d - 1`.
            let values = &survivals.values[..];
            debug_assert!(indices.len() == caps.len() * cols && values.len() == indices.len());
            let mut add = |slot: usize| {
                // SAFETY: `add` gets only `slot = r·cols + d - 1` for a row `r < caps.len()`
                // and `1 <= d <= deepest <= cols` (no cap exceeds `cols`), so it is below
                // `caps.len()·cols`, the length of `indices` (one bucket per slot of every row)
                // and of `values` (whole rows). `indices` was just filled by `map.indices`, and
                // `map.bucket` returns at most `map.len() - 1 == buckets - 1` for any value
                // (values are clamped into the map's range), so `b` is in bounds of `hist` and
                // `hist_sums`, both `stride > buckets` long.
                unsafe {
                    let b = *indices.get_unchecked(slot) as usize;
                    *hist.get_unchecked_mut(b) += 1;
                    *hist_sums.get_unchecked_mut(b) += *values.get_unchecked(slot);
                }
            };
            // `counts[d]` rows draft position `d - 1`: when that is every row, no cap is read.
            if counts[d] == caps.len() {
                let column = scatter::Column {
                    indices,
                    values,
                    cols,
                    col: d - 1,
                    rows: caps.len(),
                };
                // SAFETY: `hist` and `hist_sums` are both `stride = buckets + SCRATCH` long;
                // the column's slots `r·cols + d - 1` for `r < caps.len()` lie inside `indices`
                // and `values` and their buckets are below `buckets`, as argued in `add`.
                unsafe { scatter::add_column(column, hist, hist_sums, listed) };
            } else {
                for (r, &cap) in caps.iter().enumerate() {
                    if cap >= d {
                        add(r * cols + d - 1);
                    }
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
            // Kept only if it may reach the target: by its bucket bounds, and, where its floor
            // does not, rank by rank (a bucket of many close survivals spans many budgets, and
            // its bound is loose by all of them).
            let running = (&hist[..buckets], &hist_sums[..buckets]);
            let kept = bounds(running.0, running.1, costs, Some(target)).filter(|found| {
                may_reach(found.floor, target)
                    || !all_fall_short(running, &map, survivals.max, costs, target)
            });
            let Some(found) = kept else {
                // Not kept. If no deeper depth can reach the target either, their columns are
                // not added at all.
                if dominating_fits && d < deepest {
                    let deeper_draft_ms = costs_by_depth[d + 1..=deepest]
                        .iter()
                        .fold(f64::INFINITY, |m, &(_, ms)| m.min(ms));
                    let deeper_verify = &verify[t..=t + limit_of(costs_by_depth[deepest].0)];
                    // With costs that never fall, budgets too dear for even the largest `E`
                    // are out of every deeper depth's reach; the dominating histogram need
                    // only answer for the cheaper ones.
                    let reachable = if nondecreasing {
                        let top =
                            *every_survival.get_or_insert_with(|| largest_e(s, &survivals.values));
                        reachable_budgets(top, deeper_draft_ms, deeper_verify, target)
                    } else {
                        deeper_verify.len()
                    };
                    let deeper = StepCosts {
                        s,
                        draft_ms: deeper_draft_ms,
                        verify: &deeper_verify[..reachable.max(1)],
                        verify_nondecreasing: nondecreasing,
                    };
                    let copies = (deepest - d) as u32;
                    let before = (&mut *before_counts, &mut *before_sums);
                    let dominated = (&map, survivals.max);
                    if reachable == 0
                        || deeper_fall_short(running, before, copies, dominated, deeper, target)
                    {
                        break;
                    }
                }
                continue;
            };
            if beats(found.floor.0, found.floor.1, target.0, target.1) {
                target = found.floor;
            }
            // Kept: its histogram goes to the next free place after the running one.
            let kept = (shapes.len() + 1) * stride;
            full_counts.resize(full_counts.len().max(kept + buckets), 0);
            full_sums.resize(full_sums.len().max(kept + buckets), 0.0);
            let (running, rest) = full_counts.split_at_mut(stride);
            rest[kept - stride..kept - stride + buckets].copy_from_slice(&running[..buckets]);
            let (running, rest) = full_sums.split_at_mut(stride);
            rest[kept - stride..kept - stride + buckets].copy_from_slice(&running[..buckets]);
            shapes.push(Shape {
                depth: d,
                drafts,
                limit,
                draft_ms,
                bounds: found,
                histogram: kept,
            });
        }
        // Most promising first: the first exact searches raise the bar the others must reach.
        shapes.sort_by(|a, b| {
            let ((ea, ca), (eb, cb)) = (a.bounds.floor, b.bounds.floor);
            (eb * ca).total_cmp(&(ea * cb)).then(a.depth.cmp(&b.depth))
        });
        for shape in shapes.iter() {
            let Shape {
                depth: d,
                drafts,
                limit,
                draft_ms,
                bounds: found,
                ..
            } = *shape;
            let best_pair = (best.expected_accepted_tokens, best.predicted_cost_ms);
            let bar = if best_pair.0 * target.1 > target.0 * best_pair.1 {
                best_pair
            } else {
                target
            };
            if limit == 0 || !may_reach(found.ceiling, bar) {
                continue;
            }
            let range = shape.histogram..shape.histogram + buckets;
            let costs = StepCosts {
                s,
                draft_ms,
                verify: &verify[t..=t + limit],
                verify_nondecreasing: nondecreasing,
            };
            let kept = (&full_counts[range.clone()], &full_sums[range.clone()]);
            // A floor that may reach the bar is a budget that does: no proof to look for.
            if !may_reach(found.floor, bar) && all_fall_short(kept, &map, survivals.max, costs, bar)
            {
                continue;
            }
            fill_scheduled(d, caps, (cap_counts, deepest), scheduled);
            let among = Drafts {
                survivals,
                cols,
                scheduled,
            };
            let histogram = Histogram {
                counts: &full_counts[range.clone()],
                sums: &full_sums[range],
                indices,
                floor: Some(found.floor.0 / found.floor.1),
            };
            let chosen = search(among, &map, costs, histogram, &mut budget_buffers.search);
            offer(&mut best, d, drafts, draft_ms, chosen);
        }
    }
    for (out, &cap) in depths.iter_mut().zip(caps) {
        *out = cap.min(best.max_depth) as i32;
    }
    best
}

/// How often (in slots taken) per-request mode tests whether a depth's scan can stop.
const STOP_EVERY: usize = 16;

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
        cap_counts,
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
        column_sums,
        ..
    } = buffers;
    let deepest = deepest_cap(cap_counts);
    // Higher survival first, then shallower, then lower request: the verification planner's
    // admission order, under which every request's taken slots are a prefix. The keys are
    // distinct, so the unstable sort (in place: no allocation per call) gives that order
    // exactly.
    slots.clear();
    column_sums.clear();
    for depth in 0..deepest {
        let mut sum = 0.0;
        for (r, &n) in caps.iter().enumerate() {
            if depth < n {
                let survival = survivals.values[r * cols + depth];
                sum += survival;
                slots.push(Ranked::new(survival, depth as u32, r as u32));
            }
        }
        column_sums.push(sum);
    }
    slots.sort_unstable();
    // Pass `j`'s share of the full drafting cost, once per call (each is two divisions).
    pass_fractions.clear();
    pass_fractions.push(0.0);
    pass_fractions
        .extend((1..=deepest).map(|j| tables.depth_fraction(j) - tables.depth_fraction(j - 1)));
    // For each number of drafter passes `D`, the survival-ordered prefixes of the slots at
    // positions `< D`: the first (D, n) with the best ratio wins.
    let (mut best_d, mut best_n, mut best_e, mut best_c) = (0usize, 0usize, s, verify[t]);
    // With costs that never fall as slots are taken (verification, drafting by request count,
    // every pass's share), a depth's scan stops once even all of its survivals (`every`, a
    // bound on its `E`) over the next slot's cheapest cost cannot reach the best so far: no
    // later prefix of that depth can win.
    let monotone = tables.verify_is_nondecreasing()
        && pass_fractions.iter().all(|&f| f >= 0.0)
        && draft_table[..=caps.len()].windows(2).all(|w| w[0] <= w[1]);
    let mut every = s;
    // Tested every `STOP_EVERY` slots (a later test stops no less than an earlier one), and at
    // the budget cap.
    let cap = step.max_draft_budget.unwrap_or(usize::MAX);
    let stride = if monotone { STOP_EVERY } else { usize::MAX };
    for d in 1..=deepest {
        every += column_sums[d - 1];
        counts.clear();
        counts.resize(d + 1, 0); // counts[j]: requests drafting at least j positions
        let (mut e, mut draft_ms, mut n) = (s, 0.0f64, 0usize);
        // The next `n` at which to test the budget cap and whether the scan can stop.
        let mut check_at = cap.min(stride);
        for slot in slots.iter().filter(|slot| (slot.depth() as usize) < d) {
            if n == check_at {
                // Every later prefix of this depth has `E ≤ every` and costs at least the
                // next slot's cost with the drafting so far.
                let next = verify
                    .get(t + n + 1)
                    .map_or(f64::INFINITY, |&v| draft_ms + v);
                if n >= cap || !may_reach((every, next), (best_e, best_c)) {
                    break;
                }
                check_at = cap.min(n.saturating_add(stride));
            }
            let j = slot.depth() as usize + 1;
            let before = counts[j];
            counts[j] += 1;
            let pass = pass_fractions[j];
            let was = if before > 0 { draft_table[before] } else { 0.0 };
            draft_ms += (draft_table[before + 1] - was) * pass;
            e += slot.survival();
            n += 1;
            let c = draft_ms + verify[t + n];
            if beats(e, c, best_e, best_c) {
                (best_d, best_n, best_e, best_c) = (d, n, e, c);
            }
        }
    }
    depths.fill(0);
    // The deepest request drafts the deepest slot taken: its prefix reaches that position.
    let mut max_depth = 0usize;
    for slot in slots
        .iter()
        .filter(|slot| (slot.depth() as usize) < best_d)
        .take(best_n)
    {
        depths[slot.row() as usize] += 1;
        max_depth = max_depth.max(slot.depth() as usize + 1);
    }
    DepthPlan {
        max_depth,
        drafts: best_n,
        budget: best_n,
        expected_accepted_tokens: best_e,
        predicted_cost_ms: best_c,
    }
}

mod scatter;

#[cfg(test)]
mod tests;
