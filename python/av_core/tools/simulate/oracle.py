"""The hindsight oracle every policy is bounded by: with the verdicts known, the cheapest drafting
and verification that reaches each token count, the best throughput any policy could have had on
the same rounds and costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from av_core.tools.evaluate import DraftRounds
from av_core.tools.simulate.costs import CostModel, DrafterKind, FloatArray, IntArray, PassTokens
from av_core.tools.simulate.policies import PolicyResult, RoundStreams

ORACLE = "oracle"


def _lower_convex_envelope(values: FloatArray) -> FloatArray:
    """The greatest convex function below ``values[i]`` at ``x = i``, at the same points."""
    hull: list[int] = []
    for i in range(values.shape[0]):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is not below the segment a-i: it is not a vertex of the lower hull.
            if (values[b] - values[a]) * (i - a) >= (values[i] - values[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(i)
    return np.asarray(np.interp(np.arange(values.shape[0]), hull, values[hull]))


@dataclass(frozen=True)
class _OracleDrafting:
    """The least drafting cost of ``n`` drafts that are all accepted, per distinct step."""

    pass_ms: FloatArray  # [R + 1]: one drafter pass over m requests (m = 0: no pass)
    exact: bool  # False when an autoregressive pass cost had to be convexified (a bound)


def _oracle_drafting(
    cost: CostModel, drafter: DrafterKind, num_requests: int, parallel_pass_tokens: PassTokens
) -> _OracleDrafting:
    m = np.arange(num_requests + 1)
    pass_ms = np.asarray(cost.draft_pass_ms(m), dtype=np.float64)
    pass_ms[0] = 0.0
    exact = True
    if drafter == "autoregressive" and num_requests >= 2:
        envelope = _lower_convex_envelope(pass_ms[1:])
        scale = max(float(np.abs(pass_ms[1:]).max()), 1.0)
        exact = bool(np.all(pass_ms[1:] - envelope <= 1e-12 * scale))
        pass_ms[1:] = envelope
    return _OracleDrafting(pass_ms, exact)


def _least_drafting_ms(
    accepted: IntArray,
    num_positions: int,
    drafting: _OracleDrafting,
    cost: CostModel,
    drafter: DrafterKind,
    parallel_pass_tokens: PassTokens,
) -> FloatArray:
    """``G[n]`` for ``n = 0..Σ accepted``: the cheapest drafting of ``n`` positions of which
    every one is accepted (request r drafts d_r <= accepted[r], Σ d_r = n).

    Autoregressive: pass j runs over the requests drafting at least j positions. With at most
    ``c_j = #{accepted >= j}`` rows in pass j and rows ordered by the requests' accepted counts,
    any row counts ``R_j <= c_j`` are realisable (sorted descending they still fit), so for D
    passes the cost is ``Σ_{j<=D} pass(R_j)``; with a convex pass cost (GpuLikeCost, or the
    convex envelope of a measured one: a lower bound) the cheapest split of n rows takes the
    cheapest marginal rows first, level m of a pass costing ``pass(m) - pass(m-1)`` and being
    available in ``min(D, #{j: c_j >= m})`` passes. Parallel: one pass over the fewest requests
    whose accepted counts reach n (``requests``), or over the n drafted tokens (``drafts``)."""
    total = int(accepted.sum())
    n = np.arange(total + 1)
    pass_ms = drafting.pass_ms
    if drafter == "parallel":
        if parallel_pass_tokens == "drafts":
            out = np.asarray(cost.draft_pass_ms(n), dtype=np.float64)
            out[0] = 0.0
            return out
        reach = np.cumsum(np.sort(accepted)[::-1])
        fewest = np.searchsorted(reach, n, side="left") + 1
        fewest[0] = 0
        return np.asarray(pass_ms[fewest])
    counts = (accepted[:, None] >= np.arange(1, num_positions + 1)[None, :]).sum(axis=0)
    best = np.full(total + 1, np.inf)
    best[0] = 0.0
    levels = np.arange(2, accepted.shape[0] + 1)  # row m of a pass, m >= 2
    marginal = pass_ms[2:] - pass_ms[1:-1]  # non-decreasing: the pass cost is convex
    passes_reaching = num_positions - np.searchsorted(np.sort(counts), levels, side="left")
    for depth in range(1, num_positions + 1):
        if counts[depth - 1] < 1:
            break
        # Rows beyond the first of each pass, cheapest (lowest level) first.
        rows = np.repeat(marginal, np.minimum(depth, passes_reaching))
        ms = depth * pass_ms[1] + np.concatenate([[0.0], np.cumsum(rows)])
        span = slice(depth, depth + ms.shape[0])
        best[span] = np.minimum(best[span], ms)
    return best


def simulate_oracle(
    rounds: DraftRounds,
    streams: RoundStreams,
    cost: CostModel,
    drafter: DrafterKind,
    *,
    measure_from: int = 0,
    parallel_pass_tokens: PassTokens = "requests",
) -> PolicyResult:
    """The hindsight oracle: it knows every round's verdicts, drafts and verifies only drafts
    the target accepts (never a rejected one), and picks per step how many of them, so as to
    maximise total tokens over total time on the measured steps.

    Every policy here drafts and verifies per step; removing its rejected drafts and the drafts
    it drafted but did not verify keeps its tokens and does not raise its cost, so its steps are
    among the oracle's choices and none can beat it on the same rounds and costs. Verifying
    *every* accepted draft is not the bound: once verification is compute-bound an accepted
    draft costs more than the step's average token. The best ratio of sums over independent
    per-step choices is found exactly by Dinkelbach's iteration (each step maximises
    tokens − λ·time; λ ← the resulting ratio; it stops when λ no longer rises). With an
    autoregressive drafter whose measured pass cost is not convex in the batch it prices passes
    on the convex envelope: still a bound, possibly not reachable; the policy is then named
    ``oracle*``."""
    index = streams.rounds[measure_from:]
    steps, num_requests = index.shape
    accepted = np.minimum(rounds.num_accepted[index], rounds.num_drafted[index])
    drafting = _oracle_drafting(cost, drafter, num_requests, parallel_pass_tokens)
    width = int(accepted.sum(axis=1).max(initial=0)) + 1
    # Steps with the same multiset of accepted counts have the same choices: solve each once.
    distinct, which = np.unique(np.sort(accepted, axis=1), axis=0, return_inverse=True)
    verify = np.asarray(cost.verify_ms(num_requests + np.arange(width)), dtype=np.float64)
    distinct_ms = np.full((distinct.shape[0], width), np.inf)
    for row in range(distinct.shape[0]):
        g = _least_drafting_ms(
            distinct[row],
            rounds.num_positions,
            drafting,
            cost,
            drafter,
            parallel_pass_tokens,
        )
        distinct_ms[row, : g.shape[0]] = g + verify[: g.shape[0]]
    cost_of = distinct_ms[which.reshape(-1)]
    gain = num_requests + np.arange(width, dtype=np.float64)
    chosen = np.zeros(steps, dtype=np.int64)
    rate = (num_requests * steps) / float(cost_of[:, 0].sum())
    while True:
        value = gain[None, :] - rate * cost_of
        pick = np.argmax(value, axis=1)
        picked_ms = float(cost_of[np.arange(steps), pick].sum())
        picked_tokens = float(gain[pick].sum())
        new_rate = picked_tokens / picked_ms
        if new_rate <= rate * (1.0 + 1e-15):
            break
        rate, chosen = new_rate, pick
    verified = int(chosen.sum())
    return PolicyResult(
        ORACLE if drafting.exact else ORACLE + "*",
        num_requests,
        steps,
        int(num_requests * steps + verified),
        float(cost_of[np.arange(steps), chosen].sum()),
        verified,
        verified,
    )
