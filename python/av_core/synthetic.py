"""Synthetic speculative-decoding workloads with a known acceptance law (numpy only).

Each request drafts K tokens; the drafter's feature at position k is ``x ~ N(mean, std)`` and
the target accepts that draft with probability ``sigmoid(slope * x + intercepts[k])``,
independently given x. Verification stops at the first rejection, exactly as in speculative
sampling, so the workload exercises the estimator's label rule. Used by the demo and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


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
