//! A versioned, checksummed byte encoding of [`EstimatorState`], for persistence and the C ABI:
//! the estimator's payload in the frame of [`crate::persist`] (kind tag `E`, magic
//! `"AVCORE\0E"`), which says what the frame holds and checks it.
//!
//! Payload, version 1: config, coefficients, fixed-point statistics, counters, memory of past
//! rounds.
//!
//! Decoding checks magic, version, length and checksum before it reads a field, then validates
//! the state like any other input ([`AcceptanceEstimator::from_state`]); arbitrary bytes give an
//! error, never a panic.
//!
//! [`AcceptanceEstimator::from_state`]: crate::AcceptanceEstimator::from_state

use crate::accumulator::{PositionSums, RoundStats};
use crate::error::{Error, Result};
use crate::estimator::{EstimatorConfig, EstimatorState};
use crate::fixed_point::FRACTION_BITS;
use crate::memory::Memory;
pub use crate::persist::crc32;
use crate::persist::{frame, unframe, Kind, Reader, FRAME_LEN};

/// First bytes of an encoded estimator state.
pub const MAGIC: &[u8; 8] = &Kind::Estimator.magic();
/// Version written by this build (and the only one it reads).
///
/// # Example
///
/// ```rust
/// use av_core::snapshot::{encode, FORMAT_VERSION, MAGIC};
/// use av_core::{AcceptanceEstimator, EstimatorConfig};
///
/// let bytes = encode(&AcceptanceEstimator::new(EstimatorConfig::new(2))?.state());
/// assert_eq!(&bytes[..8], MAGIC);
/// assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
/// # Ok::<(), av_core::Error>(())
/// ```
pub const FORMAT_VERSION: u32 = 1;

const ARGUMENT: &str = "data";

/// Length of [`encode`]'s output for an estimator with `num_positions` positions (it depends on
/// nothing else).
///
/// # Example
///
/// ```rust
/// use av_core::snapshot::{encode, encoded_len};
/// use av_core::{AcceptanceEstimator, EstimatorConfig};
///
/// let state = AcceptanceEstimator::new(EstimatorConfig::new(5))?.state();
/// assert_eq!(encode(&state).len(), encoded_len(5));
/// # Ok::<(), av_core::Error>(())
/// ```
pub const fn encoded_len(num_positions: usize) -> usize {
    let k = num_positions;
    // K and refit_interval; ten config floats and the slope; intercepts; fraction bits;
    // five i128 sums and a count per position; three counters; the memory.
    let payload = 8 + 8 + 11 * 8 + k * 8 + 4 + k * (5 * 16 + 8) + 3 * 8 + (2 + 4 * k + 1) * 8;
    FRAME_LEN + payload
}

/// The longest encoded estimator state (`K = 64`): a reader never needs more bytes.
pub const MAX_ENCODED_LEN: usize = encoded_len(EstimatorConfig::MAX_POSITIONS);

/// Encodes `state`. The last four bytes are the CRC-32 of everything before them.
///
/// # Example
///
/// ```rust
/// use av_core::snapshot::{crc32, encode};
/// use av_core::{AcceptanceEstimator, EstimatorConfig};
///
/// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(4))?;
/// let bytes = encode(&estimator.state());
/// let (body, checksum) = bytes.split_at(bytes.len() - 4);
/// assert_eq!(checksum, crc32(body).to_le_bytes());
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn encode(state: &EstimatorState) -> Vec<u8> {
    let mut payload = Vec::with_capacity(128 + state.intercepts.len() * 96);
    let c = &state.config;
    payload.extend((c.num_positions as u64).to_le_bytes());
    payload.extend(c.refit_interval.to_le_bytes());
    for value in [
        c.damping,
        c.l2,
        c.init_slope,
        c.init_intercept,
        c.max_log_odds,
        c.max_step,
        c.max_slope,
        c.max_intercept,
        c.memory,
        c.drift_z,
        state.slope,
    ] {
        payload.extend(value.to_le_bytes());
    }
    for beta in &state.intercepts {
        payload.extend(beta.to_le_bytes());
    }
    payload.extend(FRACTION_BITS.to_le_bytes());
    for p in &state.stats.positions {
        for value in [p.a, p.b, p.c, p.g0, p.g1] {
            payload.extend(value.to_le_bytes());
        }
        payload.extend(p.n.to_le_bytes());
    }
    payload.extend(state.steps_since_refit.to_le_bytes());
    payload.extend(state.num_refits.to_le_bytes());
    payload.extend(state.memory.resets.to_le_bytes());
    let m = &state.memory;
    let memory = [m.a, m.total].into_iter().chain(
        m.b.iter()
            .chain(&m.c)
            .chain(&m.rhs)
            .chain(&m.counts)
            .copied(),
    );
    for value in memory {
        payload.extend(value.to_le_bytes());
    }

    frame(Kind::Estimator, FORMAT_VERSION, &payload)
}

/// Decodes bytes written by [`encode`]; the state still has to pass
/// [`AcceptanceEstimator::from_state`](crate::AcceptanceEstimator::from_state).
///
/// # Example
///
/// ```rust
/// use av_core::snapshot::{decode, encode};
/// use av_core::{AcceptanceEstimator, EstimatorConfig};
///
/// let state = AcceptanceEstimator::new(EstimatorConfig::new(3))?.state();
/// let mut bytes = encode(&state);
/// assert_eq!(decode(&bytes)?, state);
/// bytes[20] ^= 1; // one flipped bit
/// assert_eq!(decode(&bytes).unwrap_err().argument, "data");
/// assert!(decode(b"not a snapshot").is_err());
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn decode(bytes: &[u8]) -> Result<EstimatorState> {
    let payload = unframe(Kind::Estimator, FORMAT_VERSION..=FORMAT_VERSION, bytes)?.payload;
    let mut r = Reader { bytes: payload };
    let num_positions = r.u64("num_positions")?;
    if num_positions == 0 || num_positions > EstimatorConfig::MAX_POSITIONS as u64 {
        return Err(Error::state(
            ARGUMENT,
            format!("num_positions {num_positions} out of range"),
        ));
    }
    let k = num_positions as usize;
    let refit_interval = r.u64("refit_interval")?;
    let mut floats = [0.0; 11];
    for (slot, name) in floats.iter_mut().zip([
        "damping",
        "l2",
        "init_slope",
        "init_intercept",
        "max_log_odds",
        "max_step",
        "max_slope",
        "max_intercept",
        "memory",
        "drift_z",
        "slope",
    ]) {
        *slot = r.f64(name)?;
    }
    let [damping, l2, init_slope, init_intercept, max_log_odds, max_step, max_slope, max_intercept, memory, drift_z, slope] =
        floats;
    let intercepts = (0..k)
        .map(|_| r.f64("intercepts"))
        .collect::<Result<Vec<_>>>()?;
    let bits = r.u32("fraction_bits")?;
    if bits != FRACTION_BITS {
        return Err(Error::state(
            ARGUMENT,
            format!("statistics use {bits} fraction bits, this build uses {FRACTION_BITS}"),
        ));
    }
    let mut positions = Vec::with_capacity(k);
    for _ in 0..k {
        positions.push(PositionSums {
            a: r.i128("statistics")?,
            b: r.i128("statistics")?,
            c: r.i128("statistics")?,
            g0: r.i128("statistics")?,
            g1: r.i128("statistics")?,
            n: r.u64("statistics")?,
        });
    }
    let steps_since_refit = r.u64("steps_since_refit")?;
    let num_refits = r.u64("num_refits")?;
    let resets = r.u64("memory")?;
    let mut floats = |n: usize| (0..n).map(|_| r.f64("memory")).collect::<Result<Vec<_>>>();
    let head = floats(2)?;
    let (b, c, rhs, counts) = (floats(k)?, floats(k)?, floats(k + 1)?, floats(k)?);
    let memory_state = Memory {
        a: head[0],
        total: head[1],
        b,
        c,
        rhs,
        counts,
        resets,
    };
    if !r.bytes.is_empty() {
        return Err(Error::state(
            ARGUMENT,
            format!("{} unexpected bytes after the last field", r.bytes.len()),
        ));
    }
    Ok(EstimatorState {
        config: EstimatorConfig {
            num_positions: k,
            refit_interval,
            damping,
            l2,
            init_slope,
            init_intercept,
            max_log_odds,
            max_step,
            max_slope,
            max_intercept,
            memory,
            drift_z,
        },
        slope,
        intercepts,
        stats: RoundStats { positions },
        steps_since_refit,
        num_refits,
        memory: memory_state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AcceptanceEstimator, MatrixView};
    use proptest::prelude::*;

    fn sample_state() -> EstimatorState {
        let est = AcceptanceEstimator::new(EstimatorConfig::new(3)).unwrap();
        let x = [1.0f32, -2.0, 3.5, 0.25, 8.0, -1.0];
        est.observe::<f32, f32>(
            MatrixView::new("f", &x, 2, 3).unwrap(),
            &[3, 2],
            &[1, 2],
            None,
        )
        .unwrap();
        est.refit();
        est.observe::<f32, f32>(
            MatrixView::new("f", &x, 2, 3).unwrap(),
            &[2, 1],
            &[0, 1],
            None,
        )
        .unwrap();
        est.state()
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn round_trips() {
        let state = sample_state();
        let bytes = encode(&state);
        assert_eq!(decode(&bytes).unwrap(), state);
    }

    #[test]
    fn every_truncation_and_every_bit_flip_is_refused() {
        let bytes = encode(&sample_state());
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut corrupt = bytes.clone();
                corrupt[i] ^= 1 << bit;
                assert!(decode(&corrupt).is_err(), "flip at byte {i} bit {bit}");
            }
        }
    }

    #[test]
    fn encoded_len_is_the_length_for_every_k() {
        for k in 1..=EstimatorConfig::MAX_POSITIONS {
            let state = AcceptanceEstimator::new(EstimatorConfig::new(k))
                .unwrap()
                .state();
            assert_eq!(encode(&state).len(), encoded_len(k), "K = {k}");
        }
        assert!(encode(&sample_state()).len() <= MAX_ENCODED_LEN);
    }

    #[test]
    fn future_versions_are_refused_by_name() {
        let mut bytes = encode(&sample_state());
        bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
        let err = decode(&bytes).unwrap_err();
        assert!(err.message.contains("format version 2"), "{err}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(state) = decode(&bytes) {
                let _ = AcceptanceEstimator::from_state(&state);
            }
        }

        #[test]
        fn arbitrary_payloads_behind_a_valid_header_never_panic(
            payload in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let mut bytes = MAGIC.to_vec();
            bytes.extend(FORMAT_VERSION.to_le_bytes());
            bytes.extend((payload.len() as u64).to_le_bytes());
            bytes.extend(&payload);
            let checksum = crc32(&bytes);
            bytes.extend(checksum.to_le_bytes());
            if let Ok(state) = decode(&bytes) {
                let _ = AcceptanceEstimator::from_state(&state);
            }
        }
    }
}
