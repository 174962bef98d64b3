"""Serving simulation: adaptive verification against fixed draft lengths (``av-core simulate``).

R concurrent requests each replay a stream of drafting rounds taken from a labeled trace. Every
decode step, each request brings one round (K drafts with their features and, from the trace,
the number of leading drafts the target accepts under full verification). A policy decides how
many drafts of each request are verified; a request then emits ``min(accepted under full
verification, verified) + 1`` tokens (the accepted drafts plus the target's correction or bonus
token), and the step costs ``draft + verify`` milliseconds from cost tables.

Policies: fixed K = k (every request drafts and verifies ``min(k, K)`` drafts; k = 0 is no
speculation); adaptive verification (AV): the online estimator predicts, the
:class:`~av_core.VerificationPlanner` sizes the budget from the previous step's confidences and
assigns it with the current ones, and the estimator observes the verdicts of what was admitted,
so trimming shapes the labels it learns from, as in serving; and AV with drafting-depth control
(``AV+D``: one depth for the batch, ``AV+Dr``: a depth per request), where the planner first
decides how far to draft (``choose_draft_depth``, from the remembered confidences) and only the
drafted positions are paid for and planned. With ``peers``, the other engines' policies on the
same rounds and costs (SGLang's EMA tiers, TensorRT-LLM's ``draft_len_schedule``, vLLM's adaptive
verification; :mod:`av_core.peers`) and the hindsight oracle every policy is bounded by
(:func:`simulate_oracle`). The model is documented in ``docs/simulate.md``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from av_core import AcceptanceEstimator, CostTables, VerificationPlanner
from av_core.argtypes import parse_int_list
from av_core.evaluate import DraftRounds
from av_core.peers import TRT_DEFAULT_SCHEDULE, EmaTierPolicy, trt_draft_length
from av_core.tables import Table, col, fixed, general, render
from av_core.trace import DraftTrace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
DrafterKind = Literal["autoregressive", "parallel"]
PassTokens = Literal["requests", "drafts"]

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DepthControl = Literal["batch", "per_request"]
#: Policy names of adaptive verification without and with depth control.
ADAPTIVE_POLICIES = {None: "AV", "batch": "AV+D", "per_request": "AV+Dr"}
#: The peers' policies ``simulate_trace(peers=True)`` adds, in column order, and the oracle.
PEER_POLICIES = ("SGL-EMA", "TRT", "vLLM-AV")
ORACLE = "oracle"


@dataclass(frozen=True)
class GpuLikeCost:
    """A documented stand-in for a GPU serving an 8B target with a small drafter.

    ``ms(t) = base_ms + max(0, t - knee) * per_token_ms``: flat while a forward pass is
    memory-bound (reading the weights dominates, so more tokens are free), linear once it is
    compute-bound. Defaults resemble an H100-class GPU and an 8B target in bf16: about 6 ms per
    decode step up to ~256 tokens, then 16 GFLOP per token at ~500 TFLOP/s ≈ 0.03 ms per token.
    The drafter (a one-layer head or a sub-1B model) costs 0.6 ms per pass, with a slope a tenth
    of the target's past the same knee.
    """

    verify_base_ms: float = 6.0
    verify_knee: int = 256
    verify_per_token_ms: float = 0.03
    draft_base_ms: float = 0.6
    draft_knee: int = 256
    draft_per_token_ms: float = 0.003

    def __post_init__(self) -> None:
        for name, low_open in (
            ("verify_base_ms", True),
            ("verify_knee", False),
            ("verify_per_token_ms", False),
            ("draft_base_ms", False),
            ("draft_knee", False),
            ("draft_per_token_ms", False),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0 or (low_open and value == 0):
                bound = "> 0" if low_open else ">= 0"
                raise ValueError(f"{name} must be finite and {bound}, got {value!r}")

    def verify_ms(self, tokens: npt.ArrayLike) -> FloatArray:
        t = np.asarray(tokens, dtype=np.float64)
        return np.asarray(
            self.verify_base_ms + np.maximum(0.0, t - self.verify_knee) * self.verify_per_token_ms
        )

    def draft_pass_ms(self, tokens: npt.ArrayLike) -> FloatArray:
        t = np.asarray(tokens, dtype=np.float64)
        return np.asarray(
            self.draft_base_ms + np.maximum(0.0, t - self.draft_knee) * self.draft_per_token_ms
        )

    def describe(self) -> str:
        return (
            f"gpu-like: verify {self.verify_base_ms} ms flat to {self.verify_knee} tokens, then "
            f"+{self.verify_per_token_ms} ms/token; draft pass {self.draft_base_ms} ms flat to "
            f"{self.draft_knee} tokens, then +{self.draft_per_token_ms} ms/token"
        )


@dataclass(frozen=True)
class MeasuredCost:
    """Forward-pass times measured by ``av-core profile``: ``(tokens, ms)`` points.

    Between points the cost is interpolated linearly, past the last point extended along the last
    segment, below the first point held flat (never below the first measurement). Without a
    drafter curve drafting is free (stated in the output). A ``draft_depth`` profile in the file
    is not read here (see :func:`cost_tables_for`).
    """

    verify_points: FloatArray
    draft_points: FloatArray | None
    source: str

    @staticmethod
    def load(path: str | Path) -> MeasuredCost:
        """Reads a cost file; ``ValueError`` naming the file and the key for any problem
        (unreadable text, invalid JSON, a missing or malformed ``verify`` list, non-finite or
        negative times, a verify time of 0); a file that cannot be opened raises its
        ``OSError``."""
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{path}: not a cost file (not UTF-8 text at byte {error.start})"
            ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
            ) from None
        except RecursionError:
            raise ValueError(f"{path}: not valid JSON (nested too deeply)") from None
        if not isinstance(data, dict):
            raise ValueError(
                f"{path}: a cost file is a JSON object with a 'verify' list of [tokens, ms] "
                f"points, got a JSON {type(data).__name__}"
            )
        if "verify" not in data:
            raise ValueError(f"{path}: a cost file needs a 'verify' list of [tokens, ms] points")

        def points(name: str) -> FloatArray:
            value = data[name]
            if not isinstance(value, list) or not all(
                isinstance(point, list)
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in point)
                for point in value
            ):
                raise ValueError(
                    f"{path}: {name!r} must be a list of [tokens, ms] pairs of numbers"
                )
            try:
                array = np.asarray(value, dtype=np.float64)
            except (ValueError, OverflowError):
                raise ValueError(
                    f"{path}: {name!r} must be a list of [tokens, ms] pairs of numbers"
                ) from None
            if array.ndim != 2 or array.shape[1] != 2 or array.shape[0] < 1:
                raise ValueError(f"{path}: {name!r} must be a list of [tokens, ms] pairs")
            if not np.all(np.isfinite(array)) or np.any(array[:, 1] < 0):
                raise ValueError(f"{path}: {name!r} must hold finite, non-negative times")
            if np.any(array[:, 0] < 0):
                raise ValueError(f"{path}: {name!r} must hold non-negative token counts")
            order = np.argsort(array[:, 0], kind="stable")
            return np.asarray(array[order])

        verify = points("verify")
        if np.any(verify[:, 1] <= 0):
            raise ValueError(f"{path}: 'verify' times must be > 0 ms (a forward pass takes time)")
        draft = points("draft") if data.get("draft") else None
        return MeasuredCost(verify, draft, str(path))

    @staticmethod
    def _curve(points: FloatArray, tokens: npt.ArrayLike) -> FloatArray:
        t = np.asarray(tokens, dtype=np.float64)
        x, y = points[:, 0], np.maximum.accumulate(points[:, 1])
        if x.shape[0] == 1:
            return np.full(t.shape, y[0])
        inside = np.interp(t, x, y)
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2]) if x[-1] > x[-2] else 0.0
        return np.asarray(np.where(t > x[-1], y[-1] + (t - x[-1]) * slope, inside))

    def verify_ms(self, tokens: npt.ArrayLike) -> FloatArray:
        return self._curve(self.verify_points, tokens)

    def draft_pass_ms(self, tokens: npt.ArrayLike) -> FloatArray:
        if self.draft_points is None:
            return np.zeros(np.shape(tokens))
        return self._curve(self.draft_points, tokens)

    def describe(self) -> str:
        drafter = "measured drafter" if self.draft_points is not None else "drafting free"
        return f"measured: {self.source} ({self.verify_points.shape[0]} verify points, {drafter})"


CostModel = GpuLikeCost | MeasuredCost


def draft_cost_ms(
    cost: CostModel,
    drafter: DrafterKind,
    num_requests: int,
    num_drafts: int,
    parallel_pass_tokens: PassTokens = "requests",
) -> float:
    """Drafting ``num_drafts`` positions for each of ``num_requests`` requests.

    Autoregressive (draft models, EAGLE, MTP): one pass per position, each over R tokens, so k
    drafts cost k passes. Parallel (block drafters): one pass per step whatever k, charged at R
    tokens (``parallel_pass_tokens="requests"``, the default) or at the R·k query tokens the
    block actually carries (``"drafts"``: deeper blocks cost more once the drafter is
    compute-bound). No drafts, no pass.
    """
    if num_drafts <= 0 or num_requests <= 0:
        return 0.0
    if drafter == "autoregressive":
        return float(num_drafts * cost.draft_pass_ms(num_requests))
    if parallel_pass_tokens == "drafts":
        return float(cost.draft_pass_ms(num_requests * num_drafts))
    return float(cost.draft_pass_ms(num_requests))


def step_draft_cost_ms(
    cost: CostModel,
    drafter: DrafterKind,
    depths: npt.ArrayLike,
    parallel_pass_tokens: PassTokens = "requests",
) -> float:
    """Drafting ``depths[r]`` positions for each request, when depths differ (depth control).

    Autoregressive: pass ``j`` runs over the requests drafting at least ``j`` positions
    (requests that stop leave the drafter's batch). Parallel: one pass over the requests that
    draft at all (or over their drafted tokens, ``"drafts"``). With equal depths this is
    :func:`draft_cost_ms`.
    """
    d = np.asarray(depths, dtype=np.int64)
    deepest = int(d.max(initial=0))
    if deepest == 0:
        return 0.0
    if drafter == "autoregressive":
        rows = np.array([(d >= j).sum() for j in range(1, deepest + 1)])
        return float(cost.draft_pass_ms(rows).sum())
    if parallel_pass_tokens == "drafts":
        return float(cost.draft_pass_ms(int(d.sum())))
    return float(cost.draft_pass_ms(int((d > 0).sum())))


def cost_tables_for(
    cost: CostModel,
    drafter: DrafterKind,
    num_positions: int,
    max_requests: int,
    parallel_pass_tokens: PassTokens = "requests",
    depth_table: bool = False,
) -> CostTables:
    """The planner's tables: ``draft_ms[R]`` = drafting all K positions, ``verify_ms[t]``, and
    with ``depth_table`` the draft-cost-by-depth shape of the drafting this simulator charges:
    one pass per position for an autoregressive drafter, one pass at any depth for a parallel
    one (priced at the largest batch when the pass is charged by drafted tokens). A cost file's
    ``draft_depth`` profile is for serving tables (``CostTables.from_curves``); the simulator
    charges passes, so its planner prices passes too."""
    draft = np.array(
        [
            draft_cost_ms(cost, drafter, r, num_positions, parallel_pass_tokens)
            for r in range(max_requests + 1)
        ]
    )
    verify = cost.verify_ms(np.arange(max_requests * (num_positions + 1) + 1))
    tables = CostTables(draft, np.maximum(verify, 1e-6))
    if not depth_table:
        return tables
    if drafter == "parallel" and parallel_pass_tokens == "drafts":
        by_depth = [
            draft_cost_ms(cost, drafter, max_requests, d, parallel_pass_tokens)
            for d in range(num_positions + 1)
        ]
        return tables.with_draft_depth(np.maximum.accumulate(by_depth))
    return tables.with_draft_depth(drafter, max_depth=num_positions)


#: The most ``steps x requests`` slots a simulation replays (each costs a few int64 arrays).
MAX_STREAM_ENTRIES = 1 << 28


def _check_int(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def _check_stream_size(num_requests: int, num_steps: int) -> None:
    if num_requests * num_steps > MAX_STREAM_ENTRIES:
        raise ValueError(
            f"{num_steps} steps x {num_requests} requests exceed MAX_STREAM_ENTRIES = "
            f"{MAX_STREAM_ENTRIES} simulated slots"
        )


@dataclass(frozen=True)
class RoundStreams:
    """Which trace round each of R request slots replays at each step, and when a slot's
    trace request changes (a new request takes the slot)."""

    rounds: IntArray  # [steps, R]
    new_request: npt.NDArray[np.bool_]  # [steps, R]


def round_streams(
    rounds: DraftRounds, num_requests: int, num_steps: int, seed: int
) -> RoundStreams:
    """Each slot starts at a random trace request and replays whole requests in trace order,
    wrapping around; different slots therefore replay different content at the same step."""
    num_requests = _check_int(num_requests, "num_requests", 1)
    num_steps = _check_int(num_steps, "num_steps", 1)
    _check_stream_size(num_requests, num_steps)
    request_starts = np.flatnonzero(np.r_[True, rounds.request_id[1:] != rounds.request_id[:-1]])
    rng = np.random.default_rng(seed)
    starts = request_starts[rng.integers(0, request_starts.shape[0], size=num_requests)]
    index = (starts[None, :] + np.arange(num_steps)[:, None]) % rounds.num_rounds
    boundary = np.zeros(rounds.num_rounds, dtype=bool)
    boundary[request_starts] = True
    new = boundary[index]
    new[0, :] = True
    return RoundStreams(index.astype(np.int64), new)


@dataclass(frozen=True)
class PolicyResult:
    """Totals of one policy at one concurrency over the measured steps."""

    policy: str
    concurrency: int
    steps: int
    tokens: int
    time_ms: float
    verified_drafts: int
    drafted: int

    @property
    def throughput(self) -> float:
        """Output tokens per millisecond, all requests together."""
        return self.tokens / self.time_ms

    @property
    def per_request(self) -> float:
        """Output tokens per millisecond of one request (interactivity)."""
        return self.throughput / self.concurrency


def simulate_fixed(
    rounds: DraftRounds,
    streams: RoundStreams,
    k: int,
    cost: CostModel,
    drafter: DrafterKind,
    measure_from: int = 0,
    parallel_pass_tokens: PassTokens = "requests",
) -> PolicyResult:
    """Fixed draft length: every request drafts and verifies ``min(k, drafted)`` positions."""
    index = streams.rounds[measure_from:]
    steps, num_requests = index.shape
    drafted = np.minimum(rounds.num_drafted[index], k)
    accepted = np.minimum(rounds.num_accepted[index], drafted)
    tokens = int(accepted.sum()) + steps * num_requests
    verify = cost.verify_ms(num_requests + drafted.sum(axis=1))
    draft = np.array(
        [
            draft_cost_ms(cost, drafter, num_requests, int(d), parallel_pass_tokens)
            for d in drafted.max(axis=1)
        ]
    )
    return PolicyResult(
        f"K={k}",
        num_requests,
        steps,
        tokens,
        float((verify + draft).sum()),
        int(drafted.sum()),
        int(drafted.sum()),
    )


@dataclass
class AdaptiveTrace:
    """Per-step record of the adaptive policy (for inspection and plots)."""

    budget: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    time_ms: list[float] = field(default_factory=list)


def simulate_adaptive(
    rounds: DraftRounds,
    features: FloatArray,
    streams: RoundStreams,
    cost: CostModel,
    drafter: DrafterKind,
    *,
    measure_from: int = 0,
    refit_interval: int = 100,
    estimator: AcceptanceEstimator | None = None,
    budget_source: Literal["previous", "current"] = "previous",
    record: AdaptiveTrace | None = None,
    parallel_pass_tokens: PassTokens = "requests",
    exploration: float | None = None,
    depth_control: DepthControl | None = None,
    memory: float | None = None,
) -> PolicyResult:
    """Adaptive verification: features → estimator → planner → verdicts → observe.

    Without ``depth_control`` every request drafts all its positions (drafting is paid before
    the plan). With it, the planner first chooses each request's depth from its remembered
    confidences (``"batch"``: one depth, ``"per_request"``), only those positions are drafted,
    paid for (:func:`step_draft_cost_ms`) and planned; depth 0 everywhere runs the step
    without the drafter. Steps before
    ``measure_from`` run the whole loop (they warm up the estimator and the planner's remembered
    confidences) but are not counted. ``exploration`` is the planner's exploration floor (the
    probability that a request verifies its whole block in a step; ``None``: the planner's
    default).
    """
    steps, num_requests = streams.rounds.shape
    num_positions = rounds.num_positions
    tables = cost_tables_for(
        cost,
        drafter,
        num_positions,
        num_requests,
        parallel_pass_tokens,
        depth_table=depth_control is not None,
    )
    planner = (
        VerificationPlanner(
            tables, num_positions, num_slots=num_requests, budget_source=budget_source
        )
        if exploration is None
        else VerificationPlanner(
            tables,
            num_positions,
            num_slots=num_requests,
            budget_source=budget_source,
            exploration=exploration,
        )
    )
    if estimator is None:
        estimator = (
            AcceptanceEstimator(num_positions, refit_interval=refit_interval)
            if memory is None
            else AcceptanceEstimator(num_positions, refit_interval=refit_interval, memory=memory)
        )
    x_all = np.ascontiguousarray(features, dtype=np.float32)
    slots = np.arange(num_requests, dtype=np.int64)
    tokens = 0
    time_ms = 0.0
    verified_total = 0
    drafted_total = 0
    for step in range(steps):
        index = streams.rounds[step]
        for slot in np.flatnonzero(streams.new_request[step]):
            planner.add_request(int(slot))
        x = x_all[index]
        scheduled = rounds.num_drafted[index]
        if depth_control is None:
            draft_ms = float(tables.draft_ms[num_requests])
        else:
            scheduled = planner.choose_draft_depth(
                slots,
                scheduled,
                num_non_draft_tokens=num_requests,
                num_sampling_requests=num_requests,
                mode=depth_control,
            ).depths.astype(np.int64)
            draft_ms = step_draft_cost_ms(cost, drafter, scheduled, parallel_pass_tokens)
        p = estimator.predict(x)
        plan = planner.plan(
            slots,
            p,
            scheduled,
            num_non_draft_tokens=num_requests,
            num_sampling_requests=num_requests,
        )
        admitted = np.asarray(plan.admitted, dtype=np.int64)
        accepted = np.minimum(rounds.num_accepted[index], admitted)
        estimator.observe(x, admitted.astype(np.int32), accepted.astype(np.int32), p)
        step_ms = draft_ms + float(tables.verify_ms[num_requests + int(admitted.sum())])
        if step >= measure_from:
            step_tokens = int(accepted.sum()) + num_requests
            tokens += step_tokens
            time_ms += step_ms
            verified_total += int(admitted.sum())
            drafted_total += int(scheduled.sum())
            if record is not None:
                record.budget.append(int(plan.budget))
                record.tokens.append(step_tokens)
                record.time_ms.append(step_ms)
    return PolicyResult(
        ADAPTIVE_POLICIES[depth_control],
        num_requests,
        steps - measure_from,
        tokens,
        time_ms,
        verified_total,
        drafted_total,
    )


def simulate_sglang_ema(
    rounds: DraftRounds,
    streams: RoundStreams,
    cost: CostModel,
    drafter: DrafterKind,
    *,
    measure_from: int = 0,
    parallel_pass_tokens: PassTokens = "requests",
    policy: EmaTierPolicy | None = None,
) -> PolicyResult:
    """SGLang's EMA-tier adaptive speculation (:class:`~av_core.peers.EmaTierPolicy`, its default
    configuration unless ``policy`` is given, candidate steps above K clipped to K): before each
    step the batch's tier gives the step count s, every request drafts and verifies
    ``min(s, drafted)`` positions (SGLang verifies the whole chain), and the tier's EMA is fed
    the accepted counts. Charged like a fixed K = s step."""
    steps, num_requests = streams.rounds.shape
    num_positions = rounds.num_positions
    if policy is None:
        policy = EmaTierPolicy(max_steps=num_positions)
    tokens = 0
    time_ms = 0.0
    verified_total = 0
    for step in range(steps):
        index = streams.rounds[step]
        k = min(policy.steps_for(num_requests), num_positions)
        drafted = np.minimum(rounds.num_drafted[index], k)
        accepted = np.minimum(rounds.num_accepted[index], drafted)
        policy.update(accepted.tolist(), num_requests)
        if step >= measure_from:
            total = int(drafted.sum())
            tokens += int(accepted.sum()) + num_requests
            time_ms += draft_cost_ms(
                cost, drafter, num_requests, int(drafted.max(initial=0)), parallel_pass_tokens
            ) + float(cost.verify_ms(num_requests + total))
            verified_total += total
    return PolicyResult(
        PEER_POLICIES[0],
        num_requests,
        steps - measure_from,
        tokens,
        time_ms,
        verified_total,
        verified_total,
    )


def simulate_trt_schedule(
    rounds: DraftRounds,
    streams: RoundStreams,
    cost: CostModel,
    drafter: DrafterKind,
    schedule: Mapping[int, int] | None = None,
    *,
    measure_from: int = 0,
    parallel_pass_tokens: PassTokens = "requests",
) -> PolicyResult:
    """TensorRT-LLM's ``draft_len_schedule`` (:func:`~av_core.peers.trt_draft_length`; default
    ``{4: 4, 8: 2, 32: 1}``): the batch size alone fixes the draft length, so with R requests in
    flight it is fixed K = the schedule's length at R (capped at K)."""
    schedule = TRT_DEFAULT_SCHEDULE if schedule is None else schedule
    num_requests = streams.rounds.shape[1]
    k = min(trt_draft_length(schedule, num_requests), rounds.num_positions)
    result = simulate_fixed(rounds, streams, k, cost, drafter, measure_from, parallel_pass_tokens)
    return dataclasses.replace(result, policy=PEER_POLICIES[1])


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
    levels = np.arange(2, accepted.shape[0] + 1)  # row m of a pass, m >= 2
    marginal = np.concatenate([pass_ms[2:] - pass_ms[1:-1], [0.0]])  # padded: safe to index
    passes_reaching = (counts[None, :] >= levels[:, None]).sum(axis=1)  # #{j: c_j >= m}
    for depth in range(1, num_positions + 1):
        if counts[depth - 1] < 1:
            break
        available = np.minimum(depth, passes_reaching)
        cum_rows = np.concatenate([[0], np.cumsum(available)])
        cum_ms = np.concatenate([[0.0], np.cumsum(available * marginal[:-1])])
        extra = np.arange(int(counts[:depth].sum()) - depth + 1)  # rows beyond one per pass
        level = np.searchsorted(cum_rows, extra, side="left")  # first level reaching `extra`
        below = np.maximum(level - 1, 0)
        ms = cum_ms[below] + (extra - cum_rows[below]) * marginal[np.maximum(level - 1, 0)]
        ms = np.where(extra == 0, 0.0, ms)
        drafted = depth + extra
        best[drafted] = np.minimum(best[drafted], depth * pass_ms[1] + ms)
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


@dataclass(frozen=True)
class Simulation:
    """Results of every policy at every concurrency."""

    cost_description: str
    drafter: DrafterKind
    num_positions: int
    steps: int
    warmup_steps: int
    num_rounds: int
    results: dict[int, list[PolicyResult]]  # concurrency -> [K=0, ..., K=Kmax, AV, AV+D, ...]

    def best_fixed(self, concurrency: int, min_k: int = 1) -> PolicyResult:
        fixed = [
            r
            for r in self.results[concurrency]
            if r.policy.startswith("K=") and int(r.policy[2:]) >= min_k
        ]
        return max(fixed, key=lambda r: r.throughput)

    def adaptive(self, concurrency: int, policy: str = "AV") -> PolicyResult:
        return next(r for r in self.results[concurrency] if r.policy == policy)

    @property
    def adaptive_policies(self) -> list[str]:
        """The adaptive policies simulated, in column order (``AV`` first)."""
        first = next(iter(self.results.values()))
        return [r.policy for r in first if r.policy.startswith("AV")]

    def result(self, concurrency: int, policy: str) -> PolicyResult:
        """The result of ``policy`` (any name in the row) at ``concurrency``."""
        return next(r for r in self.results[concurrency] if r.policy == policy)

    @property
    def has_peers(self) -> bool:
        """Whether the peers' policies and the oracle were simulated (``peers=True``)."""
        first = next(iter(self.results.values()))
        return any(r.policy.startswith(ORACLE) for r in first)

    def to_text(self) -> str:
        text = format_simulation(self)
        return text + "\n\n" + format_peers(self) if self.has_peers else text

    def tables(self) -> list[Table]:
        """Every table of :meth:`to_text` (titled), for Markdown or JSON output."""
        return simulation_tables(self)


def simulate_trace(
    trace: DraftTrace,
    *,
    cost: CostModel | None = None,
    drafter: DrafterKind = "parallel",
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    steps: int = 1000,
    warmup_steps: int = 200,
    refit_interval: int = 100,
    seed: int = 0,
    parallel_pass_tokens: PassTokens = "requests",
    exploration: float | None = None,
    depth_control: Sequence[DepthControl] = ("batch", "per_request"),
    memory: float | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    peers: bool = False,
    trt_schedule: Mapping[int, int] | None = None,
) -> Simulation:
    """Runs every policy at every concurrency on the same round streams (paired comparison):
    fixed K = 0..K, AV, and AV with each drafting-depth mode in ``depth_control``. ``memory``
    sets the estimator's memory across rounds (``None``: the estimator's default). With
    ``peers``, also the other engines' policies (:data:`PEER_POLICIES`: SGLang's EMA tiers,
    TensorRT-LLM's ``draft_len_schedule`` (``trt_schedule``, default ``{4: 4, 8: 2, 32: 1}``),
    vLLM's adaptive verification: AV with vLLM's memoryless update and no exploration floor)
    and the hindsight oracle. ``progress(done, total, status)`` is called after each policy
    at each concurrency (``total``: policies times concurrencies).

    The trace must carry verdicts: rounds are replayed with the target's recorded verdicts, so a
    trace without any label (nothing admitted, or nothing verified) is refused with a
    ``ValueError``, as :func:`~av_core.evaluate.evaluate_trace` refuses it."""
    steps = _check_int(steps, "steps", 1)
    warmup_steps = _check_int(warmup_steps, "warmup_steps", 0)
    seed = _check_int(seed, "seed", 0)
    if isinstance(concurrency, str) or not isinstance(concurrency, Sequence):
        raise TypeError(f"concurrency must be a sequence of ints, got {type(concurrency).__name__}")
    concurrency = list(concurrency)
    if not concurrency:
        raise ValueError("concurrency must not be empty, got []")
    for r in concurrency:
        _check_int(r, "concurrency", 1)
        _check_stream_size(r, warmup_steps + steps)
    cost = cost if cost is not None else GpuLikeCost()
    if len(trace) == 0:
        raise ValueError("trace has no rows")
    if not bool(trace.admitted.any()):
        raise ValueError(
            "trace has no admitted draft (admitted = 0 in every row): nothing was verified, so "
            "there are no verdicts to replay"
        )
    if not bool(trace.labeled.any()):
        raise ValueError(
            "trace has no labeled drafts (no verdicts): the simulator replays the target's verdicts"
        )
    rounds = DraftRounds.from_trace(trace)
    features = rounds.column(trace.logit_q_max)
    results: dict[int, list[PolicyResult]] = {}
    per_concurrency = rounds.num_positions + 1 + 1 + len(depth_control) + (4 if peers else 0)
    total = per_concurrency * len(concurrency)
    done = 0

    def advance(status: str, count: int = 1) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total, status)

    for r in concurrency:
        streams = round_streams(rounds, r, warmup_steps + steps, seed)
        row = [
            simulate_fixed(rounds, streams, k, cost, drafter, warmup_steps, parallel_pass_tokens)
            for k in range(rounds.num_positions + 1)
        ]
        advance(f"R={r} fixed K", rounds.num_positions + 1)
        for mode in (None, *depth_control):
            row.append(
                simulate_adaptive(
                    rounds,
                    features,
                    streams,
                    cost,
                    drafter,
                    measure_from=warmup_steps,
                    refit_interval=refit_interval,
                    parallel_pass_tokens=parallel_pass_tokens,
                    exploration=exploration,
                    depth_control=mode,
                    memory=memory,
                )
            )
            advance(f"R={r} {row[-1].policy}")
        if peers:
            row.append(
                simulate_sglang_ema(
                    rounds,
                    streams,
                    cost,
                    drafter,
                    measure_from=warmup_steps,
                    parallel_pass_tokens=parallel_pass_tokens,
                )
            )
            advance(f"R={r} {row[-1].policy}")
            row.append(
                simulate_trt_schedule(
                    rounds,
                    streams,
                    cost,
                    drafter,
                    trt_schedule,
                    measure_from=warmup_steps,
                    parallel_pass_tokens=parallel_pass_tokens,
                )
            )
            advance(f"R={r} {row[-1].policy}")
            vllm = simulate_adaptive(
                rounds,
                features,
                streams,
                cost,
                drafter,
                measure_from=warmup_steps,
                refit_interval=refit_interval,
                parallel_pass_tokens=parallel_pass_tokens,
                exploration=0.0,
                memory=0.0,
            )
            row.append(dataclasses.replace(vllm, policy=PEER_POLICIES[2]))
            advance(f"R={r} {row[-1].policy}")
            row.append(
                simulate_oracle(
                    rounds,
                    streams,
                    cost,
                    drafter,
                    measure_from=warmup_steps,
                    parallel_pass_tokens=parallel_pass_tokens,
                )
            )
            advance(f"R={r} {ORACLE}")
        results[r] = row
    description = cost.describe()
    if drafter == "parallel":
        description += f"; parallel pass charged at {parallel_pass_tokens}"
    return Simulation(
        description,
        drafter,
        rounds.num_positions,
        steps,
        warmup_steps,
        rounds.num_rounds,
        results,
    )


def simulation_preamble(simulation: Simulation) -> list[str]:
    """The lines above the tables: drafter, K, steps and the cost model."""
    s = simulation
    return [
        f"simulation: {s.drafter} drafter, K = {s.num_positions}, {s.steps} measured steps "
        f"after {s.warmup_steps} warm-up steps, rounds replayed from {s.num_rounds} trace rounds",
        f"cost model: {s.cost_description}",
    ]


def simulation_tables(simulation: Simulation) -> list[Table]:
    """The tables of :func:`format_simulation` (and of ``--markdown`` and ``--json``)."""
    s = simulation
    first = next(iter(s.results.values()))
    names = [r.policy for r in first]
    adaptive = s.adaptive_policies

    throughput = Table(
        "output tokens per ms (all requests)",
        [col("R"), *(col(n, general(4)) for n in names)],
    )
    for concurrency in s.results:
        throughput.add(concurrency, *(s.result(concurrency, n).throughput for n in names))
    throughput.notes.append(
        "K=k: every request drafts and verifies k drafts (K=0: no speculation). AV: adaptive "
        "verification; AV+D: with one drafting depth for the batch; AV+Dr: with a depth per "
        "request."
    )

    ratios = Table(
        "adaptive policies against the best fixed K",
        [
            col("R"),
            col("best K>=1", align="<"),
            col("best K>=0", align="<"),
            *(col(f"{a}/best", fixed(3)) for a in adaptive),
            *(col(f"{a}/max", fixed(3)) for a in adaptive),
        ],
    )
    for concurrency in s.results:
        best = s.best_fixed(concurrency)
        best_all = s.best_fixed(concurrency, min_k=0)
        ratios.add(
            concurrency,
            best.policy,
            best_all.policy,
            *(s.adaptive(concurrency, a).throughput / best.throughput for a in adaptive),
            *(s.adaptive(concurrency, a).throughput / best_all.throughput for a in adaptive),
        )
    ratios.notes.append(
        "X/best: X's throughput over the best fixed K >= 1 at that concurrency; X/max: over the "
        "best of every fixed K including K = 0 (no speculation)."
    )

    interactivity = Table(
        "per-request output tokens per ms (interactivity)",
        [col("R"), *(col(n, general(3)) for n in names)],
    )
    for concurrency in s.results:
        interactivity.add(concurrency, *(s.result(concurrency, n).per_request for n in names))

    work = Table(
        "drafting and verification of the adaptive policies",
        [
            col("R"),
            *(
                column
                for a in adaptive
                for column in (
                    col(f"{a} drafted/req", fixed(3)),
                    col(f"{a} verified/drafted", fixed(3)),
                )
            ),
        ],
    )
    for concurrency in s.results:
        cells: list[float] = []
        for a in adaptive:
            r = s.adaptive(concurrency, a)
            share = r.verified_drafts / r.drafted if r.drafted else math.nan
            cells += [r.drafted / (r.steps * concurrency), share]
        work.add(concurrency, *cells)
    work.notes.append(
        "drafted/req: drafts per request per step; verified/drafted: the share of drafted "
        "positions sent to verification (n/a: nothing drafted)."
    )
    tables = [throughput, ratios, interactivity, work]
    if s.has_peers:
        tables.append(peers_table(s))
    return tables


def format_simulation(simulation: Simulation) -> str:
    """Throughput (tokens/ms) and per-request tokens/ms per policy and concurrency, each
    adaptive policy against the best fixed K >= 1 and against the best of everything fixed
    (no speculation included), and what the adaptive policies drafted and verified; each table
    titled, columns two spaces apart."""
    tables = [t for t in simulation_tables(simulation) if t.title != PEERS_TITLE]
    return render(tables, "text", simulation_preamble(simulation))


def simulation_to_dict(simulation: Simulation) -> dict[str, object]:
    """Everything ``av-core simulate --json`` prints: settings, raw results and the tables."""
    s = simulation
    return {
        "drafter": s.drafter,
        "num_positions": s.num_positions,
        "steps": s.steps,
        "warmup_steps": s.warmup_steps,
        "num_rounds": s.num_rounds,
        "cost_model": s.cost_description,
        "results": [
            {
                "concurrency": concurrency,
                "policy": r.policy,
                "throughput_tokens_per_ms": r.throughput,
                "per_request_tokens_per_ms": r.per_request,
                "tokens": r.tokens,
                "time_ms": r.time_ms,
                "drafted": r.drafted,
                "verified_drafts": r.verified_drafts,
                "steps": r.steps,
            }
            for concurrency, row in s.results.items()
            for r in row
        ],
        "tables": [t.to_dict() for t in simulation_tables(s)],
    }


def _oracle(simulation: Simulation, concurrency: int) -> PolicyResult:
    return next(r for r in simulation.results[concurrency] if r.policy.startswith(ORACLE))


def _av_core(simulation: Simulation) -> str:
    """The av_core policy the peers are compared with: AV+D when simulated, else AV."""
    return "AV+D" if "AV+D" in simulation.adaptive_policies else "AV"


@dataclass(frozen=True)
class PeerRow:
    """One concurrency of the peers' comparison: throughputs relative to the best fixed K
    (no speculation included)."""

    concurrency: int
    best_fixed: PolicyResult
    relative: dict[str, float]  # policy -> throughput / best fixed K (K = 0 included)
    av_core: str
    oracle: str

    @property
    def av_core_of_oracle(self) -> float:
        return self.relative[self.av_core] / self.relative[self.oracle]

    @property
    def av_core_of_best_other(self) -> float:
        """av_core against the best of every other policy but the oracle (fixed K included)."""
        others = [v for k, v in self.relative.items() if k not in (self.av_core, self.oracle)]
        return self.relative[self.av_core] / max([1.0, *others])


def peer_rows(simulation: Simulation) -> list[PeerRow]:
    """The comparison of ``format_peers``, per concurrency (needs ``peers=True``)."""
    if not simulation.has_peers:
        raise ValueError("simulation has no peers' policies: run simulate_trace(peers=True)")
    av_core = _av_core(simulation)
    rows = []
    for concurrency in simulation.results:
        best = simulation.best_fixed(concurrency, min_k=0)
        oracle = _oracle(simulation, concurrency)
        names = [*PEER_POLICIES, av_core, oracle.policy]
        relative = {
            name: simulation.result(concurrency, name).throughput / best.throughput
            for name in names
        }
        rows.append(PeerRow(concurrency, best, relative, av_core, oracle.policy))
    return rows


PEERS_TITLE = "peers: throughput over the best fixed K (K = 0 included), same rounds and costs"


def peers_table(simulation: Simulation) -> Table:
    """The table of :func:`format_peers`."""
    rows = peer_rows(simulation)
    names = list(rows[0].relative)
    table = Table(
        PEERS_TITLE,
        [
            col("R"),
            col("best fixed", align="<"),
            *(col(n, fixed(3)) for n in names),
            col(f"{rows[0].av_core}/oracle", fixed(3)),
            col(f"{rows[0].av_core}/other", fixed(3)),
        ],
    )
    for row in rows:
        table.add(
            row.concurrency,
            f"{row.best_fixed.throughput:.4g} ({row.best_fixed.policy})",
            *(row.relative[n] for n in names),
            row.av_core_of_oracle,
            row.av_core_of_best_other,
        )
    table.notes.append(
        "SGL-EMA: SGLang's EMA tiers (default configuration, steps above K clipped to K); TRT: "
        "TensorRT-LLM's draft_len_schedule; vLLM-AV: adaptive verification with vLLM's "
        "memoryless update and no exploration floor; oracle: the hindsight bound (verifies only "
        "accepted drafts, the best number per step). X/other: against the best policy but the "
        "oracle, fixed K included."
    )
    return table


def format_peers(simulation: Simulation) -> str:
    """The peers' policies, av_core's and the oracle, each over the best fixed K (no
    speculation included), av_core's fraction of the oracle and av_core over the best other."""
    return peers_table(simulation).to_text()


def format_peers_markdown(simulation: Simulation, label: str = "") -> str:
    """:func:`format_peers` as Markdown rows (``label`` fills a leading column when given)."""
    rows = peer_rows(simulation)
    av_core = rows[0].av_core
    lead = ["trace / drafter"] if label else []
    head = [
        *lead,
        "R",
        "best fixed K (tok/ms)",
        "SGLang-EMA",
        "TRT schedule",
        "vLLM AV",
        f"av_core ({av_core})",
        "oracle",
        "av_core / oracle",
        "av_core / best other",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [
            *([label] if label else []),
            str(row.concurrency),
            f"{row.best_fixed.throughput:.4g} ({row.best_fixed.policy})",
            *(f"{row.relative[name]:.3f}" for name in (*PEER_POLICIES, av_core, row.oracle)),
            f"{row.av_core_of_oracle:.3f}",
            f"{row.av_core_of_best_other:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_markdown(simulation: Simulation) -> str:
    """A Markdown table per concurrency: no speculation, the best fixed K >= 1, each adaptive
    policy, and each against the best fixed K (K = 0 included), in tokens per ms."""
    s = simulation
    adaptive = s.adaptive_policies
    head = (
        "| R | K=0 | best fixed K≥1 | "
        + " | ".join(adaptive)
        + " | "
        + " | ".join(f"{a} / best fixed (K=0 incl.)" for a in adaptive)
        + " |"
    )
    lines = [head, "|" + "---|" * (3 + 2 * len(adaptive))]
    for concurrency, row in s.results.items():
        best = s.best_fixed(concurrency)
        best_all = s.best_fixed(concurrency, min_k=0)
        cells = [
            str(concurrency),
            f"{row[0].throughput:.4g}",
            f"{best.throughput:.4g} ({best.policy})",
            *(f"{s.adaptive(concurrency, a).throughput:.4g}" for a in adaptive),
            *(
                f"{s.adaptive(concurrency, a).throughput / best_all.throughput:.3f}"
                for a in adaptive
            ),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_concurrency(text: str) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]``; ``"1-256"`` → 1, 2, 4, ..., 256 (doubling from LOW to HIGH).

    The grammar of :func:`av_core.argtypes.parse_int_list`: comma-separated integers and
    ``LOW-HIGH`` doubling ranges, strictly increasing, each >= 1; anything else is a
    ``ValueError`` quoting the text."""
    try:
        return parse_int_list(text, low=1)
    except ValueError as error:
        raise ValueError(f"concurrency: {error}") from None


__all__ = [
    "ADAPTIVE_POLICIES",
    "ORACLE",
    "PEER_POLICIES",
    "PEERS_TITLE",
    "PeerRow",
    "DEFAULT_CONCURRENCY",
    "MAX_STREAM_ENTRIES",
    "DepthControl",
    "AdaptiveTrace",
    "CostModel",
    "DrafterKind",
    "PassTokens",
    "GpuLikeCost",
    "MeasuredCost",
    "PolicyResult",
    "RoundStreams",
    "Simulation",
    "cost_tables_for",
    "draft_cost_ms",
    "format_markdown",
    "format_peers",
    "format_peers_markdown",
    "format_simulation",
    "parse_concurrency",
    "peer_rows",
    "peers_table",
    "round_streams",
    "simulate_adaptive",
    "simulate_fixed",
    "simulate_oracle",
    "simulate_sglang_ema",
    "simulate_trace",
    "simulate_trt_schedule",
    "simulation_preamble",
    "simulation_tables",
    "simulation_to_dict",
    "step_draft_cost_ms",
]
