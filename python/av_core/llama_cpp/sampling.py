"""The sampler of the loop: temperature, top-k and top-p applied identically to the target's and
the drafter's logits, exact speculative sampling, and the drafter-side feature.

The sampling distribution of a row of logits ``z`` is vLLM's (and :mod:`av_core.features`'):
``softmax(z / T)``, then top-k keeps the ``k`` largest entries, then top-p keeps the smallest
prefix of the renormalised top-k distribution (sorted descending) holding at least ``p`` of it,
never fewer than one token. ``T <= 0`` is greedy: all the mass on the first maximum.

Verification is exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023): draft
``x_k ~ q_k`` is accepted with probability ``min(1, p_k(x) / q_k(x))``; the first rejected
position emits a token from ``norm(max(0, p_k - q_k))``, and a fully accepted block emits a bonus
token from the target's next distribution. Every random choice goes through a
:class:`RandomSource`, so a test can enumerate every branch with its exact probability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from av_core import _native
from av_core._native import InvalidTypeError, InvalidValueError

FloatArray = npt.NDArray[np.float64]

#: The feature clamp, the estimator's default ``max_log_odds``.
MAX_LOG_ODDS = 40.0


@dataclass(frozen=True)
class SamplingParams:
    """How target and drafter sample: ``temperature`` (``<= 0``: greedy), ``top_k`` (``<= 0``:
    off) and ``top_p`` in ``(0, 1]`` (1: off), applied in that order."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float):
            raise InvalidTypeError(f"temperature must be a number, got {self.temperature!r}")
        if not math.isfinite(self.temperature):
            raise InvalidValueError(f"temperature must be finite, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise InvalidTypeError(f"top_k must be an int, got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float):
            raise InvalidTypeError(f"top_p must be a number, got {self.top_p!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def truncated(self) -> bool:
        """Whether top-k or top-p removes part of the vocabulary."""
        return self.top_k > 0 or self.top_p < 1.0


def probabilities(logits: npt.ArrayLike, params: SamplingParams) -> FloatArray:
    """The sampling distribution of each row of ``logits`` ([N, V] or [V]), float64."""
    z = np.asarray(logits)
    if params.greedy:
        out = np.zeros(z.shape, dtype=np.float64)
        np.put_along_axis(out, np.argmax(z, axis=-1)[..., None], 1.0, axis=-1)
        return out
    y: FloatArray = np.subtract(z, z.max(axis=-1, keepdims=True), dtype=np.float64)
    if params.temperature != 1.0:
        y *= 1.0 / params.temperature
    np.exp(y, out=y)
    if params.truncated:
        rows = y.reshape(-1, y.shape[-1])
        k = params.top_k if 0 < params.top_k < rows.shape[1] else rows.shape[1]
        for row in rows:
            order = np.argsort(-row, kind="stable")
            kept = row[order[:k]]
            if params.top_p < 1.0:
                before = np.cumsum(kept) - kept
                kept = kept[: max(1, int(np.count_nonzero(before < params.top_p * kept.sum())))]
            row[order[kept.shape[0] :]] = 0.0
    y /= y.sum(axis=-1, keepdims=True)
    return y


def draft_features(
    logits: npt.NDArray[np.float32], params: SamplingParams
) -> npt.NDArray[np.float32]:
    """``logit(q_max)`` of each row of drafter logits [N, V] under the sampler's distribution q.

    Untruncated rows go to the Rust kernel :func:`av_core.features.draft_log_odds` uses on CPU
    float32 logits (the same bits, without torch); with top-k or top-p the feature is
    :func:`av_core.features.draft_log_odds` itself, which needs torch (``av_core[torch]``).
    """
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    if logits.shape[0] == 0:
        return np.zeros(0, dtype=np.float32)
    if not params.truncated:
        inverse = 1.0 if params.greedy else 1.0 / params.temperature
        rows = np.full(logits.shape[0], inverse, dtype=np.float32)
        return _native.draft_log_odds_f32(logits, rows, MAX_LOG_ODDS, None)
    try:
        import torch

        from av_core.features import draft_log_odds
    except ImportError as error:
        raise ImportError(
            'features under top-k/top-p need torch: pip install "av_core[llama,torch]"'
        ) from error
    return draft_log_odds(
        torch.from_numpy(logits),
        params.temperature,
        top_k=params.top_k if params.top_k > 0 else None,
        top_p=params.top_p if params.top_p < 1.0 else None,
    ).numpy()


class RandomSource(Protocol):
    """Every random choice of the loop: a Bernoulli draw and a categorical draw."""

    def bernoulli(self, probability: float) -> bool: ...
    def categorical(self, weights: FloatArray) -> int: ...


_BLOCK = 1024


class NumpySource:
    """:class:`RandomSource` over a seeded ``numpy.random.Generator``."""

    def __init__(self, seed: int | np.random.Generator = 0) -> None:
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def bernoulli(self, probability: float) -> bool:
        return bool(self.rng.random() < probability)

    def categorical(self, weights: FloatArray) -> int:
        """Inverse-CDF sampling in two stages (blocks of ``_BLOCK`` entries, then the entries
        of the chosen block), so a draw reads the vocabulary once instead of summing it twice."""
        w = np.asarray(weights, dtype=np.float64)
        n = w.shape[0]
        blocks = -(-n // _BLOCK)
        padded = np.zeros(blocks * _BLOCK)
        padded[:n] = w
        sums = padded.reshape(blocks, _BLOCK).sum(axis=1)
        target = self.rng.random() * sums.sum()
        block_cumulative = np.cumsum(sums)
        block = min(int(np.searchsorted(block_cumulative, target, side="right")), blocks - 1)
        while sums[block] <= 0.0:  # round-off past the last block with mass
            block -= 1
        target -= block_cumulative[block] - sums[block]
        inside = padded[block * _BLOCK : (block + 1) * _BLOCK]
        index = min(int(np.searchsorted(np.cumsum(inside), target, side="right")), _BLOCK - 1)
        while inside[index] <= 0.0:  # round-off past the last entry with mass
            index -= 1
        return int(block * _BLOCK + index)


def verify(
    target: FloatArray, drafter: FloatArray, drafts: npt.ArrayLike, source: RandomSource
) -> tuple[int, int]:
    """Exact speculative sampling of one request's admitted drafts.

    ``target``: the target's distributions [a + 1, V] at the a drafted positions and the one
    after; ``drafter``: the drafter's [a, V] (what each draft was sampled from); ``drafts``: the
    a tokens. Returns ``(accepted, token)``: how many leading drafts are accepted and the token
    emitted after them (the residual's sample at the first rejection, else the bonus token).
    """
    tokens = np.asarray(drafts, dtype=np.int64)
    for k, x in enumerate(tokens.tolist()):
        p, q = float(target[k, x]), float(drafter[k, x])
        if q > 0.0 and (p >= q or source.bernoulli(p / q)):
            continue
        residual = np.maximum(target[k] - drafter[k], 0.0)
        if not residual.sum() > 0.0:  # p == q: rejection has probability 0
            residual = target[k]
        return k, source.categorical(residual)
    return len(tokens), source.categorical(target[len(tokens)])


__all__ = [
    "MAX_LOG_ODDS",
    "NumpySource",
    "RandomSource",
    "SamplingParams",
    "draft_features",
    "probabilities",
    "verify",
]
