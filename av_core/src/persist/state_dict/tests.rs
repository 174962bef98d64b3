use super::*;
use crate::{MatrixView, Update};

fn observed(config: EstimatorConfig) -> AcceptanceEstimator {
    let estimator = AcceptanceEstimator::new(config).unwrap();
    let features = [1.5f32, -0.5, 0.25, 2.0];
    let view = MatrixView::new("features", &features, 2, 2).unwrap();
    estimator
        .observe(view, &[2, 1], &[1, 1], None::<MatrixView<'_, f32>>)
        .unwrap();
    estimator
}

fn keys(tree: &Value) -> Vec<&str> {
    match tree {
        Value::Dict(entries) => entries.iter().map(|(k, _)| k.as_str()).collect(),
        _ => Vec::new(),
    }
}

fn decoded(tree: &Value) -> Result<EstimatorState> {
    decode(tree, "state", ErrorKind::Value)
}

/// `tree` with the key at `path` set to `value` (added at the end of its dict if absent), or
/// removed for `None`.
fn edited(tree: &Value, path: &[&str], value: Option<Value>) -> Value {
    let mut tree = tree.clone();
    let mut at = &mut tree;
    let (last, parents) = path.split_last().expect("a path");
    for key in parents {
        let Value::Dict(entries) = at else {
            panic!("not a dict at {key}")
        };
        at = &mut entries.iter_mut().find(|(k, _)| k == key).expect("a key").1;
    }
    let Value::Dict(entries) = at else {
        panic!("not a dict at {last}")
    };
    entries.retain(|(k, _)| k != last || value.is_some());
    if let Some(value) = value {
        match entries.iter_mut().find(|(k, _)| k == last) {
            Some(entry) => entry.1 = value,
            None => entries.push((last.to_string(), value)),
        }
    }
    tree
}

fn with(tree: &Value, path: &[&str], value: Value) -> Value {
    edited(tree, path, Some(value))
}

fn without(tree: &Value, path: &[&str]) -> Value {
    edited(tree, path, None)
}

#[test]
fn a_vllm_state_at_the_defaults_is_version_1_with_its_keys_in_order() {
    let mut config = EstimatorConfig::version_1(2);
    config.refit_interval = Some(5);
    let state = observed(config).state();
    let tree = encode(&state);
    assert_eq!(
        keys(&tree),
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
    let config = tree.get("config").unwrap();
    assert_eq!(keys(config).len(), EstimatorConfig::VERSION_1_FIELDS);
    assert_eq!(config.get("refit_interval"), Some(&Value::Int(5)));
    assert_eq!(decoded(&tree).unwrap(), state);
}

#[test]
fn the_default_state_is_the_map_updates_and_version_1_still_reads_as_vllm() {
    let state = observed(EstimatorConfig::new(2)).state();
    assert_eq!(state.config.update, Update::Map);
    assert_eq!(encode(&state).get("format_version"), Some(&Value::Int(2)));
    let old = observed(EstimatorConfig::version_1(2)).state();
    let tree = encode(&old);
    assert_eq!(tree.get("format_version"), Some(&Value::Int(1)));
    assert!(tree.get("config").unwrap().get("update").is_none());
    assert_eq!(decoded(&tree).unwrap().config.update, Update::Vllm);
}

#[test]
fn a_map_state_is_version_2_and_round_trips() {
    let state = observed(EstimatorConfig::map(2)).state();
    let tree = encode(&state);
    assert_eq!(tree.get("format_version"), Some(&Value::Int(2)));
    assert_eq!(
        &keys(&tree)[5..],
        [
            "round_stats",
            "steps_since_refit",
            "num_refits",
            "reference",
            "fitted_labels",
            "memory_state"
        ]
    );
    assert_eq!(decoded(&tree).unwrap(), state);
}

#[test]
fn the_field_docs_are_the_fields_in_order() {
    let config = to_value(&EstimatorConfig::map(3));
    let names: Vec<&str> = EstimatorConfig::FIELD_DOCS
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(keys(&config), names);
    assert_eq!(keys(&options(&EstimatorConfig::new(3))).len(), 12);
    assert_eq!(
        options(&EstimatorConfig::new(3)).get("update"),
        Some(&Value::Str("map".into()))
    );
}

#[test]
fn decode_config_reads_what_config_writes_and_defaults_the_rest() {
    let mut vllm = EstimatorConfig::vllm(3);
    vllm.refit_interval = None;
    assert_eq!(decode_config(&config(&vllm), "fields").unwrap(), vllm);
    // Only num_positions given: the constructor's defaults, the default update's included.
    let partial = Value::Dict(vec![
        ("num_positions".into(), Value::Int(5)),
        ("l2".into(), Value::Float(0.5)),
    ]);
    let mut expected = EstimatorConfig::new(5);
    expected.l2 = 0.5;
    assert_eq!(decode_config(&partial, "fields").unwrap(), expected);
}

#[test]
fn decode_config_refuses_unknown_missing_and_invalid_fields() {
    let tree = config(&EstimatorConfig::new(2));
    let err = decode_config(&with(&tree, &["l3"], Value::Float(1.0)), "fields").unwrap_err();
    assert_eq!(err.kind, ErrorKind::Value);
    assert!(
        err.to_string()
            .starts_with("fields: [\"l3\"] is not a field"),
        "{err}"
    );
    let err = decode_config(&without(&tree, &["num_positions"]), "fields").unwrap_err();
    assert_eq!(err.to_string(), "fields: [\"num_positions\"] is missing");
    let err = decode_config(&with(&tree, &["memory"], Value::Float(1.5)), "fields").unwrap_err();
    assert_eq!((err.kind, err.argument), (ErrorKind::Value, "memory"));
    let err =
        decode_config(&with(&tree, &["bins"], Value::Str("64".into())), "fields").unwrap_err();
    assert_eq!(err.kind, ErrorKind::Type);
    let err = decode_config(&Value::Int(3), "fields").unwrap_err();
    assert_eq!((err.kind, err.argument), (ErrorKind::Type, "fields"));
}

#[test]
fn bad_values_are_refused_naming_their_path_and_type() {
    let tree = encode(&observed(EstimatorConfig::map(2)).state());
    let cases: [(&[&str], Value, ErrorKind, &str); 7] = [
        (
            &["config", "update"],
            Value::Str("newton".into()),
            ErrorKind::Value,
            "state: [\"config\"][\"update\"] must be \"map\" or \"vllm\", got \"newton\"",
        ),
        (
            &["config", "l2"],
            Value::Bool(true),
            ErrorKind::Type,
            "state: [\"config\"][\"l2\"] must be a number, got bool (True)",
        ),
        (
            &["num_refits"],
            Value::Float(2.0),
            ErrorKind::Type,
            "state: [\"num_refits\"] must be an integer, got float (2.0)",
        ),
        (
            &["round_stats", "count"],
            Value::List(vec![Value::Int(-1)]),
            ErrorKind::Value,
            "state: [\"round_stats\"][\"count\"][0] must be an integer in 0..=18446744073709551615, got -1",
        ),
        (
            &["memory_state"],
            Value::None,
            ErrorKind::Type,
            "state: [\"memory_state\"] must be a dict, got NoneType",
        ),
        (
            &["format"],
            Value::Int(3),
            ErrorKind::Type,
            "state: [\"format\"] must be a string, got int (3)",
        ),
        (
            &["round_stats", "fraction_bits"],
            Value::Int(36),
            ErrorKind::Value,
            "state: [\"round_stats\"] holds 36 fraction bits, this build's histograms 16",
        ),
    ];
    for (path, value, kind, message) in cases {
        let err = decoded(&with(&tree, path, value)).unwrap_err();
        assert_eq!((err.kind, err.to_string()), (kind, message.to_string()));
    }
    let err = decoded(&without(&tree, &["slope"])).unwrap_err();
    assert_eq!(err.to_string(), "state: [\"slope\"] is missing");
}

#[test]
fn a_key_no_field_holds_is_refused_anywhere_naming_its_path() {
    for config in [EstimatorConfig::version_1(2), EstimatorConfig::map(2)] {
        let tree = encode(&observed(config).state());
        for path in [
            &["extra"][..],
            &["config", "l3"],
            &["round_stats", "extra"],
            &["memory_state", "extra"],
        ] {
            let err = decoded(&with(&tree, path, Value::Int(0))).unwrap_err();
            let at: String = path.iter().map(|key| format!("[{key:?}]")).collect();
            assert_eq!(err.kind, ErrorKind::Value);
            assert!(
                err.to_string()
                    .starts_with(&format!("state: {at} is not a field")),
                "{err}"
            );
        }
    }
    // The other update's statistics.
    let map = encode(&observed(EstimatorConfig::map(2)).state());
    let err = decoded(&with(&map, &["round_stats", "n"], Value::List(vec![]))).unwrap_err();
    assert!(err
        .to_string()
        .starts_with("state: [\"round_stats\"][\"n\"] is not a field"));
    let vllm = encode(&observed(EstimatorConfig::version_1(2)).state());
    let err = decoded(&with(&vllm, &["fitted_labels"], Value::Int(0))).unwrap_err();
    assert!(err
        .to_string()
        .starts_with("state: [\"fitted_labels\"] is not a field"));
    let err = decoded(&with(&vllm, &["config", "bins"], Value::Int(64))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "state: [\"config\"][\"bins\"] is not a field of format version 1"
    );
}

#[test]
fn a_version_1_state_from_before_the_memory_reads_as_memoryless() {
    // What the first builds wrote: no memory, drift_z or memory_state.
    let mut config = EstimatorConfig::version_1(2);
    config.memory = 0.0;
    let state = observed(config).state();
    let mut tree = encode(&state);
    for path in [
        &["config", "memory"][..],
        &["config", "drift_z"],
        &["memory_state"],
    ] {
        tree = without(&tree, path);
    }
    assert_eq!(decoded(&tree).unwrap(), state);
    // Without only one of them it is an ordinary state with a key missing.
    let partial = without(&encode(&state), &["memory_state"]);
    assert_eq!(
        decoded(&partial).unwrap_err().to_string(),
        "state: [\"memory_state\"] is missing"
    );
}

#[test]
fn a_version_1_state_from_before_the_memory_with_a_huge_k_is_refused_without_allocating_it() {
    let mut config = EstimatorConfig::version_1(2);
    config.memory = 0.0;
    let mut tree = encode(&observed(config).state());
    for path in [
        &["config", "memory"][..],
        &["config", "drift_z"],
        &["memory_state"],
    ] {
        tree = without(&tree, path);
    }
    for k in [65, 1 << 40, u64::MAX as i128] {
        let tree = with(&tree, &["config", "num_positions"], Value::Int(k));
        // The memory it reads as is a placeholder; the state is refused for its K.
        let state = decoded(&tree).unwrap();
        let err = AcceptanceEstimator::from_state(&state).unwrap_err();
        assert!(err.to_string().contains("num_positions"), "{err}");
    }
}
