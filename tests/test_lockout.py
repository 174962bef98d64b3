"""The estimator cannot lock itself out: with trimming on, one adversarial round must not leave a
position that is never verified again, and a workload switch must be tracked."""

from __future__ import annotations

from typing import Any

import numpy as np

from av_core import AcceptanceEstimator, CostTables, VerificationPlanner
from av_core.tools.synthetic import SyntheticWorkload, sigmoid

R, K = 32, 4
STATIONARY = SyntheticWorkload(slope=0.55, intercepts=(1.4, 0.9, 0.5, 0.1))
HIGH = SyntheticWorkload(slope=0.55, intercepts=(2.0, 1.5, 1.0, 0.5))
LOW = SyntheticWorkload(slope=0.55, intercepts=(0.0, -0.5, -1.0, -1.5))
# Verification is compute-bound (every extra token costs 8% of a step), so the planner trims.
TABLES = CostTables(np.zeros(R + 1), 1.0 + 0.08 * np.arange(R * (K + 1) + 1))
# vLLM's update: unbounded steps and no memory across rounds.
UNBOUNDED = {"max_step": np.inf, "max_slope": np.inf, "max_intercept": np.inf, "memory": 0.0}
GRID = np.linspace(-4.0, 6.0, 41)


def curve_error(est: AcceptanceEstimator, workload: SyntheticWorkload) -> float:
    """Largest |estimated - true| acceptance probability over positions and features in
    [-4, 6] (the bulk of the workload's feature distribution, N(1, 2.5))."""
    x = np.repeat(GRID[:, None], K, axis=1).astype(np.float32)
    truth = sigmoid(workload.slope * GRID[:, None] + np.array(workload.intercepts)[None, :])
    return float(np.abs(est.predict(x) - truth).max())


class Serving:
    """Decode steps with trimming on: predict, plan (previous-step budget), verify, observe."""

    def __init__(self, exploration: float, **estimator: Any) -> None:
        self.est = AcceptanceEstimator(K, **estimator)
        self.planner = VerificationPlanner(TABLES, K, num_slots=R, exploration=exploration)
        self.rng = np.random.default_rng(0)
        self.trimmed = 0

    def round(self, workload: SyntheticWorkload) -> None:
        slots, scheduled = np.arange(R), np.full(R, K)
        for _ in range(self.est.refit_interval):
            s = workload.step(self.rng, R, scheduled)
            p = self.est.predict(s.features)
            plan = self.planner.plan(
                slots, p, scheduled, num_non_draft_tokens=R, num_sampling_requests=R
            )
            admitted = plan.admitted.astype(np.int64)
            self.trimmed += int((admitted < K).sum())
            accepted = np.minimum(s.num_accepted, admitted)
            self.est.observe(s.features, admitted, accepted, p)

    def adversarial_round(self) -> None:
        """Feature 30 everywhere, every request rejected at position 0."""
        x = np.full((R, K), 30.0, np.float32)
        for _ in range(self.est.refit_interval):
            self.est.observe(x, np.full(R, K), np.zeros(R, np.int64), self.est.predict(x))


def rounds_until(
    serving: Serving, workload: SyntheticWorkload, tolerance: float, limit: int
) -> int:
    for r in range(1, limit + 1):
        serving.round(workload)
        if curve_error(serving.est, workload) <= tolerance:
            return r
    return limit + 1


def test_one_adversarial_round_is_recovered_from_while_trimming() -> None:
    serving = Serving(exploration=0.05, memory=0.9)
    for _ in range(20):
        serving.round(STATIONARY)
    serving.adversarial_round()
    assert curve_error(serving.est, STATIONARY) > 0.5  # the attack did knock it off
    trimmed_before = serving.trimmed
    assert rounds_until(serving, STATIONARY, 0.05, limit=12) <= 12
    assert serving.trimmed > trimmed_before  # trimming stayed on throughout


def test_without_bounds_or_exploration_the_estimator_locks_itself_out() -> None:
    # The counterfactual: vLLM's unbounded step and no exploration floor.
    serving = Serving(exploration=0.0, **UNBOUNDED)
    for _ in range(5):
        serving.round(STATIONARY)
    serving.adversarial_round()
    assert serving.est.intercepts[0] < -1e4
    for _ in range(10):
        serving.round(STATIONARY)
    assert curve_error(serving.est, STATIONARY) > 0.9


def test_a_workload_switch_is_tracked_within_a_few_rounds() -> None:
    for memory in (0.0, 0.9):
        serving = Serving(exploration=0.05, memory=memory)
        for _ in range(20):
            serving.round(HIGH)
        assert curve_error(serving.est, LOW) > 0.3
        assert rounds_until(serving, LOW, 0.1, limit=8) <= 8, memory
