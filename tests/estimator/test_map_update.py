"""av_core's map update (docs/estimator.md) against independent float64 references: the
histograms against a bin-by-bin numpy count, the fits against scipy's posterior mode, the
schedule, determinism, persistence (including the version-1 fixture) and the numpy model of
scripts/cold_start_study.py.

The tests that assert vLLM's update on purpose construct it with ``update="vllm"``
(tests/estimator/test_estimator.py and others); these are their map counterparts."""

from __future__ import annotations

import importlib.util
import json
import pickle
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from av_core import AcceptanceEstimator
from av_core.tools.synthetic import SyntheticWorkload

import reference

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data"
WIDTHS = (0.15, 1.0, 0.2, 0.1)  # slope, level, trend, spread: the defaults
X_UNIT = 2.0**-16


def batch(
    rng: np.random.Generator, rows: int, k: int, slope: float = 0.55, level: float = 0.8
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows drafted from a logistic model with intercepts falling with depth."""
    x = rng.normal(1.0, 3.0, size=(rows, k)).astype(np.float32)
    p = 1.0 / (1.0 + np.exp(-(slope * x + level - 0.4 * np.arange(k))))
    ok = rng.random((rows, k)) < p
    accepted = np.where(ok.all(axis=1), k, np.argmin(ok, axis=1)).astype(np.int64)
    admitted = np.minimum(accepted + rng.integers(0, 2, size=rows), k).astype(np.int64)
    return x, admitted, accepted


def histogram_of(est: AcceptanceEstimator) -> dict[str, np.ndarray]:
    r = est.state_dict()["round_stats"]
    k, bins = est.num_positions, r["bins"]
    return {
        name: np.asarray(r[name], dtype=np.float64).reshape(k, bins)
        for name in ("count", "accepted", "x_sum")
    }


def prior(k: int, widths: tuple[float, float, float, float] = WIDTHS) -> tuple[Any, Any]:
    precision = reference.prior_precision(k, *widths)
    mean = np.concatenate([[0.5], np.full(k, -0.2)])
    return precision, mean


def theta_of(est: AcceptanceEstimator) -> np.ndarray:
    return np.concatenate([[est.slope], est.intercepts])


# --- the statistics ---------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(0, 60), k=st.integers(1, 8))
def test_histograms_count_every_label_in_its_bin(seed: int, rows: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 25.0, size=(rows, k)).astype(np.float32)  # many clamped at ±40
    admitted = rng.integers(0, k + 1, size=rows)
    accepted = np.array([rng.integers(0, a + 1) for a in admitted], dtype=np.int64)
    est = AcceptanceEstimator(k, update="map", refit_interval=1 << 40)
    est.observe(x, admitted, accepted)
    got = histogram_of(est)
    want = reference.histograms(x, admitted, accepted)
    np.testing.assert_array_equal(got["count"], want["n"])
    np.testing.assert_array_equal(got["accepted"], want["a"])
    # x_sum is Σ round((x + 40)·2^16): the features' sum to half a unit per term.
    x_sum = got["x_sum"] * X_UNIT - 40.0 * got["count"]
    assert np.all(np.abs(x_sum - want["x"]) <= got["count"] * X_UNIT / 2 + 1e-9)
    assert est.round_counts().tolist() == want["n"].sum(axis=1).astype(int).tolist()


# --- the fits ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_a_rounds_end_is_the_posterior_mode_of_its_histograms(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = 1 + seed % 4
    est = AcceptanceEstimator(k, update="map", refit_interval=1 << 40, l2=0.0)
    x, admitted, accepted = batch(rng, 300, k)
    est.observe(x, admitted, accepted)
    h = histogram_of(est)
    est.refit()
    precision, mean = prior(k)
    want = reference.map_fit(
        h["count"], h["accepted"], h["x_sum"] * X_UNIT - 40 * h["count"], precision, mean, mean
    )
    np.testing.assert_allclose(theta_of(est), want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.8])
def test_the_memory_is_the_discounted_sum_of_past_rounds(gamma: float) -> None:
    rng = np.random.default_rng(11)
    k = 3
    est = AcceptanceEstimator(k, update="map", refit_interval=1 << 40, memory=gamma, drift_z=np.inf)
    total = None
    for _ in range(3):
        x, admitted, accepted = batch(rng, 120, k)
        est.observe(x, admitted, accepted)
        h = histogram_of(est)
        round_ = {**h, "x_sum": h["x_sum"] * X_UNIT - 40 * h["count"]}
        # Positions without labels hold the intercept of the last round's end (the reference).
        held = est.state_dict()["reference"]
        start = np.concatenate([[held["slope"]], held["intercepts"]])
        total = round_ if total is None else {n: gamma * total[n] + round_[n] for n in round_}
        est.refit()
        precision, mean = prior(k)
        want = reference.map_fit(
            total["count"], total["accepted"], total["x_sum"], precision, mean, start
        )
        np.testing.assert_allclose(theta_of(est), want, rtol=0, atol=2e-6)


def test_without_a_prior_the_round_end_is_the_maximum_likelihood_fit() -> None:
    rng = np.random.default_rng(4)
    est = AcceptanceEstimator(
        2,
        update="map",
        refit_interval=1 << 40,
        prior_slope_sd=np.inf,
        prior_spread_sd=np.inf,
        l2=0.0,
        max_step=np.inf,
    )
    x, admitted, accepted = batch(rng, 400, 2, slope=0.8, level=0.3)
    est.observe(x, admitted, accepted)
    h = histogram_of(est)
    est.refit()
    zero = np.zeros((3, 3))
    start = np.array([0.5, -0.2, -0.2])
    want = reference.map_fit(
        h["count"], h["accepted"], h["x_sum"] * X_UNIT - 40 * h["count"], zero, start, start
    )
    np.testing.assert_allclose(theta_of(est), want, rtol=0, atol=2e-6)
    assert want[0] == pytest.approx(0.8, abs=0.15)  # the data's slope, not the prior's 0.5


def test_the_prior_pulls_a_thin_round_toward_the_cold_start() -> None:
    # Three labels say little: the fit moves less than the unpenalized one would.
    x = np.array([[4.0], [3.0], [-1.0]], np.float32)
    admitted, accepted = np.ones(3, np.int64), np.array([1, 1, 1])
    with_prior = AcceptanceEstimator(1, update="map", refit_interval=1 << 40)
    no_prior = AcceptanceEstimator(
        1, update="map", refit_interval=1 << 40, prior_slope_sd=np.inf, prior_spread_sd=np.inf
    )
    for est in (with_prior, no_prior):
        est.observe(x, admitted, accepted)
        est.refit()
    assert abs(with_prior.intercepts[0] + 0.2) < abs(no_prior.intercepts[0] + 0.2)
    assert 0 < with_prior.intercepts[0] + 0.2 < 1.0


# --- the schedule -----------------------------------------------------------------------------


def test_fits_run_after_the_1st_2nd_4th_step_of_every_round_and_at_its_end() -> None:
    rng = np.random.default_rng(0)
    est = AcceptanceEstimator(2, update="map", refit_interval=10)
    fits = [est.observe(*batch(rng, 4, 2)) for _ in range(25)]
    places = [(i % 10) + 1 for i in range(25)]
    assert fits == [p in (1, 2, 4, 8, 10) for p in places]
    assert est.num_refits == sum(fits) and est.steps_since_refit == 5


def test_the_fits_within_a_round_do_not_change_how_it_ends() -> None:
    # One round of 8 steps with fits after steps 1, 2, 4 and 8, against the same 8 steps in one
    # observe each but no schedule (refit_interval huge) and an explicit refit: the same bits.
    rng = np.random.default_rng(1)
    steps = [batch(rng, 16, 3) for _ in range(16)]
    scheduled = AcceptanceEstimator(3, update="map", refit_interval=8)
    explicit = AcceptanceEstimator(3, update="map", refit_interval=1 << 40)
    for round_ in range(2):
        for s in steps[8 * round_ : 8 * round_ + 8]:
            scheduled.observe(*s)
            explicit.observe(*s, count_step=False)  # no fit inside the round at all
        explicit.refit()
        assert scheduled.slope == explicit.slope
        assert scheduled.intercepts.tobytes() == explicit.intercepts.tobytes()


def test_threads_give_the_serial_round_statistics_and_round_ends() -> None:
    rng = np.random.default_rng(3)
    k = 4
    batches = [batch(rng, 32, k) for _ in range(48)]
    serial = AcceptanceEstimator(k, update="map", refit_interval=1 << 40)
    for b in batches:
        serial.observe(*b)
    parallel = AcceptanceEstimator(k, update="map", refit_interval=1 << 40)
    workers = [
        threading.Thread(target=lambda i=i: [parallel.observe(*b) for b in batches[i::6]])
        for i in range(6)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    a, b = serial.state_dict(), parallel.state_dict()
    assert a["round_stats"] == b["round_stats"]
    assert (a["num_refits"], a["steps_since_refit"]) == (b["num_refits"], b["steps_since_refit"])
    serial.refit()
    parallel.refit()
    assert serial.state_dict() == parallel.state_dict()


def test_rounds_without_labels_change_nothing() -> None:
    est = AcceptanceEstimator(3, update="map", refit_interval=4)
    x = np.ones((5, 3), dtype=np.float32)
    for _ in range(4):
        est.observe(x, np.zeros(5, np.int64), np.zeros(5, np.int64))
    est.observe(np.zeros((0, 3), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    est.refit()
    # Fits after steps 1, 2 and 4, the round's end at 4, then step 1 of the next and its end.
    assert est.num_refits == 3 + 1 + 1
    assert est.slope == 0.5
    assert est.intercepts.tolist() == [-0.2, -0.2, -0.2]


def test_positions_never_reached_keep_their_intercepts_bit_identical() -> None:
    rng = np.random.default_rng(3)
    est = AcceptanceEstimator(4, update="map", refit_interval=10)
    for _ in range(50):
        x = rng.normal(size=(32, 4)).astype(np.float32)
        admitted = rng.integers(0, 3, size=32)  # never beyond position 1
        accepted = np.array([rng.integers(0, a + 1) for a in admitted])
        est.observe(x, admitted, accepted)
    assert est.num_refits == 5 * 5  # steps 1, 2, 4, 8 and 10 of each round
    assert est.intercepts[2:].tobytes() == np.full(2, -0.2).tobytes()
    assert np.all(est.intercepts[:2] != -0.2)


def test_a_workload_switch_fires_the_drift_test() -> None:
    est = AcceptanceEstimator(4, update="map", refit_interval=20)
    rng = np.random.default_rng(8)
    high = SyntheticWorkload(0.55, (2.0, 1.5, 1.0, 0.5))
    low = SyntheticWorkload(0.55, (-0.5, -1.0, -1.5, -2.0))
    for workload in (high, low):
        for _ in range(200):
            s = workload.step(rng, 16)
            est.observe(s.features, s.num_admitted, s.num_accepted)
        resets = est.state_dict()["memory_state"]["resets"]
        if workload is high:
            assert resets <= 1  # the cold start's first round, at most
            before = resets
    assert resets > before
    np.testing.assert_allclose(est.intercepts, low.intercepts, atol=0.25)


# --- persistence ------------------------------------------------------------------------------


def fitted(k: int = 3) -> AcceptanceEstimator:
    rng = np.random.default_rng(5)
    est = AcceptanceEstimator(
        k,
        update="map",
        refit_interval=3,
        l2=1e-2,
        init_slope=0.7,
        init_intercept=0.1,
        max_log_odds=30.0,
    )
    for _ in range(7):
        est.observe(*batch(rng, 8, k))
    return est


def test_state_dict_round_trips_bit_exactly_and_pickles() -> None:
    est = fitted()
    state = est.state_dict()
    assert state["format_version"] == 2 and state["config"]["update"] == "map"
    assert state["num_refits"] == 2 * 3 + 1 and state["steps_since_refit"] == 1
    back = AcceptanceEstimator.from_state_dict(state)
    assert back.state_dict() == state
    clone = pickle.loads(pickle.dumps(est))
    assert clone.state_dict() == state
    assert AcceptanceEstimator.from_bytes(est.to_bytes()).state_dict() == state
    rng = np.random.default_rng(6)
    x, ad, ac = batch(rng, 8, 3)
    for e in (est, back, clone):
        e.observe(x, ad, ac)
        e.refit()
    assert est.state_dict() == back.state_dict() == clone.state_dict()


def test_impossible_map_state_dicts_are_refused_by_name() -> None:
    state = fitted().state_dict()
    stats = state["round_stats"]
    occupied = next(i for i, n in enumerate(stats["count"]) if n > 0)

    def changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
        import copy

        out = copy.deepcopy(state)
        target = out
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return out

    cases = [
        (("round_stats", "accepted", occupied), stats["count"][occupied] + 1, "round_stats"),
        (("round_stats", "x_sum", occupied), 0, "round_stats"),
        (("round_stats", "bins"), 32, "round_stats"),
        (("memory_state", "count", 0), -1.0, "memory"),
        (("memory_state", "resets"), 2**40, "memory"),
        (("reference", "slope"), -1.0, "reference"),
        (("fitted_labels",), 10**9, "fitted_labels"),
        (("config", "update"), "newton", "update"),
        (("config", "bins"), 0, "bins"),
        (("config", "prior_level_sd"), 0.0, "prior_level_sd"),
    ]
    for path, value, argument in cases:
        with pytest.raises(ValueError, match=argument):
            AcceptanceEstimator.from_state_dict(changed(path, value))
    # A vllm estimator's state under the map update's name is not a map state.
    with pytest.raises(ValueError, match="map|round_stats|reference"):
        AcceptanceEstimator.from_state_dict(
            changed(("config", "update"), "map") | {"round_stats": {"fraction_bits": 36}}
        )


def test_moving_a_state_between_updates_keeps_its_predictions() -> None:
    est = fitted()
    x = np.linspace(-5, 5, 12, dtype=np.float32).reshape(4, 3)
    moved = AcceptanceEstimator.from_state_dict(est.state_dict(), update="vllm")
    assert moved.update == "vllm" and moved.round_counts().sum() == 0
    np.testing.assert_array_equal(moved.predict(x), est.predict(x))
    back = AcceptanceEstimator.from_state_dict(moved.state_dict(), update="map")
    assert back.state_dict()["reference"]["slope"] == est.slope
    np.testing.assert_array_equal(back.predict(x), est.predict(x))
    with pytest.raises(ValueError, match="update"):
        AcceptanceEstimator.from_state_dict(est.state_dict(), update="newton")


def test_a_version_1_state_loads_predicts_and_continues_bit_for_bit() -> None:
    """tests/data/estimator_v1.*: written by av_core before the map update (format version 1,
    make_estimator_v1.py), with what that build predicted from it and where it went next."""
    record = json.loads((DATA / "estimator_v1.json").read_text())
    grid = np.asarray(record["grid"], dtype=np.float32).reshape(-1, 3)
    want = np.asarray(record["predictions_f32_bits"], dtype=np.uint32)
    assert record["state_dict"]["format_version"] == 1
    from_bytes = AcceptanceEstimator.from_bytes((DATA / "estimator_v1.bin").read_bytes())
    from_dict = AcceptanceEstimator.from_state_dict(record["state_dict"])
    for est in (from_bytes, from_dict):
        assert est.update == "vllm"
        np.testing.assert_array_equal(est.predict(grid).view(np.uint32).ravel(), want)
    assert from_bytes.state_dict() == from_dict.state_dict()
    # It goes on exactly as the old build did: the same observes and refit, the same bits.
    spec = importlib.util.spec_from_file_location("make_v1", DATA / "make_estimator_v1.py")
    assert spec is not None and spec.loader is not None
    make_v1 = importlib.util.module_from_spec(spec)
    sys.modules["make_v1"] = make_v1
    spec.loader.exec_module(make_v1)
    assert make_v1.continuation(from_bytes) == record["continuation"]
    # Moved to the map update, it predicts the same until it refits.
    moved = AcceptanceEstimator.from_state_dict(record["state_dict"], update="map")
    np.testing.assert_array_equal(moved.predict(grid).view(np.uint32).ravel(), want)


# --- the numpy model of docs/estimator.md --------------------------------------------------


def study() -> Any:
    path = HERE.parents[1] / "scripts" / "cold_start_study.py"
    spec = importlib.util.spec_from_file_location("cold_start_study", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cold_start_study"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("interval", "batch_rounds"), [(25, 4), (100, 1)])
def test_the_numpy_model_of_the_design_predicts_what_the_core_predicts(
    interval: int, batch_rounds: int
) -> None:
    """scripts/cold_start_study.py's numpy model (its own binning, prior, Newton and schedule)
    and the Rust core agree on a shipped trace, prediction for prediction."""
    s = study()
    stream = s.shipped_stream(s.SHIPPED_TRACES[0])
    k = stream.x.shape[1]
    model, _ = s.replay(stream, s.CHOSEN(k, interval), batch_rounds)
    native, _ = s.replay(stream, s.native("map")(k, interval), batch_rounds)
    lab = stream.labeled
    assert np.abs(model[lab] - native[lab]).max() < 1e-5
