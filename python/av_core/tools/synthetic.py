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

from av_core._native import DEFAULT_EXPLORATION, InvalidValueError

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
    until the estimator has ended ``rounds`` rounds (``refit_interval`` observes each); returns
    ``[rounds, 1 + K]``: the slope and intercepts after each round's end (the map update's fits
    within a round are not rounds)."""
    history: list[tuple[float, ...]] = []
    while len(history) < rounds:
        s = workload.step(rng, requests_per_step)
        predictions = estimator.predict(s.features)
        refitted = estimator.observe(s.features, s.num_admitted, s.num_accepted, predictions)
        if refitted and estimator.steps_since_refit == 0:
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


#: A grid over the bulk of a workload's feature distribution (N(1, 2.5)).
CURVE_GRID = np.linspace(-4.0, 6.0, 41)


def curve_error(estimator: AcceptanceEstimator, workload: SyntheticWorkload) -> float:
    """Largest |estimated − true| acceptance probability over positions and features in
    :data:`CURVE_GRID`."""
    k = workload.num_positions
    x = np.repeat(CURVE_GRID[:, None], k, axis=1).astype(np.float32)
    truth = sigmoid(workload.slope * CURVE_GRID[:, None] + np.asarray(workload.intercepts)[None, :])
    return float(np.abs(estimator.predict(x) - truth).max())


class TrimmingServing:
    """Decode steps with trimming on: predict, plan (budget from the previous step), verify
    what the plan admitted, observe. Verification is compute-bound (every extra token costs
    ``per_token`` of a step), so the planner trims. ``estimator`` keyword arguments go to
    :class:`~av_core.AcceptanceEstimator` (its defaults otherwise)."""

    def __init__(
        self,
        num_requests: int = 32,
        num_positions: int = 4,
        *,
        exploration: float = DEFAULT_EXPLORATION,
        seed: int = 0,
        per_token: float = 0.08,
        **estimator: float | str,
    ) -> None:
        from av_core import AcceptanceEstimator, CostTables, VerificationPlanner

        r, k = num_requests, num_positions
        tables = CostTables(np.zeros(r + 1), 1.0 + per_token * np.arange(r * (k + 1) + 1))
        self.num_requests, self.num_positions = r, k
        self.est = AcceptanceEstimator(k, **estimator)  # type: ignore[arg-type]
        interval = self.est.refit_interval
        if interval is None:
            raise InvalidValueError("estimator: a round needs a refit_interval, got None (manual)")
        self.interval = interval
        self.planner = VerificationPlanner(tables, k, num_slots=r, exploration=exploration)
        self.rng = np.random.default_rng(seed)
        self.trimmed = 0

    def round(self, workload: SyntheticWorkload) -> None:
        """One refit interval of decode steps."""
        r, k = self.num_requests, self.num_positions
        slots, scheduled = np.arange(r), np.full(r, k)
        for _ in range(self.interval):
            s = workload.step(self.rng, r, scheduled)
            p = self.est.predict(s.features)
            plan = self.planner.plan(
                slots, p, scheduled, num_non_draft_tokens=r, num_sampling_requests=r
            )
            admitted = plan.admitted.astype(np.int64)
            self.trimmed += int((admitted < k).sum())
            accepted = np.minimum(s.num_accepted, admitted)
            self.est.observe(s.features, admitted, accepted, p)

    def adversarial_round(self) -> None:
        """A confidently wrong round: feature 30 everywhere, every request rejected at
        position 0."""
        r, k = self.num_requests, self.num_positions
        x = np.full((r, k), 30.0, np.float32)
        for _ in range(self.interval):
            self.est.observe(x, np.full(r, k), np.zeros(r, np.int64), self.est.predict(x))

    def rounds_until(self, workload: SyntheticWorkload, tolerance: float, limit: int) -> int:
        """Rounds of ``workload`` until :func:`curve_error` is within ``tolerance``;
        ``limit + 1`` if it never gets there within ``limit`` rounds."""
        for rounds in range(1, limit + 1):
            self.round(workload)
            if curve_error(self.est, workload) <= tolerance:
                return rounds
        return limit + 1
