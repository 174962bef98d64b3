"""The PyO3 bindings' own logic (``rust/src``): what they convert and map, not the core's math.

Each test targets one job the binding crate does and the core does not: 128-bit fixed-point
sums crossing into Python ints and back, the dtype dispatch tables (every accepted combination
must reach the core as the same numbers), the error mapping (core value errors to
``ValueError``, type errors to ``TypeError``, file errors to ``OSError`` naming the path, never
a ``PanicException``), pickling and copying, and the module's version.
"""

from __future__ import annotations

import copy
import pickle
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import av_core
from av_core import AcceptanceEstimator, CostTables, VerificationPlanner, _native

ROOT = Path(__file__).resolve().parents[1]


def test_module_version_is_the_crate_version() -> None:
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())
    assert _native.__version__ == workspace["workspace"]["package"]["version"]
    assert av_core.__version__ == _native.__version__


def test_statistics_beyond_64_bits_cross_the_boundary_exactly() -> None:
    """Σ w x² at x = 40 (clamped), p = 1/2 is 400 per observation, 400·2**36 units: after
    400,000 observations the sum is past 2**63 units. state_dict must hand it to Python as the
    exact integer, and from_state_dict must read it back into the core's i128 unchanged."""
    est = AcceptanceEstimator(1, refit_interval=2**62, update="vllm")  # its IRLS moments
    rows = 100_000
    x = np.full((rows, 1), 100.0, dtype=np.float32)  # clamped to max_log_odds = 40
    p = np.full((rows, 1), 0.5, dtype=np.float32)
    for _ in range(4):
        est.observe(x, np.ones(rows, np.int64), np.ones(rows, np.int64), p)
    state = est.state_dict()
    stats = state["round_stats"]
    units = 2 ** stats["fraction_bits"]
    a = stats["a"][0]
    assert isinstance(a, int)
    assert a == 4 * rows * 400 * units  # every term is exact in fixed point
    assert a > 2**63
    assert stats["c"][0] == 4 * rows * units // 4 and stats["n"][0] == 4 * rows
    back = AcceptanceEstimator.from_state_dict(state)
    assert back.state_dict() == state
    assert back.to_bytes() == est.to_bytes()


FLOATS = [np.float32, np.float64]
COUNTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("features_dtype", FLOATS)
@pytest.mark.parametrize("predictions_dtype", [*FLOATS, None])
@pytest.mark.parametrize("counts_dtype", COUNTS)
def test_every_dtype_combination_reaches_the_core_as_the_same_numbers(
    features_dtype: Any, predictions_dtype: Any, counts_dtype: Any
) -> None:
    """Values exact in every dtype (binary fractions, small counts): whatever the dtypes, the
    statistics, the refit and the predictions equal those of the float64/int64 call."""
    rng = np.random.default_rng(5)
    x = rng.integers(-64, 64, size=(16, 4)) / 8
    p = rng.integers(1, 16, size=(16, 4)) / 16
    admitted = rng.integers(0, 5, size=16)
    accepted = np.minimum(admitted, rng.integers(0, 5, size=16))
    reference = AcceptanceEstimator(4, refit_interval=2**62)
    reference.observe(x, admitted, accepted, p if predictions_dtype is not None else None)
    est = AcceptanceEstimator(4, refit_interval=2**62)
    est.observe(
        x.astype(features_dtype),
        admitted.astype(counts_dtype),
        accepted.astype(counts_dtype),
        None if predictions_dtype is None else p.astype(predictions_dtype),
    )
    assert est.state_dict() == reference.state_dict()
    reference.refit()
    est.refit()
    assert est.to_bytes() == reference.to_bytes()
    np.testing.assert_array_equal(est.predict(x.astype(features_dtype)), reference.predict(x))


@pytest.mark.parametrize(
    ("call", "error", "argument"),
    [
        (lambda e: e.predict(np.zeros((2, 3), np.float32)), ValueError, "features"),
        (lambda e: e.predict(np.zeros((2, 4), np.float16)), TypeError, "features"),
        (lambda e: e.predict(np.zeros((2, 4), np.int64)), TypeError, "features"),
        (lambda e: e.predict([["a", "b", "c", "d"]]), TypeError, "features"),
        (lambda e: e.observe(np.zeros((1, 4)), [5], [0]), ValueError, "num_admitted"),
        (lambda e: e.observe(np.zeros((1, 4)), [1.0], [0]), TypeError, "num_admitted"),
        (lambda e: e.observe(np.zeros((1, 4)), [2], [-1]), ValueError, "num_accepted"),
        (lambda e: e.observe(np.zeros((1, 4)), [2], [1], [[2.0] * 4]), ValueError, "predictions"),
        (lambda e: AcceptanceEstimator.from_bytes(b"junk"), ValueError, "data"),
        (lambda e: AcceptanceEstimator(0), ValueError, "num_positions"),
        (lambda e: AcceptanceEstimator(4, memory=1.5), ValueError, "memory"),
    ],
)
def test_core_errors_map_to_python_exceptions_naming_the_argument(
    call: Any, error: type[Exception], argument: str
) -> None:
    est = AcceptanceEstimator(4)
    before = est.to_bytes()
    with pytest.raises(error) as raised:
        call(est)
    assert type(raised.value) is error  # not a subclass: in particular never PanicException
    assert str(raised.value).startswith(argument), str(raised.value)
    assert est.to_bytes() == before


def test_file_errors_are_os_errors_naming_the_path(tmp_path: Path) -> None:
    est = AcceptanceEstimator(2)
    missing = tmp_path / "missing" / "state.avc"
    with pytest.raises(OSError, match="path") as raised:
        est.save(missing)
    assert str(missing) in str(raised.value)
    with pytest.raises(OSError) as raised:
        AcceptanceEstimator.load(tmp_path / "nothing.avc")
    assert "nothing.avc" in str(raised.value)
    est.save(str(tmp_path / "state.avc"))  # str and PathLike paths both convert
    assert AcceptanceEstimator.load(tmp_path / "state.avc").to_bytes() == est.to_bytes()


def test_pickle_and_copy_go_through_the_bindings_state_conversion() -> None:
    est = AcceptanceEstimator(3, memory=0.8, refit_interval=2)
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    for _ in range(5):
        est.observe(x, [3, 1], [2, 0])
    for clone in (pickle.loads(pickle.dumps(est)), copy.deepcopy(est)):
        assert clone.to_bytes() == est.to_bytes()
    tables = CostTables([0.0, 1.0, 1.5], [2.0] * 9)
    assert pickle.loads(pickle.dumps(tables)) == tables
    planner = VerificationPlanner(tables, 3, num_slots=2)
    twin = planner.copy()
    twin.plan([0], np.full((1, 3), 0.25), [3], num_non_draft_tokens=1, num_sampling_requests=1)
    np.testing.assert_array_equal(planner.previous_confidences(0), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(twin.previous_confidences(0), [0.25, 0.25, 0.25])
    assert VerificationPlanner.from_bytes(twin.to_bytes()).to_bytes() == twin.to_bytes()
