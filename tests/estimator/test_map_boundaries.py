"""The Python boundary of AcceptanceEstimator and EstimatorConfig under the default map update:
inputs that used to be silently accepted, dropped or refused without naming the argument.

Each case is checked against what the caller wrote (a literal), never against the code under
test: a refused input must raise ValueError/TypeError naming the argument and change nothing,
an accepted one must mean what it says."""

from __future__ import annotations

import collections.abc
import copy
import pickle
import re
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from av_core import AcceptanceEstimator, EstimatorConfig
from av_core._native import ESTIMATOR_DEFAULTS

K = 3


def observed(interval: int = 5, steps: int = 12) -> AcceptanceEstimator:
    """A map estimator with an open round, a memory of past rounds and a reference."""
    rng = np.random.default_rng(0)
    est = AcceptanceEstimator(K, refit_interval=interval)
    for _ in range(steps):
        admitted = rng.integers(0, K + 1, 6)
        accepted = np.array([rng.integers(0, a + 1) for a in admitted])
        est.observe(rng.normal(0.0, 2.0, size=(6, K)), admitted, accepted)
    return est


def changed(state: dict[str, Any], edit: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    out = copy.deepcopy(state)
    edit(out)
    return out


# --- from_state_dict(state, update=...) validates the state it moves ------------------------


def _corrupt_map_states() -> list[tuple[str, Callable[[dict[str, Any]], object], str]]:
    def nan_memory(s: dict[str, Any]) -> None:
        s["memory_state"]["count"][0] = float("nan")

    def impossible_bin(s: dict[str, Any]) -> None:
        s["round_stats"]["accepted"][0] = 5  # of 0 labeled

    def nan_reference(s: dict[str, Any]) -> None:
        s["reference"]["slope"] = float("nan")

    def fitted_beyond_round(s: dict[str, Any]) -> None:
        s["fitted_labels"] = 10**6

    def resets_beyond_refits(s: dict[str, Any]) -> None:
        s["memory_state"]["resets"] = 10**6

    def short_memory(s: dict[str, Any]) -> None:
        s["memory_state"]["count"].pop()

    def steps_past_interval(s: dict[str, Any]) -> None:
        s["steps_since_refit"] = 7  # refit_interval = 5

    return [
        ("nan memory", nan_memory, "memory"),
        ("impossible bin", impossible_bin, "round_stats"),
        ("nan reference", nan_reference, "reference"),
        ("fitted labels", fitted_beyond_round, "fitted_labels"),
        ("resets", resets_beyond_refits, "memory"),
        ("short memory", short_memory, "memory"),
        ("steps", steps_past_interval, "steps_since_refit"),
    ]


@pytest.mark.parametrize(
    ("edit", "argument"),
    [c[1:] for c in _corrupt_map_states()],
    ids=[c[0] for c in _corrupt_map_states()],
)
@pytest.mark.parametrize("update", [None, "map", "vllm"])
def test_a_corrupt_state_is_refused_whatever_update_it_moves_to(
    edit: Callable[[dict[str, Any]], object], argument: str, update: str | None
) -> None:
    # Before: moving to vllm dropped the map parts unread, so any garbage in them loaded.
    state = changed(observed().state_dict(), edit)
    with pytest.raises(ValueError, match=argument):
        AcceptanceEstimator.from_state_dict(state, update=update)


def test_a_corrupt_vllm_state_is_refused_when_moved_to_map() -> None:
    est = AcceptanceEstimator(K, update="vllm", refit_interval=5)
    rng = np.random.default_rng(1)
    for _ in range(7):
        est.observe(rng.normal(size=(4, K)), np.full(4, K), rng.integers(0, K + 1, 4))
    state = changed(est.state_dict(), lambda s: s["memory_state"].__setitem__("a", float("inf")))
    for update in (None, "vllm", "map"):
        with pytest.raises(ValueError, match="memory"):
            AcceptanceEstimator.from_state_dict(state, update=update)


def test_a_valid_state_still_moves_between_updates() -> None:
    est = observed()
    state = est.state_dict()
    x = np.linspace(-4.0, 4.0, 4 * K).reshape(4, K)
    for update in ("map", "vllm"):
        moved = AcceptanceEstimator.from_state_dict(state, update=update)
        assert moved.update == update
        np.testing.assert_array_equal(moved.predict(x), est.predict(x))
    assert AcceptanceEstimator.from_state_dict(state, update="map").state_dict() == state


# --- numpy booleans are booleans, not numbers -------------------------------------------------


@pytest.mark.parametrize("flag", [np.True_, np.False_])
@pytest.mark.parametrize("field", ["l2", "damping", "memory", "init_intercept", "max_step"])
def test_a_numpy_bool_is_refused_for_a_float_parameter(flag: Any, field: str) -> None:
    # Before: np.True_ was taken as 1.0 and np.False_ as 0.0 (a Python bool is refused).
    with pytest.raises(TypeError, match=rf"{field}: must be a number, got bool"):
        AcceptanceEstimator(K, **{field: flag})
    with pytest.raises(TypeError, match=rf'\["{field}"\] must be a number, got bool'):
        EstimatorConfig.from_dict({"num_positions": K, field: flag})


def test_a_numpy_bool_is_refused_by_set_regularization_and_changes_nothing() -> None:
    est = observed()
    before = pickle.dumps(est.state_dict())
    with pytest.raises(TypeError, match="l2: must be a number, got bool"):
        est.set_regularization(l2=np.True_, damping=1.0)
    with pytest.raises(TypeError, match="damping: must be a number, got bool"):
        est.set_regularization(l2=0.5, damping=np.False_)
    assert pickle.dumps(est.state_dict()) == before


def test_a_numpy_bool_in_a_state_is_refused_as_a_bool() -> None:
    state = observed().state_dict()
    for edit, where in [
        (lambda s: s["intercepts"].__setitem__(0, np.True_), r'\["intercepts"\]\[0\]'),
        (lambda s: s.__setitem__("slope", np.False_), r'\["slope"\]'),
        (lambda s: s.__setitem__("num_refits", np.True_), r'\["num_refits"\]'),
    ]:
        with pytest.raises(TypeError, match=where + r".* got bool"):
            AcceptanceEstimator.from_state_dict(changed(state, edit))


def test_numpy_numbers_in_a_state_still_load() -> None:
    state = observed().state_dict()
    as_numpy = changed(
        state,
        lambda s: (
            s.__setitem__("intercepts", np.array(s["intercepts"])),
            s.__setitem__("num_refits", np.int64(s["num_refits"])),
            s["round_stats"].__setitem__("count", np.array(s["round_stats"]["count"], np.uint64)),
        ),
    )
    assert AcceptanceEstimator.from_state_dict(as_numpy).state_dict() == state


# --- bytes are not lists of numbers -----------------------------------------------------------


def test_bytes_are_not_read_as_a_list_of_small_ints() -> None:
    # Before: b"\x01\x02\x03" loaded as the intercepts [1.0, 2.0, 3.0].
    state = changed(observed().state_dict(), lambda s: s.__setitem__("intercepts", b"\x01\x02\x03"))
    with pytest.raises(TypeError, match=r'\["intercepts"\] must be a list, got bytes'):
        AcceptanceEstimator.from_state_dict(state)
    state = changed(state, lambda s: s.__setitem__("intercepts", bytearray(b"\x01\x02\x03")))
    with pytest.raises(TypeError, match=r'\["intercepts"\] must be a list, got bytearray'):
        AcceptanceEstimator.from_state_dict(state)


# --- dict keys: every key is read or refused ---------------------------------------------------


@pytest.mark.parametrize("key", [b"l2", 1, 2.5, None, ("l2",)])
def test_from_dict_refuses_a_key_that_is_not_a_string(key: Any) -> None:
    # Before: the entry was dropped, so {b"l2": 5.0} built a config with the default l2.
    with pytest.raises(TypeError, match=rf"fields: .*key {re.escape(repr(key))}"):
        EstimatorConfig.from_dict({"num_positions": K, key: 5.0})


def test_a_key_that_is_not_a_string_is_refused_in_states_and_round_stats() -> None:
    est = observed()
    state = est.state_dict()
    with pytest.raises(TypeError, match=r'state: \["config"\]: key b\'l2\''):
        AcceptanceEstimator.from_state_dict(
            changed(state, lambda s: s["config"].__setitem__(b"l2", 1.0))
        )
    before = pickle.dumps(state)
    with pytest.raises(TypeError, match=r"round_stats: key 7"):
        est.add_round_stats({**state["round_stats"], 7: 1})
    assert pickle.dumps(est.state_dict()) == before


def test_a_key_that_is_not_utf8_is_a_value_error_naming_the_argument() -> None:
    # Before: UnicodeEncodeError, naming nothing.
    with pytest.raises(ValueError, match=r"fields: key '\\udcff' is not valid UTF-8"):
        EstimatorConfig.from_dict({"num_positions": K, "\udcff": 1})


# --- any Mapping reads as a dict ---------------------------------------------------------------


class ReadOnly(collections.abc.Mapping[str, Any]):
    def __init__(self, items: dict[str, Any]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def test_from_dict_reads_any_mapping_and_a_config() -> None:
    # Before: a mappingproxy was refused, and a Mapping or an EstimatorConfig was refused as a
    # "list" (their keys).
    config = AcceptanceEstimator(K, l2=0.25, bins=32, refit_interval=None).config
    fields = config.to_dict()
    assert EstimatorConfig.from_dict(types.MappingProxyType(fields)) == config
    assert EstimatorConfig.from_dict(ReadOnly(fields)) == config
    assert EstimatorConfig.from_dict(config) == config
    proxy = types.MappingProxyType({"num_positions": K, "l2": 0.25})
    assert EstimatorConfig.from_dict(proxy).l2 == 0.25
    # ESTIMATOR_DEFAULTS is a read-only mapping without num_positions.
    with pytest.raises(ValueError, match=r'fields: \["num_positions"\] is missing'):
        EstimatorConfig.from_dict(ESTIMATOR_DEFAULTS)
    with pytest.raises(ValueError, match=r'fields: \["l3"\] is not a field'):
        EstimatorConfig.from_dict(ReadOnly({"num_positions": K, "l3": 1.0}))


def test_a_state_in_read_only_mappings_loads() -> None:
    state = observed().state_dict()
    frozen = types.MappingProxyType(
        {k: types.MappingProxyType(v) if isinstance(v, dict) else v for k, v in state.items()}
    )
    assert AcceptanceEstimator.from_state_dict(frozen).state_dict() == state


# --- from_bytes takes any bytes-like object -----------------------------------------------------


def test_from_bytes_reads_bytes_like_objects_and_names_data_otherwise() -> None:
    est = observed()
    data = est.to_bytes()
    state = est.state_dict()
    for like in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert AcceptanceEstimator.from_bytes(like).state_dict() == state
    for wrong in ("text", None, list(data), 3):
        with pytest.raises(TypeError, match=r"^data: expected bytes"):
            AcceptanceEstimator.from_bytes(wrong)


# --- boolean keywords are named in the message ---------------------------------------------------


def test_boolean_keywords_refuse_non_booleans_naming_the_argument() -> None:
    # Before: "'int' object is not an instance of 'bool'" (the name only in a note).
    est = observed()
    before = pickle.dumps(est.state_dict())
    x, admitted, accepted = np.zeros((1, K)), [1], [0]
    with pytest.raises(TypeError, match=r"^count_step: must be a bool, got int \(1\)$"):
        est.observe(x, admitted, accepted, count_step=1)
    with pytest.raises(TypeError, match=r"^report: must be a bool, got NoneType \(None\)$"):
        est.refit(report=None)
    with pytest.raises(TypeError, match=r"^end_round: must be a bool, got str \('no'\)$"):
        est.refit(end_round="no")
    assert pickle.dumps(est.state_dict()) == before
    # numpy booleans are booleans.
    assert est.refit(report=np.False_, end_round=np.False_) is None
    est.observe(x, admitted, accepted, count_step=np.False_)
