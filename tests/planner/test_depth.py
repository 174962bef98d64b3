"""Drafting depth: the draft-cost-by-depth table, ``choose_draft_depth`` against a brute-force
numpy reference, the stateful planner's depth decision, bad input, and losslessness of a step
with depth control, proven by exact enumeration (``av_core.testing``)."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from av_core import CostTables, VerificationPlanner, choose_draft_depth
from av_core.testing import (
    DraftOutcome,
    SpecTables,
    confidence_matrices,
    cost_tables,
    depth_planner_rule,
    emitted_distribution,
    is_lossless,
    spec_tables,
)

EXACT = 1e-12


# --- cost tables ------------------------------------------------------------------------------


def test_depth_table_shapes_and_costs() -> None:
    base = CostTables([0.0, 1.0, 1.5, 2.0], [5.0] * 13)
    assert base.draft_depth_ms is None and base.max_draft_depth is None
    auto = base.with_draft_depth("autoregressive", max_depth=4)
    np.testing.assert_array_equal(auto.draft_depth_ms, [0, 0.25, 0.5, 0.75, 1])
    assert auto.max_draft_depth == 4
    assert auto.draft_cost_ms(3, 2) == 1.0  # half the passes of draft_ms[3]
    assert auto.draft_cost_ms(3, 0) == 0.0 and auto.draft_cost_ms(0, 4) == 0.0
    block = base.with_draft_depth("parallel", max_depth=4)
    assert block.draft_cost_ms(2, 1) == block.draft_cost_ms(2, 4) == 1.5
    # Pass j runs over the requests drafting at least j positions.
    assert auto.step_draft_cost_ms([4, 1, 0]) == 1.5 * 0.25 + 1.0 * 0.75
    assert block.step_draft_cost_ms([4, 1, 0]) == 1.5
    assert base.draft_cost_ms(2, 3) == 1.5  # no depth table: vLLM's constant
    # The original is unchanged (tables are immutable).
    assert base.draft_depth_ms is None


def test_depth_curve_is_built_like_the_other_curves() -> None:
    draft, verify = [(1, 0.5), (4, 0.8)], [(1, 6.0), (64, 7.0)]
    tables = CostTables.from_curves(
        draft,
        verify,
        max_num_reqs=4,
        max_batch_tokens=64,
        draft_depth_curve=[(1, 0.6), (2, 1.1), (4, 2.0)],
        max_draft_depth=6,
    )
    # Step function up to the last point (depth 3 is charged at depth 4), then the last
    # segment extended (0.45 ms per depth), depth 0 free.
    np.testing.assert_allclose(tables.draft_depth_ms, [0, 0.6, 1.1, 2.0, 2.0, 2.45, 2.9])
    # Default depth: the deepest profiled point.
    tables = CostTables.from_curves(
        draft, verify, max_num_reqs=4, max_batch_tokens=64, draft_depth_curve=[(1, 1), (3, 2)]
    )
    assert tables.max_draft_depth == 3
    # Raw samples: the median per depth.
    samples = [(1, 0.6), (1, 9.0), (1, 0.6), (2, 1.0), (2, 1.2), (2, 1.1)]
    tables = CostTables.from_samples(
        draft, verify, max_num_reqs=4, max_batch_tokens=64, draft_depth_samples=samples
    )
    np.testing.assert_allclose(tables.draft_depth_ms, [0, 0.6, 1.1])


def test_depth_table_round_trips() -> None:
    tables = CostTables([0.0, 0.3], [5.0, 6.0], draft_depth_ms=[0.0, 0.1, 0.30000000000000004])
    assert '"draft_depth_ms"' in tables.to_json()
    assert CostTables.from_json(tables.to_json()) == tables
    assert pickle.loads(pickle.dumps(tables)) == tables
    assert tables != CostTables([0.0, 0.3], [5.0, 6.0])
    assert "max_draft_depth=2" in repr(tables)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([1.0, 2.0], r"\[0\] = 1 must be 0"),  # depth 0 runs no drafter
        ([0.0, 2.0, 1.0], r"\[2\] = 1 must be finite and >= \[1\] = 2"),  # deeper never cheaper
        ([0.0, float("nan")], r"\[1\] = NaN"),
        ([0.0], "has 1 entries"),  # needs K >= 1
    ],
)
def test_bad_depth_tables_name_the_argument_and_value(table: list[float], message: str) -> None:
    with pytest.raises(ValueError, match="draft_depth_ms: " + message):
        CostTables([0.0], [1.0], draft_depth_ms=table)


def test_bad_drafter_kinds_name_the_argument() -> None:
    base = CostTables([0.0], [1.0])
    with pytest.raises(ValueError, match='draft_depth_ms.*"block"'):
        base.with_draft_depth("block", max_depth=4)
    with pytest.raises(ValueError, match="max_depth"):
        base.with_draft_depth("parallel")
    with pytest.raises(ValueError, match="max_depth"):
        base.with_draft_depth([0.0, 1.0], max_depth=1)
    with pytest.raises(ValueError, match="max_draft_depth"):
        CostTables.from_curves(
            [(1, 1)], [(1, 1)], max_num_reqs=1, max_batch_tokens=1, max_draft_depth=3
        )


# --- the decision against brute force ---------------------------------------------------------


def survivals(confidences: np.ndarray) -> np.ndarray:
    return np.cumprod(confidences, axis=1)


def drafting_ms(tables: CostTables, depths: np.ndarray) -> float:
    """The documented drafting price, from the raw tables (not ``step_draft_cost_ms``): pass
    ``j`` runs over the ``R_j`` requests drafting at least ``j`` positions and costs
    ``draft_ms[R_j] · (f(j) − f(j − 1))``, ``f(j) = draft_depth_ms[j] / draft_depth_ms[K]``."""
    depth_ms = tables.draft_depth_ms
    assert depth_ms is not None
    full = float(depth_ms[-1])

    def fraction(j: int) -> float:
        if j == 0:
            return 0.0
        return 0.0 if full <= 0 else float(depth_ms[min(j, len(depth_ms) - 1)]) / full

    cost = 0.0
    for j in range(1, int(np.max(depths, initial=0)) + 1):
        rows = int(np.sum(np.asarray(depths) >= j))
        if rows:
            cost += float(tables.draft_ms[rows]) * (fraction(j) - fraction(j - 1))
    return cost


def test_the_reference_drafting_price_is_the_documented_one() -> None:
    """Hand values for the reference itself (the function under test is not consulted)."""
    tables = CostTables([0.0, 1.0, 1.5, 2.0], [5.0] * 13)
    auto = tables.with_draft_depth("autoregressive", max_depth=4)
    # Pass 1 over 2 requests (1.5 ms · 1/4), passes 2-4 over one (1.0 · 3/4).
    assert drafting_ms(auto, np.array([4, 1, 0])) == pytest.approx(1.5 * 0.25 + 1.0 * 0.75)
    block = tables.with_draft_depth("parallel", max_depth=4)
    assert drafting_ms(block, np.array([4, 1, 0])) == pytest.approx(1.5)
    assert drafting_ms(auto, np.array([0, 0])) == 0.0


def best_ratio_for_depths(
    surv: np.ndarray, depths: np.ndarray, tables: CostTables, t: int, s: int
) -> float:
    """With the depths fixed, the best verification budget: the top-b drafted survivals."""
    values = np.sort(np.concatenate([surv[r, :d] for r, d in enumerate(depths)]))[::-1]
    draft = drafting_ms(tables, depths)
    verify = tables.verify_ms
    ratios = (s + np.r_[0.0, np.cumsum(values)]) / (draft + verify[t : t + len(values) + 1])
    return float(ratios.max())


def reference_batch(
    conf: np.ndarray, caps: np.ndarray, tables: CostTables, t: int, s: int
) -> tuple[int, float]:
    """Every depth, every budget: the first depth with the best tokens per ms."""
    surv = survivals(conf)
    best_depth, best = 0, s / tables.verify_ms[t]
    for d in range(1, int(caps.max(initial=0)) + 1):
        ratio = best_ratio_for_depths(surv, np.minimum(caps, d), tables, t, s)
        if ratio > best * (1 + 1e-12):
            best_depth, best = d, ratio
    return best_depth, best


def reference_per_request(
    conf: np.ndarray, caps: np.ndarray, tables: CostTables, t: int, s: int
) -> tuple[np.ndarray, float]:
    """The documented per-request rule (``planner/depth.rs``): for each number of passes D,
    the slots at positions < D in survival order (shallower, then lower request on ties),
    every prefix priced from scratch with :func:`drafting_ms`."""
    surv = survivals(conf)
    slots = sorted(
        ((surv[r, j], j, r) for r in range(conf.shape[0]) for j in range(caps[r])),
        key=lambda x: (-x[0], x[1], x[2]),
    )
    best_depths, best = np.zeros(conf.shape[0], dtype=np.int64), s / tables.verify_ms[t]
    for d in range(1, int(caps.max(initial=0)) + 1):
        depths = np.zeros(conf.shape[0], dtype=np.int64)
        e = float(s)
        for n, (value, _, r) in enumerate((x for x in slots if x[1] < d), start=1):
            depths[r] += 1
            e += value
            ratio = e / (drafting_ms(tables, depths) + tables.verify_ms[t + n])
            if ratio > best * (1 + 1e-12):
                best_depths, best = depths.copy(), ratio
    return best_depths, best


def exhaustive_per_request(
    conf: np.ndarray, caps: np.ndarray, tables: CostTables, t: int, s: int
) -> float:
    """Brute force over every depth vector (0..caps[r] per request) and every budget: the best
    tokens per ms any per-request depth choice can reach."""
    surv = survivals(conf)
    best = s / tables.verify_ms[t]
    for depths in itertools.product(*(range(int(c) + 1) for c in caps)):
        best = max(best, best_ratio_for_depths(surv, np.array(depths), tables, t, s))
    return best


@st.composite
def depth_case(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, CostTables]:
    r = draw(st.integers(1, 12))
    k = draw(st.integers(1, 6))
    conf = draw(confidence_matrices(r, k))
    caps = np.array(draw(st.lists(st.integers(0, k), min_size=r, max_size=r)))
    tables = draw(cost_tables(max_num_reqs=r, max_batch_tokens=r * (k + 1), max_size=r * (k + 1)))
    kind = draw(st.sampled_from(["autoregressive", "parallel"]))
    return conf, caps, tables.with_draft_depth(kind, max_depth=k)


@settings(max_examples=150, deadline=None)
@given(case=depth_case())
def test_batch_depth_matches_brute_force(case: tuple[np.ndarray, np.ndarray, CostTables]) -> None:
    conf, caps, tables = case
    r = conf.shape[0]
    plan = choose_draft_depth(
        conf, caps, num_non_draft_tokens=r, num_sampling_requests=r, cost_tables=tables
    )
    depth, ratio = reference_batch(conf, caps, tables, r, r)
    got = plan.expected_accepted_tokens / plan.predicted_cost_ms
    assert got == pytest.approx(ratio, rel=1e-9)
    # Near-ties may pick another depth of the same value; otherwise the depth must agree.
    if plan.max_depth != depth:
        _, alternative = reference_batch(conf, np.minimum(caps, plan.max_depth), tables, r, r)
        assert alternative == pytest.approx(ratio, rel=1e-9)
    np.testing.assert_array_equal(plan.depths, np.minimum(caps, plan.max_depth))
    assert plan.drafts == plan.depths.sum()


@settings(max_examples=150, deadline=None)
@given(case=depth_case())
def test_per_request_depth_matches_brute_force(
    case: tuple[np.ndarray, np.ndarray, CostTables],
) -> None:
    conf, caps, tables = case
    r = conf.shape[0]
    plan = choose_draft_depth(
        conf,
        caps,
        num_non_draft_tokens=r,
        num_sampling_requests=r,
        cost_tables=tables,
        mode="per_request",
    )
    depths, ratio = reference_per_request(conf, caps, tables, r, r)
    got = plan.expected_accepted_tokens / plan.predicted_cost_ms
    assert got == pytest.approx(ratio, rel=1e-9)
    assert np.all(plan.depths <= caps)
    assert plan.drafts == plan.depths.sum() and plan.max_depth == plan.depths.max(initial=0)
    assert plan.predicted_cost_ms == pytest.approx(
        tables.step_draft_cost_ms(plan.depths) + tables.verify_ms[r + plan.budget], rel=1e-12
    )
    # Priced independently: the plan's own depths and budget give its ratio.
    surv = survivals(conf)
    taken = np.sort(np.concatenate([surv[i, :d] for i, d in enumerate(plan.depths)]))[::-1]
    assert plan.expected_accepted_tokens == pytest.approx(r + taken[: plan.budget].sum())
    assert plan.predicted_cost_ms == pytest.approx(
        drafting_ms(tables, plan.depths) + tables.verify_ms[r + plan.budget], rel=1e-9
    )
    # Against every depth vector: a greedy, so never above the exhaustive optimum, and (the
    # documented guarantee, for non-decreasing draft costs) never below batch mode.
    if np.prod(caps + 1) <= 4096:
        assert got <= exhaustive_per_request(conf, caps, tables, r, r) * (1 + 1e-9)
    if np.all(np.diff(tables.draft_ms) >= 0):
        assert got >= reference_batch(conf, caps, tables, r, r)[1] * (1 - 1e-9)


def test_depth_follows_load() -> None:
    """Low load: verification is memory-bound and cheap, so draft deep. High load: verification
    is compute-bound, and drafting that nobody will verify is skipped entirely."""
    k = 4
    max_r = 256
    verify = 6.0 + np.maximum(0, np.arange(max_r * (k + 1) + 1) - 256) * 0.03
    draft = np.r_[0.0, np.full(max_r, 0.6 * k)]
    tables = CostTables(draft, verify).with_draft_depth("autoregressive", max_depth=k)
    conf = np.full((max_r, k), 0.6)
    depth_at = {}
    for r in (1, 8, 64, 256):
        plan = choose_draft_depth(
            conf[:r], [k] * r, num_non_draft_tokens=r, num_sampling_requests=r, cost_tables=tables
        )
        depth_at[r] = plan.max_depth
    assert depth_at[1] >= 1 and depth_at[8] >= 1
    assert depth_at[256] == 0
    assert depth_at[1] >= depth_at[64] >= depth_at[256]


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"max_depths": [5, 1]}, "max_depths"),
        ({"max_depths": [-1, 1]}, "max_depths"),
        ({"max_depths": [1, 1, 1]}, "max_depths"),
        ({"confidences": [[0.5, 1.5, 0.5, 0.5]] * 2}, "confidences"),
        ({"confidences": np.full((2, 6), 0.5), "max_depths": [1, 1]}, "confidences"),
        ({"num_non_draft_tokens": 40}, "num_non_draft_tokens"),
        ({"num_sampling_requests": 3}, "num_sampling_requests"),
        ({"mode": "deep"}, "mode"),
        ({"cost_tables": CostTables([0.0] * 3, [1.0] * 12)}, "cost_tables"),
    ],
)
def test_bad_depth_input_names_the_argument(kwargs: dict, argument: str) -> None:  # type: ignore[type-arg]
    args = {
        "confidences": np.full((2, 4), 0.5),
        "max_depths": [4, 4],
        "num_non_draft_tokens": 2,
        "num_sampling_requests": 2,
        "cost_tables": CostTables([0.0] * 3, [1.0] * 12).with_draft_depth("parallel", max_depth=4),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=argument):
        choose_draft_depth(
            args.pop("confidences"),
            args.pop("max_depths"),
            **args,  # type: ignore[arg-type]
        )


# --- the stateful planner ---------------------------------------------------------------------


def stateful_planner(exploration: float = 0.0) -> VerificationPlanner:
    tables = CostTables([0.0] + [4.0] * 8, [10.0] * 64).with_draft_depth(
        "autoregressive", max_depth=3
    )
    return VerificationPlanner(tables, 3, num_slots=8, exploration=exploration)


def test_stateful_depth_reads_remembered_confidences_and_changes_nothing() -> None:
    planner = stateful_planner()
    step = {"num_non_draft_tokens": 2, "num_sampling_requests": 2}
    fresh = planner.choose_draft_depth([1, 5], [3, 3], **step)
    np.testing.assert_array_equal(fresh.depths, [3, 3])  # optimistic 1.0s: draft all
    planner.plan([1, 5], np.full((2, 3), 0.05), [3, 3], **step)
    before = planner.to_bytes()
    poor = planner.choose_draft_depth([1, 5], [3, 3], **step)
    np.testing.assert_array_equal(poor.depths, [0, 0])
    assert planner.to_bytes() == before
    # Bad input: ValueError naming the argument, no state change.
    for args, argument in (
        (([1, 1], [3, 3]), "slots"),
        (([1, 9], [3, 3]), "slots"),
        (([1, 5], [3]), "max_depths"),
        (([1, 5], [4, 3]), "max_depths"),
    ):
        with pytest.raises(ValueError, match=argument):
            planner.choose_draft_depth(*args, **step)
    assert planner.to_bytes() == before
    # A shallower step overwrites only the drafted positions.
    planner.plan([1, 5], np.full((2, 3), 0.5), [1, 0], **step)
    np.testing.assert_array_equal(planner.previous_confidences(1), [0.5, 0.05, 0.05])
    np.testing.assert_array_equal(planner.previous_confidences(5), [0.05] * 3)
    back = VerificationPlanner.from_bytes(planner.to_bytes())
    assert back.cost_tables == planner.cost_tables


def test_exploration_steps_draft_whole_blocks_for_explorers_only() -> None:
    """Drafting is never worth it here, so only exploration drafts: in about one step in
    1/exploration the plan's explorers draft their whole blocks, and verify exactly those."""
    tables = CostTables([0.0] + [100.0] * 64, [10.0] * 400).with_draft_depth(
        "autoregressive", max_depth=4
    )
    planner = VerificationPlanner(tables, 4, num_slots=64, exploration=0.1, exploration_seed=5)
    slots = np.arange(64)
    step = {"num_non_draft_tokens": 64, "num_sampling_requests": 64}
    exploring_steps = explorers = 0
    for _ in range(200):
        depth = planner.choose_draft_depth(slots, [4] * 64, **step)
        assert set(depth.depths.tolist()) <= {0, 4}
        plan = planner.plan(slots, np.full((64, 4), 0.01), depth.depths, **step)
        np.testing.assert_array_equal(plan.admitted, depth.depths)
        exploring_steps += depth.max_depth > 0
        explorers += int((depth.depths == 4).sum())
    assert 5 <= exploring_steps <= 50
    assert explorers < 20 * exploring_steps


# --- losslessness -----------------------------------------------------------------------------


def lossless(law: dict, tables: SpecTables) -> bool:  # type: ignore[type-arg]
    return is_lossless(law, tables, EXACT)


@st.composite
def depth_planning_case(
    draw: st.DrawFn, drafter: str
) -> tuple[SpecTables, VerificationPlanner, list[int]]:
    r = draw(st.integers(1, 2))
    if r == 1:
        tables = draw(spec_tables(num_requests=1, drafter=drafter))  # type: ignore[arg-type]
    else:
        v, k = draw(st.sampled_from([(2, 2), (2, 3), (3, 2)]))
        tables = draw(
            spec_tables(num_requests=2, vocab_size=v, num_positions=k, drafter=drafter)  # type: ignore[arg-type]
        )
    k = tables.num_positions
    costs = draw(cost_tables(max_num_reqs=2, max_batch_tokens=2 + 2 * k, max_size=2 + 2 * k))
    kind = draw(st.sampled_from(["autoregressive", "parallel"]))
    source = (
        "previous"
        if drafter == "autoregressive"
        else draw(st.sampled_from(["previous", "current"]))
    )
    planner = VerificationPlanner(
        costs.with_draft_depth(kind, max_depth=k),
        k,
        num_slots=r,
        budget_source=source,
        exploration=draw(st.sampled_from([0.0, 0.5])),
        exploration_seed=draw(st.integers(0, 3)),
    )
    remembered = draw(confidence_matrices(r, k))
    planner.plan(np.arange(r), remembered, [k] * r, num_non_draft_tokens=r, num_sampling_requests=r)
    caps = draw(st.lists(st.integers(0, k), min_size=r, max_size=r))
    return tables, planner, caps


@settings(max_examples=60, deadline=None)
@given(case=depth_planning_case("autoregressive"), mode=st.sampled_from(["batch", "per_request"]))
def test_depth_control_is_lossless_for_autoregressive_drafters(
    case: tuple[SpecTables, VerificationPlanner, list[int]], mode: str
) -> None:
    tables, planner, caps = case
    rule = depth_planner_rule(planner, mode=mode, max_depths=caps)  # type: ignore[arg-type]
    assert lossless(emitted_distribution(rule, tables), tables)


@settings(max_examples=40, deadline=None)
@given(case=depth_planning_case("parallel"), mode=st.sampled_from(["batch", "per_request"]))
def test_depth_control_is_lossless_for_parallel_drafters(
    case: tuple[SpecTables, VerificationPlanner, list[int]], mode: str
) -> None:
    tables, planner, caps = case
    rule = depth_planner_rule(planner, mode=mode, max_depths=caps)  # type: ignore[arg-type]
    assert lossless(emitted_distribution(rule, tables), tables)


def test_depth_control_changes_what_is_drafted() -> None:
    """The harness must be able to see depth control at work: with a remembered hopeless
    request the step drafts nothing, and its law is then exactly one target token."""
    tables = SpecTables.from_functions(
        vocab_size=2,
        num_positions=2,
        num_requests=1,
        target=lambda r, prefix: [0.9, 0.1],
        drafter=lambda r, prefix: [0.5, 0.5],
    )
    costs = CostTables([0.0, 5.0], [1.0] * 4).with_draft_depth("autoregressive", max_depth=2)
    planner = VerificationPlanner(costs, 2, num_slots=1, exploration=0.0)
    planner.plan([0], [[0.01, 0.01]], [2], num_non_draft_tokens=1, num_sampling_requests=1)
    rule = depth_planner_rule(planner)
    seen: list[int] = []

    def recording(outcome: DraftOutcome) -> list[int]:
        admitted = list(rule(outcome))
        seen.extend(admitted)
        return admitted

    assert lossless(emitted_distribution(recording, tables), tables)
    assert set(seen) == {0}


def test_a_depth_rule_that_reads_the_token_it_governs_is_biased() -> None:
    """The known counterexample, as a depth decision: draft (and verify) position 0 only when
    the token drafted there is 1. p = (.5, .5), q = (.2, .8) emits (.4, .6), not (.5, .5)."""
    tables = SpecTables.from_functions(
        vocab_size=2,
        num_positions=1,
        num_requests=1,
        target=lambda r, prefix: [0.5, 0.5],
        drafter=lambda r, prefix: [0.2, 0.8],
    )
    costs = CostTables([0.0, 0.0], [1.0, 1.0, 1.0]).with_draft_depth("parallel", max_depth=1)
    planner = VerificationPlanner(costs, 1, num_slots=1, exploration=0.0)
    cheating = depth_planner_rule(
        planner, depth_rule=lambda outcome: [1 if outcome.tokens[0][0] == 1 else 0]
    )
    law = emitted_distribution(cheating, tables)
    first = {0: 0.0, 1: 0.0}
    for (sequence,), p in law.items():
        first[sequence[0]] += p
    assert first[0] == pytest.approx(0.4, abs=EXACT)
    assert not lossless(law, tables)
