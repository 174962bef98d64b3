//! The estimator's `state_dict`: [`EstimatorState`] as a [`tree`](super::tree) of plain values
//! (Python: `AcceptanceEstimator.state_dict()` / `from_state_dict`), every field from its
//! type's declaration (serde), and the configuration's tree that the bindings show
//! (`AcceptanceEstimator.config`, `ESTIMATOR_DEFAULTS`, `EstimatorConfig.from_dict`).
//!
//! Format `"av_core.AcceptanceEstimator"`, keys in this order: `format`, `format_version`,
//! `config` ([`EstimatorConfig`]'s fields), `slope`, `intercepts`, the update's open round
//! `round_stats`, `steps_since_refit`, `num_refits`, then the rest of the update's part
//! (`VllmState`: `memory_state`; `MapState`:
//! `reference`, `fitted_labels`, `memory_state`).
//!
//! | `format_version` | written for | `config` holds |
//! |---|---|---|
//! | 1 | `vllm` at the default map settings ([`EstimatorConfig::is_version_1`]), as before the map update | the first [`EstimatorConfig::VERSION_1_FIELDS`] fields |
//! | 2 | every other state | every field |
//!
//! A state of version 1 reads as [`EstimatorConfig::version_1`] with its fields; one written
//! before the memory of past rounds existed (no `memory`, `drift_z` or `memory_state`) reads as
//! memoryless, which it was. Reading refuses a key no field holds, anywhere, naming its path
//! (`state: ["round_stats"]["n"] is not a field`), then the state as a whole is checked by
//! [`AcceptanceEstimator::from_state`].
//!
//! # Example
//!
//! ```rust
//! use av_core::persist::state_dict;
//! use av_core::persist::tree::Value;
//! use av_core::{AcceptanceEstimator, EstimatorConfig, ErrorKind};
//!
//! let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
//! let tree = state_dict::encode(&estimator.state());
//! assert_eq!(tree.get("format_version"), Some(&Value::Int(2))); // the map update's
//! assert_eq!(state_dict::decode(&tree, "state", ErrorKind::Value)?, estimator.state());
//! # Ok::<(), av_core::Error>(())
//! ```

use serde::{Deserialize, Serialize};

use super::tree::{from_value, from_value_at, to_value, Value};
use crate::error::{Error, ErrorKind, Result};
use crate::estimator::Memory;
use crate::{AcceptanceEstimator, EstimatorConfig, EstimatorState, RefitReport, UpdateState};

/// The `format` of a state.
pub const FORMAT: &str = "av_core.AcceptanceEstimator";
/// The newest `format_version`, written for every state version 1 cannot hold.
pub const VERSION: u32 = 2;

/// What a state's first keys say about how to read it.
#[derive(Deserialize)]
struct Header {
    format: String,
    format_version: u32,
}

/// The fields every state holds besides its configuration and its update's part.
#[derive(Default, Serialize, Deserialize)]
struct Shared {
    slope: f64,
    intercepts: Vec<f64>,
    steps_since_refit: u64,
    num_refits: u64,
}

/// The entries of a tree that is a dict (of a struct's tree: always one).
fn entries(tree: Value) -> Vec<(String, Value)> {
    match tree {
        Value::Dict(entries) => entries,
        _ => Vec::new(),
    }
}

/// `state` as the format's tree (module docs).
pub fn encode(state: &EstimatorState) -> Value {
    let v1 = state.config.is_version_1();
    let version = if v1 { 1 } else { VERSION };
    let mut config = entries(to_value(&state.config));
    if v1 {
        config.truncate(EstimatorConfig::VERSION_1_FIELDS);
    }
    let mut shared = entries(to_value(&Shared {
        slope: state.slope,
        intercepts: state.intercepts.clone(),
        steps_since_refit: state.steps_since_refit,
        num_refits: state.num_refits,
    }));
    let counters = shared.split_off(2);
    let mut update = entries(to_value(&state.update));
    let after_round = update.split_off(update.len().min(1));
    let head = [
        ("format", Value::Str(FORMAT.into())),
        ("format_version", Value::Int(version.into())),
        ("config", Value::Dict(config)),
    ];
    let head = head.map(|(key, value)| (key.to_string(), value));
    let all = head.into_iter().chain(shared).chain(update).chain(counters);
    Value::Dict(all.chain(after_round).collect())
}

/// The state from the format's tree (of version 1 or 2), every field checked, errors of `kind`
/// (or type errors) naming `argument` and the path; the state as a whole is checked by
/// [`AcceptanceEstimator::from_state`].
pub fn decode(tree: &Value, argument: &'static str, kind: ErrorKind) -> Result<EstimatorState> {
    let Value::Dict(all) = tree else {
        let message = format!(
            "expected a dict from state_dict(), got {}",
            tree.type_name()
        );
        return Err(Error::type_error(argument, message));
    };
    let shared_keys = entries(to_value(&Shared::default()))
        .into_iter()
        .map(|(key, _)| key);
    let shared_keys: Vec<String> = shared_keys.collect();
    let is_shared = |key: &str| shared_keys.iter().any(|k| k == key);
    let pick = |keep: &dyn Fn(&str) -> bool| -> Vec<(String, Value)> {
        all.iter().filter(|(k, _)| keep(k)).cloned().collect()
    };
    let header = Value::Dict(pick(&|k| k == "format" || k == "format_version"));
    let header: Header = from_value(&header, argument, kind)?;
    if header.format != FORMAT {
        let message = format!("format is {:?}, expected {FORMAT:?}", header.format);
        return Err(Error::new(kind, argument, message));
    }
    let version = header.format_version;
    if !(1..=VERSION).contains(&version) {
        let message =
            format!("format_version {version} is not supported (this build reads 1 to {VERSION})");
        return Err(Error::new(kind, argument, message));
    }
    let Some(mut config_tree) = tree.get("config").cloned() else {
        return Err(Error::new(kind, argument, "[\"config\"] is missing"));
    };
    // The update's part: whatever is not the header, the configuration or the shared fields.
    let header_keys = ["format", "format_version", "config"];
    let mut update_part = pick(&|k| !header_keys.contains(&k) && !is_shared(k));
    let before_memory = version == 1 && version_1_defaults(&mut config_tree, argument, kind)?;
    let config: EstimatorConfig = from_value_at(&config_tree, &["config"], argument, kind)?;
    if before_memory && tree.get("memory_state").is_none() {
        // An empty memory; a count of positions no estimator has is refused with the state.
        let k = config.num_positions.min(EstimatorConfig::MAX_POSITIONS);
        update_part.push(("memory_state".into(), to_value(&Memory::new(k))));
    }
    let shared: Shared = from_value(&Value::Dict(pick(&is_shared)), argument, kind)?;
    let update = UpdateState::from_tree(config.update, &Value::Dict(update_part), argument, kind)?;
    Ok(EstimatorState {
        config,
        slope: shared.slope,
        intercepts: shared.intercepts,
        steps_since_refit: shared.steps_since_refit,
        num_refits: shared.num_refits,
        update,
    })
}

/// Completes the configuration of a version-1 state with what version 1 means
/// ([`EstimatorConfig::version_1`]); a field version 1 does not hold is refused. Returns whether
/// the state predates the memory of past rounds (no `memory`, no `drift_z`): then it is
/// memoryless, as it was.
fn version_1_defaults(config: &mut Value, argument: &'static str, kind: ErrorKind) -> Result<bool> {
    let Value::Dict(fields) = config else {
        return Ok(false); // the configuration's reader names the wrong type
    };
    let mut defaults = entries(to_value(&EstimatorConfig::version_1(1)));
    let extension = defaults.split_off(EstimatorConfig::VERSION_1_FIELDS);
    let is_extension = |key: &String| extension.iter().any(|(e, _)| e == key);
    if let Some((key, _)) = fields.iter().find(|(k, _)| is_extension(k)) {
        let message = format!("[\"config\"][{key:?}] is not a field of format version 1");
        return Err(Error::new(kind, argument, message));
    }
    let before_memory = !fields.iter().any(|(k, _)| k == "memory" || k == "drift_z");
    if before_memory {
        let drift_z = EstimatorConfig::DEFAULT_DRIFT_Z;
        fields.push(("memory".into(), Value::Float(0.0)));
        fields.push(("drift_z".into(), Value::Float(drift_z)));
    }
    fields.extend(extension);
    Ok(before_memory)
}

/// The configuration a dict of its fields describes, as [`config`] writes it (errors name
/// `argument` and the field): `num_positions` is required, a field left out takes
/// [`EstimatorConfig::new`]'s value (the constructor's default), a key that names no field is
/// refused, and the result is validated as [`AcceptanceEstimator::new`] validates it.
pub fn decode_config(tree: &Value, argument: &'static str) -> Result<EstimatorConfig> {
    let Value::Dict(given) = tree else {
        let got = tree.type_name();
        let message = format!("expected a dict of EstimatorConfig fields, got {got}");
        return Err(Error::type_error(argument, message));
    };
    let defaults = entries(to_value(&EstimatorConfig::new(1)))
        .into_iter()
        .skip(1);
    let left_out = defaults.filter(|(key, _)| given.iter().all(|(k, _)| k != key));
    let fields = given.iter().cloned().chain(left_out).collect();
    let config: EstimatorConfig = from_value(&Value::Dict(fields), argument, ErrorKind::Value)?;
    config.validate()?;
    Ok(config)
}

/// Every field of `config`, by name, in the declaration's order.
pub fn config(config: &EstimatorConfig) -> Value {
    to_value(config)
}

/// The constructor's options of format version 1 and the update (every field but
/// `num_positions` and the map update's settings): what the bindings export as the defaults
/// (`ESTIMATOR_DEFAULTS`) and presets (`VLLM_ESTIMATOR`), so that `AcceptanceEstimator(k,
/// **VLLM_ESTIMATOR)` is vLLM's estimator whatever the default update.
pub fn options(config: &EstimatorConfig) -> Value {
    let fields = entries(to_value(config));
    Value::Dict(fields[1..=EstimatorConfig::VERSION_1_FIELDS].to_vec())
}

/// What a refit report adds to the round it consumed.
#[derive(Serialize)]
struct Step<'a> {
    slope_step: f64,
    intercept_steps: &'a [f64],
    drift_statistic: f64,
    iterations: u32,
    end_round: bool,
}

/// What `refit(report=True)` returns for `outcome`, a refit of `estimator` (`end_round`: whether
/// it ended the round): the round the refit consumed in its state's shape (nothing for a fit
/// within a map round), `slope_step`, `intercept_steps`, `drift_statistic`, `iterations` and
/// `end_round`.
pub fn refit_report(
    estimator: &AcceptanceEstimator,
    outcome: &RefitReport,
    end_round: bool,
) -> Value {
    let mut report = outcome.update.round_tree().map(entries).unwrap_or_default();
    report.extend(entries(to_value(&Step {
        slope_step: outcome.step.slope,
        intercept_steps: &outcome.step.intercepts,
        drift_statistic: outcome.update.drift_statistic(estimator),
        iterations: outcome.update.iterations(),
        end_round,
    })));
    Value::Dict(report)
}

#[cfg(test)]
mod tests;
