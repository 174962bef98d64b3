"""Cost tables by batch shape (vllm#52559's DFlash profile: ``verify[b, k]``, the ms of one
target pass over ``b`` requests verifying ``k`` drafts each) as av_core's budget and depth hook
read them: each step is priced with the token curve of its own batch size.

The references here are the tests' own: the token curve of row ``R`` written directly from its
meaning (the profiled shapes ``(R (k + 1), verify[R, k])`` after a running maximum, a token
count charged at the next shape up, the last segment extended past the last shape), and the
budget as the brute-force first maximiser of expected tokens per millisecond over every
budget.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from av_core import CostTables
from av_core.vllm import batch_draft_budget
from av_core.vllm import plugin as vllm_plugin
from av_core.vllm.budget import ShapeCostTables, _shape_tables
from av_core.vllm.depth import DraftDepthHook
from av_core.vllm.plugin import VllmCompatibilityError

#: The core's floor on verify costs (CostTables.from_curves).
VERIFY_FLOOR_MS = 1e-6


def reference_curve(row: np.ndarray, requests: int, tokens: int) -> np.ndarray:
    """Verify ms by token count ``0..=tokens`` for ``requests`` requests, from ``row``."""
    ks = [k for k in range(row.size) if np.isfinite(row[k])]
    sizes = [requests * (k + 1) for k in ks]
    costs = list(np.maximum.accumulate([row[k] for k in ks]))
    out = np.empty(tokens + 1)
    for t in range(tokens + 1):
        above = [c for s, c in zip(sizes, costs, strict=True) if s >= t]
        if above:
            out[t] = above[0]
        else:
            slope = (costs[-1] - costs[-2]) / (sizes[-1] - sizes[-2])
            out[t] = costs[-1] + slope * (t - sizes[-1])
    return np.maximum(out, VERIFY_FLOOR_MS)


def brute_force_budget(
    stale: np.ndarray,
    drafts: list[int],
    non_draft: int,
    sampling: int,
    draft_ms: np.ndarray,
    verify: np.ndarray,
    cap: int,
) -> int:
    """The first budget maximising (s + the best survivals) / (draft[R] + verify(T + b))."""
    requests = len(drafts)
    survivals = sorted(
        (float(np.prod(stale[r, : j + 1])) for r in range(requests) for j in range(drafts[r])),
        reverse=True,
    )
    curve = reference_curve(verify[requests], requests, non_draft + cap)
    best, best_rate = 0, -1.0
    for b in range(min(cap, len(survivals)) + 1):
        rate = (sampling + sum(survivals[:b])) / (draft_ms[requests] + curve[non_draft + b])
        if rate > best_rate:
            best, best_rate = b, rate
    return best


def decode_budget(
    stale: np.ndarray, requests: int, k: int, draft_ms: np.ndarray, verify: np.ndarray
) -> int:
    """:func:`brute_force_budget` of a decode step: the first ``requests`` slots, each with one
    non-draft token and ``k`` drafts, all sampling."""
    rows = stale[:requests].astype(np.float64)
    return brute_force_budget(
        rows, [k] * requests, requests, requests, draft_ms, verify, requests * k
    )


def shape_table(rng: np.random.Generator, max_reqs: int, k: int) -> np.ndarray:
    """A verify table by shape: candidates 0, 1, 3, ... and k profiled, inf elsewhere; per-token
    cost that grows with the query length (so equal token counts differ by shape)."""
    table = np.full((max_reqs + 1, k + 1), np.inf)
    ks = sorted({0, *[2**j - 1 for j in range(1, 8) if 2**j - 1 < k], k})
    for b in range(max_reqs + 1):
        for c in ks:
            table[b, c] = 3.0 + 0.2 * b * (c + 1) * (1.0 + 0.3 * c) + rng.uniform(0.0, 0.5)
    return table


def test_for_batch_prices_the_row_of_its_batch_size_by_hand() -> None:
    """Row 2 profiles 2 x 1, 2 x 2 and 2 x 4 tokens; row 3 its own shapes."""
    verify = np.full((4, 4), np.inf)
    verify[2, [0, 1, 3]] = 10.0, 12.0, 20.0
    verify[3, [0, 1, 3]] = 11.0, 15.0, 30.0
    verify[1, [0, 3]] = 5.0, 6.0
    tables = ShapeCostTables(np.array([0.0, 0.5, 0.7, 0.9]), verify)
    two = tables.for_batch(2, 12)
    assert two.verify_ms.tolist() == [10, 10, 10, 12, 12, 20, 20, 20, 20, 22, 24, 26, 28]
    three = tables.for_batch(3, 14)
    assert three.verify_ms.tolist() == [11] * 4 + [15] * 3 + [30] * 6 + [32.5, 35]
    assert two.draft_ms.tolist() == [0.0, 0.5, 0.7, 0.9]
    # Converted once per batch size, grown when a step needs more tokens.
    assert tables.for_batch(2, 5) is two
    assert tables.for_batch(2, 40).verify_ms[40] == 20 + 2 * (40 - 8)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    max_reqs=st.integers(1, 6),
    k=st.integers(1, 6),
    extra=st.integers(0, 30),
)
def test_for_batch_matches_the_reference_on_random_tables(
    seed: int, max_reqs: int, k: int, extra: int
) -> None:
    rng = np.random.default_rng(seed)
    verify = np.where(
        rng.random((max_reqs + 1, k + 1)) < 0.4,
        np.inf,
        rng.uniform(0.0, 20.0, (max_reqs + 1, k + 1)),
    )
    verify[:, 0] = rng.uniform(0.0, 5.0, max_reqs + 1)
    verify[:, k] = rng.uniform(0.0, 40.0, max_reqs + 1)
    draft = rng.uniform(0.0, 3.0, max_reqs + 1)
    tables = ShapeCostTables(draft, verify)
    for requests in range(1, max_reqs + 1):
        tokens = requests * (k + 1) + extra
        got = tables.for_batch(requests, tokens)
        expected = reference_curve(verify[requests], requests, tokens)
        np.testing.assert_allclose(got.verify_ms[: tokens + 1], expected, rtol=1e-12, atol=0)
        np.testing.assert_array_equal(got.draft_ms, draft)


def test_the_budget_reads_the_row_of_the_steps_batch_size() -> None:
    """batch_draft_budget with a (draft, verify[b, k]) pair against the brute force, on random
    steps: decode-only and with prefill tokens, every batch size, the logits cap."""
    rng = np.random.default_rng(3)
    k, max_reqs = 7, 12
    verify = shape_table(rng, max_reqs, k)
    draft = np.sort(rng.uniform(0.1, 2.0, max_reqs + 1))
    checked = differs_from_flat = 0
    for _ in range(300):
        requests = int(rng.integers(1, max_reqs + 1))
        stale = rng.uniform(0.05, 1.0, (max_reqs, k)).astype(np.float32)
        drafts = rng.integers(0, k + 1, requests).tolist()
        rest = [1 + int(rng.integers(0, 6)) * (rng.random() < 0.2) for _ in range(requests)]
        ids = [f"r{i}" for i in range(requests)]
        slots = rng.permutation(max_reqs)[:requests]
        max_total_logits = int(rng.integers(requests, requests * (k + 2)))

        step: dict[str, Any] = {
            "num_tokens_per_req": {i: d + n for i, d, n in zip(ids, drafts, rest, strict=True)},
            "draft_tokens": {i: list(range(d)) for i, d in zip(ids, drafts, strict=True)},
            "req_id_to_index": dict(zip(ids, slots.tolist(), strict=True)),
            "stale_confidences": stale,
            "num_computed_tokens": np.zeros(max_reqs, dtype=np.int64),
            "prefill_len": np.zeros(max_reqs, dtype=np.int64),
            "max_total_logits": max_total_logits,
            "num_bonus_tokens": 1,
        }
        plan = batch_draft_budget(**step, cost_tables=(draft, verify))
        cap = min(sum(drafts), max(0, max_total_logits - requests))
        expected = brute_force_budget(
            stale[slots].astype(np.float64), drafts, sum(rest), requests, draft, verify, cap
        )
        assert plan.draft_budget == expected
        assert plan.num_tokens == sum(rest) + expected
        checked += 1
        # Priced by one flat row instead (the largest batch's), the answer often differs.
        flat = batch_draft_budget(
            **step, cost_tables=ShapeCostTables(draft, verify).for_batch(max_reqs, 200)
        )
        differs_from_flat += flat.draft_budget != expected
    assert checked == 300 and differs_from_flat > 30


def test_a_uniform_shape_costs_exactly_its_profiled_entry() -> None:
    rng = np.random.default_rng(5)
    k, max_reqs = 15, 9
    verify = shape_table(rng, max_reqs, k)
    tables = ShapeCostTables(np.zeros(max_reqs + 1), verify)
    for requests in range(1, max_reqs + 1):
        curve = tables.for_batch(requests, requests * (k + 1)).verify_ms
        for c in (0, 1, 3, 7, 15):
            assert curve[requests * (c + 1)] == verify[requests, c]


@pytest.mark.parametrize(
    ("draft", "verify", "error", "message"),
    [
        ([0.0, 1.0], [[1.0, np.nan], [1.0, 2.0]], ValueError, r"verify_ms\[0, 1\] = nan"),
        ([0.0, 1.0], [[1.0, -2.0], [1.0, 2.0]], ValueError, r"verify_ms\[0, 1\] = -2.0"),
        ([0.0, 1.0], [1.0, 2.0], ValueError, r"verify_ms must be 2-D, got shape \(2,\)"),
        ([0.0, 1.0], np.ones((2, 2, 2)), ValueError, r"verify_ms must be 2-D"),
        ([0.0, 1.0], [[1.0, 2.0]], ValueError, r"shape \[requests \+ 1 >= 2, K \+ 1 >= 2\]"),
        ([[0.0, 1.0]], [[1.0, 2.0], [1.0, 2.0]], ValueError, r"draft_ms must be 1-D"),
        ([0.0, np.inf], [[1.0, 2.0], [1.0, 2.0]], ValueError, r"draft_ms must hold finite"),
        (["a", "b"], [[1.0, 2.0], [1.0, 2.0]], TypeError, r"draft_ms must be a 1-D array"),
    ],
)
def test_shape_tables_refuse_bad_tables_naming_them(
    draft: Any, verify: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ShapeCostTables(draft, verify)


def test_for_batch_refuses_what_it_cannot_price_and_changes_nothing() -> None:
    verify = np.full((4, 3), np.inf)
    verify[1, [0, 2]] = 1.0, 3.0
    verify[2, 0] = 2.0  # one shape only: drafts cannot be priced
    tables = ShapeCostTables(np.zeros(4), verify)
    one = tables.for_batch(1, 4)
    with pytest.raises(ValueError, match=r"verify_ms\[2\] prices 1 shape"):
        tables.for_batch(2, 4)
    with pytest.raises(ValueError, match="num_requests must be at most 3.*got 4"):
        tables.for_batch(4, 4)
    with pytest.raises(ValueError, match="num_requests must be >= 1, got 0"):
        tables.for_batch(0, 4)
    with pytest.raises(TypeError, match="num_tokens must be an int, got bool"):
        tables.for_batch(1, True)
    assert tables.for_batch(1, 4) is one


def test_a_pair_is_converted_once_and_a_new_pair_again() -> None:
    verify = np.full((3, 2), 4.0)
    pair = (np.zeros(3), verify)
    assert _shape_tables(pair) is _shape_tables(pair)
    again = (np.zeros(3), verify.copy())
    assert _shape_tables(again) is not _shape_tables(pair)
    assert _shape_tables((np.zeros(3), np.ones(5))) is None


def manager(cost_tables: Any, stale: np.ndarray) -> types.SimpleNamespace:
    slots = stale.shape[0]
    return types.SimpleNamespace(
        cost_tables=cost_tables,
        req_states=types.SimpleNamespace(
            req_id_to_index={f"r{i}": i for i in range(slots)},
            num_computed_tokens_np=np.zeros(slots, dtype=np.int64),
            prefill_len=types.SimpleNamespace(np=np.zeros(slots, dtype=np.int64)),
        ),
        _stale_confidences=[types.SimpleNamespace(np=stale)],
        _stale_idx=0,
        _max_total_logits=1 << 20,
        num_bonus_tokens=1,
        _batch_budget=None,
    )


def test_the_plugins_get_num_tokens_prices_by_the_batch_shape() -> None:
    """A verify table by batch and K is read by shape at every step, not refused."""
    rng = np.random.default_rng(11)
    k, max_reqs = 7, 8
    verify = shape_table(rng, max_reqs, k)
    draft = np.linspace(0.2, 1.0, max_reqs + 1)
    stale = rng.uniform(0.1, 1.0, (max_reqs, k)).astype(np.float32)
    for requests in (1, 3, 8):
        ids = [f"r{i}" for i in range(requests)]
        state = manager((draft, verify), stale)
        tokens = vllm_plugin._get_num_tokens(
            state, {i: k + 1 for i in ids}, {i: list(range(k)) for i in ids}
        )
        expected = decode_budget(stale, requests, k, draft, verify)
        assert tokens == requests + expected
        assert state._batch_budget == (dict.fromkeys(ids, k), dict.fromkeys(ids, 1), expected)


@pytest.mark.parametrize(
    "tables", [(np.zeros(3), np.ones((3, 2, 2))), (np.zeros((3, 2)), np.ones(9)), (np.zeros(3),)]
)
def test_another_layout_is_refused_by_name_where_av_core_reads_it(tables: Any) -> None:
    state = manager(tables, np.ones((3, 2), np.float32))
    with pytest.raises(VllmCompatibilityError, match="cost_tables have shapes"):
        vllm_plugin._get_num_tokens(state, {"r0": 3}, {"r0": [1, 2]})
    assert state._batch_budget is None
    with pytest.raises(VllmCompatibilityError, match="cost_tables have shapes"):
        vllm_plugin._depth_hook(state, 2)
    assert vllm_plugin._DepthState.hook is None


# --- the depth hook --------------------------------------------------------------------------


def test_the_depth_hook_with_tables_by_shape_decides_as_the_planner_on_its_row() -> None:
    """With every step of 4 requests, a hook on the shape tables and one on a CostTables holding
    row 4's curve must decide alike, exploration included (which the shape path applies
    itself): same depths, explorers, budgets and predicted costs over 400 steps."""
    rng = np.random.default_rng(17)
    k, max_reqs, slots, batch = 5, 6, 16, 4
    verify = shape_table(rng, max_reqs, k)
    draft = np.linspace(0.1, 0.6, max_reqs + 1)
    shaped = ShapeCostTables(draft, verify)
    row = CostTables(draft, shaped.for_batch(batch, 200).verify_ms)
    hooks = [
        DraftDepthHook(
            tables.with_draft_depth("autoregressive", max_depth=k),
            slots,
            k,
            mode=mode,
            exploration=0.3,
            seed=7,
        )
        for tables in (row, shaped)
        for mode in ("batch", "per_request")
    ]
    explored = 0
    for _ in range(400):
        idx = rng.permutation(slots)[:batch]
        confidences = rng.uniform(0.0, 1.0, (batch, k)) ** rng.uniform(0.2, 4.0)
        drafted = rng.integers(0, k + 1, batch)
        for hook in hooks:
            hook.record(idx, confidences, drafted)
        decided = [
            hook.choose(idx, num_non_draft_tokens=batch, num_sampling_requests=batch)
            for hook in hooks
        ]
        for flat, shape in ((0, 2), (1, 3)):
            np.testing.assert_array_equal(decided[flat], decided[shape])
            a, b = hooks[flat], hooks[shape]
            assert a.last_plan is not None and b.last_plan is not None
            assert (a.explored, a.last_plan.budget) == (b.explored, b.last_plan.budget)
            np.testing.assert_array_equal(a.explorers, b.explorers)
            assert a.last_plan.predicted_cost_ms == pytest.approx(
                b.last_plan.predicted_cost_ms, rel=1e-12
            )
            assert a.last_plan.max_depth == b.last_plan.max_depth
        explored += hooks[0].explored
    assert explored > 10


def test_the_depth_hook_prices_each_batch_size_by_its_own_row() -> None:
    """Row 2 verifies drafts almost free, row 6 at 1 s a draft: fresh (optimistic) requests
    draft all K in a batch of 2 and nothing in a batch of 6."""
    k = 3
    verify = np.full((7, k + 1), np.inf)
    verify[:, 0] = 10.0
    verify[2, 1:] = 10.0
    verify[6, 1:] = 10.0 + 1000.0 * np.arange(1, k + 1)
    verify[[1, 3, 4, 5], k] = 20.0
    tables = ShapeCostTables(np.full(7, 0.3), verify).with_draft_depth(
        "autoregressive", max_depth=k
    )
    hook = DraftDepthHook(tables, 8, k, exploration=0.0)
    assert hook.choose([0, 1], num_non_draft_tokens=2, num_sampling_requests=2).tolist() == [k, k]
    six = hook.choose(list(range(6)), num_non_draft_tokens=6, num_sampling_requests=6)
    assert six.tolist() == [0] * 6
    assert hook.last_plan is not None and hook.last_plan.predicted_cost_ms == pytest.approx(10.0)


def test_the_depth_control_hook_takes_a_table_by_shape() -> None:
    verify = np.full((5, 4), 6.0)
    state = manager((np.linspace(0.0, 1.0, 5), verify), np.ones((4, 3), np.float32))
    try:
        hook = vllm_plugin._depth_hook(state, 3)
        assert isinstance(hook.cost_tables, ShapeCostTables)
        assert hook.cost_tables.max_draft_depth == 3
        assert vllm_plugin._depth_hook(state, 3) is hook  # built once per table
    finally:
        vllm_plugin.uninstall()
