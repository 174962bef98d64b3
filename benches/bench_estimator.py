"""Speed of the estimator's hot calls against numpy implementations of the same math.

Both updates (docs/estimator.md): vLLM's, the default (rows without a suffix, the rows every
earlier run measured), and av_core's opt-in ``map`` (``(map)`` rows).

``observe`` at R in {8, 64, 256, 1024} and K in {4, 8, 16}: map bins one decode step's labeled
drafts into the per-position histograms (numpy: the same bins by ``bincount``); vllm computes
labels, IRLS weights and the per-position sufficient statistics. ``predict`` at the same sizes.
``refit`` as it runs in serving, at the end of a round that holds observations (here one decode
step of R = 256 requests), at K in {4, 8, 16, 32}, with the default memory γ = 0.8 and with
γ = 0: map runs the drift test at the reference, discounts and adds the histograms and iterates
the MAP Newton step to convergence (numpy: the same iteration with dense ``numpy.linalg.solve``);
vllm folds the round into the discounted quadratic memory, runs the χ² drift test and takes the
damped step. And observe's growth in R from 8 to 4096. Every av_core time is paired with the
numpy reference timed interleaved in the same run. A refit consumes its round, so each timed
refit follows an untimed ``observe``. The timed map observes run with a refit interval of 2^62,
so the fits the schedule runs after the 1st, 2nd, 4th, ... observe of a round fall in at most one
timed batch of calls per power of two (the medians are the observe itself).

Targets: observe <= 5 us at R = 256, K = 8; refit at K = 16 <= 20 us for map (it iterates),
<= 2 us for vllm (one step).

    python benches/bench_estimator.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
from timing import summary, timed, timed_each

from av_core import AcceptanceEstimator

OBSERVE_TARGET_US = 5.0
REFIT_TARGET_US = 2.0
MAP_REFIT_TARGET_US = 20.0
#: Distinct rounds the refit rows cycle through.
FRESH_ROUNDS = 16
BINS, LIMIT, X_SCALE = 64, 40.0, 2.0**16


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


class NumpyMemory:
    """The memory of past rounds (``av_core/src/estimator/memory.rs``) as a dense matrix in
    numpy."""

    def __init__(self, k: int) -> None:
        self.a = np.zeros((k + 1, k + 1))
        self.rhs = np.zeros(k + 1)
        self.total = 0.0
        self.counts = np.zeros(k)
        self.resets = 0


def numpy_refit_memory(
    memory: NumpyMemory,
    stats: np.ndarray,
    theta: np.ndarray,
    gamma: float = 0.8,
    drift_z: float = 3.09,
    l2: float = 1e-3,
    damping: float = 50.0,
) -> np.ndarray:
    """One refit with memory: decay, the drift test on this round's score, fold the round's
    quadratic model in, then the damped, guarded step toward the memory's optimum."""
    a, b, c, g0, g1, n = stats
    k = len(b)
    memory.a *= gamma
    memory.rhs *= gamma
    memory.total *= gamma
    memory.counts *= gamma
    if n.sum() == 0:
        return np.zeros(k + 1)
    h = np.zeros((k + 1, k + 1))
    h[0, 0] = a.sum() + l2
    h[0, 1:] = h[1:, 0] = b
    h[np.arange(1, k + 1), np.arange(1, k + 1)] = c + l2
    g = np.concatenate([[g0.sum()], g1])
    nu = k + 1
    q = 2.0 / (9.0 * nu)
    if g @ np.linalg.solve(h, g) > nu * (1.0 - q + drift_z * np.sqrt(q)) ** 3:
        resets = memory.resets + 1
        memory.__init__(k)  # type: ignore[misc]
        memory.resets = resets
    memory.a += h
    memory.rhs += h @ theta + g
    memory.total += n.sum()
    memory.counts += n
    gradient = memory.rhs - memory.a @ theta
    full = np.linalg.solve(memory.a, gradient)
    dw = full[0] * memory.total / (memory.total + damping)
    if not np.isfinite(dw) or theta[0] + dw < 0:
        dw = 0.0
    diagonal = np.diag(memory.a)[1:]
    db = (
        (gradient[1:] - memory.a[1:, 0] * dw) / diagonal * memory.counts / (memory.counts + damping)
    )
    return np.concatenate([[dw], np.where(np.isfinite(db), db, 0.0)])


def apply_bounds(
    theta: np.ndarray,
    step: np.ndarray,
    max_step: float = 4.0,
    max_slope: float = 10.0,
    max_intercept: float = 15.0,
) -> np.ndarray:
    """The refit's bounds: every step capped, the slope in [0, max_slope], |β| capped."""
    moved = theta + np.clip(step, -max_step, max_step)
    moved[0] = min(max(moved[0], 0.0), max_slope)
    moved[1:] = np.clip(moved[1:], -max_intercept, max_intercept)
    return moved


def numpy_observe_map(
    x: np.ndarray, admitted: np.ndarray, accepted: np.ndarray, k: int
) -> np.ndarray:
    """The map update's step in vectorized numpy: ``[3, K·B]`` labeled drafts, accepted drafts
    and ``Σ round((x + L)·2^16)`` per (position, bin)."""
    pos = np.arange(k)[None, :]
    labeled = (pos < accepted[:, None]) | (
        (pos == accepted[:, None]) & (accepted < admitted)[:, None]
    )
    y = (pos < accepted[:, None]).astype(np.float64)
    u = np.clip(x.astype(np.float64), -LIMIT, LIMIT) + LIMIT
    b = np.minimum((u * (BINS / (2 * LIMIT))).astype(np.int64), BINS - 1)
    index = (pos * BINS + b)[labeled]
    size = k * BINS
    return np.stack(
        [
            np.bincount(index, minlength=size).astype(np.float64),
            np.bincount(index, weights=y[labeled], minlength=size),
            np.bincount(index, weights=np.rint(u * X_SCALE)[labeled], minlength=size),
        ]
    )


def map_prior(k: int) -> tuple[np.ndarray, np.ndarray]:
    """The map prior's precision (closed form of ``av_core/src/estimator/map.rs``) and mean."""
    slope_sd, level_sd, trend_sd, spread_sd = 0.15, 1.0, 0.2, 0.1
    z = np.arange(k) - (k - 1) / 2.0
    c0 = level_sd**2 / (spread_sd**2 + k * level_sd**2)
    c1 = 0.0 if k == 1 else trend_sd**2 / (spread_sd**2 + float(z @ z) * trend_sd**2)
    precision = np.zeros((k + 1, k + 1))
    precision[0, 0] = slope_sd**-2
    precision[1:, 1:] = (np.eye(k) - c0 - c1 * np.outer(z, z)) / spread_sd**2
    return precision, np.concatenate([[0.5], np.full(k, -0.2)])


def map_terms(
    n: np.ndarray, a: np.ndarray, xbar: np.ndarray, theta: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Score and dense Hessian of the binned log-likelihood at θ (bins ``[K, B]``)."""
    k = n.shape[0]
    z = theta[0] * xbar + theta[1:, None]
    p = 1.0 / (1.0 + np.exp(-z))
    w, r = n * p * (1.0 - p), a - n * p
    g = np.concatenate([[np.sum(r * xbar)], r.sum(axis=1)])
    h = np.zeros((k + 1, k + 1))
    h[0, 0] = np.sum(w * xbar * xbar)
    h[0, 1:] = h[1:, 0] = (w * xbar).sum(axis=1)
    h[np.arange(1, k + 1), np.arange(1, k + 1)] = w.sum(axis=1)
    return g, h


class NumpyMapEstimator:
    """The numpy reference of the map update at a round's end: the drift test at the reference,
    the memory discounted (or dropped) and the round added, the MAP Newton iteration (dense
    solves, each step capped at 1, slope held at 0 if it would go negative, stop at 1e-6 or 16
    iterations), the bounds around the reference."""

    def __init__(self, k: int, memory: float, drift_z: float = 3.09, l2: float = 1e-3) -> None:
        self.k, self.gamma, self.drift_z, self.l2 = k, memory, drift_z, l2
        self.precision, self.mean = map_prior(k)
        self.theta = self.mean.copy()
        self.memory = np.zeros((3, k, BINS))  # count, accepted, Σx (feature units)
        self.round = np.zeros((3, k * BINS))
        self.resets = 0

    def observe(self, x: np.ndarray, admitted: np.ndarray, accepted: np.ndarray) -> None:
        self.round = self.round + numpy_observe_map(x, admitted, accepted, self.k)

    def _xbar(self, n: np.ndarray, x: np.ndarray) -> np.ndarray:
        return np.where(n > 0, x / np.where(n > 0, n, 1.0), 0.0)

    def refit(self) -> None:
        k = self.k
        count, accepted, offsets = (v.reshape(k, BINS) for v in self.round)
        self.round = np.zeros_like(self.round)
        if count.sum() == 0:
            self.memory *= self.gamma
            return
        xs = offsets / X_SCALE - LIMIT * count
        g, h = map_terms(count, accepted, self._xbar(count, xs), self.theta)
        h += self.l2 * np.eye(k + 1)
        nu = k + 1
        q = 2.0 / (9.0 * nu)
        self.memory *= self.gamma
        if g @ np.linalg.solve(h, g) > nu * (1.0 - q + self.drift_z * np.sqrt(q)) ** 3:
            self.memory[:] = 0.0
            self.resets += 1
        self.memory += np.stack([count, accepted, xs])
        n, a, x = self.memory
        xbar = self._xbar(n, x)
        theta = self.theta.copy()
        free = np.concatenate([[True], n.sum(axis=1) > 0])
        for _ in range(16):
            g, h = map_terms(n, a, xbar, theta)
            grad = g - self.precision @ (theta - self.mean)
            m = h + self.precision + self.l2 * np.eye(k + 1)
            step = np.linalg.solve(m[np.ix_(free, free)], grad[free])
            largest = float(np.max(np.abs(step)))
            if largest > 1.0:
                step *= 1.0 / largest
            theta[free] += step
            if theta[0] < 0.0:
                theta[0], free[0] = 0.0, False
            if largest < 1e-6:
                break
        self.theta = apply_bounds(self.theta, theta - self.theta)


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
    est = AcceptanceEstimator(k, refit_interval=2**62, update="vllm")
    map_est = AcceptanceEstimator(k, refit_interval=2**62, update="map")
    intercepts = est.intercepts
    observe = timed(
        {
            "av_core": lambda: est.observe(x, admitted, accepted, p),
            "numpy": lambda: numpy_observe(x, admitted, accepted, p),
        },
        repeats,
        inner,
    )
    observe_map = timed(
        {
            "av_core": lambda: map_est.observe(x, admitted, accepted, p),
            "numpy": lambda: numpy_observe_map(x, admitted, accepted, k),
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
        row(f"observe (map) R={r} K={k}", observe_map, target),
        row(f"predict R={r} K={k}", predict, None),
    ]


class NumpyEstimator:
    """The numpy reference of a whole estimator: the same statistics, the same refit (dense
    solves) and the same bounds, so its coefficients must track av_core's."""

    def __init__(self, k: int, memory: float, drift_z: float = 3.09) -> None:
        self.theta = np.concatenate([[0.5], np.full(k, -0.2)])
        self.gamma = memory
        self.drift_z = drift_z
        self.memory = NumpyMemory(k)
        self.stats = np.zeros((6, k))

    def observe(self, x: np.ndarray, admitted: np.ndarray, accepted: np.ndarray) -> None:
        z = self.theta[0] * np.clip(x.astype(np.float64), -40, 40) + self.theta[None, 1:]
        p = 1.0 / (1.0 + np.exp(-z))
        self.stats = self.stats + numpy_observe(x, admitted, accepted, p)

    def refit(self) -> None:
        if self.gamma == 0.0:
            step = numpy_refit(self.stats, float(self.theta[0]))
        else:
            step = numpy_refit_memory(self.memory, self.stats, self.theta, self.gamma, self.drift_z)
        self.theta = apply_bounds(self.theta, step)
        self.stats = np.zeros_like(self.stats)


def refit(k: int, memory: float, repeats: int, inner: int, update: str) -> dict[str, Any]:
    """The end-of-round refit of an estimator that has observed one step of R = 256 requests
    (after a few rounds, so the memory holds something), against the numpy reference refitting
    the same statistics; the round-loading observe is untimed (``count_step=False``, so no fit
    of the schedule runs in it). Each refit gets a fresh round, as in serving: the steps cycle
    through ``FRESH_ROUNDS`` draws of the workload, the same sequence on both sides (a repeated
    round converges in fewer Newton iterations than a new one)."""
    steps = [workload(256, k, seed=seed) for seed in range(FRESH_ROUNDS)]
    est = AcceptanceEstimator(k, refit_interval=2**62, memory=memory, update=update)
    reference: NumpyEstimator | NumpyMapEstimator = (
        NumpyEstimator(k, memory) if update == "vllm" else NumpyMapEstimator(k, memory)
    )
    for x, admitted, accepted, _ in steps[:5]:  # warm rounds: a memory, moved coefficients
        est.observe(x, admitted, accepted, count_step=False)
        est.refit()
        reference.observe(x, admitted, accepted)
        reference.refit()
    stats = [
        numpy_observe(x, admitted, accepted, p)
        if update == "vllm"
        else numpy_observe_map(x, admitted, accepted, k)
        for x, admitted, accepted, p in steps
    ]
    turn = {"av_core": 0, "numpy": 0}

    def av_core_setup() -> None:
        x, admitted, accepted, p = steps[turn["av_core"] % FRESH_ROUNDS]
        turn["av_core"] += 1
        est.observe(x, admitted, accepted, p, count_step=False)

    def numpy_setup() -> None:
        step = stats[turn["numpy"] % FRESH_ROUNDS]
        turn["numpy"] += 1
        if isinstance(reference, NumpyEstimator):
            reference.stats = step
        else:
            reference.round = step

    samples = timed_each(
        {"av_core": (av_core_setup, est.refit), "numpy": (numpy_setup, reference.refit)},
        repeats,
        inner,
    )
    if update == "vllm":
        name = f"refit K={k} γ={memory:g} (round of 256 observations)"
        target = REFIT_TARGET_US
    else:
        name = f"refit (map) K={k} γ={memory:g} (round of 256 observations)"
        target = MAP_REFIT_TARGET_US
    result = row(name, samples, target if k == 16 else None)
    result["reference"] = "numpy, the same system solved densely"
    return result


def run(quick: bool = False) -> list[dict[str, Any]]:
    repeats, inner = (7, 50) if quick else (21, 200)
    rows: list[dict[str, Any]] = []
    for k in (4, 8, 16):
        for r in (8, 64, 256, 1024):
            rows += observe_and_predict(r, k, repeats, inner)
    for update in ("vllm", "map"):
        rows += [refit(k, 0.8, repeats, inner, update) for k in (4, 8, 16, 32)]
        rows += [refit(k, 0.0, repeats, inner, update) for k in (4, 8, 16, 32)]
    return rows


def observe_time(r: int, repeats: int, inner: int) -> float:
    x, admitted, accepted, p = workload(r, 8)
    est = AcceptanceEstimator(8, refit_interval=2**62, update="vllm")
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
