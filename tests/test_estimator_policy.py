"""The estimator's policies for callers that run their own schedule (av_core.vllm's drop-in):
manual refits (``refit_interval=None``) and ``set_regularization``, each checked against what it
replaces (an interval no run reaches; a rebuild through ``state_dict``)."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest

from av_core import AcceptanceEstimator

K = 3


def batch(rng: np.random.Generator, rows: int = 6) -> tuple[Any, Any, Any]:
    x = rng.normal(0.5, 2.5, size=(rows, K)).astype(np.float32)
    p = 1.0 / (1.0 + np.exp(-(0.8 * x - 0.3 * np.arange(K))))
    ok = rng.random((rows, K)) < p
    accepted = np.where(ok.all(axis=1), K, np.argmin(ok, axis=1))
    admitted = np.minimum(accepted + rng.integers(0, 2, size=rows), K)
    return x, admitted, accepted


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_a_manual_estimator_refits_only_when_refit_is_called(update: str) -> None:
    est = AcceptanceEstimator(K, refit_interval=None, update=update)
    assert est.refit_interval is None and est.config.refit_interval is None
    rng = np.random.default_rng(1)
    for _ in range(250):
        assert est.observe(*batch(rng)) is False
    assert (est.num_refits, est.steps_since_refit) == (0, 250)
    assert est.slope == 0.5 and est.intercepts.tolist() == [-0.2] * K
    est.refit()
    assert (est.num_refits, est.steps_since_refit) == (1, 0)
    assert est.slope != 0.5
    assert est.observe(*batch(rng)) is False and est.num_refits == 1


def test_manual_is_an_interval_never_reached_bit_for_bit() -> None:
    # What av_core.vllm built before: refit_interval = 1 << 40.
    far = AcceptanceEstimator(K, refit_interval=1 << 40)
    manual = AcceptanceEstimator(K, refit_interval=None)
    rng_a, rng_b = np.random.default_rng(2), np.random.default_rng(2)
    for step in range(30):
        assert far.observe(*batch(rng_a)) == manual.observe(*batch(rng_b))
        if step % 7 == 6:
            assert far.refit(report=True) == manual.refit(report=True)
    a, b = far.state_dict(), manual.state_dict()
    assert a["config"].pop("refit_interval") == 1 << 40
    assert b["config"].pop("refit_interval") is None
    assert a == b
    # A state at 1 << 40 still loads and behaves as before: an interval.
    again = AcceptanceEstimator.from_state_dict(far.state_dict())
    assert again.refit_interval == 1 << 40


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_a_manual_state_round_trips_through_bytes_state_dict_and_pickle(update: str) -> None:
    est = AcceptanceEstimator(K, refit_interval=None, update=update)
    rng = np.random.default_rng(3)
    for _ in range(5):
        est.observe(*batch(rng))
    state = est.state_dict()
    assert state["config"]["refit_interval"] is None
    assert state["format_version"] == (1 if update == "vllm" else 2)
    for back in (
        AcceptanceEstimator.from_bytes(est.to_bytes()),
        AcceptanceEstimator.from_state_dict(copy.deepcopy(state)),
        pickle.loads(pickle.dumps(est)),
    ):
        assert back.refit_interval is None
        assert back.state_dict() == state
        assert back.to_bytes() == est.to_bytes()
    # The constructor takes the config back, manual included.
    assert AcceptanceEstimator(**est.config).refit_interval is None


def test_refit_interval_zero_and_bad_types_are_still_refused() -> None:
    with pytest.raises(ValueError, match="refit_interval"):
        AcceptanceEstimator(K, refit_interval=0)
    with pytest.raises(TypeError, match="refit_interval"):
        AcceptanceEstimator(K, refit_interval=True)
    state = AcceptanceEstimator(K).state_dict()
    state["config"]["refit_interval"] = "never"
    with pytest.raises(TypeError, match="refit_interval"):
        AcceptanceEstimator.from_state_dict(state)


def rebuilt(est: AcceptanceEstimator, l2: float, damping: float) -> AcceptanceEstimator:
    """What av_core.vllm did before ``set_regularization``."""
    state = est.state_dict()
    state["config"] = {**state["config"], "l2": l2, "damping": damping}
    return AcceptanceEstimator.from_state_dict(state)


@pytest.mark.parametrize(
    "options",
    [
        {"refit_interval": 4},
        {"refit_interval": None, "memory": 0.0, "max_step": float("inf")},
        {"refit_interval": 4, "update": "map"},
    ],
)
def test_set_regularization_equals_the_rebuild_bit_for_bit(options: dict[str, Any]) -> None:
    changed = AcceptanceEstimator(K, **options)
    rng = np.random.default_rng(4)
    for _ in range(9):
        changed.observe(*batch(rng))
    for l2, damping in [(0.25, 5.0), (0.0, 0.0), (3.0, 400)]:
        rebuild = rebuilt(changed, l2, float(damping))
        changed.set_regularization(l2=l2, damping=damping)
        assert (changed.l2, changed.damping) == (l2, damping)
        assert changed.config == rebuild.config
        assert changed.to_bytes() == rebuild.to_bytes()
        same = np.random.default_rng(int(l2 * 100))
        for _ in range(11):
            x, admitted, accepted = batch(same)
            assert changed.observe(x, admitted, accepted) == rebuild.observe(x, admitted, accepted)
        assert changed.refit(report=True).keys() == rebuild.refit(report=True).keys()
        assert changed.state_dict() == rebuild.state_dict()
        probe = np.linspace(-8, 8, 3 * K, dtype=np.float32).reshape(3, K)
        np.testing.assert_array_equal(changed.predict(probe), rebuild.predict(probe))


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"l2": -1e-3, "damping": 50.0}, ValueError, "l2"),
        ({"l2": float("nan"), "damping": 50.0}, ValueError, "l2"),
        ({"l2": 1e-3, "damping": -1.0}, ValueError, "damping"),
        ({"l2": 1e-3, "damping": float("inf")}, ValueError, "damping"),
        ({"l2": 1e-3, "damping": True}, TypeError, "damping"),
        ({"l2": "x", "damping": 50.0}, TypeError, "l2"),
        ({"l2": 10**400, "damping": 50.0}, ValueError, "l2"),
    ],
)
def test_set_regularization_refuses_bad_values_and_changes_nothing(
    kwargs: dict[str, Any], error: type[Exception], argument: str
) -> None:
    est = AcceptanceEstimator(K, refit_interval=2)
    est.observe(*batch(np.random.default_rng(5)))
    before = est.to_bytes()
    with pytest.raises(error, match=argument):
        est.set_regularization(**kwargs)
    assert est.to_bytes() == before
    assert (est.l2, est.damping) == (1e-3, 50.0)
