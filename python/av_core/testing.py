"""Exact losslessness checks for verification planners and trimming rules.

Speculative sampling emits exactly the target's distribution only if the decision to verify
draft position ``k`` never reads the token drafted at ``k`` (given the accepted prefix). This
module checks that property *exactly*, with no sampling noise: for a tiny vocabulary and a
target and a drafter given as explicit tables, it enumerates every draft outcome with its
probability, runs the trimming rule on it, applies standard rejection sampling (accept
``min(1, p/q)``, resample from ``norm(max(0, p - q))`` on rejection, a bonus token from the
target after a fully accepted prefix) and returns the exact law of what is emitted.

To compare laws of variable-length outputs, every emitted sequence is *completed* with target
samples to ``K + 1`` tokens; a step is lossless iff the completed law equals the target's own
law over ``K + 1`` tokens (:func:`target_distribution`). With several requests the law is the
joint one, compared against the product of the targets.

Example (an autoregressive drafter, a planner with the default ``budget_source="previous"``)::

    from av_core import CostTables, VerificationPlanner
    from av_core.testing import (
        SpecTables, emitted_distribution, max_abs_difference, target_distribution)

    tables = SpecTables.from_functions(
        vocab_size=2, num_positions=2, num_requests=1,
        target=lambda r, prefix: [0.9, 0.1],
        drafter=lambda r, prefix: [0.2, 0.8] if prefix[-1:] == (1,) else [0.5, 0.5],
    )
    costs = CostTables([0.0, 0.0], [1.0, 1.0, 1.0, 3.0])
    planner = VerificationPlanner(costs, num_positions=2)
    law = emitted_distribution(planner, tables)
    assert max_abs_difference(law, target_distribution(tables)) < 1e-12

Hypothesis strategies for tables, cost curves and confidences live here too; hypothesis is a
test dependency, imported only when a strategy is built.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from av_core._checks import _check_int
from av_core._native import CostTables, InvalidValueError, VerificationPlanner, plan_verification

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "MAX_LAW_ENTRIES",
    "DraftOutcome",
    "Law",
    "SpecTables",
    "TrimmingRule",
    "confidence_matrices",
    "cost_curves",
    "cost_tables",
    "depth_planner_rule",
    "emitted_distribution",
    "is_lossless",
    "max_abs_difference",
    "max_probability",
    "plan_rule",
    "planner_rule",
    "position_marginal",
    "spec_tables",
    "target_distribution",
]

FloatArray = npt.NDArray[np.float64]
Prefix = tuple[int, ...]

#: The most entries of a joint law (``V^((K + 1)·R)``, V counted as at least 2), and so of draft
#: outcomes, the exact checks enumerate: beyond it they would run for hours or exhaust memory, so
#: they refuse first.
MAX_LAW_ENTRIES = 1 << 22


def _check_dimensions(vocab_size: object, num_positions: object, num_requests: object) -> None:
    """Types and ranges of a table's dimensions, and the size of the law they imply, before
    anything is enumerated."""
    for name, value in (
        ("vocab_size", vocab_size),
        ("num_positions", num_positions),
        ("num_requests", num_requests),
    ):
        _check_int(value, name, 1)
    assert isinstance(vocab_size, int | np.integer)
    assert isinstance(num_positions, int | np.integer)
    assert isinstance(num_requests, int | np.integer)
    # Compared as exponents first (no huge power is formed), with V counted as at least 2: the
    # enumeration walks K + 1 prefix lengths per request even for a one-token vocabulary.
    exponent = (int(num_positions) + 1) * int(num_requests)
    base = max(int(vocab_size), 2)
    if exponent > MAX_LAW_ENTRIES.bit_length() - 1 or base**exponent > MAX_LAW_ENTRIES:
        raise InvalidValueError(
            f"vocab_size ** ((num_positions + 1) * num_requests) = {vocab_size} ** {exponent} "
            f"outcomes exceed MAX_LAW_ENTRIES = {MAX_LAW_ENTRIES}: keep V, K and R tiny"
        )


#: An exact law: one completed ``K + 1``-token sequence per request -> probability.
Law = dict[tuple[Prefix, ...], float]


@dataclass(frozen=True)
class SpecTables:
    """A target and a drafter for ``R`` requests as explicit conditional tables.

    ``target[r][prefix]`` is the target's next-token distribution after ``prefix`` (every
    prefix of length ``0..K``); ``drafter[r][prefix]`` is the drafter's distribution at
    position ``len(prefix)`` after drafting ``prefix`` (lengths ``0..K-1``). A drafter whose
    tables ignore ``prefix`` beyond its length is *parallel* (its positions do not depend on
    earlier draft tokens); otherwise it is *autoregressive*.
    """

    vocab_size: int
    num_positions: int
    target: tuple[Mapping[Prefix, FloatArray], ...]
    drafter: tuple[Mapping[Prefix, FloatArray], ...]

    @property
    def num_requests(self) -> int:
        return len(self.target)

    @staticmethod
    def from_functions(
        *,
        vocab_size: int,
        num_positions: int,
        num_requests: int,
        target: Callable[[int, Prefix], Sequence[float]],
        drafter: Callable[[int, Prefix], Sequence[float]],
    ) -> SpecTables:
        """Tables from ``target(request, prefix)`` and ``drafter(request, prefix)``."""
        _check_dimensions(vocab_size, num_positions, num_requests)

        def table(fn: Callable[[int, Prefix], Sequence[float]], r: int, max_len: int) -> Any:
            return {
                prefix: _distribution(fn(r, prefix))
                for length in range(max_len + 1)
                for prefix in itertools.product(range(vocab_size), repeat=length)
            }

        tables = SpecTables(
            vocab_size,
            num_positions,
            tuple(table(target, r, num_positions) for r in range(num_requests)),
            tuple(table(drafter, r, num_positions - 1) for r in range(num_requests)),
        )
        tables.validate()
        return tables

    def validate(self) -> None:
        """Raises ``ValueError`` unless every table is a distribution over the vocabulary (and
        the law of its outcomes small enough to enumerate, :data:`MAX_LAW_ENTRIES`)."""
        if len(self.target) != len(self.drafter) or not self.target:
            raise InvalidValueError("tables: need one target and one drafter table per request")
        _check_dimensions(self.vocab_size, self.num_positions, len(self.target))
        for name, tables, max_len in (
            ("target", self.target, self.num_positions),
            ("drafter", self.drafter, self.num_positions - 1),
        ):
            for r, table in enumerate(tables):
                for length in range(max_len + 1):
                    for prefix in itertools.product(range(self.vocab_size), repeat=length):
                        dist = table.get(prefix)
                        if dist is None:
                            raise InvalidValueError(f"{name}[{r}] lacks prefix {prefix}")
                        if not isinstance(dist, np.ndarray) or dist.dtype.kind != "f":
                            raise InvalidValueError(f"{name}[{r}][{prefix}] is not a float array")
                        ok = dist.shape == (self.vocab_size,) and np.all(dist >= 0)
                        if not ok or abs(float(dist.sum()) - 1.0) > 1e-12:
                            raise InvalidValueError(f"{name}[{r}][{prefix}] is not a distribution")


def _distribution(weights: Sequence[float] | FloatArray) -> FloatArray:
    try:
        w: FloatArray = np.asarray(weights, dtype=np.float64)
    except (ValueError, TypeError, OverflowError) as error:
        raise InvalidValueError(f"a table function must return weights, got {weights!r}") from error
    total = float(w.sum()) if w.ndim == 1 else math.nan
    if not (np.all(np.isfinite(w)) and np.all(w >= 0) and total > 0):
        raise InvalidValueError(
            f"a table function must return finite, non-negative weights with a positive sum "
            f"as a 1-D sequence, got {weights!r}"
        )
    out: FloatArray = w / total
    return out


@dataclass(frozen=True)
class DraftOutcome:
    """One enumerated draft: what a trimming rule gets to see.

    ``tokens[r][k]`` is the token drafted at position ``k``; ``draft_probs[r, k]`` the
    drafter's distribution it was sampled from; ``confidences[r, k]`` the confidence a
    legitimate rule may use (a function of ``draft_probs[r, k]`` only, never of the token).
    """

    tokens: tuple[Prefix, ...]
    draft_probs: FloatArray
    confidences: FloatArray


#: A trimming rule: admitted drafts per request for one draft outcome.
TrimmingRule = Callable[[DraftOutcome], Sequence[int] | npt.NDArray[np.integer[Any]]]


def max_probability(distribution: FloatArray) -> float:
    """The default confidence: the drafter's top probability ``q_max`` (what av_core's
    estimator reads, through ``logit(q_max)``)."""
    return float(distribution.max())


def _step_defaults(
    num_requests: int,
    num_positions: int,
    scheduled_drafts: Sequence[int] | None,
    num_non_draft_tokens: int | None,
    num_sampling_requests: int | None,
) -> tuple[npt.NDArray[np.int64], int, int]:
    scheduled = np.asarray(
        [num_positions] * num_requests if scheduled_drafts is None else scheduled_drafts,
        dtype=np.int64,
    )
    # A decode step: one non-draft token per request, and every request samples.
    t = num_requests if num_non_draft_tokens is None else num_non_draft_tokens
    s = num_requests if num_sampling_requests is None else num_sampling_requests
    return scheduled, t, s


def planner_rule(
    planner: VerificationPlanner,
    *,
    slots: Sequence[int] | None = None,
    scheduled_drafts: Sequence[int] | None = None,
    num_non_draft_tokens: int | None = None,
    num_sampling_requests: int | None = None,
    max_draft_budget: int | None = None,
) -> TrimmingRule:
    """A rule running ``planner`` on each outcome's confidences.

    Every outcome is planned on a fresh copy of ``planner``, so all see the same remembered
    (previous-step) confidences: prime the planner with a ``plan`` call first to test
    ``budget_source="previous"`` with something other than fresh slots.
    """

    def rule(outcome: DraftOutcome) -> npt.NDArray[np.int32]:
        r, k = outcome.confidences.shape
        scheduled, t, s = _step_defaults(
            r, k, scheduled_drafts, num_non_draft_tokens, num_sampling_requests
        )
        plan = planner.copy().plan(
            np.arange(r) if slots is None else np.asarray(slots),
            outcome.confidences,
            scheduled,
            num_non_draft_tokens=t,
            num_sampling_requests=s,
            max_draft_budget=max_draft_budget,
        )
        return plan.admitted

    return rule


def plan_rule(
    cost_tables: CostTables,
    *,
    budget_confidences: npt.ArrayLike | None = None,
    scheduled_drafts: Sequence[int] | None = None,
    num_non_draft_tokens: int | None = None,
    num_sampling_requests: int | None = None,
    max_draft_budget: int | None = None,
) -> TrimmingRule:
    """A rule calling :func:`av_core.plan_verification`: the budget is sized from
    ``budget_confidences`` when given (fixed before drafting, like the previous step's), else
    from the outcome's own confidences (``budget_source="current"``)."""
    fixed = None if budget_confidences is None else np.asarray(budget_confidences, np.float64)

    def rule(outcome: DraftOutcome) -> npt.NDArray[np.int32]:
        r, k = outcome.confidences.shape
        scheduled, t, s = _step_defaults(
            r, k, scheduled_drafts, num_non_draft_tokens, num_sampling_requests
        )
        plan = plan_verification(
            outcome.confidences,
            scheduled,
            num_non_draft_tokens=t,
            num_sampling_requests=s,
            cost_tables=cost_tables,
            max_draft_budget=max_draft_budget,
            budget_confidences=fixed,
        )
        return plan.admitted

    return rule


def depth_planner_rule(
    planner: VerificationPlanner,
    *,
    mode: Literal["batch", "per_request"] = "batch",
    slots: Sequence[int] | None = None,
    max_depths: Sequence[int] | None = None,
    num_non_draft_tokens: int | None = None,
    num_sampling_requests: int | None = None,
    max_draft_budget: int | None = None,
    depth_rule: Callable[[DraftOutcome], Sequence[int]] | None = None,
) -> TrimmingRule:
    """A step with drafting-depth control, as a rule: ``planner.choose_draft_depth`` picks each
    request's depth ``d_r`` (from the planner's remembered confidences, before drafting), the
    drafter drafts ``d_r`` positions, and ``planner.plan`` decides what to verify among them.

    Drafting a prefix of length ``d`` has the same law as drafting ``K`` positions and ignoring
    the rest (the drafter is causal), so the rule sees every enumerated ``K``-position outcome
    and plans with ``scheduled_drafts = d``. ``depth_rule`` replaces the planner's depth
    decision by any function of the outcome: a legitimate one ignores it; one that reads the
    drafted tokens shows what a depth decision must not do.
    """

    def rule(outcome: DraftOutcome) -> npt.NDArray[np.int32]:
        r, k = outcome.confidences.shape
        scheduled, t, s = _step_defaults(
            r, k, max_depths, num_non_draft_tokens, num_sampling_requests
        )
        ids = np.arange(r) if slots is None else np.asarray(slots)
        step = planner.copy()
        if depth_rule is None:
            depths = step.choose_draft_depth(
                ids,
                scheduled,
                num_non_draft_tokens=t,
                num_sampling_requests=s,
                max_draft_budget=max_draft_budget,
                mode=mode,
            ).depths
        else:
            depths = np.minimum(np.asarray(depth_rule(outcome), dtype=np.int64), scheduled)
        # Positions past a request's depth were never drafted: what the planner sees there
        # must not matter, so hide them.
        confidences = outcome.confidences.copy()
        for row, d in enumerate(depths):
            confidences[row, int(d) :] = 0.0
        plan = step.plan(
            ids,
            confidences,
            np.asarray(depths, dtype=np.int64),
            num_non_draft_tokens=t,
            num_sampling_requests=s,
            max_draft_budget=max_draft_budget,
        )
        return plan.admitted

    return rule


class _Request:
    """Exact per-request laws, memoized by prefix."""

    def __init__(self, tables: SpecTables, r: int) -> None:
        self.v = tables.vocab_size
        self.k = tables.num_positions
        self.p = tables.target[r]
        self.q = tables.drafter[r]
        self.size = self.v ** (self.k + 1)
        self._completed: dict[Prefix, FloatArray] = {}

    def completed(self, prefix: Prefix) -> FloatArray:
        """Law over ``K + 1``-token sequences of the target continued from ``prefix``."""
        cached = self._completed.get(prefix)
        if cached is not None:
            return cached
        if len(prefix) == self.k + 1:
            law = np.zeros(self.size)
            law[_encode(prefix, self.v)] = 1.0
        else:
            law = np.zeros(self.size)
            for y, py in enumerate(self.p[prefix]):
                if py > 0:
                    law += py * self.completed((*prefix, y))
        self._completed[prefix] = law
        return law

    def emitted(self, admitted: int, draft: Prefix) -> FloatArray:
        """Completed law of one verification of ``draft[:admitted]`` by rejection sampling."""
        law = np.zeros(self.size)
        weight = 1.0
        for k in range(admitted):
            prefix = draft[:k]
            p, q = self.p[prefix], self.q[prefix]
            x = draft[k]
            accept = min(1.0, p[x] / q[x])
            residual = np.maximum(p - q, 0.0)
            mass = residual.sum()
            if accept < 1.0 and mass > 0:
                for y, ry in enumerate(residual / mass):
                    if ry > 0:
                        law += weight * (1.0 - accept) * ry * self.completed((*prefix, y))
            weight *= accept
            if weight == 0.0:
                return law
        # All admitted drafts accepted: the bonus token comes from the target.
        return law + weight * self.completed(draft[:admitted])

    def outcomes(self) -> list[tuple[Prefix, float]]:
        """Every draft ``x`` with ``Q(x) > 0``."""
        out = []
        for draft in itertools.product(range(self.v), repeat=self.k):
            prob = 1.0
            for k in range(self.k):
                prob *= float(self.q[draft[:k]][draft[k]])
            if prob > 0:
                out.append((draft, prob))
        return out


def _encode(sequence: Prefix, vocab_size: int) -> int:
    index = 0
    for token in sequence:
        index = index * vocab_size + token
    return index


def _decode(index: int, vocab_size: int, length: int) -> Prefix:
    tokens = []
    for _ in range(length):
        index, token = divmod(index, vocab_size)
        tokens.append(token)
    return tuple(reversed(tokens))


def _to_law(joint: FloatArray, tables: SpecTables) -> Law:
    v, length = tables.vocab_size, tables.num_positions + 1
    law: Law = {}
    for flat in np.flatnonzero(joint):
        indices = np.unravel_index(int(flat), joint.shape)
        law[tuple(_decode(int(i), v, length) for i in indices)] = float(joint.flat[flat])
    return law


def emitted_distribution(
    planner: VerificationPlanner | TrimmingRule,
    tables: SpecTables,
    *,
    confidence: Callable[[FloatArray], float] = max_probability,
) -> Law:
    """The exact law of the tokens one verification step emits, completed to ``K + 1`` tokens
    per request by sampling the target.

    ``planner`` is a :class:`~av_core.VerificationPlanner` (run through :func:`planner_rule`
    with decode-step defaults) or any :data:`TrimmingRule`. ``confidence`` maps the drafter's
    distribution at a position to the confidence the rule sees there. Cost: every joint draft
    outcome is enumerated, ``V^(R·K)`` rule calls; keep ``V``, ``K`` and ``R`` tiny.
    """
    rule = planner_rule(planner) if isinstance(planner, VerificationPlanner) else planner
    tables.validate()
    requests = [_Request(tables, r) for r in range(tables.num_requests)]
    per_request = [req.outcomes() for req in requests]
    k, v = tables.num_positions, tables.vocab_size
    # Each request's laws for each (admitted, draft), computed on first use.
    laws: list[dict[tuple[int, Prefix], FloatArray]] = [{} for _ in requests]
    # Joint law: sum over joint outcomes of weight * (outer product of per-request laws).
    # Grouped by the admitted vector so each group is a few matrix products, not one outer
    # product per outcome.
    groups: dict[tuple[int, ...], list[tuple[tuple[int, ...], float]]] = {}
    for combo in itertools.product(*(range(len(o)) for o in per_request)):
        drafts = tuple(per_request[r][i][0] for r, i in enumerate(combo))
        weight = float(np.prod([per_request[r][i][1] for r, i in enumerate(combo)]))
        probs = np.array(
            [[req.q[d[:j]] for j in range(k)] for req, d in zip(requests, drafts, strict=True)]
        ).reshape(len(requests), k, v)
        confidences = np.array(
            [[confidence(probs[r, j]) for j in range(k)] for r in range(len(requests))],
            dtype=np.float64,
        )
        admitted = tuple(
            int(a) for a in rule(DraftOutcome(drafts, probs, confidences.reshape(-1, k)))
        )
        if len(admitted) != len(requests) or not all(0 <= a <= k for a in admitted):
            raise InvalidValueError(f"rule returned {admitted} for {len(requests)} requests, K={k}")
        groups.setdefault(admitted, []).append((combo, weight))

    def law_of(r: int, admitted: int, index: int) -> FloatArray:
        draft = per_request[r][index][0]
        key = (admitted, draft)
        if key not in laws[r]:
            laws[r][key] = requests[r].emitted(admitted, draft)
        return laws[r][key]

    size = requests[0].size
    joint = np.zeros((size,) * len(requests))
    for admitted, members in groups.items():
        if len(requests) == 1:
            for (i,), w in members:
                joint += w * law_of(0, admitted[0], i)
        elif len(requests) == 2:
            rows = sorted({c[0] for c, _ in members})
            cols = sorted({c[1] for c, _ in members})
            row_at = {i: n for n, i in enumerate(rows)}
            col_at = {j: n for n, j in enumerate(cols)}
            weights = np.zeros((len(rows), len(cols)))
            for (i, j), w in members:
                weights[row_at[i], col_at[j]] += w
            left = np.stack([law_of(0, admitted[0], i) for i in rows])
            right = np.stack([law_of(1, admitted[1], j) for j in cols])
            joint += left.T @ weights @ right
        else:
            for combo, w in members:
                term = np.array(w)
                for r, i in enumerate(combo):
                    term = np.multiply.outer(term, law_of(r, admitted[r], i))
                joint += term
    return _to_law(joint, tables)


def target_distribution(tables: SpecTables) -> Law:
    """The target's own law over ``K + 1`` tokens (independent across requests)."""
    requests = [_Request(tables, r) for r in range(tables.num_requests)]
    joint = np.array(1.0)
    for req in requests:
        joint = np.multiply.outer(joint, req.completed(()))
    return _to_law(np.asarray(joint, dtype=np.float64), tables)


def max_abs_difference(a: Mapping[Any, float], b: Mapping[Any, float]) -> float:
    """``max |a(x) - b(x)|`` over the union of outcomes (missing outcomes count as 0)."""
    return max((abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in {*a, *b}), default=0.0)


def is_lossless(law: Mapping[Any, float], tables: SpecTables, tolerance: float = 1e-12) -> bool:
    """Whether ``law`` (from :func:`emitted_distribution`) sums to 1 and equals the target's own
    law (:func:`target_distribution`) outcome by outcome, both to ``tolerance``."""
    return (
        abs(sum(law.values()) - 1.0) < tolerance
        and max_abs_difference(law, target_distribution(tables)) < tolerance
    )


def position_marginal(
    law: Mapping[tuple[Prefix, ...], float], request: int, position: int
) -> FloatArray:
    """The law of one request's token at one position, from a joint law."""
    if not law:
        raise InvalidValueError("law must not be empty")
    first = next(iter(law))
    if isinstance(request, bool) or not isinstance(request, int) or not 0 <= request < len(first):
        raise InvalidValueError(f"request must be an int in [0, {len(first)}), got {request!r}")
    length = len(first[request])
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < length:
        raise InvalidValueError(f"position must be an int in [0, {length}), got {position!r}")
    size = 1 + max(seqs[request][position] for seqs in law)
    out = np.zeros(size)
    for seqs, p in law.items():
        out[seqs[request][position]] += p
    return out


# --- hypothesis strategies (hypothesis is imported only here, when a strategy is built) ---


def _weights(vocab_size: int) -> SearchStrategy[FloatArray]:
    from hypothesis import strategies as st

    # Small integer weights: zeros (tokens a model never proposes) and exact ties included.
    return (
        st.lists(st.integers(0, 8), min_size=vocab_size, max_size=vocab_size)
        .filter(lambda w: sum(w) > 0)
        .map(_distribution)
    )


def spec_tables(
    *,
    num_requests: int | SearchStrategy[int] = 1,
    vocab_size: int | SearchStrategy[int] | None = None,
    num_positions: int | SearchStrategy[int] | None = None,
    drafter: Literal["autoregressive", "parallel"] = "autoregressive",
) -> SearchStrategy[SpecTables]:
    """Random target and drafter tables (vocabulary 2-4 and K 2-3 unless given).

    ``drafter="parallel"`` draws a drafter whose position-``k`` distribution ignores earlier
    draft tokens; ``"autoregressive"`` lets it depend on all of them. The target always
    depends on its whole prefix.
    """
    from hypothesis import strategies as st

    def as_strategy(
        value: int | SearchStrategy[int] | None, default: SearchStrategy[int]
    ) -> SearchStrategy[int]:
        if value is None:
            return default
        return st.just(value) if isinstance(value, int) else value

    @st.composite
    def build(draw: Any) -> SpecTables:
        r = draw(as_strategy(num_requests, st.just(1)))
        v = draw(as_strategy(vocab_size, st.integers(2, 4)))
        k = draw(as_strategy(num_positions, st.integers(2, 3)))
        dist = _weights(v)
        target = []
        drafts = []
        for _ in range(r):
            target.append(
                {
                    prefix: draw(dist)
                    for length in range(k + 1)
                    for prefix in itertools.product(range(v), repeat=length)
                }
            )
            if drafter == "parallel":
                by_position = [draw(dist) for _ in range(k)]
                table = {
                    prefix: by_position[length]
                    for length in range(k)
                    for prefix in itertools.product(range(v), repeat=length)
                }
            else:
                table = {
                    prefix: draw(dist)
                    for length in range(k)
                    for prefix in itertools.product(range(v), repeat=length)
                }
            drafts.append(table)
        return SpecTables(v, k, tuple(target), tuple(drafts))

    strategy: SearchStrategy[SpecTables] = build()
    return strategy


def cost_curves(
    *, max_size: int = 64, max_points: int = 6
) -> SearchStrategy[tuple[list[tuple[int, float]], list[tuple[int, float]], int]]:
    """``(draft_curve, verify_curve, cudagraph_limit)``: increasing sizes up to ``max_size``,
    costs in ms drawn on a grid of quarter milliseconds (so ties happen), and a capture limit
    that may cut the verify curve anywhere."""
    from hypothesis import strategies as st

    def curve(max_points: int) -> SearchStrategy[list[tuple[int, float]]]:
        return st.lists(
            st.tuples(st.integers(1, max_size), st.integers(0, 400).map(lambda q: q / 4)),
            min_size=1,
            max_size=max_points,
            unique_by=lambda point: point[0],
        ).map(sorted)

    return st.tuples(curve(max_points), curve(max_points), st.integers(0, max_size))


def cost_tables(
    *, max_num_reqs: int, max_batch_tokens: int, max_size: int | None = None
) -> SearchStrategy[CostTables]:
    """Cost tables built by :meth:`CostTables.from_curves` from :func:`cost_curves`."""
    return cost_curves(max_size=max_size or max_batch_tokens).map(
        lambda c: CostTables.from_curves(
            c[0],
            c[1],
            max_num_reqs=max_num_reqs,
            max_batch_tokens=max_batch_tokens,
            cudagraph_limit=c[2],
        )
    )


def confidence_matrices(
    num_requests: int, num_positions: int, *, denominator: int = 8
) -> SearchStrategy[FloatArray]:
    """``[R, K]`` confidences on the grid ``j / denominator`` (exact binary fractions for a
    power-of-two denominator, so survival sums are exact and ties are real)."""
    from hypothesis import strategies as st

    for name, value in (
        ("num_requests", num_requests),
        ("num_positions", num_positions),
        ("denominator", denominator),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidValueError(f"{name} must be an int >= 1, got {value!r}")
    return st.lists(
        st.integers(0, denominator),
        min_size=num_requests * num_positions,
        max_size=num_requests * num_positions,
    ).map(
        lambda n: (np.asarray(n, dtype=np.float64) / denominator).reshape(
            num_requests, num_positions
        )
    )
