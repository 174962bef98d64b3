"""Speed of the estimator's hot calls against numpy implementations of the same math.

``observe`` (labels, IRLS weights and the per-position sufficient statistics of one decode step)
and ``predict`` at R in {8, 64, 256, 1024} and K in {4, 8, 16}; ``refit`` (the damped Newton step
on K + 1 unknowns) at K in {4, 8, 16, 32}; and observe's growth in R from 8 to 4096. Every av_core
time is paired with the numpy reference timed interleaved in the same run.

Targets (DESIGN.md section 7): observe <= 5 us at R = 256, K = 8; refit <= 2 us at K = 16.

    python benches/bench_estimator.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
from timing import summary, timed

from av_core import AcceptanceEstimator

OBSERVE_TARGET_US = 5.0
REFIT_TARGET_US = 2.0


def numpy_observe(
    x: np.ndarray, admitted: np.ndarray, accepted: np.ndarray, p: np.ndarray
) -> np.ndarray:
    """The same statistics in vectorized float64 numpy: labels, masks, weighted column sums."""
    k = x.shape[1]
    pos = np.arange(k)[None, :]
    labeled = (pos < accepted[:, None]) | (
        (pos == accepted[:, None]) & (accepted < admitted)[:, None]
    )
    y = (pos < accepted[:, None]).astype(np.float64)
    xs = np.clip(x.astype(np.float64), -40.0, 40.0)
    ps = p.astype(np.float64)
    w = np.where(labeled, ps * (1.0 - ps), 0.0)
    r = np.where(labeled, y - ps, 0.0)
    wx = w * xs
    return np.stack(
        [(wx * xs).sum(0), wx.sum(0), w.sum(0), (r * xs).sum(0), r.sum(0), labeled.sum(0)]
    )


def numpy_predict(x: np.ndarray, slope: float, intercepts: np.ndarray) -> np.ndarray:
    z = slope * np.clip(x.astype(np.float64), -40.0, 40.0) + intercepts[None, :]
    return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)


def numpy_refit(
    stats: np.ndarray, slope: float, l2: float = 1e-3, damping: float = 50.0
) -> np.ndarray:
    """Dense (K+1) system solved by numpy, then vLLM's damping and guards."""
    a, b, c, g0, g1, n = stats
    k = len(b)
    h = np.zeros((k + 1, k + 1))
    h[0, 0] = a.sum() + l2
    h[0, 1:] = h[1:, 0] = b
    h[np.arange(1, k + 1), np.arange(1, k + 1)] = c + l2
    step = np.linalg.solve(h, np.concatenate([[g0.sum()], g1]))
    total = n.sum()
    dw = step[0] * total / (total + damping)
    if not np.isfinite(dw) or slope + dw < 0:
        dw = 0.0
    db = (g1 - b * dw) / (c + l2) * n / (n + damping)
    return np.concatenate([[dw], np.where(np.isfinite(db), db, 0.0)])


def workload(rows: int, k: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.5, 3.0, size=(rows, k)).astype(np.float32)
    p = rng.uniform(0.05, 0.95, size=(rows, k)).astype(np.float32)
    admitted = np.full(rows, k, np.int64)
    accepted = rng.integers(0, k + 1, size=rows).astype(np.int64)
    return x, admitted, accepted, p


def row(name: str, samples: dict[str, list[float]], target: float | None) -> dict[str, Any]:
    median, q1, q3 = summary(samples["av_core"])
    reference, _, _ = summary(samples["numpy"])
    return {
        "group": "estimator",
        "name": name,
        "median_us": median,
        "q1_us": q1,
        "q3_us": q3,
        "reference": "numpy, same math",
        "reference_median_us": reference,
        "speedup": reference / median,
        "target": None if target is None else f"<= {target:g} us",
        "pass": None if target is None else median <= target,
    }


def observe_and_predict(r: int, k: int, repeats: int, inner: int) -> list[dict[str, Any]]:
    x, admitted, accepted, p = workload(r, k)
    est = AcceptanceEstimator(k, refit_interval=2**62)
    intercepts = est.intercepts
    observe = timed(
        {
            "av_core": lambda: est.observe(x, admitted, accepted, p),
            "numpy": lambda: numpy_observe(x, admitted, accepted, p),
        },
        repeats,
        inner,
    )
    predict = timed(
        {"av_core": lambda: est.predict(x), "numpy": lambda: numpy_predict(x, 0.5, intercepts)},
        repeats,
        inner,
    )
    target = OBSERVE_TARGET_US if (r, k) == (256, 8) else None
    return [
        row(f"observe R={r} K={k}", observe, target),
        row(f"predict R={r} K={k}", predict, None),
    ]


def refit(k: int, repeats: int, inner: int) -> dict[str, Any]:
    x, admitted, accepted, p = workload(256, k)
    est = AcceptanceEstimator(k, refit_interval=2**62)
    stats = numpy_observe(x, admitted, accepted, p)
    samples = timed(
        {"av_core": est.refit, "numpy": lambda: numpy_refit(stats, 0.5)}, repeats, inner
    )
    return row(f"refit K={k}", samples, REFIT_TARGET_US if k == 16 else None)


def run(quick: bool = False) -> list[dict[str, Any]]:
    repeats, inner = (7, 50) if quick else (21, 200)
    rows: list[dict[str, Any]] = []
    for k in (4, 8, 16):
        for r in (8, 64, 256, 1024):
            rows += observe_and_predict(r, k, repeats, inner)
    rows += [refit(k, repeats, inner) for k in (4, 8, 16, 32)]
    return rows


def observe_time(r: int, repeats: int, inner: int) -> float:
    x, admitted, accepted, p = workload(r, 8)
    est = AcceptanceEstimator(8, refit_interval=2**62)
    samples = timed({"av_core": lambda: est.observe(x, admitted, accepted, p)}, repeats, inner)
    return summary(samples["av_core"])[0]


def scaling(quick: bool = False) -> list[dict[str, Any]]:
    """observe's cost per call against R at K = 8, and the fitted growth exponent (R >= 128)."""
    repeats, inner = (5, 20) if quick else (11, 50)
    sizes = (8, 32, 128, 512, 2048, 4096)
    times = [observe_time(r, repeats, inner) for r in sizes]
    big = [i for i, r in enumerate(sizes) if r >= 128]
    exponent = float(
        np.polyfit(np.log([sizes[i] for i in big]), np.log([times[i] for i in big]), 1)[0]
    )
    return [
        {
            "group": "scaling",
            "name": f"observe R={r} K=8",
            "R": r,
            "median_us": t,
            "growth_exponent": exponent,
        }
        for r, t in zip(sizes, times, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = run(args.quick) + scaling(args.quick)
    for r in rows:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
