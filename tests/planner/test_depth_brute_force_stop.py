"""The batch depth decision on batches large enough for its histogram path, under uneven prices.

Batches of more than 64 scheduled slots (not all equal) take the bucket-histogram path of
``choose_draft_depth``: a running histogram grown one column per depth, a crowded column summed
in registers, and an early stop once no deeper depth can reach the best depth so far (its slots
dominated by copies of the last column, priced at the cheapest deeper drafting cost). The
prices here are the ones that stress that stop: drafting costs by depth that jump and then stay
flat (a depth that is not kept followed by one that wins), verification costs that dip, step
or climb steeply, free or dear drafting, caps that differ by row, budget caps. Each decision is
checked against a brute force written from the documented rule (every depth, every budget,
sorted sums, the documented drafting price), and every SIMD level must give the same bits.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from level_digests import level_digests

from av_core import CostTables, choose_draft_depth


def survivals(conf: np.ndarray) -> np.ndarray:
    return np.cumprod(conf, axis=1)


def drafting_ms(draft_ms: np.ndarray, depth_ms: np.ndarray, depths: np.ndarray) -> float:
    """Pass j runs over the R_j requests drafting at least j positions and costs
    draft_ms[R_j] * (f(j) - f(j-1)), f(j) = depth_ms[j] / depth_ms[K] (0 when that is 0)."""
    full = float(depth_ms[-1])
    fraction = [
        0.0 if full <= 0 or j == 0 else float(depth_ms[j]) / full for j in range(len(depth_ms))
    ]
    cost = 0.0
    for j in range(1, int(depths.max(initial=0)) + 1):
        rows = int((depths >= j).sum())
        if rows:
            cost += float(draft_ms[rows]) * (fraction[j] - fraction[j - 1])
    return cost


def brute_batch(case: dict) -> list[tuple[float, float]]:
    """(E, cost) of the best budget (first maximum) of every depth 0..deepest."""
    surv = survivals(case["conf"])
    caps, t, s, verify = case["caps"], case["t"], case["s"], case["verify"]
    out = [(float(s), float(verify[t]))]
    for d in range(1, int(caps.max(initial=0)) + 1):
        depths = np.minimum(caps, d)
        values = np.sort(np.concatenate([surv[r, :n] for r, n in enumerate(depths)]))[::-1]
        limit = len(values) if case["budget_cap"] is None else min(case["budget_cap"], len(values))
        e = s + np.r_[0.0, np.cumsum(values[:limit])]
        c = drafting_ms(case["draft"], case["depth_ms"], depths) + verify[t : t + limit + 1]
        best = int(np.argmax(e / c))
        out.append((float(e[best]), float(c[best])))
    return out


def make_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(65, 400))
    cols = int(rng.integers(2, 17))
    shape = seed % 4
    if shape == 0:  # fading survivals, as an estimator gives
        conf = rng.beta(6, 1.5, (rows, cols))
    elif shape == 1:  # dyadic, with zeros and ones
        conf = rng.integers(0, 9, (rows, cols)) / 8
        conf[:, 0] = np.maximum(conf[:, 0], 0.75)
    elif shape == 2:  # crowded near one
        conf = 1 - rng.uniform(0, 1e-3, (rows, cols))
    else:  # one confident column, the rest spread
        conf = rng.uniform(0, 1, (rows, cols))
        conf[:, 0] = 0.9
    caps_kind = (seed // 4) % 3
    caps = [
        np.full(rows, cols),
        rng.integers(0, cols + 1, rows),
        np.where(np.arange(rows) % 5 == 0, rng.integers(0, cols + 1, rows), cols),
    ][caps_kind]
    t = int(rows + rng.integers(0, 64))
    s = int(rows - seed % 2)
    tokens = t + rows * cols + 1
    base = 6.0 + rng.uniform(0, 2)
    verify_kind = (seed // 12) % 4
    if verify_kind == 0:  # dips: not monotone
        verify = base + (np.arange(tokens) % 40) / 16 - rng.uniform(0, 1, tokens)
    elif verify_kind == 1:  # steps at powers of two
        verify = base + np.floor(np.log2(np.arange(tokens) + 1)) * rng.uniform(0, 4)
    elif verify_kind == 2:  # steep
        verify = base + np.arange(tokens) * rng.uniform(0.01, 4)
    else:  # flat
        verify = np.full(tokens, base)
    draft = rng.choice([0.0, 0.5, 3.0]) * (1 + np.arange(rows + 1) / 64)
    steps = rng.choice([0.0, 0.25, 1.0, 4.0, 64.0], cols)
    if seed % 7 == 0:  # a jump at depth 2, then flat: depth 2 loses, deeper ones may win
        steps = np.r_[0.5, 64.0, np.zeros(cols - 2)]
    depth_ms = np.r_[0.0, np.cumsum(steps)]
    if depth_ms[-1] <= 0:
        depth_ms[-1] = 1.0
    budget_cap = [None, int(rng.integers(0, 40)), int(rows + rng.integers(0, rows))][seed % 3]
    return dict(
        conf=conf,
        caps=caps,
        t=t,
        s=s,
        verify=verify,
        draft=draft,
        depth_ms=depth_ms,
        budget_cap=budget_cap,
    )


def decide(case: dict, conf: np.ndarray | None = None):
    tables = CostTables(case["draft"], case["verify"]).with_draft_depth(case["depth_ms"])
    return choose_draft_depth(
        case["conf"] if conf is None else conf,
        case["caps"],
        num_non_draft_tokens=case["t"],
        num_sampling_requests=case["s"],
        cost_tables=tables,
        max_draft_budget=case["budget_cap"],
    )


CASES = 160


@pytest.mark.parametrize("seed", range(CASES))
def test_batch_depth_on_the_histogram_path_matches_brute_force(seed: int) -> None:
    case = make_case(seed)
    plan = decide(case)
    per_depth = brute_batch(case)
    ratios = np.array([e / c for e, c in per_depth])
    best = float(ratios.max())
    got = plan.expected_accepted_tokens / plan.predicted_cost_ms
    assert got == pytest.approx(best, rel=1e-9)
    # The chosen depth reaches the best ratio, and every shallower depth falls short of it
    # (ties go to the shallower depth).
    d = plan.max_depth
    assert ratios[d] == pytest.approx(best, rel=1e-9)
    assert (ratios[:d] < best * (1 - 1e-12)).all(), (d, ratios)
    np.testing.assert_array_equal(plan.depths, np.minimum(case["caps"], d))
    assert plan.drafts == int(plan.depths.sum())
    # What it anticipates is priced by the documented rule.
    cost = drafting_ms(case["draft"], case["depth_ms"], plan.depths.astype(np.int64))
    assert plan.predicted_cost_ms == pytest.approx(
        cost + case["verify"][case["t"] + plan.budget], rel=1e-12
    )
    values = np.sort(
        np.concatenate([survivals(case["conf"])[r, :n] for r, n in enumerate(plan.depths)])
    )[::-1]
    assert plan.budget <= len(values)
    if case["budget_cap"] is not None:
        assert plan.budget <= case["budget_cap"]
    assert plan.expected_accepted_tokens == pytest.approx(
        case["s"] + values[: plan.budget].sum(), rel=1e-12
    )


def test_the_cases_take_the_early_stop() -> None:
    """The cases are not all decided at depth 0 or at the deepest depth: both a depth below
    the deepest and a depth past a losing one win some of them (the stop's two outcomes)."""
    wins_inside, wins_after_loser = 0, 0
    for seed in range(CASES):
        case = make_case(seed)
        ratios = [e / c for e, c in brute_batch(case)]
        d = int(np.argmax(ratios))
        wins_inside += 0 < d < len(ratios) - 1
        wins_after_loser += any(ratios[j] < ratios[j - 1] for j in range(2, d + 1))
    assert wins_inside >= CASES // 8, wins_inside
    assert wins_after_loser >= 5, wins_after_loser


_LEVEL_WORKLOAD = """
import hashlib
import numpy as np
from test_depth_brute_force_stop import make_case
from av_core import CostTables, choose_draft_depth, plan_verification
digest = hashlib.sha256()
for seed in range(400):
    case = make_case(seed)
    tables = CostTables(case["draft"], case["verify"]).with_draft_depth(case["depth_ms"])
    step = dict(num_non_draft_tokens=case["t"], num_sampling_requests=case["s"],
                cost_tables=tables, max_draft_budget=case["budget_cap"])
    for conf in (case["conf"], case["conf"].astype(np.float32)):
        for mode in ("batch", "per_request"):
            p = choose_draft_depth(conf, case["caps"], mode=mode, **step)
            digest.update(p.depths.tobytes())
            digest.update(repr((p.max_depth, p.drafts, p.budget,
                                p.expected_accepted_tokens.hex(),
                                p.predicted_cost_ms.hex())).encode())
        v = plan_verification(conf, case["caps"], **step)
        digest.update(v.admitted.tobytes())
        digest.update(repr((v.budget, v.expected_accepted_tokens.hex(),
                            v.predicted_cost_ms.hex())).encode())
print(digest.hexdigest())
"""


def test_every_level_decides_the_same_bits() -> None:
    """Depths, budgets, admitted counts, expected tokens and costs, float32 and float64
    confidences, both modes, on every SIMD level."""
    digests = level_digests(_LEVEL_WORKLOAD, Path(__file__).parent)
    assert len(set(digests.values())) == 1, digests
    assert len(digests["baseline"]) == len(hashlib.sha256().hexdigest())
