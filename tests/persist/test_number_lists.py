"""Lists of numbers in a ``state_dict`` (the histograms' columns, the coefficients, the memory)
read in one pass, and keep every rule of reading item by item: a bool (numpy's too) is never a
number, an int beyond the column's range or a float in an integer column is refused naming the
argument, the item's path and the value, a non-finite float reaches the state's validation, and
any Python form of the same numbers (tuple, numpy array, numpy scalars, ints in a float column)
reads as the list does. The expected messages are those the item-by-item reader gave."""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import numpy as np
import pytest

from av_core import AcceptanceEstimator


def observed() -> AcceptanceEstimator:
    """A map estimator of K = 3 and 4 bins with a refit behind it and an open round."""
    rng = np.random.default_rng(3)
    est = AcceptanceEstimator(3, update="map", bins=4, refit_interval=4)
    for _ in range(6):
        x = rng.normal(1.0, 2.0, size=(8, 3)).astype(np.float32)
        admitted = rng.integers(0, 4, size=8)
        accepted = np.array([rng.integers(0, a + 1) for a in admitted])
        est.observe(x, admitted, accepted)
    return est


STATE = observed().state_dict()


def edited(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``STATE`` with ``value`` at ``path``."""
    out = copy.deepcopy(STATE)
    target: Any = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def test_the_state_holds_lists_of_both_kinds_with_data() -> None:
    counts, memory = STATE["round_stats"]["count"], STATE["memory_state"]["count"]
    assert len(counts) == 12 and all(type(v) is int for v in counts) and any(counts)
    assert len(memory) == 12 and all(type(v) is float for v in memory) and any(memory)


@pytest.mark.parametrize(
    "form",
    [
        tuple,
        np.array,
        lambda values: [np.float64(v) if isinstance(v, float) else np.int64(v) for v in values],
        lambda values: np.array(
            values, dtype=np.float64 if isinstance(values[0], float) else np.uint64
        ),
    ],
    ids=["tuple", "array", "numpy scalars", "typed array"],
)
def test_any_python_form_of_the_numbers_reads_as_the_list(form: Any) -> None:
    loose = copy.deepcopy(STATE)
    for part, column in [
        ("round_stats", "count"),
        ("memory_state", "x_sum"),
        ("reference", "intercepts"),
    ]:
        loose[part][column] = form(STATE[part][column])
    loose["intercepts"] = [int(v) if v == int(v) else v for v in [0.0, *STATE["intercepts"][1:]]]
    restored = AcceptanceEstimator.from_state_dict(loose).state_dict()
    expected = copy.deepcopy(STATE)
    expected["intercepts"] = [0.0, *STATE["intercepts"][1:]]
    assert restored == expected
    for part, column in [("round_stats", "count"), ("memory_state", "x_sum")]:
        assert [type(v) for v in restored[part][column]] == [type(v) for v in STATE[part][column]]


INTEGER, NUMBER = "must be an integer", "must be a number"
RANGE = "must be an integer in 0..=18446744073709551615"

#: (path of the bad item, the item, the error, the message after the item's path).
BAD_ITEMS = [
    (("round_stats", "count", 5), True, TypeError, rf"{INTEGER}, got bool \(True\)"),
    (("round_stats", "count", 0), np.False_, TypeError, rf"{INTEGER}, got bool \(False\)"),
    (("memory_state", "count", 11), True, TypeError, rf"{NUMBER}, got bool \(True\)"),
    (("memory_state", "count", 5), np.True_, TypeError, rf"{NUMBER}, got bool \(True\)"),
    (("intercepts", 2), False, TypeError, rf"{NUMBER}, got bool \(False\)"),
    (("round_stats", "count", 3), 2**64, ValueError, rf"{RANGE}, got {2**64}"),
    (("round_stats", "count", 3), -1, ValueError, rf"{RANGE}, got -1"),
    (
        ("round_stats", "count", 3),
        2**200,
        TypeError,
        rf"{INTEGER}, got float \(16069380442589903\d+\)",
    ),
    (("round_stats", "count", 3), 1.0, TypeError, rf"{INTEGER}, got float \(1.0\)"),
    (("round_stats", "count", 3), "1", TypeError, rf'{INTEGER}, got str \("1"\)'),
    (("round_stats", "count", 3), None, TypeError, rf"{INTEGER}, got None"),
]


@pytest.mark.parametrize(("path", "value", "error", "text"), BAD_ITEMS)
def test_a_bad_number_in_a_list_is_refused_naming_its_path_and_value(
    path: tuple[str | int, ...], value: Any, error: type[Exception], text: str
) -> None:
    at = "".join(f'["{step}"]' if isinstance(step, str) else f"[{step}]" for step in path)
    with pytest.raises(error) as caught:
        AcceptanceEstimator.from_state_dict(edited(path, value))
    assert re.fullmatch(re.escape(f"state: {at} ") + text, str(caught.value))


@pytest.mark.parametrize(
    ("path", "value", "error", "text"),
    [
        (
            ("memory_state", "count"),
            np.ones(12, bool),
            TypeError,
            r'\["count"\]\[0\] must be a number, got bool',
        ),
        (
            ("memory_state", "count", 5),
            float("nan"),
            ValueError,
            r"^memory: position 1, bin 1: must be finite",
        ),
        (
            ("memory_state", "count", 5),
            -math.inf,
            ValueError,
            r"^memory: position 1, bin 1: must be finite",
        ),
        (
            ("round_stats", "count"),
            [0] * 11,
            ValueError,
            r"^round_stats: .*\(11, 12 and 12 entries\)$",
        ),
    ],
)
def test_a_bad_list_is_refused_by_the_reader_or_the_states_validation(
    path: tuple[str | int, ...], value: Any, error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text):
        AcceptanceEstimator.from_state_dict(edited(path, value))


@pytest.mark.parametrize(
    ("path", "value", "text"),
    [
        (("round_stats", 7), 1, r'^state: \["round_stats"\]: key 7 \(int\) is not a str'),
        (
            ("intercepts",),
            [0.0, {1: 2}],
            r'^state: \["intercepts"\]\[1\]: key 1 \(int\) is not a str',
        ),
        (
            ("config",),
            {"a": {(1,): 0}},
            r'^state: \["config"\]\["a"\]: key \(1,\) \(tuple\) is not a str',
        ),
        ((b"k",), 0, r"^state: key b'k' \(bytes\) is not a str"),
    ],
)
def test_a_key_that_is_not_a_str_is_refused_naming_its_path(
    path: tuple[Any, ...], value: Any, text: str
) -> None:
    with pytest.raises(TypeError, match=text):
        AcceptanceEstimator.from_state_dict(edited(path, value))
