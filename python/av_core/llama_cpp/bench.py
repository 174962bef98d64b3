"""The real-runtime benchmark (``av-core bench-engine``): every policy at every concurrency R and
thread count, on real prompts, measured in tokens per second, beside what the serving simulator
predicts for the same run.

Per (threads, R, repeat) every policy generates ``max_new_tokens`` for the same R prompts with
the same seed (a paired comparison; runs of a repeat are interleaved across policies). Each run
is one line of ``runs.jsonl`` in the output directory, so an interrupted benchmark resumes where
it stopped. ``results.json`` aggregates them: one row per (policy, R, threads) with the medians
over repeats. Beside each measured figure:

- ``simulated_tokens_per_s``: ``av-core simulate``'s replay (:func:`~av_core.tools.simulate
  .simulate_trace`) of the run's own trace (the full-verification fixed-K run of the same repeat)
  under the measured cost tables, for the policies the simulator has (no speculation, fixed K,
  vLLM's AV, AV+D; none for llama.cpp's policy);
- ``priced_tokens_per_s``: the run's own steps priced by the same cost tables (its drafter
  passes and target decodes), for every policy: how far the cost model is from the clock.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from av_core.llama_cpp import open_engine
from av_core.llama_cpp.engine import RunResult, SpeculativeEngine
from av_core.llama_cpp.policies import DEFAULT_POLICIES, PolicySpec
from av_core.llama_cpp.profile import (
    EngineCosts,
    OnlineCosts,
    profile_engine,
    write_engine_costs,
)
from av_core.llama_cpp.sampling import SamplingParams
from av_core.tools.collect.prompts import Prompt
from av_core.tools.simulate import MeasuredCost, simulate_trace
from av_core.tools.trace import DraftTrace, trace_from_rows

#: The simulator's name of each policy's counterpart.
SIMULATED_AS = {"no-spec": "K=0", "vLLM-AV": "vLLM-AV", "AV+D": "AV+D", "AV": "AV"}


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark runs (defaults: the issue's full benchmark)."""

    target: str
    drafter: str
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    threads: tuple[int, ...] = (1, 2)
    policies: tuple[str, ...] = DEFAULT_POLICIES
    num_positions: int = 4
    max_new_tokens: int = 64
    repeats: int = 3
    max_prompt_tokens: int = 320
    profile_repeats: int = 3
    temperature: float = 1.0
    seed: int = 0
    remeasure: bool = False

    @property
    def trace_policy(self) -> str:
        """The full-verification run whose trace the simulator replays."""
        return f"K={self.num_positions}"

    def run_policies(self) -> tuple[str, ...]:
        names = tuple(self.policies)
        return names if self.trace_policy in names else (*names, self.trace_policy)


def run_trace(
    result: RunResult,
    workloads: Sequence[str],
    params: SamplingParams,
    *,
    request_ids: Sequence[int] | None = None,
    prompt_ids: Sequence[str] | None = None,
) -> DraftTrace | None:
    """The run's drafts as a labeled trace (one row per kept draft of every step; ``None`` when
    nothing was drafted). ``request_ids`` and ``prompt_ids`` name each request of the run."""
    rows: list[dict[str, Any]] = []
    counter = [0] * len(workloads)
    for step in result.steps:
        for i, r in enumerate(step.slots.tolist()):
            for k in range(int(step.drafted[i])):
                admitted = bool(k < step.admitted[i])
                rejected = admitted and k == step.accepted[i]
                row = {
                    "request_id": r if request_ids is None else request_ids[r],
                    "step": counter[r],
                    "position": k,
                    "workload": workloads[r],
                    "logit_q_max": float(step.features[i, k]),
                    "admitted": admitted,
                    "label": 1 if k < step.accepted[i] else (0 if rejected else None),
                    "temperature": params.temperature,
                    "top_p": params.top_p,
                }
                if prompt_ids is not None:
                    row["prompt_id"] = prompt_ids[r]
                rows.append(row)
            counter[r] += 1
    return trace_from_rows(rows) if rows else None


def priced_ms(result: RunResult, cost: MeasuredCost) -> float:
    """The run's steps priced by the cost model: each drafter pass at its batch, each target
    decode at its tokens."""
    total = 0.0
    for step in result.steps:
        total += float(np.sum(cost.draft_pass_ms(np.asarray(step.draft_passes, dtype=np.float64))))
        total += float(cost.verify_ms(len(step.slots) + int(step.admitted.sum())))
    return total


def simulated_tokens_per_s(
    trace: DraftTrace, cost: MeasuredCost, requests: int, seed: int
) -> dict[str, float]:
    """Tokens per second the simulator predicts for each of its policies at ``requests``."""
    simulation = simulate_trace(
        trace,
        cost=cost,
        drafter="autoregressive",
        concurrency=[requests],
        steps=400,
        warmup_steps=100,
        seed=seed,
        depth_control=("batch",),
        peers=True,
    )
    return {row.policy: row.throughput * 1000.0 for row in simulation.results[requests]}


def run_record(
    result: RunResult, policy: str, requests: int, threads: int, repeat: int, cost: MeasuredCost
) -> dict[str, Any]:
    steps = result.steps
    decode_s = result.wall_s - result.prefill_s
    return {
        "policy": policy,
        "R": requests,
        "threads": threads,
        "repeat": repeat,
        "tokens": result.emitted,
        "decode_s": decode_s,
        "decode_cpu_s": result.cpu_s - result.prefill_cpu_s,
        "tokens_per_s": result.tokens_per_s,
        "tokens_per_s_cpu": result.tokens_per_cpu_s,
        "priced_tokens_per_s": result.emitted / max(priced_ms(result, cost), 1e-9) * 1000.0,
        "accepted": result.accepted,
        "admitted": result.admitted,
        "target_calls": result.target_calls,
        "verifications": result.verifications,
        "drafted": int(sum(int(s.drafted.sum()) for s in steps)),
        "depth0_steps": int(sum(int(s.depths.max(initial=0)) == 0 for s in steps)),
        "host_ms_per_step": statistics.median(s.host_ms for s in steps),
        "draft_ms": sum(s.draft_ms for s in steps),
        "verify_ms": sum(s.verify_ms for s in steps),
        "step_ms": sum(s.step_ms for s in steps),
    }


def aggregate(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (policy, R, threads): medians over repeats, ``spread`` = [min, max] of the
    wall tokens/s, pooled acceptance."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["policy"], record["R"], record["threads"]), []).append(record)
    rows = []
    for (policy, requests, threads), runs in sorted(
        groups.items(), key=lambda item: (item[0][2], item[0][1])
    ):
        speeds = [run["tokens_per_s"] for run in runs]
        simulated = [
            run["simulated_tokens_per_s"]
            for run in runs
            if run.get("simulated_tokens_per_s") is not None
        ]
        admitted = sum(run["admitted"] for run in runs)
        rows.append(
            {
                "policy": policy,
                "R": requests,
                "threads": threads,
                "tokens_per_s": statistics.median(speeds),
                "tokens_per_s_cpu": statistics.median(run["tokens_per_s_cpu"] for run in runs),
                "simulated_tokens_per_s": statistics.median(simulated) if simulated else None,
                "priced_tokens_per_s": statistics.median(
                    run["priced_tokens_per_s"] for run in runs
                ),
                "acceptance": sum(run["accepted"] for run in runs) / admitted if admitted else None,
                "tokens_per_target_call": sum(run["tokens"] for run in runs)
                / sum(run["target_calls"] for run in runs),
                "tokens_per_verification": sum(run["tokens"] for run in runs)
                / sum(run["verifications"] for run in runs),
                "depth0_share": sum(run["depth0_steps"] for run in runs)
                / sum(run["target_calls"] for run in runs),
                "host_ms_per_step": statistics.median(run["host_ms_per_step"] for run in runs),
                "repeats": len(runs),
                "spread": [min(speeds), max(speeds)],
            }
        )
    return rows


def _read_runs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    runs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by an interruption: that run is redone
    return runs


def select_prompts(
    engine: SpeculativeEngine, prompts: Sequence[Prompt], max_tokens: int
) -> list[tuple[Prompt, list[int]]]:
    """The prompts whose tokens (chat template applied) fit ``max_tokens``, in order."""
    model = engine.target.model  # type: ignore[attr-defined]
    chosen = []
    for prompt in prompts:
        tokens = model.prompt_tokens(prompt.text, chat=prompt.chat)
        if len(tokens) <= max_tokens:
            chosen.append((prompt, tokens))
    return chosen


def run_bench(
    config: BenchConfig,
    prompts: Sequence[Prompt],
    out: str | Path,
    *,
    progress: Callable[[int, int, str], None] | None = None,
    note: Callable[[str], None] = lambda text: None,
) -> list[dict[str, Any]]:
    """Runs (or resumes) the benchmark into ``out`` (``costs_t{threads}.json``, ``runs.jsonl``,
    ``results.json``) and returns the aggregated rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    records = _read_runs(runs_path)
    done = {(r["policy"], r["R"], r["threads"], r["repeat"]) for r in records}
    policies = config.run_policies()
    deepest = max(PolicySpec(name).check(config.num_positions) for name in policies)
    params = SamplingParams(config.temperature)
    total = len(config.threads) * len(config.concurrency) * config.repeats * len(policies)
    finished = len([key for key in done if key[0] in policies])
    largest = max(config.concurrency)
    for threads in config.threads:
        engine = open_engine(
            config.target,
            config.drafter,
            requests=largest,
            tokens_per_request=config.max_prompt_tokens + config.max_new_tokens,
            params=params,
            max_positions=deepest,
            threads=threads,
            cache_prefill=True,
        )
        chosen = select_prompts(engine, prompts, config.max_prompt_tokens)
        need = largest * config.repeats
        if len(chosen) < need:
            raise ValueError(
                f"prompts: {len(chosen)} prompts fit --max-prompt-tokens "
                f"{config.max_prompt_tokens}, "
                f"R = {largest} x {config.repeats} repeats need {need}"
            )
        context = int(statistics.mean(len(t) for _, t in chosen) + config.max_new_tokens / 2)
        costs = _costs(
            config, engine, threads, context, out / f"costs_t{threads}.json", note, progress
        )
        _estimate(config, costs, threads, chosen, done, note)
        for requests in config.concurrency:
            cost = costs.measured_cost(requests)
            tables = costs.tables(requests)
            for repeat in range(config.repeats):
                batch = chosen[repeat * largest : repeat * largest + requests]
                tokens = [t for _, t in batch]
                workloads = [p.workload for p, _ in batch]
                trace_sim: dict[str, float] | None = None
                for name in (
                    config.trace_policy,
                    *(p for p in policies if p != config.trace_policy),
                ):
                    key = (name, requests, threads, repeat)
                    if key in done:
                        continue
                    online = (
                        OnlineCosts(costs.points[requests], config.num_positions, requests)
                        if config.remeasure
                        else None
                    )
                    policy = PolicySpec(name).build(
                        tables, config.num_positions, requests, online=online
                    )
                    result = engine.generate(
                        tokens, config.max_new_tokens, policy, seed=config.seed + repeat
                    )
                    record = run_record(result, name, requests, threads, repeat, cost)
                    if name == config.trace_policy:
                        trace = run_trace(result, workloads, params)
                        trace_sim = (
                            simulated_tokens_per_s(trace, cost, requests, config.seed + repeat)
                            if trace is not None and trace.labeled.any()
                            else {}
                        )
                        record["simulated_all"] = trace_sim
                    if trace_sim is None:
                        trace_sim = next(
                            (
                                r.get("simulated_all")
                                for r in records
                                if r["policy"] == config.trace_policy
                                and r["R"] == requests
                                and r["threads"] == threads
                                and r["repeat"] == repeat
                            ),
                            {},
                        )
                    simulated = trace_sim or {}
                    record["simulated_tokens_per_s"] = simulated.get(SIMULATED_AS.get(name, name))
                    records.append(record)
                    done.add(key)
                    with runs_path.open("a", encoding="utf-8") as handle:
                        handle.write(json.dumps(record) + "\n")
                    finished += 1
                    if progress is not None:
                        progress(
                            finished,
                            total,
                            f"t={threads} R={requests} #{repeat} {name}: "
                            f"{record['tokens_per_s']:.2f} tok/s",
                        )
            write_results(out / "results.json", config, aggregate(records))
        engine.target.close()  # type: ignore[attr-defined]
        engine.drafter.close()  # type: ignore[attr-defined]
    rows = aggregate(records)
    write_results(out / "results.json", config, rows)
    return rows


def _costs(
    config: BenchConfig,
    engine: SpeculativeEngine,
    threads: int,
    context: int,
    path: Path,
    note: Callable[[str], None],
    progress: Callable[[int, int, str], None] | None,
) -> EngineCosts:
    """The cost file of these threads, profiled (each sequence holding ``context`` tokens: the
    prompts' mean plus half the new tokens) unless one covering every R is there."""
    if path.exists():
        costs = EngineCosts.load(path)
        if (
            set(config.concurrency) <= set(costs.points)
            and costs.num_positions == config.num_positions
        ):
            note(f"reusing {path}")
            return costs
    note(f"profiling the loop's step costs at {threads} thread(s) into {path}")
    points = {}
    for requests in config.concurrency:
        points[requests] = profile_engine(
            engine,
            requests,
            config.num_positions,
            context=context,
            repeats=config.profile_repeats,
            progress=progress,
        )
    metadata = {
        "threads": threads,
        "context": context,
        "target": config.target,
        "drafter": config.drafter,
    }
    costs = EngineCosts(points, config.num_positions, metadata)
    write_engine_costs(path, costs)
    return costs


def _estimate(
    config: BenchConfig,
    costs: EngineCosts,
    threads: int,
    chosen: Sequence[tuple[Prompt, list[int]]],
    done: set[tuple[str, int, int, int]],
    note: Callable[[str], None],
) -> None:
    """Prints the expected duration of what is left at these threads, from the cost tables:
    one prefill per (R, repeat) (the target's cost extrapolated to the prompts' tokens, plus
    0.4 of it for the drafter), and per run ``max_new_tokens`` steps of no speculation's cost."""
    prompt_tokens = statistics.mean(len(t) for _, t in chosen)
    seconds = 0.0
    for requests in config.concurrency:
        cost = costs.measured_cost(requests)
        prefill_ms = 1.4 * float(cost.verify_ms(requests * prompt_tokens))
        run_ms = config.max_new_tokens * float(cost.verify_ms(requests))
        for repeat in range(config.repeats):
            left = sum(
                (name, requests, threads, repeat) not in done for name in config.run_policies()
            )
            seconds += (prefill_ms + left * run_ms) / 1000.0 if left else 0.0
    note(
        f"estimated time left at {threads} thread(s): {seconds / 60:.1f} min (from the "
        "measured costs)"
    )


def write_results(path: Path, config: BenchConfig, rows: list[dict[str, Any]]) -> None:
    data = {
        "command": "av-core bench-engine",
        "target": Path(config.target).name,
        "drafter": Path(config.drafter).name,
        "num_positions": config.num_positions,
        "max_new_tokens": config.max_new_tokens,
        "temperature": config.temperature,
        "measured": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    partial.replace(path)


README_START = "<!-- engine-bench:start -->"
README_END = "<!-- engine-bench:end -->"


def format_table(data: dict[str, Any], *, threads: int | None = None) -> str:
    """The README's "Measured on a real runtime" table: per R, each policy's tokens/s (wall;
    CPU and simulated beside it) and its ratio to the best policy at that R."""
    rows = [row for row in data["rows"] if threads is None or row["threads"] == threads]
    lines = [
        "| threads | R | policy | tok/s (wall) | min–max | tok/s (CPU) | simulated | priced "
        "| acceptance | tokens/verify | vs best |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault((row["threads"], row["R"]), []).append(row)
    for (t, r), group in sorted(by_key.items()):
        best = max(row["tokens_per_s"] for row in group)
        for row in group:

            def fmt(value: float | None, digits: int = 2) -> str:
                return (
                    "–"
                    if value is None or (isinstance(value, float) and math.isnan(value))
                    else f"{value:.{digits}f}"
                )

            lines.append(
                f"| {t} | {r} | {row['policy']} | {fmt(row['tokens_per_s'])} | "
                f"{fmt(row['spread'][0])}–{fmt(row['spread'][1])} | "
                f"{fmt(row['tokens_per_s_cpu'])} | "
                f"{fmt(row['simulated_tokens_per_s'])} | {fmt(row['priced_tokens_per_s'])} | "
                f"{fmt(row['acceptance'], 3)} | {fmt(row['tokens_per_verification'])} | "
                f"{row['tokens_per_s'] / best:.3f} |"
            )
    return "\n".join(lines)


def update_readme(readme: str | Path, results: str | Path) -> bool:
    """Rewrites the table between the README's engine-bench markers from ``results``; False
    when the markers are absent."""
    readme = Path(readme)
    data = json.loads(Path(results).read_text(encoding="utf-8"))
    text = readme.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        return False
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    caption = (
        f"`av-core bench-engine` on {data['target']} / {data['drafter']}, "
        f"K = {data['num_positions']}, "
        f"{data['max_new_tokens']} new tokens per request, temperature {data['temperature']}, "
        f"measured {data['measured']}; medians over repeats."
    )
    readme.write_text(
        f"{head}{README_START}\n{caption}\n\n{format_table(data)}\n{README_END}{tail}",
        encoding="utf-8",
    )
    return True


__all__ = [
    "README_END",
    "README_START",
    "SIMULATED_AS",
    "BenchConfig",
    "aggregate",
    "format_table",
    "priced_ms",
    "run_bench",
    "run_record",
    "run_trace",
    "select_prompts",
    "simulated_tokens_per_s",
    "update_readme",
    "write_results",
]
