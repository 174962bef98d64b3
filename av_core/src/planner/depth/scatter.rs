//! The batch depth decision's column scatter: one position of every row added to the running
//! histogram, each bucket's count and sum formed by the same adds in row order.
//!
//! A bucket's sum is a chain of dependent adds (another order rounds `E` differently), and
//! through memory each link waits for the store before it to reach the next load as well as for
//! the add. The first positions' survivals crowd into one or two buckets, so that chain is most
//! of such a column's time. A crowded column keeps those buckets' sums in registers instead,
//! where a link costs the add alone: their survivals are listed in row order (a branch-free
//! append), then summed onto the buckets' sums, two chains side by side, while every other
//! bucket is added through memory as before, and the crowded ones' slots add to scratch entries
//! rotated so that they form no chain of their own. Every bucket still receives the same adds
//! in the same order, so the histogram is bit for bit the plain scatter's.

use crate::planner::counting::Bucket;

/// Scratch entries the histogram carries after its buckets.
pub(super) const SCRATCH: usize = 8;

/// Columns of fewer rows are scattered plainly (their chains are short).
const CROWDED_MIN_ROWS: usize = 32;

/// Not a bucket (every bucket index is below `2^15`).
const NONE: usize = usize::MAX;

/// One position of the first `rows` rows of `cols` slots: slot `r·cols + col` holds bucket
/// `indices[slot]` and survival `values[slot]`.
#[derive(Clone, Copy)]
pub(super) struct Column<'a> {
    pub(super) indices: &'a [Bucket],
    pub(super) values: &'a [f64],
    pub(super) cols: usize,
    pub(super) col: usize,
    pub(super) rows: usize,
}

/// Rows sampled to guess whether a column is crowded.
const SAMPLES: usize = 8;

/// Samples that must fall into the two guessed buckets.
const CROWDED_SAMPLES: usize = 6;

/// The buckets a column crowds into, guessed from [`SAMPLES`] rows spread over it: the middle
/// sample's bucket and the first other bucket sampled ([`NONE`] if there is none), when at
/// least [`CROWDED_SAMPLES`] samples fall into these two; `None` (a spread column) otherwise.
/// A wrong guess costs time, never bits.
fn crowded(column: Column<'_>) -> Option<(usize, usize)> {
    let Column {
        indices,
        cols,
        col,
        rows,
        ..
    } = column;
    if rows < CROWDED_MIN_ROWS {
        return None;
    }
    let mut sampled = [0usize; SAMPLES];
    for (i, b) in sampled.iter_mut().enumerate() {
        *b = indices[(2 * i + 1) * rows / (2 * SAMPLES) * cols + col] as usize;
    }
    let first = sampled[SAMPLES / 2];
    let second = sampled
        .iter()
        .copied()
        .find(|&b| b != first)
        .unwrap_or(NONE);
    let inside = sampled
        .iter()
        .filter(|&&b| b == first || b == second)
        .count();
    (inside >= CROWDED_SAMPLES).then_some((first, second))
}

/// Adds `column` to the histogram `counts` and `sums`: each slot's count to its bucket's
/// count, its survival to its bucket's sum, slot by slot in row order as far as each bucket
/// can tell (the scatter [`plain`] does, bit for bit). `listed` is scratch.
///
/// # Safety
///
/// `counts` and `sums` have the same length, `buckets + SCRATCH`; every slot
/// `r·cols + col` with `r < rows` lies inside `indices` and `values`; and each such slot's
/// bucket is below `buckets`.
// Not inlined: the loop gets the registers to itself (inlined into the depth decision it
// spills its invariants).
#[inline(never)]
pub(super) unsafe fn add_column(
    column: Column<'_>,
    counts: &mut [u32],
    sums: &mut [f64],
    listed: &mut Vec<f64>,
) {
    debug_assert!(counts.len() == sums.len() && counts.len() >= SCRATCH);
    debug_assert!(column.col < column.cols || column.rows == 0);
    debug_assert!(column.rows * column.cols <= column.indices.len().min(column.values.len()));
    let Some((first_bucket, second_bucket)) = crowded(column) else {
        // SAFETY: the caller's promise, which is `plain`'s.
        unsafe { plain(column, counts, sums) };
        return;
    };
    let Column {
        indices,
        values,
        cols,
        col,
        rows,
    } = column;
    let buckets = counts.len() - SCRATCH;
    if listed.len() < 2 * rows {
        listed.resize(2 * rows, 0.0);
    }
    let (first, second) = listed.split_at_mut(rows);
    let (first_bucket16, second_bucket16) = (first_bucket as u16, second_bucket as u16);
    let (mut n1, mut n2) = (0usize, 0usize);
    let (counts_at, sums_at) = (counts.as_mut_ptr(), sums.as_mut_ptr());
    let (list1, list2) = (first.as_mut_ptr(), second.as_mut_ptr());
    let mut slot = col;
    for _ in 0..rows {
        // SAFETY: `slot = r·cols + col` for a row `r < rows`, inside `indices` and `values`
        // (the caller's promise), and its bucket `b` is below `buckets`, so `to` (either `b` or
        // `buckets + (n1 + n2) % SCRATCH`) is below `buckets + SCRATCH`, the length of
        // `counts` and `sums`. `n1` and `n2` count earlier rows, so they are below `rows`, the
        // length of `first` and at most that of `second` (`listed` holds at least `2·rows`).
        // The four pointers come from four distinct slices.
        unsafe {
            let b = *indices.get_unchecked(slot);
            let v = *values.get_unchecked(slot);
            *list1.add(n1) = v;
            *list2.add(n2) = v;
            // Consecutive crowded slots take consecutive scratch entries.
            let scratch = buckets + (n1 + n2) % SCRATCH;
            // `first_bucket16` and `second_bucket16` are the buckets themselves (below `2^15`)
            // or, for `NONE`, `u16::MAX`, which no bucket is.
            let (in_first, in_second) = (b == first_bucket16, b == second_bucket16);
            n1 += usize::from(in_first);
            n2 += usize::from(in_second);
            let to = if in_first | in_second {
                scratch
            } else {
                b as usize
            };
            *counts_at.add(to) += 1;
            *sums_at.add(to) += v;
        }
        slot += cols;
    }
    // The crowded buckets' sums, each continued in row order, the two chains side by side.
    let mut sum1 = sums[first_bucket];
    let mut sum2 = if second_bucket == NONE {
        0.0
    } else {
        sums[second_bucket]
    };
    let both = n1.min(n2);
    for (&a, &b) in first[..both].iter().zip(&second[..both]) {
        sum1 += a;
        sum2 += b;
    }
    for &a in &first[both..n1] {
        sum1 += a;
    }
    for &b in &second[both..n2] {
        sum2 += b;
    }
    sums[first_bucket] = sum1;
    counts[first_bucket] += n1 as u32;
    if second_bucket != NONE {
        sums[second_bucket] = sum2;
        counts[second_bucket] += n2 as u32;
    }
}

/// The plain scatter: slot by slot in row order, each through memory.
///
/// # Safety
///
/// As [`add_column`]'s (only the buckets' part of `counts` and `sums` is written).
unsafe fn plain(column: Column<'_>, counts: &mut [u32], sums: &mut [f64]) {
    let Column {
        indices,
        values,
        cols,
        col,
        rows,
    } = column;
    for r in 0..rows {
        let slot = r * cols + col;
        // SAFETY: `slot` lies inside `indices` and `values`, and its bucket inside `counts`
        // and `sums` (the caller's promise).
        unsafe {
            let b = *indices.get_unchecked(slot) as usize;
            *counts.get_unchecked_mut(b) += 1;
            *sums.get_unchecked_mut(b) += *values.get_unchecked(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: every slot of the column in row order, with bounds checks.
    fn reference(column: Column<'_>, counts: &mut [u32], sums: &mut [f64]) {
        for r in 0..column.rows {
            let slot = r * column.cols + column.col;
            let b = column.indices[slot] as usize;
            counts[b] += 1;
            sums[b] += column.values[slot];
        }
    }

    /// Crowded, half-crowded and spread columns, with values whose sums round differently in
    /// any other order (large and tiny survivals mixed in one bucket), over histograms already
    /// holding earlier columns: every count and every sum's bits match the reference.
    #[test]
    fn every_column_adds_as_the_plain_scatter() {
        let mut next = crate::planner::tests::xorshift(0x853c_49e6_748f_ea9bu64);
        let mut listed = Vec::new();
        let mut crowded_seen = 0;
        for rows in [0usize, 1, 5, 31, 32, 33, 64, 100, 256, 1000] {
            for cols in [1usize, 3, 8] {
                for spread in [1u64, 2, 3, 5, 40] {
                    let buckets = 48usize;
                    let n = rows * cols;
                    let indices: Vec<Bucket> = (0..n)
                        .map(|_| {
                            let r = next();
                            // Mostly the first `spread` buckets, sometimes any.
                            (if r % 7 == 0 {
                                r % buckets as u64
                            } else {
                                7 + r % spread
                            }) as Bucket
                        })
                        .collect();
                    let values: Vec<f64> = (0..n)
                        .map(|_| {
                            let r = next();
                            let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
                            if r % 3 == 0 {
                                unit * 1e-17
                            } else {
                                unit
                            }
                        })
                        .collect();
                    let start_counts: Vec<u32> = (0..buckets).map(|b| (b % 5) as u32).collect();
                    let start_sums: Vec<f64> = (0..buckets).map(|b| b as f64 / 3.0).collect();
                    for col in 0..cols {
                        let column = Column {
                            indices: &indices,
                            values: &values,
                            cols,
                            col,
                            rows,
                        };
                        crowded_seen += usize::from(crowded(column).is_some());
                        let (mut want_counts, mut want_sums) =
                            (start_counts.clone(), start_sums.clone());
                        reference(column, &mut want_counts, &mut want_sums);
                        let mut counts = start_counts.clone();
                        counts.extend([0; SCRATCH]);
                        let mut sums = start_sums.clone();
                        sums.extend([0.0; SCRATCH]);
                        // SAFETY: `counts` and `sums` are `buckets + SCRATCH` long, every slot
                        // of the column lies in `indices` and `values`, and every bucket above
                        // is below `buckets`.
                        unsafe { add_column(column, &mut counts, &mut sums, &mut listed) };
                        assert_eq!(counts[..buckets], want_counts[..], "{rows}x{cols} {col}");
                        let bits = |s: &[f64]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&sums[..buckets]),
                            bits(&want_sums),
                            "{rows}x{cols} {col}"
                        );
                    }
                }
            }
        }
        assert!(
            crowded_seen > 50,
            "the crowded path ran {crowded_seen} times"
        );
    }

    #[test]
    fn samples_name_the_crowded_buckets() {
        fn column(indices: &[Bucket]) -> Column<'_> {
            Column {
                indices,
                values: &[],
                cols: 1,
                col: 0,
                rows: indices.len(),
            }
        }
        // 64 rows: the samples are rows 4, 12, ..., 60 (the middle one row 36).
        let mut rows = vec![3 as Bucket; 64];
        assert_eq!(crowded(column(&rows)), Some((3, NONE)));
        rows[12] = 5;
        assert_eq!(crowded(column(&rows)), Some((3, 5)));
        rows[20] = 6;
        assert_eq!(crowded(column(&rows)), Some((3, 5)), "7 of 8 in the two");
        rows[28] = 7;
        assert_eq!(crowded(column(&rows)), Some((3, 5)), "6 of 8 in the two");
        rows[44] = 8;
        assert_eq!(crowded(column(&rows)), None, "5 of 8 in the two");
        rows[36] = 9;
        rows[44] = 9;
        rows[52] = 9;
        assert_eq!(crowded(column(&rows)), None);
        rows.fill(4);
        assert_eq!(crowded(column(&rows[..31])), None, "too few rows");
    }
}
