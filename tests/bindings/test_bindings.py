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
from av_core import (
    AcceptanceEstimator,
    CostTables,
    Error,
    InvalidTypeError,
    InvalidValueError,
    StateError,
    VerificationPlanner,
    _native,
)

ROOT = Path(__file__).resolve().parents[2]


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
        (lambda e: e.predict(np.zeros((2, 3), np.float32)), InvalidValueError, "features"),
        (lambda e: e.predict(np.zeros((2, 4), np.float16)), InvalidTypeError, "features"),
        (lambda e: e.predict(np.zeros((2, 4), np.int64)), InvalidTypeError, "features"),
        (lambda e: e.predict([["a", "b", "c", "d"]]), InvalidTypeError, "features"),
        (lambda e: e.observe(np.zeros((1, 4)), [5], [0]), InvalidValueError, "num_admitted"),
        (lambda e: e.observe(np.zeros((1, 4)), [1.0], [0]), InvalidTypeError, "num_admitted"),
        (lambda e: e.observe(np.zeros((1, 4)), [2], [-1]), InvalidValueError, "num_accepted"),
        (
            lambda e: e.observe(np.zeros((1, 4)), [2], [1], [[2.0] * 4]),
            InvalidValueError,
            "predictions",
        ),
        # Each error kind has its own class, under av_core.Error and the builtin ValueError or
        # TypeError (the core's error kind, not its text); corrupt state has StateError.
        (lambda e: AcceptanceEstimator.from_bytes(b"junk"), StateError, "data"),
        (lambda e: AcceptanceEstimator(0), InvalidValueError, "num_positions"),
        (lambda e: AcceptanceEstimator(4, memory=1.5), InvalidValueError, "memory"),
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
    assert isinstance(raised.value, Error) and isinstance(raised.value, ValueError | TypeError)
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


def test_each_error_kind_has_its_value_error_subclass(tmp_path: Path) -> None:
    """The core's error kinds map to exception classes, never through the message: corrupt state
    is a StateError, a missing or mismatched draft-depth table a DepthTableError, an argument
    too large to copy an OutOfMemoryError; all are InvalidValueErrors (so ValueErrors and
    av_core.Errors) naming the argument."""
    from av_core import DepthTableError, OutOfMemoryError, choose_draft_depth

    for cls in (StateError, DepthTableError, OutOfMemoryError, av_core.BufferChangedError):
        assert issubclass(cls, InvalidValueError) and cls.__module__ == "av_core._native"
    cases: list[tuple[Any, type[Exception], str]] = [
        (lambda: VerificationPlanner.from_bytes(b"junk"), StateError, "data"),
        (lambda: CostTables.from_json('{"draft_ms": [0]} trailing'), StateError, "json"),
        (
            lambda: VerificationPlanner.from_bytes(AcceptanceEstimator(2).to_bytes()),
            StateError,
            "data",
        ),
    ]
    tables = CostTables([0.0, 1.0, 1.0], [1.0] * 16)
    step = {"num_non_draft_tokens": 2, "num_sampling_requests": 2}
    conf = np.full((2, 3), 0.5)
    cases.append(
        (
            lambda: choose_draft_depth(conf, [3, 3], cost_tables=tables, **step),
            DepthTableError,
            "cost_tables",
        )
    )
    shallow = tables.with_draft_depth("parallel", max_depth=2)
    cases.append(
        (
            lambda: choose_draft_depth(conf, [3, 3], cost_tables=shallow, **step),
            DepthTableError,
            "cost_tables",
        )
    )
    planner = VerificationPlanner(tables, 3, num_slots=4)
    cases.append(
        (lambda: planner.choose_draft_depth([0, 1], [3, 3], **step), DepthTableError, "cost_tables")
    )
    bad = tmp_path / "bad.avp"
    bad.write_bytes(planner.to_bytes()[:-1])
    cases.append((lambda: VerificationPlanner.load(bad), StateError, "path"))
    # The same call with a value error of the plain kind is a plain InvalidValueError.
    cases.append(
        (
            lambda: choose_draft_depth(
                conf, [3, 9], cost_tables=shallow.with_draft_depth("parallel", max_depth=3), **step
            ),
            InvalidValueError,
            "max_depths",
        )
    )
    for call, expected, argument in cases:
        with pytest.raises(ValueError) as raised:
            call()
        assert type(raised.value) is expected, (expected, raised.value)
        assert str(raised.value).startswith(argument), str(raised.value)


def test_every_stateful_type_pickles_copies_saves_and_loads_through_the_core(
    tmp_path: Path,
) -> None:
    """Planner and cost tables derive to_bytes/from_bytes, save/load and pickling from the
    core's persistence: each way gives back exactly the same state, and the clone continues
    exactly like the original."""
    tables = CostTables.from_curves(
        [(1, 0.4), (4, 0.9)],
        [(1, 6.0), (16, 6.5), (64, 9.0)],
        max_num_reqs=8,
        max_batch_tokens=64,
        cudagraph_limit=16,
    ).with_draft_depth("autoregressive", max_depth=3)
    for clone in (
        pickle.loads(pickle.dumps(tables)),
        copy.copy(tables),
        copy.deepcopy(tables),
        CostTables.from_bytes(tables.to_bytes()),
    ):
        assert clone == tables and clone.to_json() == tables.to_json()
    tables.save(tmp_path / "tables.avt")
    assert CostTables.load(tmp_path / "tables.avt") == tables
    assert tables.to_bytes()[:8] == b"AVCORE\0C"

    planner = VerificationPlanner(tables, 3, num_slots=4, exploration=0.4, exploration_seed=9)
    step = {"num_non_draft_tokens": 2, "num_sampling_requests": 2}
    rng = np.random.default_rng(3)
    planner.plan([0, 2], rng.uniform(0.2, 0.9, (2, 3)), [3, 2], **step)
    planner.save(tmp_path / "planner.avp")
    clones = [
        pickle.loads(pickle.dumps(planner)),
        copy.deepcopy(planner),
        VerificationPlanner.load(tmp_path / "planner.avp"),
    ]
    for clone in clones:
        assert clone.to_bytes() == planner.to_bytes()
        assert clone.exploration == 0.4 and clone.cost_tables == tables
    for _ in range(4):
        conf = rng.uniform(0.05, 0.95, (2, 3))
        plans = [p.plan([1, 2], conf, [3, 3], **step) for p in [planner, *clones]]
        depths = [p.choose_draft_depth([1, 2], [3, 3], **step) for p in [planner, *clones]]
        for plan, depth in zip(plans[1:], depths[1:], strict=True):
            assert plan.budget == plans[0].budget
            np.testing.assert_array_equal(plan.admitted, plans[0].admitted)
            np.testing.assert_array_equal(depth.depths, depths[0].depths)
    assert len({p.to_bytes() for p in [planner, *clones]}) == 1
