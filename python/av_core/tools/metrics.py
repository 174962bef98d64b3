"""Ranking and calibration metrics for acceptance predictions (numpy only).

The four yardsticks of the original write-up of the method, with scikit-learn's argument order
(``y_true`` first) so they read like the functions they are cross-checked against in the tests:

- :func:`roc_auc`: probability that a random accepted draft scores above a random rejected one
  (ties count ½). Ranking only: blind to calibration.
- :func:`log_loss`: mean negative log-likelihood of the labels, the loss the estimator minimizes.
- :func:`expected_calibration_error`: occupancy-weighted gap between mean prediction and observed
  acceptance rate per probability bin; what a budget planner that multiplies probabilities needs.
- :func:`reliability_curve`: the bins behind ECE, for plots.

:class:`CalibrationReport` gathers them overall, excluding the first draft position (the one a
trained confidence head is best at, so comparisons without it are the fairer ones) and per position.
All arithmetic is float64.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from av_core._native import InvalidTypeError, InvalidValueError

FloatArray = npt.NDArray[np.float64]
BinStrategy = Literal["uniform", "quantile"]

#: Probabilities are clipped to [LOG_LOSS_EPS, 1 - LOG_LOSS_EPS] so one confident miss costs at
#: most -log(1e-15) ≈ 34.5 nats instead of infinity (scikit-learn's long-standing default).
LOG_LOSS_EPS = 1e-15

#: Bins of the reliability curve and ECE: 15, the count used by the calibration literature
#: (Guo et al., 2017) and by the ECE figures of the original write-up of the method.
DEFAULT_BINS = 15


#: The most bins :func:`reliability_curve` and :func:`expected_calibration_error` accept: far more
#: than any calibration plot resolves, and few enough that the per-bin arrays stay small.
MAX_BINS = 1 << 16

#: The most (position slices × bins) :meth:`CalibrationReport.from_predictions` computes: each
#: position's summary has its own bins, so the work grows with the product.
MAX_REPORT_CELLS = 1 << 24

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


def _exact_integers(value: list[Any] | tuple[Any, ...]) -> npt.NDArray[Any] | None:
    """A sequence of Python integers as an exact integer array (int64, uint64, or an object
    array of ints beyond both), or None if it holds anything else. ``np.asarray`` would turn
    ``[2**63, 1]`` into float64 and merge neighbouring values."""
    if not value or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool | np.bool_) for v in value
    ):
        return None
    ints = [int(v) for v in value]
    low, high = min(ints), max(ints)
    if _INT64_MIN <= low and high <= _INT64_MAX:
        return np.asarray(ints, dtype=np.int64)
    if 0 <= low and high <= _UINT64_MAX:
        return np.asarray(ints, dtype=np.uint64)
    exact = np.empty(len(ints), dtype=object)
    exact[:] = ints
    return exact


def _host_array(value: Any, name: str) -> npt.NDArray[Any]:
    """``value`` as a private numpy copy (what is checked is then what is used, whatever another
    thread writes into the caller's buffer). A torch tensor, in any of the forms torch hands out
    (requiring grad, lazily negated or conjugated, bfloat16, on an accelerator), becomes the
    values it stands for, without this module importing torch; numpy's own conversion refuses
    most of those with a ``RuntimeError``. Anything numpy cannot read is a ``ValueError`` or
    ``TypeError`` naming ``name``. Shared by the offline tools (the trace columns too)."""
    if type(value).__module__.partition(".")[0] == "torch" and callable(
        getattr(value, "detach", None)
    ):
        try:
            tensor = value.detach().resolve_conj().resolve_neg()
            if tensor.device.type != "cpu":
                tensor = tensor.cpu()
            if str(tensor.dtype) == "torch.bfloat16":
                tensor = tensor.float()  # exact: every bfloat16 is a float32
            return np.array(tensor.numpy())
        except (RuntimeError, TypeError, ValueError) as error:
            raise InvalidTypeError(f"{name} is a tensor numpy cannot hold: {error}") from None
    try:
        return np.array(value)
    except (ValueError, TypeError, OverflowError) as error:
        raise InvalidValueError(f"{name} must be a 1-D array: {error}") from None
    except RuntimeError as error:  # another library's array refusing numpy
        raise InvalidTypeError(f"{name} cannot be read as a numpy array: {error}") from None


def _vector(value: npt.ArrayLike, name: str) -> npt.NDArray[Any]:
    """A 1-D, non-empty, real array of ``value`` as given (copied): integers stay integers
    (exact), an object array only for Python integers beyond 64 bits."""
    array: npt.NDArray[Any] | None = None
    if isinstance(value, list | tuple):
        array = _exact_integers(value)
    if array is None:
        array = _host_array(value, name)
        # Times are numbers to numpy (timedelta64 subclasses its signed integers), not scores.
        if array.dtype.kind in "mM" or not (
            np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.bool_)
        ):
            raise InvalidTypeError(f"{name} must be numeric, got dtype {array.dtype}")
        if np.issubdtype(array.dtype, np.complexfloating):
            raise InvalidTypeError(f"{name} must be real, got dtype {array.dtype}")
    if array.ndim != 1:
        raise InvalidValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.shape[0] == 0:
        raise InvalidValueError(f"{name} must not be empty, got shape {array.shape}")
    return array


def _item(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (object arrays hold Python ints already)."""
    return value.item() if isinstance(value, np.generic) else value


def _is_integer(array: npt.NDArray[Any]) -> bool:
    return array.dtype == object or np.issubdtype(array.dtype, np.integer)


def _labels(y_true: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    array = _vector(y_true, "y_true")
    bad = np.flatnonzero((array != 0) & (array != 1))
    if bad.size:
        raise InvalidValueError(
            f"y_true must hold only 0 and 1, got {_item(array[bad[0]])!r} at index {int(bad[0])}"
        )
    return np.asarray(array == 1, dtype=np.bool_)


def _scores(y_score: npt.ArrayLike, name: str, length: int) -> npt.NDArray[Any]:
    """Finite scores, exact: integer scores keep their integer dtype (float64 would merge
    ``2**53`` and ``2**53 + 1``), floating and boolean ones become float64 (exactly)."""
    array = _vector(y_score, name)
    if array.shape[0] != length:
        raise InvalidValueError(f"{name} has {array.shape[0]} entries, y_true has {length}")
    if _is_integer(array):
        return array
    array = array.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise InvalidValueError(
            f"{name} must be finite, got {array[bad[0]]} at index {int(bad[0])}"
        )
    return array


def _probabilities(y_prob: npt.ArrayLike, length: int) -> FloatArray:
    array = _scores(y_prob, "y_prob", length)
    bad = np.flatnonzero((array < 0) | (array > 1))
    if bad.size:
        raise InvalidValueError(
            f"y_prob must lie in [0, 1], got {_item(array[bad[0]])} at index {int(bad[0])}"
        )
    return np.asarray(array, dtype=np.float64)


def _check_bins(n_bins: object, strategy: object) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int | np.integer):
        raise InvalidTypeError(f"n_bins must be an int, got {n_bins!r}")
    if n_bins < 1:
        raise InvalidValueError(f"n_bins must be >= 1, got {n_bins}")
    if n_bins > MAX_BINS:
        raise InvalidValueError(f"n_bins must be <= {MAX_BINS} (MAX_BINS), got {n_bins}")
    if not isinstance(strategy, str) or strategy not in ("uniform", "quantile"):
        raise InvalidValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")
    return int(n_bins)


def roc_auc(y_true: npt.ArrayLike, y_score: npt.ArrayLike) -> float:
    """Area under the ROC curve, by the Mann–Whitney rank sum (ties count ½).

    ``AUC = (R₁ − n₁(n₁ + 1)/2) / (n₁ n₀)`` with R₁ the sum of the positives' ranks among all
    scores (tied scores share their average rank), n₁ positives and n₀ negatives. Equal to
    P(score⁺ > score⁻) + ½ P(score⁺ = score⁻): a pure ranking measure, O(n log n).
    Needs both classes present; raises ``ValueError`` otherwise.
    """
    labels = _labels(y_true)
    scores = _scores(y_score, "y_score", labels.shape[0])
    num_positive = int(labels.sum())
    num_negative = labels.shape[0] - num_positive
    if num_positive == 0 or num_negative == 0:
        raise InvalidValueError(
            f"roc_auc needs both classes in y_true, got {num_positive} positives and "
            f"{num_negative} negatives"
        )
    # Ranked in the scores' own dtype: integers compare exactly, whatever their size.
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], sorted_scores.shape[0]]
    average_rank = (starts + ends + 1) / 2.0  # 1-based ranks start+1 .. end, averaged
    ranks = np.empty(scores.shape[0], dtype=np.float64)
    ranks[order] = np.repeat(average_rank, ends - starts)
    rank_sum = float(ranks[labels].sum())
    return float(
        (rank_sum - num_positive * (num_positive + 1) / 2.0) / (num_positive * num_negative)
    )


def log_loss(y_true: npt.ArrayLike, y_prob: npt.ArrayLike, eps: float = LOG_LOSS_EPS) -> float:
    """Mean binary cross-entropy ``−mean(y log p + (1 − y) log(1 − p))`` in float64.

    ``p`` is clipped to ``[eps, 1 − eps]`` (default 1e-15) so a certain-but-wrong prediction
    costs a large finite amount instead of infinity.
    """
    labels = _labels(y_true)
    probs = _probabilities(y_prob, labels.shape[0])
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise InvalidTypeError(f"eps must be a number, got {type(eps).__name__}")
    if not 0.0 < eps < 0.5:  # compared as given: float(10**400) would overflow
        raise InvalidValueError(f"eps must lie in (0, 0.5), got {eps}")
    eps = float(eps)
    clipped = np.clip(probs, eps, 1.0 - eps)
    losses = np.where(labels, -np.log(clipped), -np.log1p(-clipped))
    return float(losses.mean())


@dataclass(frozen=True)
class ReliabilityCurve:
    """Per-bin mean prediction against observed rate.

    Bin ``i`` holds predictions ``edges[i] < p <= edges[i + 1]``; the first bin also holds
    ``p == edges[0]`` and anything below ``edges[1]`` (the convention of scikit-learn's
    ``calibration_curve``: ``searchsorted(edges[1:-1], p, side="left")``). Empty bins have
    count 0 and NaN means.
    """

    bin_edges: FloatArray
    counts: npt.NDArray[np.int64]
    mean_predicted: FloatArray
    observed_rate: FloatArray

    @property
    def expected_calibration_error(self) -> float:
        """``Σ_b (n_b / N) · |mean_predicted_b − observed_rate_b|`` over non-empty bins."""
        occupied = self.counts > 0
        weights = self.counts[occupied] / self.counts.sum()
        gaps = np.abs(self.mean_predicted[occupied] - self.observed_rate[occupied])
        return float((weights * gaps).sum())


def reliability_curve(
    y_true: npt.ArrayLike,
    y_prob: npt.ArrayLike,
    n_bins: int = DEFAULT_BINS,
    strategy: BinStrategy = "uniform",
) -> ReliabilityCurve:
    """Bins predictions and compares each bin's mean prediction with its acceptance rate.

    ``strategy="uniform"``: ``n_bins`` equal-width bins, edges ``linspace(0, 1, n_bins + 1)``.
    ``strategy="quantile"`` (equal mass): edges at the ``100 * linspace(0, 1, n_bins + 1)``
    percentiles of ``y_prob`` (linear interpolation, the percentile positions scikit-learn's
    ``calibration_curve`` uses), so bins hold about N / n_bins predictions
    each; ties can leave some bins empty. Bin membership is described on
    :class:`ReliabilityCurve`.
    """
    labels = _labels(y_true)
    probs = _probabilities(y_prob, labels.shape[0])
    n_bins = _check_bins(n_bins, strategy)
    if strategy == "uniform":
        edges = np.linspace(0.0, 1.0, n_bins + 1)
    else:
        edges = np.percentile(probs, np.linspace(0.0, 1.0, n_bins + 1) * 100.0)
    bins = np.searchsorted(edges[1:-1], probs, side="left")
    counts = np.bincount(bins, minlength=n_bins).astype(np.int64)
    sums = np.bincount(bins, weights=probs, minlength=n_bins)
    hits = np.bincount(bins, weights=labels.astype(np.float64), minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_predicted = np.where(counts > 0, sums / counts, np.nan)
        observed_rate = np.where(counts > 0, hits / counts, np.nan)
    return ReliabilityCurve(edges.astype(np.float64), counts, mean_predicted, observed_rate)


def expected_calibration_error(
    y_true: npt.ArrayLike,
    y_prob: npt.ArrayLike,
    n_bins: int = DEFAULT_BINS,
    strategy: BinStrategy = "uniform",
) -> float:
    """``ECE = Σ_b (n_b / N) · |mean(p in b) − mean(y in b)|`` over :func:`reliability_curve` bins.

    Occupancy-weighted, so a sparsely filled bin cannot dominate. 15 equal-width bins by default
    (edges ``k/15``, a bin closed on the right); ``strategy="quantile"`` for equal-mass bins.
    """
    return reliability_curve(y_true, y_prob, n_bins, strategy).expected_calibration_error


@dataclass(frozen=True)
class CalibrationSummary:
    """Metrics of one slice of predictions. ``auc`` is NaN when the slice has a single class."""

    count: int
    num_accepted: int
    auc: float
    log_loss: float
    ece: float
    mean_predicted: float
    observed_rate: float

    @staticmethod
    def of(
        labels: npt.NDArray[np.bool_],
        probs: FloatArray,
        n_bins: int,
        strategy: BinStrategy,
    ) -> CalibrationSummary:
        accepted = int(labels.sum())
        both = 0 < accepted < labels.shape[0]
        return CalibrationSummary(
            count=int(labels.shape[0]),
            num_accepted=accepted,
            auc=roc_auc(labels, probs) if both else float("nan"),
            log_loss=log_loss(labels, probs),
            ece=expected_calibration_error(labels, probs, n_bins, strategy),
            mean_predicted=float(probs.mean()),
            observed_rate=accepted / labels.shape[0],
        )


@dataclass(frozen=True)
class CalibrationReport:
    """Acceptance predictions judged overall, without draft position 0, and per position.

    Positions are 0-based draft positions. ``excluding_first_position`` is ``None`` when every
    prediction is at position 0.
    """

    overall: CalibrationSummary
    excluding_first_position: CalibrationSummary | None
    per_position: Mapping[int, CalibrationSummary]
    n_bins: int = DEFAULT_BINS
    strategy: BinStrategy = "uniform"

    @classmethod
    def from_predictions(
        cls,
        y_true: npt.ArrayLike,
        y_prob: npt.ArrayLike,
        positions: npt.ArrayLike,
        n_bins: int = DEFAULT_BINS,
        strategy: BinStrategy = "uniform",
    ) -> CalibrationReport:
        """Builds the report from labels, predicted acceptance probabilities and positions."""
        labels = _labels(y_true)
        probs = _probabilities(y_prob, labels.shape[0])
        position_array = _vector(positions, "positions")
        if position_array.shape[0] != labels.shape[0]:
            raise InvalidValueError(
                f"positions has {position_array.shape[0]} entries, y_true has {labels.shape[0]}"
            )
        if not _is_integer(position_array):
            raise InvalidTypeError(
                f"positions must hold integers, got dtype {position_array.dtype}"
            )
        bad = np.flatnonzero(position_array < 0)
        if bad.size:
            raise InvalidValueError(
                f"positions must be >= 0, got {position_array[bad[0]]} at index {int(bad[0])}"
            )
        n_bins = _check_bins(n_bins, strategy)
        # One stable sort groups the rows by position: each slice is then a contiguous run.
        order = np.argsort(position_array, kind="stable")
        ordered = position_array[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        slices = starts.shape[0] + 2  # every position, overall and positions >= 1
        if slices * (n_bins + 1) > MAX_REPORT_CELLS:
            raise InvalidValueError(
                f"positions has {starts.shape[0]} distinct values: with n_bins = {n_bins} that is "
                f"more than MAX_REPORT_CELLS = {MAX_REPORT_CELLS} bins to compute"
            )
        overall = CalibrationSummary.of(labels, probs, n_bins, strategy)
        later = np.asarray(position_array > 0, dtype=np.bool_)
        excluding_first = (
            CalibrationSummary.of(labels[later], probs[later], n_bins, strategy)
            if later.any()
            else None
        )
        ends = np.r_[starts[1:], ordered.shape[0]]
        per_position = {
            int(ordered[start]): CalibrationSummary.of(
                labels[order[start:end]], probs[order[start:end]], n_bins, strategy
            )
            for start, end in zip(starts.tolist(), ends.tolist(), strict=True)
        }
        return cls(overall, excluding_first, per_position, n_bins, strategy)

    def rows(self) -> list[tuple[str, CalibrationSummary]]:
        """(name, summary) pairs in display order."""
        named = [("overall", self.overall)]
        if self.excluding_first_position is not None:
            named.append(("positions >= 1", self.excluding_first_position))
        named.extend((f"position {k}", s) for k, s in sorted(self.per_position.items()))
        return named

    def to_text(self) -> str:
        """A fixed-width table: one line per slice."""
        header = (
            f"{'slice':<16}{'n':>9}{'AUC':>8}{'log-loss':>10}{'ECE':>8}"
            f"{'mean p':>8}{'observed':>10}"
        )
        lines = [header, "-" * len(header)]
        for name, s in self.rows():
            lines.append(
                f"{name:<16}{s.count:>9}{s.auc:>8.4f}{s.log_loss:>10.4f}{s.ece:>8.4f}"
                f"{s.mean_predicted:>8.3f}{s.observed_rate:>10.3f}"
            )
        return "\n".join(lines)


__all__ = [
    "DEFAULT_BINS",
    "LOG_LOSS_EPS",
    "MAX_BINS",
    "MAX_REPORT_CELLS",
    "CalibrationReport",
    "CalibrationSummary",
    "ReliabilityCurve",
    "expected_calibration_error",
    "log_loss",
    "reliability_curve",
    "roc_auc",
]
