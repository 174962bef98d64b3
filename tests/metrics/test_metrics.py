"""Metrics against scikit-learn (an independent reference) on hypothesis-generated data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from av_core.tools.metrics import (
    CalibrationReport,
    expected_calibration_error,
    log_loss,
    reliability_curve,
    roc_auc,
)

sklearn_metrics = pytest.importorskip("sklearn.metrics")
sklearn_calibration = pytest.importorskip("sklearn.calibration")


@st.composite
def labeled_scores(
    draw: st.DrawFn, low: float = 0.0, high: float = 1.0, coarse: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(2, 300))
    labels = draw(hnp.arrays(np.int64, n, elements=st.integers(0, 1)))
    if coarse:  # few distinct values: many ties
        elements = st.sampled_from([low, (low + high) / 2, high, low + (high - low) / 4])
    else:
        elements = st.floats(low, high, allow_nan=False, allow_infinity=False)
    scores = draw(hnp.arrays(np.float64, n, elements=elements))
    return labels, scores


def sklearn_ece(labels: np.ndarray, probs: np.ndarray, n_bins: int, strategy: str) -> float:
    """ECE recomputed from scikit-learn's calibration_curve bins (counts from the same edges)."""
    prob_true, prob_pred = sklearn_calibration.calibration_curve(
        labels, probs, n_bins=n_bins, strategy=strategy
    )
    if strategy == "uniform":
        edges = np.linspace(0.0, 1.0, n_bins + 1)
    else:
        # The percentile positions exactly as scikit-learn computes them: with ties, an edge
        # one rounding away moves a whole group of tied predictions between bins.
        edges = np.percentile(probs, np.linspace(0, 1, n_bins + 1) * 100)
    counts = np.bincount(np.searchsorted(edges[1:-1], probs), minlength=n_bins)
    counts = counts[counts > 0]
    return float((counts / counts.sum() * np.abs(prob_true - prob_pred)).sum())


@settings(max_examples=150, deadline=None)
@given(labeled_scores(-50.0, 50.0) | labeled_scores(-3.0, 3.0, coarse=True))
def test_roc_auc_matches_sklearn(data: tuple[np.ndarray, np.ndarray]) -> None:
    labels, scores = data
    assume(0 < labels.sum() < labels.size)
    expected = sklearn_metrics.roc_auc_score(labels, scores)
    assert roc_auc(labels, scores) == pytest.approx(expected, abs=1e-12)


def test_roc_auc_ties_count_half_and_needs_both_classes() -> None:
    assert roc_auc([0, 1], [0.3, 0.3]) == 0.5
    assert roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.4, 0.9]) == pytest.approx(0.875)
    assert roc_auc([True, False], [1.0, 0.0]) == 1.0
    with pytest.raises(ValueError, match="both classes"):
        roc_auc([1, 1], [0.2, 0.3])


@settings(max_examples=150, deadline=None)
@given(labeled_scores(1e-6, 1.0 - 1e-6) | labeled_scores(1e-6, 1.0 - 1e-6, coarse=True))
def test_log_loss_matches_sklearn(data: tuple[np.ndarray, np.ndarray]) -> None:
    labels, probs = data
    expected = sklearn_metrics.log_loss(labels, probs, labels=[0, 1])
    assert log_loss(labels, probs) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_log_loss_clips_at_1e_15() -> None:
    assert log_loss([1], [0.0]) == pytest.approx(-math.log(1e-15), rel=1e-12)
    assert log_loss([0, 1], [0.0, 1.0]) == pytest.approx(-math.log1p(-1e-15), rel=1e-9)
    assert log_loss([1], [0.0], eps=1e-3) == pytest.approx(-math.log(1e-3))


@settings(max_examples=150, deadline=None)
@given(
    labeled_scores() | labeled_scores(coarse=True),
    st.integers(1, 20),
    st.sampled_from(["uniform", "quantile"]),
)
def test_ece_matches_sklearn_calibration_curve(
    data: tuple[np.ndarray, np.ndarray], n_bins: int, strategy: str
) -> None:
    labels, probs = data
    expected = sklearn_ece(labels, probs, n_bins, strategy)
    got = expected_calibration_error(labels, probs, n_bins, strategy)  # type: ignore[arg-type]
    assert got == pytest.approx(expected, abs=1e-12)


def test_ece_bins_are_closed_on_the_right_and_default_to_15() -> None:
    curve = reliability_curve([1, 0, 1, 0], [0.0, 1 / 15, 1 / 15 + 1e-9, 1.0])
    np.testing.assert_allclose(curve.bin_edges, np.linspace(0, 1, 16))
    assert curve.counts.tolist() == [2, 1] + [0] * 12 + [1]
    assert np.isnan(curve.mean_predicted[2]) and np.isnan(curve.observed_rate[2])
    # Bin 0: p = (0, 1/15), y = (1, 0); bin 1: p ≈ 1/15, y = 1; bin 14: p = 1, y = 0.
    expected = (2 * abs(1 / 30 - 0.5) + abs(1 / 15 + 1e-9 - 1) + abs(1.0 - 0.0)) / 4
    assert expected_calibration_error([1, 0, 1, 0], [0.0, 1 / 15, 1 / 15 + 1e-9, 1.0]) == (
        pytest.approx(expected, abs=1e-12)
    )


def test_perfectly_calibrated_predictions_have_small_ece() -> None:
    rng = np.random.default_rng(0)
    probs = rng.uniform(size=200_000)
    labels = rng.uniform(size=probs.size) < probs
    assert expected_calibration_error(labels, probs) < 0.005
    assert expected_calibration_error(labels, np.clip(probs + 0.1, 0, 1)) > 0.08


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: roc_auc([0, 2], [0.1, 0.2]), "y_true must hold only 0 and 1, got 2 at index 1"),
        (lambda: roc_auc([0, 1], [0.1, np.nan]), "y_score must be finite, got nan at index 1"),
        (lambda: roc_auc([0, 1], [0.1]), "y_score has 1 entries, y_true has 2"),
        (lambda: log_loss([0, 1], [0.1, 1.5]), r"y_prob must lie in \[0, 1\], got 1.5"),
        (lambda: log_loss([], []), "y_true must not be empty"),
        (lambda: log_loss([[0, 1]], [[0.1, 0.2]]), "y_true must be 1-D"),
        (lambda: log_loss([0], [0.5], eps=0.0), "eps must lie in"),
        (lambda: expected_calibration_error([0], [0.5], n_bins=0), "n_bins must be >= 1, got 0"),
        (lambda: expected_calibration_error([0], [0.5], strategy="x"), "strategy must be"),  # type: ignore[arg-type]
        (lambda: CalibrationReport.from_predictions([0], [0.5], [-1]), "positions must be >= 0"),
    ],
)
def test_bad_inputs_raise_value_errors_naming_the_argument(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def test_type_errors() -> None:
    with pytest.raises(TypeError, match="y_score must be numeric"):
        roc_auc([0, 1], ["a", "b"])
    with pytest.raises(TypeError, match="n_bins must be an int"):
        expected_calibration_error([0], [0.5], n_bins=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="positions must hold integers"):
        CalibrationReport.from_predictions([0], [0.5], [0.5])


def test_calibration_report_slices_match_direct_computation() -> None:
    rng = np.random.default_rng(3)
    positions = rng.integers(0, 4, size=5000)
    probs = 1 / (1 + np.exp(-(rng.normal(1.0, 2.0, size=positions.size) - 0.3 * positions)))
    labels = (rng.uniform(size=positions.size) < probs).astype(np.int64)
    report = CalibrationReport.from_predictions(labels, probs, positions)
    assert report.overall.count == positions.size
    assert report.overall.auc == pytest.approx(sklearn_metrics.roc_auc_score(labels, probs))
    later = positions > 0
    assert report.excluding_first_position is not None
    assert report.excluding_first_position.count == int(later.sum())
    assert report.excluding_first_position.log_loss == pytest.approx(
        sklearn_metrics.log_loss(labels[later], probs[later])
    )
    for k, summary in report.per_position.items():
        mask = positions == k
        assert summary.count == int(mask.sum())
        assert summary.ece == pytest.approx(sklearn_ece(labels[mask], probs[mask], 15, "uniform"))
        assert summary.mean_predicted == pytest.approx(probs[mask].mean())
        assert summary.observed_rate == pytest.approx(labels[mask].mean())
    assert sorted(report.per_position) == [0, 1, 2, 3]
    text = report.to_text()
    assert "positions >= 1" in text and "position 3" in text


def test_calibration_report_single_class_slice_has_nan_auc() -> None:
    report = CalibrationReport.from_predictions([1, 1, 0], [0.9, 0.8, 0.3], [0, 0, 1])
    assert math.isnan(report.per_position[0].auc)
    assert report.per_position[0].observed_rate == 1.0
    only_first = CalibrationReport.from_predictions([1, 0], [0.9, 0.3], [0, 0])
    assert only_first.excluding_first_position is None
