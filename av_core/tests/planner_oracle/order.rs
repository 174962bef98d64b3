use super::counting::Bucket;
use crate::matrix::MatrixView;

pub(crate) struct Survivals {
    pub values: Vec<f64>,
    pub cumulative: Vec<f64>,
    pub max: f64,
    pub min: f64,
    pub count: usize,
}

impl Default for Survivals {
    fn default() -> Self {
        Survivals {
            values: Vec::new(),
            cumulative: Vec::new(),
            max: 0.0,
            min: 1.0,
            count: 0,
        }
    }
}

impl Survivals {
    #[must_use]
    pub(crate) fn compute<T: Copy + Into<f64>>(
        &mut self,
        confidences: MatrixView<'_, T>,
        scheduled: &[usize],
        running_sums: bool,
    ) -> bool {
        let cols = confidences.cols();
        let len = confidences.rows() * cols;
        // Every entry of the whole rows is written below, so the buffers keep their old contents
        // instead of being zeroed each call (`resize` fills only when they grow).
        self.values.resize(len, 0.0);
        if running_sums && cols > 0 {
            self.cumulative.resize(len, 0.0);
        } else {
            self.cumulative.clear();
        }
        self.max = 0.0;
        self.min = 1.0;
        self.count = 0;
        if cols == 0 {
            return true;
        }
        let data = confidences.data();
        // A separate, vectorized pass: fused into the multiply chain below it costs more. (The
        // slice cannot change under us: the bindings hand the core their own copy of a
        // caller's buffer, and Rust's `&[T]` promises no writer.)
        let in_range = data.iter().fold(true, |ok, &p| ok & probability(p.into()));
        let rows = (data, &mut self.values[..], &mut self.cumulative[..]);
        // Common depths get a loop the compiler unrolls (independent rows then overlap).
        match cols {
            1 => fill_rows::<T, 1>(rows, running_sums),
            2 => fill_rows::<T, 2>(rows, running_sums),
            3 => fill_rows::<T, 3>(rows, running_sums),
            4 => fill_rows::<T, 4>(rows, running_sums),
            5 => fill_rows::<T, 5>(rows, running_sums),
            6 => fill_rows::<T, 6>(rows, running_sums),
            7 => fill_rows::<T, 7>(rows, running_sums),
            8 => fill_rows::<T, 8>(rows, running_sums),
            10 => fill_rows::<T, 10>(rows, running_sums),
            12 => fill_rows::<T, 12>(rows, running_sums),
            16 => fill_rows::<T, 16>(rows, running_sums),
            _ => fill_rows_any(cols, rows),
        };
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

    pub(crate) fn recount(&mut self, cols: usize, scheduled: &[usize]) {
        let (mut max, mut min, mut count) = (0.0f64, 1.0f64, 0usize);
        if cols > 0 {
            for (row, &n) in self.values.chunks_exact(cols).zip(scheduled) {
                if n > 0 {
                    max = max.max(row[0]);
                    min = min.min(row[n - 1]);
                }
                count += n;
            }
        }
        (self.max, self.min, self.count) = (max, min, count);
    }

    pub(crate) fn prefix_sum(&self, cols: usize, admitted: &[i32]) -> f64 {
        debug_assert_eq!(self.cumulative.len(), self.values.len());
        admitted
            .iter()
            .enumerate()
            .filter(|&(_, &a)| a > 0)
            .map(|(r, &a)| self.cumulative[r * cols + a as usize - 1])
            .sum()
    }

    #[inline]
    pub(crate) fn row(&self, r: usize, cols: usize, scheduled: usize) -> &[f64] {
        &self.values[r * cols..r * cols + scheduled]
    }

    #[inline]
    pub(crate) fn full_row(&self, r: usize, cols: usize) -> &[f64] {
        &self.values[r * cols..(r + 1) * cols]
    }

    pub(crate) fn gather(&self, cols: usize, scheduled: &[usize], out: &mut Vec<f64>) {
        out.clear();
        for (r, &n) in scheduled.iter().enumerate() {
            out.extend_from_slice(self.row(r, cols, n));
        }
    }
}

type Rows<'a, T> = (&'a [T], &'a mut [f64], &'a mut [f64]);

#[inline(always)]
fn probability(p: f64) -> bool {
    (0.0..=1.0).contains(&p)
}

fn fill_rows<T: Copy + Into<f64>, const K: usize>(
    (data, values, cumulative): Rows<'_, T>,
    running_sums: bool,
) {
    if !running_sums {
        for (row, out) in data.chunks_exact(K).zip(values.chunks_exact_mut(K)) {
            let mut survival = 1.0f64;
            for k in 0..K {
                // `+ 0.0` folds a `-0.0` confidence onto `+0.0` (off the multiply chain).
                survival *= row[k].into() + 0.0;
                out[k] = survival;
            }
        }
        return;
    }
    let rows = data
        .chunks_exact(K)
        .zip(values.chunks_exact_mut(K))
        .zip(cumulative.chunks_exact_mut(K));
    for ((row, out), sums) in rows {
        let mut survival = 1.0f64;
        let mut sum = 0.0f64;
        for k in 0..K {
            survival *= row[k].into() + 0.0;
            sum += survival;
            out[k] = survival;
            sums[k] = sum;
        }
    }
}

fn fill_rows_any<T: Copy + Into<f64>>(cols: usize, (data, values, cumulative): Rows<'_, T>) {
    for (r, (row, out)) in data
        .chunks_exact(cols)
        .zip(values.chunks_exact_mut(cols))
        .enumerate()
    {
        let mut survival = 1.0f64;
        for (value, &p) in out.iter_mut().zip(row) {
            survival *= p.into() + 0.0;
            *value = survival;
        }
        if let Some(sums) = cumulative.get_mut(r * cols..(r + 1) * cols) {
            let mut sum = 0.0f64;
            for (running, &v) in sums.iter_mut().zip(out.iter()) {
                sum += v;
                *running = sum;
            }
        }
    }
}

const MAX_SPAN_BINADES: u64 = 40;

#[derive(Clone, Copy, Debug)]
pub(crate) struct BucketMap {
    top: u64,
    shift: u32,
    len: usize,
    floor: f64,
    ceiling: f64,
}

impl BucketMap {
    pub(crate) fn new(survivals: &Survivals, coarseness: u32) -> Self {
        let n = survivals.count;
        let top = survivals.max.to_bits();
        let span = (top - survivals.min.to_bits()).min(MAX_SPAN_BINADES << 52);
        let bucket_bits = (usize::BITS - n.leading_zeros())
            .saturating_sub(coarseness)
            .clamp(6, 15);
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

    pub(crate) fn len(&self) -> usize {
        self.len
    }

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

    pub(crate) fn indices(&self, survivals: &Survivals, out: &mut Vec<Bucket>) {
        out.clear();
        out.extend(survivals.values.iter().map(|&v| self.bucket(v) as Bucket));
    }

    pub(crate) fn histogram(
        &self,
        survivals: &Survivals,
        cols: usize,
        scheduled: &[usize],
        indices: &[Bucket],
        counts: &mut Vec<u32>,
    ) {
        counts.clear();
        counts.resize(self.len(), 0);
        if survivals.count == indices.len() {
            for &b in indices {
                counts[b as usize] += 1;
            }
        } else {
            for (row, &n) in indices.chunks_exact(cols).zip(scheduled) {
                for &b in &row[..n] {
                    counts[b as usize] += 1;
                }
            }
        }
    }

    pub(crate) fn histogram_with_sums(
        &self,
        survivals: &Survivals,
        cols: usize,
        scheduled: &[usize],
        indices: &[Bucket],
        counts: &mut Vec<u32>,
        sums: &mut Vec<f64>,
    ) {
        counts.clear();
        counts.resize(self.len(), 0);
        sums.clear();
        sums.resize(self.len(), 0.0);
        if survivals.count == indices.len() {
            for (&b, &v) in indices.iter().zip(&survivals.values) {
                counts[b as usize] += 1;
                sums[b as usize] += v;
            }
        } else {
            let rows = indices
                .chunks_exact(cols)
                .zip(survivals.values.chunks_exact(cols))
                .zip(scheduled);
            for ((row, values), &n) in rows {
                for (&b, &v) in row[..n].iter().zip(values) {
                    counts[b as usize] += 1;
                    sums[b as usize] += v;
                }
            }
        }
    }
}

#[derive(Default)]
pub(crate) struct SortBuffers {
    counts: Vec<u32>,
    spill: Vec<f64>,
}

const INSERTION: usize = 32;

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
