""":func:`evaluate_trace`: every candidate feature replayed and scored on a trace, and every
workload and prompt group fitted offline.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from av_core._native import InvalidValueError
from av_core.tools.evaluate.fits import WorkloadFit, fit_batch
from av_core.tools.evaluate.online import (
    DEFAULT_REFIT_INTERVAL,
    MAX_FEATURE,
    Trajectory,
    replay_online,
)
from av_core.tools.evaluate.report import ONLINE, RAW, Evaluation, FeatureScore
from av_core.tools.evaluate.rounds import DraftRounds, FloatArray
from av_core.tools.metrics import CalibrationReport
from av_core.tools.trace import DraftTrace


def _sigmoid(x: FloatArray) -> FloatArray:
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(x, -MAX_FEATURE, MAX_FEATURE))))


def _groups(
    rounds: DraftRounds, groups_per_workload: int
) -> list[tuple[str, npt.NDArray[np.bool_]]]:
    """Splits each workload's prompts (in first-seen order) into contiguous groups of prompts."""
    out: list[tuple[str, npt.NDArray[np.bool_]]] = []
    for workload in dict.fromkeys(rounds.workload.tolist()):
        in_workload = rounds.workload == workload
        prompts = list(dict.fromkeys(rounds.prompt_id[in_workload].tolist()))
        count = max(1, min(groups_per_workload, len(prompts)))
        for index, chunk in enumerate(np.array_split(np.arange(len(prompts)), count)):
            names = [prompts[i] for i in chunk]
            mask = in_workload & np.isin(rounds.prompt_id, names)
            out.append((f"{workload}/{index + 1}", mask))
    return out


def _fit_subset(
    name: str,
    mask: npt.NDArray[np.bool_],
    rounds: DraftRounds,
    x: FloatArray,
    entropy: FloatArray | None,
) -> WorkloadFit:
    labeled = (rounds.labels >= 0) & mask[:, None]
    positions = np.broadcast_to(np.arange(rounds.num_positions), rounds.rows.shape)[labeled]
    labels = rounds.labels[labeled].astype(np.int64)
    fit = fit_batch(x[labeled], positions.astype(np.int64), labels, rounds.num_positions)
    drafted = (rounds.rows >= 0) & mask[:, None]
    mean_entropy = math.nan
    if entropy is not None:
        # Rows without an entropy (NaN) are left out: the mean is over the rows that have one.
        values = entropy[drafted]
        values = values[np.isfinite(values)]
        mean_entropy = float(values.mean()) if values.size else math.nan
    rate = float(labels.mean()) if labels.size else math.nan
    return WorkloadFit(name, fit, mean_entropy, rate)


def evaluate_trace(
    trace: DraftTrace,
    *,
    refit_interval: int = DEFAULT_REFIT_INTERVAL,
    batch_rounds: int = 1,
    memory: float | None = None,
    update: str | None = None,
    groups_per_workload: int = 4,
    progress: Callable[[int, int, str], None] | None = None,
) -> Evaluation:
    """Prequential feature comparison, coefficient trajectory and per-workload fits.

    ``progress(done, total, status)`` is called after each feature's replay and after the
    per-workload fits."""
    if groups_per_workload < 1:
        raise InvalidValueError(f"groups_per_workload must be >= 1, got {groups_per_workload}")
    if batch_rounds < 1:
        raise InvalidValueError(f"batch_rounds must be >= 1, got {batch_rounds}")
    rounds = DraftRounds.from_trace(trace)
    labeled = rounds.labels >= 0
    if not labeled.any():
        raise InvalidValueError("trace has no labeled drafts")
    positions = np.broadcast_to(np.arange(rounds.num_positions), rounds.rows.shape)[labeled]
    labels = rounds.labels[labeled]
    x = rounds.column(trace.logit_q_max)
    notes: list[str] = []
    if not rounds.fully_verified:
        notes.append(
            "the trace was not fully verified (a trimming policy chose what was admitted): "
            "scores cover only the drafts it verified"
        )

    candidates: list[tuple[str, bool, FloatArray]] = [(ONLINE, False, x)]
    if trace.logit_q_sampled is not None:
        candidates.append(("logit(q_sampled), online [LOSSY]", True, trace.logit_q_sampled))
    if trace.top2_margin is not None:
        candidates.append(("top-2 margin, online fit", False, trace.top2_margin))
    if trace.entropy is not None:
        candidates.append(("-entropy, online fit", False, -trace.entropy))
    if trace.head_score is not None:
        head = trace.head_score
        finite = head[np.isfinite(head)]
        if finite.size and float(finite.min()) >= 0.0 and float(finite.max()) <= 1.0:
            clipped = np.clip(head, 1e-12, 1.0 - 1e-12)
            head = np.log(clipped) - np.log1p(-clipped)
        candidates.append(("head score, online fit", False, head))

    features: list[FeatureScore] = []
    scores: dict[str, FloatArray] = {}
    trajectory: Trajectory | None = None
    total = len(candidates) + 1
    for index, (name, lossy, column) in enumerate(candidates):
        matrix = column if column is x else rounds.column(column)
        if column is not x:
            missing = int(np.sum(~np.isfinite(column)))
            if missing:
                notes.append(f"{name}: {missing} rows without a value scored with feature 0")
        replay = replay_online(
            rounds,
            matrix,
            refit_interval=refit_interval,
            batch_rounds=batch_rounds,
            memory=memory,
            update=update,
        )
        if trajectory is None:
            trajectory = replay.trajectory
        probs = replay.predictions[labeled]
        scores[name] = probs
        report = CalibrationReport.from_predictions(labels, probs, positions)
        features.append(FeatureScore(name, lossy, True, report))
        if column is x:
            raw = _sigmoid(x[labeled])
            scores[RAW] = raw
            raw_report = CalibrationReport.from_predictions(labels, raw, positions)
            features.append(FeatureScore(RAW, False, False, raw_report))
            batch = fit_batch(
                x[labeled],
                positions.astype(np.int64),
                labels.astype(np.int64),
                rounds.num_positions,
            )
            in_sample = _sigmoid(batch.slope * x[labeled] + batch.intercepts[positions])
            scores["logit(q_max), batch fit (in-sample)"] = in_sample
            features.append(
                FeatureScore(
                    "logit(q_max), batch fit (in-sample)",
                    False,
                    True,
                    CalibrationReport.from_predictions(labels, in_sample, positions),
                )
            )
        if progress is not None:
            progress(index + 1, total, name)
    if trace.acceptance_probability is not None:
        oracle = rounds.column(trace.acceptance_probability, fill=0.5)[labeled]
        scores["oracle min(1, p/q) [LOSSY]"] = oracle
        features.append(
            FeatureScore(
                "oracle min(1, p/q) [LOSSY]",
                True,
                False,
                CalibrationReport.from_predictions(labels, oracle, positions),
            )
        )
    assert trajectory is not None

    entropy = rounds.column(trace.entropy, fill=math.nan) if trace.entropy is not None else None
    workloads = [
        _fit_subset(str(w), rounds.workload == w, rounds, x, entropy)
        for w in dict.fromkeys(rounds.workload.tolist())
    ]
    groups = [
        _fit_subset(name, mask, rounds, x, entropy)
        for name, mask in _groups(rounds, groups_per_workload)
    ]
    if progress is not None:
        progress(total, total, "batch fits")
    return Evaluation(
        num_rows=len(trace),
        num_labeled=int(labeled.sum()),
        num_rounds=rounds.num_rounds,
        num_positions=rounds.num_positions,
        refit_interval=refit_interval,
        batch_rounds=batch_rounds,
        features=features,
        trajectory=trajectory,
        labels=labels,
        positions=positions.astype(np.int64),
        scores=scores,
        workloads=workloads,
        groups=groups,
        entropy_available=entropy is not None,
        fully_verified=rounds.fully_verified,
        notes=notes,
    )
