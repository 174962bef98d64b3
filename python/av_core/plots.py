"""PNG plots for ``av-core evaluate`` and ``av-core simulate`` (needs ``av_core[plot]``).

matplotlib is optional: :func:`plots_available` says whether it is installed, and the commands
print their tables and skip the plots when it is not. Each function writes one PNG and returns
its path.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from av_core.evaluate import ONLINE, RAW, Evaluation
from av_core.metrics import reliability_curve
from av_core.simulate import Simulation


def plots_available() -> bool:
    """True when matplotlib can be imported."""
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_reliability(evaluation: Evaluation, path: Path, names: Sequence[str] = ()) -> Path:
    """Reliability diagram: mean prediction against observed acceptance per bin."""
    plt = _pyplot()
    chosen = list(names) or [n for n in (ONLINE, RAW) if n in evaluation.scores]
    fig, ax = plt.subplots(figsize=(5.5, 5.0))
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect")
    for name in chosen:
        curve = reliability_curve(evaluation.labels, evaluation.scores[name])
        occupied = curve.counts > 0
        ece = evaluation.feature(name).report.overall.ece
        ax.plot(
            curve.mean_predicted[occupied],
            curve.observed_rate[occupied],
            marker="o",
            label=f"{name} (ECE {ece:.4f})",
        )
    ax.set_xlabel("predicted acceptance probability")
    ax.set_ylabel("observed acceptance rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(f"Reliability, {evaluation.num_labeled} labeled drafts (prequential)")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_position_auc(evaluation: Evaluation, path: Path) -> Path:
    """AUC per draft position for every feature."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for score in evaluation.features:
        if score.name.startswith("oracle"):
            continue
        per = score.report.per_position
        ks = sorted(per)
        style = "--" if score.lossy else "-"
        ax.plot(ks, [per[k].auc for k in ks], style, marker="o", label=score.name)
    ax.set_xlabel("draft position k (0-based)")
    ax.set_ylabel("AUC")
    ax.set_xticks(range(evaluation.num_positions))
    ax.set_title("Per-position AUC (dashed: lossy, not usable)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_trajectory(evaluation: Evaluation, path: Path) -> Path:
    """Slope and intercepts of the online estimator after each refit."""
    plt = _pyplot()
    t = evaluation.trajectory
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.5, 5.5), sharex=True)
    top.plot(t.rounds, t.slope, marker=".", color="black")
    top.set_ylabel("slope")
    top.set_title(f"Online coefficients, refit every {evaluation.refit_interval} observes")
    for k in range(t.intercepts.shape[1] if t.intercepts.ndim == 2 else 0):
        bottom.plot(t.rounds, t.intercepts[:, k], marker=".", label=f"intercept k={k}")
    bottom.set_xlabel("drafting rounds observed")
    bottom.set_ylabel("intercept")
    bottom.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_pareto(simulation: Simulation, path: Path) -> Path:
    """Throughput against interactivity: one curve per policy across concurrency."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5.0))
    concurrency = list(simulation.results)
    names = [r.policy for r in simulation.results[concurrency[0]]]
    for index, name in enumerate(names):
        row = [next(r for r in simulation.results[c] if r.policy == name) for c in concurrency]
        x = np.array([r.per_request for r in row])
        y = np.array([r.throughput for r in row])
        adaptive = {
            "AV": ("crimson", "adaptive verification"),
            "AV+D": ("darkorange", "AV + drafting depth (batch)"),
            "AV+Dr": ("goldenrod", "AV + drafting depth (per request)"),
        }
        if name in adaptive:
            color, label = adaptive[name]
            ax.plot(x, y, "-o", color=color, linewidth=2.2, label=label)
            if name == "AV":
                for c, xi, yi in zip(concurrency, x, y, strict=True):
                    ax.annotate(
                        str(c), (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points"
                    )
        else:
            ax.plot(x, y, "--.", color=plt.cm.viridis(index / max(len(names) - 1, 1)), label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens per ms per request (interactivity)")
    ax.set_ylabel("output tokens per ms (throughput)")
    ax.set_title(f"Throughput vs interactivity, {simulation.drafter} drafter (labels: R)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def evaluation_plots(evaluation: Evaluation, out: Path) -> list[Path]:
    """The three plots of ``av-core evaluate`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_reliability(evaluation, out / "reliability.png"),
        plot_position_auc(evaluation, out / "position_auc.png"),
        plot_trajectory(evaluation, out / "coefficients.png"),
    ]


def simulation_plots(simulation: Simulation, out: Path, suffix: str = "") -> list[Path]:
    """The Pareto plot of ``av-core simulate`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    return [plot_pareto(simulation, out / f"pareto{suffix}.png")]


__all__ = [
    "evaluation_plots",
    "plot_pareto",
    "plot_position_auc",
    "plot_reliability",
    "plot_trajectory",
    "plots_available",
    "simulation_plots",
]
