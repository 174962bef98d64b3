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

use super::accumulator::{Flip, MAX_COUNT};
use super::fixed_point::{MAGIC, MAGIC_BITS};
use crate::error::{Error, Result};
use crate::sync::{AtomicU64, Ordering};

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
        // `as` saturates: a NaN gives bin 0 instead of undefined behaviour.
        let bin = ((u * self.scale) as usize).min(self.bins - 1);
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

/// One round's histograms, `K × B` bins stored position-major (`index = k·B + b`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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

/// One buffer of atomic bins.
#[derive(Debug)]
struct AtomicHistogram {
    count: Box<[AtomicU64]>,
    accepted: Box<[AtomicU64]>,
    x_sum: Box<[AtomicU64]>,
}

impl AtomicHistogram {
    fn new(len: usize) -> Self {
        let column = || (0..len).map(|_| AtomicU64::new(0)).collect();
        AtomicHistogram {
            count: column(),
            accepted: column(),
            x_sum: column(),
        }
    }

    #[inline]
    fn add(&self, stats: &HistogramStats) {
        for (index, &n) in stats.count.iter().enumerate() {
            if n == 0 {
                continue;
            }
            self.count[index].fetch_add(n, Ordering::Relaxed);
            let a = stats.accepted[index];
            if a != 0 {
                self.accepted[index].fetch_add(a, Ordering::Relaxed);
            }
            self.x_sum[index].fetch_add(stats.x_sum[index], Ordering::Relaxed);
        }
    }

    /// Adds the buffer to `into` and clears it (no writer may be in flight).
    fn drain_into(&self, into: &mut HistogramStats) {
        for (index, slot) in self.count.iter().enumerate() {
            let n = slot.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            slot.store(0, Ordering::Relaxed);
            let a = self.accepted[index].load(Ordering::Relaxed);
            let x = self.x_sum[index].load(Ordering::Relaxed);
            self.accepted[index].store(0, Ordering::Relaxed);
            self.x_sum[index].store(0, Ordering::Relaxed);
            into.count[index] = into.count[index].wrapping_add(n);
            into.accepted[index] = into.accepted[index].wrapping_add(a);
            into.x_sum[index] = into.x_sum[index].wrapping_add(x);
        }
    }
}

/// The open round's histograms: any number of threads add without a lock; one thread at a time
/// (the estimator's refit lock) drains. The same double-buffer protocol as
/// [`super::accumulator::Accumulator`]: every addition lands in exactly one drain, the one
/// after the buffer it registered on was retired.
#[derive(Debug)]
pub struct HistogramAccumulator {
    buffers: [AtomicHistogram; 2],
    flip: Flip,
    /// Labels per bin of the open round (drained or not), reserved before an add lands: what
    /// keeps every bin of a round within [`MAX_BIN_COUNT`] ([`try_add`](Self::try_add)).
    open: Box<[AtomicU64]>,
    num_positions: usize,
    bins: usize,
}

// A round's position holds at most `MAX_BINS · MAX_BIN_COUNT` labels: the per-bin bound keeps
// every position within MAX_COUNT too.
const _: () = assert!(MAX_BINS as u64 * MAX_BIN_COUNT <= MAX_COUNT);

impl HistogramAccumulator {
    /// Empty histograms for `num_positions` positions of `bins` bins.
    pub fn new(num_positions: usize, bins: usize) -> Self {
        let len = num_positions * bins;
        HistogramAccumulator {
            buffers: [AtomicHistogram::new(len), AtomicHistogram::new(len)],
            flip: Flip::new(),
            open: (0..len).map(|_| AtomicU64::new(0)).collect(),
            num_positions,
            bins,
        }
    }

    /// [`add`](Self::add), unless that would take a bin of the open round past
    /// [`MAX_BIN_COUNT`] labels (the bound a restored state must meet; it keeps every position
    /// within [`MAX_COUNT`] too): then nothing is added and the error names the position and
    /// the bin. Counts are reserved first (one compare-and-swap per occupied bin, undone if a
    /// later bin is full), so concurrent adds can never together pass the bound. Lock-free.
    pub fn try_add(&self, stats: &HistogramStats) -> std::result::Result<(), (usize, usize)> {
        debug_assert_eq!(stats.count.len(), self.num_positions * self.bins);
        for (index, (open, &n)) in self.open.iter().zip(&stats.count).enumerate() {
            let fits = |c: u64| c.checked_add(n).filter(|&t| t <= MAX_BIN_COUNT);
            if n != 0
                && open
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, fits)
                    .is_err()
            {
                for (open, &n) in self.open.iter().zip(&stats.count).take(index) {
                    open.fetch_sub(n, Ordering::Relaxed);
                }
                return Err((index / self.bins, index % self.bins));
            }
        }
        self.add(stats);
        Ok(())
    }

    /// Counts `round` (a restored state's open round, held outside this accumulator) as part of
    /// the open round for [`try_add`](Self::try_add)'s bound.
    pub fn reserve(&self, round: &HistogramStats) {
        for (open, &n) in self.open.iter().zip(&round.count) {
            open.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The round `round` (everything drained for it) has ended: its labels no longer count
    /// toward [`try_add`](Self::try_add)'s bound. Adds in flight stay reserved, for the round
    /// they land in.
    pub fn end_round(&self, round: &HistogramStats) {
        for (open, &n) in self.open.iter().zip(&round.count) {
            open.fetch_sub(n, Ordering::Relaxed);
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

    /// Adds `stats` (same layout). Lock-free; safe from any thread.
    pub fn add(&self, stats: &HistogramStats) {
        debug_assert_eq!(stats.count.len(), self.num_positions * self.bins);
        let index = self.flip.enter();
        self.buffers[index].add(stats);
        self.flip.leave(index);
    }

    /// Moves everything added so far into `into` (same layout) and starts over. Callers must
    /// not run two drains at once; adds may run concurrently (each lands in this drain or a
    /// later one).
    pub fn drain_into(&self, into: &mut HistogramStats) {
        let old = self.flip.retire();
        self.buffers[old].drain_into(into);
    }
}

/// The discounted histograms of past rounds (floats: counts are discounted by `γ` per round;
/// `x_sum` in feature units, `Σ x`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramMemory {
    /// Positions K.
    pub num_positions: usize,
    /// Bins per position B.
    pub bins: usize,
    /// Discounted labeled drafts per bin.
    pub count: Vec<f64>,
    /// Discounted accepted drafts per bin.
    pub accepted: Vec<f64>,
    /// Discounted `Σ x` per bin (feature units).
    pub x_sum: Vec<f64>,
}

impl HistogramMemory {
    /// An empty memory.
    pub fn new(num_positions: usize, bins: usize) -> Self {
        let len = num_positions * bins;
        HistogramMemory {
            num_positions,
            bins,
            count: vec![0.0; len],
            accepted: vec![0.0; len],
            x_sum: vec![0.0; len],
        }
    }

    /// Multiplies everything by `gamma`.
    pub fn decay(&mut self, gamma: f64) {
        for v in self
            .count
            .iter_mut()
            .chain(&mut self.accepted)
            .chain(&mut self.x_sum)
        {
            *v *= gamma;
        }
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        *self = HistogramMemory::new(self.num_positions, self.bins);
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
        if self.num_positions != num_positions
            || self.bins != bins
            || self.count.len() != len
            || self.accepted.len() != len
            || self.x_sum.len() != len
        {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::XorShift;
    use proptest::prelude::*;

    #[test]
    fn bins_are_equal_and_cover_the_clamped_range() {
        let binning = Binning::new(40.0, 64);
        for i in 0..=6400 {
            let x = -40.0 + f64::from(i) * 0.0125;
            let (bin, offset) = binning.locate(x);
            // An independent statement of the rule: ⌊(x + 40) / 1.25⌋, the last bin closed.
            let expect = (((x + 40.0) / 1.25).floor() as usize).min(63);
            assert!(
                bin == expect || ((x + 40.0) / 1.25).fract().abs() < 1e-12,
                "{x}"
            );
            assert!((offset as f64 / X_SCALE - (x + 40.0)).abs() <= 0.5 / X_SCALE + 1e-12);
            let (lo, hi) = binning.offset_range(bin);
            assert!(
                lo <= x + 40.0 && x + 40.0 <= hi,
                "{x} in bin {bin}: [{lo}, {hi}]"
            );
        }
        assert_eq!(binning.locate(f64::NAN).0, 0);
        assert_eq!(binning.locate(f64::INFINITY), binning.locate(40.0));
    }

    #[test]
    fn impossible_histograms_are_refused() {
        let binning = Binning::new(40.0, 8);
        let mut good = HistogramStats::new(2, 8);
        let mut rng = XorShift::new(5);
        for _ in 0..100 {
            let x = rng.unit_f64() * 100.0 - 50.0;
            good.add_observation(&binning, 1, x, rng.next_u64() & 1 == 1);
        }
        assert!(good.validate("r", 2, 8, 40.0).is_ok());
        // Position 1, bin 4: features in [0, 10), none clamped (so an x_sum of 0 is impossible).
        let occupied = 8 + 4;
        assert!(good.count[occupied] > 0);
        let empty = good.count.iter().position(|&c| c == 0).unwrap();
        type Corruption = fn(&mut HistogramStats, usize, usize);
        let cases: [Corruption; 6] = [
            |h, o, _| h.accepted[o] = h.count[o] + 1,
            |h, _, e| h.x_sum[e] = 1,
            |h, o, _| h.x_sum[o] += 1 << 30,
            |h, o, _| h.x_sum[o] = 0,
            |h, o, _| h.count[o] = MAX_BIN_COUNT + 1,
            |h, _, _| {
                h.count.pop();
            },
        ];
        for (i, corrupt) in cases.iter().enumerate() {
            let mut bad = good.clone();
            corrupt(&mut bad, occupied, empty);
            let bins_ok = bad.count.len() == 16;
            let error = bad.validate("r", 2, 8, 40.0).unwrap_err();
            assert_eq!(error.argument, "r", "case {i}");
            assert!(bins_ok || error.message.contains("entries"), "case {i}");
        }
        assert!(good.validate("r", 3, 8, 40.0).is_err());
        assert!(good.validate("r", 2, 16, 40.0).is_err());
    }

    proptest! {
        #[test]
        fn any_order_and_split_gives_the_same_bits(
            seed in any::<u64>(), n in 0usize..200, split in 0usize..200, bins in 1usize..80,
        ) {
            let binning = Binning::new(40.0, bins);
            let mut rng = XorShift::new(seed | 1);
            let obs: Vec<(usize, f64, bool)> = (0..n)
                .map(|_| ((rng.next_u64() % 3) as usize, rng.unit_f64() * 120.0 - 60.0,
                          rng.next_u64() & 1 == 0))
                .collect();
            let mut whole = HistogramStats::new(3, bins);
            for &(k, x, y) in &obs {
                whole.add_observation(&binning, k, x, y);
            }
            let cut = split.min(n);
            let (mut a, mut b) = (HistogramStats::new(3, bins), HistogramStats::new(3, bins));
            for &(k, x, y) in obs[..cut].iter().rev() {
                a.add_observation(&binning, k, x, y);
            }
            for &(k, x, y) in &obs[cut..] {
                b.add_observation(&binning, k, x, y);
            }
            let acc = HistogramAccumulator::new(3, bins);
            acc.add(&b);
            acc.add(&a);
            let mut drained = HistogramStats::new(3, bins);
            acc.drain_into(&mut drained);
            prop_assert_eq!(&drained, &whole);
            prop_assert!(whole.validate("r", 3, bins, 40.0).is_ok());
            let mut memory = HistogramMemory::new(3, bins);
            memory.add_round(&whole, &binning);
            prop_assert!(memory.validate(3, bins, 0.8, 40.0).is_ok());
            // The memory's feature sums are the features' sums, to the fixed point's rounding.
            for k in 0..3 {
                let exact: f64 = obs.iter().filter(|o| o.0 == k).map(|o| o.1.clamp(-40.0, 40.0)).sum();
                let kept: f64 = memory.x_sum[k * bins..(k + 1) * bins].iter().sum();
                prop_assert!((exact - kept).abs() <= 1e-9 * (1.0 + exact.abs()) + n as f64 / X_SCALE);
            }
        }
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn binning_example() {
        use crate::estimator::histogram::{Binning, X_SCALE};

        let binning = Binning::new(40.0, 64); // bins 1.25 wide
        assert_eq!(binning.locate(-40.0), (0, 0));
        assert_eq!(binning.locate(0.0), (32, (40.0 * X_SCALE) as u64));
        assert_eq!(binning.locate(40.0).0, 63); // the upper edge belongs to the last bin
        assert_eq!(binning.locate(1e6), binning.locate(40.0)); // clamped
    }

    #[test]
    fn histogramstats_example() {
        use crate::estimator::histogram::{Binning, HistogramStats};

        let binning = Binning::new(40.0, 64);
        let mut round = HistogramStats::new(2, 64);
        round.add_observation(&binning, 0, 1.0, true);
        round.add_observation(&binning, 0, 1.1, false);
        round.add_observation(&binning, 1, -3.0, false);
        assert_eq!(round.total_count(), 3);
        assert_eq!(round.position_counts(), [2, 1]);
        let bin = 32; // both features of position 0 are in [0, 1.25)
        assert_eq!((round.count[bin], round.accepted[bin]), (2, 1));
        assert!(round.validate("round_stats", 2, 64, 40.0).is_ok());
    }

    #[test]
    fn histogramaccumulator_example() {
        use crate::estimator::histogram::{Binning, HistogramAccumulator, HistogramStats};

        let binning = Binning::new(40.0, 64);
        let acc = HistogramAccumulator::new(1, 64);
        let mut step = HistogramStats::new(1, 64);
        step.add_observation(&binning, 0, 2.5, true);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| acc.add(&step));
            }
        });
        let mut round = HistogramStats::new(1, 64);
        acc.drain_into(&mut round);
        assert_eq!(
            (round.total_count(), round.accepted.iter().sum::<u64>()),
            (4, 4)
        );
    }

    #[allow(clippy::assign_op_pattern)] // the example as it was written for the docs
    #[test]
    fn try_add_example() {
        use crate::estimator::histogram::{
            Binning, HistogramAccumulator, HistogramStats, MAX_BIN_COUNT,
        };

        let binning = Binning::new(40.0, 64);
        let acc = HistogramAccumulator::new(1, 64);
        let mut step = HistogramStats::new(1, 64);
        step.add_observation(&binning, 0, 2.5, true);
        let mut full = step.clone();
        let bin = full.count.iter().position(|&c| c > 0).unwrap();
        full.count[bin] = MAX_BIN_COUNT - 1;
        full.accepted[bin] = 0;
        full.x_sum[bin] = full.x_sum[bin] * (MAX_BIN_COUNT - 1);
        assert_eq!(acc.try_add(&full), Ok(()));
        assert_eq!(acc.try_add(&step), Ok(())); // the bin is now at the bound
        assert_eq!(acc.try_add(&step), Err((0, bin)));
        let mut round = HistogramStats::new(1, 64);
        acc.drain_into(&mut round);
        assert_eq!(round.count[bin], MAX_BIN_COUNT); // the refused add left nothing behind
    }

    #[test]
    fn histogrammemory_example() {
        use crate::estimator::histogram::{Binning, HistogramMemory, HistogramStats};

        let binning = Binning::new(40.0, 64);
        let mut round = HistogramStats::new(1, 64);
        round.add_observation(&binning, 0, 1.0, true);
        round.add_observation(&binning, 0, 0.5, false);
        let mut memory = HistogramMemory::new(1, 64);
        memory.add_round(&round, &binning);
        memory.decay(0.5);
        assert_eq!((memory.count[32], memory.accepted[32]), (1.0, 0.5));
        assert!((memory.x_sum[32] - 0.75).abs() < 1e-4); // (1.0 + 0.5) / 2
        assert!(memory.validate(1, 64, 0.8, 40.0).is_ok());
    }
}
