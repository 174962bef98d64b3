"""The estimator-memory study: how the memory discount γ fares on every criterion at once.

For each γ of vLLM's update (``update="vllm"``; γ = 0 is vLLM's memoryless update), the
update this study chose the memory for (the map update's own memory: docs/estimator.md):

1. real traces, scored prequentially (each draft by the coefficients in force when it was
   drafted, ``av_core.tools.evaluate``): AUC, log-loss and ECE overall and per draft position;
2. coefficient jitter on a stationary synthetic workload (2,560 observations per round): the
   standard deviation of every coefficient across 35 rounds after 15 warm-up rounds;
3. drift: after 30 rounds of a high-acceptance workload, rounds of a low-acceptance one until
   the log-loss is within 5% of the post-switch optimum;
4. simulated throughput (``av_core.tools.simulate``, gpu-like cost model) of adaptive verification,
   with and without drafting-depth control, at concurrency 1…512, for both drafter kinds.

Prints Markdown. ``python scripts/memory_study.py [--traces A.csv.gz B.csv.gz] [--quick]``;
without ``--traces`` it uses the traces shipped in the package.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np

from av_core import AcceptanceEstimator
from av_core.tools.evaluate import ONLINE, evaluate_trace
from av_core.tools.simulate import simulate_trace
from av_core.tools.synthetic import SyntheticWorkload, labeled_log_loss, refit_rounds
from av_core.tools.trace import SHIPPED_TRACES, DraftTrace, read_trace

STATIONARY = SyntheticWorkload(slope=0.55, intercepts=(1.4, 0.9, 0.5, 0.1))
HIGH = SyntheticWorkload(slope=0.55, intercepts=(2.0, 1.5, 1.0, 0.5))
LOW = SyntheticWorkload(slope=0.55, intercepts=(-0.5, -1.0, -1.5, -2.0))
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def shipped_traces() -> list[Path]:
    folder = resources.files("av_core").joinpath("data")
    return [Path(str(folder.joinpath(name))) for name in SHIPPED_TRACES]


def jitter(gamma: float, seed: int = 1) -> np.ndarray:
    est = AcceptanceEstimator(4, memory=gamma, update="vllm")
    return refit_rounds(est, STATIONARY, 50, np.random.default_rng(seed))[15:].std(axis=0)


def rounds_to_recover(gamma: float, seed: int = 2) -> int:
    est = AcceptanceEstimator(4, memory=gamma, update="vllm")
    rng = np.random.default_rng(seed)
    refit_rounds(est, HIGH, 30, rng)
    optimum = labeled_log_loss(None, LOW)
    for r in range(1, 60):
        refit_rounds(est, LOW, 1, rng)
        if labeled_log_loss(est, LOW) <= 1.05 * optimum:
            return r
    return 60


def trace_rows(name: str, trace: DraftTrace, gammas: list[float]) -> list[str]:
    rows = []
    for gamma in gammas:
        report = evaluate_trace(trace, memory=gamma, update="vllm").feature(ONLINE).report
        o = report.overall
        per = report.per_position
        rows.append(
            f"| {name} | {gamma:g} | {o.auc:.4f} | {o.log_loss:.4f} | {o.ece:.4f} | "
            + " ".join(f"{per[k].auc:.3f}" for k in sorted(per))
            + " | "
            + " ".join(f"{per[k].log_loss:.3f}" for k in sorted(per))
            + " | "
            + " ".join(f"{per[k].ece:.3f}" for k in sorted(per))
            + " |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="*", type=Path, default=None)
    parser.add_argument("--gammas", default="0,0.5,0.8,0.9,0.95")
    parser.add_argument("--quick", action="store_true", help="fewer simulated steps")
    args = parser.parse_args()
    gammas = [float(g) for g in args.gammas.split(",")]
    paths = args.traces or shipped_traces()
    traces = {p.name.removesuffix(".csv.gz"): read_trace(p) for p in paths}
    started = time.perf_counter()

    print("## Real traces, prequential\n")
    print(
        "| trace | γ | AUC | log-loss | ECE | AUC by position | log-loss by position "
        "| ECE by position |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, trace in traces.items():
        for row in trace_rows(name, trace, gammas):
            print(row)
    sys.stdout.flush()

    print("\n## Synthetic: jitter and drift\n")
    print(
        "| γ | std slope | std intercepts 0–3 | jitter ratio vs γ=0 (worst coefficient) "
        "| rounds to recover after a switch |"
    )
    print("|---|---|---|---|---|")
    base = jitter(0.0)
    for gamma in gammas:
        std = jitter(gamma)
        ratio = float(np.min(base / std))
        print(
            f"| {gamma:g} | {std[0]:.4f} | {' '.join(f'{v:.4f}' for v in std[1:])} | "
            f"{ratio:.1f}× | {rounds_to_recover(gamma)} |"
        )
    sys.stdout.flush()

    print("\n## Simulated throughput against γ = 0 (worst and best ratio over R = 1…512)\n")
    print(
        "| trace | drafter | γ | AV: worst (R) | AV: best (R) | AV+D: worst (R) | AV+D: best (R) |"
    )
    print("|---|---|---|---|---|---|---|")
    steps = 300 if args.quick else 1000
    for name, trace in traces.items():
        for drafter in ("parallel", "autoregressive"):
            runs = {
                gamma: simulate_trace(
                    trace,
                    drafter=drafter,  # type: ignore[arg-type]
                    concurrency=CONCURRENCY,
                    steps=steps,
                    depth_control=("batch",),
                    memory=gamma,
                    update="vllm",
                )
                for gamma in gammas
            }
            for gamma in gammas[1:]:
                cells = []
                for policy in ("AV", "AV+D"):
                    ratios = {
                        c: runs[gamma].adaptive(c, policy).throughput
                        / runs[0.0].adaptive(c, policy).throughput
                        for c in CONCURRENCY
                    }
                    worst = min(ratios, key=lambda c: ratios[c])
                    best = max(ratios, key=lambda c: ratios[c])
                    cells += [f"{ratios[worst]:.4f} ({worst})", f"{ratios[best]:.4f} ({best})"]
                print(f"| {name} | {drafter} | {gamma:g} | " + " | ".join(cells) + " |")
            sys.stdout.flush()
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
