"""One planner API: the stateless calls are one-shot uses of the planner, so they decide what a
`VerificationPlanner` holding the same confidences decides, and refuse a bad argument with the
same error; large batches release the GIL, small ones keep it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from av_core import CostTables, VerificationPlanner, choose_draft_depth, plan_verification

FloatArray = npt.NDArray[np.float64]


def tables(rows: int, k: int) -> CostTables:
    top = max(rows * (k + 1), 1024)
    verify = [(1, 6.0), (256, 6.0), (512, 7.0), (top, 7.0 + 0.01 * top)]
    return CostTables.from_curves(
        [(1, 0.5), (rows + 1, 1.0 + 0.002 * rows)],
        verify,
        max_num_reqs=rows,
        max_batch_tokens=top,
        cudagraph_limit=512,
    ).with_draft_depth("autoregressive", max_depth=k)


def confidences(rng: np.random.Generator, rows: int, k: int) -> FloatArray:
    return (1.0 - 0.6 * rng.random((rows, k)) ** 2).astype(np.float64)


@pytest.mark.parametrize("seed", range(6))
def test_stateless_calls_decide_as_the_planner_does(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, k = int(rng.integers(1, 300)), int(rng.choice([1, 3, 4, 8, 16]))
    cost = tables(rows, k)
    previous, current = confidences(rng, rows, k), confidences(rng, rows, k)
    scheduled = rng.integers(0, k + 1, rows)
    slots = rng.permutation(rows).astype(np.int64)
    step = {"num_non_draft_tokens": rows, "num_sampling_requests": rows}
    planner = VerificationPlanner(cost, k, num_slots=rows, exploration=0.0)
    # Remember `previous` for every slot (whole rows), then plan `current` from it.
    planner.remember(slots, previous, np.full(rows, k))
    depth = planner.choose_draft_depth(slots, scheduled, **step)
    expected_depth = choose_draft_depth(previous, scheduled, cost_tables=cost, **step)
    assert depth.max_depth == expected_depth.max_depth
    assert np.array_equal(depth.depths, expected_depth.depths)
    assert (depth.budget, depth.expected_accepted_tokens, depth.predicted_cost_ms) == (
        expected_depth.budget,
        expected_depth.expected_accepted_tokens,
        expected_depth.predicted_cost_ms,
    )
    plan = planner.plan(slots, current, scheduled, **step)
    expected = plan_verification(
        current, scheduled, cost_tables=cost, budget_confidences=previous, **step
    )
    assert plan.budget == expected.budget
    assert np.array_equal(plan.admitted, expected.admitted)
    assert plan.expected_accepted_tokens == expected.expected_accepted_tokens
    assert plan.predicted_cost_ms == expected.predicted_cost_ms


BAD = [
    ("scheduled_drafts", {"scheduled": np.array([2, 9])}),
    ("scheduled_drafts", {"scheduled": np.array([2])}),
    ("confidences", {"current": np.array([[0.5, np.nan], [0.5, 0.5]])}),
    ("confidences", {"current": np.array([[0.5, 1.5], [0.5, 0.5]])}),
    ("num_sampling_requests", {"sampling": 3}),
    ("num_non_draft_tokens", {"tokens": 10**6}),
]


@pytest.mark.parametrize(("argument", "change"), BAD)
def test_a_bad_argument_is_the_same_error_through_every_entry_point(
    argument: str, change: dict[str, object]
) -> None:
    cost = tables(2, 2)
    current = change.get("current", np.array([[0.5, 0.5], [0.9, 0.1]]))
    scheduled = change.get("scheduled", np.array([2, 1]))
    step = {
        "num_non_draft_tokens": change.get("tokens", 2),
        "num_sampling_requests": change.get("sampling", 2),
    }
    with pytest.raises(ValueError) as stateless:
        plan_verification(current, scheduled, cost_tables=cost, **step)  # type: ignore[arg-type]
    planner = VerificationPlanner(cost, 2, num_slots=2, budget_source="current")
    with pytest.raises(ValueError) as stateful:
        planner.plan(np.array([0, 1]), current, scheduled, **step)  # type: ignore[arg-type]
    assert str(stateless.value) == str(stateful.value)
    assert str(stateless.value).startswith(argument)
    # A rejected call changes nothing: the planner still remembers its optimistic start.
    assert np.array_equal(planner.previous_confidences(0), [1.0, 1.0])


@pytest.mark.parametrize(("rows", "calls", "releases"), [(16384, 200, True), (64, 500, False)])
def test_large_batches_release_the_gil_and_small_ones_keep_it(
    rows: int,
    calls: int,
    releases: bool,
    gil_ticks: Callable[[Callable[[], object], int, bool], int],
) -> None:
    """Batches of at least 65,536 confidences run with the GIL released; smaller ones hold it
    (a waiting thread runs only while a call has released it: `conftest.ticks_during`)."""
    k = 8
    cost = tables(rows, k)
    current = confidences(np.random.default_rng(0), rows, k)
    scheduled = np.full(rows, k)

    def plan() -> None:
        plan_verification(
            current,
            scheduled,
            num_non_draft_tokens=rows,
            num_sampling_requests=rows,
            cost_tables=cost,
            budget_confidences=current,
        )

    during = gil_ticks(plan, calls, releases)
    assert (during > 0) == releases
