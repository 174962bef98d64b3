//! The estimator's bytes, kind [`Kind::Estimator`] (magic `"AVCORE\0E"`): what
//! [`AcceptanceEstimator::to_bytes`](crate::AcceptanceEstimator::to_bytes) writes and the C
//! ABI saves.
//!
//! | payload version | payload | written by |
//! |---|---|---|
//! | 3 | the [`state_dict`](super::state_dict) tree, [`tree::encode`]d | this build |
//! | 2 | version 1's fields, then the update, bins, prior widths and the map state, by position | builds with the map update |
//! | 1 | config, coefficients, fixed-point round, counters, memory of past rounds, by position (before the memory existed: without `memory`, `drift_z` and the memory) | the first builds |
//!
//! Version 3 is the state's one declaration (serde) in a self-describing binary, so a field
//! added to the state or the configuration needs no new layout; each number has one width, so
//! the length depends on the configuration only (`K`, the update, `bins`, a manual
//! `refit_interval`), never on the values ([`encoded_len`]). Versions 1 and 2 are read, never
//! written: every state an earlier release saved loads bit for bit.
//!
//! Decoding checks magic, version, length and checksum before it reads a field, then validates
//! the state like any other input
//! ([`AcceptanceEstimator::from_state`](crate::AcceptanceEstimator::from_state)); arbitrary
//! bytes give an error, never a panic.

use super::frame::DATA;
use super::tree::{self, Value};
use super::{frame, state_dict, unframe, Kind, Reader};
use crate::error::{Error, ErrorKind, Result};
use crate::estimator::{
    HistogramMemory, HistogramStats, MapState, Memory, PositionSums, Reference, RoundStats,
    UpdateState, VllmState, FRACTION_BITS, MAX_BINS, X_FRACTION_BITS,
};
use crate::{AcceptanceEstimator, EstimatorConfig, EstimatorState, Update};

/// First bytes of an encoded estimator state.
pub const MAGIC: &[u8; 8] = &Kind::Estimator.magic();
/// The version this build writes; it reads it and every earlier one.
pub const FORMAT_VERSION: u32 = 3;
/// The first version, which this build still reads.
pub const FORMAT_VERSION_1: u32 = 1;

/// A bound on any estimator state's length, of this build (`K = 64`, `map` with the most
/// bins: 78 bytes per bin and position, the rest within 32 KiB) or an earlier one: a reader
/// never needs more bytes.
pub const MAX_ENCODED_LEN: usize = 78 * EstimatorConfig::MAX_POSITIONS * MAX_BINS + 32 * 1024;

/// Encodes `state`. The last four bytes are the CRC-32 of everything before them.
///
/// # Example
///
/// ```rust
/// use av_core::persist::{crc32, estimator::{encode, FORMAT_VERSION, MAGIC}};
/// use av_core::{AcceptanceEstimator, EstimatorConfig};
///
/// let estimator = AcceptanceEstimator::new(EstimatorConfig::new(4))?;
/// let bytes = encode(&estimator.state());
/// assert_eq!((&bytes[..8], &bytes[8..12]), (&MAGIC[..], &FORMAT_VERSION.to_le_bytes()[..]));
/// let (body, checksum) = bytes.split_at(bytes.len() - 4);
/// assert_eq!(checksum, crc32(body).to_le_bytes());
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn encode(state: &EstimatorState) -> Vec<u8> {
    let mut payload = Vec::new();
    tree::encode(&state_dict::encode(state), &mut payload);
    frame(Kind::Estimator, FORMAT_VERSION, &payload)
}

/// The length of every encoded state of an estimator with `config` (it depends on nothing
/// else); an invalid `config` is refused.
///
/// # Example
///
/// ```rust
/// use av_core::persist::estimator::encoded_len;
/// use av_core::{AcceptanceEstimator, EstimatorConfig};
///
/// let mut config = EstimatorConfig::map(4);
/// let estimator = AcceptanceEstimator::new(config.clone())?;
/// assert_eq!(estimator.to_bytes().len(), encoded_len(&config)?);
/// config.bins = 16; // a map state's length depends on its bins
/// assert!(encoded_len(&config)? < estimator.to_bytes().len());
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn encoded_len(config: &EstimatorConfig) -> Result<usize> {
    Ok(AcceptanceEstimator::new(config.clone())?.to_bytes().len())
}

/// Decodes bytes written by [`encode`] (or by an earlier release); the state still has to pass
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
    let read = unframe(Kind::Estimator, FORMAT_VERSION_1..=FORMAT_VERSION, bytes)?;
    if read.version == FORMAT_VERSION {
        let tree: Value = tree::decode(read.payload)?;
        return state_dict::decode(&tree, DATA, ErrorKind::State);
    }
    let mut r = Reader {
        bytes: read.payload,
    };
    let state = decode_by_position(&mut r, read.version)?;
    r.finish()?;
    Ok(state)
}

/// A payload of version 1 or 2 (module docs).
fn decode_by_position(r: &mut Reader<'_>, version: u32) -> Result<EstimatorState> {
    let k = r.u64("num_positions")?;
    if k == 0 || k > EstimatorConfig::MAX_POSITIONS as u64 {
        return Err(Error::state(
            DATA,
            format!("num_positions {k} out of range"),
        ));
    }
    let k = k as usize;
    // Version 1 written before the memory of past rounds existed is shorter than the later
    // layout: 96 bytes per position and 100 more after K, against 128 and 148 (anything else
    // fails as the layout it is read as).
    let before_memory = version == 1 && (r.bytes.len() as u64) < 148 + 128 * k as u64;
    let mut c = EstimatorConfig::version_1(k);
    // 0 is a manual estimator (`None`), a value no interval can have.
    c.refit_interval = Some(r.u64("refit_interval")?).filter(|&v| v != 0);
    let mut settings = [
        &mut c.damping,
        &mut c.l2,
        &mut c.init_slope,
        &mut c.init_intercept,
        &mut c.max_log_odds,
        &mut c.max_step,
        &mut c.max_slope,
        &mut c.max_intercept,
        &mut c.memory,
        &mut c.drift_z,
    ];
    let held = if before_memory { 8 } else { 10 };
    for setting in settings.iter_mut().take(held) {
        **setting = r.f64("config")?;
    }
    if before_memory {
        c.memory = 0.0; // memoryless, as it was
    }
    let slope = r.f64("slope")?;
    let intercepts = floats(r, k, "intercepts")?;
    check_bits(r.u32("fraction_bits")?, FRACTION_BITS)?;
    let mut round = RoundStats::new(k);
    for p in &mut round.positions {
        let mut sums = [0i128; 5];
        for sum in &mut sums {
            *sum = r.i128("round_stats")?;
        }
        let [a, b, c, g0, g1] = sums;
        *p = PositionSums {
            a,
            b,
            c,
            g0,
            g1,
            n: r.u64("round_stats")?,
        };
    }
    let steps_since_refit = r.u64("steps_since_refit")?;
    let num_refits = r.u64("num_refits")?;
    let mut memory = Memory::new(k);
    if !before_memory {
        memory.resets = r.u64("memory")?;
        (memory.a, memory.total) = (r.f64("memory")?, r.f64("memory")?);
        memory.b = floats(r, k, "memory")?;
        memory.c = floats(r, k, "memory")?;
        memory.rhs = floats(r, k + 1, "memory")?;
        memory.counts = floats(r, k, "memory")?;
    }
    let mut update: UpdateState = VllmState { round, memory }.into();
    if version == 2 {
        // Format 2 numbers the updates: 0 map, 1 vllm.
        let code = r.u32("update")?;
        let name = ["map", "vllm"]
            .get(code as usize)
            .copied()
            .unwrap_or_default();
        c.update = name.parse::<Update>().map_err(|_| {
            let message = format!("update code {code} is not 0 (map) or 1 (vllm)");
            Error::state(DATA, message)
        })?;
        c.bins = usize::try_from(r.u64("bins")?).unwrap_or(usize::MAX);
        c.prior_slope_sd = r.f64("prior_slope_sd")?;
        c.prior_level_sd = r.f64("prior_level_sd")?;
        c.prior_trend_sd = r.f64("prior_trend_sd")?;
        c.prior_spread_sd = r.f64("prior_spread_sd")?;
        match r.u8("map")? {
            0 => {}
            1 => update = decode_map(r, k, c.bins)?.into(),
            other => {
                return Err(Error::state(
                    DATA,
                    format!("map flag {other} is not 0 or 1"),
                ))
            }
        }
    }
    Ok(EstimatorState {
        config: c,
        slope,
        intercepts,
        steps_since_refit,
        num_refits,
        update,
    })
}

/// The map state of a version-2 payload.
fn decode_map(r: &mut Reader<'_>, k: usize, bins: usize) -> Result<MapState> {
    let reference = r.f64s("reference")?;
    let Some((&slope, intercepts)) = reference.split_first() else {
        return Err(Error::state(DATA, "the reference coefficients are empty"));
    };
    check_bits(r.u32("x fraction bits")?, X_FRACTION_BITS)?;
    let (count, accepted) = (r.u64s("round_stats")?, r.u64s("round_stats")?);
    let x_sum = r.u64s("round_stats")?;
    let round = HistogramStats {
        num_positions: k,
        bins,
        count,
        accepted,
        x_sum,
    };
    let memory = HistogramMemory {
        count: r.f64s("memory")?,
        accepted: r.f64s("memory")?,
        x_sum: r.f64s("memory")?,
        resets: 0,
    };
    let fitted_labels = r.u64("fitted_labels")?;
    Ok(MapState {
        round,
        reference: Reference {
            slope,
            intercepts: intercepts.to_vec(),
        },
        fitted_labels,
        memory: HistogramMemory {
            resets: r.u64("memory")?,
            ..memory
        },
    })
}

/// `n` floats, not length-prefixed.
fn floats(r: &mut Reader<'_>, n: usize, what: &str) -> Result<Vec<f64>> {
    (0..n).map(|_| r.f64(what)).collect()
}

/// Refuses fixed-point statistics of another precision than this build's.
fn check_bits(bits: u32, ours: u32) -> Result<()> {
    if bits == ours {
        return Ok(());
    }
    let message = format!("statistics use {bits} fraction bits, this build uses {ours}");
    Err(Error::state(DATA, message))
}

#[cfg(test)]
mod tests;
