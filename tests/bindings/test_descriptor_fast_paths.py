"""The bindings' direct paths for the common arrays, against their general conversion.

The hot calls recognise an argument that is a numpy array (a subclass included) with numpy's
own int64, int32, float32 or float64 descriptor (the same object, compared by address) and copy
it without numpy's comparison of dtypes; the other spellings of the same values (a copy of the
descriptor, ``longlong``, another byte order, other integer widths, a list) go through the
general conversion. Every spelling must give the same outcome: the same results, bit for bit,
the same state afterwards, or the same error with the same message.

The per-request outputs and ``predict``'s probabilities are written by the core straight into a
new numpy array: each result is a C-contiguous, aligned, writeable array of its own (no memory
shared with another result or an argument), whatever the GIL did during the call.
"""

from __future__ import annotations

from collections.abc import Callable
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
    choose_draft_depth,
    plan_verification,
)

K = 4
SLOTS = 8
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Sub(np.ndarray):
    """An ndarray subclass (a numpy array to the bindings)."""


def spellings(a: np.ndarray) -> dict[str, Any]:
    """The values of `a` (numpy's own descriptor, C order) in every spelling the tests compare."""
    own = a.copy(order="C")
    assert own.dtype is np.dtype(own.dtype.type), "the reference uses numpy's own descriptor"
    copied = own.view(own.dtype.newbyteorder("="))
    assert copied.dtype is not own.dtype, "a copy of the descriptor is another object"
    out: dict[str, Any] = {
        "descriptor copy": copied,
        "subclass": own.view(Sub),
        "other byte order": own.astype(own.dtype.newbyteorder(">")),
        "list": own.tolist(),
    }
    if own.dtype.kind == "i":
        out["longlong"] = own.astype(np.longlong)
        for t in (np.int64, np.int32, np.int16):  # the widths that hold the values
            if (own.astype(t) == own).all():
                out[np.dtype(t).name] = own.astype(t)
                out[f"{np.dtype(t).name} descriptor copy"] = own.astype(t).view(
                    np.dtype(t).newbyteorder("=")
                )
    return out


def normalize(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, float):
        return ("float", value.hex())
    for fields in (
        (
            "depths",
            "max_depth",
            "drafts",
            "budget",
            "expected_accepted_tokens",
            "predicted_cost_ms",
        ),
        ("budget", "admitted", "expected_accepted_tokens", "predicted_cost_ms"),
    ):
        if all(hasattr(value, name) for name in fields):
            return tuple((name, normalize(getattr(value, name))) for name in fields)
    return value


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("ok", normalize(call()))
    except (ValueError, TypeError) as error:
        assert isinstance(error, Error), f"{type(error).__name__}: {error}"
        return ("error", type(error).__name__, str(error))


def tables() -> CostTables:
    verify = [1.0 + 0.05 * t for t in range(64)]
    base = CostTables([0.0] + [0.4 + 0.1 * r for r in range(SLOTS)], verify)
    return base.with_draft_depth("autoregressive", max_depth=K)


def same_in_every_spelling(
    arrays: dict[str, np.ndarray], run: Callable[[dict[str, Any]], Any]
) -> None:
    """`run` on numpy's own arrays, then with each argument in turn spelled every other way."""
    expected = run({name: a.copy(order="C") for name, a in arrays.items()})
    for name, a in arrays.items():
        for spelling, value in spellings(a).items():
            got = run({**arrays, name: value})
            assert got == expected, f"{name} as {spelling}"


@st.composite
def features(draw: Any, rows: int, low: float, high: float) -> np.ndarray:
    values = draw(st.lists(st.floats(low, high, width=32), min_size=rows * K, max_size=rows * K))
    a = np.array(values, np.float64).reshape(rows, K)
    if a.size and draw(st.integers(0, 7)) == 0:  # sometimes one value the core refuses
        a.flat[draw(st.integers(0, a.size - 1))] = draw(st.sampled_from([np.nan, -1.0, 2.0]))
    return a.astype(draw(st.sampled_from([np.float32, np.float64])))


@st.composite
def counts(draw: Any, rows: int, low: int, high: int) -> np.ndarray:
    values = draw(st.lists(st.integers(low, high), min_size=rows, max_size=rows))
    return np.array(values, np.int64)


@SETTINGS
@given(data=st.data(), rows=st.integers(0, 6))
def test_the_estimator_gives_one_answer_for_every_spelling(data: Any, rows: int) -> None:
    arrays = {
        "features": data.draw(features(rows, -30, 30)),
        "admitted": data.draw(counts(rows, -1, K)),
        "accepted": data.draw(counts(rows, 0, K)),
        "predictions": data.draw(features(rows, 0, 1)),
    }

    def run(a: dict[str, Any]) -> Any:
        est = AcceptanceEstimator(K, refit_interval=2)
        est.observe(np.ones((1, K)), [K], [1])
        observed = outcome(
            lambda: est.observe(a["features"], a["admitted"], a["accepted"], a["predictions"])
        )
        return observed, outcome(lambda: est.predict(a["features"])), est.to_bytes()

    same_in_every_spelling(arrays, run)


@SETTINGS
@given(data=st.data(), rows=st.integers(0, 6))
def test_the_planner_gives_one_answer_for_every_spelling(data: Any, rows: int) -> None:
    slots = data.draw(
        st.lists(st.integers(0, SLOTS - 1), min_size=rows, max_size=rows, unique=True)
    )
    if rows and data.draw(st.integers(0, 7)) == 0:  # sometimes a slot the planner refuses
        slots[-1] = data.draw(st.sampled_from([-1, SLOTS, 2**31 - 1, -(2**31)]))
    arrays = {
        "slots": np.array(slots, np.int64),
        "confidences": data.draw(features(rows, 0, 1)),
        "scheduled": data.draw(counts(rows, -1, K + 1)),
        "caps": data.draw(counts(rows, -1, K + 1)),
    }
    step: dict[str, Any] = {"num_non_draft_tokens": rows, "num_sampling_requests": rows}

    def run(a: dict[str, Any]) -> Any:
        planner = VerificationPlanner(tables(), K, num_slots=SLOTS, exploration=0.3)
        planner.remember(np.arange(SLOTS), np.full((SLOTS, K), 0.6), np.full(SLOTS, K))
        slots, conf, sched, caps = a["slots"], a["confidences"], a["scheduled"], a["caps"]
        return (
            outcome(lambda: planner.choose_draft_depth(slots, caps, **step)),
            outcome(lambda: planner.choose_draft_depth(slots, caps, mode="per_request", **step)),
            outcome(lambda: planner.plan(slots, conf, sched, **step)),
            outcome(lambda: planner.remember(slots, conf, sched)),
            outcome(lambda: plan_verification(conf, sched, cost_tables=tables(), **step)),
            outcome(lambda: choose_draft_depth(conf, caps, cost_tables=tables(), **step)),
            planner.to_bytes(),
        )

    same_in_every_spelling(arrays, run)


def step_arrays(rows: int, seed: int) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    x = rng.normal(1.5, 2.0, size=(rows, K)).astype(np.float32)
    slots = np.arange(rows, dtype=np.int64)
    caps = np.full(rows, K, np.int64)
    return x, slots, caps, rng.integers(0, K + 1, size=rows)


def check_result(array: np.ndarray, dtype: Any, shape: tuple[int, ...]) -> None:
    assert type(array) is np.ndarray
    assert array.dtype == np.dtype(dtype) and array.shape == shape
    assert array.flags.c_contiguous and array.flags.aligned and array.flags.writeable


def wide_tables(rows: int) -> CostTables:
    """Tables covering `rows` requests of K drafts each."""
    tokens = rows * (K + 1)
    base = CostTables.from_curves(
        [(1, 0.5), (rows, 3.0)],
        [(1, 1.0), (tokens, 6.0)],
        max_num_reqs=rows,
        max_batch_tokens=tokens,
    )
    return base.with_draft_depth("autoregressive", max_depth=K)


@pytest.mark.parametrize("rows", [0, 1, 5, 300])
def test_results_are_new_arrays_of_their_own(rows: int) -> None:
    x, slots, caps, accepted = step_arrays(rows, 3)
    est = AcceptanceEstimator(K)
    planner = VerificationPlanner(wide_tables(max(rows, 2)), K, num_slots=max(rows, 1))
    step: dict[str, Any] = {"num_non_draft_tokens": rows, "num_sampling_requests": rows}
    depth = planner.choose_draft_depth(slots, caps, **step)
    p = est.predict(x)
    check_result(depth.depths, np.int32, (rows,))
    check_result(p, np.float32, (rows, K))
    # A cold estimator is sigmoid(0.5 x - 0.2) (its documented initial coefficients).
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-(0.5 * x.astype(np.float64) - 0.2))), rtol=1e-5)
    assert depth.depths.sum() == depth.drafts and depth.depths.max(initial=0) == depth.max_depth
    # The same calls again (neither changes any state): equal results in new memory, untouched
    # by writes to the first ones.
    first = [depth.depths.copy(), p.copy()]
    depth.depths[...] = 7
    p[...] = 0.25
    again = est.predict(x)
    depth_again = planner.choose_draft_depth(slots, caps, **step)
    np.testing.assert_array_equal(again, first[1])
    np.testing.assert_array_equal(depth_again.depths, first[0])
    plan = planner.plan(slots, again, depth_again.depths, **step)
    check_result(plan.admitted, np.int32, (rows,))
    assert plan.admitted.sum() == plan.budget
    assert ((plan.admitted >= 0) & (plan.admitted <= depth_again.depths)).all()
    results = [depth.depths, p, plan.admitted, again, depth_again.depths, x, slots, caps]
    for i, a in enumerate(results):
        for b in results[i + 1 :]:
            assert not np.shares_memory(a, b)
    est.observe(x, plan.admitted, np.minimum(accepted, plan.admitted), again)


def test_a_batch_computed_without_the_gil_is_the_rows_computed_with_it() -> None:
    """72,000 features (past the size at which the GIL is released): the same bits as the
    rows in small batches, computed with the GIL held."""
    rows = 18_000
    x, slots, caps, _ = step_arrays(rows, 4)
    est = AcceptanceEstimator(K)
    big = est.predict(x)
    small = np.concatenate([est.predict(x[i : i + 100]) for i in range(0, rows, 100)])
    assert big.tobytes() == small.tobytes()
    planner = VerificationPlanner(wide_tables(rows), K, num_slots=rows, exploration=0.0)
    step: dict[str, Any] = {"num_non_draft_tokens": rows, "num_sampling_requests": rows}
    depth = planner.choose_draft_depth(slots, caps, **step)
    assert depth.depths.sum() == depth.drafts
    assert depth.depths.max(initial=0) == depth.max_depth
    plan = planner.plan(slots, big, caps, **step)
    admitted = plan.admitted
    assert admitted.sum() == plan.budget
    assert ((admitted >= 0) & (admitted <= caps)).all()
    # The admitted drafts are the highest survivals: a prefix of each row, and every admitted
    # slot's survival is at least every refused one's.
    survival = np.cumprod(big.astype(np.float64), axis=1)
    taken = np.arange(K) < admitted[:, None]
    if taken.any() and (~taken).any():
        assert survival[taken].min() >= survival[~taken].max() - 1e-6


@pytest.mark.parametrize("shape", [(), (3, 1), (1, 3), (2, 2, 1)])
def test_another_number_of_dimensions_is_refused_in_every_spelling(shape: tuple[int, ...]) -> None:
    """An array of numpy's own descriptor with the wrong number of dimensions is refused with
    the message every other spelling of it gets."""
    est = AcceptanceEstimator(K)
    planner = VerificationPlanner(tables(), K, num_slots=SLOTS)
    step: dict[str, Any] = {"num_non_draft_tokens": 3, "num_sampling_requests": 3}
    ints = np.ones(shape, np.int64)
    floats = np.full((*shape, K)[-3:] if len(shape) != 2 else shape, 0.5, np.float32)

    def run(a: dict[str, Any]) -> Any:
        return (
            outcome(lambda: planner.choose_draft_depth(a["ints"], np.ones(3, np.int64), **step)),
            outcome(lambda: planner.plan(np.arange(3), np.full((3, K), 0.5), a["ints"], **step)),
            outcome(lambda: est.predict(a["floats"])),
            outcome(lambda: est.observe(np.ones((3, K)), a["ints"], np.zeros(3, np.int64))),
        )

    expected = run({"ints": ints, "floats": floats})
    assert all(result[0] == "error" for result in expected)
    for name, a in {"ints": ints, "floats": floats}.items():
        for spelling, value in spellings(a).items():
            if spelling != "list":  # a list of the wrong depth is numpy's to read
                assert run({"ints": ints, "floats": floats, name: value}) == expected, spelling


@pytest.mark.parametrize("rows", [1, 3, 64, 300])
def test_results_in_reused_memory_hold_only_this_calls_values(rows: int) -> None:
    """Results freed with values no call writes (NaN, -7) leave their memory to later results:
    each later result is still exactly this call's answer (the formula, the first call's
    depths and plan), whatever it reuses."""
    x, slots, caps, _ = step_arrays(rows, 5)
    est = AcceptanceEstimator(K)
    planner = VerificationPlanner(wide_tables(max(rows, 2)), K, num_slots=rows)
    step: dict[str, Any] = {"num_non_draft_tokens": rows, "num_sampling_requests": rows}
    expected_p = 1 / (1 + np.exp(-(0.5 * x.astype(np.float64) - 0.2)))
    expected_depths = planner.choose_draft_depth(slots, caps, **step).depths.copy()
    expected_admitted = planner.copy().plan(slots, est.predict(x), caps, **step).admitted.copy()
    for size in (rows, 2 * rows, 1):
        freed = [est.predict(np.zeros((size, K), np.float32)) for _ in range(5)]
        n = min(size, rows)
        few = {"num_non_draft_tokens": n, "num_sampling_requests": n}
        freed += [planner.choose_draft_depth(slots[:n], caps[:n], **few).depths]
        for a in freed:
            a[...] = np.nan if a.dtype.kind == "f" else -7
        del freed, a
        p = est.predict(x)
        np.testing.assert_allclose(p, expected_p, rtol=1e-5)
        np.testing.assert_array_equal(
            planner.choose_draft_depth(slots, caps, **step).depths, expected_depths
        )
        np.testing.assert_array_equal(
            planner.copy().plan(slots, p, caps, **step).admitted, expected_admitted
        )
