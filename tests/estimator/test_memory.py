"""Newton steps with memory across rounds: lower jitter, same drift tracking, same state rules."""

from __future__ import annotations

import numpy as np
import pytest

from av_core import AcceptanceEstimator
from av_core.tools.evaluate import ONLINE, evaluate_trace
from av_core.tools.synthetic import SyntheticWorkload, labeled_log_loss, refit_rounds
from av_core.tools.trace import SHIPPED_TRACES, load_shipped_trace

STATIONARY = SyntheticWorkload(slope=0.55, intercepts=(1.4, 0.9, 0.5, 0.1))
HIGH = SyntheticWorkload(slope=0.55, intercepts=(2.0, 1.5, 1.0, 0.5))
LOW = SyntheticWorkload(slope=0.55, intercepts=(-0.5, -1.0, -1.5, -2.0))


def run_rounds(
    est: AcceptanceEstimator, workload: SyntheticWorkload, rounds: int, rng: np.random.Generator
) -> np.ndarray:
    return refit_rounds(est, workload, rounds, rng)


def log_loss(
    est: AcceptanceEstimator, workload: SyntheticWorkload, use_truth: bool = False
) -> float:
    """Mean log-loss over labeled positions of a fixed evaluation sample (truth: optimum)."""
    return labeled_log_loss(None if use_truth else est, workload)


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_memory_cuts_coefficient_jitter_at_least_twofold(update: str) -> None:
    stds = {}
    for gamma in (0.0, 0.9):
        est = AcceptanceEstimator(4, memory=gamma, update=update)
        history = run_rounds(est, STATIONARY, 50, np.random.default_rng(1))[15:]
        stds[gamma] = history.std(axis=0)
        np.testing.assert_allclose(history.mean(axis=0)[1:], STATIONARY.intercepts, atol=0.1)
    assert np.all(stds[0.9] * 2 <= stds[0.0]), stds


def rounds_to_recover(gamma: float, update: str) -> int:
    est = AcceptanceEstimator(4, memory=gamma, update=update)
    rng = np.random.default_rng(2)
    run_rounds(est, HIGH, 30, rng)
    optimum = log_loss(est, LOW, use_truth=True)
    for r in range(1, 40):
        run_rounds(est, LOW, 1, rng)
        if log_loss(est, LOW) <= 1.05 * optimum:
            return r
    raise AssertionError(f"memory={gamma} never recovered")


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_drift_is_tracked_as_fast_as_without_memory(update: str) -> None:
    without = rounds_to_recover(0.0, update)
    with_memory = rounds_to_recover(0.9, update)
    assert with_memory <= 1.5 * without, (with_memory, without)


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_without_the_drift_test_fixed_memory_tracks_drift_slowly(update: str) -> None:
    # The counterfactual the drift test exists for: the same memory, never dropped.
    est = AcceptanceEstimator(4, memory=0.9, drift_z=float("inf"), update=update)
    rng = np.random.default_rng(2)
    run_rounds(est, HIGH, 30, rng)
    run_rounds(est, LOW, 2, rng)
    assert log_loss(est, LOW) > 1.05 * log_loss(est, LOW, use_truth=True)


def test_memory_zero_is_the_memoryless_update_bit_for_bit() -> None:
    # vLLM's update keeps no memory at all at γ = 0.
    a = AcceptanceEstimator(4, memory=0.0, update="vllm")
    b = AcceptanceEstimator(4, memory=0.0, drift_z=1.0, update="vllm")
    ha = run_rounds(a, STATIONARY, 5, np.random.default_rng(3))
    hb = run_rounds(b, STATIONARY, 5, np.random.default_rng(3))
    assert ha.tobytes() == hb.tobytes()
    assert b.state_dict()["memory_state"]["total"] == 0.0


def test_map_memory_zero_keeps_only_the_last_round_whatever_the_drift_test() -> None:
    # av_core's map update at γ = 0: each round's end fits that round alone, so dropping the
    # memory (a drift test at 1 sd fires often) changes no bit.
    a = AcceptanceEstimator(4, memory=0.0, update="map")
    b = AcceptanceEstimator(4, memory=0.0, drift_z=1.0, update="map")
    ha = run_rounds(a, STATIONARY, 5, np.random.default_rng(3))
    hb = run_rounds(b, STATIONARY, 5, np.random.default_rng(3))
    assert ha.tobytes() == hb.tobytes()
    assert b.state_dict()["memory_state"]["resets"] > 0
    last = sum(b.state_dict()["memory_state"]["count"])
    assert 0 < last <= 10 * 4 * b.refit_interval  # one round's labels at most


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_memory_state_round_trips(update: str) -> None:
    est = AcceptanceEstimator(4, memory=0.8, update=update)
    run_rounds(est, STATIONARY, 4, np.random.default_rng(4))
    state = est.state_dict()
    memory = state["memory_state"]
    assert (memory["total"] if update == "vllm" else sum(memory["count"])) > 0
    copies = [
        AcceptanceEstimator.from_state_dict(state),
        AcceptanceEstimator.from_bytes(est.to_bytes()),
    ]
    assert all(c.state_dict() == state for c in copies)
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    for e in (est, *copies):
        e.observe(x, [4, 2], [3, 1])
        e.refit()
    assert all(c.state_dict() == est.state_dict() for c in copies)


def test_the_default_is_the_chosen_memory() -> None:
    assert AcceptanceEstimator(4).memory == 0.8
    assert AcceptanceEstimator(4).state_dict()["config"]["memory"] == 0.8


@pytest.mark.parametrize("update", ["vllm", "map"])
@pytest.mark.parametrize("name", SHIPPED_TRACES)
def test_the_default_memory_beats_the_memoryless_update_on_every_real_trace(
    name: str, update: str
) -> None:
    """The criterion the default was chosen by (docs/memory.md), scored prequentially:
    lower log-loss and ECE than the same update without memory (under ``update="vllm"``,
    vLLM's memoryless update), and no worse AUC."""
    trace = load_shipped_trace(name)
    default = evaluate_trace(trace, update=update).feature(ONLINE).report.overall
    memoryless = evaluate_trace(trace, memory=0.0, update=update).feature(ONLINE).report.overall
    assert default.log_loss < memoryless.log_loss
    assert default.ece < memoryless.ece
    assert default.auc >= memoryless.auc


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"memory": -0.1}, "memory"),
        ({"memory": 1.0}, "memory"),
        ({"memory": float("nan")}, "memory"),
        ({"drift_z": 0.0}, "drift_z"),
    ],
)
def test_bad_memory_settings_are_refused(kwargs: dict[str, float], text: str) -> None:
    with pytest.raises(ValueError, match=text):
        AcceptanceEstimator(4, **kwargs)


def test_a_fold_that_would_overflow_drops_the_memory_and_the_state_still_reloads() -> None:
    # An l2 and a slope at the edge of f64 (a loaded state may hold them): the round's fold
    # l2 * slope overflows. The memory is dropped (one reset), the coefficients stay, and the
    # estimator's own bytes load again.
    est = AcceptanceEstimator(1, update="vllm", memory=0.8, refit_interval=2)
    state = est.state_dict()
    state["config"]["l2"] = 4e175
    state["config"]["max_slope"] = 5e175
    state["slope"] = 4e175
    est = AcceptanceEstimator.from_state_dict(state)
    est.observe(np.zeros((2, 1), np.float32), [1, 0], [0, 0])
    est.refit()
    memory = est.state_dict()["memory_state"]
    assert memory["resets"] == 1
    assert memory["a"] == memory["total"] == 0.0
    assert memory["rhs"] == [0.0, 0.0]
    assert est.slope == 4e175
    again = AcceptanceEstimator.from_bytes(est.to_bytes())
    assert again.to_bytes() == est.to_bytes()
