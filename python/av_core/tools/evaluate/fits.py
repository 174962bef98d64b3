"""Offline fits: batch IRLS on a set of labeled drafts (:func:`fit_batch`), a workload's fit, and
the correlation (with its interval) between intercepts and entropy across workloads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from av_core.tools.evaluate.rounds import FloatArray, IntArray
from av_core.tools.tables import signed


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
