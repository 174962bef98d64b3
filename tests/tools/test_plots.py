"""What the PNG plots draw, read back from the figures: the reliability diagram hides bins of
few drafts and shows every bin's count; the Pareto panel keeps every adaptive curve visible
where they coincide, keeps the R labels off every curve, labels more than two log ticks, and
gives every curve a colour far from every other."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_rgb  # noqa: E402

from av_core.tools.evaluate import ONLINE, RAW, Evaluation, evaluate_trace  # noqa: E402
from av_core.tools.plots import (  # noqa: E402
    MIN_BIN_DRAFTS,
    _pyplot,
    pareto_figure,
    reliability_figure,
)
from av_core.tools.simulate import Simulation, simulate_trace  # noqa: E402
from av_core.tools.trace import load_shipped_trace  # noqa: E402

CONCURRENCY = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


@pytest.fixture(scope="module")
def evaluation() -> Evaluation:
    return evaluate_trace(load_shipped_trace())


@pytest.fixture(scope="module", params=["parallel", "autoregressive"])
def simulation(request: pytest.FixtureRequest) -> Simulation:
    return simulate_trace(
        load_shipped_trace(), drafter=request.param, concurrency=CONCURRENCY, steps=100
    )


@pytest.fixture(scope="module")
def pareto(simulation: Simulation) -> Iterator[Any]:
    fig = pareto_figure(simulation)
    fig.canvas.draw()
    yield fig
    _pyplot().close(fig)


def bins(p: np.ndarray, n_bins: int = 15) -> list[np.ndarray]:
    """Indices of the predictions in each of 15 equal bins: (lo, hi], the first also [0, hi]."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    out = []
    for i in range(n_bins):
        upper = p <= edges[i + 1]
        out.append(np.flatnonzero(upper if i == 0 else upper & (p > edges[i])))
    return out


def test_reliability_hides_sparse_bins_and_shows_every_count(evaluation: Evaluation) -> None:
    fig = reliability_figure(evaluation)
    try:
        top, counts_ax = fig.get_axes()
        lines = {line.get_label().split(" (ECE")[0]: line for line in top.get_lines()}
        for name in (ONLINE, RAW):
            p = np.asarray(evaluation.scores[name], dtype=np.float64)
            y = np.asarray(evaluation.labels, dtype=np.float64)
            members = bins(p)
            counts = [len(m) for m in members]
            kept = [m for m in members if len(m) >= MIN_BIN_DRAFTS]
            np.testing.assert_allclose(lines[name].get_xdata(), [p[m].mean() for m in kept])
            np.testing.assert_allclose(lines[name].get_ydata(), [y[m].mean() for m in kept])
            bars = [
                patch.get_height()
                for patch in counts_ax.patches
                if patch.get_facecolor()[:3] == to_rgb(lines[name].get_color())
            ]
            assert bars == counts, name
        # The shipped trace has a sparse bin (one draft at 0.27 drew a plunge to 0.0), and
        # most drafts in the top bin: both are what the count panel is for.
        online = [len(m) for m in bins(np.asarray(evaluation.scores[ONLINE]))]
        assert any(0 < n < MIN_BIN_DRAFTS for n in online)
        assert online[-1] > sum(online) / 3
        assert counts_ax.get_yscale() == "log"
    finally:
        _pyplot().close(fig)


def lab(color: Any) -> np.ndarray:
    """CIELAB (D65) of an sRGB colour, from the standard formulas."""
    rgb = np.array(to_rgb(color))
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    matrix = np.array(
        [[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]
    )
    xyz = matrix @ linear / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_every_curve_has_a_colour_far_from_every_other(pareto: Any) -> None:
    left = pareto.get_axes()[0]
    curves = {line.get_label(): line.get_color() for line in left.get_lines()}
    assert {"K=0", "K=1", "K=2", "K=3", "K=4", "adaptive verification (AV)"} <= set(curves)
    for (a, ca), (b, cb) in itertools.combinations(curves.items(), 2):
        delta = float(np.linalg.norm(lab(ca) - lab(cb)))
        assert delta >= 35.0, (a, ca, b, cb, delta)


def test_coinciding_adaptive_curves_are_stacked_widest_first(pareto: Any) -> None:
    for ax in pareto.get_axes():
        adaptive = sorted(
            (
                line
                for line in ax.get_lines()
                if "AV" in line.get_label() and "vLLM" not in line.get_label()
            ),
            key=lambda line: line.get_zorder(),
        )
        assert len(adaptive) == 3
        for lower, upper in itertools.pairwise(adaptive):
            assert upper.get_linewidth() < lower.get_linewidth(), (lower, upper)
            assert upper.get_markersize() < lower.get_markersize(), (lower, upper)


def _touches(box: Any, line: Any, renderer: Any) -> bool:
    """Whether ``line`` (its segments and its markers, in display space) enters ``box``."""
    xy = line.get_transform().transform(line.get_xydata())
    pixels = renderer.points_to_pixels(1.0)
    pad = line.get_linewidth() * pixels / 2
    x0, x1, y0, y1 = box.x0 - pad, box.x1 + pad, box.y0 - pad, box.y1 + pad
    if line.get_linestyle() not in ("None", " ", ""):
        for (ax_, ay), (bx, by) in itertools.pairwise(xy):
            t = np.linspace(0.0, 1.0, int(max(abs(bx - ax_), abs(by - ay))) + 2)
            px, py = ax_ + (bx - ax_) * t, ay + (by - ay) * t
            if np.any((px > x0) & (px < x1) & (py > y0) & (py < y1)):
                return True
    if line.get_marker() not in ("None", None, "", " "):
        half = line.get_markersize() * pixels / 2
        for px, py in xy:
            if (
                px + half > box.x0
                and px - half < box.x1
                and py + half > box.y0
                and py - half < box.y1
            ):
                return True
    return False


def test_concurrency_labels_touch_no_curve(pareto: Any) -> None:
    renderer = pareto.canvas.get_renderer()
    left = pareto.get_axes()[0]
    labels = [t for t in left.texts if t.get_text() in {str(c) for c in CONCURRENCY}]
    assert sorted(int(t.get_text()) for t in labels) == CONCURRENCY
    frame = left.get_window_extent(renderer)
    for label in labels:
        box = label.get_window_extent(renderer)
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1, label.get_text()  # inside the axes
        assert frame.y0 <= box.y0 and box.y1 <= frame.y1, label.get_text()
        for line in left.get_lines():
            assert not _touches(box, line, renderer), (label.get_text(), line.get_label())


def test_both_log_axes_label_more_than_two_ticks(pareto: Any) -> None:
    left = pareto.get_axes()[0]
    for axis, limits in ((left.xaxis, left.get_xlim()), (left.yaxis, left.get_ylim())):
        low, high = sorted(limits)
        shown = [
            label.get_text()
            for label, where in zip(axis.get_ticklabels(), axis.get_ticklocs(), strict=True)
            if low <= where <= high and label.get_text()
        ]
        assert len(shown) >= 3, shown
        assert "$" not in "".join(shown)  # plain numbers, not 10^k


def test_the_coefficient_plot_says_what_its_interval_is(
    evaluation: Evaluation, tmp_path: Any
) -> None:
    from av_core.tools.plots import plot_trajectory

    captured: list[str] = []
    plt = _pyplot()
    original = plt.Figure.savefig

    def keep_titles(self: Any, *args: Any, **kwargs: Any) -> None:
        captured.extend(ax.get_title() for ax in self.get_axes())
        original(self, *args, **kwargs)

    plt.Figure.savefig = keep_titles  # type: ignore[method-assign]
    try:
        plot_trajectory(evaluation, tmp_path / "c.png")
    finally:
        plt.Figure.savefig = original  # type: ignore[method-assign]
    title = next(t for t in captured if t)
    assert f"rounds of {evaluation.refit_interval} observes" in title
    assert "refit every" not in title
