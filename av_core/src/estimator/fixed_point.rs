//! Exact, order-independent sums of `f64` terms.
//!
//! Floating-point addition is not associative, so two threads (or two tensor-parallel ranks)
//! that add the same observations in a different order end with different bits. Every
//! statistic is therefore summed in fixed point: each term is converted once, deterministically,
//! to an integer number of `2^-36` units (rounded to nearest), and integers add associatively
//! and commutatively. The resolution, `2^-36 ≈ 1.5e-11`, is far below anything the refit can
//! notice. The range: a term is at most `max_log_odds² / 4 ≤ 2500` (the estimator caps
//! `max_log_odds` at 100), under `2^48` units, so a batch of up to `2^15` rows sums in an `i64`
//! and a round's `i128` sum holds `2^79` terms.
//!
//! The conversion adds `1.5·2^52` and reads the low mantissa bits, which rounds to the nearest
//! integer for any `|value·2^36| < 2^51` with two plain SIMD-friendly operations (no saturating
//! float-to-int cast), so the accumulation loop vectorizes.

use crate::sync::{AtomicU64, Ordering};

/// Fractional bits of the fixed-point representation.
pub const FRACTION_BITS: u32 = 36;

/// `2^FRACTION_BITS` as a float.
pub const SCALE: f64 = (1u64 << FRACTION_BITS) as f64;

/// Largest `|value|` that [`to_fixed`] converts exactly (`2^51` units).
#[cfg_attr(not(test), allow(dead_code))] // only the tests call it since the module is private
pub const MAX_TERM: f64 = (1u64 << (51 - FRACTION_BITS)) as f64;

/// `1.5·2^52`: adding it to a float below `2^51` in magnitude leaves the nearest integer in the
/// low mantissa bits.
pub const MAGIC: f64 = 6_755_399_441_055_744.0;

/// The bits of [`MAGIC`] as an integer.
pub const MAGIC_BITS: i64 = MAGIC.to_bits() as i64;

/// Converts one term to fixed point, rounding to nearest (deterministic: the same `f64` always
/// gives the same integer). Exact for `|value| < MAX_TERM`; the estimator bounds its terms by
/// 2500.
#[inline(always)]
#[cfg_attr(not(test), allow(dead_code))] // only the tests call it since the module is private
pub fn to_fixed(value: f64) -> i64 {
    (value * SCALE + MAGIC).to_bits() as i64 - MAGIC_BITS
}

/// Converts a fixed-point sum back to a float (the nearest `f64`).
#[inline]
pub fn to_f64(value: i128) -> f64 {
    value as f64 / SCALE
}

/// Converts a float to the fixed-point sum closest to it, for injecting statistics.
#[cfg_attr(not(test), allow(dead_code))] // only the tests call it since the module is private
pub fn from_f64(value: f64) -> i128 {
    (value * SCALE).round() as i128
}

/// A 128-bit integer that many threads may add to at once without a lock.
///
/// Stored as two 64-bit words. An addition adds the low words with one `fetch_add`, detects the
/// carry from the value it returns, and adds high word plus carry with a second one. Because
/// both words only ever receive additions, the pair equals the exact sum modulo `2^128` once
/// every writer has finished, in whatever order the additions ran. A reader that races a writer
/// may see the low word without its carry; [`super::accumulator::Accumulator`] only reads a
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
    use crate::test_rng::XorShift;
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
            let mut rng = XorShift::new(seed | 1);
            for i in (1..shuffled.len()).rev() {
                shuffled.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
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
        fn conversion_rounds_to_nearest(value in -MAX_TERM..MAX_TERM) {
            let fixed = to_fixed(value);
            prop_assert_eq!(i128::from(fixed), (value * SCALE).round_ties_even() as i128);
            let back = to_f64(i128::from(fixed));
            prop_assert!((back - value).abs() <= 0.5 / SCALE + value.abs() * f64::EPSILON);
        }
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn scale_example() {
        use crate::estimator::fixed_point::{FRACTION_BITS, SCALE};

        assert_eq!(SCALE, 2f64.powi(FRACTION_BITS as i32));
        assert_eq!(1.0 / SCALE, 2f64.powi(-36)); // the resolution, about 1.5e-11
    }

    #[allow(clippy::assertions_on_constants)] // the example as it was written for the docs
    #[test]
    fn max_term_example() {
        use crate::estimator::fixed_point::MAX_TERM;

        assert_eq!(MAX_TERM, 32768.0);
        assert!(2500.0 < MAX_TERM); // the largest term the estimator ever adds
    }

    #[test]
    fn magic_example() {
        use crate::estimator::fixed_point::{MAGIC, MAGIC_BITS};

        let rounded = (2.75f64 + MAGIC).to_bits() as i64 - MAGIC_BITS;
        assert_eq!(rounded, 3);
    }

    #[test]
    fn to_fixed_example() {
        use crate::estimator::fixed_point::{to_f64, to_fixed};

        assert_eq!(to_fixed(1.0), 1 << 36);
        // Integer sums do not depend on order, unlike float sums.
        let terms = [0.1, 1e-3, 2500.0, -0.7];
        let forward: i128 = terms.iter().map(|&t| i128::from(to_fixed(t))).sum();
        let backward: i128 = terms.iter().rev().map(|&t| i128::from(to_fixed(t))).sum();
        assert_eq!(forward, backward);
        assert!((to_f64(forward) - 2499.401).abs() < 1e-9);
    }

    #[test]
    fn to_f64_example() {
        use crate::estimator::fixed_point::to_f64;

        assert_eq!(to_f64(3 << 35), 1.5);
    }

    #[test]
    fn from_f64_example() {
        use crate::estimator::fixed_point::{from_f64, to_f64};

        let sum = from_f64(-12.25);
        assert_eq!(sum, -12 * (1 << 36) - (1 << 34));
        assert_eq!(to_f64(sum), -12.25);
    }

    #[test]
    fn atomici128_example() {
        use crate::estimator::fixed_point::AtomicI128;

        let sum = AtomicI128::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..1000).for_each(|_| sum.add(i128::from(u64::MAX))));
            }
        });
        assert_eq!(sum.load(), 4000 * i128::from(u64::MAX)); // carries into the high word
        sum.clear();
        assert_eq!(sum.load(), 0);
    }
}
