"""The whole decode step of `benches/bench_planner.py`: its numpy reference decides what
av_core's four public calls decide (depths, budget, admitted counts, remembered confidences),
step after step, so the `whole step` rows compare like with like; and the benchmark's row
filter runs only the rows asked for."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from av_core import AcceptanceEstimator, VerificationPlanner

BENCHES = Path(__file__).resolve().parents[2] / "benches"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHES))
    try:
        import bench_planner

        yield bench_planner
    finally:
        sys.path.remove(str(BENCHES))


@pytest.mark.parametrize(("rows", "k"), [(64, 4), (256, 8), (100, 16), (1, 3)])
def test_the_numpy_step_decides_what_av_core_decides(bench: ModuleType, rows: int, k: int) -> None:
    tables = bench.profiled_tables().with_draft_depth("autoregressive", max_depth=k)
    rng = np.random.default_rng(rows * 100 + k)
    slots = rng.permutation(rows).astype(np.int64)
    caps = rng.integers(0, k + 1, rows).astype(np.int64)
    accepted = rng.integers(0, k + 1, rows).astype(np.int64)
    estimator = AcceptanceEstimator(k)
    planner = VerificationPlanner(tables, k, num_slots=rows, exploration=0.0)
    reference = bench.NumpyStep(rows, k, tables, estimator)
    decisions = set()
    for step in range(8):
        # Confident and poor drafts in turn, so the steps decide differently.
        mean = [4.0, -3.0, 1.5, 0.0][step % 4]
        x = rng.normal(mean, 2.0, size=(rows, k)).astype(np.float32)
        depth = planner.choose_draft_depth(
            slots, caps, num_non_draft_tokens=rows, num_sampling_requests=rows
        )
        p = estimator.predict(x)
        plan = planner.plan(
            slots, p, depth.depths, num_non_draft_tokens=rows, num_sampling_requests=rows
        )
        estimator.observe(x, plan.admitted, np.minimum(accepted, plan.admitted), p)
        depths, budget, admitted = reference.step(slots, caps, x, accepted, p=p)
        assert np.array_equal(depth.depths, depths), f"step {step}"
        assert plan.budget == budget, f"step {step}"
        assert np.array_equal(plan.admitted, admitted), f"step {step}"
        for r, slot in enumerate(slots):
            remembered = planner.previous_confidences(int(slot))
            assert np.array_equal(remembered, reference.previous[slot]), f"step {step}, row {r}"
        decisions.add((depth.max_depth, plan.budget))
    # The steps did not all decide the same: the comparison covered more than one case.
    assert len(decisions) > 1 or rows == 1


def test_the_row_filter_times_only_the_rows_asked_for(bench: ModuleType) -> None:
    only = bench.matching(["whole step*R=64 K=4"])
    rows = bench.run(quick=True, only=only)
    assert {row["name"] for row in rows} == {
        "whole step R=64 K=4",
        "whole step / predict R=64 K=4",
    }
    by_name = {row["name"]: row for row in rows}
    step, per_predict = by_name["whole step R=64 K=4"], by_name["whole step / predict R=64 K=4"]
    assert per_predict["median_us"] == step["median_us"]
    assert per_predict["ratio"] == pytest.approx(step["median_us"] / step["predict_us"])
    assert bench.scaling(quick=True, only=only) == []
    assert bench.matching(None)("anything")
