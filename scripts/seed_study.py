"""Every figure in README.md and docs/ that depends on randomness, over many seeds (median and
worst) or with a bootstrap interval.

    python scripts/seed_study.py [--seeds 20] [--resamples 1000] [--update-docs]

Sections (each prints a Markdown table):

1. **Lockout** (``av_core.tools.synthetic.TrimmingServing``: 32 requests, K = 4, compute-bound costs
   so the planner trims): rounds until the estimator is back within 0.05 of the true curve after
   one adversarial round, and within 0.1 after a switch from a high- to a low-acceptance
   workload; for the defaults and for the settings ``tests/estimator/test_lockout.py`` uses.
2. **Memory on synthetic workloads** (``scripts/memory_study.py``'s definitions): coefficient
   jitter against γ = 0 (worst coefficient) and rounds to recover after a workload switch, per γ.
3. **Memory on the real traces**: prequential AUC, log-loss and ECE per γ, the difference to
   γ = 0 with a 90% bootstrap interval over prompts, and ECE at 10, 15 and 20 bins.
4. **Simulated throughput** (``av_core.tools.simulate``, gpu-like cost model, one stream seed per
   run): γ = 0.8 against γ = 0, and adaptive verification (with and without drafting-depth
   control) against the best fixed K including no speculation, per concurrency.

Writes every figure to ``scripts/seed_study.json``; ``--update-docs`` rewrites the spans
``<!--s:KEY|FORMAT-->…<!--/s-->`` in README.md and docs/*.md from it, and
``tests/docs/test_doc_figures.py`` fails when a span disagrees with the JSON. About 10 minutes on
two cores with the defaults.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from av_core import AcceptanceEstimator
from av_core.tools.evaluate import DraftRounds, replay_online
from av_core.tools.metrics import expected_calibration_error, log_loss, roc_auc
from av_core.tools.simulate import simulate_trace
from av_core.tools.synthetic import (
    SyntheticWorkload,
    TrimmingServing,
    labeled_log_loss,
    refit_rounds,
)
from av_core.tools.trace import SHIPPED_TRACES, load_shipped_trace

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "scripts" / "seed_study.json"
DOC_FILES = (
    "README.md",
    "docs/memory.md",
    "docs/reliability.md",
    "docs/drafting-depth.md",
    "docs/simulate.md",
)
SPAN = re.compile(r"<!--s:(?P<spec>[^>]*?)-->(?P<value>.*?)<!--/s-->", re.S)

STATIONARY = SyntheticWorkload(slope=0.55, intercepts=(1.4, 0.9, 0.5, 0.1))
LOCKOUT_HIGH = SyntheticWorkload(slope=0.55, intercepts=(2.0, 1.5, 1.0, 0.5))
LOCKOUT_LOW = SyntheticWorkload(slope=0.55, intercepts=(0.0, -0.5, -1.0, -1.5))
MEMORY_LOW = SyntheticWorkload(slope=0.55, intercepts=(-0.5, -1.0, -1.5, -2.0))
GAMMAS = (0.0, 0.5, 0.8, 0.9, 0.95)
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TRACE_NAMES = {SHIPPED_TRACES[0]: "t1", SHIPPED_TRACES[1]: "t0.6"}

Figures = dict[str, float]


def summarize(
    figures: Figures, key: str, values: Sequence[float], *, higher_is_better: bool
) -> None:
    """median, worst and best of ``values`` under ``key.median`` etc."""
    array = np.asarray(values, dtype=np.float64)
    figures[f"{key}.median"] = float(np.median(array))
    figures[f"{key}.worst"] = float(array.min() if higher_is_better else array.max())
    figures[f"{key}.best"] = float(array.max() if higher_is_better else array.min())
    figures[f"{key}.n"] = float(len(array))


def dist(figures: Figures, key: str, digits: int = 0) -> str:
    m, w, b = (figures[f"{key}.{part}"] for part in ("median", "worst", "best"))
    return f"{m:.{digits}f} | {w:.{digits}f} | {b:.{digits}f}"


# --- 1. lockout -------------------------------------------------------------------------------

#: The defaults (γ = 0.8, exploration 0.01), the same with γ = 0 and γ = 0.9, and the settings
#: of tests/estimator/test_lockout.py (exploration 0.05).
LOCKOUT_SETTINGS: dict[str, dict[str, float]] = {
    "defaults": {},
    "m0": {"memory": 0.0},
    "m0.9": {"memory": 0.9},
    "test": {"exploration": 0.05, "memory": 0.9},
}
SWITCH_SETTINGS: dict[str, dict[str, float]] = {
    "defaults": {},
    "m0": {"memory": 0.0},
    "m0.9": {"memory": 0.9},
    "test_m0": {"exploration": 0.05, "memory": 0.0},
    "test_m0.9": {"exploration": 0.05, "memory": 0.9},
}
LIMIT = 60


def lockout(seeds: int, figures: Figures) -> None:
    for name, settings in LOCKOUT_SETTINGS.items():
        rounds = []
        for seed in range(seeds):
            serving = TrimmingServing(32, 4, seed=seed, **settings)
            for _ in range(20):
                serving.round(STATIONARY)
            serving.adversarial_round()
            rounds.append(serving.rounds_until(STATIONARY, 0.05, LIMIT))
        summarize(figures, f"lockout.{name}", rounds, higher_is_better=False)
    for name, settings in SWITCH_SETTINGS.items():
        rounds = []
        for seed in range(seeds):
            serving = TrimmingServing(32, 4, seed=seed, **settings)
            for _ in range(20):
                serving.round(LOCKOUT_HIGH)
            rounds.append(serving.rounds_until(LOCKOUT_LOW, 0.1, LIMIT))
        summarize(figures, f"switch.{name}", rounds, higher_is_better=False)


def describe(settings: dict[str, float]) -> str:
    memory = settings.get("memory", 0.8)
    exploration = settings.get("exploration", 0.01)
    return f"γ = {memory:g}, exploration {exploration:g}"


def lockout_table(figures: Figures) -> str:
    lines = [
        "| scenario | settings | median rounds | worst | best | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for what, prefix, table in (
        ("back within 0.05 after an adversarial round", "lockout", LOCKOUT_SETTINGS),
        ("a high→low switch tracked within 0.1", "switch", SWITCH_SETTINGS),
    ):
        for name, settings in table.items():
            key = f"{prefix}.{name}"
            label = describe(settings) + (" (defaults)" if not settings else "")
            lines.append(f"| {what} | {label} | {dist(figures, key)} | {figures[f'{key}.n']:.0f} |")
    return "\n".join(lines)


# --- 2. memory on synthetic workloads ---------------------------------------------------------


def jitter(gamma: float, seed: int) -> np.ndarray:
    est = AcceptanceEstimator(4, memory=gamma, update="vllm")  # docs/memory.md: vLLM's update
    return refit_rounds(est, STATIONARY, 50, np.random.default_rng(seed))[15:].std(axis=0)


def rounds_to_recover(gamma: float, seed: int) -> int:
    est = AcceptanceEstimator(4, memory=gamma, update="vllm")  # docs/memory.md: vLLM's update
    rng = np.random.default_rng(seed)
    refit_rounds(est, LOCKOUT_HIGH, 30, rng)
    optimum = labeled_log_loss(None, MEMORY_LOW)
    for r in range(1, LIMIT + 1):
        refit_rounds(est, MEMORY_LOW, 1, rng)
        if labeled_log_loss(est, MEMORY_LOW) <= 1.05 * optimum:
            return r
    return LIMIT + 1


def memory_synthetic(seeds: int, figures: Figures) -> None:
    base = {seed: jitter(0.0, seed) for seed in range(seeds)}
    for gamma in GAMMAS:
        ratios = [float(np.min(base[s] / jitter(gamma, s))) for s in range(seeds)]
        recover = [rounds_to_recover(gamma, s) for s in range(seeds)]
        key = f"memory.g{gamma:g}"
        summarize(figures, f"{key}.jitter_ratio", ratios, higher_is_better=True)
        summarize(figures, f"{key}.recover", recover, higher_is_better=False)


def memory_synthetic_table(figures: Figures) -> str:
    lines = [
        "| γ | jitter ratio vs γ = 0 (worst coefficient): median | worst | best "
        "| rounds to recover after a switch: median | worst | best |",
        "|---|---|---|---|---|---|---|",
    ]
    for gamma in GAMMAS:
        key = f"memory.g{gamma:g}"
        lines.append(
            f"| {gamma:g} | {dist(figures, f'{key}.jitter_ratio', 1)} | "
            f"{dist(figures, f'{key}.recover')} |"
        )
    return "\n".join(lines)


# --- 3. memory on the real traces -------------------------------------------------------------


def trace_scores(name: str, gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, prequential predictions, prompt index) of every labeled draft."""
    trace = load_shipped_trace(name)
    rounds = DraftRounds.from_trace(trace)
    # docs/memory.md studies the memory of vLLM's update (the map update's: docs/estimator.md).
    replay = replay_online(rounds, rounds.column(trace.logit_q_max), memory=gamma, update="vllm")
    labeled = rounds.labels >= 0
    prompt = np.broadcast_to(rounds.request_id[:, None], rounds.labels.shape)[labeled]
    return rounds.labels[labeled].astype(np.int64), replay.predictions[labeled], prompt


def metrics(y: np.ndarray, p: np.ndarray, bins: int = 15) -> tuple[float, float, float]:
    return (
        roc_auc(y, p),
        log_loss(y, p),
        expected_calibration_error(y, p, n_bins=bins),
    )


def memory_traces(resamples: int, figures: Figures) -> None:
    rng = np.random.default_rng(0)
    for name, short in TRACE_NAMES.items():
        scored = {g: trace_scores(name, g) for g in (0.0, 0.8, 0.9)}
        y, _, prompt = scored[0.0]
        prompts = np.unique(prompt)
        members = [np.flatnonzero(prompt == q) for q in prompts]
        draws = [
            np.concatenate([members[i] for i in rng.integers(0, len(prompts), len(prompts))])
            for _ in range(resamples)
        ]
        resampled = {g: [metrics(y[i], p[i]) for i in draws] for g, (_, p, _) in scored.items()}
        for gamma, (_, p, _) in scored.items():
            key = f"trace.{short}.g{gamma:g}"
            for metric, value in zip(("auc", "log_loss", "ece"), metrics(y, p), strict=True):
                figures[f"{key}.{metric}"] = value
            for bins in (10, 20):
                figures[f"{key}.ece{bins}"] = expected_calibration_error(y, p, n_bins=bins)
        for gamma, base in ((0.8, 0.0), (0.9, 0.0), (0.9, 0.8)):
            diffs = np.subtract(resampled[gamma], resampled[base])
            for j, metric in enumerate(("auc", "log_loss", "ece")):
                key = f"trace.{short}.g{gamma:g}_vs_g{base:g}.d_{metric}"
                figures[key] = (
                    figures[f"trace.{short}.g{gamma:g}.{metric}"]
                    - figures[f"trace.{short}.g{base:g}.{metric}"]
                )
                low, high = np.quantile(diffs[:, j], [0.05, 0.95])
                figures[f"{key}.low"], figures[f"{key}.high"] = float(low), float(high)


def interval(figures: Figures, key: str) -> str:
    return f"{figures[key]:+.4f} [{figures[f'{key}.low']:+.4f}, {figures[f'{key}.high']:+.4f}]"


def memory_traces_table(figures: Figures) -> str:
    lines = [
        "| trace | γ | AUC | log-loss | ECE, 15 bins | ECE, 10 / 20 bins |",
        "|---|---|---|---|---|---|",
    ]
    for short in TRACE_NAMES.values():
        for gamma in (0.0, 0.8, 0.9):
            key = f"trace.{short}.g{gamma:g}"
            lines.append(
                f"| {short} | {gamma:g} | {figures[f'{key}.auc']:.4f} | "
                f"{figures[f'{key}.log_loss']:.4f} | {figures[f'{key}.ece']:.4f} | "
                f"{figures[f'{key}.ece10']:.4f} / {figures[f'{key}.ece20']:.4f} |"
            )
    lines += [
        "",
        "| trace | comparison | Δ AUC [90% interval] | Δ log-loss | Δ ECE (15 bins) |",
        "|---|---|---|---|---|",
    ]
    for short in TRACE_NAMES.values():
        for gamma, base in ((0.8, 0.0), (0.9, 0.0), (0.9, 0.8)):
            key = f"trace.{short}.g{gamma:g}_vs_g{base:g}"
            cells = [interval(figures, f"{key}.d_{m}") for m in ("auc", "log_loss", "ece")]
            lines.append(f"| {short} | γ = {gamma:g} − γ = {base:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- 4. simulated throughput ------------------------------------------------------------------


def simulations(seeds: int, figures: Figures) -> None:
    traces = {short: load_shipped_trace(name) for name, short in TRACE_NAMES.items()}
    ratios: dict[str, dict[int, list[float]]] = {}

    def add(key: str, r: int, value: float) -> None:
        ratios.setdefault(key, {}).setdefault(r, []).append(value)

    for seed in range(seeds):
        for short, trace in traces.items():
            for drafter in ("parallel", "autoregressive"):
                modes = ("batch", "per_request") if short == "t1" else ("batch",)
                runs = {
                    gamma: simulate_trace(
                        trace,
                        drafter=drafter,  # type: ignore[arg-type]
                        concurrency=CONCURRENCY,
                        depth_control=modes if gamma == 0.8 else ("batch",),
                        memory=gamma,
                        seed=seed,
                    )
                    for gamma in (0.8, 0.0)
                }
                for r in CONCURRENCY:
                    for policy in ("AV", "AV+D"):
                        add(
                            f"sim.{short}.{drafter}.{policy}.g0.8_vs_g0",
                            r,
                            runs[0.8].adaptive(r, policy).throughput
                            / runs[0.0].adaptive(r, policy).throughput,
                        )
                    if short == "t1":
                        sim = runs[0.8]
                        best_all = sim.best_fixed(r, min_k=0).throughput
                        best = sim.best_fixed(r).throughput
                        for policy in ("AV", "AV+D", "AV+Dr"):
                            value = sim.adaptive(r, policy).throughput
                            add(f"depth.{drafter}.{policy}_vs_best", r, value / best_all)
                            add(f"depth.{drafter}.{policy}_vs_best_k1", r, value / best)
        print(f"   simulations: seed {seed + 1}/{seeds}", file=sys.stderr, flush=True)
    for key, by_r in ratios.items():
        for r, values in by_r.items():
            summarize(figures, f"{key}.R{r}", values, higher_is_better=True)
        every = [v for values in by_r.values() for v in values]
        summarize(figures, f"{key}.all", every, higher_is_better=True)


def memory_sim_table(figures: Figures) -> str:
    lines = [
        "| trace | drafter | policy | median | worst (R) | best (R) |",
        "|---|---|---|---|---|---|",
    ]
    for short in TRACE_NAMES.values():
        for drafter in ("parallel", "autoregressive"):
            for policy in ("AV", "AV+D"):
                key = f"sim.{short}.{drafter}.{policy}.g0.8_vs_g0"
                worst_r = min(CONCURRENCY, key=lambda r: figures[f"{key}.R{r}.worst"])
                best_r = max(CONCURRENCY, key=lambda r: figures[f"{key}.R{r}.best"])
                lines.append(
                    f"| {short} | {drafter} | {policy} | {figures[f'{key}.all.median']:.4f} | "
                    f"{figures[f'{key}.all.worst']:.4f} ({worst_r}) | "
                    f"{figures[f'{key}.all.best']:.4f} ({best_r}) |"
                )
    return "\n".join(lines)


def depth_table(figures: Figures) -> str:
    lines = [
        "| R | autoregressive: AV | AV+D | AV+Dr | AV+D / best K≥1 "
        "| parallel: AV | AV+D | AV+Dr | AV+D / best K≥1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(key: str) -> str:
        return f"{figures[f'{key}.median']:.3f} [{figures[f'{key}.worst']:.3f}]"

    for r in CONCURRENCY:
        cells = []
        for drafter in ("autoregressive", "parallel"):
            for policy in ("AV", "AV+D", "AV+Dr"):
                cells.append(cell(f"depth.{drafter}.{policy}_vs_best.R{r}"))
            cells.append(cell(f"depth.{drafter}.AV+D_vs_best_k1.R{r}"))
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def derive(figures: Figures) -> None:
    """Figures over ranges of concurrency, from the per-R ones: ``.upto32`` (R ≤ 32) and
    ``.from64`` (R ≥ 64) worst and best of every per-R simulated ratio."""
    ranges = {
        "upto32": [r for r in CONCURRENCY if r <= 32],
        "from64": [r for r in CONCURRENCY if r >= 64],
    }
    stems = {k.rsplit(".R", 1)[0] for k in figures if re.search(r"\.R\d+\.median$", k)}
    for stem in stems:
        for name, rs in ranges.items():
            figures[f"{stem}.{name}.worst"] = min(figures[f"{stem}.R{r}.worst"] for r in rs)
            figures[f"{stem}.{name}.best"] = max(figures[f"{stem}.R{r}.best"] for r in rs)


BLOCKS: dict[str, Callable[[Figures], str]] = {
    "lockout": lockout_table,
    "memory-synthetic": memory_synthetic_table,
    "memory-traces": memory_traces_table,
    "memory-simulated": memory_sim_table,
    "depth": depth_table,
}
BLOCK = re.compile(
    r"(?P<head><!-- seed-study:(?P<name>[a-z-]+) -->\n)(?P<body>.*?)(?P<tail><!-- /seed-study -->)",
    re.S,
)


# --- docs -------------------------------------------------------------------------------------


def figure(figures: Figures, spec: str) -> str:
    key, _, fmt = spec.partition("|")
    if key not in figures:
        raise KeyError(f"seed-study span {spec!r}: no figure {key!r} in {RESULTS.name}")
    value = figures[key]
    if fmt.endswith("%"):  # a ratio shown as a signed percentage change
        return format((value - 1.0) * 100.0, fmt[:-1]) + "%"
    return format(value, fmt)


def stale_spans(text: str, figures: Figures) -> list[str]:
    """Each span or generated table in ``text`` that disagrees with ``figures``."""
    stale = [
        f"{m['spec']}: shows {m['value']!r}, {RESULTS.name} gives {figure(figures, m['spec'])!r}"
        for m in SPAN.finditer(text)
        if m["value"] != figure(figures, m["spec"])
    ]
    stale += [
        f"table {m['name']}: differs from what {RESULTS.name} gives"
        for m in BLOCK.finditer(text)
        if m["body"] != BLOCKS[m["name"]](figures) + "\n"
    ]
    return stale


def fill(text: str, figures: Figures) -> str:
    text = BLOCK.sub(lambda m: m["head"] + BLOCKS[m["name"]](figures) + "\n" + m["tail"], text)
    return SPAN.sub(lambda m: f"<!--s:{m['spec']}-->{figure(figures, m['spec'])}<!--/s-->", text)


def update_docs(figures: Figures) -> None:
    for name in DOC_FILES:
        path = ROOT / name
        text = path.read_text()
        filled = fill(text, figures)
        if filled != text:
            path.write_text(filled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument(
        "--only", nargs="*", choices=["lockout", "synthetic", "traces", "simulate"], default=None
    )
    parser.add_argument("--update-docs", action="store_true", help="fill the docs' spans")
    parser.add_argument(
        "--docs-only", action="store_true", help="fill the spans from the saved JSON, run nothing"
    )
    args = parser.parse_args()
    if args.docs_only:
        update_docs(json.loads(RESULTS.read_text())["figures"])
        return
    figures: Figures = json.loads(RESULTS.read_text())["figures"] if RESULTS.exists() else {}
    prefixes = {
        "lockout": ("lockout.", "switch."),
        "synthetic": ("memory.",),
        "traces": ("trace.",),
        "simulate": ("sim.", "depth."),
    }
    sections: dict[str, tuple[Callable[[], None], list[str]]] = {
        "lockout": (lambda: lockout(args.seeds, figures), ["lockout"]),
        "synthetic": (lambda: memory_synthetic(args.seeds, figures), ["memory-synthetic"]),
        "traces": (lambda: memory_traces(args.resamples, figures), ["memory-traces"]),
        "simulate": (lambda: simulations(args.seeds, figures), ["memory-simulated", "depth"]),
    }
    started = time.perf_counter()
    for name, (run, tables) in sections.items():
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        for key in [k for k in figures if k.startswith(prefixes[name])]:
            del figures[key]  # this run replaces the section's figures
        run()
        for table in tables:
            print(f"\n## {table}\n\n{BLOCKS[table](figures)}")
        print(f"\n({time.perf_counter() - t0:.0f} s)", flush=True)
    derive(figures)
    meta: dict[str, Any] = {"seeds": args.seeds, "resamples": args.resamples}
    RESULTS.write_text(
        json.dumps({"meta": meta, "figures": dict(sorted(figures.items()))}, indent=1) + "\n"
    )
    print(f"\n(total {time.perf_counter() - started:.0f} s; figures in {RESULTS})")
    if args.update_docs:
        update_docs(figures)


if __name__ == "__main__":
    main()
