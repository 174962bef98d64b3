"""`av-core simulate` / `profile` / `demo`: fixed-K against a hand count, AV limits, cost models."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_evaluate import synthetic_trace

from av_core.tools.cli import main
from av_core.tools.evaluate import DraftRounds
from av_core.tools.profile import measure_forward_ms, write_cost_file
from av_core.tools.simulate import (
    GpuLikeCost,
    MeasuredCost,
    cost_tables_for,
    draft_cost_ms,
    format_markdown,
    parse_concurrency,
    round_streams,
    simulate_adaptive,
    simulate_fixed,
    simulate_trace,
    step_draft_cost_ms,
)
from av_core.tools.trace import trace_from_rows, write_trace


def tiny_trace() -> tuple[list[list[int]], object]:
    """Two requests x three steps, K = 3, with known accepted counts under full verification."""
    accepted = [[3, 0, 1], [2, 3, 0]]  # request -> step -> leading accepted drafts
    rows = []
    for r, per_step in enumerate(accepted):
        for s, a in enumerate(per_step):
            for k in range(3):
                label = 1 if k < a else (0 if k == a else None)
                rows.append(
                    {
                        "request_id": r,
                        "step": s,
                        "position": k,
                        "workload": "w",
                        "logit_q_max": 2.0 - k,
                        "admitted": True,
                        "label": label,
                    }
                )
    return accepted, trace_from_rows(rows)


def test_fixed_k_matches_a_hand_count() -> None:
    accepted, trace = tiny_trace()
    rounds = DraftRounds.from_trace(trace)  # type: ignore[arg-type]
    cost = GpuLikeCost(
        verify_base_ms=2.0,
        verify_knee=3,
        verify_per_token_ms=0.5,
        draft_base_ms=0.25,
        draft_knee=2,
        draft_per_token_ms=0.1,
    )
    num_requests, num_steps = 2, 5
    streams = round_streams(rounds, num_requests, num_steps, seed=1)
    flat = [a for per_step in accepted for a in per_step]  # trace rounds in order
    for drafter in ("autoregressive", "parallel"):
        for k in range(4):
            tokens, time_ms = 0, 0.0
            for step in range(num_steps):
                verified = 0
                for slot in range(num_requests):
                    a = flat[int(streams.rounds[step, slot])]
                    tokens += min(a, k) + 1
                    verified += k
                t = num_requests + verified
                time_ms += 2.0 + max(0, t - 3) * 0.5
                if k > 0:
                    if drafter == "autoregressive":
                        time_ms += k * (0.25 + max(0, num_requests - 2) * 0.1)
                    else:
                        time_ms += 0.25 + max(0, num_requests - 2) * 0.1
            result = simulate_fixed(rounds, streams, k, cost, drafter)  # type: ignore[arg-type]
            assert result.tokens == tokens, (drafter, k)
            assert result.time_ms == pytest.approx(time_ms), (drafter, k)
            assert result.throughput == pytest.approx(tokens / time_ms)
            assert result.per_request == pytest.approx(tokens / time_ms / num_requests)


def test_streams_replay_whole_requests_in_trace_order() -> None:
    trace = synthetic_trace(num_requests=5, num_steps=7)
    rounds = DraftRounds.from_trace(trace)
    streams = round_streams(rounds, 3, 40, seed=0)
    for slot in range(3):
        index = streams.rounds[:, slot]
        assert np.all((np.diff(index) == 1) | (index[1:] == 0))  # consecutive, wrapping
        starts = rounds.step[index] == 0
        np.testing.assert_array_equal(streams.new_request[1:, slot], starts[1:])
        assert streams.new_request[0, slot] and rounds.step[index[0]] == 0


def test_adaptive_verifies_everything_when_verification_is_free() -> None:
    trace = synthetic_trace(num_requests=6, num_steps=40)
    rounds = DraftRounds.from_trace(trace)
    features = rounds.column(trace.logit_q_max)
    streams = round_streams(rounds, 4, 120, seed=0)
    flat = GpuLikeCost(verify_knee=10_000)
    full = simulate_fixed(rounds, streams, 4, flat, "parallel")
    adaptive = simulate_adaptive(rounds, features, streams, flat, "parallel")
    assert adaptive.tokens == full.tokens
    assert adaptive.time_ms == pytest.approx(full.time_ms)
    assert adaptive.verified_drafts == adaptive.drafted


def test_adaptive_verifies_nothing_when_every_draft_is_too_expensive() -> None:
    trace = synthetic_trace(num_requests=6, num_steps=40)
    rounds = DraftRounds.from_trace(trace)
    features = rounds.column(trace.logit_q_max)
    streams = round_streams(rounds, 4, 60, seed=0)
    steep = GpuLikeCost(verify_base_ms=1.0, verify_knee=4, verify_per_token_ms=100.0)
    adaptive = simulate_adaptive(
        rounds, features, streams, steep, "autoregressive", exploration=0.0
    )
    assert adaptive.verified_drafts == 0
    assert adaptive.tokens == 60 * 4  # one token per request per step
    assert adaptive.time_ms == pytest.approx(60 * (1.0 + 4 * 0.6))  # drafting still paid


def test_adaptive_never_emits_more_than_full_verification() -> None:
    trace = synthetic_trace(num_requests=6, num_steps=40)
    simulation = simulate_trace(trace, concurrency=[1, 8, 64], steps=80, warmup_steps=20)
    assert simulation.adaptive_policies == ["AV", "AV+D", "AV+Dr"]
    for concurrency, row in simulation.results.items():
        full = next(r for r in row if r.policy == "K=4")
        for policy in simulation.adaptive_policies:
            adaptive = simulation.adaptive(concurrency, policy)
            assert row[0].tokens <= adaptive.tokens <= full.tokens
            assert adaptive.verified_drafts <= adaptive.drafted


def test_depth_control_stops_drafting_when_nothing_is_worth_verifying() -> None:
    """Verification compute-bound from the first token and drafting dear: AV still drafts (and
    pays for) every position and falls below no speculation; with depth control the planner
    stops drafting and stays within 1% of it (requests are long, so the optimistic start of a
    new request, which drafts for it, is rare)."""
    trace = synthetic_trace(num_requests=6, num_steps=400)
    cost = GpuLikeCost(
        verify_base_ms=1.0, verify_knee=0, verify_per_token_ms=0.1, draft_base_ms=2.0
    )
    for drafter in ("autoregressive", "parallel"):
        simulation = simulate_trace(
            trace, cost=cost, drafter=drafter, concurrency=[32], steps=200, warmup_steps=50
        )
        no_spec = simulation.results[32][0]
        assert no_spec.policy == "K=0"
        assert simulation.adaptive(32).throughput < 0.9 * no_spec.throughput
        for policy in ("AV+D", "AV+Dr"):
            depth = simulation.adaptive(32, policy)
            assert depth.throughput >= 0.99 * no_spec.throughput, (drafter, policy)
            assert depth.drafted < 0.1 * depth.steps * 32


def test_step_draft_cost_with_unequal_depths() -> None:
    cost = GpuLikeCost(draft_base_ms=1.0, draft_knee=2, draft_per_token_ms=0.5)
    # Autoregressive: pass 1 over 3 requests (1.5 ms), pass 2 over 2 (1.0), pass 3 over 1 (1.0).
    assert step_draft_cost_ms(cost, "autoregressive", [3, 1, 2, 0]) == pytest.approx(3.5)
    assert step_draft_cost_ms(cost, "parallel", [3, 1, 2, 0]) == pytest.approx(1.5)
    assert step_draft_cost_ms(cost, "parallel", [3, 1, 2, 0], "drafts") == pytest.approx(3.0)
    assert step_draft_cost_ms(cost, "autoregressive", [0, 0]) == 0.0
    # Equal depths: the same as draft_cost_ms.
    assert step_draft_cost_ms(cost, "autoregressive", [2] * 5) == draft_cost_ms(
        cost, "autoregressive", 5, 2
    )


def test_draft_cost_by_drafter_kind() -> None:
    cost = GpuLikeCost(draft_base_ms=1.0, draft_knee=8, draft_per_token_ms=0.5)
    assert draft_cost_ms(cost, "autoregressive", 16, 3) == pytest.approx(3 * (1.0 + 8 * 0.5))
    assert draft_cost_ms(cost, "parallel", 16, 3) == pytest.approx(1.0 + 8 * 0.5)
    assert draft_cost_ms(cost, "parallel", 16, 3, "drafts") == pytest.approx(1.0 + 40 * 0.5)
    assert draft_cost_ms(cost, "autoregressive", 16, 0) == 0.0


def test_measured_cost_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    write_cost_file(path, [(4, 3.0), (1, 1.0), (2, 2.5)], None, target="m")
    cost = MeasuredCost.load(path)
    np.testing.assert_allclose(cost.verify_ms([1, 2, 3, 4, 6, 0]), [1.0, 2.5, 2.75, 3.0, 3.5, 1.0])
    assert cost.draft_pass_ms(5) == 0.0
    assert json.loads(path.read_text())["target"] == "m"
    with pytest.raises(ValueError, match="verify"):
        path.write_text("{}")
        MeasuredCost.load(path)


def test_measure_forward_ms_takes_the_median() -> None:
    ticks = iter([0.0, 0.001, 1.0, 1.005, 2.0, 2.002] * 2)
    calls: list[int] = []
    points = measure_forward_ms(
        calls.append, [3, 8], repeats=3, warmup=1, clock=lambda: next(ticks)
    )
    assert [t for t, _ in points] == [3, 8]
    assert points[0][1] == pytest.approx(2.0)
    assert calls == [3, 3, 3, 3, 8, 8, 8, 8]


def test_parse_concurrency() -> None:
    assert parse_concurrency("1,2,4") == [1, 2, 4]
    assert parse_concurrency("1-256") == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    with pytest.raises(ValueError):
        parse_concurrency("0,2")


def test_simulate_and_demo_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace_path = tmp_path / "trace.csv"
    write_trace(synthetic_trace(num_requests=6, num_steps=30), trace_path)
    cost_path = tmp_path / "cost.json"
    write_cost_file(cost_path, [(1, 5.0), (64, 5.0), (512, 20.0)], [(1, 0.5), (512, 1.0)])
    args = ["simulate", str(trace_path), "--concurrency", "1,16", "--steps", "30"]
    assert main([*args, "--warmup-steps", "5", "--no-plots"]) == 0
    assert main([*args, "--cost-model", "measured", str(cost_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "AV/best" in out and "measured:" in out
    demo_out = tmp_path / "demo"
    assert main(["demo", "--trace", str(trace_path), "--out", str(demo_out), "--steps", "30"]) == 0
    out = capsys.readouterr().out
    # The summary: three paragraphs, their continuation lines indented.
    summary = re.split(r"\n(?! )", out[out.rindex("\nestimator:") + 1 :].strip())
    assert len(summary) == 3 and "autoregressive" in summary[-1], summary
    assert (demo_out / "evaluate.txt").is_file()


def test_commands_skip_plots_without_matplotlib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import av_core.tools.plots

    monkeypatch.setattr(av_core.tools.plots, "plots_available", lambda: False)
    trace_path = tmp_path / "trace.csv"
    write_trace(synthetic_trace(num_requests=4, num_steps=20), trace_path)
    out = tmp_path / "plots"
    assert main(["evaluate", str(trace_path), "--out", str(out)]) == 0
    # Notes go to stderr (stdout holds only the tables).
    assert "plots skipped: matplotlib is not installed" in capsys.readouterr().err
    assert not out.exists()


def tiny_qwen(transformers: Any) -> Any:
    """A two-layer random Qwen2 (64-token vocabulary) for timing code paths."""
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


def test_profile_times_a_tiny_transformers_model() -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from av_core.tools.profile import loaded_model_forward

    model = tiny_qwen(transformers)
    forward = loaded_model_forward(model, context=8)
    points = measure_forward_ms(forward, [1, 4], repeats=2)
    assert [t for t, _ in points] == [1, 4]
    assert all(ms > 0 for _, ms in points)


def test_markdown_summary_names_every_policy_and_ratio() -> None:
    trace = synthetic_trace(num_requests=6, num_steps=40)
    simulation = simulate_trace(trace, concurrency=[1, 16], steps=40, warmup_steps=10)
    table = format_markdown(simulation).splitlines()
    assert table[0].startswith("| R | K=0 | best fixed K≥1 | AV | AV+D | AV+Dr |")
    assert len(table) == 2 + 2
    cells = table[3].strip("|").split("|")
    best_all = simulation.best_fixed(16, min_k=0).throughput
    assert float(cells[-2]) == pytest.approx(
        simulation.adaptive(16, "AV+D").throughput / best_all, abs=5e-4
    )


def accept_everything_trace(num_requests: int, num_steps: int, k: int) -> object:
    """Every draft accepted: a fixed-K policy then emits exactly K + 1 tokens per request and
    step, so its throughput has a closed form."""
    rows = [
        {
            "request_id": r,
            "step": step,
            "position": position,
            "workload": "w",
            "logit_q_max": 5.0,
            "admitted": True,
            "label": 1,
        }
        for r in range(num_requests)
        for step in range(num_steps)
        for position in range(k)
    ]
    return trace_from_rows(rows)


@pytest.mark.parametrize("drafter", ["parallel", "autoregressive"])
def test_markdown_cells_match_closed_form_throughputs(drafter: str) -> None:
    """The printed K=0 and best-fixed cells against throughputs computed by hand from the cost
    model (not from the simulator), and every ratio cell against the printed cells it divides:
    the best *including* K=0 (at R = 4 here no speculation wins)."""
    k = 3
    cost = GpuLikeCost(
        verify_base_ms=2.0,
        verify_knee=4,
        verify_per_token_ms=0.5,
        draft_base_ms=0.3,
        draft_knee=100,
        draft_per_token_ms=0.0,
    )
    trace = accept_everything_trace(3, 12, k)
    simulation = simulate_trace(
        trace,  # type: ignore[arg-type]
        cost=cost,
        drafter=drafter,  # type: ignore[arg-type]
        concurrency=[1, 4],
        steps=30,
        warmup_steps=5,
    )

    def by_hand(r: int, fixed_k: int) -> float:
        passes = 0 if fixed_k == 0 else (1 if drafter == "parallel" else fixed_k)
        verify = 2.0 + max(0, r * (fixed_k + 1) - 4) * 0.5
        return r * (fixed_k + 1) / (verify + passes * 0.3)

    lines = format_markdown(simulation).splitlines()
    policies = ["AV", "AV+D", "AV+Dr"]
    for line, r in zip(lines[2:], (1, 4), strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == str(r)
        assert float(cells[1]) == pytest.approx(by_hand(r, 0), rel=1e-3)
        best_k = max(range(1, k + 1), key=lambda j: by_hand(r, j))
        value, label = cells[2].split()
        assert label == f"(K={best_k})"
        assert float(value) == pytest.approx(by_hand(r, best_k), rel=1e-3)
        best_all = max(by_hand(r, j) for j in range(k + 1))
        for i, _ in enumerate(policies):
            adaptive = float(cells[3 + i])
            assert float(cells[3 + len(policies) + i]) == pytest.approx(
                adaptive / best_all, abs=2e-3
            )
    # At R = 4 verifying costs more than it brings: no speculation is the best fixed choice.
    assert max(range(k + 1), key=lambda j: by_hand(4, j)) == 0


def test_profile_times_drafting_by_depth_into_the_cost_file(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from av_core.tools.profile import loaded_drafting_forward

    model = tiny_qwen(transformers)
    points = measure_forward_ms(loaded_drafting_forward(model, context=8), [1, 4], repeats=3)
    assert [d for d, _ in points] == [1, 4]
    # Four sequential passes cost more than one.
    assert points[1][1] > points[0][1] > 0
    path = tmp_path / "cost.json"
    write_cost_file(path, [(1, 6.0)], [(1, 0.5)], points)
    assert json.loads(path.read_text())["draft_depth"] == [[d, ms] for d, ms in points]
    # The simulator's planner prices what the simulator charges: passes (canonical shapes).
    tables = cost_tables_for(MeasuredCost.load(path), "autoregressive", 4, 8, depth_table=True)
    np.testing.assert_allclose(tables.draft_depth_ms, [0.0, 0.25, 0.5, 0.75, 1.0])
    tables = cost_tables_for(MeasuredCost.load(path), "parallel", 4, 8, depth_table=True)
    np.testing.assert_allclose(tables.draft_depth_ms, [0.0, 1.0, 1.0, 1.0, 1.0])


def test_pareto_legend_is_outside_both_panels_and_labels_sit_on_top() -> None:
    """With the peers the policies fill a legend that, inside a panel, covered curves: one
    legend under both panels, overlapping neither, and the R labels drawn above every line."""
    pytest.importorskip("matplotlib")
    from av_core.tools.plots import _pyplot, pareto_figure

    simulation = simulate_trace(
        synthetic_trace(num_requests=6, num_steps=30),
        concurrency=[1, 8, 64],
        steps=30,
        warmup_steps=5,
        peers=True,
    )
    fig = pareto_figure(simulation)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        axes = fig.get_axes()
        assert len(axes) == 2 and all(ax.get_legend() is None for ax in axes)
        assert len(fig.legends) == 1
        legend = fig.legends[0].get_window_extent(renderer)
        names = {t.get_text() for t in fig.legends[0].get_texts()}
        assert {"SGL-EMA", "TRT", "vLLM-AV", "oracle", "K=0"} <= names
        for ax in axes:
            assert not legend.overlaps(ax.get_window_extent(renderer))
        left = axes[0]
        labels = [t for t in left.texts if t.get_text() in {"1", "8", "64"}]
        assert len(labels) == 3
        top_line = max(line.get_zorder() for line in left.get_lines())
        assert all(label.get_zorder() > top_line for label in labels)
    finally:
        _pyplot().close(fig)
