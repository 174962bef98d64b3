//! Assignment: which requests get the budget's draft slots.
//!
//! The budget's slots go to the highest survivals, ties broken toward the shallower position
//! and then the lower request index. Survival never increases along a request, and a slot is
//! outranked by every shallower slot of its own request, so the winners are a prefix of each
//! request and the result is a count per request.
//!
//! The same order is what keeps the assignment lossless: whether slot `(r, k)` wins depends
//! only on how many slots rank above it, and none of those is a deeper slot of request `r`.
//! So the decision to verify draft `k` never looks at the survivals past `k`, which are the
//! only ones that depend on the token drafted at `k`.
//!
//! No sort of the `R·K` survivals is needed. When the `budget`-th largest survival `τ` is
//! already known (the budget scan found it), every slot above `τ` wins and the rest of the
//! budget goes to the slots equal to `τ`, shallow first. Otherwise one counting pass finds the
//! bucket holding rank `budget`; every slot in a higher bucket wins, and only that bucket's few
//! slots (one contiguous run per row) are sorted to pick the remainder.

use super::counting::{count_above, for_each_run, Bucket};
use super::order::{most_buckets, reserve_len, BucketMap, Survivals};
use super::ranked::Ranked;

/// Batches of at most this many scheduled slots are ranked outright.
const SMALL: usize = 64;
/// Buckets hold about `2^COARSENESS` survivals on average.
const COARSENESS: u32 = 3;

/// Reusable buffers of [`admit`].
#[derive(Default)]
pub(crate) struct AssignBuffers {
    indices: Vec<Bucket>,
    counts: Vec<u32>,
    members: Vec<Ranked>,
    tied_rows: Vec<usize>,
}

impl AssignBuffers {
    /// Room to assign among up to `slots` survivals of `rows` requests without allocating.
    pub(crate) fn reserve(&mut self, rows: usize, slots: usize) {
        reserve_len(&mut self.indices, slots);
        reserve_len(&mut self.counts, most_buckets(slots, COARSENESS));
        reserve_len(&mut self.members, slots);
        reserve_len(&mut self.tied_rows, rows);
    }
}

/// Writes the admitted count of each request into `admitted`. `threshold` is the `budget`-th
/// largest scheduled survival when known.
pub(crate) fn admit(
    survivals: &Survivals,
    cols: usize,
    scheduled: &[usize],
    budget: usize,
    threshold: Option<f64>,
    buffers: &mut AssignBuffers,
    admitted: &mut [i32],
) {
    if budget == 0 {
        admitted.fill(0);
        return;
    }
    if budget >= survivals.count {
        for (out, &n) in admitted.iter_mut().zip(scheduled) {
            *out = n as i32;
        }
    } else if let Some(threshold) = threshold {
        above_threshold(
            survivals, cols, scheduled, budget, threshold, buffers, admitted,
        );
    } else {
        by_selection(survivals, cols, scheduled, budget, buffers, admitted);
    }
}

fn above_threshold(
    survivals: &Survivals,
    cols: usize,
    scheduled: &[usize],
    budget: usize,
    threshold: f64,
    buffers: &mut AssignBuffers,
    admitted: &mut [i32],
) {
    let tied_rows = &mut buffers.tied_rows;
    tied_rows.clear();
    let mut wins = 0usize;
    for (r, (&n, out)) in scheduled.iter().zip(admitted.iter_mut()).enumerate() {
        let row = survivals.full_row(r, cols);
        let above = count_above(row, n, threshold);
        if above < n && row[above] == threshold {
            tied_rows.push(r);
        }
        *out = above as i32;
        wins += above;
    }
    let mut remaining = budget - wins;
    'depths: for depth in 0..cols {
        for &r in tied_rows.iter() {
            if remaining == 0 {
                break 'depths;
            }
            let next = admitted[r] as usize;
            if next == depth
                && next < scheduled[r]
                && survivals.values[r * cols + next] == threshold
            {
                admitted[r] += 1;
                remaining -= 1;
            }
        }
    }
    debug_assert_eq!(remaining, 0);
}

fn by_selection(
    survivals: &Survivals,
    cols: usize,
    scheduled: &[usize],
    budget: usize,
    buffers: &mut AssignBuffers,
    admitted: &mut [i32],
) {
    let AssignBuffers {
        indices,
        counts,
        members,
        ..
    } = buffers;
    // Every slot in a bucket before `bucket` wins; the slots in `bucket` compete for the rest.
    let (bucket, before) = if survivals.count <= SMALL {
        // One bucket for everything: rank all the slots.
        indices.clear();
        indices.resize(survivals.values.len(), 0);
        (0, 0)
    } else {
        let map = BucketMap::new(survivals, COARSENESS);
        map.count(survivals, cols, scheduled, indices, counts);
        let mut before = 0usize;
        let mut bucket = map.len() - 1;
        for (b, &count) in counts.iter().enumerate() {
            if before + count as usize >= budget {
                bucket = b;
                break;
            }
            before += count as usize;
        }
        (bucket, before)
    };
    members.clear();
    for_each_run(indices, cols, scheduled, bucket, bucket, |r, from, to| {
        admitted[r] = from as i32;
        for depth in from..to {
            let survival = survivals.values[r * cols + depth];
            members.push(Ranked::new(survival, depth as u32, r as u32));
        }
    });
    let needed = budget - before;
    // Higher survival first, then shallower, then lower request.
    members.select_nth_unstable(needed - 1);
    for slot in &members[..needed] {
        admitted[slot.row() as usize] += 1;
    }
}
