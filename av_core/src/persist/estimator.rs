//! The estimator's payload, kind [`Kind::Estimator`]: a versioned, checksummed byte encoding of
//! [`EstimatorState`], for persistence and the C ABI (what
//! [`AcceptanceEstimator::to_bytes`](crate::AcceptanceEstimator::to_bytes) writes, magic
//! `"AVCORE\0E"`).
//!
//! Payload, version 1: config, coefficients, fixed-point statistics, counters, memory of past
//! rounds. Version 2 appends the update (u32: 0 map, 1 vllm), bins, the four prior widths and,
//! for map, its state (reference coefficients, the open round's histograms, their memory, the
//! fitted-labels marker, resets; each column prefixed by its length).
//!
//! Version 1 (av_core before the `map` update) still loads: it is a `vllm` estimator, restored
//! with everything it held (open round, memory), so it predicts and continues bit for bit as it
//! did. And a `vllm` estimator whose map settings are the defaults (every estimator built
//! without opting into `map`) is still *written* as version 1 ([`written_version`]): the same
//! bytes as before the map update, which older builds read.
//!
//! Decoding checks magic, version, length and checksum before it reads a field, then validates
//! the state like any other input
//! ([`AcceptanceEstimator::from_state`](crate::AcceptanceEstimator::from_state)); arbitrary bytes
//! give an error, never a panic.
//!
//! [`written_version`]: written_version

use crate::error::{Error, Result};
use crate::estimator::{
    EstimatorConfig, EstimatorState, HistogramMemory, HistogramStats, MapState, Memory,
    PositionSums, RoundStats, Update, FRACTION_BITS, MAX_BINS, X_FRACTION_BITS,
};
use crate::persist::{frame, put_f64s, unframe, Kind, Reader, FRAME_LEN};

/// First bytes of an encoded estimator state.
pub const MAGIC: &[u8; 8] = &Kind::Estimator.magic();
/// The newest version, which this build writes for every state version 1 cannot hold (see
/// [`written_version`]); it reads it and [`FORMAT_VERSION_1`].
///
/// # Example
///
/// ```rust
/// use av_core::persist::estimator::{encode, FORMAT_VERSION, MAGIC};
/// use av_core::{AcceptanceEstimator, EstimatorConfig};
///
/// let bytes = encode(&AcceptanceEstimator::new(EstimatorConfig::map(2))?.state());
/// assert_eq!(&bytes[..8], MAGIC);
/// assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
/// # Ok::<(), av_core::Error>(())
/// ```
pub const FORMAT_VERSION: u32 = 2;

/// The first format version, which this build still reads (and which the planner's state
/// still uses).
pub const FORMAT_VERSION_1: u32 = 1;

const ARGUMENT: &str = "data";

/// Bytes version 2 adds to version 1 before any map state: the update, bins, four prior widths
/// and whether a map state follows.
pub const VERSION_2_EXTENSION_LEN: usize = 4 + 8 + 4 * 8 + 1;

/// Length of [`encode`]'s output for an estimator with `num_positions` positions on `update`
/// with `bins` bins and, for `vllm`, the default map settings (it depends on nothing else). A
/// `vllm` estimator with other map settings is written as version 2,
/// [`VERSION_2_EXTENSION_LEN`] bytes longer.
///
/// # Example
///
/// ```rust
/// use av_core::persist::estimator::{encode, encoded_len, VERSION_2_EXTENSION_LEN};
/// use av_core::{AcceptanceEstimator, EstimatorConfig, Update};
///
/// let state = AcceptanceEstimator::new(EstimatorConfig::map(5))?.state();
/// assert_eq!(encode(&state).len(), encoded_len(5, Update::Map, 64));
/// let vllm = EstimatorConfig::new(5).with_update(Update::Vllm);
/// let state = AcceptanceEstimator::new(vllm.clone())?.state();
/// assert_eq!(encode(&state).len(), encoded_len(5, Update::Vllm, 64));
/// let mut config = vllm;
/// config.bins = 32;
/// let state = AcceptanceEstimator::new(config)?.state();
/// assert_eq!(encode(&state).len(), encoded_len(5, Update::Vllm, 32) + VERSION_2_EXTENSION_LEN);
/// # Ok::<(), av_core::Error>(())
/// ```
pub const fn encoded_len(num_positions: usize, update: Update, bins: usize) -> usize {
    let k = num_positions;
    // K and refit_interval; ten config floats and the slope; intercepts; fraction bits;
    // five i128 sums and a count per position; three counters; the memory.
    let version_1 = 8 + 8 + 11 * 8 + k * 8 + 4 + k * (5 * 16 + 8) + 3 * 8 + (2 + 4 * k + 1) * 8;
    let rest = match update {
        Update::Vllm => 0,
        // The extension, then the reference (slope + intercepts, length-prefixed), fraction
        // bits, six columns of K·B (length-prefixed), two counters.
        Update::Map => {
            VERSION_2_EXTENSION_LEN + 8 + 8 * (k + 1) + 4 + 6 * (8 + 8 * k * bins) + 2 * 8
        }
    };
    FRAME_LEN + version_1 + rest
}

/// What a version-1 state holds beyond its fields: [`Update::Vllm`] (av_core wrote no other
/// update before the map update) and the map fields (bins, prior widths) at their defaults.
/// Every estimator before the map update was one of these, whatever today's default update is.
///
/// # Example
///
/// ```rust
/// use av_core::estimator::Update;
/// use av_core::persist::estimator::version_1_config;
/// use av_core::EstimatorConfig;
///
/// let config = version_1_config(3);
/// assert_eq!(config.update, Update::Vllm);
/// assert_eq!(config.bins, EstimatorConfig::new(3).bins);
/// ```
pub fn version_1_config(num_positions: usize) -> EstimatorConfig {
    EstimatorConfig::new(num_positions).with_update(Update::Vllm)
}

/// The format version [`encode`] writes for `state`: 1 (what av_core wrote before the map
/// update, so that older builds read it) for a `vllm` estimator whose map settings (bins,
/// prior widths) are bit for bit the defaults, which version 1 decodes to; 2 otherwise.
///
/// # Example
///
/// ```rust
/// use av_core::persist::estimator::written_version;
/// use av_core::{AcceptanceEstimator, EstimatorConfig};
///
/// let state = AcceptanceEstimator::new(EstimatorConfig::new(2))?.state();
/// assert_eq!(written_version(&state), 2); // the default: the map update
/// let state = AcceptanceEstimator::new(EstimatorConfig::vllm(2))?.state();
/// assert_eq!(written_version(&state), 1);
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn written_version(state: &EstimatorState) -> u32 {
    let (c, d) = (&state.config, version_1_config(state.config.num_positions));
    let widths = |c: &EstimatorConfig| {
        [
            c.prior_slope_sd,
            c.prior_level_sd,
            c.prior_trend_sd,
            c.prior_spread_sd,
        ]
        .map(f64::to_bits)
    };
    let version_1 = c.update == Update::Vllm
        && state.map.is_none()
        && c.bins == d.bins
        && widths(c) == widths(&d);
    if version_1 {
        FORMAT_VERSION_1
    } else {
        FORMAT_VERSION
    }
}

/// The longest encoded estimator state (`K = 64`, `map` with the most bins): a reader never
/// needs more bytes.
pub const MAX_ENCODED_LEN: usize =
    encoded_len(EstimatorConfig::MAX_POSITIONS, Update::Map, MAX_BINS);

/// Encodes `state`. The last four bytes are the CRC-32 of everything before them.
///
/// # Example
///
/// ```rust
/// use av_core::persist::{crc32, estimator::{encode}};
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
    // 0: manual (`None`), a value no interval can have, so no earlier state means it.
    payload.extend(c.refit_interval.unwrap_or(0).to_le_bytes());
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
    if written_version(state) == FORMAT_VERSION_1 {
        return frame(Kind::Estimator, FORMAT_VERSION_1, &payload);
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

    frame(Kind::Estimator, FORMAT_VERSION, &payload)
}

fn floats_column(payload: &mut Vec<u8>, column: &[f64]) {
    put_f64s(payload, column);
}

/// A length-prefixed `u64` column (the layout of the map state's open-round histograms),
/// refusing a length the data cannot hold before allocating anything.
fn u64_column(r: &mut Reader<'_>, what: &str) -> Result<Vec<u64>> {
    let len = r.u64(what)?;
    if len > (r.bytes.len() / 8) as u64 {
        return Err(Error::state(
            ARGUMENT,
            format!("{what} length {len} exceeds the data"),
        ));
    }
    (0..len).map(|_| r.u64(what)).collect()
}

/// Decodes bytes written by [`encode`]; the state still has to pass
/// [`AcceptanceEstimator::from_state`](crate::AcceptanceEstimator::from_state).
///
/// # Example
///
/// ```rust
/// use av_core::persist::estimator::{decode, encode};
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
    let frame_read = unframe(Kind::Estimator, FORMAT_VERSION_1..=FORMAT_VERSION, bytes)?;
    let (version, payload) = (frame_read.version, frame_read.payload);
    let mut r = Reader { bytes: payload };
    let num_positions = r.u64("num_positions")?;
    if num_positions == 0 || num_positions > EstimatorConfig::MAX_POSITIONS as u64 {
        return Err(Error::state(
            ARGUMENT,
            format!("num_positions {num_positions} out of range"),
        ));
    }
    let k = num_positions as usize;
    // 0 is a manual estimator (`None`), as `encode` writes it.
    let refit_interval = Some(r.u64("refit_interval")?).filter(|&v| v != 0);
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
    // Version 1 is the vllm update; version 2 says which, and carries the map state.
    let mut extension = version_1_config(k);
    let mut map = None;
    if version >= 2 {
        extension.update = match r.u32("update")? {
            0 => Update::Map,
            1 => Update::Vllm,
            other => {
                return Err(Error::state(
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
            return Err(Error::state(
                ARGUMENT,
                format!("map flag {present} is not 0 or 1"),
            ));
        }
        if present == 1 {
            let reference = r.f64s("reference")?;
            let Some((&slope, intercepts)) = reference.split_first() else {
                return Err(Error::state(
                    ARGUMENT,
                    "the reference coefficients are empty",
                ));
            };
            let bits = r.u32("x fraction bits")?;
            if bits != X_FRACTION_BITS {
                return Err(Error::state(
                    ARGUMENT,
                    format!(
                        "histograms use {bits} fraction bits, this build uses {X_FRACTION_BITS}"
                    ),
                ));
            }
            let round = HistogramStats {
                num_positions: k,
                bins: extension.bins,
                count: u64_column(&mut r, "round_stats")?,
                accepted: u64_column(&mut r, "round_stats")?,
                x_sum: u64_column(&mut r, "round_stats")?,
            };
            let memory = HistogramMemory {
                num_positions: k,
                bins: extension.bins,
                count: r.f64s("memory")?,
                accepted: r.f64s("memory")?,
                x_sum: r.f64s("memory")?,
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
        return Err(Error::state(
            ARGUMENT,
            format!("{} unexpected bytes after the last field", r.bytes.len()),
        ));
    }
    let state = EstimatorState {
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
    };
    // One encoding per state: what version 1 holds is written as version 1, so a loaded state
    // re-encodes to its own bytes.
    if version != written_version(&state) {
        return Err(Error::state(
            ARGUMENT,
            format!(
                "a vllm state at the default map settings is format version 1, not {version} \
                 (this build never writes it so)"
            ),
        ));
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::crc32;
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
            for config in [EstimatorConfig::map(k), version_1_config(k)] {
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
        let mut config = version_1_config(3);
        config.refit_interval = Some(4);
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
        // At the default map settings it is written as version 1, as before the map update.
        let bytes = encode(&state);
        assert_eq!(bytes[8..12], FORMAT_VERSION_1.to_le_bytes());
        assert_eq!(decode(&bytes).unwrap(), state);
        // With other map settings it is version 2, and round-trips them.
        let mut other = state.clone();
        other.config.bins = 16;
        other.config.prior_trend_sd = -0.0;
        let extended = encode(&other);
        assert_eq!(extended[8..12], FORMAT_VERSION.to_le_bytes());
        let back = decode(&extended).unwrap();
        assert_eq!(back, other);
        assert_eq!(back.config.prior_trend_sd.to_bits(), (-0.0f64).to_bits());
        // Version 2 minus the extension, framed as version 1, is the version-1 bytes.
        let payload = &extended[20..extended.len() - 4];
        let old = frame(
            Kind::Estimator,
            FORMAT_VERSION_1,
            &payload[..payload.len() - VERSION_2_EXTENSION_LEN],
        );
        assert_eq!(old, bytes);
        // And the default state framed as version 2 is refused: one encoding per state.
        let mut defaults = payload.to_vec();
        let at = defaults.len() - VERSION_2_EXTENSION_LEN + 4;
        defaults[at..at + 8].copy_from_slice(&(state.config.bins as u64).to_le_bytes());
        let at = at + 8 + 2 * 8;
        defaults[at..at + 8].copy_from_slice(&state.config.prior_trend_sd.to_le_bytes());
        let twice = frame(Kind::Estimator, FORMAT_VERSION, &defaults);
        let err = decode(&twice).unwrap_err();
        assert!(err.message.contains("format version 1"), "{err}");
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
