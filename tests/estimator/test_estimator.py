"""The online acceptance estimator against independent float64 references."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from av_core import AcceptanceEstimator
from av_core.tools.synthetic import SyntheticWorkload, sigmoid

import reference

# Statistics in state_dict() are fixed-point integers in units of 2**-fraction_bits.
# (vLLM's update keeps them; av_core's map update keeps histograms.)
FRACTION = 2.0 ** AcceptanceEstimator(1, update="vllm").state_dict()["round_stats"]["fraction_bits"]


# vLLM's update has no step or range limits; these switch av_core's off for exact comparisons.
# vLLM's update: unbounded steps and no memory across rounds.
UNBOUNDED = {
    "max_step": np.inf,
    "max_slope": np.inf,
    "max_intercept": np.inf,
    "memory": 0.0,
    "update": "vllm",
}
# vLLM's update with av_core's bounds, memory and drift test: the tests below that read its IRLS
# moments or assert its damped step construct it explicitly (the default is "vllm" too;
# tests/estimator/test_map_update.py tests that one).
VLLM: dict[str, Any] = {"update": "vllm"}


def float_stats(estimator: AcceptanceEstimator) -> dict[str, np.ndarray]:
    raw = estimator.state_dict()["round_stats"]
    out = {key: np.array([v / FRACTION for v in raw[key]]) for key in ("a", "b", "c", "g0", "g1")}
    out["n"] = np.array(raw["n"], dtype=np.float64)
    return out


def inject(estimator: AcceptanceEstimator, stats: dict[str, np.ndarray]) -> AcceptanceEstimator:
    """A copy of `estimator` whose open round holds `stats` (floats, rounded to fixed point)."""
    state = estimator.state_dict()
    fixed = {
        key: [round(float(v) * FRACTION) for v in stats[key]] for key in ("a", "b", "c", "g0", "g1")
    }
    state["round_stats"].update(fixed, n=[int(v) for v in stats["n"]])
    return AcceptanceEstimator.from_state_dict(state)


def random_batch(rng: np.random.Generator, rows: int, k: int) -> tuple[np.ndarray, ...]:
    x = rng.normal(0.5, 4.0, size=(rows, k)).astype(np.float32)
    admitted = rng.integers(0, k + 1, size=rows)
    accepted = np.array([rng.integers(0, a + 1) for a in admitted], dtype=np.int64)
    p = rng.uniform(0.02, 0.98, size=(rows, k)).astype(np.float32)
    return x, admitted, accepted, p


# --- labels and statistics -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("admitted", "accepted", "counts", "residuals"),
    [
        (4, 2, [1, 1, 1, 0], [0.5, 0.5, -0.5, 0.0]),
        (4, 4, [1, 1, 1, 1], [0.5, 0.5, 0.5, 0.5]),
        (0, 0, [0, 0, 0, 0], [0.0, 0.0, 0.0, 0.0]),
        (3, 0, [1, 0, 0, 0], [-0.5, 0.0, 0.0, 0.0]),
        (2, 2, [1, 1, 0, 0], [0.5, 0.5, 0.0, 0.0]),
        (1, 0, [1, 0, 0, 0], [-0.5, 0.0, 0.0, 0.0]),
    ],
)
def test_label_rule_on_hand_made_cases(
    admitted: int, accepted: int, counts: list[int], residuals: list[float]
) -> None:
    est = AcceptanceEstimator(4, **VLLM)
    features = np.array([[1.0, -2.0, 3.0, 0.5]], dtype=np.float32)
    est.observe(features, [admitted], [accepted], np.full((1, 4), 0.5, dtype=np.float32))
    assert est.round_counts().tolist() == counts
    stats = float_stats(est)
    np.testing.assert_allclose(stats["g1"], residuals, atol=1e-12)
    # w = 0.25 on every labeled position, so c counts them a quarter each.
    np.testing.assert_allclose(stats["c"], 0.25 * np.array(counts), atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(0, 40),
    k=st.integers(1, 8),
    with_predictions=st.booleans(),
)
def test_statistics_match_float64_reference(
    seed: int, rows: int, k: int, with_predictions: bool
) -> None:
    rng = np.random.default_rng(seed)
    x, admitted, accepted, p = random_batch(rng, rows, k)
    est = AcceptanceEstimator(k, **VLLM)
    est.observe(x, admitted, accepted, p if with_predictions else None)
    if not with_predictions:
        z = 0.5 * np.clip(x.astype(np.float64), -40, 40) - 0.2
        p = sigmoid(z)
    want = reference.round_statistics(x, admitted, accepted, p)
    got = float_stats(est)
    for key in ("a", "b", "c", "g0", "g1"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-9, err_msg=key)
    np.testing.assert_array_equal(got["n"], want["n"])


# --- the refit -------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 8), interval=st.integers(1, 6))
def test_refit_matches_vllm_update(seed: int, k: int, interval: int) -> None:
    rng = np.random.default_rng(seed)
    est = AcceptanceEstimator(k, refit_interval=interval, **UNBOUNDED)
    slope, intercepts = 0.5, np.full(k, -0.2)
    for _ in range(3):
        total = {key: np.zeros(k) for key in ("a", "b", "c", "g0", "g1", "n")}
        for step in range(interval):
            x, admitted, accepted, p = random_batch(rng, 16, k)
            refitted = est.observe(x, admitted, accepted, p)
            assert refitted == (step == interval - 1)
            for key, value in reference.round_statistics(x, admitted, accepted, p).items():
                total[key] += value
        slope, intercepts = reference.vllm_refit(slope, intercepts, total)
        assert est.slope == pytest.approx(slope, rel=1e-9, abs=1e-9)
        np.testing.assert_allclose(est.intercepts, intercepts, rtol=1e-9, atol=1e-9)


def observed_stats(seed: int, k: int) -> dict[str, np.ndarray]:
    """Statistics of real observations, so that H is a genuine X^T W X."""
    rng = np.random.default_rng(seed)
    x, admitted, accepted, p = random_batch(rng, 64, k)
    return reference.round_statistics(x, admitted, accepted, p)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 16))
def test_cholesky_step_equals_numpy_solve(seed: int, k: int) -> None:
    # With damping 0 the refit applies the full Newton step, which must solve (H + lambda I) d = g.
    stats = observed_stats(seed, k)
    est = inject(AcceptanceEstimator(k, damping=0.0, init_slope=1e3, **UNBOUNDED), stats)
    h, g = reference.newton_system(stats, 1e-3)
    step = np.linalg.solve(h, g)
    est.refit()
    assert est.slope - 1e3 == pytest.approx(step[0], rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(est.intercepts + 0.2, step[1:], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("s", [0.5, 1.0, 3.0, 10.0])
def test_damping_arithmetic_on_injected_statistics(s: float) -> None:
    # b = 0, c = s, g1 = s/2, a = 30 s, g0 = 2 s, n_k = 20 s on K = 4, no ridge: the Newton step
    # is (2/30, 0.5, ...), damped by N/(N+50) with N = 80 s and by n_k/(n_k+50).
    k = 4
    stats = {
        "a": np.full(k, 30 * s / k),
        "b": np.zeros(k),
        "c": np.full(k, s),
        "g0": np.full(k, 2 * s / k),
        "g1": np.full(k, 0.5 * s),
        "n": np.full(k, 20 * s),
    }
    est = inject(AcceptanceEstimator(k, l2=0.0, **UNBOUNDED), stats)
    est.refit()
    n_total = 80 * s
    assert est.slope - 0.5 == pytest.approx((2 / 30) * n_total / (n_total + 50), rel=1e-10)
    np.testing.assert_allclose(est.intercepts + 0.2, 0.5 * 20 * s / (20 * s + 50), rtol=1e-10)


def test_slope_guard_keeps_the_slope_non_negative() -> None:
    k = 2
    stats = {
        "a": np.full(k, 1.0),
        "b": np.zeros(k),
        "c": np.full(k, 1.0),
        "g0": np.full(k, -50.0),
        "g1": np.zeros(k),
        "n": np.full(k, 1000.0),
    }
    est = inject(AcceptanceEstimator(k, **VLLM), stats)
    est.refit()
    assert est.slope == 0.5
    assert est.num_refits == 1


def test_rounds_without_observations_change_nothing() -> None:
    est = AcceptanceEstimator(3, refit_interval=4, **VLLM)
    x = np.ones((5, 3), dtype=np.float32)
    for _ in range(4):
        est.observe(x, np.zeros(5, np.int64), np.zeros(5, np.int64))
    est.observe(np.zeros((0, 3), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64))
    est.refit()
    assert est.num_refits == 2
    assert est.slope == 0.5
    assert est.intercepts.tolist() == [-0.2, -0.2, -0.2]


def test_positions_never_reached_keep_their_intercepts_bit_identical() -> None:
    rng = np.random.default_rng(3)
    est = AcceptanceEstimator(4, refit_interval=10, **VLLM)
    for _ in range(50):
        x = rng.normal(size=(32, 4)).astype(np.float32)
        admitted = rng.integers(0, 3, size=32)  # never beyond position 1
        accepted = np.array([rng.integers(0, a + 1) for a in admitted])
        est.observe(x, admitted, accepted)
    assert est.num_refits == 5
    assert est.intercepts[2:].tobytes() == np.full(2, -0.2).tobytes()
    assert np.all(est.intercepts[:2] != -0.2)


def test_online_fit_recovers_a_known_bernoulli_workload() -> None:
    workload = SyntheticWorkload(slope=0.55, intercepts=(1.4, 0.9, 0.5, 0.1))
    est = AcceptanceEstimator(4)
    rng = np.random.default_rng(7)
    history = []
    for _ in range(4000):
        step = workload.step(rng, 64)
        if est.observe(
            step.features, step.num_admitted, step.num_accepted, est.predict(step.features)
        ):
            history.append((est.slope, *est.intercepts))
    late = np.array(history[-20:]).mean(axis=0)
    assert late[0] == pytest.approx(0.55, abs=0.03)
    np.testing.assert_allclose(late[1:], workload.intercepts, atol=0.08)


# --- determinism and concurrency -------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    k=st.integers(1, 8),
    splits=st.integers(1, 6),
    threads=st.integers(1, 4),
)
def test_same_observations_same_bits_whatever_order_split_or_thread(
    seed: int, k: int, splits: int, threads: int
) -> None:
    rng = np.random.default_rng(seed)
    batches = [random_batch(rng, 24, k) for _ in range(6)]
    serial = AcceptanceEstimator(k, refit_interval=1000)
    for x, ad, ac, p in batches:
        serial.observe(x, ad, ac, p)

    # Every row once, in a shuffled order, cut into `splits` pieces per batch, on `threads` threads.
    rows = [(x[i], ad[i], ac[i], p[i]) for x, ad, ac, p in batches for i in range(len(ad))]
    order = rng.permutation(len(rows))
    pieces = np.array_split(order, splits * len(batches))
    other = AcceptanceEstimator(k, refit_interval=1000)

    def work(chunk: list[np.ndarray]) -> None:
        for piece in chunk:
            sel = [rows[i] for i in piece]
            other.observe(
                np.array([r[0] for r in sel], np.float32).reshape(-1, k),
                np.array([r[1] for r in sel], np.int64),
                np.array([r[2] for r in sel], np.int64),
                np.array([r[3] for r in sel], np.float32).reshape(-1, k),
            )

    workers = [threading.Thread(target=work, args=(pieces[t::threads],)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    a, b = serial.state_dict(), other.state_dict()
    assert a["round_stats"] == b["round_stats"]
    serial.refit()
    other.refit()
    assert serial.slope == other.slope
    assert serial.intercepts.tobytes() == other.intercepts.tobytes()


def test_observe_predict_and_refit_race_without_losing_counts() -> None:
    k, producers, calls = 4, 4, 300
    est = AcceptanceEstimator(k, refit_interval=1_000_000)
    rng = np.random.default_rng(11)
    x, ad, ac, p = random_batch(rng, 32, k)
    per_call = reference.round_statistics(x, ad, ac, p)["n"]
    stop = threading.Event()
    seen = []

    def produce() -> None:
        for _ in range(calls):
            est.observe(x, ad, ac, p)

    def read() -> None:
        while not stop.is_set():
            seen.append(est.predict(x))
            seen.append(est.round_counts())

    workers = [threading.Thread(target=produce) for _ in range(producers)]
    reader = threading.Thread(target=read)
    reader.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    reader.join()
    np.testing.assert_array_equal(est.round_counts(), per_call * producers * calls)
    assert est.steps_since_refit == producers * calls
    assert seen


# --- state -----------------------------------------------------------------------------------


def test_state_dict_round_trips_bit_exactly_and_pickles() -> None:
    rng = np.random.default_rng(5)
    est = AcceptanceEstimator(
        3,
        refit_interval=3,
        damping=20.0,
        l2=1e-2,
        init_slope=0.7,
        init_intercept=0.1,
        max_log_odds=30.0,
        **VLLM,
    )
    for _ in range(7):
        x, ad, ac, p = random_batch(rng, 8, 3)
        est.observe(x, ad, ac, p)
    state = est.state_dict()
    assert state["num_refits"] == 2 and state["steps_since_refit"] == 1
    back = AcceptanceEstimator.from_state_dict(state)
    assert back.state_dict() == state
    clone = pickle.loads(pickle.dumps(est))
    assert clone.state_dict() == state
    # Both continue identically.
    x, ad, ac, p = random_batch(rng, 8, 3)
    for e in (est, back, clone):
        e.observe(x, ad, ac, p)
        e.refit()
    assert est.state_dict() == back.state_dict() == clone.state_dict()


def test_non_contiguous_and_float64_inputs_match_the_contiguous_float32_path() -> None:
    rng = np.random.default_rng(2)
    wide = rng.normal(size=(6, 8))
    strided = wide[:, ::2]
    assert not strided.flags.c_contiguous
    est = AcceptanceEstimator(4)
    np.testing.assert_array_equal(est.predict(strided), est.predict(np.ascontiguousarray(strided)))
    assert est.predict(np.zeros((0, 4), np.float32)).shape == (0, 4)
    p = est.predict(strided.astype(np.float32))
    z = 0.5 * strided.astype(np.float32).astype(np.float64) - 0.2
    np.testing.assert_allclose(p, sigmoid(z), rtol=1e-6)


def test_cpu_torch_tensors_are_accepted() -> None:
    torch = pytest.importorskip("torch")
    est = AcceptanceEstimator(4)
    x = torch.randn(5, 4)
    np.testing.assert_array_equal(est.predict(x), est.predict(x.numpy()))
    est.observe(x, torch.tensor([4, 0, 1, 2, 3]), torch.tensor([1, 0, 1, 2, 0]), est.predict(x))
    # Rows (4,1), (0,0), (1,1), (2,2), (3,0): position 0 labeled 4 times, position 1 twice.
    assert est.round_counts().tolist() == [4, 2, 0, 0]


# --- bad input -------------------------------------------------------------------------------


def _x(rows: int = 2, k: int = 3, value: float = 0.5) -> np.ndarray:
    return np.full((rows, k), value, dtype=np.float32)


BAD_CALLS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("predict", {"features": np.zeros(3, np.float32)}, ValueError, "features"),
    ("predict", {"features": _x(k=4)}, ValueError, "features"),
    ("predict", {"features": _x(value=np.nan)}, ValueError, "features: must be finite, got NaN"),
    ("predict", {"features": np.zeros((2, 3), np.int64)}, TypeError, "int64"),
    (
        "observe",
        {"features": _x(value=np.inf), "num_admitted": [1, 1], "num_accepted": [0, 0]},
        ValueError,
        "inf",
    ),
    (
        "observe",
        {"features": _x(k=2), "num_admitted": [1, 1], "num_accepted": [0, 0]},
        ValueError,
        "features",
    ),
    (
        "observe",
        {"features": _x(), "num_admitted": [1, 1, 1], "num_accepted": [0, 0, 0]},
        ValueError,
        "num_admitted",
    ),
    (
        "observe",
        {"features": _x(), "num_admitted": [1, 1], "num_accepted": [0]},
        ValueError,
        "num_accepted",
    ),
    (
        "observe",
        {"features": _x(), "num_admitted": [-1, 1], "num_accepted": [0, 0]},
        ValueError,
        "-1",
    ),
    (
        "observe",
        {"features": _x(), "num_admitted": [1, 1], "num_accepted": [0, -2]},
        ValueError,
        "-2",
    ),
    (
        "observe",
        {"features": _x(), "num_admitted": [1, 1], "num_accepted": [2, 0]},
        ValueError,
        "num_accepted",
    ),
    (
        "observe",
        {"features": _x(), "num_admitted": [4, 1], "num_accepted": [0, 0]},
        ValueError,
        "num_admitted",
    ),
    (
        "observe",
        {"features": _x(), "num_admitted": [1.0, 1.0], "num_accepted": [0, 0]},
        TypeError,
        "num_admitted",
    ),
    (
        "observe",
        {
            "features": _x(),
            "num_admitted": [1, 1],
            "num_accepted": [0, 0],
            "predictions": _x(value=1.5),
        },
        ValueError,
        "1.5",
    ),
    (
        "observe",
        {
            "features": _x(),
            "num_admitted": [1, 1],
            "num_accepted": [0, 0],
            "predictions": _x(value=np.nan),
        },
        ValueError,
        "predictions",
    ),
    (
        "observe",
        {
            "features": _x(),
            "num_admitted": [1, 1],
            "num_accepted": [0, 0],
            "predictions": _x(rows=3),
        },
        ValueError,
        "predictions",
    ),
    (
        "observe",
        {"features": "abc", "num_admitted": [1, 1], "num_accepted": [0, 0]},
        ValueError,
        "features",
    ),
]


@pytest.mark.parametrize(("method", "kwargs", "error", "text"), BAD_CALLS)
def test_bad_input_raises_naming_the_argument_and_changes_nothing(
    method: str, kwargs: dict[str, Any], error: type[Exception], text: str
) -> None:
    est = AcceptanceEstimator(3, refit_interval=1)
    est.observe(_x(), [2, 3], [1, 3])  # refit once, so the state is not the cold start
    before = est.state_dict()
    with pytest.raises(error, match=text):
        getattr(est, method)(**kwargs)
    assert est.state_dict() == before


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"num_positions": 0}, "num_positions"),
        ({"num_positions": -3}, "num_positions"),
        ({"num_positions": 65}, "num_positions"),
        ({"num_positions": 4, "refit_interval": 0}, "refit_interval"),
        ({"num_positions": 4, "damping": -1.0}, "damping"),
        ({"num_positions": 4, "damping": float("nan")}, "damping"),
        ({"num_positions": 4, "l2": -1e-3}, "l2"),
        ({"num_positions": 4, "init_slope": -0.1}, "init_slope"),
        ({"num_positions": 4, "max_log_odds": 0.0}, "max_log_odds"),
        ({"num_positions": 4, "max_log_odds": 1e6}, "max_log_odds"),
    ],
)
def test_bad_config_raises_naming_the_argument(kwargs: dict[str, Any], text: str) -> None:
    with pytest.raises(ValueError, match=text):
        AcceptanceEstimator(**kwargs)


def test_bad_state_dict_is_refused() -> None:
    state = AcceptanceEstimator(3, **VLLM).state_dict()
    for broken, text in [
        ({k: v for k, v in state.items() if k != "slope"}, "slope"),
        ({**state, "format_version": 99}, "format_version"),
        ({**state, "intercepts": [0.0, 0.0]}, "intercepts"),
        ({**state, "slope": float("nan")}, "slope"),
        ({**state, "round_stats": {**state["round_stats"], "n": [1, 2]}}, "round_stats"),
    ]:
        with pytest.raises(ValueError, match=text):
            AcceptanceEstimator.from_state_dict(broken)
    with pytest.raises(TypeError, match="state"):
        AcceptanceEstimator.from_state_dict([1, 2])  # type: ignore[arg-type]


def test_one_adversarial_round_cannot_throw_an_intercept_out_of_reach() -> None:
    # Feature 30 everywhere, every draft rejected at position 0: w = p(1-p) is ~1e-7, so the
    # unbounded Newton step on the first intercept is about -1e6.
    x = np.full((64, 4), 30.0, dtype=np.float32)
    zeros, fours = np.zeros(64, np.int64), np.full(64, 4, np.int64)
    unbounded = AcceptanceEstimator(4, refit_interval=1, **UNBOUNDED)
    unbounded.observe(x, fours, zeros)
    assert unbounded.intercepts[0] < -1e4
    bounded = AcceptanceEstimator(4, refit_interval=1, **VLLM)
    bounded.observe(x, fours, zeros)
    assert bounded.intercepts[0] == pytest.approx(-0.2 - bounded.max_step)
    assert bounded.intercepts[1:].tolist() == [-0.2, -0.2, -0.2]
    assert 0.0 <= bounded.slope <= bounded.max_slope
    # av_core's map update throws nothing out of reach in the first place: its fit is the
    # posterior mode, which the prior keeps near the cold start, and it is capped the same way.
    mapped = AcceptanceEstimator(4, refit_interval=1, update="map")
    mapped.observe(x, fours, zeros)
    assert -0.2 - mapped.max_step <= mapped.intercepts[0] < -0.2
    assert mapped.intercepts[1:].tolist() == [-0.2, -0.2, -0.2]
    assert 0.0 <= mapped.slope <= mapped.max_slope


def test_device_tensors_are_copied_to_host_by_their_own_cpu() -> None:
    # A stand-in for a CUDA tensor: numpy cannot read it, it says it lives on the device, and
    # detach().cpu() gives its values on the host. The extension stages it with the tensor's
    # own methods, asking nothing of av_core's Python modules.
    host = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    staged = []

    class DeviceTensor:
        is_cuda = True

        def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
            raise TypeError("can't convert cuda:0 device type tensor to numpy")

        def detach(self) -> DeviceTensor:
            return self

        def cpu(self) -> np.ndarray:
            staged.append(self)
            return host

    est = AcceptanceEstimator(4)
    np.testing.assert_array_equal(est.predict(DeviceTensor()), est.predict(host))
    assert len(staged) == 1
    est.observe(DeviceTensor(), [4, 1], [2, 0])
    assert est.round_counts().tolist() == [2, 1, 1, 0]

    class StuckOnDevice(DeviceTensor):
        def cpu(self) -> np.ndarray:
            return self  # type: ignore[return-value]

    with pytest.raises(TypeError, match="features: StuckOnDevice.cpu"):
        est.predict(StuckOnDevice())

    class NotATensor:
        is_cuda = False

        def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
            raise TypeError("nope")

    with pytest.raises(TypeError, match="features"):
        est.predict(NotATensor())
