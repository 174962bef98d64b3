"""The core owns every default and constant; the bindings export them once and say them truly.

The expected values are written out here from the core's documentation (``EstimatorConfig`` in
av_core/src/estimator/config.rs, vLLM 0.33.0's acceptance_estimator.py, ``cost_tables.rs``,
``planner/exploration.rs``), not read from the code under test. Each is checked three ways: the
runtime signature (``inspect.signature``, what ``help()`` shows), the exported constants, and
what an object built without the argument actually holds, so a signature text that drifted from
the core's real default fails as surely as a changed default.
"""

from __future__ import annotations

import ast
import copy
import inspect
import math
import pickle
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
import pytest

import av_core
from av_core import _native, state_types

STUB = Path(av_core.__file__).with_name("_native.pyi")

#: AcceptanceEstimator's keyword defaults, as the core documents them.
CORE_DEFAULTS: dict[str, float] = {
    "refit_interval": 100,
    "damping": 50.0,
    "l2": 1e-3,
    "init_slope": 0.5,
    "init_intercept": -0.2,
    "max_log_odds": 40.0,
    "max_step": 4.0,
    "max_slope": 10.0,
    "max_intercept": 15.0,
    "memory": 0.8,
    "drift_z": 3.09,
}

#: The update's keywords (docs/estimator.md): av_core's ``map`` update by default, with its bins
#: and prior widths (vLLM's update is ``update="vllm"``). ``ESTIMATOR_DEFAULTS`` holds the update
#: but not the map settings; a default estimator's ``state_dict()`` (format version 2) and the
#: getters hold them all.
UPDATE_DEFAULTS: dict[str, Any] = {
    "update": "map",
    "bins": 64,
    "prior_slope_sd": 0.15,
    "prior_level_sd": 1.0,
    "prior_trend_sd": 0.2,
    "prior_spread_sd": 0.1,
}

#: vLLM 0.33.0's estimator: its constants (REFIT_INTERVAL, DAMPING_OBSERVATIONS, L2,
#: _MAX_LOG_ODDS, _INIT_SLOPE, _INIT_BIAS), its memoryless, unbounded update.
VLLM = {
    **CORE_DEFAULTS,
    "update": "vllm",
    "memory": 0.0,
    "max_step": math.inf,
    "max_slope": math.inf,
    "max_intercept": math.inf,
}


def runtime_defaults(callable_: Any) -> dict[str, Any]:
    parameters = inspect.signature(callable_).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def stub_defaults(class_name: str) -> dict[str, Any]:
    """The literal defaults of ``class_name.__new__`` in the stub."""
    tree = ast.parse(STUB.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    (new,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__new__"]
    args = new.args
    named = args.kwonlyargs
    return {a.arg: ast.literal_eval(d) for a, d in zip(named, args.kw_defaults, strict=True) if d}


def test_the_estimators_signature_shows_the_cores_defaults() -> None:
    defaults = runtime_defaults(_native.AcceptanceEstimator)
    everything = {**CORE_DEFAULTS, **UPDATE_DEFAULTS}
    assert defaults == everything
    assert all(type(v) is type(everything[k]) for k, v in defaults.items()), defaults
    assert "refit_interval=100" in _native.AcceptanceEstimator.__text_signature__
    assert "..." not in _native.AcceptanceEstimator.__text_signature__


def test_an_estimator_built_with_no_options_holds_the_signatures_defaults() -> None:
    est = _native.AcceptanceEstimator(3)
    config: dict[str, Any] = dict(est.state_dict()["config"])
    assert config.pop("num_positions") == 3
    defaults = runtime_defaults(_native.AcceptanceEstimator)
    assert config == defaults
    assert config == {**CORE_DEFAULTS, **UPDATE_DEFAULTS}
    assert {k: getattr(est, k) for k in UPDATE_DEFAULTS} == UPDATE_DEFAULTS
    assert {k: defaults[k] for k in UPDATE_DEFAULTS} == UPDATE_DEFAULTS


def test_the_exported_defaults_are_the_cores_and_read_only() -> None:
    assert dict(_native.ESTIMATOR_DEFAULTS) == {**CORE_DEFAULTS, "update": "map"}
    assert dict(_native.VLLM_ESTIMATOR) == VLLM
    assert _native.MAX_LOG_ODDS == 40.0
    for mapping in (_native.ESTIMATOR_DEFAULTS, _native.VLLM_ESTIMATOR):
        with pytest.raises(TypeError):
            mapping["l2"] = 1.0  # type: ignore[index]
    assert _native.ESTIMATOR_DEFAULTS["l2"] == 1e-3


def test_the_vllm_preset_builds_vllms_estimator() -> None:
    est = _native.AcceptanceEstimator(2, **_native.VLLM_ESTIMATOR)
    config: dict[str, Any] = dict(est.state_dict()["config"])
    assert config.pop("num_positions") == 2
    assert est.update == "vllm" and est.state_dict()["format_version"] == 1
    assert config == {k: v for k, v in VLLM.items() if k != "update"}  # version 1: no update key


def test_the_stub_states_the_same_defaults() -> None:
    assert stub_defaults("AcceptanceEstimator") == {**CORE_DEFAULTS, **UPDATE_DEFAULTS}
    assert stub_defaults("VerificationPlanner")["exploration"] == 0.01


def test_the_planner_and_cost_table_constants_are_the_cores() -> None:
    assert runtime_defaults(_native.VerificationPlanner)["exploration"] == 0.01
    assert _native.DEFAULT_EXPLORATION == 0.01
    tables = _native.CostTables(np.zeros(3), np.ones(9))
    assert _native.VerificationPlanner(tables, 2).exploration == 0.01
    # The floors, seen where the core applies them: a profile at or below zero.
    floored = _native.CostTables.from_curves(
        [(1.0, -0.5)], [(1.0, 0.0)], max_num_reqs=2, max_batch_tokens=4
    )
    assert _native.VERIFY_COST_FLOOR_MS == 1e-6
    assert _native.DRAFT_COST_FLOOR_MS == 0.0
    assert floored.verify_ms.tolist() == [1e-6] * 5
    assert floored.draft_ms.tolist() == [0.0] * 3


def test_every_python_alias_of_the_clamp_is_the_cores() -> None:
    from av_core.tools.collect import LOG_ODDS_CLAMP
    from av_core.tools.evaluate import MAX_FEATURE

    assert LOG_ODDS_CLAMP == MAX_FEATURE == 40.0
    pytest.importorskip("torch")
    from av_core import features, vllm
    from av_core.vllm import constants, plugin

    assert features.MAX_LOG_ODDS == vllm.MAX_LOG_ODDS == 40.0
    assert (constants.REFIT_INTERVAL, constants.DAMPING_OBSERVATIONS, constants.L2) == (
        100,
        50.0,
        1e-3,
    )
    assert (constants.INIT_SLOPE, constants.INIT_INTERCEPT) == (0.5, -0.2)
    expected = {name.rsplit(".", 1)[-1]: v for (_, name), v in plugin.EXPECTED_CONSTANTS.items()}
    assert expected == {
        "REFIT_INTERVAL": 100,
        "DAMPING_OBSERVATIONS": 50.0,
        "L2": 1e-3,
        "_MAX_LOG_ODDS": 40.0,
        "_INIT_SLOPE": 0.5,
        "_INIT_BIAS": -0.2,
    }


def keys(typed_dict: type) -> set[str]:
    return set(get_type_hints(typed_dict))


def test_the_typed_dicts_name_every_key_the_bindings_return() -> None:
    est = _native.AcceptanceEstimator(2, refit_interval=1, update="vllm")
    x = np.array([[1.0, -1.0]], np.float32)
    est.observe(x, np.array([2]), np.array([1]))
    state: dict[str, Any] = dict(est.state_dict())
    assert set(state) == keys(state_types.EstimatorStateDict)
    assert set(state["config"]) == keys(state_types.EstimatorConfigDict)
    assert set(state["round_stats"]) == keys(state_types.RoundStatsDict)
    assert set(state["memory_state"]) == keys(state_types.MemoryStateDict)
    assert set(_native.ESTIMATOR_DEFAULTS) == keys(state_types.EstimatorOptions)
    assert set(_native.VLLM_ESTIMATOR) == keys(state_types.EstimatorOptions)
    est.observe(x, np.array([2]), np.array([1]))
    report: dict[str, Any] = dict(est.refit(report=True))
    assert set(report) == keys(state_types.RefitReport)
    # The value types the TypedDicts promise (lists of ints, floats, ints).
    assert all(type(v) is int for v in state["round_stats"]["a"])
    assert type(state["memory_state"]["a"]) is float
    assert type(report["drift_statistic"]) is float


def test_the_map_typed_dicts_name_every_key_of_a_default_estimators_state() -> None:
    est = _native.AcceptanceEstimator(2, refit_interval=3)  # the default update: map
    x = np.array([[1.0, -1.0]], np.float32)
    for _ in range(4):  # a round ended (memory), and one step into the next
        est.observe(x, np.array([2]), np.array([1]))
    state: dict[str, Any] = dict(est.state_dict())
    assert state["format_version"] == 2
    assert set(state) == keys(state_types.MapEstimatorStateDict)
    assert set(state["config"]) == keys(state_types.EstimatorConfigFields)
    assert set(state["round_stats"]) == keys(state_types.HistogramDict)
    assert set(state["memory_state"]) == keys(state_types.HistogramMemoryDict)
    assert set(state["reference"]) == keys(state_types.ReferenceDict)
    report: dict[str, Any] = dict(est.refit(report=True))
    assert set(report) == keys(state_types.MapRefitReport)
    # 2 positions × 64 bins, position-major; the one step of the open round: x = 1.0 accepted at
    # position 0, x = -1.0 rejected at position 1, each in its own bin.
    round_stats = state["round_stats"]
    assert round_stats["bins"] == 64 and len(round_stats["count"]) == 2 * 64
    assert sum(round_stats["count"][:64]) == 1 and sum(round_stats["count"][64:]) == 1
    assert sum(round_stats["accepted"][:64]) == 1 and sum(round_stats["accepted"][64:]) == 0
    assert all(type(v) is int for v in round_stats["x_sum"])
    assert all(type(v) is float for v in state["memory_state"]["count"])
    assert sum(state["memory_state"]["count"]) > 0
    assert type(state["fitted_labels"]) is int and type(report["iterations"]) is int


def stub_properties(class_name: str) -> set[str]:
    """The properties the stub declares on ``class_name``, its stub base classes' included."""
    tree = ast.parse(STUB.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    own = {
        n.name
        for n in cls.body
        if isinstance(n, ast.FunctionDef)
        and any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)
    }
    declared = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    bases = [b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in declared]
    return own.union(*(stub_properties(base) for base in bases))


def test_the_config_object_holds_every_field_with_the_documented_defaults() -> None:
    est = _native.AcceptanceEstimator(3)
    config = est.config
    expected = {"num_positions": 3, **CORE_DEFAULTS, **UPDATE_DEFAULTS}
    # Every field, in the constructor's order, with the documented default and its type.
    assert list(config) == list(config.keys()) == list(expected)
    assert dict(config) == config.to_dict() == expected
    assert all(type(config[k]) is type(v) for k, v in expected.items()), dict(config)
    assert len(config) == len(expected) and "l2" in config and "nope" not in config
    assert set(config) == keys(state_types.EstimatorConfigFields)
    # The same values as attributes, of the config and of the estimator (the old getters).
    for name, value in expected.items():
        assert getattr(config, name) == getattr(est, name) == value, name
    with pytest.raises(KeyError):
        config["nope"]
    with pytest.raises(AttributeError):
        config.l2 = 1.0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        est.l2 = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        config["l2"] = 1.0  # type: ignore[index]
    # The stub declares exactly these attributes, on both classes.
    assert stub_properties("EstimatorConfig") == set(expected)
    assert set(expected) <= stub_properties("AcceptanceEstimator")


def test_the_config_object_rebuilds_the_estimators_configuration() -> None:
    options = {"refit_interval": 7, "l2": 0.25, "update": "map", "bins": 16}
    est = _native.AcceptanceEstimator(2, **options)
    config = est.config
    assert {k: config[k] for k in options} == options
    again = _native.AcceptanceEstimator(**config)
    assert again.config == config
    assert again.config != _native.AcceptanceEstimator(2).config
    assert repr(config).startswith("EstimatorConfig(num_positions=2, refit_interval=7, ")
    # A map estimator's version-2 state_dict holds exactly the config object's fields.
    assert est.state_dict()["config"] == dict(config)


#: Configurations unlike the default in every way a field can differ (None, inf, the other
#: update, the largest K).
CONFIGS: list[dict[str, Any]] = [
    {"num_positions": 3},
    {"num_positions": 4, **_native.VLLM_ESTIMATOR},
    {"num_positions": 2, "refit_interval": None, "max_step": math.inf, "drift_z": math.inf},
    {"num_positions": 64, "bins": 16, "prior_slope_sd": math.inf, "prior_trend_sd": 0.0},
    {"num_positions": 1, "update": "vllm", "memory": 0.0, "l2": 0.5, "init_intercept": -0.0},
]


@pytest.mark.parametrize("fields", CONFIGS, ids=lambda f: ",".join(map(str, f.values())))
def test_the_config_object_pickles_copies_and_hashes_as_a_value(fields: dict[str, Any]) -> None:
    config = _native.AcceptanceEstimator(**fields).config
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(config, protocol=protocol))
        assert type(again) is _native.EstimatorConfig
        assert again == config and hash(again) == hash(config), protocol
        assert again.to_dict() == config.to_dict()
        assert {k: again[k] for k in fields} == fields  # the values set, not the defaults
    # Immutable: a copy is the object itself, also inside a copied structure.
    assert copy.copy(config) is config and copy.deepcopy(config) is config
    assert copy.deepcopy({"c": [config]})["c"][0] is config
    # Equal configurations built apart hash alike and meet as dict keys and set members.
    twin = _native.AcceptanceEstimator(**fields).config
    assert twin is not config and {config: 1}[twin] == 1 and len({config, twin}) == 1


def test_configs_that_differ_in_one_field_are_different_keys() -> None:
    base = _native.AcceptanceEstimator(3).config
    changes = {"l2": 0.002, "update": "vllm", "bins": 32, "refit_interval": None, "memory": 0.5}
    others = [_native.AcceptanceEstimator(**{**base, k: v}).config for k, v in changes.items()]
    assert all(o != base for o in others)
    assert len({base, *others}) == 1 + len(changes)
    # 0.0 and -0.0 are the same value, as Python's floats are: equal and hashed alike.
    zero = _native.AcceptanceEstimator(3, init_intercept=0.0).config
    negative = _native.AcceptanceEstimator(3, init_intercept=-0.0).config
    assert zero == negative and hash(zero) == hash(negative)


@pytest.mark.parametrize("fields", CONFIGS, ids=lambda f: ",".join(map(str, f.values())))
def test_from_dict_builds_what_the_constructor_builds(fields: dict[str, Any]) -> None:
    # Fields left out take the constructor's defaults: compared with the constructor itself.
    assert _native.EstimatorConfig.from_dict(fields) == _native.AcceptanceEstimator(**fields).config
    full = _native.AcceptanceEstimator(**fields).config.to_dict()
    assert _native.EstimatorConfig.from_dict(full).to_dict() == full


@pytest.mark.parametrize(
    ("fields", "error", "text"),
    [
        ({"num_positions": 3, "l3": 1.0}, ValueError, r'fields: \["l3"\] is not a field'),
        ({"l2": 1.0}, ValueError, r'fields: \["num_positions"\] is missing'),
        ({"num_positions": 0}, ValueError, r"num_positions: must be between 1 and 64, got 0"),
        ({"num_positions": 3, "memory": 1.5}, ValueError, r"memory: must be in \[0, 1\), got 1.5"),
        ({"num_positions": 3, "bins": "64"}, TypeError, r'fields: \["bins"\] must be an integer'),
        (
            {"num_positions": 3, "update": "newton"},
            ValueError,
            r"\"map\" or \"vllm\", got \"newton\"",
        ),
        ({"num_positions": 3, "l2": -1.0}, ValueError, r"l2: .*got -1"),
        ([("num_positions", 3)], TypeError, r"fields: expected a dict of EstimatorConfig fields"),
    ],
)
def test_from_dict_refuses_bad_fields_naming_them(fields: Any, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        _native.EstimatorConfig.from_dict(fields)
