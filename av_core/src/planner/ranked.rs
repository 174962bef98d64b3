//! The admission order of draft slots as one integer key.

/// A draft slot's place in the admission order, as one integer: the survival's bits inverted
/// in the high half (survivals are never negative, NaN nor `-0.0`, so their bit patterns order
/// as their values, and inverted bits order them descending), then the position, then the
/// request. Ascending keys are the order the verification planner admits slots in (higher
/// survival, then shallower, then lower request); keys are distinct, so an unstable sort or
/// selection of them (in place, no buffer) gives that order exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ranked(u128);

impl Ranked {
    /// The key of the slot at position `depth` of request `row`.
    #[inline]
    pub(crate) fn new(survival: f64, depth: u32, row: u32) -> Self {
        let order = u128::from(!survival.to_bits()) << 64;
        Ranked(order | u128::from(depth) << 32 | u128::from(row))
    }

    #[inline]
    pub(crate) fn survival(self) -> f64 {
        f64::from_bits(!((self.0 >> 64) as u64))
    }

    #[inline]
    pub(crate) fn depth(self) -> u32 {
        (self.0 >> 32) as u32
    }

    #[inline]
    pub(crate) fn row(self) -> u32 {
        self.0 as u32
    }
}
