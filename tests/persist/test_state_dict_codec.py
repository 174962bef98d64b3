"""The ``state_dict`` format, now the core's (av_core/src/persist/state_dict.rs): the bindings
only convert its value tree to Python values and back, so the output must be exactly what the
bindings wrote before (tests/data/state_dicts.json, written by that build), key order and
Python types included, and every state must read back bit for bit (a refit's floats to
rounding where the fit's arithmetic changed since: ``REFITTED_SINCE``)."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trees import exact, with_later_fields

from av_core import AcceptanceEstimator

DATA = Path(__file__).resolve().parents[1] / "data"


def _load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("make_state_dicts", DATA / "make_state_dicts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = _load_generator()
RECORDS: dict[str, Any] = json.loads((DATA / "state_dicts.json").read_text())


#: Records whose refits' floats may differ from the record by this much: the map update's
#: Newton step has been solved by its structure (O(K), Woodbury and a Schur complement) since
#: the record was written, not by a dense Cholesky, which moves the fitted coefficients by
#: rounding (at most 2e-15 in these records). Everything else stays exact: the format, the
#: types, every integer (the histograms), and every float of a state loaded without a refit.
REFITTED_SINCE: dict[str, float] = {"map": 1e-12}


def test_the_exact_check_tolerates_only_what_it_is_told() -> None:
    exact({"a": [0.1 + 1e-13]}, {"a": [0.1]}, fitted=1e-12)
    with pytest.raises(AssertionError):
        exact({"a": [0.1 + 1e-11]}, {"a": [0.1]}, fitted=1e-12)
    with pytest.raises(AssertionError):
        exact({"a": 1}, {"a": 2}, fitted=1e-12)  # integers stay exact
    with pytest.raises(AssertionError):
        exact({"a": 1.0}, {"a": 1}, fitted=1e-12)  # and types


def test_the_exact_check_catches_a_changed_type_or_order() -> None:
    with pytest.raises(AssertionError):
        exact({"a": 1}, {"a": 1.0})
    with pytest.raises(AssertionError):
        exact({"a": 1, "b": 2}, {"b": 2, "a": 1})
    with pytest.raises(AssertionError):
        exact([0.0], [-0.0])
    with pytest.raises(AssertionError):
        exact({"a": True}, {"a": 1})
    exact({"x": [math.nan, 1]}, {"x": [math.nan, 1]})


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_state_dict_and_report_are_what_the_bindings_wrote_before(name: str) -> None:
    record = RECORDS[name]
    k, options, steps = GENERATOR.SCENARIOS[name]
    assert (record["k"], record["options"], record["steps"]) == (k, options, steps)
    est = GENERATOR.drive(k, options, steps)
    fitted = REFITTED_SINCE.get(name, 0.0)
    exact(est.state_dict(), with_later_fields(record["state"]), name, fitted)
    exact(est.refit(report=True), record["report"], f"{name} report", fitted)
    exact(est.state_dict(), with_later_fields(record["after"]), f"{name} after", fitted)


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_the_old_builds_state_dicts_load_bit_for_bit(name: str) -> None:
    record = RECORDS[name]
    for key in ("state", "after"):
        est = AcceptanceEstimator.from_state_dict(copy.deepcopy(record[key]))
        exact(est.state_dict(), with_later_fields(record[key]), f"{name} {key}")
    # And it continues as the estimator that wrote it: its report is the old build's.
    est = AcceptanceEstimator.from_state_dict(copy.deepcopy(record["state"]))
    exact(est.refit(report=True), record["report"], f"{name} report", REFITTED_SINCE.get(name, 0.0))


def test_a_small_state_dict_is_the_hand_computed_one() -> None:
    # One labelled draft at x = 2 with draft-time prediction p = 0.5, accepted (y = 1):
    # w = p(1 - p) = 1/4, r = y - p = 1/2, so in units of 2**-36: a = w x² = 1 -> 2**36,
    # b = w x = 1/2 -> 2**35, c = w = 1/4 -> 2**34, g0 = r x = 1 -> 2**36, g1 = r = 2**35.
    est = AcceptanceEstimator(1, update="vllm")  # IRLS moments: vLLM's update
    est.observe(np.array([[2.0]], np.float32), [1], [1], np.array([[0.5]], np.float32))
    expected = {
        "format": "av_core.AcceptanceEstimator",
        "format_version": 1,
        "config": {
            "num_positions": 1,
            "refit_interval": 100,
            "damping": 50.0,
            "l2": 0.001,
            "init_slope": 0.5,
            "init_intercept": -0.2,
            "max_log_odds": 40.0,
            "max_step": 4.0,
            "max_slope": 10.0,
            "max_intercept": 15.0,
            "memory": 0.8,
            "drift_z": 3.09,
        },
        "slope": 0.5,
        "intercepts": [-0.2],
        "round_stats": {
            "fraction_bits": 36,
            "a": [2**36],
            "b": [2**35],
            "c": [2**34],
            "g0": [2**36],
            "g1": [2**35],
            "n": [1],
        },
        "steps_since_refit": 1,
        "num_refits": 0,
        "memory_state": {
            "a": 0.0,
            "b": [0.0],
            "c": [0.0],
            "rhs": [0.0, 0.0],
            "total": 0.0,
            "counts": [0.0],
            "resets": 0,
        },
    }
    exact(est.state_dict(), expected)
    exact(AcceptanceEstimator.from_state_dict(expected).state_dict(), expected)


def test_python_values_of_other_types_read_as_the_arguments_do() -> None:
    state = RECORDS["vllm_default"]["state"]
    loose = copy.deepcopy(state)
    loose["intercepts"] = np.array(state["intercepts"])  # an array for a list of floats
    loose["num_refits"] = np.int64(state["num_refits"])  # a numpy integer for an int
    loose["config"]["damping"] = 50  # an int for a float
    loose["round_stats"]["n"] = tuple(state["round_stats"]["n"])  # a tuple for a list
    exact(AcceptanceEstimator.from_state_dict(loose).state_dict(), state)


@pytest.mark.parametrize(
    ("path", "value", "error", "text"),
    [
        ((), [1, 2], TypeError, r"^state: expected a dict from state_dict\(\)"),
        (("format",), 3, TypeError, r'^state: \["format"\] must be a string, got int'),
        (("format_version",), 99, ValueError, r"^state: format_version 99 is not supported"),
        (("config", "l2"), True, TypeError, r'^state: \["config"\]\["l2"\] must be a number'),
        (
            ("config", "bins"),
            0,
            ValueError,
            r'^state: \["config"\]\["bins"\] is not a field of format version 1',
        ),
        (("num_refits",), 2.0, TypeError, r'^state: \["num_refits"\] must be an integer'),
        (("round_stats", "n", 0), 2**70, ValueError, r'\["round_stats"\]\["n"\]\[0\]'),
        (("memory_state",), None, TypeError, r'\["memory_state"\] must be a dict, got NoneType'),
        (("slope",), "DEL", ValueError, r'^state: \["slope"\] is missing'),
        (("config", "refit_interval"), 0, ValueError, r"^refit_interval: must be at least 1"),
    ],
)
def test_a_bad_field_is_refused_naming_the_argument_and_its_path(
    path: tuple[str | int, ...], value: Any, error: type[Exception] | None, text: str | None
) -> None:
    state = copy.deepcopy(RECORDS["vllm_default"]["state"])
    broken: Any = state
    if path:
        target = state
        for key in path[:-1]:
            target = target[key]
        if value == "DEL":
            del target[path[-1]]
        elif isinstance(target, dict) and path[-1] not in target:
            target[path[-1]] = value
        else:
            target[path[-1]] = value
    else:
        broken = value
    if error is None:
        AcceptanceEstimator.from_state_dict(broken)
        return
    with pytest.raises(error, match=text):
        AcceptanceEstimator.from_state_dict(broken)


def test_a_self_containing_list_is_refused_not_recursed_forever() -> None:
    state = copy.deepcopy(RECORDS["vllm_default"]["state"])
    loop: list[Any] = []
    loop.append(loop)
    state["intercepts"] = loop
    with pytest.raises(TypeError, match="intercepts"):
        AcceptanceEstimator.from_state_dict(state)


def test_a_state_from_before_the_memory_with_a_huge_k_is_refused_not_allocated() -> None:
    # A version-1 state without `memory`, `drift_z` and `memory_state` reads with an empty
    # memory; at K = 2**40 that memory must not be allocated (it aborted the interpreter).
    state = copy.deepcopy(RECORDS["vllm_default"]["state"])
    assert state["format_version"] == 1
    del state["config"]["memory"], state["config"]["drift_z"], state["memory_state"]
    state["config"]["num_positions"] = 2**40
    with pytest.raises(ValueError, match=r"^num_positions: .*1099511627776"):
        AcceptanceEstimator.from_state_dict(state)
