"""Re-pricing a saved ``av-core bench-engine`` folder with the current cost model, without
running a model (:func:`reprice`; ``scripts/reprice_engine.py`` is its command line)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from av_core._native import InvalidValueError
from av_core.llama_cpp.bench import (
    BenchConfig,
    _load_trace,
    _read_runs,
    _trace_path,
    aggregate,
    priced_ms,
    simulated_tokens_per_s,
)
from av_core.llama_cpp.policies import PolicySpec
from av_core.llama_cpp.profile import EngineCosts
from av_core.tools.evaluate import DraftRounds
from av_core.tools.simulate.run import StepShape, simulate_run
from av_core.tools.trace import DraftTrace


def _replayed_shapes(
    trace: DraftTrace, policy: str, costs: EngineCosts, config: BenchConfig, requests: int
) -> list[StepShape]:
    """The step shapes of ``policy``'s replay on ``trace`` (its run's own shapes when ``trace``
    is that run's, a full verification)."""
    shapes: list[StepShape] = []

    def record(shape: StepShape) -> float:
        shapes.append(shape)
        return 0.0

    rounds = DraftRounds.from_trace(trace)
    confidences = trace.top10_confidence
    simulate_run(
        rounds,
        PolicySpec(policy).build(costs.tables(requests), config.num_positions, requests),
        record,
        config.max_new_tokens,
        features=rounds.column(trace.logit_q_max),
        confidences=None if confidences is None else rounds.column(confidences, math.nan),
    )
    return shapes


def reprice(
    folder: str | Path, *, extra_costs: str | Path | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Re-derives a benchmark folder's predictions with the current cost model, without running
    anything: each run's ``simulated_tokens_per_s`` from its saved trace and the folder's cost
    files, and its ``priced_*`` figures where its step shapes are known without its step records
    (a trace run, whose shapes its own trace replays, or a run that never drafted: every
    request verifies one token per step until it has ``max_new_tokens``); ``repriced`` lists
    what was recomputed, the rest is the run's record. ``extra_costs``: a cost file of the same
    threads, context and clock whose concurrencies join the folder's (the target's curve of
    tokens then has points below the folder's smallest). Returns the runs and their aggregate
    rows."""
    folder = Path(folder)
    if not (folder / "settings.json").is_file() or not (folder / "runs.jsonl").is_file():
        raise InvalidValueError(
            f"folder: {folder} holds no bench-engine settings.json and runs.jsonl"
        )
    settings = json.loads((folder / "settings.json").read_text(encoding="utf-8"))
    keep = ("num_positions", "max_new_tokens", "max_prompt_tokens", "temperature", "seed", "clock")
    config = BenchConfig(settings["target"], settings["drafter"], **{k: settings[k] for k in keep})
    extra = None if extra_costs is None else EngineCosts.load(extra_costs)
    costs: dict[int, EngineCosts] = {}
    records = _read_runs(folder / "runs.jsonl")
    for record in records:
        threads = record["threads"]
        if threads not in costs:
            costs[threads] = _with_extra(
                EngineCosts.load(folder / f"costs_t{threads}.json"), extra, extra_costs
            )
        cost, requests, policy = costs[threads], record["R"], record["policy"]
        trace_name = config.trace_of(policy)
        trace = _load_trace(_trace_path(folder, trace_name, requests, threads, record["repeat"]))
        repriced = []
        if trace is not None:
            record["simulated_tokens_per_s"] = simulated_tokens_per_s(
                trace, policy, cost, config, requests
            )
            repriced.append("simulated_tokens_per_s")
        shapes = None
        if record["drafted"] == 0:
            one_token = StepShape((), tuple((r, 1) for r in range(requests)))
            shapes = [one_token] * record["target_calls"]
        elif policy == trace_name and trace is not None:
            shapes = _replayed_shapes(trace, policy, cost, config, requests)
        if shapes is not None and len(shapes) == record["target_calls"]:
            draft_ms, verify_ms = priced_ms(cost, shapes)
            record["priced_draft_ms"], record["priced_verify_ms"] = draft_ms, verify_ms
            total = draft_ms + verify_ms
            record["priced_tokens_per_s"] = record["tokens"] / max(total, 1e-9) * 1000.0
            repriced += ["priced_draft_ms", "priced_verify_ms", "priced_tokens_per_s"]
        record["repriced"] = repriced
    return records, aggregate(records)


def _with_extra(
    costs: EngineCosts, extra: EngineCosts | None, path: str | Path | None
) -> EngineCosts:
    """``costs`` with the concurrencies of ``extra`` it lacks; ``ValueError`` naming ``path``
    when ``extra`` was measured under other settings."""
    if extra is None:
        return costs
    for key in ("threads", "context", "clock"):
        if extra.metadata.get(key) != costs.metadata.get(key):
            raise InvalidValueError(
                f"extra_costs: {path} has {key} {extra.metadata.get(key)!r}, the folder's cost "
                f"file {costs.metadata.get(key)!r}"
            )
    return EngineCosts({**extra.points, **costs.points}, costs.num_positions, costs.metadata)


__all__ = ["reprice"]
