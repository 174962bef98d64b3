//! The fitted coefficients, readable by any thread while a refit publishes new ones.
//!
//! A sequence lock: the single writer (a refit, serialized by the estimator) makes the sequence
//! odd, stores the new values, and makes it even again; a reader copies the values and retries
//! if the sequence moved or was odd. Readers never block the writer and never see a vector that
//! mixes two refits. Every field is an atomic, so a racing read is a retry, not undefined
//! behaviour.

use crate::sync::{backoff, fence, AtomicU64, Ordering};

/// A consistent copy of the coefficients.
#[derive(Clone, Debug, PartialEq)]
pub struct Coefficients {
    /// Shared slope ω.
    pub slope: f64,
    /// Per-position intercepts β_k.
    pub intercepts: Vec<f64>,
    /// How many refits produced these values (0 for the initial ones).
    pub version: u64,
}

/// Coefficients shared between one writer and any number of readers.
///
/// `read`, `read_into`, `len` and `is_empty` may run on any number of threads at once, and
/// concurrently with `write`; `write` calls must not overlap each other (the estimator
/// serializes them with its refit lock).
#[derive(Debug)]
pub struct SharedCoefficients {
    sequence: AtomicU64,
    version: AtomicU64,
    slope: AtomicU64,
    intercepts: Box<[AtomicU64]>,
}

impl SharedCoefficients {
    /// Starts from `slope` and `intercepts`, at `version`.
    pub fn new(slope: f64, intercepts: &[f64], version: u64) -> Self {
        SharedCoefficients {
            sequence: AtomicU64::new(0),
            version: AtomicU64::new(version),
            slope: AtomicU64::new(slope.to_bits()),
            intercepts: intercepts
                .iter()
                .map(|b| AtomicU64::new(b.to_bits()))
                .collect(),
        }
    }

    /// Number of positions.
    pub fn len(&self) -> usize {
        self.intercepts.len()
    }

    /// Always false: an estimator has at least one position.
    pub fn is_empty(&self) -> bool {
        self.intercepts.is_empty()
    }

    /// Copies a consistent snapshot into `intercepts` (resized to fit) and returns
    /// `(slope, version)`. Reuses the caller's buffer, so a hot loop does not allocate.
    pub fn read_into(&self, intercepts: &mut Vec<f64>) -> (f64, u64) {
        intercepts.resize(self.intercepts.len(), 0.0);
        self.read_into_slice(intercepts)
    }

    /// [`read_into`](Self::read_into) into a slice of [`len`](Self::len) entries (a buffer on
    /// the caller's stack).
    pub fn read_into_slice(&self, intercepts: &mut [f64]) -> (f64, u64) {
        debug_assert_eq!(intercepts.len(), self.intercepts.len());
        let mut spins = 0u32;
        loop {
            let before = self.sequence.load(Ordering::Acquire);
            if before & 1 == 0 {
                let slope = f64::from_bits(self.slope.load(Ordering::Relaxed));
                let version = self.version.load(Ordering::Relaxed);
                for (out, value) in intercepts.iter_mut().zip(&*self.intercepts) {
                    *out = f64::from_bits(value.load(Ordering::Relaxed));
                }
                fence(Ordering::Acquire);
                if self.sequence.load(Ordering::Relaxed) == before {
                    return (slope, version);
                }
            }
            backoff(&mut spins);
        }
    }

    /// A consistent snapshot.
    pub fn read(&self) -> Coefficients {
        let mut intercepts = Vec::with_capacity(self.intercepts.len());
        let (slope, version) = self.read_into(&mut intercepts);
        Coefficients {
            slope,
            intercepts,
            version,
        }
    }

    /// Publishes new values. Only one writer at a time (the caller serializes writers).
    ///
    /// Panics if `intercepts` has a different length from the current vector.
    pub fn write(&self, slope: f64, intercepts: &[f64], version: u64) {
        assert_eq!(intercepts.len(), self.intercepts.len());
        let sequence = self.sequence.load(Ordering::Relaxed);
        self.sequence
            .store(sequence.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.slope.store(slope.to_bits(), Ordering::Relaxed);
        self.version.store(version, Ordering::Relaxed);
        for (slot, value) in self.intercepts.iter().zip(intercepts) {
            slot.store(value.to_bits(), Ordering::Relaxed);
        }
        self.sequence
            .store(sequence.wrapping_add(2), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn readers_never_see_a_mixed_vector() {
        // Each published vector is (v, [v; 16]) for version v: a torn read would mix versions.
        let shared = Arc::new(SharedCoefficients::new(0.0, &[0.0; 16], 0));
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                for v in 1..=20_000u64 {
                    shared.write(v as f64, &[v as f64; 16], v);
                }
            })
        };
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    let mut last = 0;
                    for _ in 0..20_000 {
                        let c = shared.read();
                        assert!(c.intercepts.iter().all(|&b| b == c.slope));
                        assert_eq!(c.slope, c.version as f64);
                        assert!(c.version >= last);
                        last = c.version;
                    }
                })
            })
            .collect();
        writer.join().unwrap();
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(shared.read().version, 20_000);
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn sharedcoefficients_example() {
        use crate::estimator::coefficients::SharedCoefficients;

        let shared = SharedCoefficients::new(0.5, &[-0.2, -0.4], 0);
        std::thread::scope(|s| {
            s.spawn(|| shared.write(0.55, &[-0.1, -0.6], 1));
            s.spawn(|| {
                let c = shared.read(); // either version, never a mix
                assert!(c.version == 0 && c.slope == 0.5 || c.version == 1 && c.slope == 0.55);
            });
        });
        assert_eq!(shared.read().intercepts, [-0.1, -0.6]);
        assert_eq!(shared.len(), 2);
    }

    #[test]
    fn new_example() {
        use crate::estimator::coefficients::SharedCoefficients;

        let shared = SharedCoefficients::new(0.5, &[-0.2; 4], 0);
        assert_eq!(shared.len(), 4);
        assert!(!shared.is_empty());
        assert_eq!(shared.read().version, 0);
    }

    #[test]
    fn read_into_example() {
        use crate::estimator::coefficients::SharedCoefficients;

        let shared = SharedCoefficients::new(0.48, &[0.3, -0.1, -0.9], 7);
        let mut intercepts = Vec::new();
        assert_eq!(shared.read_into(&mut intercepts), (0.48, 7));
        assert_eq!(intercepts, [0.3, -0.1, -0.9]);
    }

    #[test]
    fn read_example() {
        use crate::estimator::coefficients::{Coefficients, SharedCoefficients};

        let shared = SharedCoefficients::new(0.5, &[-0.2, -0.2], 0);
        let expected = Coefficients {
            slope: 0.5,
            intercepts: vec![-0.2, -0.2],
            version: 0,
        };
        assert_eq!(shared.read(), expected);
    }

    #[test]
    fn write_example() {
        use crate::estimator::coefficients::SharedCoefficients;

        let shared = SharedCoefficients::new(0.5, &[-0.2, -0.2], 0);
        shared.write(0.6, &[0.1, -0.3], 1);
        let c = shared.read();
        assert_eq!(
            (c.slope, c.intercepts, c.version),
            (0.6, vec![0.1, -0.3], 1)
        );
    }
}
