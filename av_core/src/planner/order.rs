//! Survivals, and buckets that order them without sorting.
//!
//! Survival never increases along a request (`S_k = S_{k-1}·p_k` with `p_k ≤ 1`, and rounding
//! is monotone), so each row is already sorted descending: the global maximum is among the
//! row heads, the minimum among the row tails, and the slots of any value range form one
//! contiguous run per row. The planner leans on this everywhere instead of sorting `R·K`
//! values.
//!
//! [`BucketMap`] splits `[min, max]` into equal-width buckets of the IEEE-754 bit pattern (for
//! non-negative doubles the bit order is the numeric order, and equal widths in bit space are a
//! piecewise-linear log scale, which spreads products evenly).

use super::counting::Bucket;
use crate::matrix::MatrixView;

/// Row-major survivals `[R, K]`: whole rows, of which the first `scheduled[r]` count.
pub(crate) struct Survivals {
    /// `S[r, k]`, row-major, never `-0.0`.
    pub values: Vec<f64>,
    /// Largest scheduled survival (0 when there is none).
    pub max: f64,
    /// Smallest scheduled survival (1 when there is none).
    pub min: f64,
    /// Number of scheduled slots.
    pub count: usize,
}

impl Default for Survivals {
    fn default() -> Self {
        Survivals {
            values: Vec::new(),
            max: 0.0,
            min: 1.0,
            count: 0,
        }
    }
}

impl Survivals {
    /// `S[r, k] = Π_{j ≤ k} p[r, j]` in f64, multiplied left to right (as vLLM's `cumprod` over
    /// float64). Whole rows are computed, a branch-free loop; only the slots
    /// `k < scheduled[r]` count. Returns `false` if some confidence is outside `[0, 1]` or NaN
    /// (the caller reports which).
    #[must_use]
    pub(crate) fn compute<T: Copy + Into<f64>>(
        &mut self,
        confidences: MatrixView<'_, T>,
        scheduled: &[usize],
    ) -> bool {
        let cols = confidences.cols();
        let len = confidences.rows() * cols;
        // Every entry of the whole rows is written below, so the buffer keeps its old contents
        // instead of being zeroed each call (`resize` fills only when it grows).
        self.values.resize(len, 0.0);
        self.max = 0.0;
        self.min = 1.0;
        self.count = 0;
        if cols == 0 {
            return true;
        }
        let in_range = multiply_at(
            crate::simd::level(),
            cols,
            (confidences.data(), &mut self.values[..]),
        );
        let values = &self.values[..];
        // Rows are sorted: the extremes are among the heads and the last scheduled entries.
        let (mut max, mut min, mut count) = (0.0f64, 1.0f64, 0usize);
        for (row, &n) in values.chunks_exact(cols).zip(scheduled) {
            if let (Some(&head), Some(&tail)) = (row.first(), row[..n].last()) {
                max = if head > max { head } else { max };
                min = if tail < min { tail } else { min };
            }
            count += n;
        }
        (self.max, self.min, self.count) = (max, min, count);
        in_range
    }

    /// Room for `slots` survivals.
    pub(crate) fn reserve(&mut self, slots: usize) {
        reserve_len(&mut self.values, slots);
    }

    /// The survivals `remembered` holds for `slots` (slot-major, `cols` per slot), as whole
    /// rows in the order of `slots`, with the extremes and count of the scheduled ones: what
    /// [`Self::compute`] gives for the confidences those survivals were multiplied from.
    pub(crate) fn gather_rows(
        &mut self,
        remembered: &[f64],
        slots: &[i64],
        cols: usize,
        scheduled: &[usize],
    ) {
        self.values.resize(slots.len() * cols, 0.0);
        gather_at(
            crate::simd::level(),
            cols,
            (remembered, slots, &mut self.values[..]),
        );
        self.recount(cols, scheduled);
    }

    /// Re-derives `max`, `min` and `count` for other scheduled counts (the values stay).
    pub(crate) fn recount(&mut self, cols: usize, scheduled: &[usize]) {
        let (mut max, mut min, mut count) = (0.0f64, 1.0f64, 0usize);
        if cols > 0 {
            for (row, &n) in self.values.chunks_exact(cols).zip(scheduled) {
                if n > 0 {
                    // Plain comparisons (`maxsd`/`minsd`): survivals are never NaN.
                    let (head, tail) = (row[0], row[n.min(cols) - 1]);
                    max = if head > max { head } else { max };
                    min = if tail < min { tail } else { min };
                }
                count += n;
            }
        }
        (self.max, self.min, self.count) = (max, min, count);
    }

    /// Sum over the rows of each row's running sum of its first `admitted[r]` survivals (each
    /// row summed left to right from 0, the rows in order).
    pub(crate) fn prefix_sum(&self, cols: usize, admitted: &[i32]) -> f64 {
        admitted
            .iter()
            .enumerate()
            .filter(|&(_, &a)| a > 0)
            .map(|(r, &a)| {
                self.values[r * cols..r * cols + a as usize]
                    .iter()
                    .fold(0.0f64, |sum, &v| sum + v)
            })
            .sum()
    }

    /// The scheduled survivals of row `r`.
    #[inline]
    pub(crate) fn row(&self, r: usize, cols: usize, scheduled: usize) -> &[f64] {
        &self.values[r * cols..r * cols + scheduled]
    }

    /// All `K` survivals of row `r`, sorted descending (only the first `scheduled[r]` count).
    #[inline]
    pub(crate) fn full_row(&self, r: usize, cols: usize) -> &[f64] {
        &self.values[r * cols..(r + 1) * cols]
    }

    /// The scheduled survivals, row by row, into `out`.
    pub(crate) fn gather(&self, cols: usize, scheduled: &[usize], out: &mut Vec<f64>) {
        out.clear();
        for (r, &n) in scheduled.iter().enumerate() {
            out.extend_from_slice(self.row(r, cols, n));
        }
    }
}

/// [`gather_any`] on the variant for `level`, which must be one this CPU runs
/// ([`crate::simd::available`]).
#[inline]
fn gather_at(level: crate::simd::Level, cols: usize, rows: (&[f64], &[i64], &mut [f64])) {
    crate::simd::dispatch!(
        level,
        avx512: x86::gather_avx512(cols, rows),
        avx2: x86::gather_avx2(cols, rows),
        baseline: gather_any(cols, rows),
    );
}

/// Rows of `cols` values of `source` (row `slot` at `slot · cols`), in the order of `slots`,
/// into `out`: common depths copy fixed-size rows (moves, not a `memcpy` call per row; one
/// vector a row of 8 on AVX-512).
#[inline(always)]
fn gather_any(cols: usize, rows: (&[f64], &[i64], &mut [f64])) {
    match cols {
        4 => copy_rows::<4>(rows),
        8 => copy_rows::<8>(rows),
        16 => copy_rows::<16>(rows),
        _ => {
            let (source, slots, out) = rows;
            for (out, &slot) in out.chunks_exact_mut(cols.max(1)).zip(slots) {
                let start = slot as usize * cols;
                out.copy_from_slice(&source[start..start + cols]);
            }
        }
    }
}

/// Rows of `K` values of `source` (row `slot` at `slot · K`), in the order of `slots`, into
/// `out`.
#[inline(always)]
fn copy_rows<const K: usize>((source, slots, out): (&[f64], &[i64], &mut [f64])) {
    for (out, &slot) in out.chunks_exact_mut(K).zip(slots) {
        let start = slot as usize * K;
        out.copy_from_slice(&source[start..start + K]);
    }
}

/// Confidences in, survivals out.
type Rows<'a, T> = (&'a [T], &'a mut [f64]);

/// Whether a confidence is a probability (NaN is not).
#[inline(always)]
fn probability(p: f64) -> bool {
    (0.0..=1.0).contains(&p)
}

/// Survivals of rows of `cols` confidences (`data` and `values` of the same length, a
/// multiple of `cols > 0`) and whether every confidence is a probability, on the variant for
/// `level`, which must be one this CPU runs ([`crate::simd::available`]). Every variant
/// multiplies each row left to right from 1.0 with the same operations, so all give the same
/// bits.
#[inline]
fn multiply_at<T: Copy + Into<f64>>(
    level: crate::simd::Level,
    cols: usize,
    rows: Rows<'_, T>,
) -> bool {
    crate::simd::dispatch!(
        level,
        avx512: wide::multiply_avx512(cols, rows),
        avx2: wide::multiply_avx2(cols, rows),
        baseline: {
            let in_range = in_range(rows.0);
            multiply_rows(cols, rows);
            in_range
        },
    )
}

/// Whether every confidence is a probability: a separate, vectorized pass (fused into the
/// multiply chain it costs more). The slice cannot change under us: the bindings hand the
/// core their own copy of a caller's buffer, and Rust's `&[T]` promises no writer.
#[inline(always)]
fn in_range<T: Copy + Into<f64>>(data: &[T]) -> bool {
    data.iter().fold(true, |ok, &p| ok & probability(p.into()))
}

/// The baseline's survivals of rows of `cols` confidences.
#[inline(always)]
fn multiply_rows<T: Copy + Into<f64>>(cols: usize, rows: Rows<'_, T>) {
    // Common depths get a loop the compiler unrolls (independent rows then overlap).
    match cols {
        1 => fill_rows::<T, 1>(rows),
        2 => fill_rows::<T, 2>(rows),
        3 => fill_rows::<T, 3>(rows),
        4 => fill_rows::<T, 4>(rows),
        5 => fill_rows::<T, 5>(rows),
        6 => fill_rows::<T, 6>(rows),
        7 => fill_rows::<T, 7>(rows),
        8 => fill_rows::<T, 8>(rows),
        10 => fill_rows::<T, 10>(rows),
        12 => fill_rows::<T, 12>(rows),
        16 => fill_rows::<T, 16>(rows),
        _ => fill_rows_any(cols, rows),
    }
}

/// The survivals compiled for AVX2 and AVX-512: four rows at a time, one row a lane.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::Rows;
    use std::arch::x86_64::{
        __m256d, _mm256_add_pd, _mm256_loadu_pd, _mm256_mul_pd, _mm256_permute2f128_pd,
        _mm256_set1_pd, _mm256_setzero_pd, _mm256_storeu_pd, _mm256_unpackhi_pd,
        _mm256_unpacklo_pd,
    };

    crate::simd::wide_variants! {
        fn multiply_avx2 / multiply_avx512 [T: Copy + Into<f64>] (
            cols: usize,
            rows: Rows<'_, T>,
        ) -> bool {
            let in_range = super::in_range(rows.0);
            let (data, values) = rows;
            let done = if cols % 4 == 0 { four_rows_avx2(cols, (data, values)) } else { 0 };
            let at = done * cols;
            super::multiply_rows(cols, (&data[at..], &mut values[at..]));
            in_range
        }
    }

    /// The 4 × 4 transpose: `[a, b, c, d]` (rows) into their columns (and back).
    #[target_feature(enable = "avx2")]
    fn transpose([a, b, c, d]: [__m256d; 4]) -> [__m256d; 4] {
        // SAFETY: register shuffles only, which need AVX, which this function is compiled
        // with and whose callers (compiled with it too) run only where it was detected.
        #[allow(unused_unsafe)]
        unsafe {
            let (ab_even, ab_odd) = (_mm256_unpacklo_pd(a, b), _mm256_unpackhi_pd(a, b));
            let (cd_even, cd_odd) = (_mm256_unpacklo_pd(c, d), _mm256_unpackhi_pd(c, d));
            [
                _mm256_permute2f128_pd::<0x20>(ab_even, cd_even),
                _mm256_permute2f128_pd::<0x20>(ab_odd, cd_odd),
                _mm256_permute2f128_pd::<0x31>(ab_even, cd_even),
                _mm256_permute2f128_pd::<0x31>(ab_odd, cd_odd),
            ]
        }
    }

    /// Survivals of the first `4 · ⌊rows / 4⌋` rows of `cols` (a multiple of 4) confidences,
    /// four rows at a time: each row's product runs in one lane, left to right from 1.0 with
    /// `+ 0.0` on each confidence, the baseline's operations in the baseline's order. Returns
    /// the number of rows done.
    #[target_feature(enable = "avx2")]
    fn four_rows_avx2<T: Copy + Into<f64>>(cols: usize, (data, values): Rows<'_, T>) -> usize {
        debug_assert!(cols > 0 && cols % 4 == 0 && data.len() == values.len());
        let block = 4 * cols;
        let mut done = 0;
        for (rows, out) in data.chunks_exact(block).zip(values.chunks_exact_mut(block)) {
            // The four rows, each cut into columns of four (chunks of exactly 4).
            let (a, rest) = rows.split_at(cols);
            let (b, rest) = rest.split_at(cols);
            let (c, d) = rest.split_at(cols);
            let ins = (a.chunks_exact(4).zip(b.chunks_exact(4)))
                .zip(c.chunks_exact(4).zip(d.chunks_exact(4)));
            let (oa, rest) = out.split_at_mut(cols);
            let (ob, rest) = rest.split_at_mut(cols);
            let (oc, od) = rest.split_at_mut(cols);
            let outs = (oa.chunks_exact_mut(4).zip(ob.chunks_exact_mut(4)))
                .zip(oc.chunks_exact_mut(4).zip(od.chunks_exact_mut(4)));
            // SAFETY: arithmetic and shuffles need AVX, which this function is compiled with
            // and whose callers run only where it was detected; each load reads the four
            // `f64`s of a `[f64; 4]`, each store writes a chunk of exactly four `f64`s.
            #[allow(unused_unsafe)]
            unsafe {
                let zero = _mm256_setzero_pd();
                let mut survival = _mm256_set1_pd(1.0);
                for (((a, b), (c, d)), ((oa, ob), (oc, od))) in ins.zip(outs) {
                    let mut lanes = [zero; 4];
                    for (lane, row) in lanes.iter_mut().zip([a, b, c, d]) {
                        let mut four = [0.0f64; 4];
                        for (x, &p) in four.iter_mut().zip(row) {
                            *x = p.into();
                        }
                        // `+ 0.0` folds a `-0.0` confidence onto `+0.0`.
                        *lane = _mm256_add_pd(_mm256_loadu_pd(four.as_ptr()), zero);
                    }
                    let mut columns = transpose(lanes);
                    for column in columns.iter_mut() {
                        survival = _mm256_mul_pd(survival, *column);
                        *column = survival;
                    }
                    for (lane, out) in transpose(columns).into_iter().zip([oa, ob, oc, od]) {
                        _mm256_storeu_pd(out.as_mut_ptr(), lane);
                    }
                }
            }
            done += 4;
        }
        done
    }
}

/// Survivals of rows of `K` confidences.
#[inline(always)]
fn fill_rows<T: Copy + Into<f64>, const K: usize>((data, values): Rows<'_, T>) {
    for (row, out) in data.chunks_exact(K).zip(values.chunks_exact_mut(K)) {
        let mut survival = 1.0f64;
        for k in 0..K {
            // `+ 0.0` folds a `-0.0` confidence onto `+0.0` (off the multiply chain).
            survival *= row[k].into() + 0.0;
            out[k] = survival;
        }
    }
}

/// [`fill_rows`] for any row length.
#[inline(always)]
fn fill_rows_any<T: Copy + Into<f64>>(cols: usize, (data, values): Rows<'_, T>) {
    for (row, out) in data.chunks_exact(cols).zip(values.chunks_exact_mut(cols)) {
        let mut survival = 1.0f64;
        for (value, &p) in out.iter_mut().zip(row) {
            survival *= p.into() + 0.0;
            *value = survival;
        }
    }
}

/// Keys further below the maximum than this many binades share the last bucket, so one zero
/// survival cannot stretch every bucket.
const MAX_SPAN_BINADES: u64 = 40;

/// Bucket index of a survival: equal-width buckets in bit-pattern space below the largest
/// scheduled survival, bucket 0 holding the largest.
/// `log2` of the most buckets a [`BucketMap`] over `n` values at `coarseness` has (at least
/// 6, at most 15).
fn bucket_bits(n: usize, coarseness: u32) -> u32 {
    (usize::BITS - n.leading_zeros())
        .saturating_sub(coarseness)
        .clamp(6, 15)
}

/// The most buckets a [`BucketMap`] over at most `slots` values at `coarseness` has: the
/// capacity that buffers of one entry per bucket reserve.
pub(crate) fn most_buckets(slots: usize, coarseness: u32) -> usize {
    1 << bucket_bits(slots, coarseness)
}

/// Grows `buffer`'s capacity to at least `len` (its contents stay), so that filling it up to
/// `len` later allocates nothing.
pub(crate) fn reserve_len<T>(buffer: &mut Vec<T>, len: usize) {
    buffer.reserve(len.saturating_sub(buffer.len()));
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct BucketMap {
    top: u64,
    shift: u32,
    len: usize,
    /// Values are clamped into `[floor, ceiling]` before bucketing: values below the floor
    /// share the bucket farthest from the top, and unscheduled slots above the ceiling
    /// (never counted) stay in range.
    floor: f64,
    ceiling: f64,
}

impl BucketMap {
    /// About `N / 2^coarseness` buckets (at least 64, at most 2^15, so every index fits a
    /// [`Bucket`] and a signed 16-bit lane) over the survivals' range. Requires at least one
    /// scheduled slot.
    pub(crate) fn new(survivals: &Survivals, coarseness: u32) -> Self {
        let top = survivals.max.to_bits();
        let span = (top - survivals.min.to_bits()).min(MAX_SPAN_BINADES << 52);
        let bucket_bits = bucket_bits(survivals.count, coarseness);
        let span_bits = u64::BITS - span.leading_zeros();
        let shift = span_bits.saturating_sub(bucket_bits);
        BucketMap {
            top,
            shift,
            // (top − bits(v)) ≤ span < 2^span_bits, so the index stays below 2^bucket_bits.
            len: (span >> shift) as usize + 1,
            floor: f64::from_bits(top - span),
            ceiling: survivals.max,
        }
    }

    /// Number of buckets.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bucket of `value`; larger values get smaller or equal buckets.
    #[inline]
    pub(crate) fn bucket(&self, value: f64) -> usize {
        // Plain comparisons (`maxsd`/`minsd`, vectorizable): survivals are never NaN.
        let low = if value > self.floor {
            value
        } else {
            self.floor
        };
        let clamped = if low < self.ceiling {
            low
        } else {
            self.ceiling
        };
        ((self.top - clamped.to_bits()) >> self.shift) as usize
    }

    /// The values in buckets `≥ bucket` (for `bucket ≤ len`) are exactly those `≤` this bound.
    pub(crate) fn upper_bound(&self, bucket: usize) -> f64 {
        if bucket == 0 {
            return f64::INFINITY;
        }
        if bucket >= self.len {
            return f64::NEG_INFINITY;
        }
        // bucket(v) ≥ j  ⟺  bits(max(v, floor)) ≤ top − (j << shift), and j < len keeps
        // that at or above the floor.
        f64::from_bits(self.top - ((bucket as u64) << self.shift))
    }

    /// Bucket indices of every slot, scheduled or not: one vector pass (clamp, subtract,
    /// shift, narrow), on AVX2 or AVX-512 where the CPU has it (integer arithmetic and exact
    /// clamps: the same indices on every level). The scatter that follows is cheaper without the index
    /// arithmetic in its loop.
    pub(crate) fn indices(&self, survivals: &Survivals, out: &mut Vec<Bucket>) {
        let values = &survivals.values;
        // Every entry is written below, so the buffer keeps its old contents.
        out.resize(values.len(), 0);
        self.indices_at(crate::simd::level(), values, out);
    }

    /// The bucket of every value into `out` (of the same length), on the variant for `level`,
    /// which must be one this CPU runs ([`crate::simd::available`]).
    #[inline]
    fn indices_at(&self, level: crate::simd::Level, values: &[f64], out: &mut [Bucket]) {
        crate::simd::dispatch!(
            level,
            avx512: x86::indices_avx512(self, values, out),
            avx2: x86::indices_avx2(self, values, out),
            baseline: self.fill_indices(values, out),
        );
    }

    /// The loop of [`Self::indices`], inlined into each target's variant.
    #[inline(always)]
    fn fill_indices(&self, values: &[f64], out: &mut [Bucket]) {
        for (index, &v) in out.iter_mut().zip(values) {
            *index = self.bucket(v) as Bucket;
        }
    }

    /// [`Self::indices`], then the counts per bucket of the scheduled survivals into `counts`
    /// (length [`Self::len`]).
    pub(crate) fn count(
        &self,
        survivals: &Survivals,
        cols: usize,
        scheduled: &[usize],
        indices: &mut Vec<Bucket>,
        counts: &mut Vec<u32>,
    ) {
        self.indices(survivals, indices);
        counts.clear();
        counts.resize(self.len(), 0);
        let counts = &mut counts[..];
        // SAFETY (each `get_unchecked_mut` below): `indices` was just filled by
        // `Self::indices` with this map, and `bucket` returns at most `len - 1` for any value
        // (values are clamped into `[floor, ceiling]`, whose bucket range is `0..len`), so
        // every index is below `counts.len() == self.len()`.
        if survivals.count == indices.len() {
            for &b in indices.iter() {
                unsafe { *counts.get_unchecked_mut(b as usize) += 1 };
            }
        } else {
            for (row, &n) in indices.chunks_exact(cols).zip(scheduled) {
                for &b in &row[..n] {
                    unsafe { *counts.get_unchecked_mut(b as usize) += 1 };
                }
            }
        }
    }

    /// [`Self::indices`], then the counts and sums per bucket of the scheduled survivals (sums
    /// accumulated slot by slot in row-major order).
    pub(crate) fn count_and_sum(
        &self,
        survivals: &Survivals,
        cols: usize,
        scheduled: &[usize],
        indices: &mut Vec<Bucket>,
        counts: &mut Vec<u32>,
        sums: &mut Vec<f64>,
    ) {
        self.indices(survivals, indices);
        counts.clear();
        counts.resize(self.len(), 0);
        sums.clear();
        sums.resize(self.len(), 0.0);
        let (counts, sums) = (&mut counts[..], &mut sums[..]);
        // SAFETY (each `get_unchecked_mut` below): as in `Self::count`, every index is below
        // `self.len()`, the length of both `counts` and `sums`.
        if survivals.count == indices.len() {
            for (&b, &v) in indices.iter().zip(&survivals.values) {
                unsafe {
                    *counts.get_unchecked_mut(b as usize) += 1;
                    *sums.get_unchecked_mut(b as usize) += v;
                }
            }
        } else {
            let rows = indices
                .chunks_exact(cols)
                .zip(survivals.values.chunks_exact(cols))
                .zip(scheduled);
            for ((row, values), &n) in rows {
                for (&b, &v) in row[..n].iter().zip(values) {
                    unsafe {
                        *counts.get_unchecked_mut(b as usize) += 1;
                        *sums.get_unchecked_mut(b as usize) += v;
                    }
                }
            }
        }
    }
}

/// The bucket-index pass and the rows' gather compiled for AVX2 and AVX-512 (the same code,
/// wider vectors; AVX-512 narrows the 64-bit indices to 16 bits in one instruction and moves a
/// row of 8 survivals in one).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Bucket, BucketMap};

    crate::simd::wide_variants! {
        fn indices_avx2 / indices_avx512 [] (map: &BucketMap, values: &[f64], out: &mut [Bucket]) {
            map.fill_indices(values, out);
        }
        fn gather_avx2 / gather_avx512 [] (cols: usize, rows: (&[f64], &[i64], &mut [f64])) {
            super::gather_any(cols, rows);
        }
    }
}

/// Buffers reused by [`sort_descending`].
#[derive(Default)]
pub(crate) struct SortBuffers {
    counts: Vec<u32>,
    spill: Vec<f64>,
}

impl SortBuffers {
    /// Room to sort up to `slots` values without allocating: one count per bucket (at most
    /// `2^min(bits(n), 15) + 1` of them, and `+ 1` for the prefix sums) and the spill.
    pub(crate) fn reserve(&mut self, slots: usize) {
        reserve_len(&mut self.counts, most_buckets(slots, 0) + 2);
        reserve_len(&mut self.spill, slots);
    }
}

/// Up to this many values are sorted by insertion alone.
const INSERTION: usize = 32;

/// Sorts survivals (finite, `≥ 0`, never `-0.0`) descending.
///
/// One counting pass distributes them into about `n` equal-width buckets of bit-pattern space
/// between their extremes, then a single insertion pass fixes the order inside buckets: linear
/// on spread values, where a comparison sort pays `log n` mispredicted branches per element.
pub(crate) fn sort_descending(values: &mut [f64], buffers: &mut SortBuffers) {
    let n = values.len();
    if n > INSERTION {
        let (top, bottom) = values.iter().fold((0u64, u64::MAX), |(hi, lo), &v| {
            (hi.max(v.to_bits()), lo.min(v.to_bits()))
        });
        let span = top - bottom;
        if span == 0 {
            return;
        }
        let bucket_bits = (usize::BITS - n.leading_zeros()).min(15);
        let shift = (u64::BITS - span.leading_zeros()).saturating_sub(bucket_bits);
        let bucket = |v: f64| ((top - v.to_bits()) >> shift) as usize;
        let SortBuffers { counts, spill } = buffers;
        counts.clear();
        counts.resize((span >> shift) as usize + 2, 0);
        for &v in values.iter() {
            counts[bucket(v) + 1] += 1;
        }
        for b in 1..counts.len() {
            counts[b] += counts[b - 1];
        }
        spill.clear();
        spill.resize(n, 0.0);
        for &v in values.iter() {
            let slot = &mut counts[bucket(v)];
            spill[*slot as usize] = v;
            *slot += 1;
        }
        values.copy_from_slice(spill);
        // A crowded bucket (values clustered far below the top) is sorted by comparison, so
        // the insertion pass below stays linear whatever the distribution.
        let mut start = 0usize;
        for &end in counts.iter() {
            let end = end as usize;
            if end - start > INSERTION {
                values[start..end].sort_unstable_by(|a, b| b.total_cmp(a));
            }
            start = end;
        }
    }
    for i in 1..n {
        let v = values[i];
        let mut j = i;
        while j > 0 && values[j - 1] < v {
            values[j] = values[j - 1];
            j -= 1;
        }
        values[j] = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn survivals(conf: &[f64], rows: usize, cols: usize, sched: &[usize]) -> Survivals {
        let mut s = Survivals::default();
        assert!(s.compute(MatrixView::new("c", conf, rows, cols).unwrap(), sched));
        s
    }

    #[test]
    fn negative_zero_becomes_zero() {
        let s = survivals(&[-0.0, 0.5], 1, 2, &[2]);
        assert_eq!(s.values[0].to_bits(), 0);
        assert_eq!(s.values[1].to_bits(), 0);
    }

    /// Every level's bucket indices against [`BucketMap::bucket`] one value at a time: maps
    /// over spreads from one value to many binades (values clamped at the floor), lengths that
    /// fill the vectors and lengths left over, zeros and subnormals.
    #[test]
    fn every_level_buckets_as_the_scalar_map() {
        let mut next = crate::planner::tests::xorshift(0x2545_f491_4f6c_dd1du64);
        for len in [1usize, 3, 4, 7, 8, 9, 15, 16, 17, 31, 64, 100, 257, 2048] {
            for spread in [0u32, 1, 8, 60, 300, 1100] {
                let values: Vec<f64> = (0..len)
                    .map(|_| {
                        let r = next();
                        match r % 11 {
                            0 => 0.0,
                            1 => f64::MIN_POSITIVE / 7.0,
                            _ => {
                                let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
                                unit * 2f64.powi(-((next() % (spread as u64 + 1)) as i32))
                            }
                        }
                    })
                    .collect();
                // Every fifth row unscheduled: its value may lie above the map's ceiling.
                let sched: Vec<usize> = (0..len).map(|i| usize::from(i % 5 != 0)).collect();
                let s = survivals(
                    &values.iter().map(|&v| v.min(1.0)).collect::<Vec<_>>(),
                    len,
                    1,
                    &sched,
                );
                if s.count == 0 {
                    continue;
                }
                let map = BucketMap::new(&s, 4);
                let expected: Vec<Bucket> =
                    s.values.iter().map(|&v| map.bucket(v) as Bucket).collect();
                assert!(expected.iter().all(|&b| (b as usize) < map.len()));
                for level in crate::simd::available() {
                    let mut got = vec![Bucket::MAX; len];
                    map.indices_at(level, &s.values, &mut got);
                    assert_eq!(got, expected, "{level:?} len {len} spread {spread}");
                }
            }
        }
    }

    /// Every level's gather of remembered rows against a plain copy, for depths with and
    /// without a fixed-size copy, slots in any order and repeated.
    #[test]
    fn every_level_gathers_the_slots_rows() {
        for cols in [1usize, 2, 3, 4, 5, 8, 12, 16, 17] {
            let num_slots = 11;
            let source: Vec<f64> = (0..num_slots * cols).map(|i| i as f64 / 7.0).collect();
            for slots in [vec![], vec![3i64], vec![10, 0, 5, 5, 2, 9, 1, 7]] {
                let expected: Vec<f64> = slots
                    .iter()
                    .flat_map(|&s| source[s as usize * cols..(s as usize + 1) * cols].to_vec())
                    .collect();
                for level in crate::simd::available() {
                    let mut out = vec![f64::NAN; slots.len() * cols];
                    gather_at(level, cols, (&source, &slots, &mut out));
                    assert_eq!(out, expected, "{level:?} {cols} {slots:?}");
                }
            }
        }
    }

    /// Every level's survivals against the definition (each row multiplied left to right
    /// from 1.0, `-0.0` read as `+0.0`), bit for bit, and its range check against a plain
    /// test of every confidence: both element types, rows that fill the four-row blocks and
    /// rows left over, depths that are and are not multiples of 4, and subnormal, zero,
    /// negative-zero and out-of-range confidences.
    #[test]
    fn every_level_multiplies_as_the_definition() {
        fn check<T: Copy + Into<f64> + std::fmt::Debug>(data: &[T], rows: usize, cols: usize) {
            let mut expected = Vec::with_capacity(data.len());
            for row in data.chunks_exact(cols) {
                let mut survival = 1.0f64;
                for &p in row {
                    let p: f64 = p.into();
                    survival *= if p == 0.0 { 0.0 } else { p };
                    expected.push(survival);
                }
            }
            let valid = data.iter().all(|&p| (0.0..=1.0).contains(&p.into()));
            for level in crate::simd::available() {
                let mut values = vec![f64::NAN; rows * cols];
                let ok = multiply_at(level, cols, (data, &mut values[..]));
                assert_eq!(ok, valid, "{level:?} {rows}x{cols} {data:?}");
                let (got, want): (Vec<u64>, Vec<u64>) = (
                    values.iter().map(|v| v.to_bits()).collect(),
                    expected.iter().map(|v| v.to_bits()).collect(),
                );
                assert_eq!(got, want, "{level:?} {rows}x{cols} {data:?}");
            }
        }
        let special = [
            0.0,
            -0.0,
            1.0,
            0.5,
            f64::MIN_POSITIVE,
            f64::MIN_POSITIVE / 3.0,
            1e-300,
            0.999_999_999_999,
            0.3,
        ];
        let mut next = crate::planner::tests::xorshift(0x9e37_79b9_7f4a_7c15u64);
        for cols in 1..=17 {
            for rows in 0..=9 {
                for trial in 0..4 {
                    let data: Vec<f64> = (0..rows * cols)
                        .map(|_| {
                            let r = next();
                            if r % 5 == 0 {
                                special[(r / 5) as usize % special.len()]
                            } else {
                                (r >> 11) as f64 / (1u64 << 53) as f64
                            }
                        })
                        .collect();
                    check(&data, rows, cols);
                    let narrow: Vec<f32> = data.iter().map(|&p| p as f32).collect();
                    check(&narrow, rows, cols);
                    if rows > 0 && trial == 3 {
                        for bad in [f64::NAN, 1.5, -0.25, f64::INFINITY] {
                            let mut spoiled = data.clone();
                            let at = (next() as usize) % spoiled.len();
                            spoiled[at] = bad;
                            check(&spoiled, rows, cols);
                            let narrow: Vec<f32> = spoiled.iter().map(|&p| p as f32).collect();
                            check(&narrow, rows, cols);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn out_of_range_is_reported() {
        for bad in [f64::NAN, 1.5, -0.5, f64::INFINITY] {
            let mut s = Survivals::default();
            let data = [0.5, bad];
            let view = MatrixView::new("c", &data[..], 1, 2).unwrap();
            assert!(!s.compute(view, &[1]));
        }
    }

    #[test]
    fn prefix_sums_add_each_admitted_prefix() {
        let s = survivals(&[0.5, 0.5, 1.0, 0.25, 0.0, 1.0], 2, 3, &[3, 2]);
        assert_eq!(s.prefix_sum(3, &[2, 0]), 0.75);
        assert_eq!(s.prefix_sum(3, &[3, 2]), 1.0 + 0.25);
    }

    proptest! {
        /// Buckets are monotone, and `upper_bound` separates them exactly.
        #[test]
        fn buckets_are_monotone_and_bounds_exact(
            rows in 1usize..60,
            cols in 1usize..10,
            seed in prop::collection::vec(
                prop_oneof![Just(0.0), Just(1.0), Just(0.5), 0.0f64..=1.0, 0.9f64..=1.0],
                600,
            ),
            sched_seed in prop::collection::vec(0usize..11, 60),
            coarseness in 0u32..4,
        ) {
            let conf: Vec<f64> = (0..rows * cols).map(|i| seed[i % seed.len()]).collect();
            let mut sched: Vec<usize> = (0..rows).map(|r| sched_seed[r] % (cols + 1)).collect();
            sched[0] = cols;
            let s = survivals(&conf, rows, cols, &sched);
            let map = BucketMap::new(&s, coarseness);
            let mut indices = Vec::new();
            let mut counts = Vec::new();
            map.count(&s, cols, &sched, &mut indices, &mut counts);
            prop_assert_eq!(counts.iter().map(|&c| c as usize).sum::<usize>(), s.count);
            let mut all = Vec::new();
            s.gather(cols, &sched, &mut all);
            let mut plain = all.clone();
            plain.sort_by(|a, b| b.total_cmp(a));
            sort_descending(&mut all, &mut SortBuffers::default());
            prop_assert_eq!(&all, &plain);
            for w in all.windows(2) {
                prop_assert!(map.bucket(w[0]) <= map.bucket(w[1]));
            }
            for &v in &all {
                let b = map.bucket(v);
                prop_assert!(b < map.len());
                prop_assert!(v <= map.upper_bound(b));
                prop_assert!(b == map.len() - 1 || v > map.upper_bound(b + 1));
            }
            let bound = all[all.len() / 2];
            for (r, &n) in sched.iter().enumerate() {
                let expected = s.row(r, cols, n).iter().filter(|&&v| v > bound).count();
                prop_assert_eq!(super::super::counting::count_above(s.full_row(r, cols), n, bound), expected);
            }
        }
    }
}
