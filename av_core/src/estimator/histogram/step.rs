//! One step's histograms as observe builds them, before they join the open round
//! ([`super::HistogramAccumulator::try_add_step`]).

use super::{Binning, HistogramStats};

/// One step's histograms as observe builds them: per bin (`k·B + b`) its three sums side by
/// side, `[count, accepted, x_sum]`, so binning a draft touches one place (one bounds check,
/// one cache line) rather than three columns, and the list of the bins that hold a draft (in
/// the order they were first added to), so that adding the step to the round and clearing it
/// afterwards visit only those bins (a step at R = 256, K = 8 occupies about a fifth of the
/// 512 default bins). Reusable: [`clear`](Self::clear) empties it in time proportional to the
/// occupied bins.
#[derive(Clone, Debug)]
pub(crate) struct StepHistogram {
    num_positions: usize,
    bins: usize,
    sums: Vec<[u64; 3]>,
    /// The occupied bins, first `num_touched` entries (room for every bin).
    touched: Vec<u32>,
    num_touched: usize,
}

impl StepHistogram {
    /// Empty histograms.
    pub(crate) fn new(num_positions: usize, bins: usize) -> Self {
        let len = num_positions * bins;
        StepHistogram {
            num_positions,
            bins,
            sums: vec![[0; 3]; len],
            touched: vec![0; len],
            num_touched: 0,
        }
    }

    /// Adds one labeled draft to bin `index` (`k·B + b`) with fixed-point offset `offset`
    /// ([`Binning::locate`]).
    #[inline(always)]
    #[cfg_attr(not(test), allow(dead_code))] // observe adds whole rows (`add_rows`)
    pub(crate) fn add(&mut self, index: usize, accepted: bool, offset: u64) {
        let (sums, touched) = (&mut self.sums[..], &mut self.touched[..]);
        add_draft(
            sums,
            touched,
            &mut self.num_touched,
            index,
            accepted,
            offset,
        );
    }

    /// Adds the labeled drafts of a block of rows: row `r`'s features were located at
    /// `bin_of[r·K..]` and `offset_of[r·K..]` ([`Binning::locate_all`]), its first
    /// `num_labeled(admitted[r], accepted[r])` positions are labeled, the first `accepted[r]`
    /// of them accepted (`K` = the histograms' positions). The counts are the caller's to
    /// check (`0 ≤ accepted ≤ admitted ≤ K`); impossible ones add at most `K` drafts a row,
    /// in range. Out of line: inlined into observe's body, the loop runs out of registers and
    /// shuffles and reloads some on every draft.
    #[inline(never)]
    pub(crate) fn add_rows(
        &mut self,
        bin_of: &[u32],
        offset_of: &[u64],
        admitted: &[i64],
        accepted: &[i64],
    ) {
        let (k, bins) = (self.num_positions, self.bins);
        // The list's length in a local: through `&mut self` it would be stored back on every
        // draft (the compiler cannot tell the list's buffer from the field).
        let (sums, touched) = (&mut self.sums[..], &mut self.touched[..]);
        let mut num_touched = self.num_touched;
        let rows = admitted.iter().zip(accepted);
        for ((&admitted, &accepted), (bin_of, offset_of)) in
            rows.zip(bin_of.chunks_exact(k).zip(offset_of.chunks_exact(k)))
        {
            // The labeled drafts: the accepted ones, then the first rejection. On valid
            // counts `labeled ≤ k`; `min` keeps the slices in range regardless.
            let (admitted, accepted) = (admitted as usize, accepted as usize);
            let labeled = crate::estimator::labels::num_labeled(admitted, accepted).min(k);
            let located = bin_of[..labeled].iter().zip(&offset_of[..labeled]);
            for (position, (&bin, &offset)) in located.enumerate() {
                let index = position * bins + bin as usize;
                add_draft(
                    sums,
                    touched,
                    &mut num_touched,
                    index,
                    position < accepted,
                    offset,
                );
            }
        }
        self.num_touched = num_touched;
    }

    /// [`add_rows`](Self::add_rows) locating each labeled feature of `features` (row-major
    /// `[R, K]`) where it is read (as [`Binning::locate_all`] does); returns whether every one
    /// of them is finite.
    /// Runs on the widest vectors the CPU has ([`crate::simd`]): the loop is scalar, but the
    /// wider instruction sets' three-operand forms and (AVX-512) 32 registers keep its values
    /// in registers. The same bits on every variant (nothing is fused).
    #[inline]
    pub(crate) fn locate_rows<T: Copy + Into<f64>>(
        &mut self,
        binning: &Binning,
        features: &[T],
        admitted: &[i64],
        accepted: &[i64],
    ) -> bool {
        self.locate_rows_at(
            crate::simd::level(),
            binning,
            features,
            (admitted, accepted),
        )
    }

    /// [`locate_rows`](Self::locate_rows) on the variant for `level`, which must be one this
    /// CPU runs ([`crate::simd::available`]).
    #[inline]
    pub(crate) fn locate_rows_at<T: Copy + Into<f64>>(
        &mut self,
        level: crate::simd::Level,
        binning: &Binning,
        features: &[T],
        counts: (&[i64], &[i64]),
    ) -> bool {
        crate::simd::dispatch!(
            level,
            avx512: x86::locate_rows_avx512(self, binning, features, counts),
            avx2: x86::locate_rows_avx2(self, binning, features, counts),
            baseline: self.locate_rows_baseline(binning, features, counts),
        )
    }

    /// The body of every [`locate_rows`](Self::locate_rows) variant.
    #[inline(always)]
    fn locate_rows_baseline<T: Copy + Into<f64>>(
        &mut self,
        binning: &Binning,
        features: &[T],
        (admitted, accepted): (&[i64], &[i64]),
    ) -> bool {
        let (k, bins) = (self.num_positions, self.bins);
        let (sums, touched) = (&mut self.sums[..], &mut self.touched[..]);
        let mut num_touched = self.num_touched;
        let mut finite = true;
        let rows = admitted.iter().zip(accepted);
        for ((&admitted, &accepted), row) in rows.zip(features.chunks_exact(k)) {
            let (admitted, accepted) = (admitted as usize, accepted as usize);
            let labeled = crate::estimator::labels::num_labeled(admitted, accepted).min(k);
            for (position, &x) in row[..labeled].iter().enumerate() {
                let x: f64 = x.into();
                finite &= x.is_finite();
                let (bin, offset) = binning.locate_branch_free(x);
                add_draft(
                    sums,
                    touched,
                    &mut num_touched,
                    position * bins + bin as usize,
                    position < accepted,
                    offset,
                );
            }
        }
        self.num_touched = num_touched;
        finite
    }

    /// The bins that hold a draft, each once, in the order they were first added to.
    pub(crate) fn occupied(&self) -> impl Iterator<Item = usize> + Clone + '_ {
        self.touched[..self.num_touched]
            .iter()
            .map(|&index| index as usize)
    }

    /// Number of bins `K·B`.
    pub(crate) fn num_bins(&self) -> usize {
        self.sums.len()
    }

    /// The sums `[count, accepted, x_sum]` of bin `index`.
    #[inline(always)]
    pub(crate) fn sums(&self, index: usize) -> [u64; 3] {
        self.sums[index]
    }

    /// Empties every bin (only the occupied ones are written).
    pub(crate) fn clear(&mut self) {
        for &index in &self.touched[..self.num_touched] {
            if let Some(sums) = self.sums.get_mut(index as usize) {
                *sums = [0; 3];
            }
        }
        self.num_touched = 0;
    }

    /// The same histograms as columns.
    pub(crate) fn into_stats(self) -> HistogramStats {
        let mut stats = HistogramStats::new(self.num_positions, self.bins);
        for index in self.occupied() {
            let [n, a, x] = self.sums[index];
            stats.count[index] = n;
            stats.accepted[index] = a;
            stats.x_sum[index] = x;
        }
        stats
    }
}

/// [`StepHistogram::locate_rows`] compiled for AVX2 and AVX-512 (the same code).
#[cfg(target_arch = "x86_64")]
mod x86 {
    crate::simd::wide_variants! {
        fn locate_rows_avx2 / locate_rows_avx512 [T: Copy + Into<f64>] (
            histogram: &mut super::StepHistogram,
            binning: &super::Binning,
            features: &[T],
            counts: (&[i64], &[i64]),
        ) -> bool {
            histogram.locate_rows_baseline(binning, features, counts)
        }
    }
}

/// Adds one labeled draft to bin `index` of a [`StepHistogram`]'s sums, listing the bin in
/// `touched[..num_touched]` if it was empty.
#[inline(always)]
fn add_draft(
    sums: &mut [[u64; 3]],
    touched: &mut [u32],
    num_touched: &mut usize,
    index: usize,
    accepted: bool,
    offset: u64,
) {
    let sums = &mut sums[index];
    // Branch-free: the bin is written at the end of the list every time, and the list grows
    // over it when the bin was empty. While the list has room; once it holds every bin
    // (`K·B`, which `u32` indexes: `K ≤ 64`, `B ≤ 1024`), none is empty.
    if let Some(slot) = touched.get_mut(*num_touched) {
        *slot = index as u32;
    }
    *num_touched += usize::from(sums[0] == 0);
    sums[0] += 1;
    sums[1] += u64::from(accepted);
    sums[2] = sums[2].wrapping_add(offset);
}
