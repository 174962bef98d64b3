"""Independent float64 numpy references for the estimator's math (never calls av_core)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def labels(num_positions: int, admitted: int, accepted: int) -> list[float | None]:
    """The label rule of docs/design.md ("The estimator"), written out case by case."""
    out: list[float | None] = []
    for k in range(num_positions):
        if k < accepted:
            out.append(1.0)
        elif k == accepted and accepted < admitted:
            out.append(0.0)
        else:
            out.append(None)
    return out


def round_statistics(
    features: npt.ArrayLike,
    admitted: npt.ArrayLike,
    accepted: npt.ArrayLike,
    predictions: npt.ArrayLike,
    max_log_odds: float = 40.0,
) -> dict[str, FloatArray]:
    """Per-position a, b, c, g0, g1, n of one batch, in float64."""
    x_all = np.clip(np.asarray(features, dtype=np.float64), -max_log_odds, max_log_odds)
    p_all = np.asarray(predictions, dtype=np.float64)
    k = x_all.shape[1]
    stats = {name: np.zeros(k) for name in ("a", "b", "c", "g0", "g1", "n")}
    for row, (ad, ac) in enumerate(zip(np.asarray(admitted), np.asarray(accepted), strict=True)):
        for pos, y in enumerate(labels(k, int(ad), int(ac))):
            if y is None:
                continue
            x, p = x_all[row, pos], p_all[row, pos]
            w, r = p * (1 - p), y - p
            stats["a"][pos] += w * x * x
            stats["b"][pos] += w * x
            stats["c"][pos] += w
            stats["g0"][pos] += r * x
            stats["g1"][pos] += r
            stats["n"][pos] += 1
    return stats


def vllm_refit(
    slope: float,
    intercepts: FloatArray,
    stats: dict[str, FloatArray],
    l2: float = 1e-3,
    damping: float = 50.0,
) -> tuple[float, FloatArray]:
    """vLLM 0.33.0's refit, as its kernel documents it: the arrowhead Schur-complement step."""
    with np.errstate(all="ignore"):
        c = stats["c"] + l2
        a = stats["a"].sum() + l2
        b, g1, n = stats["b"], stats["g1"], stats["n"]
        step_w = (stats["g0"].sum() - np.sum(b * g1 / c)) / (a - np.sum(b * b / c))
        total = n.sum()
        step_w *= total / (total + damping)
        if not np.isfinite(step_w) or slope + step_w < 0:
            step_w = 0.0
        step_b = (g1 - b * step_w) / c * (n / (n + damping))
        step_b = np.where(np.isfinite(step_b), step_b, 0.0)
    return slope + float(step_w), np.asarray(intercepts, dtype=np.float64) + step_b


def newton_system(stats: dict[str, FloatArray], l2: float) -> tuple[FloatArray, FloatArray]:
    """The dense (H + lambda I, g) of the full Newton step."""
    k = len(stats["n"])
    h = np.zeros((k + 1, k + 1))
    h[0, 0] = stats["a"].sum() + l2
    h[0, 1:] = h[1:, 0] = stats["b"]
    h[np.arange(1, k + 1), np.arange(1, k + 1)] = stats["c"] + l2
    g = np.concatenate([[stats["g0"].sum()], stats["g1"]])
    return h, g


def histograms(
    features: npt.ArrayLike,
    admitted: npt.ArrayLike,
    accepted: npt.ArrayLike,
    bins: int = 64,
    max_log_odds: float = 40.0,
) -> dict[str, FloatArray]:
    """The map update's round, bin by bin: labeled drafts ``n``, accepted ``a`` and the sum of
    the clamped features ``x`` (exact floats), each ``[K, bins]``; the bin of ``x`` is
    ``floor((x + L) / (2L / bins))``, the upper edge in the last bin."""
    x_all = np.clip(np.asarray(features, dtype=np.float64), -max_log_odds, max_log_odds)
    k = x_all.shape[1]
    out = {name: np.zeros((k, bins)) for name in ("n", "a", "x")}
    width = 2 * max_log_odds / bins
    for row, (ad, ac) in enumerate(zip(np.asarray(admitted), np.asarray(accepted), strict=True)):
        for pos, y in enumerate(labels(k, int(ad), int(ac))):
            if y is None:
                continue
            x = x_all[row, pos]
            b = min(int(np.floor((x + max_log_odds) / width)), bins - 1)
            out["n"][pos, b] += 1
            out["a"][pos, b] += y
            out["x"][pos, b] += x
    return out


def prior_precision(
    k: int, slope_sd: float, level_sd: float, trend_sd: float, spread_sd: float
) -> FloatArray:
    """The map prior's (K+1)^2 precision, by inverting the covariance of
    beta_k = level + trend * (k - (K-1)/2) + eps_k (and the slope's variance)."""
    z = np.arange(k) - (k - 1) / 2.0
    cov = level_sd**2 * np.ones((k, k)) + trend_sd**2 * np.outer(z, z) + spread_sd**2 * np.eye(k)
    out = np.zeros((k + 1, k + 1))
    out[0, 0] = slope_sd**-2
    out[1:, 1:] = np.linalg.inv(cov)
    return out


def map_fit(
    n: FloatArray,
    a: FloatArray,
    x_sum: FloatArray,
    precision: FloatArray,
    mean: FloatArray,
    start: FloatArray,
) -> FloatArray:
    """The posterior mode of p = sigmoid(w x + b_k) on binned data (each bin's labels at its mean
    feature) under a Gaussian prior, by scipy's trust-region Newton; positions without a label
    keep their ``start`` value."""
    from scipy.optimize import minimize
    from scipy.special import expit, log_expit

    k = n.shape[0]
    occupied = n > 0
    xbar = np.where(occupied, x_sum / np.where(occupied, n, 1.0), 0.0)
    free = np.concatenate([[True], occupied.any(axis=1)])

    def full(theta_free: FloatArray) -> FloatArray:
        theta = np.asarray(start, dtype=np.float64).copy()
        theta[free] = theta_free
        return theta

    def objective(theta_free: FloatArray) -> tuple[float, FloatArray, FloatArray]:
        theta = full(theta_free)
        z = theta[0] * xbar + theta[1:, None]
        nll = -float(np.sum(np.where(occupied, a * log_expit(z) + (n - a) * log_expit(-z), 0.0)))
        d = theta - mean
        value = nll + 0.5 * float(d @ precision @ d)
        p = expit(z)
        r = np.where(occupied, a - n * p, 0.0)
        w = np.where(occupied, n * p * (1 - p), 0.0)
        grad = -np.concatenate([[np.sum(r * xbar)], r.sum(axis=1)]) + precision @ d
        hess = precision.copy()
        hess[0, 0] += np.sum(w * xbar * xbar)
        hess[0, 1:] += (w * xbar).sum(axis=1)
        hess[1:, 0] += (w * xbar).sum(axis=1)
        hess[np.arange(1, k + 1), np.arange(1, k + 1)] += w.sum(axis=1)
        return value, grad[free], hess[np.ix_(free, free)]

    result = minimize(
        lambda t: objective(t)[0],
        np.asarray(start, dtype=np.float64)[free],
        jac=lambda t: objective(t)[1],
        hess=lambda t: objective(t)[2],
        method="trust-exact",
        options={"gtol": 1e-11},
    )
    theta = full(result.x)
    return theta


def rank_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties (independent of av_core.tools.metrics)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    positives = labels == 1
    n1, n0 = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
