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
drafted positions are paid for and planned. The model is documented in ``docs/simulate.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from av_core import AcceptanceEstimator, CostTables, VerificationPlanner
from av_core.evaluate import DraftRounds
from av_core.trace import DraftTrace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
DrafterKind = Literal["autoregressive", "parallel"]
PassTokens = Literal["requests", "drafts"]

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DepthControl = Literal["batch", "per_request"]
#: Policy names of adaptive verification without and with depth control.
ADAPTIVE_POLICIES = {None: "AV", "batch": "AV+D", "per_request": "AV+Dr"}


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
        """Reads a cost file written by ``av-core profile`` (JSON with a ``verify`` list of
        ``[tokens, ms]`` points and an optional ``draft`` list). Anything malformed (not UTF-8,
        not JSON, missing or mistyped lists, non-finite or negative values) raises ``ValueError``
        naming the file; a file that cannot be opened raises its ``OSError``."""
        try:
            data = json.loads(Path(path).read_bytes().decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not UTF-8 text ({error.reason})") from None
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not JSON ({error})") from None
        except RecursionError:
            raise ValueError(f"{path}: not JSON (nested too deeply)") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a cost file is a JSON object, got {type(data).__name__}")
        if "verify" not in data:
            raise ValueError(f"{path}: a cost file needs a 'verify' list of [tokens, ms] points")

        def points(name: str) -> FloatArray:
            value = data[name]
            try:
                if not isinstance(value, list) or not all(
                    isinstance(point, list)
                    and all(isinstance(v, int | float) and not isinstance(v, bool) for v in point)
                    for point in value
                ):
                    raise ValueError
                array = np.asarray(value, dtype=np.float64)
            except (ValueError, OverflowError):
                array = np.zeros((0, 0))
            if array.ndim != 2 or array.shape[1] != 2 or array.shape[0] < 1:
                raise ValueError(f"{path}: {name!r} must be a list of [tokens, ms] pairs")
            if not np.all(np.isfinite(array)) or np.any(array[:, 1] < 0):
                raise ValueError(f"{path}: {name!r} must hold finite, non-negative times")
            order = np.argsort(array[:, 0], kind="stable")
            return np.asarray(array[order])

        draft = points("draft") if data.get("draft") else None
        return MeasuredCost(points("verify"), draft, str(path))

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

    def to_text(self) -> str:
        return format_simulation(self)


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
    progress: Callable[[str], None] | None = None,
) -> Simulation:
    """Runs every policy at every concurrency on the same round streams (paired comparison):
    fixed K = 0..K, AV, and AV with each drafting-depth mode in ``depth_control``. ``memory``
    sets the estimator's memory across rounds (``None``: the estimator's default)."""
    steps = _check_int(steps, "steps", 1)
    warmup_steps = _check_int(warmup_steps, "warmup_steps", 0)
    seed = _check_int(seed, "seed", 0)
    if isinstance(concurrency, str) or not isinstance(concurrency, Sequence):
        raise TypeError(f"concurrency must be a sequence of ints, got {type(concurrency).__name__}")
    for r in concurrency:
        _check_int(r, "concurrency", 1)
        _check_stream_size(r, warmup_steps + steps)
    cost = cost if cost is not None else GpuLikeCost()
    rounds = DraftRounds.from_trace(trace)
    features = rounds.column(trace.logit_q_max)
    results: dict[int, list[PolicyResult]] = {}
    for r in concurrency:
        streams = round_streams(rounds, r, warmup_steps + steps, seed)
        row = [
            simulate_fixed(rounds, streams, k, cost, drafter, warmup_steps, parallel_pass_tokens)
            for k in range(rounds.num_positions + 1)
        ]
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
        results[r] = row
        if progress is not None:
            progress(f"concurrency {r} done")
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


def format_simulation(simulation: Simulation) -> str:
    """Throughput (tokens/ms) and per-request tokens/ms per policy and concurrency, and each
    adaptive policy against the best fixed K >= 1 and against the best of everything fixed
    (no speculation included)."""
    s = simulation
    first = next(iter(s.results.values()))
    names = [r.policy for r in first]
    adaptive = s.adaptive_policies
    ratio_names = [f"{a}/best" for a in adaptive] + [f"{a}/max" for a in adaptive]
    lines = [
        f"simulation: {s.drafter} drafter, K = {s.num_positions}, {s.steps} measured steps "
        f"after {s.warmup_steps} warm-up steps, rounds replayed from {s.num_rounds} trace rounds",
        f"cost model: {s.cost_description}",
        "",
        "output tokens per ms (all requests)",
        f"{'R':>5}" + "".join(f"{n:>9}" for n in names) + "".join(f"{n:>10}" for n in ratio_names),
    ]
    for concurrency, row in s.results.items():
        best = s.best_fixed(concurrency)
        best_all = s.best_fixed(concurrency, min_k=0)
        lines.append(
            f"{concurrency:>5}"
            + "".join(f"{r.throughput:>9.4g}" for r in row)
            + "".join(
                f"{s.adaptive(concurrency, a).throughput / best.throughput:>10.3f}"
                for a in adaptive
            )
            + "".join(
                f"{s.adaptive(concurrency, a).throughput / best_all.throughput:>10.3f}"
                for a in adaptive
            )
        )
    lines.append(
        "X/best: X against the best fixed K >= 1 at that concurrency; X/max: against the best "
        "of every fixed K including K = 0 (no speculation). AV: adaptive verification; AV+D: "
        "with one drafting depth for the batch; AV+Dr: with a depth per request."
    )
    lines.append("")
    lines.append("per-request output tokens per ms (interactivity)")
    lines.append(f"{'R':>5}" + "".join(f"{n:>9}" for n in names))
    for concurrency, row in s.results.items():
        lines.append(f"{concurrency:>5}" + "".join(f"{r.per_request:>9.3g}" for r in row))
    lines.append("")
    lines.append(
        f"{'R':>5}"
        + "".join(f"{a + ' drafted/req':>18}{a + ' verified/drafted':>21}" for a in adaptive)
    )
    for concurrency in s.results:
        cells = []
        for a in adaptive:
            r = s.adaptive(concurrency, a)
            cells.append(
                f"{r.drafted / (r.steps * concurrency):>18.3f}"
                f"{r.verified_drafts / max(r.drafted, 1):>21.3f}"
            )
        lines.append(f"{concurrency:>5}" + "".join(cells))
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
    """``"1,2,4"`` → ``[1, 2, 4]``; ``"1-256"`` → powers of two from 1 to 256."""
    if "-" in text and "," not in text:
        low, high = (int(part) for part in text.split("-"))
        values = [2**i for i in range(int(math.log2(max(low, 1))), int(math.log2(high)) + 1)]
        return [v for v in values if low <= v <= high]
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or any(v < 1 for v in values):
        raise ValueError(f"concurrency must be positive integers, got {text!r}")
    return values


__all__ = [
    "ADAPTIVE_POLICIES",
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
    "format_simulation",
    "parse_concurrency",
    "round_streams",
    "simulate_adaptive",
    "simulate_fixed",
    "simulate_trace",
    "step_draft_cost_ms",
]
