"""The benchmark modules still run, in their quick mode, and the planner benchmark's own
cross-checks hold: on every workload it times, ``plan_verification`` must give numpy's budget
and admitted counts (vLLM's host math) and ``choose_draft_depth`` numpy's depth, or it raises.
No timing is asserted here; the figures live in ``benches/results.md``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCHES = Path(__file__).resolve().parents[1] / "benches"


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
    for expected in ("plan R=256 K=8", "depth + plan R=256 K=8", "plan R=1024 K=16"):
        assert expected in names
    targeted = [row for row in rows if row["target"] is not None]
    assert {row["name"] for row in targeted} == {"plan R=256 K=8", "depth + plan R=256 K=8"}
    for row in rows:
        assert row["median_us"] > 0 and row["reference_median_us"] > 0
        assert row["speedup"] == pytest.approx(row["reference_median_us"] / row["median_us"])


def test_estimator_benchmark_runs(benches: None) -> None:
    rows = load("bench_estimator").run(quick=True)
    names = {row["name"] for row in rows}
    assert {"observe R=256 K=8", "refit K=16"} <= names
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
