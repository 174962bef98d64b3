//! The exploration floor: a few requests verify (and draft) their whole block whatever the
//! budget, so that no position is locked out of labels.
//!
//! With trimming on, a position whose estimate collapsed (one confidently wrong round) is never
//! admitted again, so it never gets another label and never recovers. A floor of full
//! verifications keeps labels coming. It stays lossless because every draw is a hash of
//! (`seed`, step number, slot): fixed before any token is drafted and independent of them.

use crate::error::{Error, Result};

/// The exploration draw of a whole step (slots are far below it, so draws never collide).
const WHOLE_STEP: u64 = u64::MAX;

/// The planner's exploration policy: a probability `ε` and the seed of its draws.
///
/// Each step, each request independently explores with probability `ε` (a hash of the seed,
/// the step number and its slot): the verification planner verifies its whole scheduled block,
/// and the drafting-depth decision lets it draft as deep as the batch does. One more draw per
/// step makes it an *exploration step* (probability `ε`), in which the explorers draft their
/// whole block even when the decision is not to draft. `ε = 0` turns it off (vLLM's
/// behaviour).
///
/// # Example
///
/// ```rust
/// use av_core::planner::Exploration;
///
/// let exploration = Exploration::new("exploration", 0.25, 7)?;
/// assert_eq!((exploration.probability(), exploration.seed()), (0.25, 7));
/// // The same (seed, step, slot) always draws the same.
/// assert_eq!(exploration.explores(3, 5), exploration.explores(3, 5));
/// let explorers = (0..10_000).filter(|&slot| exploration.explores(1, slot)).count();
/// assert!((2_300..2_700).contains(&explorers));
/// assert!(!Exploration::OFF.explores(1, 0) && Exploration::ALWAYS.explores(1, 0));
/// // The caller names the argument (a binding may call it `exploration` or `probability`).
/// let err = Exploration::new("probability", 1.5, 0).unwrap_err();
/// assert_eq!(err.to_string(), "probability: must be a probability in [0, 1], got 1.5");
/// # Ok::<(), av_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exploration {
    probability: f64,
    seed: u64,
}

impl Default for Exploration {
    fn default() -> Self {
        Exploration::DEFAULT
    }
}

impl Exploration {
    /// Default probability: one request in a hundred verifies its whole draft block.
    pub const DEFAULT_PROBABILITY: f64 = 0.01;

    /// The default policy: [`Self::DEFAULT_PROBABILITY`], seed 0.
    pub const DEFAULT: Exploration = Exploration {
        probability: Self::DEFAULT_PROBABILITY,
        seed: 0,
    };

    /// No exploration.
    pub const OFF: Exploration = Exploration {
        probability: 0.0,
        seed: 0,
    };

    /// Every request explores every step.
    pub const ALWAYS: Exploration = Exploration {
        probability: 1.0,
        seed: 0,
    };

    /// A policy of probability `probability` (in `[0, 1]`) with draws from `seed`; `argument`
    /// names the probability in the error, as the caller's API spells it.
    pub fn new(argument: &'static str, probability: f64, seed: u64) -> Result<Self> {
        if !(0.0..=1.0).contains(&probability) {
            return Err(Error::value(
                argument,
                format!("must be a probability in [0, 1], got {probability}"),
            ));
        }
        Ok(Exploration { probability, seed })
    }

    /// The probability `ε`.
    pub fn probability(self) -> f64 {
        self.probability
    }

    /// The seed of the draws.
    pub fn seed(self) -> u64 {
        self.seed
    }

    /// Whether the policy explores at all (`ε > 0`).
    pub fn is_on(self) -> bool {
        self.probability > 0.0
    }

    /// Whether `slot` explores at step `step`: a deterministic draw from (seed, step, slot).
    pub fn explores(self, step: u64, slot: u64) -> bool {
        self.explores_key(step, slot_key(slot))
    }

    /// [`Self::explores`] for the slot whose [`slot_key`] is `key` (planners keep each slot's
    /// key, one hash fewer per draw).
    #[inline]
    pub(crate) fn explores_key(self, step: u64, key: u64) -> bool {
        self.draws(step).explores(key)
    }

    /// The draws of step `step`, for many slots.
    #[inline]
    pub(crate) fn draws(self, step: u64) -> Draws {
        // A draw `x = hash >> 11` (an integer below 2^53) explores when `x · 2^-53 < p`. Both
        // sides are exact (a power-of-two scaling), so that is `x < p · 2^53`, and for an
        // integer `x`, `x < ⌈p · 2^53⌉`: one integer comparison per draw.
        Draws {
            seed: self.seed,
            step,
            cut: (self.probability * (1u64 << 53) as f64).ceil() as u64,
        }
    }

    /// Whether `step` is an exploration step (one draw per step, probability `ε`): its
    /// explorers draft their whole block.
    pub fn is_exploration_step(self, step: u64) -> bool {
        self.explores(step, WHOLE_STEP)
    }
}

/// One step's exploration draws ([`Exploration::draws`]).
#[derive(Clone, Copy)]
pub(crate) struct Draws {
    seed: u64,
    step: u64,
    cut: u64,
}

impl Draws {
    /// Whether the slot whose [`slot_key`] is `key` explores.
    #[inline]
    pub(crate) fn explores(self, key: u64) -> bool {
        self.draws_below(mix(self.seed ^ mix(self.step ^ key)) >> 11)
    }

    /// Whether a draw `x` (below 2^53) explores.
    #[inline]
    fn draws_below(self, x: u64) -> bool {
        x < self.cut
    }
}

/// splitmix64's finalizer: a well-mixed 64-bit hash.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The part of a draw that depends on the slot alone.
#[inline]
pub(crate) fn slot_key(slot: u64) -> u64 {
    mix(slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The integer cut draws exactly what the probability's float comparison draws.
    #[test]
    fn the_integer_cut_is_the_float_comparison() {
        let probabilities = [
            0.0,
            5e-324,
            1e-300,
            1e-16,
            1.0 / (1u64 << 53) as f64,
            0.01,
            0.1,
            0.3,
            0.5,
            1.0 - 1e-16,
            1.0,
        ];
        for p in probabilities {
            let draws = Exploration::new("p", p, 7).unwrap().draws(0);
            let cut = draws.cut;
            for x in [
                0u64,
                1,
                2,
                cut.saturating_sub(1),
                cut,
                cut + 1,
                (1 << 53) - 1,
            ] {
                let x = x.min((1 << 53) - 1);
                let float = (x as f64) * (1.0 / (1u64 << 53) as f64) < p;
                assert_eq!(draws.draws_below(x), float, "p = {p}, x = {x}");
            }
        }
        let exploration = Exploration::new("p", 0.37, 11).unwrap();
        for step in 0..50 {
            for slot in 0..200 {
                let float = {
                    let draw = mix(11 ^ mix(step ^ mix(slot)));
                    ((draw >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < 0.37
                };
                assert_eq!(exploration.explores(step, slot), float);
            }
        }
    }
}
