"""Prequential evaluation of the online estimator on a labeled draft trace (``av-core evaluate``).

The estimator is replayed over the trace in decode order exactly as it runs in serving: each
decode step it predicts with its current coefficients, then observes that step's verdicts, and
every ``refit_interval`` observes it refits. Every draft is scored with the prediction made *at
draft time*, so no draft is ever scored by coefficients fitted on its own label (prequential,
"test then train"). The same replay is run on the other candidate features (the lossy
``logit(q_sampled)``, the top-2 margin, the entropy, a head score), and raw ``q_max`` is scored
without any fit, which gives the feature comparison table of the original write-up.

Each workload (prompt source) is also fitted offline by batch IRLS, to check the write-up's claim
that the slope is a property of the model pair (it barely moves across workloads) while the first
intercept tracks the drafter's mean entropy. See ``docs/evaluate.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from av_core import AcceptanceEstimator
from av_core.metrics import CalibrationReport, reliability_curve
from av_core.tables import Table, col, fixed, render, signed
from av_core.trace import UNLABELED, DraftTrace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Default refit interval of the replay, in observe calls. The shipped trace was collected one
#: request at a time, so one observe holds one drafting round (K drafts, about 3 labels); serving
#: observes a whole batch per step. 25 rounds (about 75 labels per refit window) keeps the window
#: a few times the damping constant (50 observations), as vLLM's 100 serving steps of many
#: requests do.
DEFAULT_REFIT_INTERVAL = 25

#: Features are clamped to ±40, the estimator's own ``max_log_odds``.
MAX_FEATURE = 40.0


#: The most ``rounds x K`` entries :meth:`DraftRounds.from_trace` lays out (2 GiB of int64).
MAX_ROUND_ENTRIES = 1 << 28


@dataclass(frozen=True)
class DraftRounds:
    """A trace regrouped into drafting rounds: one row per (request, step), K columns.

    Rounds are in decode order: the order in which each ``(request_id, step)`` first appears in
    the trace (the collector writes in decode order). ``num_accepted`` is the number of leading
    label-1 positions, i.e. the tokens accepted under the verification recorded in the trace
    (full verification for a collected trace). ``num_verified`` is ``num_accepted`` plus one when
    the round ends with a rejection: the admitted count that reproduces exactly the trace's labels.
    Padding (rounds with fewer than K positions) has feature 0, label -1 and row index -1.
    """

    request_id: IntArray
    step: IntArray
    workload: npt.NDArray[np.str_]
    prompt_id: npt.NDArray[np.str_]
    rows: IntArray
    num_drafted: IntArray
    labels: npt.NDArray[np.int8]
    num_accepted: IntArray
    num_verified: IntArray
    fully_verified: bool

    @property
    def num_rounds(self) -> int:
        return int(self.request_id.shape[0])

    @property
    def num_positions(self) -> int:
        return int(self.rows.shape[1])

    def column(self, values: FloatArray, fill: float = 0.0) -> FloatArray:
        """A per-row trace column laid out as [rounds, K] (``fill`` for padding and NaN)."""
        out = np.full(self.rows.shape, fill, dtype=np.float64)
        present = self.rows >= 0
        out[present] = values[self.rows[present]]
        out[~np.isfinite(out)] = fill
        return out

    @staticmethod
    def from_trace(trace: DraftTrace) -> DraftRounds:
        """Regroups ``trace``; the ``[rounds, K]`` layout is checked against
        :data:`MAX_ROUND_ENTRIES` before it is allocated (K is the deepest position + 1, so one
        stray position could otherwise ask for terabytes)."""
        if not isinstance(trace, DraftTrace):
            raise TypeError(f"trace must be a DraftTrace, got {type(trace).__name__}")
        if len(trace) == 0:
            raise ValueError("trace must not be empty")
        num_positions = trace.num_positions
        keys = np.stack([trace.request_id, trace.step], axis=1)
        unique, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        if unique.shape[0] * num_positions > MAX_ROUND_ENTRIES:
            raise ValueError(
                f"trace: {unique.shape[0]} rounds x {num_positions} positions (the deepest "
                f"position + 1) exceed MAX_ROUND_ENTRIES = {MAX_ROUND_ENTRIES}"
            )
        inverse = inverse.reshape(-1)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.shape[0])
        round_of_row = rank[inverse]
        rows = np.full((order.shape[0], num_positions), -1, dtype=np.int64)
        rows[round_of_row, trace.position] = np.arange(len(trace))
        labels = np.full(rows.shape, UNLABELED, dtype=np.int8)
        present = rows >= 0
        labels[present] = trace.label[rows[present]]
        num_accepted = np.cumprod(labels == 1, axis=1).sum(axis=1).astype(np.int64)
        ends_rejected = np.zeros(rows.shape[0], dtype=bool)
        inside = num_accepted < num_positions
        ends_rejected[inside] = labels[inside, num_accepted[inside]] == 0
        first_rows = first[order]
        drafted = present.sum(axis=1).astype(np.int64)
        admitted = np.zeros(rows.shape, dtype=bool)
        admitted[present] = trace.admitted[rows[present]]
        # Full verification: every drafted position up to the first rejection was admitted.
        fully = bool(np.all(admitted.sum(axis=1) >= np.minimum(num_accepted + 1, drafted)))
        prompt = trace.prompt_id if trace.prompt_id is not None else trace.workload
        return DraftRounds(
            request_id=unique[order, 0].astype(np.int64),
            step=unique[order, 1].astype(np.int64),
            workload=trace.workload[first_rows],
            prompt_id=prompt[first_rows],
            rows=rows,
            num_drafted=drafted,
            labels=labels,
            num_accepted=num_accepted,
            num_verified=num_accepted + ends_rejected.astype(np.int64),
            fully_verified=fully,
        )


@dataclass(frozen=True)
class Trajectory:
    """Coefficients after each refit: ``rounds[i]`` rounds had been observed at refit ``i``."""

    rounds: IntArray
    slope: FloatArray
    intercepts: FloatArray  # [refits, K]


@dataclass(frozen=True)
class Replay:
    """Draft-time predictions of an online replay, laid out as [rounds, K]."""

    predictions: FloatArray
    trajectory: Trajectory
    final_slope: float
    final_intercepts: FloatArray


def replay_online(
    rounds: DraftRounds,
    features: FloatArray,
    *,
    refit_interval: int = DEFAULT_REFIT_INTERVAL,
    batch_rounds: int = 1,
    memory: float | None = None,
    update: str | None = None,
) -> Replay:
    """Replays the online estimator prequentially over ``rounds`` with feature matrix [rounds, K].

    ``batch_rounds`` consecutive rounds form one decode step (one predict, one observe): every
    round of a step is predicted before any of its labels is observed, as in serving. The
    estimator refits itself every ``refit_interval`` observes; the prediction stored for a draft
    is the one made before its own step was observed, so its label never influences its score.
    ``memory`` is the estimator's memory across rounds (``None``: av_core's default; 0: vLLM's
    memoryless update); ``update`` how it refits (``None``: av_core's default, ``"map"``;
    ``"vllm"``: vLLM's damped Newton step, docs/estimator.md).
    """
    if isinstance(batch_rounds, bool) or not isinstance(batch_rounds, int | np.integer):
        raise TypeError(f"batch_rounds must be an int, got {type(batch_rounds).__name__}")
    if batch_rounds < 1:
        raise ValueError(f"batch_rounds must be >= 1, got {batch_rounds}")
    if features.shape != rounds.rows.shape:
        raise ValueError(f"features must have shape {rounds.rows.shape}, got {features.shape}")
    options: dict[str, Any] = {"refit_interval": refit_interval}
    if memory is not None:
        options["memory"] = memory
    if update is not None:
        options["update"] = update
    estimator = AcceptanceEstimator(rounds.num_positions, **options)
    x = np.ascontiguousarray(np.clip(features, -MAX_FEATURE, MAX_FEATURE), dtype=np.float32)
    predictions = np.empty(x.shape, dtype=np.float64)
    refit_rounds: list[int] = []
    slopes: list[float] = []
    intercepts: list[FloatArray] = []
    verified = rounds.num_verified.astype(np.int32)
    accepted = rounds.num_accepted.astype(np.int32)
    for start in range(0, rounds.num_rounds, batch_rounds):
        stop = min(start + batch_rounds, rounds.num_rounds)
        step_x = x[start:stop]
        p = estimator.predict(step_x)
        predictions[start:stop] = p
        if estimator.observe(step_x, verified[start:stop], accepted[start:stop], p):
            refit_rounds.append(stop)
            slopes.append(estimator.slope)
            intercepts.append(estimator.intercepts.copy())
    trajectory = Trajectory(
        rounds=np.asarray(refit_rounds, dtype=np.int64),
        slope=np.asarray(slopes, dtype=np.float64),
        intercepts=(
            np.asarray(intercepts, dtype=np.float64)
            if intercepts
            else np.zeros((0, rounds.num_positions))
        ),
    )
    return Replay(predictions, trajectory, estimator.slope, estimator.intercepts.copy())


@dataclass(frozen=True)
class BatchFit:
    """An offline maximum-likelihood fit of ``p = sigmoid(slope * x + intercepts[k])``."""

    slope: float
    intercepts: FloatArray
    num_labels: int
    converged: bool


#: Ridge of the offline fits: a N(0, 1) prior on every coefficient. Small against a few hundred
#: labels, but it keeps an intercept finite when a position's labels are all 1 (code prompts
#: reach 98% acceptance, so a small prompt group often has no rejection at a deep position).
BATCH_L2 = 1.0


def fit_batch(
    features: FloatArray,
    positions: IntArray,
    labels: IntArray,
    num_positions: int,
    *,
    l2: float = BATCH_L2,
) -> BatchFit:
    """Batch IRLS (Newton) on the labeled drafts, float64, with ridge ``l2`` on every coefficient.

    The reference fit the online estimator approximates: same model, all labels at once.
    A position with no labels has intercept 0.
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    design = np.zeros((x.shape[0], num_positions + 1))
    design[:, 0] = x
    design[np.arange(x.shape[0]), 1 + np.asarray(positions)] = 1.0
    theta = np.zeros(num_positions + 1)
    converged = False
    for _ in range(100):
        z = design @ theta
        p = 1.0 / (1.0 + np.exp(-z))
        w = p * (1.0 - p)
        hessian = design.T @ (design * w[:, None]) + l2 * np.eye(num_positions + 1)
        gradient = design.T @ (y - p) - l2 * theta
        delta = np.linalg.solve(hessian, gradient)
        theta = theta + delta
        if float(np.max(np.abs(delta))) < 1e-10:
            converged = True
            break
    return BatchFit(float(theta[0]), theta[1:].copy(), int(x.shape[0]), converged)


@dataclass(frozen=True)
class WorkloadFit:
    """A batch fit of one workload (or one group of its prompts) and its mean draft entropy."""

    name: str
    fit: BatchFit
    mean_entropy: float
    acceptance_rate: float


#: Fewest points for a correlation: through two points any line fits, so r is always ±1.
MIN_CORRELATION_POINTS = 3


@dataclass(frozen=True)
class Correlation:
    """Pearson r over the ``n`` pairs where both values are finite, with a Fisher-z 95%
    interval (NaN when n < 4). r is NaN with fewer than :data:`MIN_CORRELATION_POINTS` pairs
    (two points always give r = ±1) or when either side is constant."""

    r: float
    n: int
    low: float
    high: float

    @staticmethod
    def of(a: Sequence[float], b: Sequence[float]) -> Correlation:
        x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        finite = np.isfinite(x) & np.isfinite(y)
        x, y = x[finite], y[finite]
        n = int(x.shape[0])
        if n < MIN_CORRELATION_POINTS or float(np.std(x)) == 0.0 or float(np.std(y)) == 0.0:
            return Correlation(math.nan, n, math.nan, math.nan)
        r = float(np.corrcoef(x, y)[0, 1])
        if n < 4 or abs(r) >= 1.0:
            return Correlation(r, n, math.nan, math.nan)
        z, half = math.atanh(r), 1.96 / math.sqrt(n - 3)
        return Correlation(r, n, math.tanh(z - half), math.tanh(z + half))

    def to_text(self) -> str:
        if math.isnan(self.r):
            if self.n < MIN_CORRELATION_POINTS:
                return (
                    f"r = n/a (n = {self.n}: a correlation needs >= {MIN_CORRELATION_POINTS} "
                    "points)"
                )
            return f"r = n/a (n = {self.n}: one side is constant)"
        r = signed(2)(self.r)
        if math.isnan(self.low):
            return f"r = {r} (n = {self.n}: too few points for an interval)"
        return f"r = {r} (n = {self.n}, 95% CI {signed(2)(self.low)} .. {signed(2)(self.high)})"


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
        raise ValueError(f"groups_per_workload must be >= 1, got {groups_per_workload}")
    if batch_rounds < 1:
        raise ValueError(f"batch_rounds must be >= 1, got {batch_rounds}")
    rounds = DraftRounds.from_trace(trace)
    labeled = rounds.labels >= 0
    if not labeled.any():
        raise ValueError("trace has no labeled drafts")
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
    return [
        f"trace: {e.num_rows} rows, {e.num_rounds} drafting rounds, {e.num_labeled} labeled "
        f"drafts, K = {e.num_positions}",
        f"prequential replay: {e.batch_rounds} round(s) per observe, refit every "
        f"{e.refit_interval} observes ({e.trajectory.rounds.shape[0]} refits); every draft is "
        "scored with the prediction made at draft time",
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


__all__ = [
    "DEFAULT_REFIT_INTERVAL",
    "MIN_CORRELATION_POINTS",
    "MAX_ROUND_ENTRIES",
    "ONLINE",
    "RAW",
    "BatchFit",
    "Correlation",
    "DraftRounds",
    "Evaluation",
    "FeatureScore",
    "Replay",
    "Trajectory",
    "WorkloadFit",
    "evaluate_trace",
    "evaluation_preamble",
    "evaluation_tables",
    "evaluation_to_dict",
    "fit_batch",
    "format_evaluation",
    "reliability_data",
    "replay_online",
]
