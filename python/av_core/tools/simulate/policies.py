"""The round streams every policy replays (the same rounds for each, a paired comparison) and the
policies themselves: fixed K, adaptive verification with and without drafting-depth control, and
the other engines' policies (SGLang's EMA tiers, TensorRT-LLM's ``draft_len_schedule``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from av_core import AcceptanceEstimator, VerificationPlanner
from av_core._checks import _check_int
from av_core._native import ESTIMATOR_DEFAULTS, InvalidValueError
from av_core.tools.evaluate import DraftRounds
from av_core.tools.peers import TRT_DEFAULT_SCHEDULE, EmaTierPolicy, trt_draft_length
from av_core.tools.simulate.costs import (
    CostModel,
    DrafterKind,
    FloatArray,
    IntArray,
    PassTokens,
    cost_tables_for,
    draft_cost_ms,
    step_draft_cost_ms,
)

DepthControl = Literal["batch", "per_request"]
#: Policy names of adaptive verification without and with depth control.
ADAPTIVE_POLICIES = {None: "AV", "batch": "AV+D", "per_request": "AV+Dr"}
#: The peers' policies ``simulate_trace(peers=True)`` adds, in column order, and the oracle.
PEER_POLICIES = ("SGL-EMA", "TRT", "vLLM-AV")


#: The most ``steps x requests`` slots a simulation replays (each costs a few int64 arrays).
MAX_STREAM_ENTRIES = 1 << 28


def _check_stream_size(num_requests: int, num_steps: int) -> None:
    if num_requests * num_steps > MAX_STREAM_ENTRIES:
        raise InvalidValueError(
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
    refit_interval: int = ESTIMATOR_DEFAULTS["refit_interval"],
    estimator: AcceptanceEstimator | None = None,
    budget_source: Literal["previous", "current"] = "previous",
    record: AdaptiveTrace | None = None,
    parallel_pass_tokens: PassTokens = "requests",
    exploration: float | None = None,
    depth_control: DepthControl | None = None,
    memory: float | None = None,
    update: str | None = None,
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
    default). ``memory`` and ``update`` are the estimator's (``None``: its defaults; the
    simulator's vLLM peer passes vLLM's, ``memory=0.0, update="vllm"``).
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
        options: dict[str, Any] = {"refit_interval": refit_interval}
        if memory is not None:
            options["memory"] = memory
        if update is not None:
            options["update"] = update
        estimator = AcceptanceEstimator(num_positions, **options)
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
    """SGLang's EMA-tier adaptive speculation (:class:`~av_core.tools.peers.EmaTierPolicy`, its
    default configuration unless ``policy`` is given, candidate steps above K clipped to K):
    before each step the batch's tier gives the step count s, every request drafts and verifies
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
    """TensorRT-LLM's ``draft_len_schedule`` (:func:`~av_core.tools.peers.trt_draft_length`; default
    ``{4: 4, 8: 2, 32: 1}``): the batch size alone fixes the draft length, so with R requests in
    flight it is fixed K = the schedule's length at R (capped at K)."""
    schedule = TRT_DEFAULT_SCHEDULE if schedule is None else schedule
    num_requests = streams.rounds.shape[1]
    k = min(trt_draft_length(schedule, num_requests), rounds.num_positions)
    result = simulate_fixed(rounds, streams, k, cost, drafter, measure_from, parallel_pass_tokens)
    return dataclasses.replace(result, policy=PEER_POLICIES[1])
