"""The feature: :func:`draft_log_odds`, ``logit(q_max)`` of each row of drafter logits, on
whichever path fits the logits (the Rust kernel, the Triton kernels or torch operations).
"""

from __future__ import annotations

import math

import torch

from av_core.features.checks import (
    MAX_LOG_ODDS,
    _check_logits,
    _check_max_log_odds,
    _check_row_valid,
    _check_temperature,
    _temperature_rows,
)
from av_core.features.native import _native_log_odds, _use_native
from av_core.features.stats import _log_odds_from_stats, _scatter_rows, _stats_for_rows, _valid_rows
from av_core.features.triton_kernels import _triton_stats
from av_core.features.truncation import _truncated_complement, _truncation_args


def draft_log_odds(
    logits: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
    *,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    max_log_odds: float = MAX_LOG_ODDS,
    row_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logit(q_max)`` of each row of drafter logits: float32 ``[N]`` on the logits' device.

    ``x = -log(sum over every entry but one occurrence of the maximum m of exp((z - m) / T))``,
    exact as ``q_max -> 1`` because ``1 - q_max`` is summed, never formed as ``total - 1``.

    Args:
        logits: ``[N, V]`` float32, bfloat16 or float16 (computed in float32), any strides; a
            lazily negated view (``x._neg_view()``) is read as the values it stands for.
        temperature: scalar or ``[N]`` tensor; ``<= 0`` is greedy and leaves the logits
            unscaled (vLLM's convention). ``None`` means 1. A scalar must be finite; a tensor
            row that is NaN or ``+inf`` gives a NaN feature (see below) instead of failing the
            whole batch.
        top_k: optional int or ``[N]`` tensor applied to q before taking q_max; ``<= 0`` or
            ``>= V`` disables it for a row, below -1 raises. Off by default, as in vLLM's
            estimator.
        top_p: optional float in (0, 1] or ``[N]`` tensor, applied after top-k on the
            renormalised distribution; ``>= 1`` disables it for a row; NaN or ``<= 0`` raises.
        max_log_odds: the symmetric clamp, 40 by default: a positive normal float32 (about
            1.2e-38 to 3.4e38), whatever the logits' dtype.
        row_valid: optional bool ``[N]``; rows marked False (padding) are not computed and give 0.

    Per-row ``top_k``/``top_p`` tensors are checked entry by entry only on the host, and only on
    rows ``row_valid`` keeps. On an accelerator the entries are not checked (that would wait for
    the device): there a ``top_k`` below -1 acts as no top-k, and a ``top_p`` that is NaN or
    ``<= 0`` keeps only the most likely token, so the row gives ``+max_log_odds``.

    A row with one finite entry gives ``+max_log_odds``. A valid row whose maximum is not finite
    (a NaN or ``+inf`` logit, or no finite entry), or whose temperature is NaN or ``+inf``, gives
    NaN, which the estimator rejects rather than learning from.
    """
    logits = _check_logits(logits)
    max_log_odds = _check_max_log_odds(max_log_odds)
    n, vocab = logits.shape
    device = logits.device
    temp = _check_temperature(temperature, n, device)
    valid = _check_row_valid(row_valid, n, device)
    k_rows, p_rows = _truncation_args(top_k, top_p, n, vocab, device, valid)
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=device)
    with torch.no_grad():
        if k_rows is None and p_rows is None:
            return _draft_log_odds_untruncated(logits, temp, valid, max_log_odds)
        truncated = torch.zeros(n, dtype=torch.bool, device=device)
        if k_rows is not None:
            truncated |= k_rows < vocab
        if p_rows is not None:
            truncated |= p_rows < 1.0
        plain = ~truncated if valid is None else valid & ~truncated
        out = _draft_log_odds_untruncated(logits, temp, plain, max_log_odds)
        rows = torch.nonzero(truncated if valid is None else truncated & valid).squeeze(1)
        if rows.numel():
            k_sel = k_rows[rows] if k_rows is not None else None
            p_sel = p_rows[rows] if p_rows is not None else None
            t_rows = _temperature_rows(temp, n, device)
            row_max, complement = _truncated_complement(logits, t_rows, rows, k_sel, p_sel)
            x = (-torch.log(complement)).clamp(min=-max_log_odds, max=max_log_odds)
            out[rows] = torch.where(torch.isfinite(row_max), x, torch.full_like(x, math.nan))
        return out


def _draft_log_odds_untruncated(
    logits: torch.Tensor,
    temp: float | torch.Tensor,
    valid: torch.Tensor | None,
    max_log_odds: float,
) -> torch.Tensor:
    n = logits.shape[0]
    if _use_native(logits):
        return _native_log_odds(logits, temp, valid, max_log_odds)
    kernel = _triton_stats(logits, temp, valid, max_log_odds)
    if kernel is not None:
        return kernel[0]
    rows = _valid_rows(valid)
    if rows is not None and rows.numel() == 0:
        return torch.zeros(n, dtype=torch.float32, device=logits.device)
    stats = _stats_for_rows(logits, temp, rows)
    return _scatter_rows(_log_odds_from_stats(stats, max_log_odds), rows, n, 0.0)
