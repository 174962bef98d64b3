use std::cmp::Ordering;

use super::counting::{count_above, for_each_run, Bucket};
use super::order::{BucketMap, Survivals};

const SMALL: usize = 64;
const COARSENESS: u32 = 3;

#[derive(Default)]
pub(crate) struct AssignBuffers {
    indices: Vec<Bucket>,
    counts: Vec<u32>,
    members: Vec<Slot>,
    tied_rows: Vec<usize>,
}

#[derive(Clone, Copy)]
struct Slot {
    survival: f64,
    depth: u32,
    row: u32,
}

fn rank_order(a: &Slot, b: &Slot) -> Ordering {
    b.survival
        .total_cmp(&a.survival)
        .then(a.depth.cmp(&b.depth))
        .then(a.row.cmp(&b.row))
}

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
        map.indices(survivals, indices);
        map.histogram(survivals, cols, scheduled, indices, counts);
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
            members.push(Slot {
                survival: survivals.values[r * cols + depth],
                depth: depth as u32,
                row: r as u32,
            });
        }
    });
    let needed = budget - before;
    members.select_nth_unstable_by(needed - 1, rank_order);
    for slot in &members[..needed] {
        admitted[slot.row as usize] += 1;
    }
}
