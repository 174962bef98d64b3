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

from av_core.tools.evaluate import ONLINE, RAW, Evaluation
from av_core.tools.metrics import reliability_curve
from av_core.tools.simulate import Simulation


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


#: Marker and line style per feature, in the order the features are listed: no two alike, so
#: lines that coincide (raw q_max and the batch fit rank drafts identically at each position,
#: both being increasing maps of logit(q_max)) stay visible.
_FEATURE_STYLES = (
    ("o", 9, 2.6),
    ("s", 7, 1.8),
    ("^", 6, 1.2),
    ("D", 5, 1.4),
    ("v", 6, 1.4),
    ("P", 6, 1.4),
    ("X", 6, 1.4),
)


def plot_position_auc(evaluation: Evaluation, path: Path) -> Path:
    """AUC per draft position for every feature, each with its own marker, and the features
    spread a little along x so that equal values do not hide one another."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 4.8))
    shown = [score for score in evaluation.features if not score.name.startswith("oracle")]
    spread = 0.05
    for index, score in enumerate(shown):
        per = score.report.per_position
        ks = sorted(per)
        marker, size, width = _FEATURE_STYLES[index % len(_FEATURE_STYLES)]
        offset = (index - (len(shown) - 1) / 2) * spread
        style = "--" if score.lossy else "-"
        ax.plot(
            [k + offset for k in ks],
            [per[k].auc for k in ks],
            style,
            marker=marker,
            markersize=size,
            linewidth=width,
            markerfacecolor="none" if index % 2 == 0 else None,
            label=score.name,
            zorder=2 + index,
        )
    ax.set_xlabel("draft position k (0-based; features spread slightly for legibility)")
    ax.set_ylabel("AUC")
    ax.set_xticks(range(evaluation.num_positions))
    ax.set_title("Per-position AUC (dashed: lossy, not usable)")
    ax.grid(True, axis="y", alpha=0.3)
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


#: Colour, marker, line style, width and label of each adaptive policy: AV+D and AV+Dr often
#: coincide, so they differ in every attribute (the thinner, dashed one is drawn on top).
_ADAPTIVE_STYLES = {
    "AV": ("crimson", "o", "-", 2.4, "adaptive verification (AV)"),
    "AV+D": ("darkorange", "s", "-", 3.2, "AV + drafting depth, batch (AV+D)"),
    "AV+Dr": ("black", "^", ":", 1.6, "AV + drafting depth, per request (AV+Dr)"),
}
_PEER_STYLES = {
    "SGL-EMA": ("tab:purple", "v"),
    "TRT": ("tab:brown", "<"),
    "vLLM-AV": ("tab:pink", ">"),
    "oracle": ("0.3", "*"),
}


def _policy_names(simulation: Simulation) -> list[str]:
    first = simulation.results[next(iter(simulation.results))]
    return [r.policy for r in first]


def _draw_policy(ax: Any, plt: Any, name: str, index: int, count: int, x: Any, y: Any) -> None:
    if name in _ADAPTIVE_STYLES:
        color, marker, style, width, label = _ADAPTIVE_STYLES[name]
        ax.plot(
            x,
            y,
            linestyle=style,
            marker=marker,
            color=color,
            linewidth=width,
            markersize=4 + width,
            markerfacecolor="none" if name == "AV+Dr" else color,
            label=label,
            zorder=5 + list(_ADAPTIVE_STYLES).index(name),
        )
    elif name.split(" ")[0] in _PEER_STYLES:
        color, marker = _PEER_STYLES[name.split(" ")[0]]
        ax.plot(x, y, "-.", marker=marker, color=color, linewidth=1.2, label=name, zorder=3)
    else:
        color = plt.cm.viridis(index / max(count - 1, 1))
        ax.plot(x, y, "--", marker=".", color=color, linewidth=1.0, label=name, zorder=2)


def _log_axis_ticks(axis: Any, values: Any) -> None:
    """Major ticks at 1, 2 and 5 times powers of ten within the data, labelled plainly
    (0.05, 0.1, 0.2); no minor labels, so labels never overlap."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    low, high = float(np.min(values)), float(np.max(values))
    ticks = [
        m * 10.0**e
        for e in range(int(np.floor(np.log10(low))) - 1, int(np.ceil(np.log10(high))) + 1)
        for m in (1, 2, 5)
        if low / 1.3 <= m * 10.0**e <= high * 1.3
    ]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


#: Concurrency labels on the Pareto panel sit above every curve.
_LABEL_ZORDER = 20
#: Entries per row of the shared legend under the two Pareto panels.
_LEGEND_COLUMNS = 5


def pareto_figure(simulation: Simulation) -> Any:
    """The figure :func:`plot_pareto` writes (the caller closes it): two panels sharing one
    legend below them, outside both axes, so that no entry covers a curve."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13.0, 5.6))
    concurrency = list(simulation.results)
    names = _policy_names(simulation)
    best = np.array([simulation.best_fixed(c).throughput for c in concurrency])
    relative_values: list[tuple[str, Any]] = []
    for index, name in enumerate(names):
        row = [simulation.result(c, name) for c in concurrency]
        x = np.array([r.per_request for r in row])
        y = np.array([r.throughput for r in row])
        _draw_policy(left, plt, name, index, len(names), x, y)
        if name == "AV":
            for c, xi, yi in zip(concurrency, x, y, strict=True):
                left.annotate(
                    str(c),
                    (xi, yi),
                    fontsize=7,
                    xytext=(0, -11),
                    textcoords="offset points",
                    ha="center",
                    color="crimson",
                    zorder=_LABEL_ZORDER,
                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
                )
        ratio = y / best
        relative_values.append((name, ratio))
        _draw_policy(right, plt, name, index, len(names), concurrency, ratio)
    every_x = np.array([simulation.result(c, n).per_request for c in concurrency for n in names])
    left.set_xscale("log")
    left.set_yscale("log")
    _log_axis_ticks(left.xaxis, every_x)
    left.set_xlabel("tokens per ms per request (interactivity)")
    left.set_ylabel("output tokens per ms (throughput)")
    left.set_title(f"Throughput vs interactivity, {simulation.drafter} drafter (labels: R)")
    left.grid(True, which="major", alpha=0.3)

    right.axhline(1.0, color="0.5", linewidth=1.0, linestyle="-", zorder=1)
    right.set_xscale("log", base=2)
    right.set_xticks(concurrency)
    right.set_xticklabels([str(c) for c in concurrency], fontsize=8)
    low = min(float(np.min(v)) for _, v in relative_values)
    high = max(float(np.max(v)) for _, v in relative_values)
    right.set_ylim(max(0.0, min(low, 0.95) - 0.05), high + 0.05)
    right.set_xlabel("concurrent requests R")
    right.set_ylabel("throughput / best fixed K >= 1 at that R")
    right.set_title("Relative throughput (1 = the best fixed K >= 1 at that R)")
    right.grid(True, alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    rows = -(-len(labels) // _LEGEND_COLUMNS)
    fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=min(_LEGEND_COLUMNS, len(labels)),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0.0, 0.035 * rows + 0.01, 1.0, 1.0))
    return fig


def plot_pareto(simulation: Simulation, path: Path) -> Path:
    """Two panels: throughput against interactivity (one curve per policy across
    concurrency), and each policy's throughput relative to the best fixed K >= 1 at every
    concurrency (the ratio the adaptive policies are judged by; K = 0 shows where not
    speculating beats every K >= 1); one legend below both."""
    plt = _pyplot()
    fig = pareto_figure(simulation)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


#: The files :func:`evaluation_plots` writes: reliability, per-position AUC, coefficients.
EVALUATION_PLOTS = ("reliability.png", "position_auc.png", "coefficients.png")


def simulation_plot_names(suffix: str = "") -> tuple[str, ...]:
    """The files :func:`simulation_plots` writes with ``suffix``."""
    return (f"pareto{suffix}.png",)


def evaluation_plots(evaluation: Evaluation, out: Path) -> list[Path]:
    """The three plots of ``av-core evaluate`` in ``out`` (:data:`EVALUATION_PLOTS`)."""
    out.mkdir(parents=True, exist_ok=True)
    reliability, auc, coefficients = (out / name for name in EVALUATION_PLOTS)
    return [
        plot_reliability(evaluation, reliability),
        plot_position_auc(evaluation, auc),
        plot_trajectory(evaluation, coefficients),
    ]


def simulation_plots(simulation: Simulation, out: Path, suffix: str = "") -> list[Path]:
    """The plot of ``av-core simulate`` in ``out``: the Pareto panel and the
    relative-throughput panel."""
    out.mkdir(parents=True, exist_ok=True)
    (pareto,) = simulation_plot_names(suffix)
    return [plot_pareto(simulation, out / pareto)]


__all__ = [
    "EVALUATION_PLOTS",
    "evaluation_plots",
    "pareto_figure",
    "plot_pareto",
    "plot_position_auc",
    "plot_reliability",
    "plot_trajectory",
    "plots_available",
    "simulation_plot_names",
    "simulation_plots",
]
