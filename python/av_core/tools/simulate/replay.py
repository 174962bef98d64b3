"""The replay: :func:`simulate_trace` runs every policy at every concurrency on the same round
streams of a trace and collects a :class:`~av_core.tools.simulate.report.Simulation`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence

from av_core._checks import _check_int
from av_core._native import ESTIMATOR_DEFAULTS, VLLM_ESTIMATOR, InvalidTypeError, InvalidValueError
from av_core.tools.argtypes import parse_int_list
from av_core.tools.evaluate import DraftRounds
from av_core.tools.simulate.costs import CostModel, DrafterKind, GpuLikeCost, PassTokens
from av_core.tools.simulate.oracle import ORACLE, simulate_oracle
from av_core.tools.simulate.policies import (
    PEER_POLICIES,
    DepthControl,
    PolicyResult,
    RoundStreams,
    _check_stream_size,
    round_streams,
    simulate_adaptive,
    simulate_fixed,
    simulate_sglang_ema,
    simulate_trt_schedule,
)
from av_core.tools.simulate.report import Simulation
from av_core.tools.trace import DraftTrace

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def simulate_trace(
    trace: DraftTrace,
    *,
    cost: CostModel | None = None,
    drafter: DrafterKind = "parallel",
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    steps: int = 1000,
    warmup_steps: int = 200,
    refit_interval: int = ESTIMATOR_DEFAULTS["refit_interval"],
    seed: int = 0,
    parallel_pass_tokens: PassTokens = "requests",
    exploration: float | None = None,
    depth_control: Sequence[DepthControl] = ("batch", "per_request"),
    memory: float | None = None,
    update: str | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    peers: bool = False,
    trt_schedule: Mapping[int, int] | None = None,
) -> Simulation:
    """Runs every policy at every concurrency on the same round streams (paired comparison):
    fixed K = 0..K, AV, and AV with each drafting-depth mode in ``depth_control``. ``memory``
    sets the estimator's memory across rounds and ``update`` how it refits (``"map"`` or
    ``"vllm"``; ``None``: the estimator's defaults). With
    ``peers``, also the other engines' policies (:data:`PEER_POLICIES`: SGLang's EMA tiers,
    TensorRT-LLM's ``draft_len_schedule`` (``trt_schedule``, default ``{4: 4, 8: 2, 32: 1}``),
    vLLM's adaptive verification: AV with vLLM's memoryless update and no exploration floor)
    and the hindsight oracle. ``progress(done, total, status)`` is called after each policy
    at each concurrency (``total``: policies times concurrencies).

    The trace must carry verdicts: rounds are replayed with the target's recorded verdicts, so a
    trace without any label (nothing admitted, or nothing verified) is refused with a
    ``ValueError``, as :func:`~av_core.tools.evaluate.evaluate_trace` refuses it."""
    steps = _check_int(steps, "steps", 1)
    warmup_steps = _check_int(warmup_steps, "warmup_steps", 0)
    seed = _check_int(seed, "seed", 0)
    if isinstance(concurrency, str) or not isinstance(concurrency, Sequence):
        raise InvalidTypeError(
            f"concurrency must be a sequence of ints, got {type(concurrency).__name__}"
        )
    concurrency = list(concurrency)
    if not concurrency:
        raise InvalidValueError("concurrency must not be empty, got []")
    for r in concurrency:
        _check_int(r, "concurrency", 1)
        _check_stream_size(r, warmup_steps + steps)
    cost = cost if cost is not None else GpuLikeCost()
    if len(trace) == 0:
        raise InvalidValueError("trace has no rows")
    if not bool(trace.admitted.any()):
        raise InvalidValueError(
            "trace has no admitted draft (admitted = 0 in every row): nothing was verified, so "
            "there are no verdicts to replay"
        )
    if not bool(trace.labeled.any()):
        raise InvalidValueError(
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
        adaptive = functools.partial(
            simulate_adaptive,
            rounds,
            features,
            streams,
            cost,
            drafter,
            measure_from=warmup_steps,
            refit_interval=refit_interval,
            parallel_pass_tokens=parallel_pass_tokens,
        )
        for mode in (None, *depth_control):
            row.append(
                adaptive(exploration=exploration, depth_control=mode, memory=memory, update=update)
            )
            advance(f"R={r} {row[-1].policy}")
        if peers:
            run = functools.partial(
                _run_policy, rounds, streams, cost, drafter, warmup_steps, parallel_pass_tokens
            )
            for result, name in _peer_results(run, adaptive, trt_schedule):
                row.append(result)
                advance(f"R={r} {name}")
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


def _run_policy(
    rounds: DraftRounds,
    streams: RoundStreams,
    cost: CostModel,
    drafter: DrafterKind,
    measure_from: int,
    parallel_pass_tokens: PassTokens,
    simulate: Callable[..., PolicyResult],
    *args: object,
) -> PolicyResult:
    """``simulate`` (a peer policy or the oracle) on the replay's round streams, measured from
    ``measure_from``; ``args`` follow ``drafter``."""
    return simulate(
        rounds,
        streams,
        cost,
        drafter,
        *args,
        measure_from=measure_from,
        parallel_pass_tokens=parallel_pass_tokens,
    )


def _peer_results(
    run: Callable[..., PolicyResult],
    adaptive: Callable[..., PolicyResult],
    trt_schedule: Mapping[int, int] | None,
) -> Iterator[tuple[PolicyResult, str]]:
    """The other engines' policies (in :data:`PEER_POLICIES`' order), then the oracle, each with
    its progress name; run one at a time, so that progress advances after each."""
    result = run(simulate_sglang_ema)
    yield result, result.policy
    result = run(simulate_trt_schedule, trt_schedule)
    yield result, result.policy
    vllm = adaptive(
        exploration=0.0, memory=VLLM_ESTIMATOR["memory"], update=VLLM_ESTIMATOR["update"]
    )
    result = dataclasses.replace(vllm, policy=PEER_POLICIES[2])
    yield result, result.policy
    yield run(simulate_oracle), ORACLE


def parse_concurrency(text: str) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]``; ``"1-256"`` → 1, 2, 4, ..., 256 (doubling from LOW to HIGH).

    The grammar of :func:`av_core.tools.argtypes.parse_int_list`: comma-separated integers and
    ``LOW-HIGH`` doubling ranges, strictly increasing, each >= 1; anything else is a
    ``ValueError`` quoting the text."""
    try:
        return parse_int_list(text, low=1)
    except ValueError as error:
        raise InvalidValueError(f"concurrency: {error}") from None
