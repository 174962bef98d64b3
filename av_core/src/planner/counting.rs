//! Counting along sorted rows.
//!
//! Survivals never increase along a row, so the slots of a row inside any value range (or
//! bucket range, buckets being monotone in value) form one run `from..to`, and both ends are
//! plain counts: `from = #{slot above the range}`, `to = #{slot above or in it}`. The planner
//! takes these counts for every row several times per call, so they are the inner loop of its
//! critical path.
//!
//! Baseline x86-64 (SSE2) has neither unsigned integer compares nor `popcnt`, and the portable
//! loops compile to per-lane bit tricks there. The SSE2 kernels below compare signed lanes
//! (bucket indices stay below `2^15`) and count by summing compare masks (`psubb`/`psubq`,
//! then `psadbw`), for rows of 4 or a multiple of 8 buckets and any row of values. Other
//! targets and row lengths use the portable loops, which the tests also use as the reference.

/// A bucket index ([`super::order::BucketMap`] makes at most `2^15` buckets).
pub(crate) type Bucket = u16;

/// `#{k < n : row[k] > bound}` for a row sorted descending: a fixed-length count over the
/// whole row (the unscheduled tail is sorted too, so capping at `n` is exact).
#[inline]
pub(crate) fn count_above(full_row: &[f64], n: usize, bound: f64) -> usize {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    match full_row.len() {
        // Unrolled for the common K = 8: plan at R = 256 with the budget from the current
        // confidences took 6.05 µs with it against 6.3 µs with the pair loop alone.
        8 => return sse2::count_above_8(full_row, bound).min(n),
        2.. => return sse2::count_above(full_row, bound).min(n),
        _ => {}
    }
    portable_count_above(full_row, bound).min(n)
}

fn portable_count_above(full_row: &[f64], bound: f64) -> usize {
    full_row
        .iter()
        .fold(0usize, |c, &v| c + usize::from(v > bound))
}

/// `out[n] = #{i : values[i] == n}` for `n < len` (every value must be below `len`).
///
/// Per-request counts are often all equal (every request drafting `K`), and one counter then
/// takes every increment: a chain through memory of a store and a reload per value. Four
/// interleaved tallies, added at the end, cut that chain to a quarter (the counts are integers:
/// any order gives the same result). A few values are counted in one lane (no chain to cut).
pub(crate) fn tally(values: &[usize], len: usize, out: &mut Vec<usize>) {
    const LANES: usize = 4;
    out.clear();
    if values.len() < 8 * LANES {
        out.resize(len, 0);
        for &v in values {
            out[v] += 1;
        }
        return;
    }
    out.resize(LANES * len, 0);
    let (first, rest) = out.split_at_mut(len);
    let (second, rest) = rest.split_at_mut(len);
    let (third, fourth) = rest.split_at_mut(len);
    let mut chunks = values.chunks_exact(LANES);
    for chunk in &mut chunks {
        first[chunk[0]] += 1;
        second[chunk[1]] += 1;
        third[chunk[2]] += 1;
        fourth[chunk[3]] += 1;
    }
    for &v in chunks.remainder() {
        first[v] += 1;
    }
    for (n, total) in first.iter_mut().enumerate() {
        *total += second[n] + third[n] + fourth[n];
    }
    out.truncate(len);
}

/// For every row `r`, the run of scheduled slots whose bucket lies in `first..=last`: calls
/// `f(r, from, to)` with `from = #{bucket < first}` and `to = #{bucket ≤ last}`, both capped
/// at `scheduled[r]` (buckets never decrease along a row, so the run is `from..to`).
/// `indices` holds every slot's bucket, row-major, `cols` per row.
#[inline]
pub(crate) fn for_each_run(
    indices: &[Bucket],
    cols: usize,
    scheduled: &[usize],
    first: usize,
    last: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    if cols == 0 {
        return;
    }
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    if (cols == 4 || cols % 8 == 0) && cols <= sse2::MAX_COLS && first < 1 << 15 && last < 1 << 15 {
        let (first, last) = (first as i16, last as i16);
        if cols == 8 {
            // The common depth: one vector a row, in a loop of its own.
            for (r, (row, &n)) in indices.chunks_exact(8).zip(scheduled).enumerate() {
                // `below_and_above` inlined on a chunk of 8: one vector, no inner loop.
                let (before, after) = sse2::below_and_above(row, first, last);
                f(r, before.min(n), (8 - after).min(n));
            }
            return;
        }
        for (r, (row, &n)) in indices.chunks_exact(cols).zip(scheduled).enumerate() {
            let (before, after) = if cols == 4 {
                sse2::below_and_above_4(row, first, last)
            } else {
                sse2::below_and_above(row, first, last)
            };
            f(r, before.min(n), (cols - after).min(n));
        }
        return;
    }
    // Every index is below `Bucket::MAX`, so clamping keeps both counts.
    let (first, last) = (
        first.min(Bucket::MAX as usize),
        last.min(Bucket::MAX as usize),
    );
    for (r, (row, &n)) in indices.chunks_exact(cols).zip(scheduled).enumerate() {
        let (from, to) = portable_run(row, first as Bucket, last as Bucket);
        f(r, from.min(n), to.min(n));
    }
}

fn portable_run(row: &[Bucket], first: Bucket, last: Bucket) -> (usize, usize) {
    let from = row.iter().filter(|&&b| b < first).count();
    let to = row.iter().filter(|&&b| b <= last).count();
    (from, to)
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod sse2 {
    use std::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_castpd_si128, _mm_cmpgt_epi16, _mm_cmpgt_pd, _mm_cvtsi128_si32,
        _mm_cvtsi128_si64, _mm_extract_epi16, _mm_loadl_epi64, _mm_loadu_pd, _mm_loadu_si128,
        _mm_packs_epi16, _mm_sad_epu8, _mm_set1_epi16, _mm_set1_pd, _mm_set_epi16,
        _mm_setzero_si128, _mm_sub_epi64, _mm_sub_epi8, _mm_unpackhi_epi64,
    };

    use super::Bucket;

    /// Longest row [`below_and_above`] counts: its byte counters hold up to 255.
    pub(super) const MAX_COLS: usize = 8 * 255;

    /// `(#{b < first}, #{b > last})` over a row of a multiple of 8 (at most [`MAX_COLS`])
    /// bucket indices; indices, `first` and `last` are below `2^15`, so signed 16-bit lanes
    /// order them.
    #[inline]
    pub(super) fn below_and_above(row: &[Bucket], first: i16, last: i16) -> (usize, usize) {
        debug_assert!(row.len() % 8 == 0 && row.len() <= MAX_COLS);
        debug_assert!(row.iter().all(|&b| b < 1 << 15) && first >= 0 && last >= 0);
        // SAFETY: every intrinsic below needs only SSE2, which this module's `cfg` proves the
        // target has; the one load reads 16 bytes from `chunk`, which is a `&[u16]` of
        // length 8 (unaligned loads are allowed).
        unsafe {
            let first = _mm_set1_epi16(first);
            let last = _mm_set1_epi16(last);
            let zero = _mm_setzero_si128();
            let mut counts = zero;
            for chunk in row.chunks_exact(8) {
                let lanes = _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>());
                // Bytes 0..8 flag `b < first`, bytes 8..16 flag `b > last` (0xFF or 0).
                let flags =
                    _mm_packs_epi16(_mm_cmpgt_epi16(first, lanes), _mm_cmpgt_epi16(lanes, last));
                counts = _mm_sub_epi8(counts, flags); // +1 per flag, at most 255 in all
            }
            let sums = _mm_sad_epu8(counts, zero); // one sum per 8-byte half
            (
                _mm_cvtsi128_si32(sums) as usize,
                _mm_extract_epi16::<4>(sums) as usize,
            )
        }
    }

    /// [`below_and_above`] over a row of exactly 4 bucket indices.
    #[inline]
    pub(super) fn below_and_above_4(row: &[Bucket], first: i16, last: i16) -> (usize, usize) {
        debug_assert!(row.len() == 4);
        debug_assert!(row.iter().all(|&b| b < 1 << 15) && first >= 0 && last >= 0);
        // SAFETY: SSE2 only, as above; the load reads 8 bytes from `row`, a `&[u16]` of
        // length 4.
        unsafe {
            // Lanes 4..8 load as 0: `0 > last` never flags, but `0 < first` does, so the flag
            // bytes 4..8 (those lanes' `b < first`) are masked off.
            let lanes = _mm_loadl_epi64(row.as_ptr().cast::<__m128i>());
            let flags = _mm_packs_epi16(
                _mm_cmpgt_epi16(_mm_set1_epi16(first), lanes),
                _mm_cmpgt_epi16(lanes, _mm_set1_epi16(last)),
            );
            let real = _mm_set_epi16(-1, -1, -1, -1, 0, 0, -1, -1);
            let zero = _mm_setzero_si128();
            let sums = _mm_sad_epu8(_mm_sub_epi8(zero, _mm_and_si128(flags, real)), zero);
            (
                _mm_cvtsi128_si32(sums) as usize,
                _mm_extract_epi16::<4>(sums) as usize,
            )
        }
    }

    /// `#{k : row[k] > bound}` over a row of exactly 8 values.
    #[inline]
    pub(super) fn count_above_8(row: &[f64], bound: f64) -> usize {
        debug_assert_eq!(row.len(), 8);
        // SAFETY: SSE2 only, as above; the four loads read `row[0..2]`, `row[2..4]`,
        // `row[4..6]` and `row[6..8]`, inside a slice of length 8 (checked by the caller).
        unsafe {
            let bound = _mm_set1_pd(bound);
            let p = row.as_ptr();
            let mut counts = _mm_setzero_si128();
            for offset in [0, 2, 4, 6] {
                let above = _mm_cmpgt_pd(_mm_loadu_pd(p.add(offset)), bound);
                counts = _mm_sub_epi64(counts, _mm_castpd_si128(above)); // +1 per lane
            }
            let total =
                _mm_cvtsi128_si64(counts) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(counts, counts));
            total as usize
        }
    }

    /// `#{k : row[k] > bound}`, two lanes at a time (an odd last value on its own).
    #[inline]
    pub(super) fn count_above(row: &[f64], bound: f64) -> usize {
        let mut pairs = row.chunks_exact(2);
        // SAFETY: SSE2 only, as above; each load reads the two values of `pair`, a `&[f64]`
        // of length 2.
        let paired = unsafe {
            let bound = _mm_set1_pd(bound);
            let mut counts = _mm_setzero_si128();
            for pair in &mut pairs {
                let above = _mm_cmpgt_pd(_mm_loadu_pd(pair.as_ptr()), bound);
                counts = _mm_sub_epi64(counts, _mm_castpd_si128(above)); // +1 per lane
            }
            _mm_cvtsi128_si64(counts) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(counts, counts))
        };
        paired as usize + pairs.remainder().iter().filter(|&&v| v > bound).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Tallies count every value, whatever the lengths and the remainder of four.
        #[test]
        fn tally_counts_each_value(values in prop::collection::vec(0usize..9, 0..80), extra in 0usize..3) {
            let len = values.iter().max().map_or(0, |&m| m + 1) + extra;
            let mut out = vec![7; 3];
            tally(&values, len, &mut out);
            let expected: Vec<usize> =
                (0..len).map(|n| values.iter().filter(|&&v| v == n).count()).collect();
            prop_assert_eq!(out, expected);
        }

        /// The kernels agree with the portable counts on sorted rows of every supported shape.
        #[test]
        fn kernels_match_portable_counts(
            cols in prop_oneof![Just(4usize), Just(8), Just(12), Just(16), Just(24), 1usize..20],
            steps in prop::collection::vec(0u16..3000, 1..200),
            first in 0usize..40_000,
            width in 0usize..40_000,
            n_seed in 0usize..25,
            bound in prop_oneof![Just(0.5f64), 0.0f64..1.0],
            values in prop::collection::vec(
                prop_oneof![Just(0.5f64), Just(0.0), 0.0f64..=1.0], 0..20),
        ) {
            let mut row: Vec<Bucket> = Vec::with_capacity(cols);
            let mut b = 0u16;
            for k in 0..cols {
                b = (b + steps[k % steps.len()] % 5000).min((1 << 15) - 1);
                row.push(b);
            }
            let last = first + width;
            let n = n_seed % (cols + 1);
            let mut seen = None;
            for_each_run(&row, cols, &[n], first, last, |r, from, to| seen = Some((r, from, to)));
            let first_b = first.min(Bucket::MAX as usize) as Bucket;
            let last_b = last.min(Bucket::MAX as usize) as Bucket;
            let (from, to) = portable_run(&row, first_b, last_b);
            prop_assert_eq!(seen, Some((0, from.min(n), to.min(n))));

            let mut sorted = values.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let n = n_seed % (sorted.len() + 1);
            prop_assert_eq!(
                count_above(&sorted, n, bound),
                portable_count_above(&sorted, bound).min(n)
            );
        }
    }
}
