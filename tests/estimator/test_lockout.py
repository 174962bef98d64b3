"""The estimator cannot lock itself out: with trimming on, one adversarial round must not leave a
position that is never verified again, and a workload switch must be tracked."""

from __future__ import annotations

from typing import Any

import numpy as np

from av_core.tools.synthetic import SyntheticWorkload, TrimmingServing, curve_error

R, K = 32, 4
STATIONARY = SyntheticWorkload(slope=0.55, intercepts=(1.4, 0.9, 0.5, 0.1))
HIGH = SyntheticWorkload(slope=0.55, intercepts=(2.0, 1.5, 1.0, 0.5))
LOW = SyntheticWorkload(slope=0.55, intercepts=(0.0, -0.5, -1.0, -1.5))
# vLLM's update: unbounded steps and no memory across rounds.
# vLLM's update: unbounded steps, no memory (the counterfactual the bounds exist for).
UNBOUNDED: dict[str, Any] = {
    "max_step": np.inf,
    "max_slope": np.inf,
    "max_intercept": np.inf,
    "memory": 0.0,
    "update": "vllm",
}


def serving_loop(exploration: float = 0.01, seed: int = 0, **estimator: Any) -> TrimmingServing:
    """Decode steps with trimming on (compute-bound costs: every extra token 8% of a step)."""
    return TrimmingServing(R, K, exploration=exploration, seed=seed, **estimator)


def rounds_until(
    serving: TrimmingServing, workload: SyntheticWorkload, tolerance: float, limit: int
) -> int:
    return serving.rounds_until(workload, tolerance, limit)


def test_one_adversarial_round_is_recovered_from_while_trimming() -> None:
    serving = serving_loop(exploration=0.05, memory=0.9)
    for _ in range(20):
        serving.round(STATIONARY)
    serving.adversarial_round()
    assert curve_error(serving.est, STATIONARY) > 0.5  # the attack did knock it off
    trimmed_before = serving.trimmed
    assert rounds_until(serving, STATIONARY, 0.05, limit=12) <= 12
    assert serving.trimmed > trimmed_before  # trimming stayed on throughout


def test_without_bounds_or_exploration_the_estimator_locks_itself_out() -> None:
    # The counterfactual: vLLM's unbounded step and no exploration floor.
    serving = serving_loop(exploration=0.0, **UNBOUNDED)
    for _ in range(5):
        serving.round(STATIONARY)
    serving.adversarial_round()
    assert serving.est.intercepts[0] < -1e4
    for _ in range(10):
        serving.round(STATIONARY)
    assert curve_error(serving.est, STATIONARY) > 0.9


def test_a_workload_switch_is_tracked_within_a_few_rounds() -> None:
    for memory in (0.0, 0.9):
        serving = serving_loop(exploration=0.05, memory=memory)
        for _ in range(20):
            serving.round(HIGH)
        assert curve_error(serving.est, LOW) > 0.3
        assert rounds_until(serving, LOW, 0.1, limit=8) <= 8, memory


def test_recovery_at_the_defaults_holds_across_seeds() -> None:
    """Not one lucky seed: at the defaults (γ = 0.8, exploration 0.01) every seed recovers from
    the adversarial round and tracks the switch. The bound is loose on purpose: over 20 seeds
    the worst took 23 and 20 rounds (docs/reliability.md, scripts/seed_study.py)."""
    for seed in range(6):
        serving = serving_loop(exploration=0.01, seed=seed)
        for _ in range(20):
            serving.round(STATIONARY)
        serving.adversarial_round()
        assert curve_error(serving.est, STATIONARY) > 0.5
        assert rounds_until(serving, STATIONARY, 0.05, limit=40) <= 40, seed
        switching = serving_loop(exploration=0.01, seed=seed)
        for _ in range(20):
            switching.round(HIGH)
        assert rounds_until(switching, LOW, 0.1, limit=40) <= 40, seed
