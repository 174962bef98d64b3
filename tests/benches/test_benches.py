"""The benchmarks compare like with like: each numpy reference they time computes what the
av_core call it is paired with computes (checked here on the benchmarks' own workloads), every
row times real work (a refit row follows a round with observations), and the modules still run
in quick mode. The planner benchmark also cross-checks itself while it runs: on every workload
it times, ``plan_verification`` must give numpy's budget and admitted counts (vLLM's host math),
the stateful planner numpy's, and ``choose_draft_depth`` numpy's depth, or it raises. No timing
is asserted; the figures live in ``benches/results.md``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from av_core import AcceptanceEstimator

BENCHES = Path(__file__).resolve().parents[2] / "benches"


@pytest.fixture(scope="module")
def benches() -> Iterator[None]:
    sys.path.insert(0, str(BENCHES))
    try:
        yield
    finally:
        sys.path.remove(str(BENCHES))


def load(name: str) -> ModuleType:
    return importlib.import_module(name)


def test_planner_benchmark_runs_and_agrees_with_numpy(benches: None) -> None:
    rows = load("bench_planner").run(quick=True)
    names = {row["name"] for row in rows}
    for expected in (
        "plan R=256 K=8",
        "VerificationPlanner.plan R=256 K=8",
        "depth + plan R=256 K=8",
        "plan R=1024 K=16",
    ):
        assert expected in names
    targeted = [row for row in rows if row["target"] is not None]
    assert {row["name"] for row in targeted} == {
        "plan R=256 K=8",
        "VerificationPlanner.plan R=256 K=8",
        "depth + plan R=256 K=8",
        "whole step R=256 K=8",
        "whole step / predict R=256 K=8",
    }
    for row in rows:
        assert row["median_us"] > 0 and row["reference_median_us"] > 0
        if row["name"].startswith("whole step / predict"):
            assert row["ratio"] == pytest.approx(row["median_us"] / row["reference_median_us"])
            assert row["pass"] == (None if row["target"] is None else row["ratio"] <= 3)
            continue
        assert row["speedup"] == pytest.approx(row["reference_median_us"] / row["median_us"])
        if row["name"].startswith("whole step"):
            assert row["pass"] == (None if row["target"] is None else row["speedup"] >= 30)
            continue
        assert row["pass"] == (
            None if row["target"] is None else row["speedup"] >= 10 and row["median_us"] <= 5
        )


def test_estimator_benchmark_runs(benches: None) -> None:
    rows = load("bench_estimator").run(quick=True)
    names = {row["name"] for row in rows}
    assert {
        "observe R=256 K=8",
        "observe (map) R=256 K=8",
        "refit K=16 γ=0.8 (round of 256 observations)",
        "refit K=16 γ=0 (round of 256 observations)",
        "refit (map) K=16 γ=0.8 (round of 256 observations)",
        "refit (map) K=16 γ=0 (round of 256 observations)",
    } <= names
    assert all(row["median_us"] > 0 for row in rows)


def test_vllm_metrics_benchmark_runs(benches: None) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("prometheus_client")
    rows = load("bench_vllm_metrics").run(quick=True)
    names = [row["name"] for row in rows]
    assert any(name.startswith("metrics on: estimator step") for name in names)
    assert any(name.startswith("metrics fold") for name in names)
    for row in rows:
        assert row["median_us"] > 0 and row["reference_median_us"] > 0
        if "ratio" in row:
            assert row["ratio"] == pytest.approx(row["median_us"] / row["reference_median_us"])
    for row in rows:
        if row["name"].startswith("refit K=16"):
            assert row["target"] == "<= 2 us"
            assert row["pass"] == (row["median_us"] <= 2.0)


def fixed_to_float(values: list[int], bits: int) -> np.ndarray:
    return np.asarray(values, dtype=np.float64) / 2.0**bits


@pytest.mark.parametrize(("r", "k"), [(8, 4), (256, 8), (1024, 16)])
def test_numpy_observe_and_predict_compute_what_av_core_does(benches: None, r: int, k: int) -> None:
    bench = load("bench_estimator")
    x, admitted, accepted, p = bench.workload(r, k)
    est = AcceptanceEstimator(k, refit_interval=2**62, update="vllm")  # its IRLS moments
    np.testing.assert_allclose(
        est.predict(x), bench.numpy_predict(x, 0.5, est.intercepts), rtol=1e-6, atol=1e-7
    )
    est.observe(x, admitted, accepted, p)
    report = est.refit(report=True)
    bits = report["fraction_bits"]
    ours = np.stack(
        [fixed_to_float(report[name], bits) for name in ("a", "b", "c", "g0", "g1")]
        + [np.asarray(report["n"], dtype=np.float64)]
    )
    np.testing.assert_allclose(ours, bench.numpy_observe(x, admitted, accepted, p), atol=1e-6)
    # The map update's histograms: the numpy bins are the core's, integer for integer.
    est = AcceptanceEstimator(k, refit_interval=2**62, update="map")
    est.observe(x, admitted, accepted, p)
    round_stats = est.state_dict()["round_stats"]
    ours = np.stack([np.asarray(round_stats[name], np.float64) for name in bench_columns()])
    np.testing.assert_array_equal(ours, bench.numpy_observe_map(x, admitted, accepted, k))


def bench_columns() -> tuple[str, str, str]:
    return ("count", "accepted", "x_sum")


@pytest.mark.parametrize(("memory", "drift_z"), [(0.8, 3.09), (0.8, float("inf")), (0.0, 3.09)])
@pytest.mark.parametrize("k", [4, 16])
def test_the_refit_reference_tracks_the_estimator_round_after_round(
    benches: None, memory: float, drift_z: float, k: int
) -> None:
    """The numpy estimator the refit rows time (dense solves, memory, drift test, damping,
    bounds) follows av_core's coefficients over rounds of a drifting workload: the same math,
    with the drift test firing (its rounds do not fit the model) and with it off (the memory
    then keeps every round)."""
    bench = load("bench_estimator")
    # vLLM's update (the map update's reference: the test below).
    est = AcceptanceEstimator(
        k, refit_interval=2**62, memory=memory, drift_z=drift_z, update="vllm"
    )
    reference = bench.NumpyEstimator(k, memory, drift_z)
    drifted = 0
    for round_ in range(12):
        x, admitted, accepted, _ = bench.workload(256, k, seed=round_)
        if round_ >= 6:  # a workload switch: every draft rejected more often
            accepted = accepted // 2
        est.observe(x, admitted, accepted)
        reference.observe(x, admitted, accepted)
        est.refit()
        reference.refit()
        ours = np.concatenate([[est.slope], est.intercepts])
        np.testing.assert_allclose(ours, reference.theta, rtol=1e-7, atol=1e-9)
        drifted = reference.memory.resets
    if memory > 0:
        assert est.state_dict()["memory_state"]["resets"] == drifted
        assert drifted > 0 if np.isfinite(drift_z) else drifted == 0


@pytest.mark.parametrize(("memory", "drift_z"), [(0.8, 3.09), (0.8, float("inf")), (0.0, 3.09)])
@pytest.mark.parametrize("k", [4, 16])
def test_the_map_refit_reference_tracks_the_estimator_round_after_round(
    benches: None, memory: float, drift_z: float, k: int
) -> None:
    """The numpy map estimator the map refit rows time (its own bins, prior, dense Newton,
    memory, drift test, bounds) follows av_core's coefficients over rounds of a drifting
    workload."""
    bench = load("bench_estimator")
    est = AcceptanceEstimator(k, refit_interval=2**62, memory=memory, drift_z=drift_z, update="map")
    reference = bench.NumpyMapEstimator(k, memory, drift_z)
    for round_ in range(12):
        x, admitted, accepted, _ = bench.workload(256, k, seed=round_)
        if round_ >= 6:
            accepted = accepted // 2
        est.observe(x, admitted, accepted, count_step=False)
        reference.observe(x, admitted, accepted)
        est.refit()
        reference.refit()
        ours = np.concatenate([[est.slope], est.intercepts])
        np.testing.assert_allclose(ours, reference.theta, rtol=1e-7, atol=1e-9)
    if memory > 0:
        assert est.state_dict()["memory_state"]["resets"] == reference.resets
        assert reference.resets > 0 if np.isfinite(drift_z) else reference.resets == 0


def test_the_refit_rows_time_rounds_with_observations(benches: None) -> None:
    """The timed refit consumes a round loaded by an untimed observe: after the benchmark's
    setup the round holds all 256 requests' labels, not nothing."""
    bench = load("bench_estimator")
    x, admitted, accepted, p = bench.workload(256, 16)
    est = AcceptanceEstimator(16, refit_interval=2**62)
    est.observe(x, admitted, accepted, p)
    assert int(np.sum(est.round_counts())) == int(
        np.sum(np.minimum(accepted + (accepted < admitted), admitted))
    )
    report = est.refit(report=True)
    assert report["slope_step"] != 0.0 or any(s != 0.0 for s in report["intercept_steps"])
