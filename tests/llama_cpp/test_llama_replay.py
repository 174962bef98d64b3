"""The simulator's replay of a run (``simulate_run``) against the loop itself, llama.cpp's
micro-batches, and the shape-aware price of a step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from llama_fakes import FakeRuntime

from av_core import CostTables
from av_core.llama_cpp.bench import run_trace
from av_core.llama_cpp.engine import SpeculativeEngine
from av_core.llama_cpp.policies import AdaptivePolicy, FixedK, LlamaCppPolicy
from av_core.llama_cpp.profile import EngineCosts, llama_ubatches
from av_core.llama_cpp.sampling import SamplingParams
from av_core.tools.evaluate import DraftRounds
from av_core.tools.simulate.run import StepShape, simulate_run
from av_core.tools.trace import trace_from_rows

PROMPTS = [[0, 1], [2], [3, 4, 0], [1]]


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        # Every sequence brings one token: one micro-batch.
        (((0, 1), (1, 1), (2, 1)), [(3, 3)]),
        # Equal lengths: one micro-batch of 3 x 2 tokens.
        (((0, 2), (1, 2), (2, 2)), [(3, 6)]),
        # Uneven: as many tokens from each as the shortest has, then the rest alone.
        (((0, 5), (1, 1), (2, 1), (3, 1)), [(4, 4), (1, 4)]),
        (((0, 3), (1, 2)), [(2, 4), (1, 1)]),
        (((0, 1), (1, 3), (2, 2)), [(3, 3), (2, 2), (1, 1)]),
        # Sequence ids must follow each other: a gap starts another micro-batch.
        (((0, 1), (2, 1), (3, 1)), [(1, 1), (2, 2)]),
        (((1, 1), (3, 1), (5, 1)), [(1, 1), (1, 1), (1, 1)]),
        (((0, 2), (2, 1), (3, 1)), [(1, 2), (2, 2)]),
    ],
)
def test_micro_batches_follow_llama_cpps_split_equal(shape, expected) -> None:  # type: ignore[no-untyped-def]
    """Hand cases of ``llama_batch_allocr::split_equal(n_ubatch, sequential=true)`` (the
    vendored src/llama-batch.cpp): a set of consecutive sequence ids, expanded one token per
    sequence while every one has tokens left."""
    assert llama_ubatches(shape) == expected


def _costs() -> EngineCosts:
    """Two profiled concurrencies with round numbers: a target pass costs 10 ms plus 3 ms per
    token at either (R = 2 measures 2, 4, 6 tokens; R = 4 measures 4, 8, 12); a drafter pass
    5 ms per request; a catch-up token 0.5 ms."""

    def entry(r: int) -> dict[str, list[tuple[int, float]]]:
        return {
            "verify": [(r * (1 + a), 10.0 + 3.0 * r * (1 + a)) for a in range(3)],
            "draft": [(n, 5.0 * n) for n in range(1, r + 1)],
            "catchup": [(1, 5.0), (9, 9.0), (33, 21.0)],
            "draft_depth": [(0, 0.0), (1, 5.0 * r), (2, 10.0 * r)],
        }

    return EngineCosts({2: entry(2), 4: entry(4)}, 2, {})


def test_an_even_step_costs_what_the_tables_say() -> None:
    costs = _costs()
    for r in (2, 4):
        tables = costs.tables(r)
        for depth in (0, 1, 2):
            passes = tuple(tuple((s, 1) for s in range(r)) for _ in range(depth))
            verify = tuple((s, 1 + depth) for s in range(r))
            expected = tables.verify_ms[r * (1 + depth)] + depth * tables.draft_ms[r] / 2
            assert costs.price(StepShape(passes, verify)) == pytest.approx(expected)


def test_an_uneven_step_costs_each_micro_batch() -> None:
    costs = _costs()
    # Target: slots 0-2 bring 3, 1, 1 tokens -> (3 seqs, 3 tokens) then (1 seq, 2 tokens),
    # each at the line of tokens every concurrency measured: 10 + 3 t.
    at3 = 10.0 + 3.0 * 3
    at1 = 10.0 + 3.0 * 2
    # Drafter: slot 0 catches up on 9 tokens, slot 1 on 1: (2 seqs, 2 tokens), then (1, 8):
    # a pass over 2 requests, then a pass over 1 request plus what 7 more tokens add (the
    # catch-up curve at 8 less at 1: 7/8 of the way from 5 to 9 ms).
    draft = 10.0 + 5.0 + (9.0 - 5.0) * 7 / 8
    # Two requests catching up on 2 tokens each (one micro-batch of 4 tokens): the pass over
    # 2 plus what the curve adds from 2 tokens to 4.
    both = StepShape((((0, 2), (1, 2)),), ())
    assert costs.price(both) == pytest.approx(10.0 + (9.0 - 5.0) * (4 - 2) / 8)
    shape = StepShape((((0, 9), (1, 1)),), ((0, 3), (1, 1), (2, 1)))
    assert costs.price(shape) == pytest.approx(at3 + at1 + draft)


@pytest.mark.parametrize(
    "make", [lambda: FixedK(2), lambda: FixedK(3), lambda: LlamaCppPolicy(n_max=3)]
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replaying_a_run_on_its_own_trace_gives_its_steps(make, seed: int) -> None:  # type: ignore[no-untyped-def]
    """A policy whose decisions do not depend on verdicts, replayed on its own run's trace
    (verified in full), makes that run's steps: the same forward passes, catch-up tokens and
    verification blocks step by step, and the same tokens."""
    engine = SpeculativeEngine(
        FakeRuntime(6, seed, capacity=96),
        FakeRuntime(6, seed + 50, scale=1.0, capacity=96),
        SamplingParams(1.0),
        max_positions=4,
    )
    result = engine.generate(PROMPTS, 20, make(), seed=seed)
    trace = run_trace(result, ["w"] * len(PROMPTS), engine.params)
    assert trace is not None
    rounds = DraftRounds.from_trace(trace)
    shapes: list[StepShape] = []

    def record(shape: StepShape) -> float:
        shapes.append(shape)
        return 1.0

    confidences = None if trace.top10_confidence is None else rounds.column(trace.top10_confidence)
    replay = simulate_run(
        rounds,
        make(),
        record,
        20,
        features=rounds.column(trace.logit_q_max),
        confidences=confidences,
    )
    assert shapes == [step.shape for step in result.steps]
    assert replay.tokens == result.emitted == 20 * len(PROMPTS)
    assert (replay.steps, replay.admitted, replay.accepted) == (
        len(result.steps),
        result.admitted,
        result.accepted,
    )


def _rounds(confidences: list[list[float]], accepted: list[int]) -> tuple[DraftRounds, np.ndarray]:
    """One request's rounds of 3 greedy drafts with the given confidences, verified in full:
    round i accepts its first ``accepted[i]`` drafts."""
    rows = [
        {
            "request_id": 0,
            "step": i,
            "position": k,
            "workload": "w",
            "logit_q_max": 1.0,
            "admitted": True,
            "label": 1 if k < a else (0 if k == a else None),
            "top10_confidence": c,
        }
        for i, (row, a) in enumerate(zip(confidences, accepted, strict=True))
        for k, c in enumerate(row)
    ]
    trace = trace_from_rows(rows)
    rounds = DraftRounds.from_trace(trace)
    return rounds, rounds.column(trace.top10_confidence, math.nan)  # type: ignore[arg-type]


def test_llama_cpps_replay_stops_below_p_min_and_pays_the_stopping_pass() -> None:
    """Round 0: confidences 0.9, 0.5, 0.9 -> with p_min 0.75 the first draft is kept, the
    second position stops it (its pass was run); round 1: 0.6 first -> nothing drafted, one
    pass; n_min 2 drops round 0's single draft (verified: none)."""
    rounds, confidences = _rounds([[0.9, 0.5, 0.9], [0.6, 0.9, 0.9], [0.9, 0.9, 0.9]], [1, 3, 3])
    shapes: list[StepShape] = []

    def record(shape: StepShape) -> float:
        shapes.append(shape)
        return 1.0

    features = rounds.column(np.ones(9))
    replay = simulate_run(
        rounds, LlamaCppPolicy(p_min=0.75), record, 6, features=features, confidences=confidences
    )
    # Step 0: two passes (the draft, then the stop), verifies 1 draft, accepts it: 2 tokens.
    # Step 1: one pass, stopped at once: 1 token. Step 2: 3 drafts all accepted... capped by
    # the 3 tokens left (depth 2): 3 tokens.
    assert [len(s.draft_passes) for s in shapes] == [2, 1, 2]
    assert [s.verify for s in shapes] == [((0, 2),), ((0, 1),), ((0, 3),)]
    assert replay.tokens == 6 and replay.steps == 3
    shapes.clear()
    simulate_run(
        rounds,
        LlamaCppPolicy(n_min=2, p_min=0.75),
        record,
        4,
        features=features,
        confidences=confidences,
    )
    assert [s.verify for s in shapes][:2] == [((0, 1),), ((0, 1),)]


def test_the_replay_drafts_nothing_where_av_d_would_not() -> None:
    """AV+D with tables where drafting costs far more than it returns: the replay runs (nearly)
    every step without the drafter, as the loop does (test_llama_policies)."""
    engine = SpeculativeEngine(
        FakeRuntime(6, 3, capacity=96), FakeRuntime(6, 4, capacity=96), max_positions=4
    )
    result = engine.generate(PROMPTS, 30, FixedK(4), seed=0)
    trace = run_trace(result, ["w"] * len(PROMPTS), engine.params)
    assert trace is not None
    rounds = DraftRounds.from_trace(trace)
    tables = CostTables(np.full(5, 160.0), 10.0 + 0.5 * np.arange(21.0))
    replay = simulate_run(
        rounds,
        AdaptivePolicy(tables, 4, num_slots=4, depth=True),
        lambda shape: 1.0,
        30,
        features=rounds.column(trace.logit_q_max),
    )
    assert replay.tokens == 120 and replay.depth0_steps >= 0.9 * replay.steps


def test_bad_replay_arguments_are_named() -> None:
    rounds, confidences = _rounds([[0.9, 0.9, 0.9]], [3])
    with pytest.raises(ValueError, match="confidences: a greedy"):
        simulate_run(rounds, LlamaCppPolicy(), lambda s: 1.0, 4, features=np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"features must be \[rounds, K\] = \[1, 3\]"):
        simulate_run(rounds, FixedK(2), lambda s: 1.0, 4, features=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="max_new_tokens"):
        simulate_run(rounds, FixedK(2), lambda s: 1.0, 0, features=confidences)
    with pytest.raises(TypeError, match="rounds must be DraftRounds"):
        simulate_run([], FixedK(2), lambda s: 1.0, 4, features=confidences)  # type: ignore[arg-type]
