"""Arbitrary arrays at every public array-taking entry point: each call either returns a valid
result or raises ValueError/TypeError with a message, and a raising call changes no state."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from av_core import (
    AcceptanceEstimator,
    CostTables,
    VerificationPlanner,
    assign_draft_budget,
    choose_draft_budget,
    plan_verification,
)

K = 3
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_, np.float16, np.complex64]
SPECIAL = [0.0, -0.0, 1.0, 0.5, -1.0, 2.0, 4.0, 1e300, -1e300, np.nan, np.inf, -np.inf, 1e-300]


@st.composite
def arbitrary_array(draw: Any, max_dims: int = 3) -> Any:
    """Any dtype, any small shape (including empty), special values, sometimes a strided view,
    sometimes a Python list or a scalar."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=5))
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
        elements = st.sampled_from(SPECIAL) | st.floats(-50, 50, width=16)
    elif dtype == np.bool_:
        elements = st.booleans()
    else:
        info = np.iinfo(dtype)
        elements = st.integers(max(info.min, -5), min(info.max, 12))
    with np.errstate(all="ignore"):
        array = draw(hnp.arrays(dtype, shape, elements=elements))
    form = draw(st.sampled_from(["array", "strided", "list", "scalar"]))
    if form == "strided" and array.ndim >= 1 and array.shape[-1] > 0:
        return np.repeat(array, 2, axis=-1)[..., ::2]
    if form == "list":
        return array.tolist()
    if form == "scalar":
        return draw(st.sampled_from([None, 1, 2.5, "x", b"y"]))
    return array


def well_formed(draw: Any, rows: int) -> tuple[Any, Any, Any]:
    """Mostly-valid [rows, K] inputs, so the valid path is exercised too."""
    conf = draw(hnp.arrays(np.float64, (rows, K), elements=st.floats(0, 1)))
    sched = draw(hnp.arrays(np.int64, (rows,), elements=st.integers(0, K)))
    acc = np.minimum(sched, draw(hnp.arrays(np.int64, (rows,), elements=st.integers(0, K))))
    return conf, sched, acc


def checked(call: Any, state: Any) -> Any:
    """Runs `call`; on an exception asserts it is a ValueError/TypeError with a message and
    that `state()` did not change."""
    before = state()
    try:
        return call()
    except (ValueError, TypeError) as error:
        assert str(error), "errors must say what went wrong"
        assert state() == before, "a rejected call changed state"
        return None


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=st.data())
def test_estimator_entry_points(data: Any) -> None:
    est = AcceptanceEstimator(K, refit_interval=2)
    est.observe(np.ones((2, K), np.float32), [K, 1], [1, 1])
    rows = data.draw(st.integers(0, 4))
    conf, sched, acc = well_formed(data.draw, rows)
    pick = data.draw
    features = pick(st.sampled_from([conf * 10 - 5, pick(arbitrary_array())]))
    admitted = pick(st.sampled_from([sched, pick(arbitrary_array(1))]))
    accepted = pick(st.sampled_from([acc, pick(arbitrary_array(1))]))
    predictions = pick(st.sampled_from([None, conf, pick(arbitrary_array())]))

    out = checked(lambda: est.predict(features), est.state_dict)
    if out is not None:
        assert out.dtype == np.float32 and out.shape[1] == K
        assert np.all((out >= 0) & (out <= 1))
    result = checked(lambda: est.observe(features, admitted, accepted, predictions), est.state_dict)
    assert result in (None, True, False)
    assert np.isfinite(est.slope) and np.all(np.isfinite(est.intercepts))


TABLES = CostTables(np.linspace(0.0, 1.0, 9), np.linspace(1.0, 5.0, 64))


@SETTINGS
@given(data=st.data())
def test_planner_entry_points(data: Any) -> None:
    rows = data.draw(st.integers(0, 4))
    conf, sched, _ = well_formed(data.draw, rows)
    pick = data.draw
    confidences = pick(st.sampled_from([conf, pick(arbitrary_array())]))
    scheduled = pick(st.sampled_from([sched, pick(arbitrary_array(1))]))
    tokens = pick(st.integers(-2, 70))
    sampling = pick(st.integers(-2, 8))
    budget = pick(st.integers(-2, 20))
    common = {
        "num_non_draft_tokens": tokens,
        "num_sampling_requests": sampling,
        "cost_tables": TABLES,
    }
    nothing = lambda: None  # noqa: E731  (stateless functions)

    b = checked(lambda: choose_draft_budget(confidences, scheduled, **common), nothing)
    if b is not None:
        assert (
            0 <= b <= int(np.sum(sched)) if confidences is conf and scheduled is sched else b >= 0
        )
    a = checked(lambda: assign_draft_budget(confidences, scheduled, budget), nothing)
    if a is not None:
        assert a.dtype == np.int32 and np.all(a >= 0)
    plan = checked(lambda: plan_verification(confidences, scheduled, **common), nothing)
    if plan is not None:
        assert plan.budget == int(plan.admitted.sum())

    planner = VerificationPlanner(TABLES, K, num_slots=6)
    slots = pick(st.sampled_from([np.arange(rows), pick(arbitrary_array(1))]))

    def memory() -> list[list[float]]:
        return [planner.previous_confidences(s).tolist() for s in range(6)]

    plan = checked(
        lambda: planner.plan(
            slots,
            confidences,
            scheduled,
            num_non_draft_tokens=tokens,
            num_sampling_requests=sampling,
        ),
        memory,
    )
    if plan is not None:
        assert plan.budget == int(plan.admitted.sum())


@SETTINGS
@given(draft=arbitrary_array(2), verify=arbitrary_array(2), limit=st.integers(-1, 40))
def test_cost_table_builders(draft: Any, verify: Any, limit: int) -> None:
    for build in (CostTables.from_curves, CostTables.from_samples):
        tables = checked(
            lambda build=build: build(
                draft, verify, max_num_reqs=8, max_batch_tokens=32, cudagraph_limit=limit
            ),
            lambda: None,
        )
        if tables is not None:
            assert np.all(np.isfinite(tables.draft_ms)) and np.all(tables.draft_ms >= 0)
            assert np.all(np.isfinite(tables.verify_ms)) and np.all(tables.verify_ms >= 1e-6)


@pytest.mark.parametrize("data", [b"", b"AVCORE\0E", b"\0" * 64, bytes(range(256))])
def test_arbitrary_state_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        AcceptanceEstimator.from_bytes(data)
