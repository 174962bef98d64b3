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
