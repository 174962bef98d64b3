"""The results of an evaluation (:class:`Evaluation`) and how they are shown: the comparison and
fit tables, text, Markdown and JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from av_core.tools.evaluate.fits import MIN_CORRELATION_POINTS, Correlation, WorkloadFit
from av_core.tools.evaluate.online import Trajectory
from av_core.tools.evaluate.rounds import FloatArray, IntArray
from av_core.tools.metrics import CalibrationReport, reliability_curve
from av_core.tools.tables import Table, col, fixed, render, signed


@dataclass(frozen=True)
class FeatureScore:
    """One row of the comparison table."""

    name: str
    lossy: bool
    fitted: bool
    report: CalibrationReport


@dataclass(frozen=True)
class Evaluation:
    """Everything ``av-core evaluate`` prints and plots."""

    num_rows: int
    num_labeled: int
    num_rounds: int
    num_positions: int
    refit_interval: int
    batch_rounds: int
    features: list[FeatureScore]
    trajectory: Trajectory
    labels: npt.NDArray[np.int8]  # labeled drafts in decode order
    positions: IntArray
    scores: Mapping[str, FloatArray]  # feature name -> probabilities of the labeled drafts
    workloads: list[WorkloadFit]
    groups: list[WorkloadFit]
    entropy_available: bool
    fully_verified: bool
    notes: list[str] = field(default_factory=list)

    def feature(self, name: str) -> FeatureScore:
        for score in self.features:
            if score.name == name:
                return score
        raise KeyError(name)

    def to_text(self) -> str:
        return format_evaluation(self)


ONLINE = "logit(q_max), online fit"
RAW = "q_max, no fit"


def _fit_table(title: str, fits: Sequence[WorkloadFit], entropy: bool) -> Table:
    k = len(fits[0].fit.intercepts) if fits else 0
    table = Table(
        title,
        [
            col("workload", align="<"),
            col("labels"),
            col("accept", fixed(3)),
            col("slope", fixed(3)),
            *(col(f"b{i}", signed(3)) for i in range(k)),
            *([col("mean entropy", fixed(3))] if entropy else []),
        ],
    )
    for item in fits:
        table.add(
            item.name,
            item.fit.num_labels,
            item.acceptance_rate,
            item.fit.slope,
            *(float(b) for b in item.fit.intercepts),
            *([item.mean_entropy] if entropy else []),
        )
    return table


def _agreement(evaluation: Evaluation) -> Table:
    """Slope and first intercept across workloads and prompt groups, and how they correlate
    with the mean draft entropy (only with >= 3 fits: two points always give r = ±1)."""
    table = Table(
        "slope and first intercept across fits, against the mean draft entropy",
        [
            col("fits", align="<"),
            col("n"),
            col("slope min", fixed(3)),
            col("slope max", fixed(3)),
            col("b0 min", signed(3)),
            col("b0 max", signed(3)),
            col("r(b0, entropy)", signed(2)),
            col("r(b0) 95% CI", align="<"),
            col("r(slope, entropy)", signed(2)),
            col("r(slope) 95% CI", align="<"),
        ],
    )

    def interval(c: Correlation) -> str:
        if math.isnan(c.low):
            return "n/a"
        return f"{signed(2)(c.low)} .. {signed(2)(c.high)}"

    for title, fits in (("workloads", evaluation.workloads), ("prompt groups", evaluation.groups)):
        if len(fits) < 2:
            continue
        slopes = [f.fit.slope for f in fits]
        first = [float(f.fit.intercepts[0]) for f in fits]
        entropy = [f.mean_entropy if evaluation.entropy_available else math.nan for f in fits]
        first_r, slope_r = Correlation.of(first, entropy), Correlation.of(slopes, entropy)
        table.add(
            title,
            len(fits),
            min(slopes),
            max(slopes),
            min(first),
            max(first),
            first_r.r,
            interval(first_r),
            slope_r.r,
            interval(slope_r),
        )
    table.notes.append(
        "r: Pearson correlation over the fits with an entropy, n/a with fewer than "
        f"{MIN_CORRELATION_POINTS} (two points always give r = ±1) or without an entropy "
        "column; 95% CI: Fisher z, n/a below 4 fits."
    )
    fits = evaluation.groups if len(evaluation.groups) >= 4 else evaluation.workloads
    if evaluation.entropy_available and len(fits) >= 4:
        slopes = [f.fit.slope for f in fits]
        intercepts = [float(f.fit.intercepts[0]) for f in fits]
        first_corr = Correlation.of(intercepts, [f.mean_entropy for f in fits])
        tracks = first_corr.high < 0.0 if not math.isnan(first_corr.high) else False
        table.notes.append(
            f"verdict vs the write-up (slope 0.51-0.55, first intercept vs entropy r = -0.89): "
            f"slope spread {max(slopes) - min(slopes):.2f} against first-intercept spread "
            f"{max(intercepts) - min(intercepts):.2f}; first intercept "
            + (
                "tracks entropy (r < 0, interval excludes 0)"
                if tracks
                else "does not clearly track entropy here"
            )
        )
    else:
        table.notes.append("too few workloads or groups for a verdict (need >= 4 fits)")
    return table


def evaluation_preamble(evaluation: Evaluation) -> list[str]:
    """The lines above the tables: what was replayed and how."""
    e = evaluation
    observes = -(-e.num_rounds // e.batch_rounds)
    return [
        f"trace: {e.num_rows} rows, {e.num_rounds} drafting rounds, {e.num_labeled} labeled "
        f"drafts, K = {e.num_positions}",
        f"prequential replay: {e.batch_rounds} round(s) per observe, rounds of "
        f"{e.refit_interval} observes ({observes // e.refit_interval} round ends, "
        f"{e.trajectory.rounds.shape[0]} refits in all); every draft is scored with the "
        "prediction made at draft time",
    ]


def evaluation_tables(evaluation: Evaluation) -> list[Table]:
    """Every table of :func:`format_evaluation`, titled (also for Markdown and JSON)."""
    e = evaluation
    comparison = Table(
        "feature comparison (prequential)",
        [
            col("feature", align="<"),
            col("AUC", fixed(4)),
            col("log-loss", fixed(4)),
            col("ECE", fixed(4)),
            col("AUC k>=1", fixed(4)),
            col("log-loss k>=1", fixed(4)),
            col("ECE k>=1", fixed(4)),
        ],
    )
    for score in e.features:
        o, later = score.report.overall, score.report.excluding_first_position
        comparison.add(
            score.name,
            o.auc,
            o.log_loss,
            o.ece,
            *((later.auc, later.log_loss, later.ece) if later is not None else (None,) * 3),
        )
    comparison.notes.append(
        "k>=1: excluding draft position 0. LOSSY: reads the sampled token, not usable for "
        "deciding what to verify."
    )

    positions = sorted(e.features[0].report.per_position)
    per_position = Table(
        "per-position AUC",
        [col("feature", align="<"), *(col(f"k={k}", fixed(4)) for k in positions)],
    )
    for score in e.features:
        per = score.report.per_position
        per_position.add(score.name, *(per[k].auc if k in per else None for k in positions))

    counts = e.features[0].report.per_position
    labels = Table(
        "labels per draft position",
        [col("position"), col("labels"), col("acceptance rate", fixed(3))],
    )
    for k in positions:
        labels.add(k, counts[k].count, counts[k].observed_rate)

    t = e.trajectory
    k = t.intercepts.shape[1] if t.intercepts.ndim == 2 else 0
    coefficients = Table(
        f"online coefficients ({ONLINE}), after refit",
        [col("round"), col("slope", fixed(3)), *(col(f"b{i}", signed(3)) for i in range(k))],
    )
    if t.rounds.shape[0]:
        picks = sorted(
            set(np.linspace(0, t.rounds.shape[0] - 1, min(8, t.rounds.shape[0])).astype(int))
        )
        for i in picks:
            coefficients.add(int(t.rounds[i]), float(t.slope[i]), *map(float, t.intercepts[i]))
    else:
        coefficients.notes.append("no refit happened (trace shorter than one refit window)")

    tables = [
        comparison,
        per_position,
        labels,
        coefficients,
        _fit_table(
            "batch fit per workload (offline IRLS on logit(q_max))",
            e.workloads,
            e.entropy_available,
        ),
        _fit_table(
            "batch fit per prompt group (each workload's prompts in contiguous groups)",
            e.groups,
            e.entropy_available,
        ),
        _agreement(e),
    ]
    tables[-1].notes.extend(f"note: {note}" for note in e.notes)
    return tables


def format_evaluation(evaluation: Evaluation) -> str:
    """The tables ``av-core evaluate`` prints, each titled, columns two spaces apart."""
    return render(evaluation_tables(evaluation), "text", evaluation_preamble(evaluation))


def evaluation_to_dict(evaluation: Evaluation) -> dict[str, object]:
    """Everything ``av-core evaluate --json`` prints: the replay's settings and the tables."""
    e = evaluation
    return {
        "num_rows": e.num_rows,
        "num_labeled": e.num_labeled,
        "num_rounds": e.num_rounds,
        "num_positions": e.num_positions,
        "refit_interval": e.refit_interval,
        "batch_rounds": e.batch_rounds,
        "num_refits": int(e.trajectory.rounds.shape[0]),
        "fully_verified": e.fully_verified,
        "notes": list(e.notes),
        "tables": [t.to_dict() for t in evaluation_tables(e)],
    }


def reliability_data(
    evaluation: Evaluation, names: Sequence[str]
) -> dict[str, tuple[FloatArray, FloatArray, npt.NDArray[np.int64]]]:
    """(mean predicted, observed rate, count) per bin for each named feature."""
    out = {}
    for name in names:
        curve = reliability_curve(evaluation.labels, evaluation.scores[name])
        out[name] = (curve.mean_predicted, curve.observed_rate, curve.counts)
    return out
