"""The peers' policies in `av-core simulate` and the hindsight oracle.

- The oracle against an exhaustive search over every per-step choice of every request's drafts
  (exact ratio of sums), on random tiny streams, both drafters, both parallel charges, convex and
  non-convex costs; and no simulated policy beats it.
- SGLang's EMA tiers (``av_core.tools.peers.EmaTierPolicy``) against sequences worked out by hand
  from SGLang's documented rules (tests/sglang/test_sglang_contract.py also runs it against
  SGLang's own class); TensorRT-LLM's schedule against its documented example.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from test_evaluate import synthetic_trace

from av_core.tools.cli import main
from av_core.tools.evaluate import DraftRounds
from av_core.tools.peers import (
    SGLANG_DEFAULT_TIERS,
    EmaTier,
    EmaTierPolicy,
    parse_trt_schedule,
    trt_draft_length,
)
from av_core.tools.simulate import (
    PEER_POLICIES,
    CostModel,
    GpuLikeCost,
    MeasuredCost,
    PassTokens,
    format_peers_markdown,
    peer_rows,
    round_streams,
    simulate_adaptive,
    simulate_fixed,
    simulate_oracle,
    simulate_sglang_ema,
    simulate_trace,
    simulate_trt_schedule,
)
from av_core.tools.trace import DraftTrace, trace_from_rows, write_trace

# --- helpers --------------------------------------------------------------------------------


def accepted_trace(accepted: list[list[int]], k: int) -> DraftTrace:
    """A fully verified trace whose round (request r, step s) accepts accepted[r][s] drafts."""
    rows = []
    for r, per_step in enumerate(accepted):
        for s, a in enumerate(per_step):
            for position in range(k):
                label = 1 if position < a else (0 if position == a else None)
                rows.append(
                    {
                        "request_id": r,
                        "step": s,
                        "position": position,
                        "workload": "w",
                        "logit_q_max": 1.0,
                        "admitted": True,
                        "label": label,
                    }
                )
    return trace_from_rows(rows)


def gpu_pass_ms(cost: GpuLikeCost, tokens: int) -> float:
    """GpuLikeCost's drafter pass, written out (not through the class)."""
    return cost.draft_base_ms + max(0, tokens - cost.draft_knee) * cost.draft_per_token_ms


def gpu_verify_ms(cost: GpuLikeCost, tokens: int) -> float:
    return cost.verify_base_ms + max(0, tokens - cost.verify_knee) * cost.verify_per_token_ms


def step_choices(
    accepted: list[int],
    pass_ms: object,
    verify_ms: object,
    drafter: str,
    pass_tokens: PassTokens,
) -> set[tuple[int, float]]:
    """Every (tokens, ms) a step can give when request r drafts and verifies d_r <= accepted[r]
    drafts, with the simulator's documented charges."""
    assert callable(pass_ms) and callable(verify_ms)
    out = set()
    num_requests = len(accepted)
    for depths in itertools.product(*(range(a + 1) for a in accepted)):
        n = sum(depths)
        if drafter == "autoregressive":
            draft = sum(
                pass_ms(sum(1 for d in depths if d >= j)) for j in range(1, max(depths) + 1)
            )
        elif pass_tokens == "drafts":
            draft = pass_ms(n) if n else 0.0
        else:
            drafting = sum(1 for d in depths if d > 0)
            draft = pass_ms(drafting) if drafting else 0.0
        out.add((num_requests + n, round(float(draft + verify_ms(num_requests + n)), 12)))
    return out


def best_ratio(per_step: list[set[tuple[int, float]]]) -> float:
    """max Σ tokens / Σ ms over one choice per step, by enumerating every combination."""
    best = 0.0
    for combo in itertools.product(*per_step):
        tokens = sum(t for t, _ in combo)
        ms = sum(m for _, m in combo)
        best = max(best, tokens / ms)
    return best


# --- the oracle -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("drafter", "pass_tokens"),
    [("autoregressive", "requests"), ("parallel", "requests"), ("parallel", "drafts")],
)
def test_oracle_is_the_exhaustive_best_ratio(seed: int, drafter: str, pass_tokens: str) -> None:
    rng = np.random.default_rng(seed)
    k, num_requests, num_steps = 3, 3, 3
    accepted = rng.integers(0, k + 1, size=(4, 3)).tolist()
    rounds = DraftRounds.from_trace(accepted_trace(accepted, k))
    streams = round_streams(rounds, num_requests, num_steps, seed=seed)
    # Knees inside the tiny batches, so both the flat and the linear regime are reached.
    cost = GpuLikeCost(
        verify_base_ms=float(rng.uniform(1.0, 3.0)),
        verify_knee=int(rng.integers(2, 7)),
        verify_per_token_ms=float(rng.uniform(0.1, 0.6)),
        draft_base_ms=float(rng.uniform(0.05, 0.8)),
        draft_knee=int(rng.integers(1, 3)),
        draft_per_token_ms=float(rng.uniform(0.0, 0.3)),
    )
    per_step = []
    for step in range(num_steps):
        index = streams.rounds[step]
        a = np.minimum(rounds.num_accepted[index], rounds.num_drafted[index]).tolist()
        per_step.append(
            step_choices(
                a,
                lambda t: gpu_pass_ms(cost, t),
                lambda t: gpu_verify_ms(cost, t),
                drafter,
                pass_tokens,  # type: ignore[arg-type]
            )
        )
    oracle = simulate_oracle(
        rounds,
        streams,
        cost,
        drafter,  # type: ignore[arg-type]
        parallel_pass_tokens=pass_tokens,  # type: ignore[arg-type]
    )
    assert oracle.policy == "oracle"
    assert oracle.throughput == pytest.approx(best_ratio(per_step), rel=1e-12)


def test_oracle_on_a_non_convex_drafter_is_a_bound() -> None:
    """A measured drafter pass that jumps at 3 requests: the oracle prices passes on the convex
    envelope (named ``oracle*``) and is at or above the exhaustive best."""
    accepted = [[3, 2, 3], [3, 3, 1], [2, 3, 3], [3, 1, 2]]
    rounds = DraftRounds.from_trace(accepted_trace(accepted, 3))
    streams = round_streams(rounds, 4, 3, seed=2)
    draft = np.array([[1, 0.2], [2, 0.2], [3, 1.5], [4, 1.5]])
    verify = np.array([[1, 1.0], [8, 1.0], [16, 3.0]])
    cost = MeasuredCost(verify, draft, "test")
    per_step = []
    for step in range(3):
        index = streams.rounds[step]
        a = np.minimum(rounds.num_accepted[index], rounds.num_drafted[index]).tolist()
        per_step.append(
            step_choices(
                a,
                lambda t: float(np.interp(t, draft[:, 0], draft[:, 1])),
                lambda t: (
                    float(np.interp(t, verify[:, 0], verify[:, 1], right=np.nan))
                    if t <= 16
                    else 3.0 + (t - 16) * 0.25
                ),
                "autoregressive",
                "requests",
            )
        )
    oracle = simulate_oracle(rounds, streams, cost, "autoregressive")
    assert oracle.policy == "oracle*"
    assert oracle.throughput >= best_ratio(per_step) * (1 - 1e-12)


def test_oracle_verifies_every_accepted_draft_when_verification_and_drafting_are_free() -> None:
    trace = synthetic_trace(num_requests=6, num_steps=30)
    rounds = DraftRounds.from_trace(trace)
    streams = round_streams(rounds, 8, 60, seed=0)
    free = GpuLikeCost(verify_knee=10_000, draft_base_ms=0.0)
    oracle = simulate_oracle(rounds, streams, free, "autoregressive")
    full = simulate_fixed(rounds, streams, 4, free, "autoregressive")
    assert oracle.tokens == full.tokens
    index = streams.rounds
    assert oracle.verified_drafts == int(
        np.minimum(rounds.num_accepted[index], rounds.num_drafted[index]).sum()
    )


@pytest.mark.parametrize("drafter", ["autoregressive", "parallel"])
@pytest.mark.parametrize("pass_tokens", ["requests", "drafts"])
def test_no_policy_beats_the_oracle(drafter: str, pass_tokens: str) -> None:
    trace = synthetic_trace(num_requests=8, num_steps=40)
    costs: list[CostModel] = [
        GpuLikeCost(),
        GpuLikeCost(verify_knee=24, draft_knee=8, draft_per_token_ms=0.05),
        MeasuredCost(
            np.array([[1, 4.0], [32, 4.5], [128, 9.0]]), np.array([[1, 0.4], [64, 0.9]]), "m"
        ),
    ]
    for cost in costs:
        simulation = simulate_trace(
            trace,
            cost=cost,
            drafter=drafter,  # type: ignore[arg-type]
            concurrency=[1, 4, 16, 64],
            steps=60,
            warmup_steps=20,
            parallel_pass_tokens=pass_tokens,  # type: ignore[arg-type]
            peers=True,
        )
        for concurrency, row in simulation.results.items():
            oracle = next(r for r in row if r.policy.startswith("oracle"))
            assert oracle.policy == "oracle"  # both cost models have convex drafter passes
            for result in row:
                assert result.throughput <= oracle.throughput * (1 + 1e-12), (
                    cost,
                    concurrency,
                    result.policy,
                )


# --- SGLang's EMA tiers -----------------------------------------------------------------------


def feed(policy: EmaTierPolicy, mean: int, batches: int, batch_size: int = 1) -> list[int | None]:
    return [policy.update([mean] * batch_size, batch_size) for _ in range(batches)]


def test_ema_tiers_climb_and_fall_as_documented() -> None:
    """Tier (1, 3, 5, 7), α = 0.2, 10 warm-up batches, a decision every 5, down hysteresis −0.25;
    starting at 3 the EMA starts at 2. Worked out by hand:
    - accepted 4 every batch: EMA_t = 4 − 2·0.8^t; at batch 15 (3.93 > 2.5, not > 4.5) → 5;
    - then accepted 1: after 5 batches 1 + (4 − 2·0.8^20 − 1)·0.8^5 = 1.98 ≤ 3 − 0.5 − 0.25 → 3;
    - then 0: after 5 batches 0.65 (> 1 − 0.5 − 0.25: stay), after 10 0.21 → 1."""
    policy = EmaTierPolicy({1: EmaTier((1, 3, 5, 7))}, initial_steps=3)
    assert policy.steps_for(1) == 3 and policy.ema(1) == 2.0
    moves = feed(policy, 4, 20)
    assert moves == [None] * 14 + [5] + [None] * 5
    assert policy.ema(1) == pytest.approx(4 - 2 * 0.8**20)
    assert feed(policy, 1, 5) == [None] * 4 + [3]
    assert policy.ema(1) == pytest.approx(1 + (4 - 2 * 0.8**20 - 1) * 0.8**5)
    assert feed(policy, 0, 10) == [None] * 9 + [1]
    assert policy.steps_for(1) == 1


def test_ema_tiers_switch_speculation_off_and_probe_back() -> None:
    """Tier (0, 1, 3) without hysteresis: accepted 0 from step 3 drops to 0 at batch 15
    (EMA 2·0.8^15 ≤ 0.5); at 0 the EMA is frozen and the next decision probes 1; accepted 1
    then lifts the EMA to 1 − (1 − 2·0.8^15)·0.8^5 = 0.70 > 0.5 → 3."""
    policy = EmaTierPolicy({8: EmaTier((0, 1, 3), down_hysteresis=0.0)}, initial_steps=3)
    assert feed(policy, 0, 15, batch_size=8)[-1] == 0
    frozen = policy.ema(8)
    assert frozen == pytest.approx(2 * 0.8**15)
    assert feed(policy, 0, 5, batch_size=8) == [None] * 4 + [1]
    assert policy.ema(8) == frozen
    assert feed(policy, 1, 5, batch_size=8) == [None] * 4 + [3]
    # A tier that starts at 0 starts its first probe from that step's neutral EMA.
    cold = EmaTierPolicy({1: EmaTier((0, 1))}, initial_steps=0)
    assert cold.ema(1) == -1.0
    assert feed(cold, 0, 15)[-1] == 1
    assert cold.ema(1) == 0.0


def test_ema_tiers_route_batch_sizes_and_clip_to_k() -> None:
    policy = EmaTierPolicy()
    assert set(SGLANG_DEFAULT_TIERS) == {1, 8, 32, 64}
    assert [policy.steps_for(b) for b in (1, 7, 8, 31, 32, 63, 64, 512)] == [3, 3, 3, 3, 1, 1, 0, 0]
    assert policy.candidate_steps(7) == [1, 3, 5, 7]
    assert policy.candidate_steps(40) == [0, 1]
    clipped = EmaTierPolicy(max_steps=4)
    assert clipped.candidate_steps(1) == [1, 3, 4]
    assert clipped.candidate_steps(8) == [0, 1, 3]
    assert policy.update([], 1) is None
    with pytest.raises(ValueError, match="candidate_steps"):
        EmaTierPolicy({1: EmaTier(())})


def test_sglang_ema_in_the_simulator_is_fixed_k_when_the_tier_is_pinned() -> None:
    trace = synthetic_trace(num_requests=6, num_steps=30)
    rounds = DraftRounds.from_trace(trace)
    cost = GpuLikeCost()
    for r, k in ((4, 2), (64, 0)):
        streams = round_streams(rounds, r, 50, seed=1)
        pinned = EmaTierPolicy({1: EmaTier((k,))}, initial_steps=k)
        ema = simulate_sglang_ema(
            rounds, streams, cost, "autoregressive", measure_from=10, policy=pinned
        )
        fixed = simulate_fixed(rounds, streams, k, cost, "autoregressive", 10)
        assert ema.policy == PEER_POLICIES[0]
        assert (ema.tokens, ema.verified_drafts) == (fixed.tokens, fixed.verified_drafts)
        assert ema.time_ms == pytest.approx(fixed.time_ms)


# --- TensorRT-LLM's schedule ----------------------------------------------------------------


def test_trt_schedule_follows_the_documented_example() -> None:
    schedule = {4: 4, 8: 2, 32: 1}  # 1-4 → 4, 5-8 → 2, 9-32 → 1, 33+ → 0
    sizes = (1, 4, 5, 8, 9, 32, 33, 512)
    assert [trt_draft_length(schedule, b) for b in sizes] == [4, 4, 2, 2, 1, 1, 0, 0]
    assert parse_trt_schedule("4:4, 8:2,32:1") == schedule
    for bad in ("", "4", "4:x", "0:2", "4:-1"):
        with pytest.raises(ValueError, match="trt schedule"):
            parse_trt_schedule(bad)
    with pytest.raises(ValueError, match="batch_size"):
        trt_draft_length(schedule, 0)
    # A threshold given twice is a mistake, not "the last one wins"; an empty item is a typo.
    for bad, message in (("4:4,4:2", "twice"), ("4:4,,8:2", "empty item"), ("4:4,", "empty")):
        with pytest.raises(ValueError, match=message):
            parse_trt_schedule(bad)
    assert trt_draft_length(parse_trt_schedule("8:2,4:4"), 5) == 2  # pairs in any order


def test_trt_schedule_in_the_simulator_is_fixed_k_at_the_scheduled_length() -> None:
    trace = synthetic_trace(num_requests=6, num_steps=30)
    rounds = DraftRounds.from_trace(trace)
    cost = GpuLikeCost()
    for r, k in ((2, 4), (6, 2), (16, 1), (64, 0)):
        streams = round_streams(rounds, r, 40, seed=0)
        trt = simulate_trt_schedule(rounds, streams, cost, "parallel")
        fixed = simulate_fixed(rounds, streams, k, cost, "parallel")
        assert trt.policy == "TRT"
        assert (trt.tokens, trt.time_ms) == (fixed.tokens, fixed.time_ms)
    streams = round_streams(rounds, 2, 40, seed=0)
    deep = simulate_trt_schedule(rounds, streams, cost, "parallel", {8: 9})  # capped at K = 4
    assert deep.tokens == simulate_fixed(rounds, streams, 4, cost, "parallel").tokens


def test_the_vllm_peer_is_vllms_update_whatever_av_cores_default() -> None:
    # vLLM-AV is vLLM's estimator (its update, memoryless, no exploration floor), not av_core's
    # default update: the same streams through simulate_adaptive with vLLM's options give the
    # same tokens and time, and av_core's default (map) gives others.
    trace = synthetic_trace(num_requests=6, num_steps=40)
    rounds = DraftRounds.from_trace(trace)
    features = rounds.column(trace.logit_q_max)
    cost = GpuLikeCost()
    simulation = simulate_trace(
        trace, concurrency=[64], steps=40, warmup_steps=10, peers=True, depth_control=[]
    )
    peer = next(r for r in simulation.results[64] if r.policy == "vLLM-AV")
    streams = round_streams(rounds, 64, 50, seed=0)

    def run(**options: object) -> tuple[int, float]:
        result = simulate_adaptive(
            rounds,
            features,
            streams,
            cost,
            "parallel",
            measure_from=10,
            exploration=0.0,
            **options,  # type: ignore[arg-type]
        )
        return result.tokens, result.time_ms

    assert (peer.tokens, peer.time_ms) == run(memory=0.0, update="vllm")
    assert (peer.tokens, peer.time_ms) != run(memory=0.0)


# --- the comparison table and the command line ------------------------------------------------


def test_peer_rows_divide_by_the_best_fixed_k_including_none() -> None:
    trace = synthetic_trace(num_requests=6, num_steps=40)
    simulation = simulate_trace(
        trace, concurrency=[1, 64], steps=40, warmup_steps=10, peers=True, depth_control=["batch"]
    )
    assert simulation.has_peers
    for row in peer_rows(simulation):
        results = {r.policy: r.throughput for r in simulation.results[row.concurrency]}
        best = max(v for name, v in results.items() if name.startswith("K="))
        assert row.best_fixed.throughput == best
        for name in ("SGL-EMA", "TRT", "vLLM-AV", "AV+D", "oracle"):
            assert row.relative[name] == pytest.approx(results[name] / best)
        assert row.av_core_of_oracle == pytest.approx(results["AV+D"] / results["oracle"])
        # Every peer's policy and fixed K; av_core's own AV (without depth control) is no peer.
        others = [v for n, v in results.items() if n not in ("AV", "AV+D", "oracle")]
        assert row.av_core_of_best_other == pytest.approx(results["AV+D"] / max(others))
    table = format_peers_markdown(simulation, label="synthetic / parallel").splitlines()
    assert table[0].startswith("| trace / drafter | R | best fixed K (tok/ms) | SGLang-EMA |")
    assert len(table) == 4 and table[2].startswith("| synthetic / parallel | 1 |")
    plain = simulate_trace(trace, concurrency=[1], steps=20, warmup_steps=5)
    assert not plain.has_peers
    with pytest.raises(ValueError, match="peers"):
        peer_rows(plain)


def test_simulate_command_runs_the_peers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_path = tmp_path / "trace.csv"
    write_trace(synthetic_trace(num_requests=6, num_steps=30), trace_path)
    args = ["simulate", str(trace_path), "--concurrency", "1,16", "--steps", "30", "--no-plots"]
    assert main([*args, "--peers", "--trt-schedule", "8:3", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "peers: throughput over the best fixed K" in out
    assert "| R | best fixed K (tok/ms) | SGLang-EMA |" in out
    # A malformed schedule is refused while parsing: exit 2, one line naming the option.
    assert main([*args, "--peers", "--trt-schedule", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trt-schedule" in err[0] and "'8'" in err[0]
