use super::counting::{for_each_run, Bucket};
use super::order::{sort_descending, BucketMap, SortBuffers, Survivals};

const LOW: f64 = 1.0 - 1.0 / (1u64 << 48) as f64;
const HIGH: f64 = 1.0 + 1.0 / (1u64 << 48) as f64;
const TINY: f64 = 1e-290;
const BOUND_SLACK: f64 = 1e-9;
const SMALL: usize = 64;
const COARSENESS: u32 = 4;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Budget {
    pub budget: usize,
    pub expected_tokens: f64,
    pub threshold: f64,
}

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

#[derive(Clone, Copy)]
pub(crate) struct Drafts<'a> {
    pub(crate) survivals: &'a Survivals,
    pub(crate) cols: usize,
    pub(crate) scheduled: &'a [usize],
}

#[derive(Clone, Copy)]
pub(crate) struct StepCosts<'a> {
    pub(crate) s: f64,
    pub(crate) draft_ms: f64,
    pub(crate) verify: &'a [f64],
    pub(crate) verify_nondecreasing: bool,
}

impl StepCosts<'_> {
    pub(crate) fn limit(&self) -> usize {
        self.verify.len() - 1
    }
}

#[derive(Default)]
pub(crate) struct BudgetBuffers {
    pub(crate) indices: Vec<Bucket>,
    pub(crate) counts: Vec<u32>,
    pub(crate) sums: Vec<f64>,
    members: Vec<f64>,
    sort: SortBuffers,
}

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
        members,
        sort,
    } = buffers;
    if is_small(survivals, limit) {
        survivals.gather(cols, scheduled, members);
        sort_descending(members, sort);
        return exact_scan(&members[..limit], costs.s, costs.draft_ms, costs.verify);
    }

    // Count and sum per bucket.
    let map = bucket_map(survivals);
    map.indices(survivals, indices);
    map.histogram_with_sums(survivals, cols, scheduled, indices, counts, sums);
    search(drafts, &map, costs, buffers)
}

pub(crate) fn is_small(survivals: &Survivals, limit: usize) -> bool {
    survivals.count <= SMALL || survivals.max == survivals.min || limit == 0
}

pub(crate) fn bucket_map(survivals: &Survivals) -> BucketMap {
    BucketMap::new(survivals, COARSENESS)
}

pub(crate) fn search(
    drafts: Drafts<'_>,
    map: &BucketMap,
    costs: StepCosts<'_>,
    buffers: &mut BudgetBuffers,
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
    let BudgetBuffers {
        indices,
        counts,
        sums,
        members,
        sort,
    } = buffers;

    // The floor as the pair (ratio, 1): `reaches` compares cross-multiplied pairs.
    let (floor_e, floor_c) = (floor_ratio(counts, sums, costs), 1.0);

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
    for (b, (&count, &sum)) in counts.iter().zip(sums.iter()).enumerate() {
        if start >= limit {
            break;
        }
        if count > 0 {
            let end = (start + count as usize).min(limit);
            let e_max = s + (prefix + sum);
            let costs = &verify[start + 1..=end];
            let c_min = draft_ms
                + if verify_nondecreasing {
                    costs[0]
                } else {
                    costs.iter().fold(f64::INFINITY, |m, &v| m.min(v))
                };
            let candidate = reaches(e_max, c_min) && {
                let top = map.upper_bound(b).min(survivals.max);
                costs.iter().enumerate().any(|(t, &v)| {
                    let e = s + prefix + (t + 1) as f64 * top;
                    reaches(e.min(e_max), draft_ms + v)
                })
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

pub(crate) fn floor_ratio(counts: &[u32], sums: &[f64], costs: StepCosts<'_>) -> f64 {
    let StepCosts {
        s,
        draft_ms,
        verify,
        ..
    } = costs;
    let limit = costs.limit();
    let mut best = s / (draft_ms + verify[0]);
    let (mut end, mut prefix) = (0usize, 0.0f64);
    for (&count, &sum) in counts.iter().zip(sums) {
        end += count as usize;
        prefix += sum;
        if end > limit {
            break;
        }
        best = best.max((s + prefix) / (draft_ms + verify[end]));
    }
    best
}

pub(crate) fn may_reach(
    counts: &[u32],
    sums: &[f64],
    costs: StepCosts<'_>,
    (best_e, best_c): (f64, f64),
) -> bool {
    let StepCosts {
        s,
        draft_ms,
        verify,
        verify_nondecreasing,
    } = costs;
    let limit = costs.limit();
    let reaches = |e: f64, c: f64| {
        let reach = e * best_c * (1.0 + BOUND_SLACK);
        let need = best_e * c * (1.0 - BOUND_SLACK);
        reach >= need || !reach.is_finite() || !need.is_finite()
    };
    if reaches(s, draft_ms + verify[0]) {
        return true;
    }
    let (mut start, mut prefix) = (0usize, 0.0f64);
    for (&count, &sum) in counts.iter().zip(sums) {
        if start >= limit {
            break;
        }
        if count > 0 {
            let end = (start + count as usize).min(limit);
            let costs = &verify[start + 1..=end];
            let cheapest = if verify_nondecreasing {
                costs[0]
            } else {
                costs.iter().fold(f64::INFINITY, |m, &v| m.min(v))
            };
            if reaches(s + prefix + sum, draft_ms + cheapest) {
                return true;
            }
        }
        prefix += sum;
        start += count as usize;
    }
    false
}

pub(crate) fn exact_scan(sorted: &[f64], s: f64, draft_ms: f64, verify: &[f64]) -> Budget {
    debug_assert_eq!(verify.len(), sorted.len() + 1);
    let mut best = Best::start(s, draft_ms + verify[0]);
    best.scan(sorted, 1, s, 0.0, draft_ms, verify);
    best.finish()
}
