//! A versioned, checksummed byte encoding of [`EstimatorState`], for persistence and the C ABI.
//!
//! Layout (little-endian):
//!
//! ```text
//! magic  "AVCORE\0E"            8 bytes
//! format version                u32   (currently 2)
//! payload length                u64
//! payload                       config, coefficients, fixed-point statistics, counters,
//!                               memory of past rounds; since version 2 then the update
//!                               (u32: 0 map, 1 vllm), bins, the four prior widths and, for
//!                               map, its state (reference coefficients, the open round's
//!                               histograms, their memory, the fitted-labels marker, resets;
//!                               each column prefixed by its length)
//! CRC-32 (IEEE) of all the above u32
//! ```
//!
//! Version 1 (av_core before the `map` update) still loads: it is a `vllm` estimator, restored
//! with everything it held (open round, memory), so it predicts and continues bit for bit as it
//! did.
//!
//! Decoding checks magic, version, length and checksum before it reads a field, then validates
//! the state like any other input ([`AcceptanceEstimator::from_state`]); arbitrary bytes give an
//! error, never a panic.
//!
//! [`AcceptanceEstimator::from_state`]: crate::AcceptanceEstimator::from_state

use crate::accumulator::{PositionSums, RoundStats};
use crate::error::{Error, Result};
use crate::estimator::{EstimatorConfig, EstimatorState, MapState, Update};
use crate::fixed_point::FRACTION_BITS;
use crate::histogram::{HistogramMemory, HistogramStats, MAX_BINS, X_FRACTION_BITS};
use crate::memory::Memory;

/// First bytes of an encoded estimator state.
pub const MAGIC: &[u8; 8] = b"AVCORE\0E";
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
pub const FORMAT_VERSION: u32 = 2;

/// The first format version, which this build still reads (and which the planner's state
/// still uses).
pub const FORMAT_VERSION_1: u32 = 1;

const ARGUMENT: &str = "data";

/// Bytes of the frame around a payload: magic, version, length and CRC-32.
pub(crate) const FRAME_LEN: usize = 8 + 4 + 8 + 4;

/// Length of [`encode`]'s output for an estimator with `num_positions` positions on `update`
/// with `bins` bins (it depends on nothing else).
///
/// # Example
///
/// ```rust
/// use av_core::snapshot::{encode, encoded_len};
/// use av_core::{AcceptanceEstimator, EstimatorConfig, Update};
///
/// let state = AcceptanceEstimator::new(EstimatorConfig::new(5))?.state();
/// assert_eq!(encode(&state).len(), encoded_len(5, Update::Map, 64));
/// let state = AcceptanceEstimator::new(EstimatorConfig::vllm(5))?.state();
/// assert_eq!(encode(&state).len(), encoded_len(5, Update::Vllm, 64));
/// # Ok::<(), av_core::Error>(())
/// ```
pub const fn encoded_len(num_positions: usize, update: Update, bins: usize) -> usize {
    let k = num_positions;
    // K and refit_interval; ten config floats and the slope; intercepts; fraction bits;
    // five i128 sums and a count per position; three counters; the memory.
    let version_1 = 8 + 8 + 11 * 8 + k * 8 + 4 + k * (5 * 16 + 8) + 3 * 8 + (2 + 4 * k + 1) * 8;
    // The update, bins, four prior widths and whether a map state follows.
    let extension = 4 + 8 + 4 * 8 + 1;
    let map = match update {
        Update::Vllm => 0,
        // Reference (slope + intercepts, length-prefixed), fraction bits, six columns of K·B
        // (length-prefixed), two counters.
        Update::Map => 8 + 8 * (k + 1) + 4 + 6 * (8 + 8 * k * bins) + 2 * 8,
    };
    FRAME_LEN + version_1 + extension + map
}

/// The longest encoded estimator state (`K = 64`, `map` with the most bins): a reader never
/// needs more bytes.
pub const MAX_ENCODED_LEN: usize =
    encoded_len(EstimatorConfig::MAX_POSITIONS, Update::Map, MAX_BINS);

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) of `bytes`.
///
/// # Example
///
/// ```rust
/// use av_core::snapshot::crc32;
///
/// assert_eq!(crc32(b"123456789"), 0xCBF4_3926); // the standard check value
/// assert_eq!(crc32(b""), 0);
/// ```
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

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
    // Version 2: the update and the map state.
    payload.extend(
        match c.update {
            Update::Map => 0u32,
            Update::Vllm => 1u32,
        }
        .to_le_bytes(),
    );
    payload.extend((c.bins as u64).to_le_bytes());
    for value in [
        c.prior_slope_sd,
        c.prior_level_sd,
        c.prior_trend_sd,
        c.prior_spread_sd,
    ] {
        payload.extend(value.to_le_bytes());
    }
    payload.push(u8::from(state.map.is_some()));
    if let Some(map) = &state.map {
        let reference: Vec<f64> = std::iter::once(map.reference_slope)
            .chain(map.reference_intercepts.iter().copied())
            .collect();
        floats_column(&mut payload, &reference);
        payload.extend(X_FRACTION_BITS.to_le_bytes());
        for column in [&map.round.count, &map.round.accepted, &map.round.x_sum] {
            payload.extend((column.len() as u64).to_le_bytes());
            for value in column {
                payload.extend(value.to_le_bytes());
            }
        }
        for column in [&map.memory.count, &map.memory.accepted, &map.memory.x_sum] {
            floats_column(&mut payload, column);
        }
        payload.extend(map.fitted_labels.to_le_bytes());
        payload.extend(map.resets.to_le_bytes());
    }

    frame_version(MAGIC, FORMAT_VERSION, &payload)
}

fn floats_column(payload: &mut Vec<u8>, column: &[f64]) {
    payload.extend((column.len() as u64).to_le_bytes());
    for value in column {
        payload.extend(value.to_le_bytes());
    }
}

/// Wraps `payload` as `magic | version 1 | length | payload | CRC-32` (the planner's frame).
pub(crate) fn frame(magic: &[u8; 8], payload: &[u8]) -> Vec<u8> {
    frame_version(magic, FORMAT_VERSION_1, payload)
}

/// Wraps `payload` as `magic | version | length | payload | CRC-32`.
pub(crate) fn frame_version(magic: &[u8; 8], version: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 24);
    out.extend(magic);
    out.extend(version.to_le_bytes());
    out.extend((payload.len() as u64).to_le_bytes());
    out.extend(payload);
    let checksum = crc32(&out);
    out.extend(checksum.to_le_bytes());
    out
}

/// A cursor that fails with a value error instead of reading past the end.
pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
}

impl Reader<'_> {
    pub(crate) fn take<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        if self.bytes.len() < N {
            return Err(Error::value(
                ARGUMENT,
                format!("truncated while reading {what}"),
            ));
        }
        let (head, rest) = self.bytes.split_at(N);
        self.bytes = rest;
        Ok(head.try_into().expect("split at N"))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        self.take::<4>(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        self.take::<8>(what).map(u64::from_le_bytes)
    }

    pub(crate) fn f64(&mut self, what: &str) -> Result<f64> {
        self.take::<8>(what).map(f64::from_le_bytes)
    }

    pub(crate) fn i128(&mut self, what: &str) -> Result<i128> {
        self.take::<16>(what).map(i128::from_le_bytes)
    }

    /// A length prefix, refused unless that many `width`-byte values follow.
    fn length(&mut self, what: &str, width: usize) -> Result<usize> {
        let len = self.u64(what)?;
        match usize::try_from(len).ok().and_then(|n| n.checked_mul(width)) {
            Some(bytes) if bytes <= self.bytes.len() => Ok(len as usize),
            _ => Err(Error::value(
                ARGUMENT,
                format!("truncated while reading {what} ({len} entries promised)"),
            )),
        }
    }

    fn f64_column(&mut self, what: &str) -> Result<Vec<f64>> {
        let len = self.length(what, 8)?;
        (0..len).map(|_| self.f64(what)).collect()
    }

    fn u64_column(&mut self, what: &str) -> Result<Vec<u64>> {
        let len = self.length(what, 8)?;
        (0..len).map(|_| self.u64(what)).collect()
    }
}

/// Checks the frame written by [`frame`] (magic, version 1, length, checksum) and returns the
/// payload; `what` names the expected kind of state in the error.
pub(crate) fn unframe<'a>(magic: &[u8; 8], what: &str, bytes: &'a [u8]) -> Result<&'a [u8]> {
    unframe_versions(magic, what, bytes, FORMAT_VERSION_1..=FORMAT_VERSION_1).map(|(_, p)| p)
}

/// [`unframe`] for any version in `versions`; returns the version and the payload.
pub(crate) fn unframe_versions<'a>(
    magic: &[u8; 8],
    what: &str,
    bytes: &'a [u8],
    versions: std::ops::RangeInclusive<u32>,
) -> Result<(u32, &'a [u8])> {
    if bytes.len() < magic.len() || &bytes[..magic.len()] != magic {
        return Err(Error::value(
            ARGUMENT,
            format!("not {what} (bad magic bytes)"),
        ));
    }
    let mut header = Reader {
        bytes: &bytes[magic.len()..],
    };
    let version = header.u32("the format version")?;
    if !versions.contains(&version) {
        let (first, last) = (versions.start(), versions.end());
        let reads = if first == last {
            format!("{first}")
        } else {
            format!("{first} to {last}")
        };
        return Err(Error::value(
            ARGUMENT,
            format!("format version {version} is not supported (this build reads {reads})"),
        ));
    }
    let length = header.u64("the payload length")?;
    let expected = (magic.len() as u64 + 12)
        .checked_add(length)
        .and_then(|n| n.checked_add(4));
    if expected != Some(bytes.len() as u64) {
        return Err(Error::value(
            ARGUMENT,
            format!(
                "length mismatch: header promises a {length}-byte payload, the data has {} bytes \
                 in all (truncated or padded)",
                bytes.len()
            ),
        ));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
    let actual = crc32(body);
    if stored != actual {
        return Err(Error::value(
            ARGUMENT,
            format!("checksum mismatch (stored {stored:#010x}, computed {actual:#010x}): corrupt"),
        ));
    }
    Ok((version, &body[magic.len() + 12..]))
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
    let (version, payload) = unframe_versions(
        MAGIC,
        "an av_core estimator state",
        bytes,
        FORMAT_VERSION_1..=FORMAT_VERSION,
    )?;
    let mut r = Reader { bytes: payload };
    let num_positions = r.u64("num_positions")?;
    if num_positions == 0 || num_positions > EstimatorConfig::MAX_POSITIONS as u64 {
        return Err(Error::value(
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
        return Err(Error::value(
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
    // Version 1 is the vllm update; version 2 says which, and carries the map state.
    let mut extension = EstimatorConfig::vllm(k);
    let mut map = None;
    if version >= 2 {
        extension.update = match r.u32("update")? {
            0 => Update::Map,
            1 => Update::Vllm,
            other => {
                return Err(Error::value(
                    ARGUMENT,
                    format!("update code {other} is not 0 (map) or 1 (vllm)"),
                ))
            }
        };
        let bins = r.u64("bins")?;
        extension.bins = usize::try_from(bins).unwrap_or(usize::MAX);
        extension.prior_slope_sd = r.f64("prior_slope_sd")?;
        extension.prior_level_sd = r.f64("prior_level_sd")?;
        extension.prior_trend_sd = r.f64("prior_trend_sd")?;
        extension.prior_spread_sd = r.f64("prior_spread_sd")?;
        let [present] = r.take::<1>("map")?;
        if present > 1 {
            return Err(Error::value(
                ARGUMENT,
                format!("map flag {present} is not 0 or 1"),
            ));
        }
        if present == 1 {
            let reference = r.f64_column("reference")?;
            let Some((&slope, intercepts)) = reference.split_first() else {
                return Err(Error::value(
                    ARGUMENT,
                    "the reference coefficients are empty",
                ));
            };
            let bits = r.u32("x fraction bits")?;
            if bits != X_FRACTION_BITS {
                return Err(Error::value(
                    ARGUMENT,
                    format!(
                        "histograms use {bits} fraction bits, this build uses {X_FRACTION_BITS}"
                    ),
                ));
            }
            let round = HistogramStats {
                num_positions: k,
                bins: extension.bins,
                count: r.u64_column("round_stats")?,
                accepted: r.u64_column("round_stats")?,
                x_sum: r.u64_column("round_stats")?,
            };
            let memory = HistogramMemory {
                num_positions: k,
                bins: extension.bins,
                count: r.f64_column("memory")?,
                accepted: r.f64_column("memory")?,
                x_sum: r.f64_column("memory")?,
            };
            map = Some(MapState {
                reference_slope: slope,
                reference_intercepts: intercepts.to_vec(),
                round,
                memory,
                fitted_labels: r.u64("fitted_labels")?,
                resets: r.u64("memory")?,
            });
        }
    }
    if !r.bytes.is_empty() {
        return Err(Error::value(
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
            ..extension
        },
        slope,
        intercepts,
        stats: RoundStats { positions },
        steps_since_refit,
        num_refits,
        memory: memory_state,
        map,
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
            for config in [EstimatorConfig::new(k), EstimatorConfig::vllm(k)] {
                let (update, bins) = (config.update, config.bins);
                let state = AcceptanceEstimator::new(config).unwrap().state();
                assert_eq!(
                    encode(&state).len(),
                    encoded_len(k, update, bins),
                    "K = {k}"
                );
            }
        }
        assert!(encode(&sample_state()).len() <= MAX_ENCODED_LEN);
    }

    #[test]
    fn future_versions_are_refused_by_name() {
        let mut bytes = encode(&sample_state());
        bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
        let err = decode(&bytes).unwrap_err();
        assert!(err.message.contains("format version 3"), "{err}");
    }

    #[test]
    fn a_version_1_state_is_a_vllm_estimator_with_everything_it_held() {
        // Version 1 is this build's version 2 minus the extension, framed as version 1.
        let mut config = EstimatorConfig::vllm(3);
        config.refit_interval = 4;
        let est = AcceptanceEstimator::new(config).unwrap();
        let x = [1.0f32, -2.0, 3.5, 0.25, 8.0, -1.0];
        for _ in 0..6 {
            est.observe::<f32, f32>(
                MatrixView::new("f", &x, 2, 3).unwrap(),
                &[3, 2],
                &[1, 2],
                None,
            )
            .unwrap();
        }
        let state = est.state();
        let bytes = encode(&state);
        let payload = &bytes[20..bytes.len() - 4];
        let extension = 4 + 8 + 4 * 8 + 1;
        let old = frame(MAGIC, &payload[..payload.len() - extension]);
        assert_eq!(decode(&old).unwrap(), state);
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
