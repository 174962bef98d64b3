"""The calibration curve's shape: the map update plus a softplus term.

A numpy prototype, not shipped. One logistic curve per position, ``σ(ω·x + β_k)``, goes to 0 as
the drafter's confidence does; the acceptance rate does not (it is ``1 − TV(p, q)`` on average,
which stays above 0 when q flattens), and on both shipped traces the reliability bins at
p ≈ 0.3–0.55 are under-predicted in every prompt order. Beta calibration (Kull, Silva Filho and
Flach, AISTATS 2017) fits separate slopes on ``log q_max`` and ``−log(1 − q_max)``; written on
x = logit(q_max), whose two parts they are (``log q = −softplus(−x)``, ``−log(1 − q) =
softplus(x)``), the model is

    p = σ(ω·x + c·softplus(x) + β_k),

monotone in x while ω ≥ 0 and ω + c ≥ 0 (the fit holds both), one coefficient more than the map
update's, on the same histograms (the terms at each bin's exact mean x̄). Prior: the map update's
on (ω, β) plus ``c ~ N(c_mean, c_sd²)``. Batch fits of every label (K intercepts): whole-trace ECE
0.0120 → 0.0082 on t1 and 0.0199 → 0.0103 on t0.6.

Scored as ``scripts/residual_study.py`` scores its candidates (its ``cells``: the prequential
``replay`` and ``Scores`` of ``scripts/cold_start_study.py``, refit 25 and 100, 1 and 4 rounds
per observe, first 25% of labels and the whole trace), on the shipped order and on random prompt
orders.

``python scripts/shape_study.py [--permutations P]``
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cold_start_study as cs  # noqa: E402
from cold_start_study import (  # noqa: E402
    F64,
    MAX_X,
    Histogram,
    Maker,
    Scheme,
    chi2_quantile,
    newton,
    sigmoid,
    spd_solve,
)
from residual_study import BOUNDS, KEYS, cells  # noqa: E402

from av_core.trace import SHIPPED_TRACES  # noqa: E402


def softplus(x: F64) -> F64:
    return np.asarray(np.logaddexp(0.0, x))


class Shape(Histogram):
    """The map update's numpy model with the softplus term (see the module docstring)."""

    def __init__(self, k: int, scheme: Scheme, c_mean: float, c_sd: float) -> None:
        super().__init__(k, scheme)
        self.c = c_mean
        # Prior over θ = (ω, c, β_1 … β_K): the map update's, with c inserted second.
        lam = np.zeros((k + 2, k + 2))
        lam[0, 0], lam[0, 2:], lam[2:, 0] = self.lam[0, 0], self.lam[0, 1:], self.lam[1:, 0]
        lam[2:, 2:] = self.lam[1:, 1:]
        lam[1, 1] = 0.0 if math.isinf(c_sd) else c_sd**-2
        self.lam2 = lam
        self.mu2 = np.concatenate([[self.mu[0], c_mean], self.mu[1:]])
        self.ref = np.concatenate([[self.slope, self.c], self.intercepts])

    def predict(self, x: Any) -> Any:
        xf = np.clip(x.astype(np.float64), -MAX_X, MAX_X)
        z = self.slope * xf + self.c * softplus(xf) + self.intercepts
        return sigmoid(z).astype(np.float32)

    def _terms(self, n: F64, a: F64, xbar: F64, theta: F64) -> tuple[F64, F64]:
        """Score and Hessian of the histogram log-likelihood at θ."""
        k, f = self.k, [xbar, softplus(xbar)]
        p = sigmoid(theta[0] * f[0] + theta[1] * f[1] + theta[2:, None])
        w, r = n * p * (1.0 - p), a - n * p
        g = np.concatenate([[float((r * f[0]).sum()), float((r * f[1]).sum())], r.sum(axis=1)])
        h = np.zeros((k + 2, k + 2))
        for i in range(2):
            for j in range(2):
                h[i, j] = float((w * f[i] * f[j]).sum())
            h[i, 2:] = h[2:, i] = (w * f[i]).sum(axis=1)
        h[2:, 2:] = np.diag(w.sum(axis=1))
        return g, h

    def _drift(self) -> bool:
        if self.r_n.sum() == 0 or math.isinf(self.s.drift_z):
            return False
        g, h = self._terms(self.r_n, self.r_a, self._xbar(self.r_n, self.r_sx), self.ref)
        sol = spd_solve(h + self.s.l2 * np.eye(self.k + 2), g)
        t = math.inf if sol is None else float(g @ sol)
        return t > chi2_quantile(self.k + 2, self.s.drift_z)

    def _end_round(self) -> None:
        super()._end_round()
        self.ref = np.concatenate([[self.slope, self.c], self.intercepts])

    def _fit(self) -> None:
        s, k = self.s, self.k
        n, a, sx = self.r_n + self.m_n, self.r_a + self.m_a, self.r_sx + self.m_sx
        xbar = self._xbar(n, sx)
        theta0 = self.ref.copy()
        free = np.concatenate([[True, True], n.sum(axis=1) > 0])

        def system(theta: F64) -> tuple[F64, F64]:
            g, h = self._terms(n, a, xbar, theta)
            return h + self.lam2 + s.l2 * np.eye(k + 2), g - self.lam2 @ (theta - self.mu2)

        def hold(theta: F64, free: npt.NDArray[np.bool_]) -> None:
            if theta[0] < 0.0:  # ω ≥ 0: hold it at 0
                theta[0], free[0] = 0.0, False
            if theta[0] + theta[1] < 0.0 and free[1]:  # ω + c ≥ 0
                theta[1], free[1] = -theta[0], False

        theta, _ = newton(theta0, free, system, hold, s)
        self.new_labels = 0
        d = np.clip(theta - theta0, -s.max_step, s.max_step)
        self.slope = float(np.clip(theta0[0] + d[0], 0.0, s.max_slope))
        self.c = float(np.clip(theta0[1] + d[1], -self.slope, s.max_slope))
        self.intercepts = np.clip(theta0[2:] + d[2:], -s.max_intercept, s.max_intercept)
        self.refits += 1


def shape(c_mean: float = 0.0, c_sd: float = 0.3, **scheme: Any) -> Maker:
    base = Scheme(**scheme)
    return lambda k, interval: Shape(k, replace(base, refit_interval=interval), c_mean, c_sd)


CANDIDATES: dict[str, Maker] = {
    "map (the default update)": cs.MAP,
    "map + c·softplus(x), c ~ N(0, 0.3²), cold start unchanged": shape(),
    "… c ~ N(0, 1)": shape(c_sd=1.0),
    "… c unpenalized": shape(c_sd=math.inf),
    "… centred on the traces' shape: ω 0.1, c ~ N(0.6, 0.2²), β −0.6": shape(
        0.6, 0.2, init_slope=0.1, init_intercept=-0.6
    ),
    "… the same, γ = 0.9": shape(0.6, 0.2, init_slope=0.1, init_intercept=-0.6, memory=0.9),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--permutations", type=int, default=8)
    args = parser.parse_args()
    streams = [cs.shipped_stream(name) for name in SHIPPED_TRACES]
    orders = [[s.shuffled(seed) for s in streams] for seed in range(args.permutations)]
    print(
        f"Target misses (ECE 25%, AUC gap 25%, ECE, AUC gap) over 8 cells of the shipped order "
        f"and over {args.permutations} prompt orders × 8 cells; the shipped order's worst cell; "
        "the mean over cells and orders of the whole-trace ECE, AUC gap and log-loss.\n"
    )
    print(
        "| scheme | shipped misses | shipped worst: ECE 25% / AUC 25% / ECE / AUC | "
        "orders misses | ECE | AUC gap | log-loss |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, make in CANDIDATES.items():
        shipped = cells(make, streams)
        grids = np.asarray([cells(make, o) for o in orders])  # [order, cell, key]
        miss_shipped = tuple(int((shipped[:, j] > BOUNDS[j]).sum()) for j in range(4))
        miss_orders = tuple(int((grids[..., j] > BOUNDS[j]).sum()) for j in range(4))
        worst = shipped.max(axis=0)
        mean = grids.reshape(-1, len(KEYS)).mean(axis=0)
        print(
            f"| {label} | {miss_shipped} | {worst[0]:.4f} / {worst[1]:+.4f} / {worst[2]:.4f} / "
            f"{worst[3]:+.4f} | {miss_orders} | {mean[2]:.4f} | {mean[3]:+.4f} | {mean[4]:.5f} |"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
