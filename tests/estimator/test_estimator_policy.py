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
    far = AcceptanceEstimator(K, refit_interval=1 << 40, update="vllm")
    manual = AcceptanceEstimator(K, refit_interval=None, update="vllm")
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


# --- found by review: bounds and argument types of the policy's entry points -----------------

MAX_COUNT = 2**56  # the most steps a saved state may hold (av_core/src/estimator/accumulator.rs)


@pytest.mark.parametrize(("update", "interval"), [("vllm", None), ("map", None), ("vllm", 2**60)])
def test_a_step_count_at_its_bound_stays_there_and_the_state_reloads(
    update: str, interval: int | None
) -> None:
    state = AcceptanceEstimator(K, refit_interval=interval, update=update).state_dict()
    state["steps_since_refit"] = MAX_COUNT
    est = AcceptanceEstimator.from_state_dict(state)
    x, admitted, accepted = batch(np.random.default_rng(4))
    for _ in range(3):
        est.observe(x, admitted, accepted)
    assert (est.steps_since_refit, est.num_refits) == (MAX_COUNT, 0)
    # Whatever it reached saves and loads again, by every route.
    for again in (
        AcceptanceEstimator.from_bytes(est.to_bytes()),
        AcceptanceEstimator.from_state_dict(est.state_dict()),
        pickle.loads(pickle.dumps(est)),
    ):
        assert again.to_bytes() == est.to_bytes()
    est.refit()
    assert (est.steps_since_refit, est.num_refits) == (0, 1)


@pytest.mark.parametrize("bad", [1, 3.5, None, b"map", ["map"]])
def test_update_of_another_type_is_a_type_error_naming_it(bad: object) -> None:
    if bad is None:  # from_state_dict's default: no change of update
        assert AcceptanceEstimator.from_state_dict(AcceptanceEstimator(K).state_dict(), update=bad)
        with pytest.raises(TypeError, match=r"^update: must be a string, got NoneType \(None\)$"):
            AcceptanceEstimator(K, update=bad)  # type: ignore[arg-type]
        return
    expected = rf"^update: must be a string, got {type(bad).__name__} \("
    with pytest.raises(TypeError, match=expected):
        AcceptanceEstimator(K, update=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=expected):
        AcceptanceEstimator.from_state_dict(AcceptanceEstimator(K).state_dict(), update=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, 2**64])
def test_refit_interval_states_the_range_it_accepts(bad: int) -> None:
    with pytest.raises(
        ValueError,
        match=rf"^refit_interval: must be an integer in 1\.\.=18446744073709551615, got {bad}$",
    ):
        AcceptanceEstimator(K, refit_interval=bad)


def test_the_config_is_a_mapping_of_string_keys() -> None:
    config = AcceptanceEstimator(K).config
    for key in (0, None, ("l2",), b"l2"):
        assert key not in config
        with pytest.raises(KeyError):
            config[key]  # type: ignore[index]
    assert config["l2"] == 0.001 and "l2" in config


def test_the_vllm_drop_in_restores_counters_as_the_native_state_does() -> None:
    torch = pytest.importorskip("torch")
    from av_core.vllm import OnlineAcceptanceEstimator

    est = OnlineAcceptanceEstimator(4, K, torch.device("cpu"))
    state = est.state_dict()
    est.load_state_dict({**state, "steps_since_refit": np.int64(3), "refits": np.uint8(2)})
    assert est.state_dict()["steps_since_refit"] == 3 and est.state_dict()["refits"] == 2
    with pytest.raises(TypeError, match=r"^state\['refits'\] must be an int, got bool$"):
        est.load_state_dict({**state, "refits": True})
    with pytest.raises(ValueError, match=r"^state\['steps_since_refit'\] must be >= 0, got -1$"):
        est.load_state_dict({**state, "steps_since_refit": -1})
    assert est.state_dict()["steps_since_refit"] == 3  # a refused state changed nothing
