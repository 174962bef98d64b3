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


#: Bins of the reliability diagram holding fewer drafts than this are not drawn: a bin of one
#: draft is a point at 0 or 1 that says nothing about calibration. The bar chart under the
#: diagram shows every bin's count, so where the drafts sit is still visible.
MIN_BIN_DRAFTS = 20


def reliability_figure(evaluation: Evaluation, names: Sequence[str] = ()) -> Any:
    """The figure :func:`plot_reliability` writes (the caller closes it): mean prediction
    against observed acceptance per bin, bins of at least :data:`MIN_BIN_DRAFTS` drafts, and
    under it the number of drafts in every bin, per feature."""
    plt = _pyplot()
    chosen = list(names) or [n for n in (ONLINE, RAW) if n in evaluation.scores]
    fig, (ax, counts_ax) = plt.subplots(
        2, 1, figsize=(5.5, 6.4), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect")
    width = 1.0 / max(len(chosen), 1)
    for index, name in enumerate(chosen):
        curve = reliability_curve(evaluation.labels, evaluation.scores[name])
        drawn = curve.counts >= MIN_BIN_DRAFTS
        ece = evaluation.feature(name).report.overall.ece
        (line,) = ax.plot(
            curve.mean_predicted[drawn],
            curve.observed_rate[drawn],
            marker="o",
            label=f"{name} (ECE {ece:.4f})",
        )
        left = curve.bin_edges[:-1]
        bin_width = np.diff(curve.bin_edges)
        counts_ax.bar(
            left + bin_width * width * index,
            curve.counts,
            width=bin_width * width,
            align="edge",
            color=line.get_color(),
            label=name,
        )
    ax.set_ylabel("observed acceptance rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(
        f"Reliability, {evaluation.num_labeled} labeled drafts (prequential)\n"
        f"bins of >= {MIN_BIN_DRAFTS} drafts drawn; every bin's drafts below",
        fontsize=10,
    )
    ax.legend(loc="upper left", fontsize=8)
    counts_ax.set_yscale("log")
    counts_ax.set_ylabel("drafts per bin")
    counts_ax.set_xlabel("predicted acceptance probability")
    counts_ax.axhline(MIN_BIN_DRAFTS, color="0.5", linewidth=0.8, linestyle=":")
    counts_ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_reliability(evaluation: Evaluation, path: Path, names: Sequence[str] = ()) -> Path:
    """Reliability diagram (:func:`reliability_figure`) written to ``path``."""
    plt = _pyplot()
    fig = reliability_figure(evaluation, names)
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
    top.set_title(
        f"Online coefficients after each refit (rounds of {evaluation.refit_interval} observes)"
    )
    for k in range(t.intercepts.shape[1] if t.intercepts.ndim == 2 else 0):
        bottom.plot(t.rounds, t.intercepts[:, k], marker=".", label=f"intercept k={k}")
    bottom.set_xlabel("drafting rounds observed")
    bottom.set_ylabel("intercept")
    bottom.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


#: Colour, marker, line style, width, marker size and label of each adaptive policy. AV, AV+D
#: and AV+Dr often coincide, so each is drawn narrower than the one under it (AV+D widest, at
#: the bottom; AV+Dr thinnest, dotted, on top), and every one stays visible where they meet.
_ADAPTIVE_STYLES = {
    "AV+D": ("darkorange", "s", "-", 5.0, 10.0, "AV + drafting depth, batch (AV+D)"),
    "AV": ("crimson", "o", "-", 2.2, 6.0, "adaptive verification (AV)"),
    "AV+Dr": ("black", "^", ":", 1.2, 4.0, "AV + drafting depth, per request (AV+Dr)"),
}
_PEER_STYLES = {
    "SGL-EMA": ("#7B3294", "v"),
    "TRT": ("#66A61E", "<"),
    "vLLM-AV": ("#E7298A", ">"),
    "oracle": ("0.55", "*"),
}
#: Colour and marker of fixed K = 0, 1, 2, ...: navy, sky blue, bluish green, reddish purple,
#: brown, then greys. Every two colours of the panel, adaptive and peer policies included, are
#: at least 35 apart in CIELAB (ΔE 1976), so no two curves are told apart by the marker only.
_FIXED_STYLES = (
    ("#1F3B73", "o"),
    ("#56B4E9", "s"),
    ("#009E73", "D"),
    ("#CC79A7", "^"),
    ("#8C510A", "v"),
    ("0.7", "P"),
    ("0.85", "X"),
)


def _policy_names(simulation: Simulation) -> list[str]:
    first = simulation.results[next(iter(simulation.results))]
    return [r.policy for r in first]


def _draw_policy(ax: Any, name: str, fixed: int, x: Any, y: Any) -> None:
    """One policy's curve; ``fixed``: the index of a fixed-K policy among them."""
    if name in _ADAPTIVE_STYLES:
        color, marker, style, width, size, label = _ADAPTIVE_STYLES[name]
        ax.plot(
            x,
            y,
            linestyle=style,
            marker=marker,
            color=color,
            linewidth=width,
            markersize=size,
            markerfacecolor="none" if name == "AV+Dr" else color,
            label=label,
            zorder=5 + list(_ADAPTIVE_STYLES).index(name),
        )
    elif name.split(" ")[0] in _PEER_STYLES:
        color, marker = _PEER_STYLES[name.split(" ")[0]]
        ax.plot(x, y, "-.", marker=marker, color=color, linewidth=1.2, label=name, zorder=3)
    else:
        color, marker = _FIXED_STYLES[min(fixed, len(_FIXED_STYLES) - 1)]
        ax.plot(
            x,
            y,
            "--",
            marker=marker,
            markersize=3.5,
            color=color,
            linewidth=1.1,
            label=name,
            zorder=2,
        )


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


#: Where a concurrency label may sit around its point, in points (x, y) with its alignment,
#: tried in this order and then twice and three times as far: above, right, below, left, then
#: the diagonals.
_LABEL_SPOTS = (
    ((0, 5), "center", "bottom"),
    ((6, 0), "left", "center"),
    ((0, -5), "center", "top"),
    ((-6, 0), "right", "center"),
    ((5, 4), "left", "bottom"),
    ((-5, 4), "right", "bottom"),
    ((5, -4), "left", "top"),
    ((-5, -4), "right", "top"),
)


def _line_pixels(ax: Any, renderer: Any) -> tuple[Any, Any]:
    """Every curve of ``ax`` in display space: points along its segments (one a pixel, padded
    by half its width) and the boxes of its markers, as ``(points [n, 3], boxes [m, 4])``, the
    points' third column their padding."""
    scale = renderer.points_to_pixels(1.0)
    points, boxes = [np.empty((0, 3))], [np.empty((0, 4))]
    for line in ax.get_lines():
        xy = line.get_transform().transform(line.get_xydata())
        if line.get_linestyle() not in ("None", " ", "") and len(xy) > 1:
            for start, end in zip(xy[:-1], xy[1:], strict=True):
                steps = int(np.abs(end - start).max()) + 2
                t = np.linspace(0.0, 1.0, steps)[:, None]
                along = start + (end - start) * t
                pad = np.full((steps, 1), line.get_linewidth() * scale / 2)
                points.append(np.hstack([along, pad]))
        if line.get_marker() not in ("None", None, "", " "):
            half = line.get_markersize() * scale / 2
            boxes.append(np.hstack([xy - half, xy + half]))
    return np.vstack(points), np.vstack(boxes)


def _clear(box: Any, points: Any, boxes: Any, taken: list[Any], frame: Any) -> bool:
    """Whether the display box ``box`` lies inside ``frame`` and meets no curve, marker or
    label already placed."""
    if box.x0 < frame.x0 or box.x1 > frame.x1 or box.y0 < frame.y0 or box.y1 > frame.y1:
        return False
    x, y, pad = points[:, 0], points[:, 1], points[:, 2]
    if np.any((x > box.x0 - pad) & (x < box.x1 + pad) & (y > box.y0 - pad) & (y < box.y1 + pad)):
        return False
    if np.any(
        (boxes[:, 2] > box.x0)
        & (boxes[:, 0] < box.x1)
        & (boxes[:, 3] > box.y0)
        & (boxes[:, 1] < box.y1)
    ):
        return False
    return not any(box.overlaps(other) for other in taken)


def _label_points(fig: Any, ax: Any, labels: Sequence[tuple[str, tuple[float, float]]]) -> None:
    """Each ``(text, (x, y))`` written beside its data point, at the first spot of
    :data:`_LABEL_SPOTS` where it meets no curve, marker or other label (the figure is drawn
    once to know where everything is; the last spot tried is kept if none is clear)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    points, boxes = _line_pixels(ax, renderer)
    frame = ax.get_window_extent(renderer)
    taken: list[Any] = []
    for text, xy in labels:
        label = ax.annotate(
            text,
            xy,
            xytext=(0, 0),
            textcoords="offset points",
            fontsize=7,
            color="crimson",
            zorder=_LABEL_ZORDER,
        )
        for scale in (1, 2, 3):
            for (dx, dy), ha, va in _LABEL_SPOTS:
                label.set_position((dx * scale, dy * scale))
                label.set_horizontalalignment(ha)
                label.set_verticalalignment(va)
                box = label.get_window_extent(renderer)
                if _clear(box, points, boxes, taken, frame):
                    break
            else:
                continue
            break
        taken.append(label.get_window_extent(renderer))


def pareto_figure(simulation: Simulation) -> Any:
    """The figure :func:`plot_pareto` writes (the caller closes it): two panels sharing one
    legend below them, outside both axes, so that no entry covers a curve."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13.0, 5.6))
    concurrency = list(simulation.results)
    names = _policy_names(simulation)
    best = np.array([simulation.best_fixed(c).throughput for c in concurrency])
    relative_values: list[tuple[str, Any]] = []
    fixed = [n for n in names if n not in _ADAPTIVE_STYLES and n.split(" ")[0] not in _PEER_STYLES]
    for name in names:
        row = [simulation.result(c, name) for c in concurrency]
        x = np.array([r.per_request for r in row])
        y = np.array([r.throughput for r in row])
        index = fixed.index(name) if name in fixed else 0
        _draw_policy(left, name, index, x, y)
        ratio = y / best
        relative_values.append((name, ratio))
        _draw_policy(right, name, index, concurrency, ratio)
    points = np.array(
        [
            [
                (simulation.result(c, n).per_request, simulation.result(c, n).throughput)
                for n in names
            ]
            for c in concurrency
        ]
    )
    left.set_xscale("log")
    left.set_yscale("log")
    _log_axis_ticks(left.xaxis, points[:, :, 0])
    _log_axis_ticks(left.yaxis, points[:, :, 1])
    left.margins(x=0.08, y=0.08)
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
    if "AV" in names:
        av = names.index("AV")
        _label_points(
            fig, left, [(str(c), tuple(points[i, av])) for i, c in enumerate(concurrency)]
        )
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
    "MIN_BIN_DRAFTS",
    "evaluation_plots",
    "pareto_figure",
    "plot_pareto",
    "plot_position_auc",
    "plot_reliability",
    "plot_trajectory",
    "plots_available",
    "reliability_figure",
    "simulation_plot_names",
    "simulation_plots",
]
