use crate::error::{Error, Result};

const WHOLE_STEP: u64 = u64::MAX;

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
    pub const DEFAULT_PROBABILITY: f64 = 0.01;

    pub const DEFAULT: Exploration = Exploration {
        probability: Self::DEFAULT_PROBABILITY,
        seed: 0,
    };

    pub const OFF: Exploration = Exploration {
        probability: 0.0,
        seed: 0,
    };

    pub const ALWAYS: Exploration = Exploration {
        probability: 1.0,
        seed: 0,
    };

    pub fn new(argument: &'static str, probability: f64, seed: u64) -> Result<Self> {
        if !(0.0..=1.0).contains(&probability) {
            return Err(Error::value(
                argument,
                format!("must be a probability in [0, 1], got {probability}"),
            ));
        }
        Ok(Exploration { probability, seed })
    }

    pub fn probability(self) -> f64 {
        self.probability
    }

    pub fn seed(self) -> u64 {
        self.seed
    }

    pub fn is_on(self) -> bool {
        self.probability > 0.0
    }

    pub fn explores(self, step: u64, slot: u64) -> bool {
        fn mix(mut z: u64) -> u64 {
            // splitmix64's finalizer: a well-mixed 64-bit hash.
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        let draw = mix(self.seed ^ mix(step ^ mix(slot)));
        ((draw >> 11) as f64) * (1.0 / (1u64 << 53) as f64) < self.probability
    }

    pub fn is_exploration_step(self, step: u64) -> bool {
        self.explores(step, WHOLE_STEP)
    }
}
