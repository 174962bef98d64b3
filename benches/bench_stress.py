"""Observation throughput under concurrency: 1, 2, 4 and 8 Python producer threads calling
``observe`` on one estimator (the GIL is released inside), against one thread summing the same
statistics with numpy (the reference figure of merit: observations per second).

    python benches/bench_stress.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_estimator import numpy_observe  # noqa: E402

from av_core import AcceptanceEstimator  # noqa: E402

K, ROWS = 8, 256


def batch(seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.5, 3.0, size=(ROWS, K)).astype(np.float32)
    p = rng.uniform(0.05, 0.95, size=(ROWS, K)).astype(np.float32)
    admitted = np.full(ROWS, K, np.int64)
    accepted = rng.integers(0, K + 1, size=ROWS).astype(np.int64)
    return x, admitted, accepted, p


def throughput(producers: int, calls: int) -> float:
    """Labeled observations per second with `producers` threads, `calls` observes each."""
    data = [batch(s) for s in range(8)]
    est = AcceptanceEstimator(K, refit_interval=2**62, update="vllm")

    def work(t: int) -> None:
        for i in range(calls):
            est.observe(*data[(t + i) % len(data)])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(producers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return float(sum(est.round_counts())) / elapsed


def numpy_throughput(calls: int) -> float:
    data = [batch(s) for s in range(8)]
    labeled = 0.0
    start = time.perf_counter()
    for i in range(calls):
        labeled += float(numpy_observe(*data[i % len(data)])[5].sum())
    return labeled / (time.perf_counter() - start)


def run(quick: bool = False) -> list[dict[str, Any]]:
    calls = 2000 if quick else 10000
    reference = numpy_throughput(calls // 10)
    throughput(1, 200)  # warm-up: first-touch page faults and allocator growth
    rows = []
    for producers in (1, 2, 4, 8):
        rate = throughput(producers, calls // producers)
        rows.append(
            {
                "group": "stress",
                "name": f"observe throughput, {producers} producer thread(s), R={ROWS} K={K}",
                "observations_per_s": rate,
                "reference": "numpy, 1 thread",
                "reference_observations_per_s": reference,
                "speedup": rate / reference,
                "target": None,
                "pass": None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for row in run(args.quick):
        print(
            f"{row['name']}: {row['observations_per_s'] / 1e6:.1f} M obs/s "
            f"(numpy {row['reference_observations_per_s'] / 1e6:.2f} M obs/s)"
        )


if __name__ == "__main__":
    main()
