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
    /// `(slope, version)`.
    pub fn read_into(&self, intercepts: &mut Vec<f64>) -> (f64, u64) {
        intercepts.resize(self.intercepts.len(), 0.0);
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
