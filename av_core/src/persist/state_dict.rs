//! The `state_dict` format of the estimator: [`EstimatorState`] as a [`tree`](super::tree) of
//! plain values (Python: `AcceptanceEstimator.state_dict()` / `from_state_dict`), and the
//! named fields of [`EstimatorConfig`] that the bindings show (`AcceptanceEstimator.config`,
//! its attributes, `ESTIMATOR_DEFAULTS`).
//!
//! Format `"av_core.AcceptanceEstimator"`, keys in this order:
//!
//! | key | version 1 (`vllm` at the default map settings) | version 2 (every other state) |
//! |---|---|---|
//! | `format`, `format_version` | `"av_core.AcceptanceEstimator"`, 1 | the same, 2 |
//! | `config` | [`CONFIG_FIELDS`] up to `drift_z` | every field of [`CONFIG_FIELDS`] |
//! | `slope`, `intercepts` | float, K floats | the same |
//! | `round_stats` | [`round_stats`]: IRLS moments | `vllm`: moments; `map`: [`histogram`] |
//! | `steps_since_refit`, `num_refits` | ints | the same |
//! | `reference`, `fitted_labels` | — | `map` only: `{slope, intercepts}`, int |
//! | `memory_state` | `a b c rhs total counts resets` | `vllm`: same; `map`: `count accepted x_sum resets` |
//!
//! Statistics are exact fixed-point integers in units of `2**-fraction_bits`. A vllm estimator
//! at the default map settings keeps the version-1 layout, as its bytes do
//! ([`crate::persist::estimator::written_version`]); version 1 reads as a `vllm` estimator with the map
//! fields' defaults. A manual estimator (`refit_interval` `None`) is written in either layout
//! with `refit_interval: None`.
//!
//! Decoding validates every field and names it (`state: ["config"]["l2"] must be a number, got
//! str ("x")`), then the state as a whole ([`AcceptanceEstimator::from_state`]).
//!
//! [`AcceptanceEstimator::from_state`]: crate::AcceptanceEstimator::from_state
//!
//! # Example
//!
//! ```rust
//! use av_core::persist::state_dict;
//! use av_core::persist::tree::Value;
//! use av_core::{AcceptanceEstimator, EstimatorConfig};
//!
//! let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
//! let tree = Value::Map(state_dict::encode(&estimator.state()));
//! let Value::Map(map) = &tree else { unreachable!() };
//! assert_eq!(map.get("format_version"), Some(&Value::Int(2))); // the map update's
//! assert_eq!(state_dict::decode(&tree)?, estimator.state());
//! # Ok::<(), av_core::Error>(())
//! ```

use super::estimator::{version_1_config, written_version, FORMAT_VERSION_1};
use super::tree::{Fields, Map, Value, I128, U64};
use crate::error::{Error, Result};
use crate::estimator::{
    HistogramMemory, HistogramStats, Memory, PositionSums, RoundStats, FRACTION_BITS,
    X_FRACTION_BITS,
};
use crate::{AcceptanceEstimator, EstimatorConfig, EstimatorState, MapState, RefitReport, Update};

/// The `format` of a state.
pub const FORMAT: &str = "av_core.AcceptanceEstimator";
/// The newest `format_version`, written for every state version 1 cannot hold.
pub const VERSION: u32 = 2;
/// The argument decoding errors name.
const ARGUMENT: &str = "state";

/// One named field of [`EstimatorConfig`]: its keyword in the constructor and key in
/// `state_dict()["config"]`, what it means, and how it reads and writes as a tree value.
pub struct ConfigField {
    /// The keyword (`"refit_interval"`).
    pub name: &'static str,
    /// One line on what it is (the bindings' docstring).
    pub doc: &'static str,
    get: fn(&EstimatorConfig) -> Value,
    set: fn(&mut EstimatorConfig, &Fields<'_>, &str) -> Result<()>,
}

impl ConfigField {
    /// The field's value in `config`.
    pub fn get(&self, config: &EstimatorConfig) -> Value {
        (self.get)(config)
    }

    /// Reads the field from `fields` into `config` (errors name the field's path).
    pub fn set(&self, config: &mut EstimatorConfig, fields: &Fields<'_>) -> Result<()> {
        (self.set)(config, fields, self.name)
    }
}

impl std::fmt::Debug for ConfigField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigField")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

macro_rules! float_field {
    ($name:ident, $doc:expr) => {
        ConfigField {
            name: stringify!($name),
            doc: $doc,
            get: |c| Value::Float(c.$name),
            set: |c, f, key| {
                c.$name = f.float(key)?;
                Ok(())
            },
        }
    };
}

/// Every field of [`EstimatorConfig`], in the order of the constructor's keywords and of
/// `state_dict()["config"]`: `num_positions`, the options of format version 1 (up to
/// `drift_z`), then the update's (`update`, `bins`, the prior widths).
pub const CONFIG_FIELDS: [ConfigField; 18] = [
    ConfigField {
        name: "num_positions",
        doc: "Number of draft positions K.",
        get: |c| Value::from(c.num_positions),
        set: |c, f, key| {
            c.num_positions = f.int(key, U64)?;
            Ok(())
        },
    },
    ConfigField {
        name: "refit_interval",
        doc: "Observe calls per round (None: manual, a refit only when refit() is called).",
        get: |c| Value::from(c.refit_interval),
        set: |c, f, key| {
            c.refit_interval = f.optional_int(key, U64)?;
            Ok(())
        },
    },
    float_field!(damping, "Damping D, in observations."),
    float_field!(l2, "Ridge λ."),
    float_field!(init_slope, "Cold-start slope."),
    float_field!(init_intercept, "Cold-start intercept (every position)."),
    float_field!(max_log_odds, "Feature clamp."),
    float_field!(max_step, "Largest change of a coefficient in one refit."),
    float_field!(max_slope, "Largest slope."),
    float_field!(max_intercept, "Largest absolute intercept."),
    float_field!(
        memory,
        "Discount γ per round of the memory of past rounds (0 = vLLM's memoryless refit)."
    ),
    float_field!(
        drift_z,
        "Drift test threshold (standard deviations); inf disables the test."
    ),
    ConfigField {
        name: "update",
        doc:
            "How the estimator refits: \"map\" (av_core's) or \"vllm\" (vLLM's damped Newton step).",
        get: |c| Value::from(c.update.name()),
        set: |c, f, key| {
            let name = f.string(key)?;
            c.update = Update::parse(name).ok_or_else(|| {
                f.error(
                    crate::ErrorKind::Value,
                    key,
                    format!("must be \"map\" or \"vllm\", got {name:?}"),
                )
            })?;
            Ok(())
        },
    },
    ConfigField {
        name: "bins",
        doc: "map: bins per position of the feature histograms.",
        get: |c| Value::from(c.bins),
        set: |c, f, key| {
            c.bins = f.int(key, U64)?;
            Ok(())
        },
    },
    float_field!(prior_slope_sd, "map: the prior sd of the slope."),
    float_field!(
        prior_level_sd,
        "map: the prior sd of the intercepts' level."
    ),
    float_field!(
        prior_trend_sd,
        "map: the prior sd of the intercepts' trend in depth."
    ),
    float_field!(
        prior_spread_sd,
        "map: the prior sd of each intercept around the trend."
    ),
];

/// How many of [`CONFIG_FIELDS`] format version 1 holds (`num_positions` to `drift_z`).
pub const VERSION_1_FIELDS: usize = 12;

/// The field of [`CONFIG_FIELDS`] named `name`, if any.
pub fn config_field(name: &str) -> Option<&'static ConfigField> {
    CONFIG_FIELDS.iter().find(|f| f.name == name)
}

/// Every field of `config`, by name, in [`CONFIG_FIELDS`]' order.
pub fn config(config: &EstimatorConfig) -> Map {
    fields(config, &CONFIG_FIELDS)
}

/// The constructor's options of format version 1 and the update (every field but
/// `num_positions` and the map update's settings): what the bindings export as the defaults
/// (`ESTIMATOR_DEFAULTS`) and presets (`VLLM_ESTIMATOR`), so that `AcceptanceEstimator(k,
/// **VLLM_ESTIMATOR)` is vLLM's estimator whatever the default update.
pub fn options(config: &EstimatorConfig) -> Map {
    fields(config, &CONFIG_FIELDS[1..=VERSION_1_FIELDS])
}

/// The configuration a dict of its fields describes, as [`config`] writes it (errors name
/// `argument` and the field): `num_positions` is required, a field left out takes
/// [`EstimatorConfig::new`]'s value (the constructor's default), a key that names no field is
/// refused, and the result is validated as [`AcceptanceEstimator::new`] validates it.
pub fn decode_config(value: &Value, argument: &'static str) -> Result<EstimatorConfig> {
    let c = Fields::root(value, argument, "expected a dict of EstimatorConfig fields")?;
    if let Some(key) = c.as_map().keys().find(|&key| config_field(key).is_none()) {
        return Err(c.error(
            crate::ErrorKind::Value,
            key,
            "is not a field of EstimatorConfig",
        ));
    }
    let mut config = EstimatorConfig::new(1);
    for field in &CONFIG_FIELDS {
        if field.name == "num_positions" || c.as_map().get(field.name).is_some() {
            field.set(&mut config, &c)?;
        }
    }
    config.validate()?;
    Ok(config)
}

fn fields(config: &EstimatorConfig, fields: &[ConfigField]) -> Map {
    let mut map = Map::new();
    for field in fields {
        map.insert(field.name, field.get(config));
    }
    map
}

/// The update named `name`, or a value error for `argument`.
pub fn parse_update(name: &str, argument: &'static str) -> Result<Update> {
    Update::parse(name).ok_or_else(|| {
        Error::value(
            argument,
            format!("must be \"map\" or \"vllm\", got {name:?}"),
        )
    })
}

/// A round's fixed-point IRLS moments: `fraction_bits`, then per-position lists `a b c g0 g1 n`.
pub fn round_stats(stats: &RoundStats) -> Map {
    let mut m = Map::new();
    m.insert("fraction_bits", FRACTION_BITS);
    let column = |f: fn(&PositionSums) -> i128| -> Value {
        Value::List(stats.positions.iter().map(|p| Value::Int(f(p))).collect())
    };
    m.insert("a", column(|p| p.a));
    m.insert("b", column(|p| p.b));
    m.insert("c", column(|p| p.c));
    m.insert("g0", column(|p| p.g0));
    m.insert("g1", column(|p| p.g1));
    m.insert("n", column(|p| i128::from(p.n)));
    m
}

/// A round's histograms: `fraction_bits`, `bins`, then flat position-major lists of K·B
/// integers `count accepted x_sum`.
pub fn histogram(round: &HistogramStats) -> Map {
    let mut m = Map::new();
    m.insert("fraction_bits", X_FRACTION_BITS);
    m.insert("bins", round.bins);
    m.insert("count", round.count.clone());
    m.insert("accepted", round.accepted.clone());
    m.insert("x_sum", round.x_sum.clone());
    m
}

/// A round's IRLS moments from [`round_stats`]' tree (`argument` names it in errors).
pub fn decode_round_stats(value: &Value, argument: &'static str) -> Result<RoundStats> {
    let s = Fields::root(value, argument, "round_stats must be a dict")?;
    round_stats_of(&s)
}

fn round_stats_of(s: &Fields<'_>) -> Result<RoundStats> {
    let bits: u32 = s.int("fraction_bits", U64)?;
    if bits != FRACTION_BITS {
        return Err(Error::value(
            s.argument(),
            format!("round_stats use {bits} fraction bits, this build uses {FRACTION_BITS}"),
        ));
    }
    let columns: Vec<Vec<i128>> = ["a", "b", "c", "g0", "g1"]
        .iter()
        .map(|key| s.ints::<i128>(key, I128))
        .collect::<Result<_>>()?;
    let n: Vec<u64> = s.ints("n", U64)?;
    if columns.iter().any(|col| col.len() != n.len()) {
        return Err(Error::value(
            s.argument(),
            "round_stats columns have different lengths",
        ));
    }
    let positions = (0..n.len())
        .map(|k| PositionSums {
            a: columns[0][k],
            b: columns[1][k],
            c: columns[2][k],
            g0: columns[3][k],
            g1: columns[4][k],
            n: n[k],
        })
        .collect();
    Ok(RoundStats { positions })
}

/// A round's histograms from [`histogram`]'s tree, for an estimator of `num_positions`
/// positions and `bins` bins (`argument` names it in errors).
pub fn decode_histogram(
    value: &Value,
    argument: &'static str,
    num_positions: usize,
    bins: usize,
) -> Result<HistogramStats> {
    let s = Fields::root(value, argument, "round_stats must be a dict")?;
    histogram_of(&s, num_positions, bins)
}

fn histogram_of(s: &Fields<'_>, num_positions: usize, bins: usize) -> Result<HistogramStats> {
    let bits: u32 = s.int("fraction_bits", U64)?;
    if bits != X_FRACTION_BITS {
        return Err(Error::value(
            s.argument(),
            format!(
                "round_stats hold {bits} fraction bits, this estimator's histograms \
                 {X_FRACTION_BITS} (a vllm round given to a map estimator?)"
            ),
        ));
    }
    let theirs: usize = s.int("bins", U64)?;
    if theirs != bins {
        return Err(Error::value(
            s.argument(),
            format!("round_stats have {theirs} bins, this estimator {bins}"),
        ));
    }
    Ok(HistogramStats {
        num_positions,
        bins,
        count: s.ints("count", U64)?,
        accepted: s.ints("accepted", U64)?,
        x_sum: s.ints("x_sum", U64)?,
    })
}

/// Adds another round of `estimator`'s kind, as [`round_stats`] or [`histogram`] writes it, to its open round
/// (errors name `argument`; a refused round adds nothing).
pub fn add_round(
    estimator: &AcceptanceEstimator,
    value: &Value,
    argument: &'static str,
) -> Result<()> {
    let config = estimator.config();
    match config.update {
        Update::Vllm => estimator.add_round_stats(&decode_round_stats(value, argument)?),
        Update::Map => estimator.add_round_histogram(&decode_histogram(
            value,
            argument,
            config.num_positions,
            config.bins,
        )?),
    }
}

/// What `refit(report=True)` returns for `outcome`, a refit of `estimator` (`end_round`: whether
/// it ended the round): the round's statistics (moments under `vllm`; under `map` the
/// histograms the fit consumed, nothing if none), `slope_step`, `intercept_steps`,
/// `drift_statistic`, `iterations` and `end_round`.
pub fn refit_report(
    estimator: &AcceptanceEstimator,
    outcome: &RefitReport,
    end_round: bool,
) -> Map {
    let update = estimator.config().update;
    let mut d = match (&outcome.histogram, update) {
        (_, Update::Vllm) => round_stats(&outcome.stats),
        (Some(round), Update::Map) => histogram(round),
        (None, Update::Map) => Map::new(),
    };
    d.insert("slope_step", outcome.step.slope);
    d.insert("intercept_steps", outcome.step.intercepts.clone());
    let drift = match update {
        Update::Vllm => estimator.drift_statistic(&outcome.stats),
        Update::Map => outcome.drift_statistic.unwrap_or(f64::NAN),
    };
    d.insert("drift_statistic", drift);
    d.insert("iterations", outcome.iterations);
    d.insert("end_round", end_round);
    d
}

/// `state` as the format's tree (module docs).
pub fn encode(state: &EstimatorState) -> Map {
    let version = if written_version(state) == FORMAT_VERSION_1 {
        1
    } else {
        VERSION
    };
    let held = if version == 1 {
        &CONFIG_FIELDS[..VERSION_1_FIELDS]
    } else {
        &CONFIG_FIELDS[..]
    };
    let mut d = Map::new();
    d.insert("format", FORMAT);
    d.insert("format_version", version);
    d.insert("config", fields(&state.config, held));
    d.insert("slope", state.slope);
    d.insert("intercepts", state.intercepts.clone());
    d.insert(
        "round_stats",
        match &state.map {
            None => round_stats(&state.stats),
            Some(map) => histogram(&map.round),
        },
    );
    d.insert("steps_since_refit", state.steps_since_refit);
    d.insert("num_refits", state.num_refits);
    let mut memory = Map::new();
    match &state.map {
        None => {
            let m = &state.memory;
            memory.insert("a", m.a);
            memory.insert("b", m.b.clone());
            memory.insert("c", m.c.clone());
            memory.insert("rhs", m.rhs.clone());
            memory.insert("total", m.total);
            memory.insert("counts", m.counts.clone());
            memory.insert("resets", m.resets);
        }
        Some(map) => {
            memory.insert("count", map.memory.count.clone());
            memory.insert("accepted", map.memory.accepted.clone());
            memory.insert("x_sum", map.memory.x_sum.clone());
            memory.insert("resets", map.resets);
            let mut reference = Map::new();
            reference.insert("slope", map.reference_slope);
            reference.insert("intercepts", map.reference_intercepts.clone());
            d.insert("reference", reference);
            d.insert("fitted_labels", map.fitted_labels);
        }
    }
    d.insert("memory_state", memory);
    d
}

/// The state from the format's tree (of version 1 or 2), every field checked and named
/// (`state: ...`); the state as a whole is checked by [`AcceptanceEstimator::from_state`].
///
/// [`AcceptanceEstimator::from_state`]: crate::AcceptanceEstimator::from_state
pub fn decode(value: &Value) -> Result<EstimatorState> {
    let d = Fields::root(value, ARGUMENT, "expected a dict from state_dict()")?;
    let format = d.string("format")?;
    if format != FORMAT {
        return Err(Error::value(
            ARGUMENT,
            format!("format is {format:?}, expected {FORMAT:?}"),
        ));
    }
    let version: u32 = d.int("format_version", U64)?;
    if !(1..=VERSION).contains(&version) {
        return Err(Error::value(
            ARGUMENT,
            format!("format_version {version} is not supported (this build reads 1 to {VERSION})"),
        ));
    }
    let c = d.map("config")?;
    // Version 1 is the vllm update with the map fields' defaults.
    let mut config = version_1_config(1);
    let held = if version >= 2 {
        &CONFIG_FIELDS[..]
    } else {
        &CONFIG_FIELDS[..VERSION_1_FIELDS]
    };
    for field in held {
        field.set(&mut config, &c)?;
    }
    let m = d.map("memory_state")?;
    let k = config.num_positions;
    let (stats, memory, map) = match config.update {
        Update::Vllm => {
            let stats = round_stats_of(&d.map("round_stats")?)?;
            let memory = Memory {
                a: m.float("a")?,
                b: m.floats("b")?,
                c: m.floats("c")?,
                rhs: m.floats("rhs")?,
                total: m.float("total")?,
                counts: m.floats("counts")?,
                resets: m.int("resets", U64)?,
            };
            (stats, memory, None)
        }
        Update::Map => {
            let round = histogram_of(&d.map("round_stats")?, k, config.bins)?;
            let r = d.map("reference")?;
            let map = MapState {
                reference_slope: r.float("slope")?,
                reference_intercepts: r.floats("intercepts")?,
                round,
                memory: HistogramMemory {
                    num_positions: k,
                    bins: config.bins,
                    count: m.floats("count")?,
                    accepted: m.floats("accepted")?,
                    x_sum: m.floats("x_sum")?,
                },
                fitted_labels: d.int("fitted_labels", U64)?,
                resets: m.int("resets", U64)?,
            };
            (RoundStats::new(k), Memory::new(k), Some(map))
        }
    };
    Ok(EstimatorState {
        config,
        slope: d.float("slope")?,
        intercepts: d.floats("intercepts")?,
        stats,
        steps_since_refit: d.int("steps_since_refit", U64)?,
        num_refits: d.int("num_refits", U64)?,
        memory,
        map,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MatrixView;

    fn observed(config: EstimatorConfig) -> AcceptanceEstimator {
        let estimator = AcceptanceEstimator::new(config).unwrap();
        let features = [1.5f32, -0.5, 0.25, 2.0];
        let view = MatrixView::new("features", &features, 2, 2).unwrap();
        estimator
            .observe(view, &[2, 1], &[1, 1], None::<MatrixView<'_, f32>>)
            .unwrap();
        estimator
    }

    #[test]
    fn a_vllm_state_at_the_defaults_is_version_1_with_its_keys_in_order() {
        let mut config = version_1_config(2);
        config.refit_interval = Some(5);
        let state = observed(config).state();
        let tree = encode(&state);
        assert_eq!(
            tree.keys().collect::<Vec<_>>(),
            [
                "format",
                "format_version",
                "config",
                "slope",
                "intercepts",
                "round_stats",
                "steps_since_refit",
                "num_refits",
                "memory_state"
            ]
        );
        assert_eq!(tree.get("format_version"), Some(&Value::Int(1)));
        let Some(Value::Map(config)) = tree.get("config") else {
            panic!("no config")
        };
        assert_eq!(config.len(), VERSION_1_FIELDS);
        assert_eq!(config.get("refit_interval"), Some(&Value::Int(5)));
        assert_eq!(decode(&Value::Map(tree)).unwrap(), state);
    }

    #[test]
    fn the_default_state_is_the_map_updates_and_version_1_still_reads_as_vllm() {
        // The default update moved from vllm to map: a default state is written as version 2,
        // and a version-1 tree (every state before the map update) still decodes to vllm.
        let state = observed(EstimatorConfig::new(2)).state();
        assert_eq!(state.config.update, Update::Map);
        assert_eq!(encode(&state).get("format_version"), Some(&Value::Int(2)));
        let old = observed(version_1_config(2)).state();
        let tree = encode(&old);
        assert_eq!(tree.get("format_version"), Some(&Value::Int(1)));
        let Some(Value::Map(config)) = tree.get("config") else {
            panic!("no config")
        };
        assert!(
            config.get("update").is_none(),
            "version 1 has no update key"
        );
        assert_eq!(
            decode(&Value::Map(tree)).unwrap().config.update,
            Update::Vllm
        );
    }

    #[test]
    fn a_map_state_is_version_2_and_round_trips() {
        let state = observed(EstimatorConfig::map(2)).state();
        let tree = encode(&state);
        assert_eq!(tree.get("format_version"), Some(&Value::Int(2)));
        let keys: Vec<_> = tree.keys().collect();
        assert_eq!(
            &keys[7..],
            ["num_refits", "reference", "fitted_labels", "memory_state"]
        );
        assert_eq!(decode(&Value::Map(tree)).unwrap(), state);
    }

    #[test]
    fn every_config_field_reads_back_what_it_writes() {
        let mut config = EstimatorConfig::map(3);
        config.bins = 17;
        config.l2 = 0.25;
        let tree = Value::Map(super::config(&config));
        let fields = Fields::root(&tree, "config", "a dict").unwrap();
        let mut read = EstimatorConfig::new(1);
        for field in &CONFIG_FIELDS {
            field.set(&mut read, &fields).unwrap();
        }
        assert_eq!(read, config);
        assert_eq!(options(&config).len(), 12);
        assert_eq!(
            options(&config).get("update"),
            Some(&Value::Str("map".into()))
        );
        assert!(config_field("l2").is_some() && config_field("nope").is_none());
    }

    #[test]
    fn decode_config_reads_what_config_writes_and_defaults_the_rest() {
        let mut config = EstimatorConfig::vllm(3);
        config.refit_interval = None;
        config.max_step = f64::INFINITY;
        let tree = Value::Map(super::config(&config));
        assert_eq!(decode_config(&tree, "fields").unwrap(), config);
        // Only num_positions given: the constructor's defaults, the default update's included.
        let mut partial = Map::new();
        partial.insert("num_positions", 5u64);
        partial.insert("l2", 0.5);
        let mut expected = EstimatorConfig::new(5);
        expected.l2 = 0.5;
        assert_eq!(
            decode_config(&Value::Map(partial), "fields").unwrap(),
            expected
        );
    }

    #[test]
    fn decode_config_refuses_unknown_missing_and_invalid_fields() {
        let message = |tree: Map| decode_config(&Value::Map(tree), "fields").unwrap_err();
        let mut unknown = super::config(&EstimatorConfig::new(2));
        unknown.insert("l3", 1.0);
        let err = message(unknown);
        assert_eq!(err.kind, crate::ErrorKind::Value);
        assert!(err.to_string().contains("[\"l3\"] is not a field"), "{err}");
        let mut missing = Map::new();
        for (key, value) in super::config(&EstimatorConfig::new(2)).iter().skip(1) {
            missing.insert(key, value.clone());
        }
        assert!(message(missing)
            .to_string()
            .contains("[\"num_positions\"] is missing"));
        let mut invalid = super::config(&EstimatorConfig::new(2));
        invalid.insert("memory", 1.5);
        let err = message(invalid);
        assert_eq!(
            (err.kind, err.argument),
            (crate::ErrorKind::Value, "memory")
        );
        let mut wrong_type = super::config(&EstimatorConfig::new(2));
        wrong_type.insert("bins", "64");
        assert_eq!(message(wrong_type).kind, crate::ErrorKind::Type);
        let err = decode_config(&Value::Int(3), "fields").unwrap_err();
        assert_eq!((err.kind, err.argument), (crate::ErrorKind::Type, "fields"));
    }

    #[test]
    fn a_bad_update_name_is_refused_naming_its_path() {
        let state = observed(EstimatorConfig::map(2)).state();
        let mut tree = encode(&state);
        let Some(Value::Map(mut config)) = tree.get("config").cloned() else {
            panic!()
        };
        config.insert("update", "newton");
        tree.insert("config", config);
        let err = decode(&Value::Map(tree)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "state: [\"config\"][\"update\"] must be \"map\" or \"vllm\", got \"newton\""
        );
    }
}
