"""End-to-end per-step overhead of one decode step through ``av_core.vllm`` on CPU tensors.

One decode step at R = 64 requests, K = 8: ``step`` (grade the previous drafts, refit every
100 steps) plus K ``predict`` calls (one per draft position, logits [64, 4096]). The reference
is a plain-torch implementation of the same estimator step on the same tensors: gathered
statistics in float64 with torch ops, ``torch.linalg.solve`` at each refit, a logsumexp feature.

    python benches/bench_vllm.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from av_core.vllm import OnlineAcceptanceEstimator

R, K, V, SLOTS = 64, 8, 4096, 128


class TorchReference:
    """vLLM's estimator math in plain torch (float64 statistics, dense solve)."""

    def __init__(self) -> None:
        self.slope = torch.full((1,), 0.5)
        self.intercepts = torch.full((K,), -0.2)
        self.features = torch.zeros(SLOTS, K)
        self.predictions = torch.zeros(SLOTS, K)
        self.stats = torch.zeros(6, K, dtype=torch.float64)
        self.steps = 0

    def step(
        self, idx: torch.Tensor, num_sampled: torch.Tensor, num_rejected: torch.Tensor
    ) -> None:
        accepted = (num_sampled - 1).clamp(min=0)
        admitted = accepted + num_rejected
        pos = torch.arange(K)[None, :]
        labeled = (pos < accepted[:, None]) | (
            (pos == accepted[:, None]) & (accepted < admitted)[:, None]
        )
        x = self.features[idx].double()
        p = self.predictions[idx].double()
        y = (pos < accepted[:, None]).double()
        w = torch.where(labeled, p * (1 - p), 0.0)
        r = torch.where(labeled, y - p, 0.0)
        self.stats += torch.stack(
            [
                (w * x * x).sum(0),
                (w * x).sum(0),
                w.sum(0),
                (r * x).sum(0),
                r.sum(0),
                labeled.double().sum(0),
            ]
        )
        self.steps += 1
        if self.steps % 100 == 0:
            a, b, c, g0, g1, n = self.stats
            h = torch.diag(torch.cat([a.sum()[None], c]) + 1e-3)
            h[0, 1:] = b
            h[1:, 0] = b
            step = torch.linalg.solve(h, torch.cat([g0.sum()[None], g1]))
            total = n.sum()
            dw = step[0] * total / (total + 50)
            dw = dw if bool(torch.isfinite(dw)) and float(self.slope + dw) >= 0 else dw * 0
            db = (g1 - b * dw) / (c + 1e-3) * n / (n + 50)
            self.slope += dw.float()
            self.intercepts += torch.nan_to_num(db).float()
            self.stats.zero_()

    def predict(self, logits: torch.Tensor, idx: torch.Tensor, k: int, conf: torch.Tensor) -> None:
        top = logits.max(dim=-1)
        rest = logits.scatter(-1, top.indices[:, None], float("-inf"))
        x = (top.values - torch.logsumexp(rest, dim=-1)).clamp(-40, 40)
        p = torch.sigmoid(self.slope * x + self.intercepts[k])
        self.features[idx, k] = x
        self.predictions[idx, k] = p
        conf[: len(idx), k] = p


def decode_steps(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    steps = []
    for _ in range(n):
        num_sampled = torch.randint(1, K + 2, (R,), generator=g, dtype=torch.int32)
        num_rejected = torch.where(num_sampled <= K, 1, 0).to(torch.int32)
        steps.append({"num_sampled": num_sampled, "num_rejected": num_rejected})
    return steps


def one_step(
    est: Any,
    idx: torch.Tensor,
    verdict: dict[str, torch.Tensor],
    logits: list[torch.Tensor],
    conf: torch.Tensor,
    temperature: torch.Tensor,
    reference: bool,
) -> None:
    est.step(idx, verdict["num_sampled"], verdict["num_rejected"])
    for k, lg in enumerate(logits):
        if reference:
            est.predict(lg, idx, k, conf)
        else:
            est.predict(lg, idx, torch.tensor(k), conf, temperature)


def run(quick: bool = False) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    steps = 200 if quick else 600
    verdicts = decode_steps(steps)
    logits = [torch.randn(R, V) * 3 for _ in range(K)]
    idx = torch.arange(R, dtype=torch.int32)
    temperature = torch.ones(SLOTS)
    ours, ref = OnlineAcceptanceEstimator(SLOTS, K, torch.device("cpu")), TorchReference()
    conf_ours, conf_ref = torch.zeros(SLOTS, K), torch.zeros(SLOTS, K)
    times: dict[str, list[float]] = {"av_core": [], "reference": []}
    for verdict in verdicts:
        for name, est, conf in (("av_core", ours, conf_ours), ("reference", ref, conf_ref)):
            start = time.perf_counter()
            one_step(
                est,
                idx.long() if name == "reference" else idx,
                verdict,
                logits,
                conf,
                temperature,
                reference=name == "reference",
            )
            times[name].append((time.perf_counter() - start) * 1e6)
    q1, median, q3 = statistics.quantiles(times["av_core"], n=4, method="inclusive")
    reference = statistics.median(times["reference"])
    return [
        {
            "group": "vllm",
            "name": f"av_core.vllm decode step (step + {K} predict) R={R} K={K} V={V}, CPU",
            "median_us": median,
            "q1_us": q1,
            "q3_us": q3,
            "reference": "plain torch, same math",
            "reference_median_us": reference,
            "speedup": reference / median,
            "target": None,
            "pass": None,
            "refits": ours.num_refits,
        }
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for row in run(args.quick):
        print(row)


if __name__ == "__main__":
    main()
