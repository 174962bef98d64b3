"""What the Prometheus metrics (av_core.vllm.metrics) cost the vLLM drop-ins per decode step.

The same decode step with metrics on (HTTP server on 127.0.0.1) and off, alternated sample by
sample in one run: R = 64 requests, K = 8, on CPU tensors. What the serving thread pays is
measured with the background fold parked (``AV_CORE_METRICS_INTERVAL`` = 1 hour), so that the
fold thread's own CPU time, timed separately, does not land in the samples of a shared machine.

- ``estimator step``: ``OnlineAcceptanceEstimator.step`` alone (grades 64 x 8 drafts, refit every
  100 steps), the call the metrics touch most.
- ``decode step``: ``step`` + K ``predict`` calls (logits [64, 4096]) + ``batch_draft_budget``.

The figures are the ratio on / off (1.0 = free), also as the median of the ratios of neighbouring
samples (steadier on a shared machine), and the microseconds added per step. The fold
(once a second, on the daemon thread) is timed for 1,000 pending steps: its cost per step.

    python benches/bench_vllm_metrics.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from typing import Any

import numpy as np
import torch
from timing import summary, timed

from av_core.vllm import (
    OnlineAcceptanceEstimator,
    batch_draft_budget,
    build_cost_tables_from_curves,
)
from av_core.vllm import metrics as vllm_metrics

R, K, V, SLOTS = 64, 8, 4096, 128


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Workload:
    """One estimator and the inputs of its decode steps (verdicts cycle through a fixed set)."""

    def __init__(self, est: OnlineAcceptanceEstimator, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.est = est
        self.idx = torch.arange(R, dtype=torch.int32)
        self.verdicts = [
            (
                torch.randint(1, K + 2, (R,), generator=g, dtype=torch.int32),
                torch.randint(0, 2, (R,), generator=g, dtype=torch.int32),
            )
            for _ in range(64)
        ]
        for sampled, rejected in self.verdicts:
            rejected.masked_fill_(sampled > K, 0)
        self.logits = [torch.randn(R, V, generator=g) * 3 for _ in range(K)]
        self.steps = [torch.tensor(k) for k in range(K)]
        self.conf = torch.zeros(SLOTS, K)
        self.temperature = torch.ones(SLOTS)
        self.tables = build_cost_tables_from_curves(
            [(1, 0.4), (64, 1.5), (128, 2.5)],
            [(1, 3.0), (256, 6.0), (1024, 12.0), (2048, 22.0)],
            SLOTS,
            2048,
        )
        self.req_ids = [f"r{i}" for i in range(R)]
        self.tokens = dict.fromkeys(self.req_ids, 1 + K)
        self.drafts = {r: [0] * K for r in self.req_ids}
        self.index = {r: i for i, r in enumerate(self.req_ids)}
        self.computed = np.full(SLOTS, 100)
        self.prefill = np.zeros(SLOTS, np.int64)
        self.n = 0

    def estimator_step(self) -> None:
        sampled, rejected = self.verdicts[self.n % len(self.verdicts)]
        self.n += 1
        self.est.step(self.idx, sampled, rejected)

    def decode_step(self) -> None:
        self.estimator_step()
        for k in range(K):
            self.est.predict(self.logits[k], self.idx, self.steps[k], self.conf, self.temperature)
        batch_draft_budget(
            self.tokens,
            self.drafts,
            req_id_to_index=self.index,
            stale_confidences=self.est.predictions.numpy(),
            num_computed_tokens=self.computed,
            prefill_len=self.prefill,
            cost_tables=self.tables,
            max_total_logits=2048,
            num_bonus_tokens=1,
        )


def run(quick: bool = False) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    names = (vllm_metrics.ENV_PORT, vllm_metrics.ENV_INTERVAL, "AV_CORE_METRICS")
    saved = {name: os.environ.get(name) for name in names}
    vllm_metrics.reset()
    off = Workload(OnlineAcceptanceEstimator(SLOTS, K, torch.device("cpu")))
    os.environ[vllm_metrics.ENV_PORT] = str(_free_port())
    os.environ[vllm_metrics.ENV_INTERVAL] = "3600"
    os.environ.pop("AV_CORE_METRICS", None)
    try:
        on = Workload(OnlineAcceptanceEstimator(SLOTS, K, torch.device("cpu")))
        metrics = vllm_metrics.current()
        assert metrics is not None and on.est._recorder is not None and off.est._recorder is None

        events = metrics.events

        def with_metrics(call: Any) -> Any:
            def run_on() -> None:
                call()
                # The parked fold would have drained the queue (and freed the arrays it holds);
                # its own cost is timed below.
                if len(events) > 4096:
                    events.clear()

            return run_on

        def without(call: Any) -> Any:
            def run_off() -> None:  # the budget helper reads the process's metrics: hide them
                vllm_metrics._process = None
                try:
                    call()
                finally:
                    vllm_metrics._process = metrics
                if len(events) > 4096:  # the same check, for the same cost
                    events.clear()

            return run_off

        # Many short samples, alternated: on a shared machine the paired ratio of neighbouring
        # samples is far steadier than the ratio of two medians.
        shapes = {"estimator step": (400, 20), "decode step": (120, 3)}
        rows = []
        for name, pick in (
            ("estimator step", lambda w: w.estimator_step),
            ("decode step", lambda w: w.decode_step),
        ):
            repeats, inner = shapes[name]
            if quick:
                repeats = max(10, repeats // 10)
            samples = timed(
                {"on": with_metrics(pick(on)), "off": without(pick(off))},
                repeats=repeats,
                inner=inner,
            )
            median, q1, q3 = summary(samples["on"])
            reference, _, _ = summary(samples["off"])
            paired = np.asarray(samples["on"]) / np.asarray(samples["off"])
            added = np.asarray(samples["on"]) - np.asarray(samples["off"])
            shape = f"R={R} K={K}" + (f" V={V}" if name == "decode step" else "")
            rows.append(
                {
                    "group": "vllm",
                    "name": f"metrics on: {name} {shape}",
                    "median_us": median,
                    "q1_us": q1,
                    "q3_us": q3,
                    "reference": "the same step, metrics off",
                    "reference_median_us": reference,
                    "ratio": median / reference,
                    "paired_ratio_median": float(np.median(paired)),
                    "paired_ratio_q1_q3": [float(v) for v in np.percentile(paired, [25, 75])],
                    "added_us_median": float(np.median(added)),
                    "target": None,
                    "pass": None,
                }
            )
        # What the serving thread does for metrics in one decode step (step + K predicts +
        # budget), timed alone: steadier than a difference of two noisy step timings.
        recorder = on.est._recorder
        p = np.zeros((R, K), np.float32)
        counts = np.zeros(R, np.int64)

        def record_one_step() -> None:
            metrics.end_step()
            started = time.perf_counter()
            recorder.verdicts(p, counts, counts)
            recorder.host_time(vllm_metrics.STEP, time.perf_counter() - started)
            for _ in range(K):
                started = time.perf_counter()
                recorder.host_time(vllm_metrics.PREDICT, time.perf_counter() - started)
            started = time.perf_counter()
            metrics.host_time(vllm_metrics.BUDGET, time.perf_counter() - started)
            metrics.budget_chosen(8, 1.0)
            if len(events) > 4096:
                events.clear()

        recording = timed({"recording": record_one_step}, repeats=15 if quick else 41, inner=1000)
        median, q1, q3 = summary(recording["recording"])
        rows.append(
            {
                "group": "vllm",
                "name": f"metrics recording per decode step R={R} K={K} (serving thread)",
                "median_us": median,
                "q1_us": q1,
                "q3_us": q3,
                "reference": "the decode step, metrics off",
                "reference_median_us": rows[1]["reference_median_us"],
                "target": None,
                "pass": None,
            }
        )
        # The fold alone (the daemon thread's work): 1,000 steps' worth of verdicts pending.
        metrics.fold()
        fold_samples = []
        for _ in range(5 if quick else 15):
            for _ in range(1000):
                on.estimator_step()
            start = time.perf_counter()
            metrics.fold()
            fold_samples.append((time.perf_counter() - start) * 1e6)
        fold_median = float(np.median(fold_samples))
        rows.append(
            {
                "group": "vllm",
                "name": "metrics fold of 1,000 steps R=64 K=8 (daemon thread, once a second)",
                "median_us": fold_median,
                "q1_us": float(np.percentile(fold_samples, 25)),
                "q3_us": float(np.percentile(fold_samples, 75)),
                "reference": "per step, on the fold thread",
                "reference_median_us": fold_median / 1000,
                "target": None,
                "pass": None,
            }
        )
        return rows
    finally:
        vllm_metrics.reset()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for row in run(args.quick):
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})


if __name__ == "__main__":
    main()
