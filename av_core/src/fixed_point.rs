//! Exact, order-independent sums of `f64` terms.
//!
//! Floating-point addition is not associative, so two threads (or two tensor-parallel ranks)
//! that add the same observations in a different order end with different bits. Every
//! statistic is therefore summed in fixed point: each term is converted once, deterministically,
//! to an integer number of `2^-44` units, and integers add associatively and commutatively.
//! The resolution, `2^-44 ≈ 5.7e-14`, is far below anything the refit can notice. The range:
//! a term is at most `max_log_odds² / 4 ≤ 2500` (the estimator caps `max_log_odds` at 100), under
//! `2^56` units, so one term fits an `i64` and an `i128` sum holds `2^71` of them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Fractional bits of the fixed-point representation.
pub const FRACTION_BITS: u32 = 44;

/// `2^FRACTION_BITS` as a float.
const SCALE: f64 = (1u64 << FRACTION_BITS) as f64;

/// Converts one term to fixed point, rounding toward zero (deterministic: the same `f64` always
/// gives the same integer). Terms beyond ±2^19 saturate; the estimator bounds its terms by 2500.
#[inline]
pub fn to_fixed(value: f64) -> i64 {
    (value * SCALE) as i64
}

/// Converts a fixed-point sum back to a float (the nearest `f64`).
#[inline]
pub fn to_f64(value: i128) -> f64 {
    value as f64 / SCALE
}

/// Converts a float to the fixed-point sum closest to it, for injecting statistics.
pub fn from_f64(value: f64) -> i128 {
    (value * SCALE).round() as i128
}

/// A 128-bit integer that many threads may add to at once without a lock.
///
/// Stored as two 64-bit words. An addition adds the low words with one `fetch_add`, detects the
/// carry from the value it returns, and adds high word plus carry with a second one. Because
/// both words only ever receive additions, the pair equals the exact sum modulo `2^128` once
/// every writer has finished, in whatever order the additions ran. A reader that races a writer
/// may see the low word without its carry; [`crate::accumulator::Accumulator`] only reads a
/// buffer after its writers have drained.
#[derive(Debug, Default)]
pub struct AtomicI128 {
    low: AtomicU64,
    high: AtomicU64,
}

impl AtomicI128 {
    /// Adds `value` (relaxed ordering: callers publish with their own fences).
    #[inline]
    pub fn add(&self, value: i128) {
        let bits = value as u128;
        let low = bits as u64;
        let high = (bits >> 64) as u64;
        let previous = self.low.fetch_add(low, Ordering::Relaxed);
        let carry = u64::from(previous.checked_add(low).is_none());
        let high = high.wrapping_add(carry);
        if high != 0 {
            self.high.fetch_add(high, Ordering::Relaxed);
        }
    }

    /// Reads the value; exact only when no writer is in flight.
    #[inline]
    pub fn load(&self) -> i128 {
        let low = self.low.load(Ordering::Relaxed) as u128;
        let high = self.high.load(Ordering::Relaxed) as u128;
        ((high << 64) | low) as i128
    }

    /// Sets the value to zero; only when no writer is in flight.
    pub fn clear(&self) {
        self.low.store(0, Ordering::Relaxed);
        self.high.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn carries_propagate_across_the_low_word() {
        let sum = AtomicI128::default();
        sum.add(i128::from(u64::MAX));
        sum.add(1);
        assert_eq!(sum.load(), i128::from(u64::MAX) + 1);
        sum.add(-(i128::from(u64::MAX) + 3));
        assert_eq!(sum.load(), -2);
    }

    proptest! {
        #[test]
        fn atomic_sum_equals_integer_sum_in_any_order(
            values in proptest::collection::vec(any::<i64>(), 0..64),
            seed in any::<u64>(),
        ) {
            let forward = AtomicI128::default();
            for &v in &values {
                forward.add(i128::from(v));
            }
            let mut shuffled = values.clone();
            // A cheap deterministic shuffle driven by the seed.
            let mut state = seed | 1;
            for i in (1..shuffled.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                shuffled.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let backward = AtomicI128::default();
            for &v in &shuffled {
                backward.add(i128::from(v));
            }
            let exact: i128 = values.iter().map(|&v| i128::from(v)).sum();
            prop_assert_eq!(forward.load(), exact);
            prop_assert_eq!(backward.load(), exact);
        }

        #[test]
        fn conversion_is_within_one_unit(value in -5.0e5f64..5.0e5) {
            let back = to_f64(i128::from(to_fixed(value)));
            prop_assert!((back - value).abs() <= 1.0 / SCALE + value.abs() * f64::EPSILON);
        }
    }
}
