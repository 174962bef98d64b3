"""The verification planner against brute force, numpy references and hand cases; errors and
the stateful planner's bookkeeping; the torch assignment against the Rust one."""

from __future__ import annotations

import copy
import itertools
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from av_core import (
    CostTables,
    VerificationPlanner,
    assign_draft_budget,
    choose_draft_budget,
    plan_verification,
)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


# --- independent references ------------------------------------------------------------------


def survivals(conf: FloatArray) -> list[list[Fraction]]:
    """Exact survivals (the inputs are exact binary fractions in the brute-force tests)."""
    out = []
    for row in conf:
        s, acc = Fraction(1), []
        for p in row:
            s *= Fraction(float(p))
            acc.append(s)
        out.append(acc)
    return out


def brute_force(
    conf: FloatArray,
    sched: list[int],
    *,
    t: int,
    s: int,
    draft_ms: float,
    verify_ms: list[float],
    cap: int | None,
) -> tuple[int, list[Fraction]]:
    """Every prefix allocation, exact arithmetic: the first b maximising
    (s + best sum for b) / (draft + verify[t + b]); also the best sum per b."""
    surv = survivals(conf)
    prefix = [
        [sum(row[:a], Fraction(0)) for a in range(n + 1)]
        for row, n in zip(surv, sched, strict=True)
    ]
    total = sum(sched)
    best = [Fraction(-1)] * (total + 1)
    for alloc in itertools.product(*(range(n + 1) for n in sched)):
        b = sum(alloc)
        best[b] = max(best[b], sum((prefix[r][a] for r, a in enumerate(alloc)), Fraction(0)))
    limit = total if cap is None else min(cap, total)
    ratios = [
        (s + best[b]) / (Fraction(draft_ms) + Fraction(verify_ms[t + b])) for b in range(limit + 1)
    ]
    return ratios.index(max(ratios)), best


def rank_order_assignment(conf: FloatArray, sched: list[int], budget: int) -> list[int]:
    """Sort every scheduled slot by (survival desc, depth asc, request asc); count the top."""
    slots = []
    for r, row in enumerate(np.cumprod(conf.astype(np.float64), axis=1)):
        for k in range(sched[r]):
            slots.append((-row[k], k, r))
    slots.sort()
    out = [0] * len(sched)
    for _, _, r in slots[:budget]:
        out[r] += 1
    return out


def vllm_budget(conf: FloatArray, sched: IntArray, t: int, s: int, tables: CostTables) -> int:
    """vLLM 0.33.0's get_num_tokens budget math in numpy (sorted scores, cumsum, argmax)."""
    steps = np.arange(conf.shape[1])
    valid = steps[None, :] < sched[:, None]
    scores = np.sort(np.cumprod(conf.astype(np.float64), axis=1)[valid])[::-1]
    b_max = int(sched.sum())
    e = np.concatenate(([s], s + np.cumsum(scores)))
    costs = tables.draft_ms[conf.shape[0]] + tables.verify_ms[t : t + b_max + 1]
    return int(np.argmax(e / costs))


# --- hand cases from the issue -----------------------------------------------------------------


def test_issue_hand_cases() -> None:
    cliff = CostTables([0.0] * 3, [1, 1, 1, 1, 100, 100, 100])
    conf = np.array([[0.1, 0.1], [0.9, 0.9]])
    budget = choose_draft_budget(
        conf, [2, 2], num_non_draft_tokens=2, num_sampling_requests=2, cost_tables=cliff
    )
    assert budget == 1
    flat = CostTables([0.0] * 3, [1.0] * 7)
    kwargs = {"num_non_draft_tokens": 2, "num_sampling_requests": 2, "cost_tables": flat}
    assert choose_draft_budget(conf, [2, 2], **kwargs) == 4
    for cap in range(5):
        assert choose_draft_budget(conf, [2, 2], max_draft_budget=cap, **kwargs) == cap
    np.testing.assert_array_equal(assign_draft_budget(np.ones((3, 3)), [3, 3, 3], 4), [2, 1, 1])
    np.testing.assert_array_equal(assign_draft_budget(np.ones((3, 8)), [0, 1, 8], 5), [0, 1, 4])
    out = assign_draft_budget(np.full((2, 3), 0.5, np.float32), np.array([1, 3], np.int32), 99)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [1, 3])


def test_plan_returns_everything_in_one_call() -> None:
    tables = CostTables([0.5] * 3, [1, 1, 1, 1, 1, 1, 9])
    conf = np.array([[0.5, 0.5], [1.0, 0.25]])
    plan = plan_verification(
        conf, [2, 2], num_non_draft_tokens=2, num_sampling_requests=2, cost_tables=tables
    )
    budget, admitted, expected, cost = plan
    assert (budget, plan.budget) == (3, 3)
    # 1.0 (request 1), 0.5 (request 0), then 0.25 twice at depth 1: the lower request wins.
    np.testing.assert_array_equal(admitted, [2, 1])
    assert expected == plan.expected_accepted_tokens == 2 + 1.0 + 0.5 + 0.25
    assert cost == plan.predicted_cost_ms == 1.5
    assert "budget=3" in repr(plan)
    # The budget can be sized from other confidences (here: nothing worth verifying).
    zeros = plan_verification(
        conf,
        [2, 2],
        num_non_draft_tokens=2,
        num_sampling_requests=2,
        cost_tables=tables,
        budget_confidences=np.zeros((2, 2), np.float32),
    )
    assert zeros.budget == 0 and zeros.admitted.tolist() == [0, 0]
    assert zeros.expected_accepted_tokens == 2.0


# --- brute force and references ---------------------------------------------------------------


@st.composite
def small_cases(
    draw: st.DrawFn,
) -> tuple[FloatArray, list[int], int, int, float, list[float], int | None]:
    rows = draw(st.integers(1, 3))
    cols = draw(st.integers(1, 3))
    conf = np.array(draw(st.lists(st.integers(0, 8), min_size=rows * cols, max_size=rows * cols)))
    conf = (conf / 8.0).reshape(rows, cols)
    sched = draw(st.lists(st.integers(0, cols), min_size=rows, max_size=rows))
    t = draw(st.integers(0, 3))
    s = draw(st.integers(0, rows))
    draft = draw(st.integers(0, 6)) / 2
    verify = [v / 4 for v in draw(st.lists(st.integers(1, 40), min_size=t + 10, max_size=t + 10))]
    cap = draw(st.none() | st.integers(0, 9))
    return conf, sched, t, s, draft, verify, cap


@settings(max_examples=300, deadline=None)
@given(case=small_cases())
def test_budget_and_assignment_match_brute_force(
    case: tuple[FloatArray, list[int], int, int, float, list[float], int | None],
) -> None:
    conf, sched, t, s, draft, verify, cap = case
    rows = conf.shape[0]
    tables = CostTables([draft] * (rows + 1), verify)
    expected, best = brute_force(conf, sched, t=t, s=s, draft_ms=draft, verify_ms=verify, cap=cap)
    budget = choose_draft_budget(
        conf,
        sched,
        num_non_draft_tokens=t,
        num_sampling_requests=s,
        cost_tables=tables,
        max_draft_budget=cap,
    )
    assert budget == expected
    surv = survivals(conf)
    total = sum(sched)
    for b in range(total + 2):
        admitted = assign_draft_budget(conf, sched, b)
        assert admitted.sum() == min(b, total)
        assert all(0 <= a <= n for a, n in zip(admitted, sched, strict=True))
        got = sum(
            (sum(surv[r][: int(a)], Fraction(0)) for r, a in enumerate(admitted)), Fraction(0)
        )
        assert got == best[min(b, total)]
        assert admitted.tolist() == rank_order_assignment(conf, sched, b)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 300),
    cols=st.integers(1, 16),
    seed=st.integers(0, 2**32 - 1),
    skew=st.sampled_from([0.0, 0.5, 0.9, 0.99]),
    limit=st.integers(0, 600),
)
def test_budget_matches_vllm_numpy_math(
    rows: int, cols: int, seed: int, skew: float, limit: int
) -> None:
    rng = np.random.default_rng(seed)
    conf = (skew + (1 - skew) * rng.random((rows, cols))).astype(np.float32)
    conf[rng.random((rows, cols)) < 0.05] = 1.0
    sched = rng.integers(0, cols + 1, rows)
    t = rows
    max_tokens = t + rows * cols
    curve = sorted({int(x) for x in rng.integers(1, max_tokens + 1, 5)})
    verify = [(x, 5.0 + 0.02 * x + float(rng.random())) for x in curve]
    tables = CostTables.from_curves(
        [(1, 1.0), (rows, 2.0)] if rows > 1 else [(1, 1.0)],
        verify,
        max_num_reqs=rows,
        max_batch_tokens=max_tokens,
        cudagraph_limit=min(limit, max_tokens),
    )
    expected = vllm_budget(conf, sched, t, rows, tables)
    got = choose_draft_budget(
        conf, sched, num_non_draft_tokens=t, num_sampling_requests=rows, cost_tables=tables
    )
    if got != expected:
        # Only a float64 near-tie may resolve differently (sums in a different order).
        scores = np.sort(
            np.cumprod(conf.astype(np.float64), axis=1)[np.arange(cols) < sched[:, None]]
        )[::-1]
        e = rows + np.concatenate(([0.0], np.cumsum(scores)))
        ratio = e / (tables.draft_ms[rows] + tables.verify_ms[t : t + len(e)])
        assert abs(ratio[got] - ratio[expected]) <= 1e-12 * ratio[expected]
    plan = plan_verification(
        conf, sched, num_non_draft_tokens=t, num_sampling_requests=rows, cost_tables=tables
    )
    assert plan.budget == got
    assert plan.admitted.tolist() == rank_order_assignment(conf, sched.tolist(), got)
    surv = np.cumprod(conf.astype(np.float64), axis=1)
    admitted_sum = sum(surv[r, : int(a)].sum() for r, a in enumerate(plan.admitted))
    assert plan.expected_accepted_tokens == pytest.approx(rows + admitted_sum, rel=1e-12)
    assert plan.predicted_cost_ms == tables.draft_ms[rows] + tables.verify_ms[t + got]


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(1, 200),
    cols=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
    levels=st.integers(2, 9),
)
def test_assignment_follows_the_rank_order_with_many_ties(
    rows: int, cols: int, seed: int, levels: int
) -> None:
    rng = np.random.default_rng(seed)
    conf = rng.integers(0, levels, (rows, cols)) / (levels - 1)
    sched = rng.integers(0, cols + 1, rows).tolist()
    total = sum(sched)
    for budget in {0, 1, total // 3, total // 2, total - 1, total, total + 5}:
        if budget < 0:
            continue
        assert assign_draft_budget(conf, sched, budget).tolist() == rank_order_assignment(
            conf, sched, budget
        )


# --- errors ------------------------------------------------------------------------------------


TABLES = CostTables([0.0] * 3, [1.0] * 8)
GOOD = np.full((2, 2), 0.5)
STEP = {"num_non_draft_tokens": 2, "num_sampling_requests": 2, "cost_tables": TABLES}


@pytest.mark.parametrize(
    ("confidences", "scheduled", "argument"),
    [
        (np.array([[0.5, np.nan], [0.5, 0.5]]), [2, 2], "confidences"),
        (np.array([[0.5, np.inf], [0.5, 0.5]]), [2, 2], "confidences"),
        (np.array([[0.5, 1.5], [0.5, 0.5]]), [2, 2], "confidences"),
        (np.array([[0.5, -0.1], [0.5, 0.5]]), [2, 2], "confidences"),
        (GOOD, [2, -1], "scheduled_drafts"),
        (GOOD, [2, 3], "scheduled_drafts"),
        (GOOD, [2], "scheduled_drafts"),
        (GOOD, [2, 2, 2], "scheduled_drafts"),
        (np.full((2, 2, 1), 0.5), [2, 2], "confidences"),
        (np.full((4, 2), 0.5), [2, 2, 2, 2], "confidences"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_argument(
    confidences: FloatArray, scheduled: list[int], argument: str
) -> None:
    with pytest.raises(ValueError, match=f"^{argument}: "):
        choose_draft_budget(confidences, scheduled, **STEP)
    with pytest.raises(ValueError, match=f"^{argument}: "):
        plan_verification(confidences, scheduled, **STEP)
    if argument != "confidences" or confidences.shape[0] <= 2:
        with pytest.raises(ValueError, match=f"^{argument}: "):
            assign_draft_budget(confidences, scheduled, 1)


def test_bad_step_numbers_name_the_argument() -> None:
    base = {"num_non_draft_tokens": 2, "num_sampling_requests": 2, "cost_tables": TABLES}
    for key, value, argument in [
        ("num_non_draft_tokens", 5, "num_non_draft_tokens"),  # 5 + 4 drafts > 7 tokens
        ("num_non_draft_tokens", -1, "num_non_draft_tokens"),
        ("num_sampling_requests", 3, "num_sampling_requests"),
        ("num_sampling_requests", -1, "num_sampling_requests"),
        ("max_draft_budget", -1, "max_draft_budget"),
    ]:
        with pytest.raises(ValueError, match=f"^{argument}: "):
            choose_draft_budget(GOOD, [2, 2], **{**base, key: value})
    # A cap keeps T + budget inside the table.
    assert (
        choose_draft_budget(
            GOOD, [2, 2], **{**base, "num_non_draft_tokens": 5, "max_draft_budget": 2}
        )
        == 2
    )
    with pytest.raises(ValueError, match="^budget_confidences: "):
        plan_verification(GOOD, [2, 2], budget_confidences=np.full((2, 3), 0.5), **STEP)
    with pytest.raises(ValueError, match="^budget_confidences: "):
        plan_verification(GOOD, [2, 2], budget_confidences=np.full((2, 2), np.nan), **STEP)
    with pytest.raises(ValueError, match="^budget: "):
        assign_draft_budget(GOOD, [2, 2], -1)
    with pytest.raises(TypeError, match="^confidences: "):
        choose_draft_budget(GOOD.astype(np.int64), [2, 2], **STEP)
    with pytest.raises(TypeError, match="^scheduled_drafts: "):
        choose_draft_budget(GOOD, [2.0, 2.0], **STEP)


# --- the stateful planner ----------------------------------------------------------------------


def plan(
    planner: VerificationPlanner, slots: list[int], conf: FloatArray, sched: list[int] | None = None
) -> tuple[int, list[int]]:
    result = planner.plan(
        slots,
        conf,
        [conf.shape[1]] * len(slots) if sched is None else sched,
        num_non_draft_tokens=len(slots),
        num_sampling_requests=len(slots),
    )
    return result.budget, result.admitted.tolist()


def test_previous_budget_reads_the_last_step_and_new_slots_start_at_one() -> None:
    flat = CostTables([0.0] * 5, [1.0] * 13)
    previous = VerificationPlanner(flat, 2, num_slots=4)
    current = VerificationPlanner(flat, 2, num_slots=4, budget_source="current")
    assert (previous.budget_source, current.budget_source) == ("previous", "current")
    assert (previous.num_slots, previous.num_positions) == (4, 2)
    zeros, ones = np.zeros((2, 2)), np.ones((2, 2))
    # Fresh slots remember 1.0: the previous planner budgets everything on step one.
    assert plan(previous, [3, 1], zeros) == (4, [2, 2])
    assert plan(current, [3, 1], zeros)[0] == 0
    np.testing.assert_array_equal(previous.previous_confidences(3), [0.0, 0.0])
    # Step two: the previous planner sizes from the zeros it remembered.
    assert plan(previous, [3, 1], ones) == (0, [0, 0])
    assert plan(current, [3, 1], ones) == (4, [2, 2])
    # A new request in slot 3 starts over at 1.0.
    previous.add_request(3)
    np.testing.assert_array_equal(previous.previous_confidences(3), [1.0, 1.0])
    assert plan(previous, [3], ones[:1]) == (2, [2])


def test_admitted_counts_are_the_budget_spread_by_current_confidences() -> None:
    flat = CostTables([0.0] * 3, [1.0] * 7)
    planner = VerificationPlanner(flat, 2, num_slots=2)
    planner.plan(
        [0, 1], np.full((2, 2), 0.5), [2, 2], num_non_draft_tokens=2, num_sampling_requests=2
    )
    # Remembered survivals 0.5, 0.5, 0.25, 0.25 all pay: budget 4 whatever the current ones say.
    budget, admitted = plan(planner, [0, 1], np.array([[0.9, 0.9], [0.1, 0.1]]))
    assert (budget, admitted) == (4, [2, 2])
    capped = planner.plan(
        [0, 1],
        np.array([[0.9, 0.9], [0.1, 0.1]]),
        [2, 2],
        num_non_draft_tokens=2,
        num_sampling_requests=2,
        max_draft_budget=2,
    )
    assert capped.admitted.tolist() == [2, 0]


def test_rejected_calls_change_no_state() -> None:
    planner = VerificationPlanner(CostTables([0.0] * 5, [1.0] * 13), 2, num_slots=4)
    planner.plan(
        [0, 1],
        np.array([[0.5, 0.25], [0.75, 1.0]]),
        [2, 2],
        num_non_draft_tokens=2,
        num_sampling_requests=2,
    )
    before = [planner.previous_confidences(s).tolist() for s in range(4)]
    bad_calls = [
        ([0, 0], GOOD, [2, 2], "slots"),
        ([0, 4], GOOD, [2, 2], "slots"),
        ([-1, 0], GOOD, [2, 2], "slots"),
        ([0], GOOD, [2, 2], "slots"),
        ([0, 1], GOOD, [2, 3], "scheduled_drafts"),
        ([0, 1], np.array([[0.1, np.nan], [0.3, 0.4]]), [2, 2], "confidences"),
        ([0, 1], np.full((2, 3), 0.5), [2, 2], "confidences"),
    ]
    for slots, conf, sched, argument in bad_calls:
        with pytest.raises(ValueError, match=f"^{argument}: "):
            planner.plan(slots, conf, sched, num_non_draft_tokens=2, num_sampling_requests=2)
        assert [planner.previous_confidences(s).tolist() for s in range(4)] == before
    with pytest.raises(ValueError, match="^num_non_draft_tokens: "):
        planner.plan([0, 1], GOOD, [2, 2], num_non_draft_tokens=100, num_sampling_requests=2)
    assert [planner.previous_confidences(s).tolist() for s in range(4)] == before
    with pytest.raises(ValueError, match="^slot: "):
        planner.add_request(4)
    with pytest.raises(ValueError, match="^budget_source: "):
        VerificationPlanner(TABLES, 2, budget_source="stale")
    with pytest.raises(ValueError, match="^num_positions: "):
        VerificationPlanner(TABLES, 0)


def test_copies_are_independent() -> None:
    planner = VerificationPlanner(CostTables([0.0] * 3, [1.0] * 7), 2, num_slots=2)
    clone = planner.copy()
    for other in (clone, copy.copy(planner), copy.deepcopy(planner)):
        other.plan([0], np.zeros((1, 2)), [2], num_non_draft_tokens=1, num_sampling_requests=1)
    np.testing.assert_array_equal(planner.previous_confidences(0), [1.0, 1.0])
    np.testing.assert_array_equal(clone.previous_confidences(0), [0.0, 0.0])
    assert planner.cost_tables == clone.cost_tables
    assert "budget_source" in repr(planner)


# --- the torch assignment ---------------------------------------------------------------------


def torch_cases() -> st.SearchStrategy[tuple[FloatArray, IntArray, int]]:
    @st.composite
    def build(draw: st.DrawFn) -> tuple[FloatArray, IntArray, int]:
        rows = draw(st.integers(1, 40))
        cols = draw(st.integers(1, 10))
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        if draw(st.booleans()):
            conf = rng.integers(0, 5, (rows, cols)) / 4  # many exact ties
        else:
            conf = rng.random((rows, cols)) ** 0.3
        sched = rng.integers(0, cols + 1, rows)
        budget = draw(st.integers(0, rows * cols + 2))
        return conf.astype(np.float32), sched, budget

    return build()


@settings(max_examples=150, deadline=None)
@given(case=torch_cases())
def test_torch_assignment_matches_rust(case: tuple[FloatArray, IntArray, int]) -> None:
    torch = pytest.importorskip("torch")
    from av_core.planner_torch import assign_draft_budget_torch

    conf, sched, budget = case
    expected = assign_draft_budget(conf, sched, budget)
    got = assign_draft_budget_torch(torch.from_numpy(conf), torch.from_numpy(sched), budget)
    assert got.dtype == torch.int32
    assert got.tolist() == expected.tolist()
    as_tensor = assign_draft_budget_torch(
        torch.from_numpy(conf).double(), torch.from_numpy(sched).int(), torch.tensor(budget)
    )
    assert as_tensor.tolist() == expected.tolist()


def test_torch_assignment_rejects_bad_shapes() -> None:
    torch = pytest.importorskip("torch")
    from av_core.planner_torch import assign_draft_budget_torch

    conf = torch.full((2, 3), 0.5)
    with pytest.raises(ValueError, match="^scheduled_drafts: "):
        assign_draft_budget_torch(conf, torch.tensor([3]), 1)
    with pytest.raises(TypeError, match="^scheduled_drafts: "):
        assign_draft_budget_torch(conf, torch.tensor([3.0, 3.0]), 1)
    with pytest.raises(ValueError, match="^confidences: "):
        assign_draft_budget_torch(conf[0], torch.tensor([3]), 1)
    with pytest.raises(ValueError, match="^budget: "):
        assign_draft_budget_torch(conf, torch.tensor([3, 3]), -1)


@pytest.mark.cuda
def test_torch_assignment_on_gpu_matches_rust_without_host_sync() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from av_core.planner_torch import assign_draft_budget_torch

    rng = np.random.default_rng(1)
    for rows, cols in [(8, 4), (256, 8), (1024, 16)]:
        for ties in (False, True):
            conf = rng.integers(0, 5, (rows, cols)) / 4 if ties else rng.random((rows, cols)) ** 0.3
            conf = conf.astype(np.float32)
            sched = rng.integers(0, cols + 1, rows)
            for budget in (0, 1, int(sched.sum()) // 2, int(sched.sum())):
                expected = assign_draft_budget(conf, sched, budget)
                device = torch.device("cuda")
                c, s = torch.from_numpy(conf).to(device), torch.from_numpy(sched).to(device)
                b = torch.tensor(budget, device=device)
                torch.cuda.set_sync_debug_mode("error")
                try:
                    got = assign_draft_budget_torch(c, s, b)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                assert got.device.type == "cuda"
                assert got.cpu().tolist() == expected.tolist()


def test_an_empty_batch_plans_nothing() -> None:
    empty = np.zeros((0, 4))
    assert (
        choose_draft_budget(
            empty,
            np.zeros(0, np.int64),
            **{**STEP, "num_non_draft_tokens": 0, "num_sampling_requests": 0},
        )
        == 0
    )
    assert assign_draft_budget(empty, np.zeros(0, np.int64), 3).tolist() == []
