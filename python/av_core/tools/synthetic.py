"""Synthetic speculative-decoding workloads with a known acceptance law (numpy only).

Each request drafts K tokens; the drafter's feature at position k is ``x ~ N(mean, std)`` and
the target accepts that draft with probability ``sigmoid(slope * x + intercepts[k])``,
independently given x. Verification stops at the first rejection, exactly as in speculative
sampling, so the workload exercises the estimator's label rule. Used by the demo and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from av_core._native import AcceptanceEstimator


def sigmoid(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Logistic function in float64."""
    return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)


@dataclass(frozen=True)
class SyntheticStep:
    """One decode step: features, the true acceptance probabilities, and the verdicts."""

    features: npt.NDArray[np.float32]
    true_probabilities: npt.NDArray[np.float64]
    num_admitted: npt.NDArray[np.int64]
    num_accepted: npt.NDArray[np.int64]


@dataclass(frozen=True)
class SyntheticWorkload:
    """A stationary workload with known coefficients."""

    slope: float
    intercepts: tuple[float, ...]
    feature_mean: float = 1.0
    feature_std: float = 2.5

    @property
    def num_positions(self) -> int:
        return len(self.intercepts)

    def step(
        self,
        rng: np.random.Generator,
        num_requests: int,
        num_admitted: npt.NDArray[np.int64] | None = None,
    ) -> SyntheticStep:
        """Draws one step; every request verifies all K drafts unless ``num_admitted`` says."""
        k = self.num_positions
        x = rng.normal(self.feature_mean, self.feature_std, size=(num_requests, k))
        p = sigmoid(self.slope * x + np.asarray(self.intercepts)[None, :])
        admitted = (
            np.full(num_requests, k, dtype=np.int64)
            if num_admitted is None
            else np.asarray(num_admitted, dtype=np.int64)
        )
        success = rng.random((num_requests, k)) < p
        # Accepted = the leading run of successes, cut at the admitted count.
        leading = np.cumprod(success, axis=1).sum(axis=1)
        accepted = np.minimum(leading, admitted).astype(np.int64)
        return SyntheticStep(x.astype(np.float32), p, admitted, accepted)


def refit_rounds(
    estimator: AcceptanceEstimator,
    workload: SyntheticWorkload,
    rounds: int,
    rng: np.random.Generator,
    requests_per_step: int = 10,
) -> npt.NDArray[np.float64]:
    """Feeds ``workload`` steps (predict, then observe with those predictions, as in serving)
    until the estimator has refitted ``rounds`` times; returns ``[rounds, 1 + K]``: the slope
    and intercepts after each refit."""
    history: list[tuple[float, ...]] = []
    while len(history) < rounds:
        s = workload.step(rng, requests_per_step)
        predictions = estimator.predict(s.features)
        if estimator.observe(s.features, s.num_admitted, s.num_accepted, predictions):
            history.append((estimator.slope, *estimator.intercepts))
    return np.array(history, dtype=np.float64).reshape(-1, 1 + workload.num_positions)


def labeled_log_loss(
    estimator: AcceptanceEstimator | None, workload: SyntheticWorkload, num_requests: int = 3000
) -> float:
    """Mean log-loss over the labeled positions of a fixed sample of ``workload`` (seed 99) under
    the estimator's predictions, or under the true probabilities with ``estimator=None`` (the
    optimum)."""
    s = workload.step(np.random.default_rng(99), num_requests)
    p = s.true_probabilities if estimator is None else estimator.predict(s.features)
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-15, 1 - 1e-15)
    k = np.arange(workload.num_positions)[None, :]
    accepted, admitted = s.num_accepted[:, None], s.num_admitted[:, None]
    labeled = (k < accepted) | ((k == accepted) & (accepted < admitted))
    return float(-np.where(k < accepted, np.log(p), np.log1p(-p))[labeled].mean())
