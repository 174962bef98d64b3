//! The estimator's bytes, kind [`Kind::Estimator`] (magic `"AVCORE\0E"`): what
//! [`AcceptanceEstimator::to_bytes`](crate::AcceptanceEstimator::to_bytes) writes and the C
//! ABI saves.
//!
//! | payload version | payload | written by |
//! |---|---|---|
//! | 4 | the configuration ([`EstimatorConfig`]) by field name, as a value tree in a self-describing binary (`value_tree.rs`); then, in [postcard]'s wire format, `slope`, `intercepts`, `steps_since_refit`, `num_refits` and the update's part ([`VllmState`] or [`MapState`], as the configuration's `update` names it) | this build |
//! | 3 | the same fields in postcard, the configuration's by position as they were declared then | builds from postcard to version 4 |
//! | 3 | the `state_dict` tree in the self-describing binary, read when a payload is not postcard's layout and starts as the tree's | the builds between the state's serde declaration and postcard |
//! | 2 | version 1's fields, then the update, bins, prior widths and the map state, by position | builds with the map update |
//! | 1 | config, coefficients, fixed-point round, counters, memory of past rounds, by position (before the memory existed: without `memory`, `drift_z` and the memory) | the first builds |
//!
//! Everything in version 4 follows the types' declaration (serde). The configuration is read
//! by name, so a configuration field added with a serde default (the behaviour from before it
//! existed) reads from earlier bytes as that default and needs no new version; the statistics
//! after it are read by position, so a field added to them needs one. Counters and integer
//! columns are written at a fixed width ([`fixed`](super::fixed)), so the length depends on
//! the configuration only (`K`, the update, `bins`, a manual `refit_interval`), never on the
//! values ([`encoded_len`]), and each state has one encoding: bytes that decode to a state but
//! are not its encoding (an overlong varint, a configuration's field out of order or of another
//! type) are refused. Versions 1 to 3 are read, never written: every state an earlier release
//! saved loads bit for bit.
//!
//! Decoding checks magic, version, length and checksum before it reads a field, then validates
//! the state like any other input
//! ([`AcceptanceEstimator::from_state`](crate::AcceptanceEstimator::from_state)); arbitrary
//! bytes give an error, never a panic.
//!
//! [postcard]: https://postcard.jamesmunns.com/wire-format

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::frame::{broken, frame_with, DATA};
use super::tree::{from_value, to_value, Value};
use super::{unframe, Kind, Reader};
use crate::error::{ErrorKind, Result};
use crate::estimator::{
    HistogramMemory, HistogramStats, MapState, Memory, Reference, RoundStats, UpdateState,
    VllmState, FRACTION_BITS, MAX_BINS, X_FRACTION_BITS,
};
use crate::{AcceptanceEstimator, EstimatorConfig, EstimatorState, Update};

/// First bytes of an encoded estimator state.
pub const MAGIC: &[u8; 8] = &Kind::Estimator.magic();
/// The version this build writes; it reads it and every earlier one.
pub const FORMAT_VERSION: u32 = 4;
/// The version whose configuration is written by position, read only.
pub const FORMAT_VERSION_3: u32 = 3;
/// The first version, which this build still reads.
pub const FORMAT_VERSION_1: u32 = 1;

/// A bound on any estimator state's length, of this build or an earlier one (`K = 64`, `map`
/// with the most bins: 48 bytes per bin and position in postcard's layout, 78 in the value
/// tree's, the rest within 32 KiB): a reader never needs more bytes.
pub const MAX_ENCODED_LEN: usize = 78 * EstimatorConfig::MAX_POSITIONS * MAX_BINS + 32 * 1024;

/// The fields between the configuration and the update's part (versions 3 and 4).
#[derive(Serialize, Deserialize)]
struct Coefficients<'a> {
    slope: f64,
    intercepts: Cow<'a, [f64]>,
    #[serde(with = "super::fixed")]
    steps_since_refit: u64,
    #[serde(with = "super::fixed")]
    num_refits: u64,
}

/// Version 3's configuration: [`EstimatorConfig`]'s fields as they were declared when that
/// version was written, in postcard by position. A field declared since takes its serde
/// default.
#[derive(Serialize, Deserialize)]
struct ConfigV3 {
    num_positions: usize,
    refit_interval: Option<u64>,
    damping: f64,
    l2: f64,
    init_slope: f64,
    init_intercept: f64,
    max_log_odds: f64,
    max_step: f64,
    max_slope: f64,
    max_intercept: f64,
    memory: f64,
    drift_z: f64,
    update: Update,
    bins: usize,
    prior_slope_sd: f64,
    prior_level_sd: f64,
    prior_trend_sd: f64,
    prior_spread_sd: f64,
}

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
    let coefficients = Coefficients {
        slope: state.slope,
        intercepts: Cow::Borrowed(&state.intercepts),
        steps_since_refit: state.steps_since_refit,
        num_refits: state.num_refits,
    };
    // Room for the update's columns (48 bytes per map bin), which dominate the length.
    let bins = state.update.as_map().map_or(0, |map| map.round.count.len());
    frame_with(Kind::Estimator, FORMAT_VERSION, 2048 + 48 * bins, |out| {
        payload(&to_value(&state.config), &coefficients, &state.update, out)
    })
}

/// Version 4's payload after `out`: the configuration's tree, then the rest in postcard.
fn payload(
    config: &Value,
    coefficients: &Coefficients<'_>,
    update: &UpdateState,
    mut out: Vec<u8>,
) -> Vec<u8> {
    value_tree::write(config, &mut out);
    // Writing to a vector fails only for a sequence of unknown length, which no field is.
    let out = postcard::to_extend(coefficients, out).expect("the state's fields serialize");
    postcard::to_extend(update, out).expect("the update's part serializes")
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
    let mut r = Reader {
        bytes: read.payload,
    };
    match read.version {
        FORMAT_VERSION => decode_declared(&mut r),
        // A payload postcard's layout refuses may be the value tree's version 3.
        FORMAT_VERSION_3 => {
            decode_v3(&mut r).or_else(|err| match value_tree::holds(read.payload) {
                true => value_tree::decode(read.payload),
                false => Err(err),
            })
        }
        version => {
            let state = decode_by_position(&mut r, version)?;
            r.finish()?;
            Ok(state)
        }
    }
}

/// A payload of version 4 (module docs), which must be the state's one encoding.
fn decode_declared(r: &mut Reader<'_>) -> Result<EstimatorState> {
    let all = r.bytes;
    let tree = value_tree::read(r, 0)?;
    let config: EstimatorConfig = from_value(&tree, DATA, ErrorKind::State)?;
    let coefficients: Coefficients<'_> = take(r)?;
    let update = take_update(r, config.update)?;
    r.finish()?;
    // The fields it holds as this build writes them, in its order (a field it lacks took its
    // default; one out of order is left out, so the comparison below refuses it).
    let mut written = match to_value(&config) {
        Value::Dict(entries) => entries,
        _ => Vec::new(), // a struct's tree is a dict
    };
    let held: &[(String, Value)] = match &tree {
        Value::Dict(entries) => entries,
        _ => &[],
    };
    let mut held = held.iter().map(|(key, _)| key).peekable();
    written.retain(|(key, _)| held.next_if(|held| *held == key).is_some());
    if payload(&Value::Dict(written), &coefficients, &update, Vec::new()) != all {
        return Err(not_its_encoding());
    }
    Ok(state(config, coefficients, update))
}

/// A payload of version 3 in postcard (module docs), which must be the state's one encoding.
fn decode_v3(r: &mut Reader<'_>) -> Result<EstimatorState> {
    let all = r.bytes;
    let config: ConfigV3 = take(r)?;
    let coefficients: Coefficients<'_> = take(r)?;
    let update = take_update(r, config.update)?;
    r.finish()?;
    let again = postcard::to_allocvec(&(&config, &coefficients, &update));
    if again.ok().as_deref() != Some(all) {
        return Err(not_its_encoding());
    }
    let config = from_value(&to_value(&config), DATA, ErrorKind::State)?;
    Ok(state(config, coefficients, update))
}

/// The update's part named by `update`, from the front of what `r` has left.
fn take_update(r: &mut Reader<'_>, update: Update) -> Result<UpdateState> {
    Ok(match update {
        Update::Vllm => UpdateState::Vllm(take(r)?),
        Update::Map => UpdateState::Map(take(r)?),
    })
}

/// The state of a version 3 or 4 payload's parts.
fn state(
    config: EstimatorConfig,
    coefficients: Coefficients<'_>,
    update: UpdateState,
) -> EstimatorState {
    EstimatorState {
        config,
        slope: coefficients.slope,
        intercepts: coefficients.intercepts.into_owned(),
        steps_since_refit: coefficients.steps_since_refit,
        num_refits: coefficients.num_refits,
        update,
    }
}

/// The error for bytes that decode to a state but are not its encoding.
fn not_its_encoding() -> crate::Error {
    broken("not the state's encoding (a length or tag written in more bytes than it takes, or a field out of order)")
}

/// A `T` from the front of what `r` has left.
fn take<T: DeserializeOwned>(r: &mut Reader<'_>) -> Result<T> {
    let (value, rest) = postcard::take_from_bytes(r.bytes).map_err(|e| broken(e.to_string()))?;
    r.bytes = rest;
    Ok(value)
}

/// A payload of version 1 or 2 (module docs).
fn decode_by_position(r: &mut Reader<'_>, version: u32) -> Result<EstimatorState> {
    let k = r.u64("num_positions")?;
    if k == 0 || k > EstimatorConfig::MAX_POSITIONS as u64 {
        return Err(broken(format!("num_positions {k} out of range")));
    }
    let k = k as usize;
    // Version 1 written before the memory of past rounds existed is shorter than the later
    // layout: 96 bytes per position and 100 more after K, against 128 and 148 (anything else
    // fails as the layout it is read as).
    let before_memory = version == 1 && (r.bytes.len() as u64) < 148 + 128 * k as u64;
    let mut c = EstimatorConfig::version_1(k);
    // 0 is a manual estimator (`None`), a value no interval can have.
    c.refit_interval = Some(r.u64("refit_interval")?).filter(|&v| v != 0);
    let settings = [
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
    for setting in settings
        .into_iter()
        .take(if before_memory { 8 } else { 10 })
    {
        *setting = r.f64("config")?;
    }
    if before_memory {
        c.memory = 0.0; // memoryless, as it was
    }
    let slope = r.f64("slope")?;
    let intercepts = floats(r, k, "intercepts")?;
    check_bits(r.u32("fraction_bits")?, FRACTION_BITS)?;
    let mut round = RoundStats::new(k);
    for p in &mut round.positions {
        let [a, b, c, g0, g1] = [(); 5].map(|()| r.i128("round_stats"));
        let n = r.u64("round_stats")?;
        (p.a, p.b, p.c, p.g0, p.g1, p.n) = (a?, b?, c?, g0?, g1?, n);
    }
    let (steps_since_refit, num_refits) = (r.u64("steps_since_refit")?, r.u64("num_refits")?);
    let mut memory = Memory::new(k);
    if !before_memory {
        memory.resets = r.u64("memory")?;
        (memory.a, memory.total) = (r.f64("memory")?, r.f64("memory")?);
        memory.b = floats(r, k, "memory")?;
        memory.c = floats(r, k, "memory")?;
        memory.rhs = floats(r, k + 1, "memory")?;
        memory.counts = floats(r, k, "memory")?;
    }
    let mut update = UpdateState::Vllm(VllmState { round, memory });
    if version == 2 {
        // Format 2 numbers the updates: 0 map, 1 vllm.
        c.update = match r.u32("update")? {
            0 => Update::Map,
            1 => Update::Vllm,
            code => {
                return Err(broken(format!(
                    "update code {code} is not 0 (map) or 1 (vllm)"
                )))
            }
        };
        c.bins = usize::try_from(r.u64("bins")?).unwrap_or(usize::MAX);
        c.prior_slope_sd = r.f64("prior_slope_sd")?;
        c.prior_level_sd = r.f64("prior_level_sd")?;
        c.prior_trend_sd = r.f64("prior_trend_sd")?;
        c.prior_spread_sd = r.f64("prior_spread_sd")?;
        match r.u8("map")? {
            0 => {}
            1 => update = UpdateState::Map(decode_map(r, k, c.bins)?),
            other => return Err(broken(format!("map flag {other} is not 0 or 1"))),
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
        return Err(broken("the reference coefficients are empty"));
    };
    check_bits(r.u32("x fraction bits")?, X_FRACTION_BITS)?;
    let [count, accepted, x_sum] = [(); 3].map(|()| r.u64s("round_stats"));
    let round = HistogramStats {
        num_positions: k,
        bins,
        count: count?,
        accepted: accepted?,
        x_sum: x_sum?,
    };
    let [count, accepted, x_sum] = [(); 3].map(|()| r.f64s("memory"));
    let fitted_labels = r.u64("fitted_labels")?;
    let memory = HistogramMemory {
        count: count?,
        accepted: accepted?,
        x_sum: x_sum?,
        resets: r.u64("memory")?,
    };
    let intercepts = intercepts.to_vec();
    Ok(MapState {
        round,
        reference: Reference { slope, intercepts },
        fitted_labels,
        memory,
    })
}

/// `n` floats, not length-prefixed.
fn floats(r: &mut Reader<'_>, n: usize, what: &str) -> Result<Vec<f64>> {
    (0..n).map(|_| r.f64(what)).collect()
}

/// Refuses fixed-point statistics of another precision than this build's.
fn check_bits(bits: u32, ours: u32) -> Result<()> {
    match bits == ours {
        true => Ok(()),
        false => Err(broken(format!(
            "statistics use {bits} fraction bits, this build uses {ours}"
        ))),
    }
}

mod value_tree;

#[cfg(test)]
mod tests;
