//! One round's IRLS sufficient statistics, and the lock-free accumulator that collects them.
//!
//! For an observation at position `k` with feature `x`, prediction `p` (the one made at draft
//! time when the caller has it) and label `y`, the IRLS weight is `w = p(1 − p)` and the residual
//! `r = y − p`. Per position the round keeps
//!
//! ```text
//! a_k = Σ w x²   b_k = Σ w x   c_k = Σ w   g0_k = Σ r x   g1_k = Σ r   n_k = count
//! ```
//!
//! which is all the Newton step needs: `XᵀWX` is the arrowhead `[[Σ a_k, b ᵀ], [b, diag(c)]]` and
//! `Xᵀr = [Σ g0_k, g1]`. State is O(K) numbers whatever the traffic.
//!
//! Sums are kept in fixed point ([`super::fixed_point`]), so the same set of observations gives
//! the same bits in any order, on any thread, in any split into calls.

use crate::sync::{backoff, AtomicU64, Ordering};

use super::fixed_point::{to_f64, AtomicI128, MAGIC, MAGIC_BITS, SCALE};
use crate::error::{Error, Result};

/// Largest observation count a round may hold per position, and the largest value of the
/// estimator's other counters that a restored state may carry: `2^56`.
///
/// No run reaches it (a position labeled a billion times a second would take two years without a
/// refit), and from it a `u64` still has room for more observations than any call can add, with
/// the sum over 64 positions far from wrapping too.
///
/// # Example
///
/// ```rust
/// use av_core::estimator::{RoundStats, MAX_COUNT};
///
/// let mut stats = RoundStats::new(1);
/// stats.positions[0].n = u64::MAX; // no sequence of observations gets here
/// assert_eq!(stats.validate("round_stats", 1, 40.0).unwrap_err().argument, "round_stats");
/// assert!(MAX_COUNT.checked_mul(64).is_some()); // 64 positions sum without wrapping
/// ```
pub const MAX_COUNT: u64 = 1 << 56;

/// One position's statistics in fixed point (units of `2^-FRACTION_BITS`), plus its count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PositionSums {
    /// `Σ w x²`.
    pub a: i128,
    /// `Σ w x`.
    pub b: i128,
    /// `Σ w`.
    pub c: i128,
    /// `Σ r x`.
    pub g0: i128,
    /// `Σ r`.
    pub g1: i128,
    /// Number of labeled observations.
    pub n: u64,
}

impl PositionSums {
    /// Adds one observation with feature `x`, IRLS prediction `p` and label `y`.
    #[inline]
    pub fn add_observation(&mut self, x: f64, p: f64, y: bool) {
        let [a, b, c, g0, g1] = terms(x, p, f64::from(u8::from(y)), 1.0);
        self.a += i128::from(a);
        self.b += i128::from(b);
        self.c += i128::from(c);
        self.g0 += i128::from(g0);
        self.g1 += i128::from(g1);
        self.n += 1;
    }

    /// Why these sums cannot have come from `n` observations of features clamped to
    /// `±max_log_odds`, or `None` when they can.
    ///
    /// Every observation adds `w x²`, `w x`, `w`, `r x` and `r` with `w = p(1 − p) ∈ [0, 1/4]`,
    /// `r = y − p ∈ [−1, 1]` and `|x| ≤ max_log_odds`, each rounded to the nearest unit: so the
    /// weight sums `a` and `c` are non-negative, every sum is at most `n` times its largest term
    /// (plus half a unit of rounding per term), a position without observations holds zeros,
    /// and `b² ≤ a·c` (Cauchy–Schwarz, `Σ w x` against `Σ w x²` and `Σ w`) up to the same
    /// rounding.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::estimator::PositionSums;
    ///
    /// let mut sums = PositionSums::default();
    /// sums.add_observation(2.0, 0.3, true);
    /// sums.add_observation(-1.5, 0.8, false);
    /// assert_eq!(sums.impossibility(40.0), None);
    /// let negative_weight = PositionSums { c: -1, ..sums };
    /// assert!(negative_weight.impossibility(40.0).is_some());
    /// let beyond_cauchy_schwarz = PositionSums { b: sums.b * 4, ..sums };
    /// assert!(beyond_cauchy_schwarz.impossibility(40.0).is_some());
    /// ```
    pub fn impossibility(&self, max_log_odds: f64) -> Option<String> {
        let n = self.n;
        if n > MAX_COUNT {
            return Some(format!("count {n} exceeds {MAX_COUNT}"));
        }
        let sums = [self.a, self.b, self.c, self.g0, self.g1];
        if n == 0 {
            return (sums != [0; 5]).then(|| "a position without observations has sums".into());
        }
        if self.a < 0 || self.c < 0 {
            return Some(format!(
                "weight sums must be non-negative, got a = {} and c = {}",
                self.a, self.c
            ));
        }
        // Largest term of each sum, in units, with room for the rounding of the float products
        // (a few ulps) and of the conversion (half a unit).
        let limit = if max_log_odds.is_finite() && max_log_odds > 0.0 {
            max_log_odds
        } else {
            return Some(format!(
                "max_log_odds {max_log_odds} is not finite and positive"
            ));
        };
        let slack = 1.0 + 1e-9;
        let count = n as f64;
        let largest = [
            SCALE / 4.0 * limit * limit,
            SCALE / 4.0 * limit,
            SCALE / 4.0,
            SCALE * limit,
            SCALE,
        ];
        for ((name, &sum), term) in ["a", "b", "c", "g0", "g1"].iter().zip(&sums).zip(largest) {
            let bound = count * (term * slack + 1.0);
            if (sum as f64).abs() > bound {
                return Some(format!(
                    "|{name}| = {} exceeds {n} observations of at most {term} units each",
                    sum.unsigned_abs()
                ));
            }
        }
        let rounding = count / 2.0 + 1.0;
        let (a, b, c) = (self.a as f64, self.b as f64, self.c as f64);
        let cauchy_schwarz = ((a + rounding) * (c + rounding)).sqrt() * slack + rounding;
        if b.abs() > cauchy_schwarz {
            return Some(format!(
                "|b| = {} exceeds sqrt(a c) = {} (Cauchy-Schwarz)",
                self.b.unsigned_abs(),
                (a * c).sqrt()
            ));
        }
        None
    }

    /// Adds another position's sums (exact).
    #[inline]
    pub fn merge(&mut self, other: &PositionSums) {
        self.a += other.a;
        self.b += other.b;
        self.c += other.c;
        self.g0 += other.g0;
        self.g1 += other.g1;
        self.n += other.n;
    }
}

/// The fixed-point terms `[w x², w x, w, r x, r]` of one observation, times `mask` (1 for a
/// labeled position, 0 for an unlabeled one, so that a branch-free loop can skip it).
#[inline(always)]
pub fn terms(x: f64, p: f64, y: f64, mask: f64) -> [i64; 5] {
    scaled_term_bits(x, p, y, mask).map(|bits| bits.wrapping_sub(MAGIC_BITS))
}

/// [`terms`] before the final subtraction of `MAGIC_BITS`. The scale `2^F` is applied once to
/// `w` and `r` (a power of two, so exact) instead of to each product.
#[inline(always)]
pub(crate) fn scaled_term_bits(x: f64, p: f64, y: f64, mask: f64) -> [i64; 5] {
    let w = p * (1.0 - p) * mask * SCALE;
    let r = (y - p) * mask * SCALE;
    let wx = w * x;
    [wx * x, wx, w, r * x, r].map(|v| (v + MAGIC).to_bits() as i64)
}

/// A round's statistics for every position, in fixed point. Saved as columns
/// ([`RoundColumns`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "RoundColumns", try_from = "RoundColumns")]
pub struct RoundStats {
    /// One entry per draft position.
    pub positions: Vec<PositionSums>,
}

/// How a round's statistics are saved (`state_dict()["round_stats"]` under `vllm`): the
/// fixed-point `fraction_bits`, then one list per sum with an entry per position.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct RoundColumns {
    /// [`FRACTION_BITS`](super::FRACTION_BITS) (a round of another build is refused).
    pub fraction_bits: u32,
    /// `Σ w x²` per position.
    #[serde(with = "crate::persist::fixed")]
    pub a: Vec<i128>,
    /// `Σ w x` per position.
    #[serde(with = "crate::persist::fixed")]
    pub b: Vec<i128>,
    /// `Σ w` per position.
    #[serde(with = "crate::persist::fixed")]
    pub c: Vec<i128>,
    /// `Σ r x` per position.
    #[serde(with = "crate::persist::fixed")]
    pub g0: Vec<i128>,
    /// `Σ r` per position.
    #[serde(with = "crate::persist::fixed")]
    pub g1: Vec<i128>,
    /// Labeled observations per position.
    #[serde(with = "crate::persist::fixed")]
    pub n: Vec<u64>,
}

impl From<RoundStats> for RoundColumns {
    fn from(stats: RoundStats) -> Self {
        let column = |f: fn(&PositionSums) -> i128| stats.positions.iter().map(f).collect();
        RoundColumns {
            fraction_bits: super::FRACTION_BITS,
            a: column(|p| p.a),
            b: column(|p| p.b),
            c: column(|p| p.c),
            g0: column(|p| p.g0),
            g1: column(|p| p.g1),
            n: stats.positions.iter().map(|p| p.n).collect(),
        }
    }
}

impl TryFrom<RoundColumns> for RoundStats {
    type Error = String;

    fn try_from(c: RoundColumns) -> std::result::Result<Self, String> {
        let bits = super::FRACTION_BITS;
        if c.fraction_bits != bits {
            return Err(format!(
                "holds {} fraction bits, this build's statistics {bits}",
                c.fraction_bits
            ));
        }
        let k = c.n.len();
        if [&c.a, &c.b, &c.c, &c.g0, &c.g1]
            .iter()
            .any(|col| col.len() != k)
        {
            return Err("has columns of different lengths".into());
        }
        let positions = (0..k)
            .map(|i| PositionSums {
                a: c.a[i],
                b: c.b[i],
                c: c.c[i],
                g0: c.g0[i],
                g1: c.g1[i],
                n: c.n[i],
            })
            .collect();
        Ok(RoundStats { positions })
    }
}

impl RoundStats {
    /// Empty statistics for `num_positions` positions.
    pub fn new(num_positions: usize) -> Self {
        RoundStats {
            positions: vec![PositionSums::default(); num_positions],
        }
    }

    /// Checks that these statistics could have come from observations: `num_positions`
    /// positions, each passing [`PositionSums::impossibility`] for features clamped to
    /// `±max_log_odds`. `argument` names them in the error.
    pub fn validate(
        &self,
        argument: &'static str,
        num_positions: usize,
        max_log_odds: f64,
    ) -> Result<()> {
        if self.positions.len() != num_positions {
            return Err(Error::value(
                argument,
                format!(
                    "expected {num_positions} positions, got {}",
                    self.positions.len()
                ),
            ));
        }
        for (k, position) in self.positions.iter().enumerate() {
            if let Some(why) = position.impossibility(max_log_odds) {
                return Err(Error::value(
                    argument,
                    format!("position {k}: {why}; no sequence of observations gives that"),
                ));
            }
        }
        Ok(())
    }

    /// Total labeled observations over all positions.
    pub fn total_count(&self) -> u64 {
        self.positions.iter().map(|p| p.n).sum()
    }

    /// The statistics as floats, for the solve.
    pub(crate) fn to_float(&self) -> FloatStats {
        let column = |f: fn(&PositionSums) -> i128| -> Vec<f64> {
            self.positions.iter().map(|p| to_f64(f(p))).collect()
        };
        FloatStats {
            a: column(|p| p.a),
            b: column(|p| p.b),
            c: column(|p| p.c),
            g0: column(|p| p.g0),
            g1: column(|p| p.g1),
            n: self.positions.iter().map(|p| p.n as f64).collect(),
        }
    }
}

/// A round's statistics as `f64` columns (one entry per position).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FloatStats {
    /// `Σ w x²` per position.
    pub a: Vec<f64>,
    /// `Σ w x` per position.
    pub b: Vec<f64>,
    /// `Σ w` per position.
    pub c: Vec<f64>,
    /// `Σ r x` per position.
    pub g0: Vec<f64>,
    /// `Σ r` per position.
    pub g1: Vec<f64>,
    /// Observation count per position.
    pub n: Vec<f64>,
}

/// One buffer of atomic per-position sums.
#[derive(Debug)]
struct AtomicRound {
    sums: Box<[[AtomicI128; 5]]>,
    counts: Box<[AtomicU64]>,
}

impl AtomicRound {
    fn new(num_positions: usize) -> Self {
        AtomicRound {
            sums: (0..num_positions).map(|_| Default::default()).collect(),
            counts: (0..num_positions).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Adds `stats` unless that would take a position's count past [`MAX_COUNT`]; then adds
    /// nothing and returns that position. Counts are reserved first (one compare-and-swap
    /// each, undone if a later position is full), so concurrent adds can never together pass
    /// the limit; a snapshot racing the undo may see a count above its sums, which is still a
    /// state observations can produce (fewer labels than counted never breaks an invariant).
    fn try_add(&self, stats: &RoundStats) -> std::result::Result<(), usize> {
        for (k, (count, p)) in self.counts.iter().zip(&stats.positions).enumerate() {
            let fits = |c: u64| c.checked_add(p.n).filter(|&t| t <= MAX_COUNT);
            if p.n != 0
                && count
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, fits)
                    .is_err()
            {
                for (count, p) in self.counts.iter().zip(&stats.positions).take(k) {
                    count.fetch_sub(p.n, Ordering::Relaxed);
                }
                return Err(k);
            }
        }
        for (sums, p) in self.sums.iter().zip(&stats.positions) {
            if *p == PositionSums::default() {
                continue;
            }
            for (sum, value) in sums.iter().zip([p.a, p.b, p.c, p.g0, p.g1]) {
                sum.add(value);
            }
        }
        Ok(())
    }

    fn add(&self, stats: &RoundStats) {
        for ((sums, count), p) in self.sums.iter().zip(&*self.counts).zip(&stats.positions) {
            if *p == PositionSums::default() {
                continue;
            }
            for (sum, value) in sums.iter().zip([p.a, p.b, p.c, p.g0, p.g1]) {
                sum.add(value);
            }
            count.fetch_add(p.n, Ordering::Relaxed);
        }
    }

    fn load(&self) -> RoundStats {
        let positions = self
            .sums
            .iter()
            .zip(&*self.counts)
            .map(|(s, n)| PositionSums {
                a: s[0].load(),
                b: s[1].load(),
                c: s[2].load(),
                g0: s[3].load(),
                g1: s[4].load(),
                n: n.load(Ordering::Relaxed),
            })
            .collect();
        RoundStats { positions }
    }

    fn clear(&self) {
        for (sums, count) in self.sums.iter().zip(&*self.counts) {
            sums.iter().for_each(AtomicI128::clear);
            count.store(0, Ordering::Relaxed);
        }
    }
}

/// The round accumulator: any number of threads add, one thread at a time takes.
///
/// Two buffers; writers add to the active one. One atomic word holds the index of the active
/// buffer (bit 0) and each buffer's number of writers in flight (bits 1–31 and 32–62). A writer
/// registers on the active buffer with one compare-and-swap, so it learns the buffer and
/// announces itself in the same indivisible step; it adds, then deregisters.
/// [`Accumulator::take`] flips bit 0, waits for the old buffer's writers to leave (they never
/// wait for anything, so this is a few atomic adds long), reads the buffer and clears it. Every
/// addition lands in exactly one round: the one active when it registered. Writers never block.
///
/// `add` may run on any number of threads at once, and concurrently with `take`/`snapshot`;
/// `take` and `snapshot` must not overlap each other (the estimator runs them under its refit
/// lock).
#[derive(Debug)]
pub struct Accumulator {
    buffers: [AtomicRound; 2],
    flip: Flip,
    num_positions: usize,
}

/// One writer in flight on buffer `index`, as an increment of the state word.
const fn writer(index: usize) -> u64 {
    if index == 0 {
        1 << 1
    } else {
        1 << 32
    }
}

/// Writers in flight on buffer `index` in state word `state`.
const fn writers(state: u64, index: usize) -> u64 {
    if index == 0 {
        (state >> 1) & 0x7FFF_FFFF
    } else {
        (state >> 32) & 0x7FFF_FFFF
    }
}

/// The double-buffer protocol of [`Accumulator`], shared with the histogram accumulator
/// ([`super::histogram`]): one atomic word holds the index of the active buffer (bit 0) and each
/// buffer's number of writers in flight (bits 1–31 and 32–62).
#[derive(Debug)]
pub(crate) struct Flip {
    state: AtomicU64,
}

impl Flip {
    pub(crate) fn new() -> Self {
        Flip {
            state: AtomicU64::new(0),
        }
    }

    /// Registers a writer on the active buffer and returns that buffer's index: one
    /// compare-and-swap learns the buffer and announces the writer in the same step.
    #[inline]
    pub(crate) fn enter(&self) -> usize {
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            let index = (current & 1) as usize;
            // Acquire pairs with the clearing `retire` released, so our adds land on zeros.
            match self.state.compare_exchange_weak(
                current,
                current + writer(index),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return index,
                Err(actual) => current = actual,
            }
        }
    }

    /// Deregisters a writer of buffer `index`.
    #[inline]
    pub(crate) fn leave(&self, index: usize) {
        // Release publishes the writer's adds to the `retire` that waits for this count to drop.
        self.state.fetch_sub(writer(index), Ordering::Release);
    }

    /// Makes the other buffer active, waits until the old one has no writer in flight, and
    /// returns the old one's index: it may then be read and cleared. Callers must not run two
    /// `retire`s at once.
    pub(crate) fn retire(&self) -> usize {
        let previous = self.state.fetch_xor(1, Ordering::AcqRel);
        let old = (previous & 1) as usize;
        let mut spins = 0u32;
        while writers(self.state.load(Ordering::Acquire), old) != 0 {
            backoff(&mut spins);
        }
        old
    }
}

impl Accumulator {
    /// An empty accumulator for `num_positions` positions.
    pub fn new(num_positions: usize) -> Self {
        Accumulator {
            buffers: [
                AtomicRound::new(num_positions),
                AtomicRound::new(num_positions),
            ],
            flip: Flip::new(),
            num_positions,
        }
    }

    /// Number of positions.
    pub fn num_positions(&self) -> usize {
        self.num_positions
    }

    /// Adds a batch's statistics to the current round. Lock-free; safe from any thread.
    pub fn add(&self, stats: &RoundStats) {
        debug_assert_eq!(stats.positions.len(), self.num_positions);
        let index = self.flip.enter();
        self.buffers[index].add(stats);
        self.flip.leave(index);
    }

    /// [`add`](Self::add), unless that would take a position's count in the current round past
    /// [`MAX_COUNT`] (the bound a restored state must meet): then nothing is added and the
    /// error names the position. Lock-free; safe from any thread.
    pub fn try_add(&self, stats: &RoundStats) -> std::result::Result<(), usize> {
        debug_assert_eq!(stats.positions.len(), self.num_positions);
        let index = self.flip.enter();
        let result = self.buffers[index].try_add(stats);
        self.flip.leave(index);
        result
    }

    /// Ends the round: returns its statistics and starts an empty one.
    ///
    /// Callers must not run two `take`s at once (the estimator serializes them with its refit
    /// lock); adds may run concurrently.
    pub fn take(&self) -> RoundStats {
        let old = self.flip.retire();
        let stats = self.buffers[old].load();
        // Writers return to this buffer only after the next `take` flips back; that flip is a
        // release (and follows this one through the caller's lock), so they see it cleared.
        self.buffers[old].clear();
        stats
    }

    /// The current round's statistics without ending it (same serialization rule as `take`).
    pub fn snapshot(&self) -> RoundStats {
        let stats = self.take();
        self.add(&stats);
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn sample_stats(seed: u64, num_positions: usize) -> RoundStats {
        let mut stats = RoundStats::new(num_positions);
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        for k in 0..num_positions {
            for _ in 0..3 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let x = ((state >> 11) as f64 / (1u64 << 53) as f64) * 20.0 - 10.0;
                let p = 1.0 / (1.0 + (-x).exp());
                stats.positions[k].add_observation(x, p, state & 1 == 1);
            }
        }
        stats
    }

    #[test]
    fn concurrent_adds_and_takes_lose_nothing() {
        let num_positions = 4;
        let acc = Arc::new(Accumulator::new(num_positions));
        let threads = 4;
        let per_thread = 2000;
        let mut expected = RoundStats::new(num_positions);
        for t in 0..threads {
            for i in 0..per_thread {
                let s = sample_stats((t * per_thread + i) as u64, num_positions);
                for (e, p) in expected.positions.iter_mut().zip(&s.positions) {
                    e.merge(p);
                }
            }
        }
        let taker = {
            let acc = Arc::clone(&acc);
            std::thread::spawn(move || {
                let mut total = RoundStats::new(num_positions);
                for _ in 0..200 {
                    let s = acc.take();
                    for (e, p) in total.positions.iter_mut().zip(&s.positions) {
                        e.merge(p);
                    }
                    std::thread::yield_now();
                }
                total
            })
        };
        let writers: Vec<_> = (0..threads)
            .map(|t| {
                let acc = Arc::clone(&acc);
                std::thread::spawn(move || {
                    for i in 0..per_thread {
                        acc.add(&sample_stats((t * per_thread + i) as u64, num_positions));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let mut total = taker.join().unwrap();
        let rest = acc.take();
        for (e, p) in total.positions.iter_mut().zip(&rest.positions) {
            e.merge(p);
        }
        assert_eq!(total, expected);
    }

    #[test]
    fn snapshot_does_not_end_the_round() {
        let acc = Accumulator::new(2);
        let s = sample_stats(7, 2);
        acc.add(&s);
        assert_eq!(acc.snapshot(), s);
        assert_eq!(acc.take(), s);
        assert_eq!(acc.take(), RoundStats::new(2));
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn positionsums_example() {
        use crate::estimator::accumulator::PositionSums;
        use crate::estimator::fixed_point::to_f64;

        let mut sums = PositionSums::default();
        sums.add_observation(2.0, 0.5, true); // w = 0.25, r = 0.5
        let mut other = PositionSums::default();
        other.add_observation(-1.0, 0.5, false); // w = 0.25, r = -0.5
        sums.merge(&other);
        assert_eq!(sums.n, 2);
        assert_eq!(to_f64(sums.a), 1.25); // Σ w x² = 0.25·4 + 0.25·1
        assert_eq!(to_f64(sums.g1), 0.0); // Σ r
    }

    #[test]
    fn terms_example() {
        use crate::estimator::accumulator::terms;
        use crate::estimator::fixed_point::to_fixed;

        let [a, b, c, g0, g1] = terms(2.0, 0.5, 1.0, 1.0);
        assert_eq!([a, b, c, g0, g1], [1.0, 0.5, 0.25, 1.0, 0.5].map(to_fixed));
        assert_eq!(terms(2.0, 0.5, 1.0, 0.0), [0; 5]); // masked out
    }

    #[test]
    fn roundstats_example() {
        use crate::estimator::accumulator::RoundStats;

        let mut stats = RoundStats::new(3);
        stats.positions[0].add_observation(1.0, 0.8, true);
        stats.positions[1].add_observation(0.5, 0.6, false);
        assert_eq!(stats.total_count(), 2);
        let floats = stats.to_float();
        assert_eq!(floats.n, [1.0, 1.0, 0.0]);
        assert!((floats.c[0] - 0.16).abs() < 1e-10); // w = p(1 − p)
    }

    #[test]
    fn accumulator_example() {
        use crate::estimator::accumulator::{Accumulator, RoundStats};

        let acc = Accumulator::new(2);
        let mut step = RoundStats::new(2);
        step.positions[0].add_observation(1.5, 0.7, true);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| acc.add(&step));
            }
        });
        assert_eq!(acc.snapshot().total_count(), 4); // the round goes on
        assert_eq!(acc.take().positions[0].n, 4); // ends the round
        assert_eq!(acc.take().total_count(), 0);
    }

    #[test]
    fn add_example() {
        use crate::estimator::accumulator::{Accumulator, RoundStats};

        let acc = Accumulator::new(1);
        let mut batch = RoundStats::new(1);
        batch.positions[0].add_observation(0.3, 0.6, true);
        acc.add(&batch);
        acc.add(&batch);
        assert_eq!(acc.snapshot().positions[0].n, 2);
    }

    #[test]
    fn try_add_example() {
        use crate::estimator::accumulator::{Accumulator, RoundStats, MAX_COUNT};

        let acc = Accumulator::new(2);
        let mut full = RoundStats::new(2);
        full.positions[1].n = MAX_COUNT; // counts only: a valid, if unreachable, round
        assert_eq!(acc.try_add(&full), Ok(()));
        let mut one = RoundStats::new(2);
        one.positions[0].add_observation(0.3, 0.6, true);
        one.positions[1].add_observation(0.3, 0.6, true);
        assert_eq!(acc.try_add(&one), Err(1));
        assert_eq!(acc.take(), full); // the refused add left nothing behind
    }

    #[test]
    fn take_example() {
        use crate::estimator::accumulator::{Accumulator, RoundStats};

        let acc = Accumulator::new(2);
        let mut batch = RoundStats::new(2);
        batch.positions[1].add_observation(-2.0, 0.3, false);
        acc.add(&batch);
        assert_eq!(acc.take(), batch); // exactly what was added
        assert_eq!(acc.take(), RoundStats::new(2)); // the new round starts empty
    }
}
