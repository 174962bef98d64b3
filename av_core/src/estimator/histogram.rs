//! Per-position histograms of the feature with exact label counts: the statistics of the `map`
//! update ([`super::map`]).
//!
//! The clamped feature `x ∈ [−L, L]` (`L = max_log_odds`) falls in one of `B` equal bins
//! (`B = bins`, 64 by default, so 1.25 log-odds wide at `L = 40`):
//!
//! ```text
//! u = clamp(x, −L, L) + L        b = min(B − 1, ⌊u · B / (2L)⌋)
//! ```
//!
//! two IEEE operations without a fused multiply-add, so every machine puts a feature in the same
//! bin, and `x = L` falls in the last one. Per position `k` and bin `b` a round keeps three
//! integers: the labeled drafts `count`, the accepted ones `accepted`, and `x_sum = Σ round(u ·
//! 2^16)`, the features' sum in fixed point, offset by `L` so that every term is a non-negative
//! integer below `2L · 2^16 ≤ 2^24`. Integer sums do not depend on order: the same observations
//! give the same bits in any order, on any thread, in any split into calls, on any rank. From
//! them the bin's mean feature is exact to `2^-17`, which is all the likelihood needs:
//! `Σ_{drafts in the bin} log p(y | x)` is evaluated at the bin's mean, and a bin 1.25 wide
//! changes the fitted coefficients by less than their standard errors (docs/estimator.md,
//! ablations).
//!
//! A bin holds at most [`MAX_BIN_COUNT`] labels per round (`2^40`: a trillion drafts in one bin
//! without a refit), so `x_sum` stays below `2^64`. Memory is `O(K·B)` whatever the traffic.
//!
//! Past rounds are kept as [`HistogramMemory`]: the same three sums as floats (`x` in feature
//! units), discounted by `γ` per round.

use super::accumulator::MAX_COUNT;
use super::fixed_point::{MAGIC, MAGIC_BITS};
use crate::error::{Error, Result};
use crate::sync::{Mutex, MutexGuard};

/// Default number of bins over `[−max_log_odds, max_log_odds]`.
pub const DEFAULT_BINS: usize = 64;
/// Most bins a histogram may have.
pub const MAX_BINS: usize = 1024;
/// Fraction bits of the fixed-point feature sums.
pub const X_FRACTION_BITS: u32 = 16;
/// `2^X_FRACTION_BITS`.
pub const X_SCALE: f64 = (1u64 << X_FRACTION_BITS) as f64;
/// Most labels one bin of one round may hold (`2^40`); with terms below `2^24`, `x_sum` then
/// stays below `2^64`.
pub const MAX_BIN_COUNT: u64 = 1 << 40;

/// Where a feature goes: the bin and its fixed-point offset.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Binning {
    limit: f64,
    bins: usize,
    scale: f64,
}

impl Binning {
    /// `bins` equal bins over `[−limit, limit]` (`limit > 0`, `bins ≥ 1`).
    pub fn new(limit: f64, bins: usize) -> Self {
        Binning {
            limit,
            bins,
            scale: bins as f64 / (2.0 * limit),
        }
    }

    /// The clamp `L`.
    pub fn limit(&self) -> f64 {
        self.limit
    }

    /// Number of bins `B`.
    pub fn bins(&self) -> usize {
        self.bins
    }

    /// The bin of feature `x` and `round(u · 2^16)` for `u = clamp(x, ±L) + L` (a NaN lands in
    /// bin 0; callers refuse non-finite features first).
    #[inline(always)]
    pub fn locate(&self, x: f64) -> (usize, u64) {
        let u = x.clamp(-self.limit, self.limit) + self.limit;
        // `u · B / (2L)` is in `[0, B]` (B ≤ MAX_BINS) for every non-NaN `x`, so the cast
        // through `i32` is exact and cheaper than one to `usize`; `as` saturates, so a NaN
        // gives bin 0 instead of undefined behaviour (and a negative could only give a huge
        // `usize`, which `min` brings back to the last bin).
        let bin = ((u * self.scale) as i32 as usize).min(self.bins - 1);
        let offset = ((u * X_SCALE + MAGIC).to_bits() as i64).wrapping_sub(MAGIC_BITS) as u64;
        (bin, offset)
    }

    /// [`locate`](Self::locate) for every feature of `xs`: bins to `bins`, offsets to
    /// `offsets` (the first `xs.len()` of each); returns whether every feature is finite. The
    /// same bits as `locate` for every non-NaN feature (a NaN, for which the caller fails
    /// anyway, is located as `−L`: bin 0, offset 0). One branch-free pass that vectorizes: the
    /// expensive part of binning a step. Runs on AVX2's 256-bit vectors where the CPU has them,
    /// AVX-512 CPUs included (512-bit multiplies would lower the core's clock for the code that
    /// follows), else on the baseline ([`crate::simd`]); every variant gives the same bits
    /// (nothing is fused).
    #[inline]
    pub fn locate_all<T: Copy + Into<f64>>(
        &self,
        xs: &[T],
        bins: &mut [u32],
        offsets: &mut [u64],
    ) -> bool {
        self.locate_all_at(crate::simd::level(), xs, bins, offsets)
    }

    /// [`locate_all`](Self::locate_all) on the variant for `level`, which must be one this CPU
    /// runs ([`crate::simd::available`]).
    #[inline]
    pub(crate) fn locate_all_at<T: Copy + Into<f64>>(
        &self,
        level: crate::simd::Level,
        xs: &[T],
        bins: &mut [u32],
        offsets: &mut [u64],
    ) -> bool {
        crate::simd::dispatch!(
            level,
            avx512: x86::locate_all_avx2(self, xs, bins, offsets),
            avx2: x86::locate_all_avx2(self, xs, bins, offsets),
            baseline: self.locate_all_baseline(xs, bins, offsets),
        )
    }

    /// The body of every [`locate_all`](Self::locate_all) variant.
    #[inline(always)]
    fn locate_all_baseline<T: Copy + Into<f64>>(
        &self,
        xs: &[T],
        bins: &mut [u32],
        offsets: &mut [u64],
    ) -> bool {
        let mut finite = true;
        for ((&value, bin), offset) in xs.iter().zip(bins).zip(offsets) {
            let x: f64 = value.into();
            finite &= x.is_finite();
            (*bin, *offset) = self.locate_branch_free(x);
        }
        finite
    }

    /// [`locate`](Self::locate) without a branch or a float-to-int conversion, the body of
    /// [`locate_all`](Self::locate_all) (the same bits for every non-NaN `x`; a NaN is located
    /// as `−L`: bin 0, offset 0).
    #[inline(always)]
    pub(crate) fn locate_branch_free(&self, x: f64) -> (u32, u64) {
        let (limit, scale) = (self.limit, self.scale);
        let last = (self.bins - 1) as f64;
        // `clamp`'s two comparisons, written so that a NaN fails both and takes the lower
        // bound (one `maxpd` and one `minpd` each, where `f64::max`'s NaN rule costs three
        // more instructions): `u` is never NaN.
        let clamped = if x > -limit { x } else { -limit };
        let u = if clamped < limit { clamped } else { limit } + limit;
        // `v = u · B / (2L)` is in `[0, B − 1]` after the `min`, and `⌊v⌋` is `locate`'s
        // `v as usize` (truncation, `v ≥ 0`), taken without a float-to-int conversion (which
        // does not vectorize): the magic-number rounding gives the nearest integer `n` (exact
        // below 2^51), less one when `n > v`.
        let v = u * scale;
        let v = if v < last { v } else { last };
        let shifted = v + MAGIC;
        let nearest = (shifted.to_bits() as i64).wrapping_sub(MAGIC_BITS);
        let bin = nearest.wrapping_sub(i64::from(shifted - MAGIC > v)) as u32;
        let offset = ((u * X_SCALE + MAGIC).to_bits() as i64).wrapping_sub(MAGIC_BITS) as u64;
        (bin, offset)
    }

    /// The range `[lo, hi]` of `u = x + L` over bin `bin`, widened by a few ulps (the bounds
    /// the validation of stored sums uses).
    pub fn offset_range(&self, bin: usize) -> (f64, f64) {
        let width = 2.0 * self.limit / self.bins as f64;
        let slack = 1e-9 * (1.0 + 2.0 * self.limit);
        (
            (bin as f64 * width - slack).max(0.0),
            ((bin + 1) as f64 * width + slack).min(2.0 * self.limit),
        )
    }
}

/// One round's histograms, `K × B` bins stored position-major (`index = k·B + b`). Saved as
/// columns ([`HistogramColumns`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "HistogramColumns", try_from = "HistogramColumns")]
pub struct HistogramStats {
    /// Positions K.
    pub num_positions: usize,
    /// Bins per position B.
    pub bins: usize,
    /// Labeled drafts per bin.
    pub count: Vec<u64>,
    /// Accepted drafts per bin.
    pub accepted: Vec<u64>,
    /// `Σ round((clamp(x) + L) · 2^16)` per bin.
    pub x_sum: Vec<u64>,
}

/// How a round's histograms are saved (`state_dict()["round_stats"]` under `map`): the
/// fixed-point `fraction_bits` of `x_sum`, the bins per position, and the three columns.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct HistogramColumns {
    /// [`X_FRACTION_BITS`] (histograms of another build, or a vllm round, are refused).
    pub fraction_bits: u32,
    /// Bins per position B.
    pub bins: usize,
    /// Labeled drafts per bin.
    #[serde(with = "crate::persist::fixed")]
    pub count: Vec<u64>,
    /// Accepted drafts per bin.
    #[serde(with = "crate::persist::fixed")]
    pub accepted: Vec<u64>,
    /// `Σ round((clamp(x) + L) · 2^16)` per bin.
    #[serde(with = "crate::persist::fixed")]
    pub x_sum: Vec<u64>,
}

impl From<HistogramStats> for HistogramColumns {
    fn from(stats: HistogramStats) -> Self {
        HistogramColumns {
            fraction_bits: X_FRACTION_BITS,
            bins: stats.bins,
            count: stats.count,
            accepted: stats.accepted,
            x_sum: stats.x_sum,
        }
    }
}

impl TryFrom<HistogramColumns> for HistogramStats {
    type Error = String;

    fn try_from(c: HistogramColumns) -> std::result::Result<Self, String> {
        if c.fraction_bits != X_FRACTION_BITS {
            return Err(format!(
                "holds {} fraction bits, this build's histograms {X_FRACTION_BITS}",
                c.fraction_bits
            ));
        }
        // The layout is checked against the estimator's by `validate`.
        Ok(HistogramStats {
            num_positions: c.count.len().checked_div(c.bins).unwrap_or(0),
            bins: c.bins,
            count: c.count,
            accepted: c.accepted,
            x_sum: c.x_sum,
        })
    }
}

impl HistogramStats {
    /// Empty histograms.
    pub fn new(num_positions: usize, bins: usize) -> Self {
        let len = num_positions * bins;
        HistogramStats {
            num_positions,
            bins,
            count: vec![0; len],
            accepted: vec![0; len],
            x_sum: vec![0; len],
        }
    }

    /// Adds one labeled draft at `position` with feature `x` and label `accepted`.
    #[inline]
    #[cfg_attr(not(test), allow(dead_code))] // only the tests call it since Binning is private
    pub(crate) fn add_observation(
        &mut self,
        binning: &Binning,
        position: usize,
        x: f64,
        accepted: bool,
    ) {
        let (bin, offset) = binning.locate(x);
        let index = position * self.bins + bin;
        self.count[index] += 1;
        self.accepted[index] += u64::from(accepted);
        self.x_sum[index] += offset;
    }

    /// Adds another round's histograms bin by bin (the layouts must match; wrapping, so a
    /// corrupt input cannot panic, and valid rounds never wrap).
    pub fn merge(&mut self, other: &HistogramStats) {
        for (mine, theirs) in [
            (&mut self.count, &other.count),
            (&mut self.accepted, &other.accepted),
            (&mut self.x_sum, &other.x_sum),
        ] {
            for (a, &b) in mine.iter_mut().zip(theirs) {
                *a = a.wrapping_add(b);
            }
        }
    }

    /// Labeled drafts over every bin.
    pub fn total_count(&self) -> u64 {
        self.count
            .iter()
            .fold(0u64, |sum, &c| sum.saturating_add(c))
    }

    /// Labeled drafts per position.
    pub fn position_counts(&self) -> Vec<u64> {
        if self.bins == 0 {
            return vec![0; self.num_positions];
        }
        self.count
            .chunks(self.bins)
            .map(|bins| bins.iter().fold(0u64, |sum, &c| sum.saturating_add(c)))
            .collect()
    }

    /// Checks that these histograms could have come from observations of an estimator with
    /// `num_positions` positions, `bins` bins and features clamped to `±max_log_odds`: the
    /// layout, at most [`MAX_BIN_COUNT`] labels per bin and [`MAX_COUNT`] per position, no more
    /// accepted than labeled, and a feature sum that `count` features of that bin can give
    /// (each term is within the bin's range, rounded to the nearest unit). `argument` names them
    /// in the error.
    pub fn validate(
        &self,
        argument: &'static str,
        num_positions: usize,
        bins: usize,
        max_log_odds: f64,
    ) -> Result<()> {
        let len = num_positions * bins;
        if self.num_positions != num_positions
            || self.bins != bins
            || self.count.len() != len
            || self.accepted.len() != len
            || self.x_sum.len() != len
        {
            return Err(Error::value(
                argument,
                format!(
                    "expected {num_positions} positions of {bins} bins ({len} entries per column), \
                     got {} positions of {} bins ({}, {} and {} entries)",
                    self.num_positions,
                    self.bins,
                    self.count.len(),
                    self.accepted.len(),
                    self.x_sum.len()
                ),
            ));
        }
        let binning = Binning::new(max_log_odds, bins);
        for index in 0..len {
            let (k, b) = (index / bins, index % bins);
            let (n, a, x) = (self.count[index], self.accepted[index], self.x_sum[index]);
            let fail = |why: String| {
                Err(Error::value(
                    argument,
                    format!("position {k}, bin {b}: {why}; no sequence of observations gives that"),
                ))
            };
            if n > MAX_BIN_COUNT {
                return fail(format!("count {n} exceeds {MAX_BIN_COUNT}"));
            }
            if a > n {
                return fail(format!("{a} accepted of {n} labeled"));
            }
            let (lo, hi) = binning.offset_range(b);
            let count = n as f64;
            let (least, most) = (
                (count * lo * X_SCALE - count * 0.5 - 1.0).max(0.0),
                count * hi * X_SCALE + count * 0.5 + 1.0,
            );
            let sum = x as f64;
            if n == 0 && x != 0 || sum < least || sum > most {
                return fail(format!(
                    "x_sum {x} is outside [{least}, {most}], the range of {n} features in the bin"
                ));
            }
        }
        for (k, n) in self.position_counts().into_iter().enumerate() {
            if n > MAX_COUNT {
                return Err(Error::value(
                    argument,
                    format!("position {k}: {n} labels exceed {MAX_COUNT}"),
                ));
            }
        }
        Ok(())
    }
}

/// The open round behind [`HistogramAccumulator`]'s lock.
#[derive(Debug)]
struct OpenRound {
    /// Added since the last drain.
    pending: HistogramStats,
    /// Labels per bin of the open round (drained or not, and a restored state's round),
    /// counted when an add lands: what keeps every bin of a round within [`MAX_BIN_COUNT`]
    /// ([`HistogramAccumulator::try_add`]).
    reserved: Vec<u64>,
}

/// The open round's histograms: any number of threads add, one thread at a time (the
/// estimator's refit lock) drains, each under one short lock. A step's histogram is built
/// without it (the binning, the expensive part, runs on every thread at once); the lock covers
/// only the bound check and the plain integer adds of the step's occupied bins, and a drain
/// (a vectorized add of the pending histogram into the caller's, then a clear). So every
/// addition lands whole in exactly one drain, and the bound is checked against everything
/// added before it. Integer sums: the drained histograms do not depend on the order the adds
/// took the lock. One uncontended lock per step costs less than what it replaced, a lock-free
/// double buffer with atomic read-modify-writes per occupied bin (a compare-and-swap for the
/// bound's reservation and up to three adds: some 500 locked operations per step at R = 256,
/// K = 8).
#[derive(Debug)]
pub struct HistogramAccumulator {
    open: Mutex<OpenRound>,
    num_positions: usize,
    bins: usize,
}

// A round's position holds at most `MAX_BINS · MAX_BIN_COUNT` labels: the per-bin bound keeps
// every position within MAX_COUNT too.
const _: () = assert!(MAX_BINS as u64 * MAX_BIN_COUNT <= MAX_COUNT);

impl HistogramAccumulator {
    /// Empty histograms for `num_positions` positions of `bins` bins.
    pub fn new(num_positions: usize, bins: usize) -> Self {
        HistogramAccumulator {
            open: Mutex::new(OpenRound {
                pending: HistogramStats::new(num_positions, bins),
                reserved: vec![0; num_positions * bins],
            }),
            num_positions,
            bins,
        }
    }

    fn lock(&self) -> MutexGuard<'_, OpenRound> {
        // Nothing that holds the lock can panic (integer adds over indices below the layout's
        // length, checked by the callers' layouts), so a poisoned lock still guards a
        // consistent value.
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// [`add`](Self::add), unless that would take a bin of the open round past
    /// [`MAX_BIN_COUNT`] labels (the bound a restored state must meet; it keeps every position
    /// within [`MAX_COUNT`] too): then nothing is added and the error names the position and
    /// the bin (the first in `(k, b)` order that would pass it). Checked and added under the
    /// same lock, so concurrent adds can never together pass the bound.
    pub fn try_add(&self, stats: &HistogramStats) -> std::result::Result<(), (usize, usize)> {
        debug_assert_eq!(stats.count.len(), self.num_positions * self.bins);
        let touched = (0..stats.count.len()).filter(|&index| stats.count[index] != 0);
        self.try_add_bins(touched, |index| {
            [
                stats.count[index],
                stats.accepted[index],
                stats.x_sum[index],
            ]
        })
    }

    /// [`try_add`](Self::try_add) for a step observe built.
    pub(crate) fn try_add_step(
        &self,
        step: &StepHistogram,
    ) -> std::result::Result<(), (usize, usize)> {
        debug_assert_eq!(step.num_bins(), self.num_positions * self.bins);
        self.try_add_bins(step.occupied(), |index| step.sums(index))
    }

    /// Adds the bins `touched` (every occupied bin of the step, each once, in any order), whose
    /// sums `[count, accepted, x_sum]` are `sums(index)`, unless one would pass the bound. One
    /// pass: each bin is checked and added in turn, and a bin that would pass the bound takes
    /// the bins added before it back out (all under the lock, so no one sees them), which
    /// leaves the open round as it was; the error then names the first bin in `(k, b)` order
    /// that would pass the bound.
    #[inline]
    fn try_add_bins(
        &self,
        touched: impl Iterator<Item = usize> + Clone,
        sums: impl Fn(usize) -> [u64; 3],
    ) -> std::result::Result<(), (usize, usize)> {
        let mut open = self.lock();
        let open = &mut *open;
        let fits = |reserved: u64, n: u64| {
            reserved
                .checked_add(n)
                .filter(|&total| total <= MAX_BIN_COUNT)
        };
        for index in touched.clone() {
            let [n, a, x] = sums(index);
            let reserved = &mut open.reserved[index];
            match fits(*reserved, n) {
                Some(total) => *reserved = total,
                None => {
                    for added in touched.clone().take_while(|&added| added != index) {
                        let [n, a, x] = sums(added);
                        open.reserved[added] -= n;
                        let negated = [n.wrapping_neg(), a.wrapping_neg(), x.wrapping_neg()];
                        add_bin(&mut open.pending, added, negated);
                    }
                    let full = touched
                        .filter(|&bin| fits(open.reserved[bin], sums(bin)[0]).is_none())
                        .min()
                        .unwrap_or(index);
                    return Err((full / self.bins, full % self.bins));
                }
            }
            add_bin(&mut open.pending, index, [n, a, x]);
        }
        Ok(())
    }

    /// Counts `round` (a restored state's open round, held outside this accumulator) as part of
    /// the open round for [`try_add`](Self::try_add)'s bound.
    pub fn reserve(&self, round: &HistogramStats) {
        let mut open = self.lock();
        for (reserved, &n) in open.reserved.iter_mut().zip(&round.count) {
            *reserved = reserved.wrapping_add(n);
        }
    }

    /// The round `round` (everything drained for it) has ended: its labels no longer count
    /// toward [`try_add`](Self::try_add)'s bound. Adds since the drain stay counted, for the
    /// round they land in.
    pub fn end_round(&self, round: &HistogramStats) {
        let mut open = self.lock();
        for (reserved, &n) in open.reserved.iter_mut().zip(&round.count) {
            *reserved = reserved.wrapping_sub(n);
        }
    }

    /// Positions K.
    pub fn num_positions(&self) -> usize {
        self.num_positions
    }

    /// Bins per position B.
    pub fn bins(&self) -> usize {
        self.bins
    }

    /// Adds `stats` (same layout) without counting it toward [`try_add`](Self::try_add)'s
    /// bound. Safe from any thread.
    pub fn add(&self, stats: &HistogramStats) {
        debug_assert_eq!(stats.count.len(), self.num_positions * self.bins);
        let mut open = self.lock();
        for index in (0..stats.count.len()).filter(|&index| stats.count[index] != 0) {
            let sums = [
                stats.count[index],
                stats.accepted[index],
                stats.x_sum[index],
            ];
            add_bin(&mut open.pending, index, sums);
        }
    }

    /// Moves everything added so far into `into` (same layout) and starts over. Callers must
    /// not run two drains at once; adds may run concurrently (each lands in this drain or a
    /// later one).
    pub fn drain_into(&self, into: &mut HistogramStats) {
        let mut open = self.lock();
        into.merge(&open.pending);
        let pending = &mut open.pending;
        for column in [
            &mut pending.count,
            &mut pending.accepted,
            &mut pending.x_sum,
        ] {
            column.fill(0);
        }
    }
}

/// Adds the sums `[count, accepted, x_sum]` to bin `index` of `into` (wrapping, so a corrupt
/// input cannot panic; valid rounds never wrap).
#[inline(always)]
fn add_bin(into: &mut HistogramStats, index: usize, [n, a, x]: [u64; 3]) {
    into.count[index] = into.count[index].wrapping_add(n);
    into.accepted[index] = into.accepted[index].wrapping_add(a);
    into.x_sum[index] = into.x_sum[index].wrapping_add(x);
}

/// The discounted histograms of past rounds (floats: counts are discounted by `γ` per round;
/// `x_sum` in feature units, `Σ x`), `K × B` bins position-major as [`HistogramStats`], and the
/// number of rounds whose drift test dropped them.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HistogramMemory {
    /// Discounted labeled drafts per bin.
    pub count: Vec<f64>,
    /// Discounted accepted drafts per bin.
    pub accepted: Vec<f64>,
    /// Discounted `Σ x` per bin (feature units).
    pub x_sum: Vec<f64>,
    /// Rounds whose drift test dropped the memory.
    #[serde(with = "crate::persist::fixed")]
    pub resets: u64,
}

impl HistogramMemory {
    /// An empty memory for `num_positions` positions of `bins` bins.
    pub fn new(num_positions: usize, bins: usize) -> Self {
        let len = num_positions * bins;
        HistogramMemory {
            count: vec![0.0; len],
            accepted: vec![0.0; len],
            x_sum: vec![0.0; len],
            resets: 0,
        }
    }

    /// Multiplies everything by `gamma`.
    pub fn decay(&mut self, gamma: f64) {
        // Column by column: each loop vectorizes (a chained iterator did not).
        for column in [&mut self.count, &mut self.accepted, &mut self.x_sum] {
            for v in column.iter_mut() {
                *v *= gamma;
            }
        }
    }

    /// Forgets every round (the count of resets stays).
    pub fn clear(&mut self) {
        for column in [&mut self.count, &mut self.accepted, &mut self.x_sum] {
            column.fill(0.0);
        }
    }

    /// Adds a round (same layout).
    pub(crate) fn add_round(&mut self, round: &HistogramStats, binning: &Binning) {
        let limit = binning.limit();
        for index in 0..self.count.len() {
            let n = round.count[index];
            if n == 0 {
                continue;
            }
            let count = n as f64;
            self.count[index] += count;
            self.accepted[index] += round.accepted[index] as f64;
            self.x_sum[index] += round.x_sum[index] as f64 / X_SCALE - limit * count;
        }
    }

    /// Whether every bin is empty.
    pub fn is_empty(&self) -> bool {
        self.count.iter().all(|&c| c == 0.0)
    }

    /// Checks that this memory could have been built from rounds of an estimator with
    /// `num_positions` positions, `bins` bins and features clamped to `±max_log_odds`: the
    /// layout, finite values, non-negative counts, no more accepted than labeled, a feature sum
    /// within its bin's range times the count (each up to the float rounding of the sums), and a
    /// total within the geometric bound `K ·` [`MAX_COUNT`]` / (1 − gamma)` that rounds of at most
    /// [`MAX_COUNT`] labels per position discounted by `gamma` never pass.
    pub fn validate(
        &self,
        num_positions: usize,
        bins: usize,
        gamma: f64,
        max_log_odds: f64,
    ) -> Result<()> {
        let fail = |message: String| Err(Error::value("memory", message));
        let len = num_positions * bins;
        if self.count.len() != len || self.accepted.len() != len || self.x_sum.len() != len {
            return fail(format!(
                "expected {num_positions} positions of {bins} bins ({len} entries per column)"
            ));
        }
        let binning = Binning::new(max_log_odds, bins);
        let tolerance = 1e-9;
        let mut total = 0.0;
        for index in 0..len {
            let (k, b) = (index / bins, index % bins);
            let (n, a, x) = (self.count[index], self.accepted[index], self.x_sum[index]);
            if !(n.is_finite() && a.is_finite() && x.is_finite()) {
                return fail(format!("position {k}, bin {b}: must be finite"));
            }
            if n < 0.0 || a < 0.0 || a > n * (1.0 + tolerance) {
                return fail(format!(
                    "position {k}, bin {b}: {a} accepted of {n} labeled is impossible"
                ));
            }
            let (lo, hi) = binning.offset_range(b);
            let slack = tolerance * (1.0 + n) * (1.0 + max_log_odds) + n / X_SCALE;
            let (least, most) = (n * (lo - max_log_odds), n * (hi - max_log_odds));
            if x < least - slack || x > most + slack {
                return fail(format!(
                    "position {k}, bin {b}: x_sum {x} is outside [{least}, {most}], the range \
                     of {n} features in the bin"
                ));
            }
            total += n;
        }
        // γ·L + MAX_COUNT·K = L, with room for the float rounding of the discounted sums.
        let limit = MAX_COUNT as f64 * num_positions as f64 / (1.0 - gamma) * (1.0 + 1e-9);
        if total > limit {
            return fail(format!("{total} labels exceed {limit}"));
        }
        Ok(())
    }
}

/// [`Binning::locate_all`] compiled for AVX2 (the same code, wider vectors), which AVX-512 CPUs
/// run too: the pass's 512-bit multiplies lower the core's clock for the code that follows, by
/// more than the wider vectors gain (on an Intel Xeon, the `map` refit that follows a round's
/// last observe ran 6–12% slower at K = 4 to 32, 4.74 against 4.22 µs at K = 4, γ = 0.8, with
/// the same instructions; observe itself gains at most 5%, at R = 1,024).
#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx2")]
    pub(super) fn locate_all_avx2<T: Copy + Into<f64>>(
        binning: &super::Binning,
        xs: &[T],
        bins: &mut [u32],
        offsets: &mut [u64],
    ) -> bool {
        binning.locate_all_baseline(xs, bins, offsets)
    }
}

mod step;
pub(crate) use step::StepHistogram;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod examples;
