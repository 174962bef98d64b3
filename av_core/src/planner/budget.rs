//! The draft budget: how many draft tokens are worth verifying this step.
//!
//! With survivals sorted descending (`v_1 ≥ v_2 ≥ …`), `s` sampling requests, `R` requests and
//! `T` non-draft tokens, verifying the best `b` drafts is expected to yield
//! `E(b) = s + Σ_{j≤b} v_j` tokens at a cost `C(b) = draft_ms[R] + verify_ms[T + b]`, and the
//! budget is the first `b` maximising tokens per millisecond `E(b)/C(b)` (vLLM's rule).
//!
//! A full sort of the `N = R·K` survivals would dominate the step, and most of it is wasted:
//! only the ranks near the optimum matter. So one pass buckets the survivals by value (count
//! and sum per bucket, [`BucketMap`]), and the buckets bound the ratio: inside a bucket `E` is
//! at most its value at the bucket's end and `C` at least its minimum over the bucket's ranks.
//! The best ratio at any bucket boundary is attained by some budget, so every bucket whose
//! bound falls short of it is skipped; the hull of the rest is gathered (one contiguous run per
//! row, since rows are sorted), sorted and scanned exactly. `O(N)` plus the hull's sort.
//!
//! Ratios compare like numpy's `argmax` over rounded float64 quotients: by cross-multiplying
//! when the products are far enough apart (relative `2^-48`) that the quotients must order the
//! same way, by the quotients themselves otherwise. `E` is accumulated in float64 bucket by
//! bucket, so it can differ from vLLM's sequential `cumsum` in the last bits; budgets then
//! agree with vLLM's except where two budgets' ratios tie to within about `1e-15` relative.

use super::counting::{for_each_run, Bucket};
use super::order::{most_buckets, reserve_len, sort_descending, BucketMap, SortBuffers, Survivals};

/// Products closer than this relative margin fall back to comparing rounded quotients.
const LOW: f64 = 1.0 - 1.0 / (1u64 << 48) as f64;
const HIGH: f64 = 1.0 + 1.0 / (1u64 << 48) as f64;
/// Below this magnitude products may have lost relative precision to underflow.
const TINY: f64 = 1e-290;
/// Relative slack on bucket bounds, far above the float64 error of the bucket sums.
const BOUND_SLACK: f64 = 1e-9;
/// Batches of at most this many scheduled slots are sorted and scanned outright.
const SMALL: usize = 64;
/// Buckets hold about `2^COARSENESS` survivals on average (in [`bucket_map`]).
pub(crate) const COARSENESS: u32 = 4;

/// The chosen budget, its expected token count `E(budget)`, and the `budget`-th largest
/// survival (the assignment's threshold; meaningless for `budget = 0`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Budget {
    pub budget: usize,
    pub expected_tokens: f64,
    pub threshold: f64,
}

/// Whether `e / c` beats `best_e / best_c` as rounded float64 quotients.
#[inline]
pub(crate) fn beats(e: f64, c: f64, best_e: f64, best_c: f64) -> bool {
    let lhs = e * best_c;
    let rhs = best_e * c;
    if lhs < rhs * LOW && lhs > TINY && rhs.is_finite() {
        return false;
    }
    if lhs > rhs * HIGH && rhs > TINY && lhs.is_finite() {
        return true;
    }
    e / c > best_e / best_c
}

/// Running best of a scan in increasing `b` (ties keep the first).
struct Best {
    budget: usize,
    e: f64,
    c: f64,
    threshold: f64,
}

impl Best {
    fn start(s: f64, c0: f64) -> Self {
        Best {
            budget: 0,
            e: s,
            c: c0,
            threshold: 0.0,
        }
    }

    /// Scans `values` (sorted descending) as ranks `first_rank..`, with `E = s + prefix` just
    /// before the first of them.
    fn scan(
        &mut self,
        values: &[f64],
        first_rank: usize,
        s: f64,
        prefix: f64,
        draft_ms: f64,
        verify: &[f64],
    ) {
        let costs = &verify[first_rank..first_rank + values.len()];
        let mut cumulative = prefix;
        for (t, (&v, &verify_b)) in values.iter().zip(costs).enumerate() {
            cumulative += v;
            let e = s + cumulative;
            let c = draft_ms + verify_b;
            if beats(e, c, self.e, self.c) {
                self.budget = first_rank + t;
                self.e = e;
                self.c = c;
                self.threshold = v;
            }
        }
    }

    fn finish(self) -> Budget {
        Budget {
            budget: self.budget,
            expected_tokens: self.e,
            threshold: self.threshold,
        }
    }
}

/// The drafts a budget is chosen among: the survivals (`cols` per row) and how many of each
/// row's are scheduled.
#[derive(Clone, Copy)]
pub(crate) struct Drafts<'a> {
    pub(crate) survivals: &'a Survivals,
    pub(crate) cols: usize,
    pub(crate) scheduled: &'a [usize],
}

/// The step's costs a budget is priced with: `s` sampling requests, the drafting cost, and
/// `verify = verify_ms[T..=T + limit]` for the budgets `0..=limit` (`limit` is
/// `verify.len() - 1`); `verify_nondecreasing` lets a bound read a bucket's cheapest cost at
/// its first rank instead of scanning for it.
#[derive(Clone, Copy)]
pub(crate) struct StepCosts<'a> {
    pub(crate) s: f64,
    pub(crate) draft_ms: f64,
    pub(crate) verify: &'a [f64],
    pub(crate) verify_nondecreasing: bool,
}

impl StepCosts<'_> {
    /// The largest budget priced.
    pub(crate) fn limit(&self) -> usize {
        self.verify.len() - 1
    }
}

/// Reusable buffers of [`best_budget`].
#[derive(Default)]
pub(crate) struct BudgetBuffers {
    pub(crate) indices: Vec<Bucket>,
    counts: Vec<u32>,
    sums: Vec<f64>,
    pub(crate) search: SearchBuffers,
}

/// Reusable buffers of [`search`]: the hull's survivals and their sort.
#[derive(Default)]
pub(crate) struct SearchBuffers {
    members: Vec<f64>,
    sort: SortBuffers,
}

impl BudgetBuffers {
    /// Room for budgets over up to `slots` survivals, so that no call of that size allocates.
    pub(crate) fn reserve(&mut self, slots: usize) {
        reserve_len(&mut self.indices, slots);
        reserve_len(&mut self.counts, most_buckets(slots, COARSENESS));
        reserve_len(&mut self.sums, most_buckets(slots, COARSENESS));
        reserve_len(&mut self.search.members, slots);
        self.search.sort.reserve(slots);
    }
}

/// The first `b` in `0..=costs.limit()` maximising `E(b) / C(b)` over `drafts`.
pub(crate) fn best_budget(
    drafts: Drafts<'_>,
    costs: StepCosts<'_>,
    buffers: &mut BudgetBuffers,
) -> Budget {
    let Drafts {
        survivals,
        cols,
        scheduled,
    } = drafts;
    let limit = costs.limit();
    let BudgetBuffers {
        indices,
        counts,
        sums,
        search: search_buffers,
    } = buffers;
    if is_small(survivals, limit) {
        let SearchBuffers { members, sort } = search_buffers;
        survivals.gather(cols, scheduled, members);
        sort_descending(members, sort);
        return exact_scan(&members[..limit], costs.s, costs.draft_ms, costs.verify);
    }

    // Count and sum per bucket.
    let map = bucket_map(survivals);
    map.count_and_sum(survivals, cols, scheduled, indices, counts, sums);
    search(
        drafts,
        &map,
        costs,
        Histogram {
            counts,
            sums,
            indices,
            floor: None,
        },
        search_buffers,
    )
}

/// Whether [`best_budget`] would sort and scan outright (then [`search`] must not be used).
pub(crate) fn is_small(survivals: &Survivals, limit: usize) -> bool {
    survivals.count <= SMALL || survivals.max == survivals.min || limit == 0
}

/// The bucket map [`best_budget`] uses.
pub(crate) fn bucket_map(survivals: &Survivals) -> BucketMap {
    BucketMap::new(survivals, COARSENESS)
}

/// The scheduled slots bucketed by a [`BucketMap`]: count and sum per bucket, and every slot's
/// bucket (row-major, scheduled or not).
#[derive(Clone, Copy)]
pub(crate) struct Histogram<'a> {
    pub(crate) counts: &'a [u32],
    pub(crate) sums: &'a [f64],
    pub(crate) indices: &'a [Bucket],
    /// [`floor_ratio`] of `counts` and `sums`, when the caller already has it.
    pub(crate) floor: Option<f64>,
}

/// [`best_budget`]'s search over the scheduled slots' histogram under `map` (the depth
/// decision builds its histograms position by position instead of from scratch).
pub(crate) fn search(
    drafts: Drafts<'_>,
    map: &BucketMap,
    costs: StepCosts<'_>,
    histogram: Histogram<'_>,
    buffers: &mut SearchBuffers,
) -> Budget {
    let Drafts {
        survivals,
        cols,
        scheduled,
    } = drafts;
    let StepCosts {
        s,
        draft_ms,
        verify,
        verify_nondecreasing,
    } = costs;
    let limit = costs.limit();
    let Histogram {
        counts,
        sums,
        indices,
        floor,
    } = histogram;
    let SearchBuffers { members, sort } = buffers;

    // The floor as the pair (ratio, 1): `reaches` compares cross-multiplied pairs.
    let floor = floor.unwrap_or_else(|| floor_ratio(counts, sums, costs));
    let (floor_e, floor_c) = (floor, 1.0);

    // Buckets that may hold a budget reaching the floor, and their hull. A quick test first:
    // E at the bucket's end over C at its cheapest. Then, for buckets that pass, per rank:
    // E(start + t) ≤ s + prefix + t·(bucket's top value), against the exact C there.
    let mut hull: Option<(usize, usize, f64)> = None; // (first bucket, its first rank, prefix)
    let mut last_bucket = 0usize;
    let mut start = 0usize;
    let mut prefix = 0.0f64;
    let reaches = |e: f64, c: f64| {
        let reach = e * floor_c * (1.0 + BOUND_SLACK);
        let need = floor_e * c * (1.0 - BOUND_SLACK);
        reach >= need || !reach.is_finite() || !need.is_finite()
    };
    // With costs that never fall, once even the largest `E` over a bucket's cheapest cost cannot
    // reach the floor, neither can it nor any later bucket.
    let top_e = verify_nondecreasing.then(|| largest_e(s, sums));
    for (b, (&count, &sum)) in counts.iter().zip(sums.iter()).enumerate() {
        if start >= limit {
            break;
        }
        if count > 0 {
            let end = (start + count as usize).min(limit);
            let e_max = s + (prefix + sum);
            let costs = &verify[start + 1..=end];
            let c_min = draft_ms + cheapest(costs, verify_nondecreasing);
            if top_e.is_some_and(|top| !reaches(top, c_min)) {
                break;
            }
            let candidate = reaches(e_max, c_min) && {
                let top = map.upper_bound(b).min(survivals.max);
                let ranks = RankTest {
                    base: s + prefix,
                    top,
                    e_max,
                    draft_ms,
                    floor: (floor_e, floor_c),
                    first: 1.0,
                };
                if verify_nondecreasing {
                    ranks.any_reaches_nondecreasing(costs)
                } else {
                    ranks.any_reaches(costs)
                }
            };
            if candidate {
                hull.get_or_insert((b, start, prefix));
                last_bucket = b;
            }
        }
        prefix += sum;
        start += count as usize;
    }

    let mut best = Best::start(s, draft_ms + verify[0]);
    if let Some((first_bucket, first_rank, prefix)) = hull {
        // The hull's survivals: one contiguous run per row.
        members.clear();
        for_each_run(
            indices,
            cols,
            scheduled,
            first_bucket,
            last_bucket,
            |r, from, to| {
                if from < to {
                    members.extend_from_slice(&survivals.values[r * cols + from..r * cols + to]);
                }
            },
        );
        sort_descending(members, sort);
        let take = members.len().min(limit - first_rank);
        best.scan(
            &members[..take],
            first_rank + 1,
            s,
            prefix,
            draft_ms,
            verify,
        );
    }
    best.finish()
}

/// The hull's per-rank test of one bucket: whether any rank `t` (1-based) inside it may reach
/// the floor, with `E ≤ min(base + t·top, e_max)` against its exact cost.
#[derive(Clone, Copy)]
struct RankTest {
    base: f64,
    top: f64,
    e_max: f64,
    draft_ms: f64,
    floor: (f64, f64),
    /// The rank of the first cost, as f64 (1 for a whole bucket).
    first: f64,
}

/// Ranks per block of [`RankTest::any_reaches_nondecreasing`].
const RANK_BLOCK: usize = 16;

impl RankTest {
    /// [`Self::any_reaches`] for costs that never fall: a block of ranks whose largest `E` (at
    /// its last rank) over its cheapest cost (at its first) cannot reach the floor holds no rank
    /// that can (the test is monotone in `E` and in the cost, rounding included), so it is
    /// skipped whole; the other blocks are tested rank by rank.
    fn any_reaches_nondecreasing(self, costs: &[f64]) -> bool {
        if costs.len() <= 2 * RANK_BLOCK {
            return self.any_reaches(costs);
        }
        for (i, block) in costs.chunks(RANK_BLOCK).enumerate() {
            let last = (i * RANK_BLOCK + block.len()) as f64;
            let e = self.base + last * self.top;
            let e = if e < self.e_max { e } else { self.e_max };
            if self.reaches(e, block[0]) && self.offset(i * RANK_BLOCK).any_reaches(block) {
                return true;
            }
        }
        false
    }

    /// The test of one rank: `E` (already capped) against the cost `draft_ms + v`.
    #[inline(always)]
    fn reaches(self, e: f64, v: f64) -> bool {
        let (floor_e, floor_c) = self.floor;
        let reach = e * floor_c * (1.0 + BOUND_SLACK);
        let need = floor_e * (self.draft_ms + v) * (1.0 - BOUND_SLACK);
        reach >= need || !reach.is_finite() || !need.is_finite()
    }

    /// The test of the ranks from `skipped + 1` on, as if they were the first.
    fn offset(self, skipped: usize) -> Self {
        RankTest {
            first: self.first + skipped as f64,
            ..self
        }
    }

    /// Over the bucket's costs `verify[start + 1..]`, four ranks at a time (vectors on every
    /// level, AVX2 where the CPU has it), each rank computed exactly as one at a time would be.
    fn any_reaches(self, costs: &[f64]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if costs.len() >= 8 && crate::simd::level() >= crate::simd::Level::Avx2 {
            // SAFETY: `any_reaches_avx2` only requires AVX2, which `simd::level` reports only
            // after `is_x86_feature_detected!("avx2")` confirmed it on this CPU.
            return unsafe { self.any_reaches_avx2(costs) };
        }
        self.any_reaches_lanes(costs)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn any_reaches_avx2(self, costs: &[f64]) -> bool {
        self.any_reaches_lanes(costs)
    }

    #[inline(always)]
    fn any_reaches_lanes(self, costs: &[f64]) -> bool {
        let RankTest {
            base,
            top,
            e_max,
            draft_ms,
            floor: (floor_e, floor_c),
            first,
        } = self;
        // `E = base + t·top` with `t` an exact integer in f64, the `min` of finite values, and
        // the products in the order `reaches` takes them: each rank's bits as the scalar test's.
        let lane = |t: f64, v: f64| {
            let e = base + t * top;
            let e = if e < e_max { e } else { e_max };
            let reach = e * floor_c * (1.0 + BOUND_SLACK);
            let need = floor_e * (draft_ms + v) * (1.0 - BOUND_SLACK);
            reach >= need || !reach.is_finite() || !need.is_finite()
        };
        let mut chunks = costs.chunks_exact(4);
        let mut t = first;
        for chunk in &mut chunks {
            let hits = [
                lane(t, chunk[0]),
                lane(t + 1.0, chunk[1]),
                lane(t + 2.0, chunk[2]),
                lane(t + 3.0, chunk[3]),
            ];
            if hits[0] | hits[1] | hits[2] | hits[3] {
                return true;
            }
            t += 4.0;
        }
        chunks.remainder().iter().any(|&v| {
            let hit = lane(t, v);
            t += 1.0;
            hit
        })
    }
}

/// The best ratio `E / C` at any bucket boundary within `limit`, as a rounded quotient: attained
/// by some budget (up to the quotient's rounding, far inside [`BOUND_SLACK`]), so a valid floor
/// for pruning. The maximum is found by [`beats`] (cross-multiplied, no division per bucket):
/// the same value as the largest rounded quotient.
pub(crate) fn floor_ratio(counts: &[u32], sums: &[f64], costs: StepCosts<'_>) -> f64 {
    let StepCosts {
        s,
        draft_ms,
        verify,
        ..
    } = costs;
    let limit = costs.limit();
    let (mut best_e, mut best_c) = (s, draft_ms + verify[0]);
    let (mut end, mut prefix) = (0usize, 0.0f64);
    // With costs that never fall, once even the largest `E` over the next boundary's cost falls
    // short of the best ratio by more than the slack, no later boundary beats it.
    let top_e = costs.verify_nondecreasing.then(|| largest_e(s, sums));
    for (&count, &sum) in counts.iter().zip(sums) {
        end += count as usize;
        prefix += sum;
        if end > limit {
            break;
        }
        let (e, c) = (s + prefix, draft_ms + verify[end]);
        if beats(e, c, best_e, best_c) {
            (best_e, best_c) = (e, c);
        } else if top_e.is_some_and(|top| !may_reach((top, c), (best_e, best_c))) {
            break;
        }
    }
    best_e / best_c
}

/// What a bucket histogram of a depth's slots says about its best ratio over budgets
/// `0..=limit`, as `(E, C)` pairs: `floor`, the best ratio at a bucket boundary (attained by
/// some budget; its rounded quotient is [`floor_ratio`]'s), and `ceiling`, a bound no budget
/// exceeds (at every rank inside a bucket, `E` is at most the bucket's end value and `C` at
/// least its cheapest cost, compared by plain cross-multiplication: a bound for pruning only).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub(crate) floor: (f64, f64),
    pub(crate) ceiling: (f64, f64),
}

/// [`Bounds`] of the slots counted in `counts` and `sums`, priced with `costs`; with a
/// `target` pair, `None` as soon as no budget of them can reach it: then every budget's ratio is
/// below the target by more than twice [`BOUND_SLACK`], so the ceiling the whole sweep would
/// give fails [`may_reach`] against the target and against any pair at least as good, and the
/// floor, below that ceiling, does not beat the target either. The sweep stops early (with
/// costs that never fall) once the ceiling so far and every later bucket (`E` at most the
/// largest, costs at least the current bucket's cheapest) fall short.
pub(crate) fn bounds(
    counts: &[u32],
    sums: &[f64],
    costs: StepCosts<'_>,
    target: Option<(f64, f64)>,
) -> Option<Bounds> {
    let StepCosts {
        s,
        draft_ms,
        verify,
        verify_nondecreasing,
    } = costs;
    let limit = costs.limit();
    let zero = (s, draft_ms + verify[0]);
    let (mut floor, mut ceiling) = (zero, zero);
    let (mut start, mut prefix) = (0usize, 0.0f64);
    let top_e = verify_nondecreasing.then(|| largest_e(s, sums));
    // Whether a ratio falls short of the target with the slack taken twice.
    let short = |(e, c): (f64, f64)| {
        target.is_some_and(|bar| !may_reach((e * (1.0 + BOUND_SLACK), c), bar))
    };
    let mut ceiling_short = short(ceiling);
    if ceiling_short {
        match top_e {
            Some(top) if limit > 0 && short((top, draft_ms + verify[1])) => return None,
            _ if limit == 0 => return None,
            _ => {}
        }
    }
    for (&count, &sum) in counts.iter().zip(sums) {
        if start >= limit {
            break;
        }
        prefix += sum;
        let end = start + count as usize;
        if count > 0 {
            let e = s + prefix;
            let ranks = &verify[start + 1..=end.min(limit)];
            let c = draft_ms + cheapest(ranks, verify_nondecreasing);
            if e * ceiling.1 > ceiling.0 * c {
                ceiling = (e, c);
                ceiling_short = short(ceiling);
            } else if let Some(top) = top_e {
                if ceiling_short && short((top, c)) {
                    // Neither the ceiling so far nor any later bucket reaches the target.
                    return None;
                }
                if !may_reach((top, c), ceiling) && !may_reach((top, c), floor) {
                    // No later bucket (E at most `top`, costs at least `c`) raises either bound.
                    break;
                }
            }
            if end <= limit {
                let c = draft_ms + verify[end];
                if beats(e, c, floor.0, floor.1) {
                    floor = (e, c);
                }
            }
        }
        start = end;
    }
    if ceiling_short {
        return None;
    }
    Some(Bounds { floor, ceiling })
}

/// The cheapest of a bucket's costs (its first, when costs never fall).
#[inline(always)]
fn cheapest(costs: &[f64], nondecreasing: bool) -> f64 {
    if nondecreasing {
        costs[0]
    } else {
        costs.iter().fold(f64::INFINITY, |m, &v| m.min(v))
    }
}

/// An upper bound on `E` at every budget of a histogram: `s` plus the sum of its bucket sums
/// (or of any survivals that include every slot counted),
/// summed in eight lanes (another order than the prefix sums, so widened by [`BOUND_SLACK`],
/// far above the difference; eight independent chains, since the bound is taken once per
/// depth and per search and one chain would wait on every add).
pub(crate) fn largest_e(s: f64, sums: &[f64]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let mut chunks = sums.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v;
        }
    }
    let rest: f64 = chunks.remainder().iter().sum();
    let [a, b, c, d, e, f, g, h] = lanes;
    (s + (((a + b) + (c + d)) + ((e + f) + (g + h))) + rest) * (1.0 + BOUND_SLACK)
}

/// Whether every budget over the slots counted in `counts` and `sums` (bucketed by `map`, none
/// above `max`) falls short of `bar`, priced with `costs`: budget 0 by [`may_reach`], then each
/// bucket by the quick test (`E` at its end over its cheapest cost) and, where that may reach,
/// every rank of it by the hull's per-rank test (`E` at most the bucket's start plus `t`
/// times its largest value, and at most its end, against the rank's exact cost; blocks of ranks
/// skipped whole with costs that never fall), stopping once even the largest `E` over a
/// bucket's cheapest cost falls short (then so does every later bucket, with costs that never
/// fall). `true` proves every budget's ratio below `bar` by more than twice [`BOUND_SLACK`].
pub(crate) fn all_fall_short(
    (counts, sums): (&[u32], &[f64]),
    map: &BucketMap,
    max: f64,
    costs: StepCosts<'_>,
    bar: (f64, f64),
) -> bool {
    let StepCosts {
        s,
        draft_ms,
        verify,
        verify_nondecreasing,
    } = costs;
    let limit = costs.limit();
    if may_reach((s, draft_ms + verify[0]), bar) {
        return false;
    }
    let top_e = verify_nondecreasing.then(|| largest_e(s, sums));
    let (mut start, mut prefix) = (0usize, 0.0f64);
    for (b, (&count, &sum)) in counts.iter().zip(sums).enumerate() {
        if start >= limit {
            break;
        }
        if count > 0 {
            let end = (start + count as usize).min(limit);
            let costs = &verify[start + 1..=end];
            if top_e.is_some_and(|top| !may_reach((top, draft_ms + costs[0]), bar)) {
                break;
            }
            // The quick test first: E at the bucket's end over its cheapest cost. Most buckets
            // fail it, and then no rank of theirs is tested.
            let e_max = s + (prefix + sum);
            if may_reach(
                (e_max, draft_ms + cheapest(costs, verify_nondecreasing)),
                bar,
            ) {
                let ranks = RankTest {
                    base: s + prefix,
                    top: map.upper_bound(b).min(max),
                    e_max,
                    draft_ms,
                    floor: bar,
                    first: 1.0,
                };
                let reaches = if verify_nondecreasing {
                    ranks.any_reaches_nondecreasing(costs)
                } else {
                    ranks.any_reaches(costs)
                };
                if reaches {
                    return false;
                }
            }
        }
        prefix += sum;
        start += count as usize;
    }
    true
}

/// How many budgets `0..` may reach the ratio `bar` when `E` is at most `top` at every budget
/// and budget `b` costs `draft_ms + verify[b]`, for costs that never fall: [`may_reach`] holds
/// for those and fails for every later one (the need grows with the cost). All of `verify`
/// when a product would not be finite (then [`may_reach`] is not monotone in the cost).
pub(crate) fn reachable_budgets(top: f64, draft_ms: f64, verify: &[f64], bar: (f64, f64)) -> usize {
    let (bar_e, bar_c) = bar;
    let dearest = draft_ms + verify.last().copied().unwrap_or(0.0);
    let reach = top * bar_c * (1.0 + BOUND_SLACK);
    let need = bar_e * dearest * (1.0 - BOUND_SLACK);
    if !reach.is_finite() || !need.is_finite() {
        return verify.len();
    }
    verify.partition_point(|&v| may_reach((top, draft_ms + v), bar))
}

/// Whether a ratio `e / c` may reach the ratio `bar` (pairs), with [`BOUND_SLACK`] on both
/// sides: `false` proves it falls short.
pub(crate) fn may_reach((e, c): (f64, f64), (bar_e, bar_c): (f64, f64)) -> bool {
    let reach = e * bar_c * (1.0 + BOUND_SLACK);
    let need = bar_e * c * (1.0 - BOUND_SLACK);
    reach >= need || !reach.is_finite() || !need.is_finite()
}

/// The first `b` in `0..=sorted.len()` maximising `E(b) / C(b)` over survivals already sorted
/// descending, with `E` accumulated in order (exactly vLLM's `s + cumsum`).
pub(crate) fn exact_scan(sorted: &[f64], s: f64, draft_ms: f64, verify: &[f64]) -> Budget {
    debug_assert_eq!(verify.len(), sorted.len() + 1);
    let mut best = Best::start(s, draft_ms + verify[0]);
    best.scan(sorted, 1, s, 0.0, draft_ms, verify);
    best.finish()
}

/// [`exact_scan`] over the first `verify.len() - 1` values `sorted` yields (descending): the
/// same sums, in the same order, and the same comparisons as over a slice of them.
pub(crate) fn exact_scan_of(
    sorted: impl Iterator<Item = f64>,
    s: f64,
    draft_ms: f64,
    verify: &[f64],
) -> Budget {
    let mut best = Best::start(s, draft_ms + verify[0]);
    let mut cumulative = 0.0f64;
    for ((b, v), &verify_b) in (1..).zip(sorted).zip(&verify[1..]) {
        cumulative += v;
        let e = s + cumulative;
        let c = draft_ms + verify_b;
        if beats(e, c, best.e, best.c) {
            best.budget = b;
            best.e = e;
            best.c = c;
            best.threshold = v;
        }
    }
    best.finish()
}

#[cfg(test)]
mod tests;
