"""Vocabulary-parallel drafters: per-shard statistics (:func:`partial_stats`, three numbers per
row instead of the shard's logits) and their combination into the unsharded feature
(:func:`combine_partials`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from av_core._native import InvalidTypeError, InvalidValueError
from av_core.features.checks import (
    MAX_LOG_ODDS,
    _check_logits,
    _check_max_log_odds,
    _check_row_valid,
    _check_temperature,
    _dense,
    _temperature_rows,
)
from av_core.features.stats import PartialStats, _scatter_rows, _stats_for_rows, _valid_rows
from av_core.features.triton_kernels import _triton_stats


def partial_stats(
    logits_shard: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
    *,
    row_valid: torch.Tensor | None = None,
) -> PartialStats:
    """Per-row ``(max, argmax, complement)`` of one vocabulary shard of the drafter's logits.

    A tensor-parallel drafter all-gathers these three numbers per row instead of its logits and
    calls :func:`combine_partials`, which gives the same feature as :func:`draft_log_odds` on the
    unsharded row. Padded rows, and shards with no finite entry in a row, give the empty partial
    ``(-inf, 0, 0)``, which combines as no mass.
    """
    logits_shard = _check_logits(logits_shard, "logits_shard")
    n = logits_shard.shape[0]
    device = logits_shard.device
    temp = _check_temperature(temperature, n, device)
    valid = _check_row_valid(row_valid, n, device)
    if n == 0:
        empty = torch.empty(0, dtype=torch.float32, device=device)
        return PartialStats(empty, torch.empty(0, dtype=torch.int64, device=device), empty)
    with torch.no_grad():
        kernel = _triton_stats(logits_shard, temp, valid, MAX_LOG_ODDS)
        if kernel is not None:
            return kernel[1]
        rows = _valid_rows(valid)
        if rows is not None and rows.numel() == 0:
            return PartialStats(
                torch.full((n,), -math.inf, device=device),
                torch.zeros(n, dtype=torch.int64, device=device),
                torch.zeros(n, device=device),
            )
        raw = _stats_for_rows(logits_shard, temp, rows)
        t = _temperature_rows(temp, n, device)
        t = t if rows is None else t[rows]
        scaled_max = (raw.max.to(torch.float64) / t).to(torch.float32)
        empty = raw.max == -math.inf
        return PartialStats(
            _scatter_rows(scaled_max, rows, n, -math.inf),
            _scatter_rows(raw.argmax.masked_fill(empty, 0), rows, n, 0),
            _scatter_rows(raw.complement.masked_fill(empty, 0.0), rows, n, 0.0),
        )


def combine_partials(
    partials: Sequence[PartialStats],
    *,
    max_log_odds: float = MAX_LOG_ODDS,
    row_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """The feature of the unsharded rows from every shard's :class:`PartialStats`.

    With ``M = max_s max_s`` and ``s*`` the first shard attaining it,
    ``complement = c_{s*} + sum over s != s* of exp(max_s - M) * (1 + c_s)``: the shard holding
    the left-out maximum contributes its complement, every other shard all of its mass (a tie in
    another shard counts, as in the unsharded row). ``x = -log(complement)``, clamped; NaN where
    ``M`` is not finite; 0 for rows marked False in ``row_valid``.
    """
    max_log_odds = _check_max_log_odds(max_log_odds)
    if isinstance(partials, PartialStats) or not isinstance(partials, Sequence):
        raise InvalidTypeError("partials must be a sequence of PartialStats, one per shard")
    if len(partials) == 0:
        raise InvalidValueError("partials must hold at least one shard, got 0")
    for i, part in enumerate(partials):
        if not isinstance(part, PartialStats):
            raise InvalidTypeError(
                f"partials[{i}] must be a PartialStats, got {type(part).__name__}"
            )
    fields: dict[str, list[torch.Tensor]] = {"max": [], "complement": []}
    n = device = None
    for i, part in enumerate(partials):
        for field, values in fields.items():
            value = getattr(part, field)
            where = f"partials[{i}].{field}"
            if not isinstance(value, torch.Tensor):
                raise InvalidTypeError(
                    f"{where} must be a torch.Tensor, got {type(value).__name__}"
                )
            if not value.dtype.is_floating_point:
                raise InvalidTypeError(f"{where} must be a float tensor, got dtype {value.dtype}")
            if value.dim() != 1:
                raise InvalidValueError(f"{where} must be 1-D, got shape {tuple(value.shape)}")
            if n is None:
                n, device = value.shape[0], value.device
            if value.shape[0] != n:
                raise InvalidValueError(f"{where} must have shape [{n}], got {tuple(value.shape)}")
            if value.device != device:
                raise InvalidValueError(f"{where} must be on {device}, got {value.device}")
            values.append(_dense(value.detach(), where).to(torch.float32))
    assert n is not None
    with torch.no_grad():
        maxima = torch.stack(fields["max"])
        comps = torch.stack(fields["complement"])
        top = maxima.amax(dim=0)
        first = maxima.argmax(dim=0)
        shards = torch.arange(len(partials), device=maxima.device)[:, None]
        gap = torch.where(maxima == -math.inf, -math.inf, maxima - top)
        mass = torch.exp(gap) * (1.0 + comps)
        complement = torch.where(shards == first, comps, mass).sum(dim=0)
        x = (-torch.log(complement)).clamp(min=-max_log_odds, max=max_log_odds)
        x = torch.where(torch.isfinite(top), x, torch.full_like(x, math.nan))
        valid = _check_row_valid(row_valid, n, x.device)
        if valid is not None:
            x = torch.where(valid, x, torch.zeros_like(x))
        return x
