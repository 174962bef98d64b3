"""The real-runtime benchmark (``av-core bench-engine``): every policy at every concurrency R and
thread count, on real prompts, measured in tokens per second, beside what the simulator
predicts for the same run.

Per (threads, R, repeat) every policy generates ``max_new_tokens`` for the same R prompts with
the same seed (a paired comparison; runs of a repeat are interleaved across policies). Each run
is one line of ``runs.jsonl`` in the output directory, so an interrupted benchmark resumes where
it stopped. ``results.json`` aggregates them: one row per (policy, R, threads) with the medians
over repeats. Beside each measured figure:

- ``simulated_tokens_per_s``: :func:`~av_core.tools.simulate.simulate_run`'s replay of the policy
  on the repeat's own trace, priced by the measured cost tables (:meth:`EngineCosts.price`). The
  trace is that of a full-verification run of the same drafting: fixed K = K for the policies
  that sample their drafts, llama.cpp's default policy (greedy drafts, ``p_min = 0``: every
  position up to ``n_max``, with the confidence ``p_min`` reads) for llama.cpp's policies. Each
  trace is kept in ``traces/`` in the trace format.
- ``priced_tokens_per_s``: the run's own steps priced by the same function: how far the cost
  model is from the clock, with the components per step beside it (``draft_ms_per_step``,
  ``priced_draft_ms_per_step``, ``verify_ms_per_step``, ``priced_verify_ms_per_step``,
  ``other_ms_per_step``: the decode time outside the priced calls).

``clock`` (``wall`` or ``cpu``) is what the profile, the step records and the prediction read;
on a shared machine CPU time is the robust one (it still counts llama.cpp's threads spinning).
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

from av_core._native import InvalidValueError
from av_core.llama_cpp import open_engine
from av_core.llama_cpp.engine import RunResult, SpeculativeEngine
from av_core.llama_cpp.policies import DEFAULT_POLICIES, PolicySpec
from av_core.llama_cpp.profile import (
    EngineCosts,
    OnlineCosts,
    profile_engine,
    profile_tokens,
    write_engine_costs,
)
from av_core.llama_cpp.sampling import SamplingParams
from av_core.tools.collect.prompts import Prompt
from av_core.tools.evaluate import DraftRounds
from av_core.tools.simulate.run import StepShape, simulate_run
from av_core.tools.trace import DraftTrace, read_trace, trace_from_rows, write_trace

#: The full-verification run of llama.cpp's greedy drafting (``p_min = 0``).
GREEDY_TRACE_POLICY = "llama.cpp"
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark runs (defaults: the full benchmark of docs/llama-cpp.md)."""

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
    clock: str = "wall"

    @property
    def trace_policy(self) -> str:
        """The full-verification run whose trace replays the policies that sample drafts."""
        return f"K={self.num_positions}"

    def trace_of(self, policy: str) -> str:
        """The run whose trace replays ``policy``."""
        greedy = PolicySpec(policy).check(self.num_positions).greedy
        return GREEDY_TRACE_POLICY if greedy else self.trace_policy

    def settings(self) -> dict[str, Any]:
        """What makes two runs comparable (a resumed benchmark must keep them): everything but
        the concurrencies, thread counts, policies and repeats, which it may extend."""
        keep = ("num_positions", "max_new_tokens", "max_prompt_tokens", "temperature", "seed")
        models = {"target": Path(self.target).name, "drafter": Path(self.drafter).name}
        return {**models, **{k: getattr(self, k) for k in keep}, "clock": self.clock}

    def run_policies(self) -> tuple[str, ...]:
        """Every policy, the trace runs first."""
        traces = dict.fromkeys(self.trace_of(p) for p in (*self.policies, self.trace_policy))
        return (*traces, *(p for p in self.policies if p not in traces))


def run_trace(
    result: RunResult,
    workloads: Sequence[str],
    params: SamplingParams,
    *,
    request_ids: Sequence[int] | None = None,
    prompt_ids: Sequence[str] | None = None,
) -> DraftTrace | None:
    """The run's drafts as a labeled trace (one row per kept draft of every step, with
    ``top10_confidence`` when the drafts are greedy; ``None`` when nothing was drafted).
    ``request_ids`` and ``prompt_ids`` name each request of the run."""
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
                if not math.isnan(step.confidences[i, k]):
                    row["top10_confidence"] = float(step.confidences[i, k])
                rows.append(row)
            counter[r] += 1
    return trace_from_rows(rows) if rows else None


def simulated_tokens_per_s(
    trace: DraftTrace, policy: str, costs: EngineCosts, config: BenchConfig, requests: int
) -> float | None:
    """What :func:`simulate_run` predicts for ``policy`` at ``requests`` from ``trace``."""
    if not trace.labeled.any():
        return None
    rounds = DraftRounds.from_trace(trace)
    confidences = trace.top10_confidence
    replay = simulate_run(
        rounds,
        PolicySpec(policy).build(costs.tables(requests), config.num_positions, requests),
        costs.price,
        config.max_new_tokens,
        features=rounds.column(trace.logit_q_max),
        confidences=None if confidences is None else rounds.column(confidences, math.nan),
    )
    return replay.tokens_per_s


def priced_ms(costs: EngineCosts, shapes: Sequence[StepShape]) -> tuple[float, float]:
    """The drafter's and the target's milliseconds of a run's steps, priced by ``costs``."""
    draft = sum(costs.price(StepShape(s.draft_passes, ())) for s in shapes)
    return draft, sum(costs.price(StepShape((), s.verify)) for s in shapes)


def run_record(
    result: RunResult, policy: str, requests: int, threads: int, repeat: int, costs: EngineCosts
) -> dict[str, Any]:
    steps = result.steps
    priced_draft, priced_verify = priced_ms(costs, [s.shape for s in steps])
    decode_s = result.wall_s - result.prefill_s
    return {
        "policy": policy,
        "R": requests,
        "threads": threads,
        "repeat": repeat,
        "tokens": result.kept,
        "decode_s": decode_s,
        "decode_cpu_s": result.cpu_s - result.prefill_cpu_s,
        "tokens_per_s": result.tokens_per_s,
        "tokens_per_s_cpu": result.tokens_per_cpu_s,
        "priced_tokens_per_s": result.kept / max(priced_draft + priced_verify, 1e-9) * 1000.0,
        "accepted": result.accepted,
        "admitted": result.admitted,
        "target_calls": len(steps),
        "verifications": result.verifications,
        "drafted": int(sum(int(s.drafted.sum()) for s in steps)),
        "depth0_steps": int(sum(int(s.depths.max(initial=0)) == 0 for s in steps)),
        "host_ms_per_step": statistics.median(s.host_ms for s in steps),
        "draft_ms": sum(s.draft_ms for s in steps),
        "verify_ms": sum(s.verify_ms for s in steps),
        "step_ms": sum(s.step_ms for s in steps),
        "priced_draft_ms": priced_draft,
        "priced_verify_ms": priced_verify,
    }


def aggregate(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (policy, R, threads): medians over repeats, ``spread`` = [min, max] of the
    wall tokens/s, pooled acceptance and per-step components (the clock's ms)."""
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
        calls = sum(run["target_calls"] for run in runs)

        def per_step(key: str, runs: list[dict[str, Any]] = runs, calls: int = calls) -> float:
            return float(sum(run.get(key, math.nan) for run in runs)) / calls

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
                "tokens_per_target_call": sum(run["tokens"] for run in runs) / calls,
                "tokens_per_verification": sum(run["tokens"] for run in runs)
                / sum(run["verifications"] for run in runs),
                "depth0_share": sum(run["depth0_steps"] for run in runs) / calls,
                "host_ms_per_step": statistics.median(run["host_ms_per_step"] for run in runs),
                "draft_ms_per_step": per_step("draft_ms"),
                "priced_draft_ms_per_step": per_step("priced_draft_ms"),
                "verify_ms_per_step": per_step("verify_ms"),
                "priced_verify_ms_per_step": per_step("priced_verify_ms"),
                "other_ms_per_step": per_step("step_ms")
                - per_step("draft_ms")
                - per_step("verify_ms"),
                "repeats": len(runs),
                "spread": [min(speeds), max(speeds)],
            }
        )
    return rows


def _read_runs(path: Path) -> list[dict[str, Any]]:
    """The records of ``runs.jsonl``, the last of each run (a line cut by an interruption is
    skipped: that run is redone)."""
    runs: dict[tuple[Any, ...], dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                runs[(record["policy"], record["R"], record["threads"], record["repeat"])] = record
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return list(runs.values())


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


def _trace_path(out: Path, policy: str, requests: int, threads: int, repeat: int) -> Path:
    return out / "traces" / f"t{threads}_R{requests}_r{repeat}_{policy}.csv.gz"


def _load_trace(path: Path) -> DraftTrace | None:
    try:
        return read_trace(path)
    except (OSError, ValueError):
        return None


def run_bench(
    config: BenchConfig,
    prompts: Sequence[Prompt],
    out: str | Path,
    *,
    progress: Callable[[int, int, str], None] | None = None,
    note: Callable[[str], None] = lambda text: None,
) -> list[dict[str, Any]]:
    """Runs (or resumes) the benchmark into ``out`` (``costs_t{threads}.json``, ``runs.jsonl``,
    ``traces/``, ``results.json``) and returns the aggregated rows."""
    out = Path(out)
    _check_depths(config)
    _check_settings(out / "settings.json", config)
    runs_path = out / "runs.jsonl"
    records = _read_runs(runs_path)
    policies = config.run_policies()
    # A trace run that drafted but whose trace file is gone runs again (its replays need it).
    records = [
        r
        for r in records
        if r["policy"] not in {config.trace_of(p) for p in policies}
        or not r["drafted"]
        or _trace_path(out, r["policy"], r["R"], r["threads"], r["repeat"]).exists()
    ]
    done = {(r["policy"], r["R"], r["threads"], r["repeat"]) for r in records}
    deepest = max(PolicySpec(name).check(config.num_positions).num_positions for name in policies)
    params = SamplingParams(config.temperature)
    total = len(config.threads) * len(config.concurrency) * config.repeats * len(policies)
    finished = len([key for key in done if key[0] in policies])
    largest = max(config.concurrency)
    clock = CLOCKS[config.clock]
    for threads in config.threads:
        engine = open_engine(
            config.target,
            config.drafter,
            requests=largest,
            # Room for the runs and for the profile, whose context lies below it.
            tokens_per_request=profile_tokens(
                config.max_prompt_tokens + config.max_new_tokens, config.num_positions
            ),
            params=params,
            max_positions=deepest,
            threads=threads,
            cache_prefill=True,
        )
        engine.clock = clock
        chosen = select_prompts(engine, prompts, config.max_prompt_tokens)
        need = largest * config.repeats
        if len(chosen) < need:
            raise InvalidValueError(
                f"prompts: {len(chosen)} prompts fit --max-prompt-tokens "
                f"{config.max_prompt_tokens}, "
                f"R = {largest} x {config.repeats} repeats need {need}"
            )
        _record_settings(out, config)
        context = int(statistics.mean(len(t) for _, t in chosen) + config.max_new_tokens / 2)
        costs = _costs(
            config, engine, threads, context, out / f"costs_t{threads}.json", note, progress
        )
        _estimate(config, costs, threads, chosen, done, note)
        for requests in config.concurrency:
            for repeat in range(config.repeats):
                batch = chosen[repeat * largest : repeat * largest + requests]
                tokens = [t for _, t in batch]
                workloads = [p.workload for p, _ in batch]
                for name in policies:
                    key = (name, requests, threads, repeat)
                    if key in done:
                        continue
                    if progress is not None:
                        progress(finished, total, f"t={threads} R={requests} #{repeat} {name}")
                    online = (
                        OnlineCosts(costs.points[requests], config.num_positions, requests)
                        if config.remeasure
                        else None
                    )
                    policy = PolicySpec(name).build(
                        costs.tables(requests), config.num_positions, requests, online=online
                    )
                    result = engine.generate(
                        tokens, config.max_new_tokens, policy, seed=config.seed + repeat
                    )
                    record = run_record(result, name, requests, threads, repeat, costs)
                    trace_file = _trace_path(out, config.trace_of(name), requests, threads, repeat)
                    if name == config.trace_of(name):
                        trace = run_trace(result, workloads, params)
                        if trace is not None:
                            partial = trace_file.with_name("partial-" + trace_file.name)
                            write_trace(trace, partial)
                            partial.replace(trace_file)
                    trace = _load_trace(trace_file)
                    record["simulated_tokens_per_s"] = (
                        None
                        if trace is None
                        else simulated_tokens_per_s(trace, name, costs, config, requests)
                    )
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


def _check_depths(config: BenchConfig) -> None:
    """``ValueError`` naming a policy that samples its drafts deeper than ``num_positions``: its
    prediction replays the ``K = num_positions`` trace, which holds no deeper draft, so it
    would silently be the prediction of a shallower policy."""
    for name in config.policies:
        policy = PolicySpec(name).check(config.num_positions)
        if not policy.greedy and policy.num_positions > config.num_positions:
            raise InvalidValueError(
                f"--policies: {name} drafts {policy.num_positions} positions, more than --k "
                f"{config.num_positions} (its prediction replays the K={config.num_positions} "
                "trace); raise --k"
            )


def _check_settings(path: Path, config: BenchConfig) -> None:
    """``ValueError`` naming the output folder when it is not a folder or holds a benchmark of
    other settings than ``config``'s (its runs would be mixed with these)."""
    if path.parent.exists() and not path.parent.is_dir():
        raise InvalidValueError(f"--out {path.parent}: not a folder")
    wanted = config.settings()
    if not path.exists():
        return
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidValueError(f"{path}: not a bench-engine settings file ({error})") from None
    differ = [f"{k} {found.get(k)!r} (now {v!r})" for k, v in wanted.items() if found.get(k) != v]
    if differ:
        raise InvalidValueError(
            f"--out {path.parent}: holds a benchmark of other settings: {', '.join(differ)}; "
            "use another --out or remove it"
        )


def _record_settings(out: Path, config: BenchConfig) -> None:
    """Creates the output folder, its ``traces/`` and ``settings.json`` (``config``'s settings,
    kept from the first run on). Called once the models are loaded and the prompts fit, so that
    a benchmark refused before that leaves nothing behind."""
    (out / "traces").mkdir(parents=True, exist_ok=True)
    path = out / "settings.json"
    if not path.exists():
        path.write_text(json.dumps(config.settings(), indent=1) + "\n", encoding="utf-8")


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
    prompts' mean plus half the new tokens) unless one of the same clock covering every R is
    there."""
    if path.exists():
        costs = EngineCosts.load(path)
        if (
            set(config.concurrency) <= set(costs.points)
            and costs.num_positions == config.num_positions
            and costs.metadata.get("clock", "wall") == config.clock
            and all("catchup" in entry for entry in costs.points.values())
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
            clock=CLOCKS[config.clock],
        )
    metadata = {
        "threads": threads,
        "context": context,
        "clock": config.clock,
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
        "clock": config.clock,
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
    CPU, simulated and priced beside it) and its ratio to the best policy at that R by the
    benchmark's clock (wall, or CPU time)."""
    rows = [row for row in data["rows"] if threads is None or row["threads"] == threads]
    lines = [
        "| threads | R | policy | tok/s (wall) | min–max | tok/s (CPU) | simulated | priced "
        "| acceptance | tokens/verify | vs best |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in rows:
        by_key.setdefault((row["threads"], row["R"]), []).append(row)

    def fmt(value: float | None, digits: int = 2) -> str:
        return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"

    measured = "tokens_per_s_cpu" if data.get("clock") == "cpu" else "tokens_per_s"
    for (t, r), group in sorted(by_key.items()):
        best = max(row[measured] for row in group)
        for row in group:
            lines.append(
                f"| {t} | {r} | {row['policy']} | {fmt(row['tokens_per_s'])} | "
                f"{fmt(row['spread'][0])}–{fmt(row['spread'][1])} | "
                f"{fmt(row['tokens_per_s_cpu'])} | "
                f"{fmt(row['simulated_tokens_per_s'])} | {fmt(row['priced_tokens_per_s'])} | "
                f"{fmt(row['acceptance'], 3)} | {fmt(row['tokens_per_verification'])} | "
                f"{row[measured] / best:.3f} |"
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
        f"clock {data.get('clock', 'wall')}, measured {data['measured']}; medians over repeats."
    )
    partial = readme.with_name(readme.name + ".partial")
    partial.write_text(
        f"{head}{README_START}\n{caption}\n\n{format_table(data)}\n{README_END}{tail}",
        encoding="utf-8",
    )
    partial.replace(readme)
    return True


__all__ = [
    "CLOCKS",
    "GREEDY_TRACE_POLICY",
    "README_END",
    "README_START",
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
