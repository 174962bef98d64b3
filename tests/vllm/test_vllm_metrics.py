"""Prometheus metrics of the vLLM drop-ins (av_core.vllm.metrics), scraped for real.

The main test starts the real HTTP server on 127.0.0.1, drives the drop-in estimator and the
budget helpers through 300 decode steps of a workload whose acceptance is known (the target
accepts each admitted draft with exactly its draft-time prediction, so the predictions are
calibrated by construction), scrapes ``/metrics`` with a real HTTP client, parses it with
``prometheus_client.parser`` and checks every value against a reference the test keeps itself:
counters equal to the labels it fed, the sum of predictions equal to its own float64 sum and its
ratio to the accepted drafts within sampling error of 1, the window's log-loss and ECE equal to
scikit-learn's and a float64 ECE, the budget histogram equal to the budgets returned.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from child_env import child_env

torch = pytest.importorskip("torch")
prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from av_core import CostTables  # noqa: E402
from av_core.vllm import (  # noqa: E402
    OnlineAcceptanceEstimator,
    assign_draft_token_budget,
    batch_draft_budget,
    build_cost_tables_from_curves,
)
from av_core.vllm import metrics as vllm_metrics  # noqa: E402
from av_core.vllm.depth import DraftDepthHook  # noqa: E402

HERE = Path(__file__).resolve().parent
M, K, VOCAB, STEPS, REFIT, WINDOW = 32, 4, 256, 300, 50, 500
CPU = torch.device("cpu")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def metrics_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    port = free_port()
    vllm_metrics.reset()
    monkeypatch.setenv("AV_CORE_METRICS_PORT", str(port))
    monkeypatch.setenv("AV_CORE_METRICS_INTERVAL", "3600")  # fold only when the test says
    monkeypatch.setenv("AV_CORE_METRICS_WINDOW", str(WINDOW))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("AV_CORE_METRICS", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    yield port
    vllm_metrics.reset()


def scrape(port: int) -> dict[str, list[Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    families: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            families.setdefault(sample.name, []).append(sample)
    return families


def value(families: dict[str, list[Any]], name: str, **labels: str) -> float:
    found = [
        s.value for s in families[name] if all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, families.get(name))
    return float(found[0])


def ece_64(y: np.ndarray, p: np.ndarray, bins: int = 15) -> float:
    """Occupancy-weighted |mean p - mean y| over equal-width bins closed on the right."""
    index = np.clip(np.ceil(p * bins).astype(int) - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        inside = index == b
        if inside.any():
            total += inside.sum() / len(p) * abs(p[inside].mean() - y[inside].mean())
    return float(total)


def run_workload(seed: int = 3) -> dict[str, Any]:
    """300 decode steps through the estimator and the budget helpers; what was fed."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    est = OnlineAcceptanceEstimator(M, K, CPU)
    est.REFIT_INTERVAL = REFIT
    tables = build_cost_tables_from_curves(
        [(1, 0.4), (8, 0.7), (32, 1.5)], [(1, 3.0), (32, 3.5), (128, 6.0), (256, 11.0)], M, 256
    )
    conf = torch.zeros(M, K)
    temperature = torch.ones(M)
    fed: dict[str, Any] = {
        "labeled": np.zeros(K, np.int64),
        "accepted": np.zeros(K, np.int64),
        "predicted": np.zeros(K, np.float64),
        "variance": 0.0,
        "window_p": [],
        "window_y": [],
        "budgets": [],
        "costs": [],
    }
    verdict = (torch.zeros(0, dtype=torch.int32),) * 3
    for _ in range(STEPS):
        est.step(*verdict)
        live = int(rng.integers(4, M))
        slots = torch.from_numpy(rng.permutation(M)[:live].astype(np.int32))
        for position in range(K):
            logits = torch.randn(live, VOCAB, generator=gen) * float(rng.uniform(0.5, 6.0))
            est.predict(logits, slots, torch.tensor(position), conf, temperature)
        p = est.predictions[slots.long()].numpy().astype(np.float64)
        req_ids = [f"r{int(s)}" for s in slots]
        plan = batch_draft_budget(
            {r: 1 + K for r in req_ids},
            {r: [0] * K for r in req_ids},
            req_id_to_index={r: int(s) for r, s in zip(req_ids, slots, strict=True)},
            stale_confidences=est.predictions.numpy(),
            num_computed_tokens=np.full(M, 100),
            prefill_len=np.zeros(M, np.int64),
            cost_tables=tables,
            max_total_logits=256,
            num_bonus_tokens=1,
        )
        fed["budgets"].append(plan.draft_budget)
        fed["costs"].append(float(tables[0][live]) + float(tables[1][plan.num_tokens]))
        admitted = torch.full((live,), K, dtype=torch.int32)
        assign_draft_token_budget(conf, torch.arange(live), admitted, plan.draft_budget, K)
        admitted_np = admitted.numpy().astype(np.int64)
        # The target accepts each admitted draft with its draft-time prediction, in order.
        draws = rng.random((live, K)) < p
        first_miss = np.where(~draws, np.arange(K), K).min(axis=1)
        accepted = np.minimum(first_miss, admitted_np)
        labeled = np.arange(K)[None, :] < np.minimum(accepted + 1, admitted_np)[:, None]
        ones = np.arange(K)[None, :] < accepted[:, None]
        fed["labeled"] += labeled.sum(axis=0)
        fed["accepted"] += ones.sum(axis=0)
        fed["predicted"] += np.where(labeled, p, 0.0).sum(axis=0)
        fed["variance"] += float(np.where(labeled, p * (1 - p), 0.0).sum())
        fed["window_p"] += p[labeled].tolist()  # row-major: step, row, position
        fed["window_y"] += ones[labeled].tolist()
        verdict = (
            slots,
            torch.from_numpy((accepted + 1).astype(np.int32)),
            torch.from_numpy((accepted < admitted_np).astype(np.int32)),
        )
    est.step(*verdict)  # the last step's verdicts (this step records no host time of its own)
    fed["estimator"] = est
    return fed


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_scraped_metrics_equal_an_independent_reference(
    metrics_env: int, update: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM's update (the drop-in's default) and av_core's opt-in map update, whose round keeps
    # histograms instead of residuals: the expected accepted drafts come from the verdicts.
    from sklearn.metrics import log_loss as sk_log_loss

    monkeypatch.setenv("AV_CORE_VLLM_ESTIMATOR", update)

    fed = run_workload()
    est: OnlineAcceptanceEstimator = fed["estimator"]
    assert est.update == update
    metrics = vllm_metrics.current()
    assert metrics is not None and metrics.exporter.server is not None
    assert metrics.exporter.server.server_address[0] == "127.0.0.1"
    metrics.fold()
    families = scrape(metrics_env)
    assert all(name.startswith("av_core_") for name in families)
    rank = {"rank": "0"}

    for k in range(K):
        at = {**rank, "position": str(k)}
        assert value(families, "av_core_labeled_drafts_total", **at) == fed["labeled"][k]
        assert value(families, "av_core_accepted_drafts_total", **at) == fed["accepted"][k]
        predicted = value(families, "av_core_predicted_accepted_drafts_total", **at)
        assert predicted == pytest.approx(fed["predicted"][k], rel=1e-9)
    # Calibrated by construction: expected / actual accepted drafts is 1 within sampling error.
    expected = sum(
        value(families, "av_core_predicted_accepted_drafts_total", **rank, position=str(k))
        for k in range(K)
    )
    actual = sum(
        value(families, "av_core_accepted_drafts_total", **rank, position=str(k)) for k in range(K)
    )
    assert fed["labeled"].sum() > 3000 and actual > 500
    assert abs(expected - actual) <= 4.0 * math.sqrt(fed["variance"])
    assert abs(expected / actual - 1.0) < 0.05

    p = np.asarray(fed["window_p"][-WINDOW:])
    y = np.asarray(fed["window_y"][-WINDOW:], dtype=np.float64)
    assert value(families, "av_core_window_drafts", **rank) == WINDOW
    assert value(families, "av_core_log_loss", **rank) == pytest.approx(
        sk_log_loss(y, p, labels=[0, 1]), rel=1e-9
    )
    assert value(families, "av_core_expected_calibration_error", **rank) == pytest.approx(
        ece_64(y, p), abs=1e-12
    )

    slope, intercepts = est.host_coefficients
    assert value(families, "av_core_slope", **rank) == slope
    for k in range(K):
        assert value(families, "av_core_intercept", **rank, position=str(k)) == intercepts[k]
    # 301 step() calls, each counting a step (the first one's verdicts are empty). vLLM's update
    # fits at the end of each round of REFIT steps; the map update also after the 1st, 2nd, 4th,
    # ... step of every round.
    steps_in_round = [(n - 1) % REFIT + 1 for n in range(1, STEPS + 2)]
    doubling = [s == REFIT or (update == "map" and s & (s - 1) == 0) for s in steps_in_round]
    assert value(families, "av_core_refits_total", **rank) == sum(doubling) == est.num_refits
    assert value(families, "av_core_dropped_rows_total", **rank) == 0
    drift = value(families, "av_core_drift_statistic", **rank)
    assert math.isfinite(drift) and drift >= 0

    budgets = np.asarray(fed["budgets"])
    assert budgets.min() < budgets.max()  # the budget does vary
    assert value(families, "av_core_draft_budget_count", **rank) == STEPS
    assert value(families, "av_core_draft_budget_sum", **rank) == budgets.sum()
    for bound in vllm_metrics.BUDGET_BUCKETS:
        got = value(families, "av_core_draft_budget_bucket", **rank, le=f"{float(bound)}")
        assert got == np.count_nonzero(budgets <= bound), bound
    costs = np.asarray(fed["costs"])
    at = {**rank, "decision": "budget"}
    assert value(families, "av_core_predicted_step_cost_ms_count", **at) == STEPS
    assert value(families, "av_core_predicted_step_cost_ms_sum", **at) == pytest.approx(
        costs.sum(), rel=1e-12
    )

    # A step's host time is complete when the next step starts: 301 step() calls, 300 steps.
    assert value(families, "av_core_step_host_seconds_count", **rank) == STEPS
    for call in ("step", "predict", "budget"):
        assert value(families, "av_core_host_seconds_total", **rank, call=call) > 0
    host_total = sum(
        value(families, "av_core_host_seconds_total", **rank, call=call)
        for call in ("step", "predict", "budget")
    )
    # Both count the 300 completed steps (the last step() call's own time is still open).
    per_step = value(families, "av_core_step_host_seconds_sum", **rank)
    assert per_step == pytest.approx(host_total, rel=1e-9)


def test_the_depth_hook_records_its_depths_and_predicted_costs(metrics_env: int) -> None:
    OnlineAcceptanceEstimator(8, 4, CPU)  # the first drop-in starts the process's metrics
    costs = CostTables(np.linspace(0.5, 2.0, 9), np.linspace(3.0, 9.0, 65)).with_draft_depth(
        "autoregressive", max_depth=4
    )
    hook = DraftDepthHook(costs, 8, 4)
    rng = np.random.default_rng(0)
    depths, predicted = [], []
    for _ in range(20):
        slots = np.arange(6)
        hook.record(slots, rng.uniform(0.05, 0.99, (6, 4)), 4)
        depth = hook.num_speculative_tokens(
            slots, limit=4, num_non_draft_tokens=6, num_sampling_requests=6
        )
        depths.append(depth)
        assert hook.last_plan is not None
        predicted.append(hook.last_plan.predicted_cost_ms)
    metrics = vllm_metrics.current()
    assert metrics is not None
    metrics.fold()
    families = scrape(metrics_env)
    assert value(families, "av_core_drafting_depth_count", rank="0") == 20
    assert value(families, "av_core_drafting_depth_sum", rank="0") == sum(depths)
    at = {"rank": "0", "decision": "depth"}
    assert value(families, "av_core_predicted_step_cost_ms_count", **at) == 20
    assert value(families, "av_core_predicted_step_cost_ms_sum", **at) == pytest.approx(
        sum(predicted), rel=1e-12
    )


def test_metrics_off_cost_nothing_and_import_nothing() -> None:
    code = """
import sys, torch
from av_core.vllm import OnlineAcceptanceEstimator
est = OnlineAcceptanceEstimator(4, 2, torch.device("cpu"))
idx = torch.arange(2, dtype=torch.int32)
for _ in range(3):
    est.step(idx, torch.full((2,), 2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    est.predict(torch.randn(2, 16), idx, torch.tensor(0), torch.zeros(2, 2), torch.ones(4))
from av_core.vllm import metrics as vllm_metrics
assert est._recorder is None and vllm_metrics.current() is None
assert "prometheus_client" not in sys.modules
print("ok")
"""
    off = ("AV_CORE_METRICS", "PROMETHEUS")
    env = child_env(drop=off)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_taken_port_or_a_missing_dependency_never_stops_serving(
    metrics_env: int, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", metrics_env))
        taken.listen(1)
        est = OnlineAcceptanceEstimator(4, 2, CPU)
    assert "metrics server not started" in caplog.text
    assert est._recorder is not None  # still recorded (for PROMETHEUS_MULTIPROC_DIR)
    idx = torch.arange(2, dtype=torch.int32)
    est.step(idx, torch.full((2,), 2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))


_MULTIPROC_CHILD = """
import json, sys, numpy as np, torch
from av_core.vllm import metrics as vllm_metrics
from av_core.vllm import OnlineAcceptanceEstimator
est = OnlineAcceptanceEstimator(8, 3, torch.device("cpu"))
est.REFIT_INTERVAL = 10
rng = np.random.default_rng(1)
conf = torch.zeros(8, 3)
labeled = np.zeros(3, np.int64)
verdict = (torch.zeros(0, dtype=torch.int32),) * 3
for _ in range(40):
    est.step(*verdict)
    slots = torch.arange(8, dtype=torch.int32)
    for k in range(3):
        est.predict(torch.randn(8, 32) * 3, slots, torch.tensor(k), conf, torch.ones(8))
    admitted = rng.integers(0, 4, 8)
    accepted = np.minimum(rng.integers(0, 4, 8), admitted)
    labeled += (np.arange(3)[None, :] < np.minimum(accepted + 1, admitted)[:, None]).sum(0)
    verdict = (slots, torch.from_numpy((accepted + 1).astype(np.int32)),
               torch.from_numpy((admitted - accepted).astype(np.int32)))
est.step(*verdict)
labeled += 0
vllm_metrics.current().fold()
print(json.dumps({"labeled": labeled.tolist(), "refits": est.num_refits}))
"""


def test_prometheus_multiproc_dir_reaches_a_multiprocess_collector(tmp_path: Path) -> None:
    env = child_env(drop=("AV_CORE_METRICS",), PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    env["RANK"] = "3"
    out = subprocess.run(
        [sys.executable, "-c", _MULTIPROC_CHILD], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    child = json.loads(out.stdout)
    # What vLLM's own /metrics does in multiprocess mode, in this (another) process.
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    families: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            families.setdefault(sample.name, []).append(sample)
    for k in range(3):
        got = value(families, "av_core_labeled_drafts_total", rank="3", position=str(k))
        assert got == child["labeled"][k]
    assert value(families, "av_core_refits_total", rank="3") == child["refits"] == 4
    slope = [s for s in families["av_core_slope"] if s.labels["rank"] == "3"]
    assert len(slope) == 1 and slope[0].value != 0.5  # moved by the refits


def test_the_gpu_selfchecks_metrics_run_works_on_the_host() -> None:
    from av_core.vllm.selfcheck import _metrics_sync_check

    report = _metrics_sync_check(torch.device("cpu"), 100)
    assert report["ok"] and report["no_blocking_sync"] and report["refits"] == 4
