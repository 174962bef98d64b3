"""Every native entry point at its boundaries, as general properties.

* Layouts: any memory layout of an argument (Fortran order, transposed storage, negative
  strides, non-contiguous slices, misaligned buffers, Python lists, CPU torch ``.t()`` and
  strided views) gives exactly what its C-contiguous copy gives: the same result and the same
  state afterwards, or the same ValueError/TypeError.
* Buffers written by another thread during a call: whatever the interleaving, a call returns a
  result within its contract or raises ValueError/TypeError; it never raises PanicException (or
  any other BaseException), and it never lets a value it did not validate into the state.
* Sizes: no size an argument implies is allocated before it is checked (run under an address-
  space limit, so an attempt aborts the child process instead of the machine).
* Concurrent saves: any number of threads and processes saving to one path, killed at any
  moment, leave either the old file or one complete new one; ``load`` refuses what is not a
  regular file, and what is longer than any state.
* The refit schedule: after any number of threads observing at once, ``num_refits`` and
  ``steps_since_refit`` are what a serial run of the same calls gives.
* Integers and floats: out-of-range values are ValueErrors naming the argument and the value, a
  bool is not a number (TypeError), an empty list is accepted wherever an empty array is.
* State: ``from_state_dict`` refuses statistics no sequence of observations can produce.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from av_core import (
    AcceptanceEstimator,
    CostTables,
    Error,
    VerificationPlanner,
    _native,
    assign_draft_budget,
    choose_draft_budget,
    choose_draft_depth,
    plan_verification,
)

K = 3
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- layouts -----------------------------------------------------------------------------------

NUMPY_LAYOUTS = ["C", "F", "transposed", "reversed", "strided", "misaligned", "broadcast", "list"]
TORCH_LAYOUTS = ["torch", "torch_t", "torch_strided"]
TORCH_DTYPES = [np.dtype(t) for t in ("float32", "float64", "int64", "int32", "int16", "bool")]


def relayout(a: np.ndarray, layout: str) -> Any:
    """The values of `a` (same shape and dtype) in another memory layout."""
    a = np.ascontiguousarray(a)
    every = (slice(None, None, -1),) * a.ndim
    if layout == "C":
        return a.copy()
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "transposed":  # stored transposed: F-like strides, including for 1-D
        return np.ascontiguousarray(a.T).T
    if layout == "reversed":  # negative strides on every axis
        return np.ascontiguousarray(a[every])[every]
    if layout == "strided":  # every other element of a larger buffer
        big = np.zeros(tuple(2 * n + 1 for n in a.shape), a.dtype)
        view = big[(slice(1, None, 2),) * a.ndim]
        view[...] = a
        return view
    if layout == "misaligned":  # one byte past an aligned address
        raw = np.zeros(a.nbytes + 1, np.uint8)
        view = raw[1:].view(a.dtype).reshape(a.shape)
        view[...] = a
        return view
    if layout == "broadcast":  # zero strides where the rows repeat, else a read-only view
        if a.ndim >= 1 and a.shape[0] > 1 and (a == a[:1]).all():
            return np.broadcast_to(a[:1], a.shape)
        view = a.copy()
        view.setflags(write=False)
        return view
    if layout == "list":
        return a.tolist()
    torch = pytest.importorskip("torch")
    if a.dtype not in TORCH_DTYPES:  # a dtype torch does not hold as it is
        return a.copy()
    if layout == "torch":
        return torch.from_numpy(a.copy())
    if layout == "torch_t":
        if a.ndim != 2:
            return torch.from_numpy(a.copy())
        return torch.from_numpy(np.ascontiguousarray(a.T)).t()
    if layout == "torch_strided":
        big = torch.zeros(tuple(2 * n for n in a.shape), dtype=torch.from_numpy(a[:0]).dtype)
        view = big[(slice(None, None, 2),) * a.ndim]
        view.copy_(torch.from_numpy(a.copy()))
        return view
    raise AssertionError(layout)


def normalize(value: Any) -> Any:
    """A comparable form of a native result: arrays by dtype, shape and bits; plans by field."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, np.ascontiguousarray(value).tobytes())
    if isinstance(value, float):
        return ("float", value.hex() if not math.isnan(value) else "nan")
    if isinstance(value, _native.VerificationPlan | _native.DepthPlan):
        fields = [
            "budget",
            "admitted",
            "depths",
            "max_depth",
            "drafts",
            "expected_accepted_tokens",
            "predicted_cost_ms",
        ]
        return tuple(
            (name, normalize(getattr(value, name))) for name in fields if hasattr(value, name)
        )
    if isinstance(value, list | tuple):
        return tuple(normalize(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, normalize(v)) for k, v in sorted(value.items()))
    return value


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """("ok", result) or ("error", type, message); anything but ValueError/TypeError fails, and
    so does one that is not also an av_core.Error."""
    try:
        return ("ok", normalize(call()))
    except (ValueError, TypeError) as error:
        assert str(error), "an error must say what went wrong"
        assert isinstance(error, Error), f"{type(error).__name__} is no av_core.Error: {error}"
        return ("error", type(error).__name__, str(error))


layouts = st.sampled_from(NUMPY_LAYOUTS + TORCH_LAYOUTS)
float_dtypes = st.sampled_from([np.float32, np.float64, np.dtype(">f8")])
int_dtypes = st.sampled_from([np.int64, np.int32, np.int16, np.uint8, np.uint64, np.dtype(">i8")])


@st.composite
def matrices(draw: Any, rows: int, cols: int, low: float, high: float) -> np.ndarray:
    """A [rows, cols] float matrix of mostly valid values, sometimes one bad value, sometimes all
    rows alike (so the broadcast layout has zero strides)."""
    values = draw(st.lists(st.floats(low, high), min_size=rows * cols, max_size=rows * cols))
    a = np.array(values, np.float64).reshape(rows, cols)
    if rows > 1 and draw(st.booleans()):
        a[:] = a[:1]
    if a.size and draw(st.integers(0, 9)) == 0:
        a.flat[draw(st.integers(0, a.size - 1))] = draw(st.sampled_from([np.nan, np.inf, 2.0]))
    return a.astype(draw(float_dtypes))


@st.composite
def counts(draw: Any, rows: int, high: int) -> np.ndarray:
    values = draw(st.lists(st.integers(0, high), min_size=rows, max_size=rows))
    return np.array(values, np.int64).astype(draw(int_dtypes))


def tables(depth: bool) -> CostTables:
    verify = [1.0 + 0.05 * t for t in range(64)]
    base = CostTables([0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2], verify)
    return base.with_draft_depth("autoregressive", max_depth=K) if depth else base


def same_on_every_layout(
    draw: Any, arrays: dict[str, np.ndarray], call: Callable[[dict[str, Any]], Any]
) -> None:
    """`call` on the C-contiguous arrays and on each drawn to another layout: same outcome."""
    expected = outcome(lambda: call({name: relayout(a, "C") for name, a in arrays.items()}))
    chosen = {name: draw(layouts) for name in arrays}
    moved = {name: relayout(a, chosen[name]) for name, a in arrays.items()}
    got = outcome(lambda: call(moved))
    assert got == expected, f"layouts {chosen}"


@SETTINGS
@given(data=st.data(), rows=st.integers(0, 5))
def test_estimator_calls_give_the_contiguous_answer_on_every_layout(data: Any, rows: int) -> None:
    arrays = {
        "features": data.draw(matrices(rows, K, -60, 60)),
        "admitted": data.draw(counts(rows, K)),
        "accepted": data.draw(counts(rows, K)),
        "predictions": data.draw(matrices(rows, K, 0, 1)),
    }

    def observe_then_predict(a: dict[str, Any]) -> Any:
        est = AcceptanceEstimator(K, refit_interval=2)
        est.observe(np.ones((1, K)), [K], [1])
        result = outcome(
            lambda: est.observe(a["features"], a["admitted"], a["accepted"], a["predictions"])
        )
        return result, outcome(lambda: est.predict(a["features"])), normalize(est.state_dict())

    same_on_every_layout(data.draw, arrays, observe_then_predict)


@SETTINGS
@given(data=st.data(), rows=st.integers(0, 5), depth=st.booleans())
def test_planning_functions_give_the_contiguous_answer_on_every_layout(
    data: Any, rows: int, depth: bool
) -> None:
    t = tables(depth)
    arrays = {
        "confidences": data.draw(matrices(rows, K, 0, 1)),
        "previous": data.draw(matrices(rows, K, 0, 1)),
        "scheduled": data.draw(counts(rows, K)),
    }
    budget = data.draw(st.integers(0, 3 * K))
    step = {"num_non_draft_tokens": rows, "num_sampling_requests": rows, "cost_tables": t}

    def every_function(a: dict[str, Any]) -> Any:
        conf, prev, sched = a["confidences"], a["previous"], a["scheduled"]
        return (
            outcome(lambda: assign_draft_budget(conf, sched, budget)),
            outcome(lambda: choose_draft_budget(conf, sched, **step)),
            outcome(lambda: plan_verification(conf, sched, **step)),
            outcome(lambda: plan_verification(conf, sched, budget_confidences=prev, **step)),
            outcome(lambda: choose_draft_depth(conf, sched, **step)),
            outcome(lambda: choose_draft_depth(conf, sched, mode="per_request", **step)),
        )

    same_on_every_layout(data.draw, arrays, every_function)


@SETTINGS
@given(data=st.data(), rows=st.integers(0, 4), depth=st.booleans())
def test_the_planner_gives_the_contiguous_answer_on_every_layout(
    data: Any, rows: int, depth: bool
) -> None:
    slots = data.draw(st.lists(st.integers(0, 7), min_size=rows, max_size=rows, unique=True))
    arrays = {
        "slots": np.array(slots, np.int64).astype(data.draw(int_dtypes)),
        "confidences": data.draw(matrices(rows, K, 0, 1)),
        "scheduled": data.draw(counts(rows, K)),
    }
    step = {"num_non_draft_tokens": rows, "num_sampling_requests": rows}

    def plan_remember_depth(a: dict[str, Any]) -> Any:
        planner = VerificationPlanner(tables(depth), K, num_slots=8, exploration=0.3)
        slots, conf, sched = a["slots"], a["confidences"], a["scheduled"]
        results = (
            outcome(lambda: planner.plan(slots, conf, sched, **step)),
            outcome(lambda: planner.remember(slots, conf, sched)),
            outcome(lambda: planner.choose_draft_depth(slots, sched, **step)),
        )
        return results, planner.to_bytes()

    same_on_every_layout(data.draw, arrays, plan_remember_depth)


@SETTINGS
@given(data=st.data(), size=st.integers(0, 6), depth=st.integers(1, 4))
def test_cost_tables_give_the_contiguous_answer_on_every_layout(
    data: Any, size: int, depth: int
) -> None:
    sizes = sorted(data.draw(st.sets(st.integers(0, 40), min_size=size, max_size=size)))
    costs = data.draw(st.lists(st.floats(-1, 50), min_size=size, max_size=size))
    curve = np.array([sizes, costs], np.float64).T.reshape(size, 2)
    arrays = {
        "curve": curve.astype(data.draw(float_dtypes)),
        "draft": np.abs(data.draw(matrices(1, size + 1, 0, 5)))[0],
        "verify": np.abs(data.draw(matrices(1, size + 1, 0.1, 5)))[0],
        "depth": np.cumsum(np.r_[0.0, np.abs(data.draw(matrices(1, depth, 0, 2)))[0]]),
        "depths": data.draw(counts(size, depth + 2)),
    }
    limits = {"max_num_reqs": 8, "max_batch_tokens": 50}

    def every_table(a: dict[str, Any]) -> Any:
        t = tables(False)
        return (
            outcome(
                lambda: CostTables(a["draft"], a["verify"], draft_depth_ms=a["depth"]).to_json()
            ),
            outcome(lambda: t.with_draft_depth(a["depth"]).to_json()),
            outcome(lambda: CostTables.from_curves(a["curve"], a["curve"], **limits).to_json()),
            outcome(
                lambda: CostTables.from_samples(
                    a["curve"], a["curve"], draft_depth_samples=a["curve"], **limits
                ).to_json()
            ),
            outcome(lambda: t.step_draft_cost_ms(a["depths"])),
            outcome(lambda: t.with_draft_depth(a["depth"]).step_draft_cost_ms(a["depths"])),
        )

    same_on_every_layout(data.draw, arrays, every_table)


@SETTINGS
@given(data=st.data(), rows=st.integers(0, 4), vocab=st.integers(1, 40))
def test_feature_kernels_give_the_contiguous_answer_on_every_layout(
    data: Any, rows: int, vocab: int
) -> None:
    logits = data.draw(matrices(rows, vocab, -30, 30)).astype(np.float32)
    arrays = {
        "logits": logits,
        "bits": (logits.view(np.uint32) >> 16).astype(np.uint16).view(np.int16),
        "inverse": np.array(
            data.draw(st.lists(st.floats(0.1, 4), min_size=rows, max_size=rows)), np.float32
        ),
        "valid": np.array(data.draw(st.lists(st.booleans(), min_size=rows, max_size=rows)), bool),
    }

    def both_kernels(a: dict[str, Any]) -> Any:
        args = (a["inverse"], 40.0, a["valid"])
        return (
            outcome(lambda: _native.draft_log_odds_f32(a["logits"], *args)),
            outcome(lambda: _native.draft_log_odds_bf16(a["bits"], *args)),
        )

    # The kernels take numpy arrays (lists and tensors are the Python layer's): the per-row
    # arguments in any layout; the logits, read in place and never copied, C-contiguous and
    # aligned only (any other layout is a ValueError naming them, never a misread).
    expected = both_kernels({n: relayout(v, "C") for n, v in arrays.items()})
    chosen = {n: data.draw(st.sampled_from(NUMPY_LAYOUTS[:-1])) for n in arrays}
    moved = {n: relayout(v, chosen[n]) for n, v in arrays.items()}
    got = both_kernels(moved)
    for i, name in enumerate(["logits", "bits"]):
        if moved[name].flags.c_contiguous and moved[name].flags.aligned:
            assert got[i] == expected[i], chosen
        else:
            assert got[i][:2] == ("error", "InvalidValueError") and "logits" in got[i][2], got[i]


def test_the_example_of_the_issue_is_no_longer_transposed() -> None:
    est = AcceptanceEstimator(2)
    x = np.array([[-40.0, -40.0], [40.0, 40.0]])
    expected = est.predict(x)
    assert expected[0, 0] < 0.01 < 0.99 < expected[1, 0]
    np.testing.assert_array_equal(est.predict(np.asfortranarray(x)), expected)
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(est.predict(torch.tensor(x.T).t()), expected)


# --- buffers written by another thread --------------------------------------------------------


class Writer:
    """A thread that rewrites `buffer` in place, cycling through `values` (numpy's copy releases
    the GIL for buffers this size, so it runs while the native call does)."""

    def __init__(self, buffer: np.ndarray, values: list[np.ndarray]) -> None:
        self.buffer, self.values = buffer, values
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            np.copyto(self.buffer, self.values[i % len(self.values)])
            i += 1

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def only_value_or_type_errors(call: Callable[[], Any]) -> Any:
    """The call's result, or None after a ValueError/TypeError; any other exception (notably
    pyo3's PanicException, a BaseException) fails the test."""
    try:
        return call()
    except (ValueError, TypeError) as error:
        assert isinstance(error, Error), f"{type(error).__name__} is no av_core.Error: {error}"
        return None
    except BaseException as error:  # noqa: B036 - exactly what must never escape
        pytest.fail(f"{type(error).__module__}.{type(error).__name__} escaped: {error}")


RACE_ROWS = 4096  # big enough that numpy releases the GIL while copying


def race_values(shape: tuple[int, ...], low: float, high: float) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    good = rng.uniform(low, high, size=shape)
    bad = good.copy()
    bad[::7] = np.nan
    worse = good.copy()
    worse[1::5] = np.inf if high > 1 else 3.0
    return [good, bad, good, worse]


@pytest.mark.parametrize("update", ["map", "vllm"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_estimator_calls_racing_a_writer_stay_within_their_contract(
    dtype: type, update: str
) -> None:
    features = np.zeros((RACE_ROWS, K), dtype)
    predictions = np.full((RACE_ROWS, K), 0.5, dtype)
    admitted = np.full(RACE_ROWS, K, np.int64)
    accepted = np.ones(RACE_ROWS, np.int64)
    est = AcceptanceEstimator(K, refit_interval=3, update=update)
    with (
        Writer(features, race_values(features.shape, -30, 30)),
        Writer(predictions, race_values(predictions.shape, 0, 1)),
    ):
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            p = only_value_or_type_errors(lambda: est.predict(features))
            if p is not None:
                assert p.shape == features.shape and np.isfinite(p).all()
                assert ((p >= 0) & (p <= 1)).all()
            only_value_or_type_errors(
                lambda: est.observe(features, admitted, accepted, predictions)
            )
    # Nothing unvalidated reached the statistics: the state is one observations can produce.
    state = est.state_dict()
    AcceptanceEstimator.from_state_dict(state)
    AcceptanceEstimator.from_bytes(est.to_bytes())
    if update == "vllm":
        assert all(c >= 0 for c in state["round_stats"]["c"])
    else:
        stats = state["round_stats"]
        assert all(a <= n for a, n in zip(stats["accepted"], stats["count"], strict=True))
    assert np.isfinite(est.intercepts).all() and math.isfinite(est.slope)


def test_planning_calls_racing_a_writer_stay_within_their_contract() -> None:
    rows = RACE_ROWS
    t = CostTables([0.0] + [1.0] * rows, [1.0 + 0.001 * i for i in range(rows * (K + 1) + 1)])
    t = t.with_draft_depth("parallel", max_depth=K)
    conf = np.full((rows, K), 0.5)
    sched = np.full(rows, K, np.int64)
    slots = np.arange(rows, dtype=np.int64)
    planner = VerificationPlanner(t, K, num_slots=rows)
    step = {"num_non_draft_tokens": rows, "num_sampling_requests": rows}
    with Writer(conf, race_values(conf.shape, 0, 1)):
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            plans = [
                only_value_or_type_errors(lambda: planner.plan(slots, conf, sched, **step)),
                only_value_or_type_errors(
                    lambda: plan_verification(conf, sched, cost_tables=t, **step)
                ),
                only_value_or_type_errors(
                    lambda: choose_draft_budget(conf, sched, cost_tables=t, **step)
                ),
            ]
            for plan in plans[:2]:
                if plan is not None:
                    assert 0 <= plan.budget <= rows * K
                    assert ((plan.admitted >= 0) & (plan.admitted <= K)).all()
                    assert plan.admitted.sum() == plan.budget
                    assert math.isfinite(plan.expected_accepted_tokens)
            admitted = only_value_or_type_errors(lambda: assign_draft_budget(conf, sched, rows))
            if admitted is not None:
                assert admitted.sum() == rows
            only_value_or_type_errors(lambda: planner.remember(slots, conf, sched))
    # What the planner remembered passed validation: its own bytes load, every value a probability.
    back = VerificationPlanner.from_bytes(planner.to_bytes())
    for slot in range(0, rows, 97):
        remembered = back.previous_confidences(slot)
        assert ((remembered >= 0) & (remembered <= 1)).all()


def test_feature_kernels_racing_a_writer_stay_within_their_contract() -> None:
    rows, vocab, limit = 64, 4096, 40.0
    logits = np.zeros((rows, vocab), np.float32)
    rng = np.random.default_rng(2)
    values = [rng.normal(0, 3, size=logits.shape).astype(np.float32) for _ in range(3)]
    values[1][::3, ::11] = np.nan
    values[2][:, ::5] = 80.0
    inverse = np.ones(rows, np.float32)
    valid = np.arange(rows) % 3 != 0
    with Writer(logits, values):
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            x = only_value_or_type_errors(
                lambda: _native.draft_log_odds_f32(logits, inverse, limit, valid)
            )
            assert x is not None and x.shape == (rows,)
            finite = x[np.isfinite(x)]
            assert (np.abs(finite) <= limit).all()
            assert (x[~valid] == 0).all()


def racers(dtype: Any, bad: float) -> dict[str, tuple[np.ndarray, list[np.ndarray], Any, Any]]:
    """Every array-taking hot call: (the buffer a writer rewrites, the values it cycles through,
    the call, a check of the state afterwards)."""
    rows = RACE_ROWS
    rng = np.random.default_rng(5)
    conf = np.full((rows, K), 0.5, dtype)
    good_conf = rng.uniform(0, 1, size=conf.shape).astype(dtype)
    bad_conf = good_conf.copy()
    bad_conf[::3] = bad
    ints = np.full(rows, K, np.int64)
    bad_ints = ints.copy()
    bad_ints[::5] = -3 if bad != bad else 10**6  # NaN draws negative counts, the rest huge
    sched = np.full(rows, K, np.int64)
    slots = np.arange(rows, dtype=np.int64)
    t = CostTables([0.0] + [1.0] * rows, [1.0] * (rows * (K + 1) + 1))
    d = t.with_draft_depth("autoregressive", max_depth=K)
    step = {"num_non_draft_tokens": rows, "num_sampling_requests": rows}
    est = AcceptanceEstimator(K, refit_interval=2)
    planner = VerificationPlanner(d, K, num_slots=rows)

    def estimator_ok() -> None:
        AcceptanceEstimator.from_bytes(est.to_bytes())

    def planner_ok() -> None:
        VerificationPlanner.from_bytes(planner.to_bytes())

    def nothing() -> None:
        pass

    values = [good_conf, bad_conf]
    counts = [ints, bad_ints]
    return {
        "predict": (conf, values, lambda: est.predict(conf), estimator_ok),
        "observe": (
            conf,
            values,
            lambda: est.observe(conf, sched, np.ones(rows, np.int64)),
            estimator_ok,
        ),
        "observe counts": (
            ints,
            counts,
            lambda: est.observe(good_conf, ints, np.ones(rows, np.int64)),
            estimator_ok,
        ),
        "plan": (conf, values, lambda: planner.plan(slots, conf, sched, **step), planner_ok),
        "plan slots": (
            slots,
            [np.arange(rows), np.zeros(rows, np.int64)],
            lambda: planner.plan(slots, good_conf, sched, **step),
            planner_ok,
        ),
        "remember": (conf, values, lambda: planner.remember(slots, conf, sched), planner_ok),
        "planner depth": (
            ints,
            counts,
            lambda: planner.choose_draft_depth(slots, ints, **step),
            planner_ok,
        ),
        "plan_verification": (
            conf,
            values,
            lambda: plan_verification(conf, sched, cost_tables=t, budget_confidences=conf, **step),
            nothing,
        ),
        "choose_draft_budget": (
            conf,
            values,
            lambda: choose_draft_budget(conf, sched, cost_tables=t, **step),
            nothing,
        ),
        "choose_draft_depth": (
            conf,
            values,
            lambda: choose_draft_depth(conf, sched, cost_tables=d, **step),
            nothing,
        ),
        "assign_draft_budget": (
            ints,
            counts,
            lambda: assign_draft_budget(good_conf, ints, rows),
            nothing,
        ),
        "step_draft_cost_ms": (ints, counts, lambda: d.step_draft_cost_ms(ints), nothing),
    }


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(racers(np.float64, np.nan))),
    dtype=st.sampled_from([np.float32, np.float64]),
    bad=st.sampled_from([np.nan, np.inf, -np.inf, 2.0, -1.0]),
    calls=st.integers(5, 40),
)
def test_any_hot_call_racing_a_writer_raises_only_value_or_type_errors(
    name: str, dtype: Any, bad: float, calls: int
) -> None:
    buffer, values, call, state_ok = racers(dtype, bad)[name]
    with Writer(buffer, [v.astype(buffer.dtype) for v in values]):
        for _ in range(calls):
            only_value_or_type_errors(call)
    state_ok()


# --- sizes ---------------------------------------------------------------------------------


def test_no_size_an_argument_implies_is_allocated_before_it_is_checked() -> None:
    """In a child limited to 2 GiB of address space: an unchecked 8 TB allocation would abort
    it; each case must return quickly or raise ValueError naming the argument."""
    script = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        import numpy as np
        from av_core import (AcceptanceEstimator, CostTables, VerificationPlanner,
                             assign_draft_budget)

        t = CostTables([0.0, 1, 2], [1.0, 2, 3, 4])
        d = t.with_draft_depth("autoregressive", max_depth=3)
        for depths in ([10**12], [2**62], [2**63 - 1], [0, 2**40, 1]):
            assert t.step_draft_cost_ms(depths) == t.step_draft_cost_ms(np.minimum(depths, 1))
            assert d.step_draft_cost_ms(depths) == d.step_draft_cost_ms(np.minimum(depths, 3))
        assert t.draft_cost_ms(2, 10**15) == t.draft_cost_ms(2, 1)

        def refused(argument, call):
            try:
                call()
            except ValueError as error:
                assert argument in str(error), (argument, error)
            else:
                raise AssertionError(f"{argument}: accepted")

        curve = [(1.0, 1.0)]
        refused("depths", lambda: t.step_draft_cost_ms(np.array([2**63], np.uint64)))
        refused("max_num_reqs", lambda: CostTables.from_curves(
            curve, curve, max_num_reqs=10**12, max_batch_tokens=4))
        refused("max_batch_tokens", lambda: CostTables.from_curves(
            curve, curve, max_num_reqs=4, max_batch_tokens=2**40))
        refused("max_draft_depth", lambda: CostTables.from_samples(
            curve, curve, max_num_reqs=4, max_batch_tokens=4, draft_depth_samples=curve,
            max_draft_depth=10**12))
        refused("max_depth", lambda: t.with_draft_depth("parallel", max_depth=10**12))
        refused("num_slots", lambda: VerificationPlanner(t, 3, num_slots=10**12))
        refused("num_positions", lambda: VerificationPlanner(t, 10**12, num_slots=1))
        refused("num_positions", lambda: AcceptanceEstimator(10**12))
        refused("num_requests", lambda: t.draft_cost_ms(10**12, 1))
        p = VerificationPlanner(t, 3, num_slots=2)
        refused("slot", lambda: p.previous_confidences(10**12))
        refused("slot", lambda: p.add_request(2**63))
        assert assign_draft_budget(np.full((2, 3), 0.5), [3, 3], 2**63).tolist() == [3, 3]

        # Views implying more elements than memory holds: refused by name, not an abort.
        huge = 10**12
        est = AcceptanceEstimator(3)
        rows = np.broadcast_to(np.ones((1, 3)), (huge, 3))
        counts = np.broadcast_to(np.int64(1), (huge,))
        refused("features", lambda: est.predict(rows))
        refused("features", lambda: est.observe(rows, counts, counts))
        refused("confidences", lambda: assign_draft_budget(rows, counts, 1))
        refused("slots", lambda: p.remember(counts, rows, counts))
        refused("draft_ms", lambda: CostTables(np.broadcast_to(1.0, (huge,)), [1.0]))
        refused("depths", lambda: t.step_draft_cost_ms(counts))
        # Of its own kind: a ValueError subclass, told apart without reading the message.
        from av_core import OutOfMemoryError
        for call in (lambda: est.predict(rows), lambda: assign_draft_budget(rows, counts, 1)):
            try:
                call()
            except ValueError as error:
                assert type(error) is OutOfMemoryError, repr(error)
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def reference_step_draft_cost(t: CostTables, depths: list[int]) -> float:
    """Pass j over the requests drafting at least j positions (float64, summed in j order)."""
    table = t.draft_depth_ms
    full = 1 if table is None else len(table) - 1

    def fraction(j: int) -> float:
        if j == 0:
            return 0.0
        if table is None:
            return 1.0
        return 0.0 if table[-1] <= 0 else float(table[min(j, full)] / table[-1])

    cost, previous = 0.0, 0.0
    for j in range(1, min(max(depths, default=0), full) + 1):
        rows = sum(d >= j for d in depths)
        f = fraction(j)
        if rows:
            cost += float(t.draft_ms[rows]) * (f - previous)
        previous = f
    return cost


@SETTINGS
@given(
    depths=st.lists(
        st.one_of(st.integers(0, 5), st.integers(0, 2**63 - 1)), min_size=0, max_size=8
    ),
    depth=st.sampled_from([None, 1, 3, 4]),
)
def test_step_draft_cost_of_any_depths_is_the_reference(
    depths: list[int], depth: int | None
) -> None:
    t = CostTables([0.0, 0.4, 0.7, 0.9, 1.0, 1.2, 1.3, 1.5, 1.6], [1.0] * 9)
    if depth is not None:
        t = t.with_draft_depth("autoregressive", max_depth=depth)
    assert t.step_draft_cost_ms(np.array(depths, np.int64)) == reference_step_draft_cost(t, depths)


# --- integers, floats, empty lists -------------------------------------------------------------

TABLES = CostTables([0.0, 0.5, 0.6, 0.7], [1.0] * 40)
DEPTH_TABLES = TABLES.with_draft_depth("autoregressive", max_depth=K)
STEP = {"num_non_draft_tokens": 2, "num_sampling_requests": 2}
CONF = np.full((2, K), 0.5)
SCHED = np.array([K, 1])
CURVE = [(1.0, 1.0), (4.0, 2.0)]
SAMPLES = {"max_num_reqs": 4, "max_batch_tokens": 8}


def planner() -> VerificationPlanner:
    return VerificationPlanner(DEPTH_TABLES, K, num_slots=4)


# Every integer parameter of every native entry point: (argument, a valid value, call with it).
INT_PARAMETERS: list[tuple[str, int, Callable[[Any], Any]]] = [
    ("num_positions", 2, lambda v: AcceptanceEstimator(v)),
    ("refit_interval", 5, lambda v: AcceptanceEstimator(2, refit_interval=v)),
    (
        "max_num_reqs",
        4,
        lambda v: CostTables.from_curves(CURVE, CURVE, max_num_reqs=v, max_batch_tokens=8),
    ),
    (
        "max_batch_tokens",
        8,
        lambda v: CostTables.from_curves(CURVE, CURVE, max_num_reqs=4, max_batch_tokens=v),
    ),
    (
        "cudagraph_limit",
        2,
        lambda v: CostTables.from_curves(CURVE, CURVE, cudagraph_limit=v, **SAMPLES),
    ),
    (
        "max_draft_depth",
        3,
        lambda v: CostTables.from_curves(
            CURVE, CURVE, draft_depth_curve=CURVE, max_draft_depth=v, **SAMPLES
        ),
    ),
    (
        "max_num_reqs",
        4,
        lambda v: CostTables.from_samples(CURVE, CURVE, max_num_reqs=v, max_batch_tokens=8),
    ),
    (
        "max_batch_tokens",
        8,
        lambda v: CostTables.from_samples(CURVE, CURVE, max_num_reqs=4, max_batch_tokens=v),
    ),
    (
        "cudagraph_limit",
        2,
        lambda v: CostTables.from_samples(CURVE, CURVE, cudagraph_limit=v, **SAMPLES),
    ),
    (
        "max_draft_depth",
        3,
        lambda v: CostTables.from_samples(
            CURVE, CURVE, draft_depth_samples=CURVE, max_draft_depth=v, **SAMPLES
        ),
    ),
    ("max_depth", 3, lambda v: TABLES.with_draft_depth("parallel", max_depth=v)),
    ("num_requests", 2, lambda v: TABLES.draft_cost_ms(v, 1)),
    ("depth", 1, lambda v: TABLES.draft_cost_ms(2, v)),
    ("budget", 2, lambda v: assign_draft_budget(CONF, SCHED, v)),
    (
        "num_non_draft_tokens",
        2,
        lambda v: choose_draft_budget(
            CONF, SCHED, num_non_draft_tokens=v, num_sampling_requests=2, cost_tables=TABLES
        ),
    ),
    (
        "num_sampling_requests",
        2,
        lambda v: choose_draft_budget(
            CONF, SCHED, num_non_draft_tokens=2, num_sampling_requests=v, cost_tables=TABLES
        ),
    ),
    (
        "max_draft_budget",
        2,
        lambda v: choose_draft_budget(CONF, SCHED, cost_tables=TABLES, max_draft_budget=v, **STEP),
    ),
    (
        "num_non_draft_tokens",
        2,
        lambda v: plan_verification(
            CONF, SCHED, num_non_draft_tokens=v, num_sampling_requests=2, cost_tables=TABLES
        ),
    ),
    (
        "num_sampling_requests",
        2,
        lambda v: plan_verification(
            CONF, SCHED, num_non_draft_tokens=2, num_sampling_requests=v, cost_tables=TABLES
        ),
    ),
    (
        "max_draft_budget",
        2,
        lambda v: plan_verification(CONF, SCHED, cost_tables=TABLES, max_draft_budget=v, **STEP),
    ),
    (
        "num_non_draft_tokens",
        2,
        lambda v: choose_draft_depth(
            CONF, SCHED, num_non_draft_tokens=v, num_sampling_requests=2, cost_tables=DEPTH_TABLES
        ),
    ),
    (
        "num_sampling_requests",
        2,
        lambda v: choose_draft_depth(
            CONF, SCHED, num_non_draft_tokens=2, num_sampling_requests=v, cost_tables=DEPTH_TABLES
        ),
    ),
    (
        "max_draft_budget",
        2,
        lambda v: choose_draft_depth(
            CONF, SCHED, cost_tables=DEPTH_TABLES, max_draft_budget=v, **STEP
        ),
    ),
    ("num_positions", K, lambda v: VerificationPlanner(TABLES, v, num_slots=2)),
    ("num_slots", 2, lambda v: VerificationPlanner(TABLES, K, num_slots=v)),
    ("exploration_seed", 7, lambda v: VerificationPlanner(TABLES, K, exploration_seed=v)),
    ("slot", 1, lambda v: planner().add_request(v)),
    ("slot", 1, lambda v: planner().previous_confidences(v)),
    (
        "num_non_draft_tokens",
        2,
        lambda v: planner().plan(
            [0, 1], CONF, SCHED, num_non_draft_tokens=v, num_sampling_requests=2
        ),
    ),
    (
        "num_sampling_requests",
        2,
        lambda v: planner().plan(
            [0, 1], CONF, SCHED, num_non_draft_tokens=2, num_sampling_requests=v
        ),
    ),
    (
        "max_draft_budget",
        2,
        lambda v: planner().plan([0, 1], CONF, SCHED, max_draft_budget=v, **STEP),
    ),
    (
        "num_non_draft_tokens",
        2,
        lambda v: planner().choose_draft_depth(
            [0, 1], SCHED, num_non_draft_tokens=v, num_sampling_requests=2
        ),
    ),
    (
        "num_sampling_requests",
        2,
        lambda v: planner().choose_draft_depth(
            [0, 1], SCHED, num_non_draft_tokens=2, num_sampling_requests=v
        ),
    ),
    (
        "max_draft_budget",
        2,
        lambda v: planner().choose_draft_depth([0, 1], SCHED, max_draft_budget=v, **STEP),
    ),
]

FLOAT_PARAMETERS: list[tuple[str, float, Callable[[Any], Any]]] = [
    *[
        (name, value, lambda v, name=name: AcceptanceEstimator(2, **{name: v}))
        for name, value in [
            ("damping", 50.0),
            ("l2", 1e-3),
            ("init_slope", 0.5),
            ("init_intercept", -0.2),
            ("max_log_odds", 40.0),
            ("max_step", 4.0),
            ("max_slope", 10.0),
            ("max_intercept", 15.0),
            ("memory", 0.5),
            ("drift_z", 3.0),
        ]
    ],
    ("exploration", 0.1, lambda v: VerificationPlanner(TABLES, K, exploration=v)),
    (
        "max_log_odds",
        40.0,
        lambda v: _native.draft_log_odds_f32(
            np.zeros((1, 4), np.float32), np.ones(1, np.float32), v
        ),
    ),
    (
        "max_log_odds",
        40.0,
        lambda v: _native.draft_log_odds_bf16(
            np.zeros((1, 4), np.int16), np.ones(1, np.float32), v
        ),
    ),
]


def int_parameter_ids() -> list[str]:
    return [f"{name}-{i}" for i, (name, _, _) in enumerate(INT_PARAMETERS)]


@pytest.mark.parametrize(("argument", "valid", "call"), INT_PARAMETERS, ids=int_parameter_ids())
def test_every_integer_parameter_refuses_by_name(
    argument: str, valid: int, call: Callable[[Any], Any]
) -> None:
    call(valid)
    call(np.int64(valid))  # numpy integers are integers
    for huge in [2**64, -(2**64), 2**200, -1]:
        with pytest.raises(ValueError, match=argument) as error:
            call(huge)
        assert str(huge) in str(error.value)
    for not_an_int in [True, False, 2.5, "3", np.float64(2.0)]:
        with pytest.raises(TypeError, match=argument):
            call(not_an_int)


@pytest.mark.parametrize(("argument", "valid", "call"), FLOAT_PARAMETERS, ids=lambda v: str(v)[:20])
def test_every_float_parameter_refuses_by_name(
    argument: str, valid: float, call: Callable[[Any], Any]
) -> None:
    call(valid)
    call(np.float32(valid))
    call(int(valid) if float(valid).is_integer() else valid)  # an int is a number
    with pytest.raises(ValueError, match=argument):
        call(10**400)
    for not_a_number in [True, "1.0", None, 1j]:
        with pytest.raises(TypeError, match=argument):
            call(not_a_number)


@settings(max_examples=80, deadline=None)
@given(
    parameter=st.sampled_from(INT_PARAMETERS),
    value=st.one_of(
        st.integers(-(2**70), 2**70),
        st.sampled_from([2**63, 2**64, -(2**63) - 1, True, False, 0]),
        st.integers(0, 8),
    ),
)
def test_any_integer_to_any_parameter_is_a_result_or_a_value_or_type_error(
    parameter: tuple[str, int, Callable[[Any], Any]], value: int
) -> None:
    argument, _, call = parameter
    try:
        call(value)
    except (ValueError, TypeError) as error:
        assert argument in str(error) or "cost_tables" in str(error) or "max" in str(error), error
        assert isinstance(error, Error), f"{type(error).__name__} is no av_core.Error: {error}"
    except BaseException as error:  # noqa: B036 - exactly what must never escape
        pytest.fail(f"{type(error).__name__} escaped for {argument}={value!r}: {error}")


def test_the_examples_of_the_issue_raise_value_or_type_errors() -> None:
    with pytest.raises(ValueError, match="num_positions.*18446744073709551616"):
        AcceptanceEstimator(2**64)
    with pytest.raises(ValueError, match="refit_interval"):
        AcceptanceEstimator(2, refit_interval=2**64)
    with pytest.raises(ValueError, match="exploration_seed.*-1"):
        VerificationPlanner(TABLES, K, exploration_seed=-1)
    with pytest.raises(ValueError, match="max_num_reqs"):
        CostTables.from_curves(CURVE, CURVE, max_num_reqs=2**64, max_batch_tokens=8)
    with pytest.raises(TypeError, match="num_positions.*bool"):
        AcceptanceEstimator(True)


def test_empty_lists_are_accepted_wherever_empty_arrays_are() -> None:
    empty_rows = np.zeros((0, K))
    none = np.zeros(0, np.int64)
    est, arrays = AcceptanceEstimator(K), AcceptanceEstimator(K)
    assert est.observe([], [], []) == arrays.observe(empty_rows, none, none)
    assert est.observe([], [], [], []) == arrays.observe(empty_rows, none, none, empty_rows)
    assert est.state_dict() == arrays.state_dict()
    assert est.predict([]).shape == arrays.predict(empty_rows).shape == (0, K)
    for t in (TABLES, DEPTH_TABLES):
        step = {"cost_tables": t, "num_non_draft_tokens": 0, "num_sampling_requests": 0}
        assert normalize(plan_verification([], [], **step)) == normalize(
            plan_verification(empty_rows, none, **step)
        )
        assert normalize(plan_verification([], [], budget_confidences=[], **step)) == normalize(
            plan_verification(empty_rows, none, budget_confidences=empty_rows, **step)
        )
        assert choose_draft_budget([], [], **step) == 0
    step = {"cost_tables": DEPTH_TABLES, "num_non_draft_tokens": 0, "num_sampling_requests": 0}
    assert normalize(choose_draft_depth([], [], **step)) == normalize(
        choose_draft_depth(empty_rows, none, **step)
    )
    assert assign_draft_budget([], [], 0).shape == (0,)
    assert TABLES.step_draft_cost_ms([]) == 0.0
    p, q = planner(), planner()
    step = {"num_non_draft_tokens": 0, "num_sampling_requests": 0}
    assert normalize(p.plan([], [], [], **step)) == normalize(
        q.plan(none, empty_rows, none, **step)
    )
    p.remember([], [], [])
    q.remember(none, empty_rows, none)
    assert normalize(p.choose_draft_depth([], [], **step)) == normalize(
        q.choose_draft_depth(none, none, **step)
    )
    assert p.to_bytes() == q.to_bytes()
    # A float array is still not an integer array, even when empty.
    with pytest.raises(TypeError, match="scheduled_drafts"):
        assign_draft_budget(empty_rows, np.zeros(0), 0)


def test_unsigned_values_beyond_int64_are_refused_with_their_value() -> None:
    big = np.array([2**64 - 1], np.uint64)
    with pytest.raises(ValueError, match="scheduled_drafts.*18446744073709551615"):
        assign_draft_budget(np.full((1, K), 0.5), big, 1)
    with pytest.raises(ValueError, match="slots.*18446744073709551615"):
        planner().remember(big, np.full((1, K), 0.5), [1])


# --- state that no observations can produce ----------------------------------------------------


def observed_state() -> dict[str, Any]:
    # vLLM's update: the corruptions below are of its IRLS moments and quadratic memory (the map
    # update's histograms: tests/estimator/test_map_update.py).
    est = AcceptanceEstimator(K, refit_interval=3, memory=0.8, update="vllm")
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.normal(0, 3, size=(16, K))
        admitted = rng.integers(0, K + 1, size=16)
        est.observe(x, admitted, np.minimum(admitted, rng.integers(0, K + 1, size=16)))
    state = est.state_dict()
    assert state["memory_state"]["total"] > 0 and sum(state["round_stats"]["n"]) > 0
    return state


def corrupt(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    import copy

    state = copy.deepcopy(state)
    target = state
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value(target[path[-1]]) if callable(value) else value
    return state


def test_from_state_dict_refuses_statistics_no_observations_can_produce() -> None:
    state = observed_state()
    AcceptanceEstimator.from_state_dict(state)
    stats = state["round_stats"]
    a, c = stats["a"][0], stats["c"][0]
    cases: list[tuple[tuple[Any, ...], Any, str]] = [
        (("round_stats", "n", 0), 2**64 - 1, "round_stats"),
        (("round_stats", "c", 0), -1, "round_stats"),
        (("round_stats", "a", 1), -(2**40), "round_stats"),
        (("round_stats", "b", 0), int(math.isqrt(a * c) * 1.01) + 10**6, "round_stats"),
        (("round_stats", "g1", 0), 2**120, "round_stats"),
        (("steps_since_refit",), 3, "steps_since_refit"),
        (("num_refits",), 2**64 - 1, "num_refits"),
        (("memory_state", "c", 0), -1.0, "memory"),
        (("memory_state", "counts", 1), -5.0, "memory"),
        (("memory_state", "b", 0), lambda b: 1e6 * (1 + abs(b)), "memory"),
        (("memory_state", "resets"), 2**40, "memory"),
        (("memory_state", "total"), lambda t: 3 * t, "memory"),
    ]
    for path, value, argument in cases:
        with pytest.raises(ValueError, match=argument):
            AcceptanceEstimator.from_state_dict(corrupt(state, path, value))
    for path, value in [
        (("round_stats", "n", 0), True),
        (("config", "num_positions"), True),
        (("num_refits",), 2.0),
    ]:
        with pytest.raises(TypeError):
            AcceptanceEstimator.from_state_dict(corrupt(state, path, value))
    with pytest.raises(ValueError, match="n"):
        AcceptanceEstimator.from_state_dict(corrupt(state, ("round_stats", "n", 0), 2**70))


@SETTINGS
@given(
    seed=st.integers(0, 2**32), steps=st.integers(1, 12), memory=st.sampled_from([0.0, 0.5, 0.99])
)
def test_every_state_observations_produce_is_accepted(seed: int, steps: int, memory: float) -> None:
    rng = np.random.default_rng(seed)
    est = AcceptanceEstimator(K, refit_interval=int(rng.integers(1, 4)), memory=memory, l2=0.0)
    for _ in range(steps):
        rows = int(rng.integers(0, 30))
        x = rng.choice([0.0, 1e-9, 40.0, -40.0, 1e5, 3.0], size=(rows, K)) * rng.uniform(
            -1, 1, size=(rows, K)
        )
        p = rng.choice([0.0, 1.0, 0.5, 0.25], size=(rows, K))
        admitted = rng.integers(0, K + 1, size=rows)
        accepted = np.minimum(admitted, rng.integers(0, K + 1, size=rows))
        est.observe(x, admitted, accepted, p if rng.random() < 0.5 else None)
        AcceptanceEstimator.from_state_dict(est.state_dict())
        AcceptanceEstimator.from_bytes(est.to_bytes())


# --- the refit schedule under contention -------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(threads=st.integers(2, 8), interval=st.integers(1, 7), per_thread=st.integers(1, 300))
def test_any_number_of_threads_keeps_the_serial_refit_schedule(
    threads: int, interval: int, per_thread: int
) -> None:
    # vLLM's schedule: one refit per round (the map schedule: tests/estimator/test_map_update.py).
    est = AcceptanceEstimator(K, refit_interval=interval, update="vllm")
    x = np.full((2, K), 1.5, np.float32)
    admitted, accepted = np.array([K, 1]), np.array([1, 0])
    start = threading.Barrier(threads)

    def observer() -> None:
        start.wait()
        for _ in range(per_thread):
            est.observe(x, admitted, accepted)

    workers = [threading.Thread(target=observer) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    n = threads * per_thread
    assert (est.num_refits, est.steps_since_refit) == (n // interval, n % interval)


def test_statistics_summed_by_many_threads_are_the_serial_bits() -> None:
    rng = np.random.default_rng(3)
    batches = [(rng.normal(0, 4, size=(32, K)), rng.integers(0, K + 1, size=32)) for _ in range(48)]
    batches = [(x, a, np.minimum(a, 1)) for x, a in batches]
    # vLLM's update, whose only fits are the rounds' ends: the whole state is the serial one.
    # (Under map the fits within a round see the steps that arrived first, so only its round
    # statistics and its round ends are order-independent: tests/estimator/test_map_update.py.)
    serial = AcceptanceEstimator(K, refit_interval=2**62, update="vllm")
    for b in batches:
        serial.observe(*b)
    parallel = AcceptanceEstimator(K, refit_interval=2**62, update="vllm")
    workers = [
        threading.Thread(target=lambda i=i: [parallel.observe(*b) for b in batches[i::6]])
        for i in range(6)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert parallel.state_dict() == serial.state_dict()


# --- concurrent saves, and what load accepts ---------------------------------------------------


def estimators(n: int) -> list[AcceptanceEstimator]:
    out = []
    for i in range(n):
        est = AcceptanceEstimator(K)
        est.observe(np.full((1, K), float(i)), [K], [i % (K + 1)])
        out.append(est)
    return out


def test_threads_saving_to_one_path_leave_one_complete_file(tmp_path: Path) -> None:
    path = tmp_path / "state.bin"
    candidates = estimators(8)
    known = {e.to_bytes() for e in candidates}
    candidates[0].save(path)
    errors: list[BaseException] = []
    stop = threading.Event()

    def saver(est: AcceptanceEstimator) -> None:
        try:
            for _ in range(40):
                est.save(path)
        except BaseException as error:  # noqa: B036 - reported below
            errors.append(error)

    def reader() -> None:
        while not stop.is_set():
            try:
                assert AcceptanceEstimator.load(path).to_bytes() in known
            except BaseException as error:  # noqa: B036 - reported below
                errors.append(error)
                return

    threads = [threading.Thread(target=saver, args=(e,)) for e in candidates]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert not errors, errors[:3]
    assert AcceptanceEstimator.load(path).to_bytes() in known
    assert [p.name for p in tmp_path.iterdir()] == ["state.bin"], "temporary files left behind"


SAVE_FOREVER = """
import sys
import numpy as np
from av_core import AcceptanceEstimator, CostTables, VerificationPlanner
path, seed = sys.argv[1], int(sys.argv[2])
est = AcceptanceEstimator(3)
est.observe(np.full((1, 3), float(seed)), [3], [seed % 4])
tables = CostTables([0.0, 0.5, 0.6, 0.7], [1.0] * 40)
planner = VerificationPlanner(tables, 3, num_slots=64, exploration_seed=seed)
while True:
    est.save(path)
    planner.save(path + ".planner")
"""


def test_processes_killed_while_saving_leave_a_loadable_file(tmp_path: Path) -> None:
    path = str(tmp_path / "state.bin")
    known = {e.to_bytes() for e in estimators(4)}
    planners = {
        VerificationPlanner(TABLES, K, num_slots=64, exploration_seed=s).to_bytes()
        for s in range(4)
    }
    rng = np.random.default_rng(4)
    for _ in range(6):
        children = [
            subprocess.Popen([sys.executable, "-c", SAVE_FOREVER, path, str(s)]) for s in range(4)
        ]
        try:
            deadline = time.monotonic() + 60
            while not (os.path.exists(path) and os.path.exists(path + ".planner")):
                assert time.monotonic() < deadline, "the children never saved"
                assert all(c.poll() is None for c in children), "a saver died"
                time.sleep(0.01)
            # Loads while they save, then kills them at a random moment, mid-save or not.
            for _ in range(20):
                assert AcceptanceEstimator.load(path).to_bytes() in known
                assert VerificationPlanner.load(path + ".planner").to_bytes() in planners
            time.sleep(float(rng.uniform(0, 0.05)))
        finally:
            for child in children:
                child.send_signal(signal.SIGKILL)
            for child in children:
                child.wait()
        assert AcceptanceEstimator.load(path).to_bytes() in known
        assert VerificationPlanner.load(path + ".planner").to_bytes() in planners


def test_file_errors_are_the_matching_python_exceptions(tmp_path: Path) -> None:
    est = AcceptanceEstimator(K)
    with pytest.raises(FileNotFoundError, match="path"):
        AcceptanceEstimator.load(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="path"):
        est.save(tmp_path / "no" / "such" / "directory")
    with pytest.raises(ValueError, match="path"):
        est.save(str(tmp_path / "nul\0byte"))
    with pytest.raises(ValueError, match="path"):
        VerificationPlanner.load(str(tmp_path / "nul\0byte"))


def test_load_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """In a child with a timeout: a FIFO once blocked `load` forever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    long = tmp_path / "long"
    with open(long, "wb") as f:  # sparse: no data is written or read
        f.truncate(len(AcceptanceEstimator(1).to_bytes()) * 10**6)
    script = textwrap.dedent(
        f"""
        from av_core import AcceptanceEstimator, VerificationPlanner
        for cls in (AcceptanceEstimator, VerificationPlanner):
            for path, words in [({str(fifo)!r}, "not a regular file"),
                                ({str(tmp_path)!r}, "not a regular file"),
                                ("/dev/zero", "not a regular file")]:
                try:
                    cls.load(path)
                except ValueError as error:
                    assert words in str(error) and "path" in str(error), error
                else:
                    raise AssertionError(path)
        try:
            AcceptanceEstimator.load({str(long)!r})
        except ValueError as error:
            assert "more than any saved state" in str(error), error
        else:
            raise AssertionError("long")
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
