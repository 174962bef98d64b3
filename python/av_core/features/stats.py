"""Row statistics on the torch path: the row maximum, the column left out, and the sum over
every other column (``1 - q_max`` up to normalisation), one cache-sized block of rows at a time.

The path every device and dtype can take: the fused kernels (:mod:`av_core.features.native` on
the CPU, :mod:`av_core.features.triton_kernels` on CUDA) compute the same statistics faster where
they apply, and fall back to it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from av_core.features.checks import _exp2_scale, _temperature_rows

_LN2 = math.log(2.0)
# exp2 below -126 leaves float32's normal range, where the CPU kernel takes a slow path; an entry
# that far below the row maximum adds at most 2**-126 per entry, far under the clamp at e**-40.
_EXP2_FLOOR = -126.0
# Row blocks are sized so that the float32 working copy of a block stays in the last-level cache
# on a CPU, and bounded on an accelerator: the only [rows, V] temporary is one block.
_CPU_BLOCK_BYTES = 4 << 20
_DEVICE_BLOCK_BYTES = 256 << 20


class PartialStats(NamedTuple):
    """Per-row statistics of one vocabulary shard, enough to rebuild the unsharded feature.

    ``max`` is the shard's largest scaled logit ``max(z / T)`` (``-inf`` for a shard with no finite
    entry or a padded row), ``argmax`` the shard-local column of the occurrence left out of
    ``complement``, and ``complement = sum over the shard except that occurrence of
    exp(z / T - max)``. Three numbers per row instead of ``V / shards`` logits.
    """

    max: torch.Tensor
    argmax: torch.Tensor
    complement: torch.Tensor


class _RowStats(NamedTuple):
    max: torch.Tensor  # raw (unscaled) row maximum, float32
    argmax: torch.Tensor  # column left out of complement, int64
    complement: torch.Tensor  # sum of exp2((z - max) * scale) over the other columns, float32
    excluded: torch.Tensor  # (z[argmax] - max) * scale, float32 (0 when argmax is the maximum)


def _segmentation(vocab: int) -> tuple[int, int]:
    """(segment length, number of full segments): the divisor of vocab nearest 2048 in
    [1024, 4096], else 2048 with a shorter tail segment.

    Per-segment maxima locate the row maximum to one segment at no extra cost over a plain
    row maximum; finding its column with torch.argmax over the row costs several times more.
    """
    if vocab <= 4096:
        return vocab, 1
    divisors = [d for d in range(1024, 4097) if vocab % d == 0]
    length = min(divisors, key=lambda d: abs(d - 2048)) if divisors else 2048
    return length, vocab // length


def _block_rows(vocab: int, budget: int) -> int:
    return max(1, budget // (4 * vocab))


def _stats_torch(
    logits: torch.Tensor,
    scale: torch.Tensor,
    rows: torch.Tensor | None,
    exclude: torch.Tensor | None,
) -> _RowStats:
    """Row statistics with plain torch operations, one cache-sized block of rows at a time.

    Per block: per-segment maxima (the only pass over the logits in memory), then
    ``exp2((z - m) * scale)`` on a float32 working copy and per-segment sums. Afterwards one
    segment per row is re-read to leave out exactly one column: the first occurrence of the
    maximum, or ``exclude``. The other segments' sums are exact sums of positive terms, so the
    complement keeps full relative precision however small it is.
    """
    device = logits.device
    vocab = logits.shape[1]
    n = logits.shape[0] if rows is None else rows.numel()
    seg_len, n_full = _segmentation(vocab)
    split = seg_len * n_full
    n_seg = n_full + (1 if split < vocab else 0)
    seg_max = torch.empty(n, n_seg, dtype=torch.float32, device=device)
    seg_sum = torch.empty(n, n_seg, dtype=torch.float32, device=device)
    budget = _CPU_BLOCK_BYTES if device.type == "cpu" else _DEVICE_BLOCK_BYTES
    block = min(_block_rows(vocab, budget), max(n, 1))
    work_buffer = torch.empty(block, vocab, dtype=torch.float32, device=device)
    for start in range(0, n, block):
        stop = min(start + block, n)
        b = stop - start
        work = work_buffer[:b]
        if rows is None:
            src = logits[start:stop]
        elif logits.dtype == torch.float32:
            src = torch.index_select(logits, 0, rows[start:stop], out=work)
        else:
            src = logits.index_select(0, rows[start:stop])
        if src.dtype != torch.float32 or src.stride(-1) != 1:
            work.copy_(src)
            src = work
        seg_max[start:stop, :n_full] = src[:, :split].view(b, n_full, seg_len).amax(dim=2)
        if n_seg > n_full:
            seg_max[start:stop, n_full] = src[:, split:].amax(dim=1)
        row_max = seg_max[start:stop].amax(dim=1, keepdim=True)
        torch.sub(src, row_max, out=work)
        work.mul_(scale[start:stop, None]).clamp_(min=_EXP2_FLOOR).exp2_()
        seg_sum[start:stop, :n_full] = work[:, :split].view(b, n_full, seg_len).sum(dim=2)
        if n_seg > n_full:
            seg_sum[start:stop, n_full] = work[:, split:].sum(dim=1)
    del work_buffer

    row_max = seg_max.amax(dim=1)
    if exclude is None:
        seg_star = seg_max.argmax(dim=1)
    else:
        seg_star = torch.div(exclude, seg_len, rounding_mode="floor")
    values = _segment_values(logits, rows, seg_star, seg_len, n_full).to(torch.float32)
    exponent = (values - row_max[:, None]).mul_(scale[:, None])
    local = exponent.argmax(dim=1) if exclude is None else exclude - seg_star * seg_len
    excluded = exponent.gather(1, local[:, None]).squeeze(1)
    terms = exponent.clamp_(min=_EXP2_FLOOR).exp2_().scatter_(1, local[:, None], 0.0)
    seg_sum.scatter_(1, seg_star[:, None], terms.sum(dim=1, keepdim=True))
    return _RowStats(row_max, seg_star * seg_len + local, seg_sum.sum(dim=1), excluded)


def _segment_values(
    logits: torch.Tensor,
    rows: torch.Tensor | None,
    seg_star: torch.Tensor,
    seg_len: int,
    n_full: int,
) -> torch.Tensor:
    """``[n, seg_len]`` logits of segment ``seg_star`` of each row, -inf past the vocabulary."""
    vocab = logits.shape[1]
    split = seg_len * n_full
    row_ids = torch.arange(logits.shape[0], device=logits.device) if rows is None else rows
    if logits.stride(-1) != 1:
        cols = (seg_star[:, None] * seg_len + torch.arange(seg_len, device=logits.device)).clamp(
            max=vocab - 1
        )
        values = logits[row_ids[:, None], cols]
    else:
        segments = logits[:, :split].view(logits.shape[0], n_full, seg_len)
        values = segments[row_ids, seg_star.clamp(max=n_full - 1)]
    if split < vocab:
        tail = torch.full_like(values, -math.inf)
        tail[:, : vocab - split] = logits[row_ids, split:]
        values = torch.where((seg_star == n_full)[:, None], tail, values)
    return values


def _log_odds_from_stats(stats: _RowStats, max_log_odds: float) -> torch.Tensor:
    """x = excluded * ln 2 - ln(complement), clamped; NaN where the row maximum is not finite
    (a NaN or +inf logit, or no finite entry), since such a row has no distribution."""
    x = stats.excluded * _LN2 - torch.log(stats.complement)
    x = x.clamp(min=-max_log_odds, max=max_log_odds)
    return torch.where(torch.isfinite(stats.max), x, torch.full_like(x, math.nan))


def _valid_rows(row_valid: torch.Tensor | None) -> torch.Tensor | None:
    if row_valid is None:
        return None
    return torch.nonzero(row_valid).squeeze(1)


def _scatter_rows(
    values: torch.Tensor, rows: torch.Tensor | None, n: int, fill: float
) -> torch.Tensor:
    if rows is None:
        return values
    out = torch.full((n,), fill, dtype=values.dtype, device=values.device)
    out[rows] = values
    return out


def _stats_for_rows(
    logits: torch.Tensor,
    temperature: float | torch.Tensor,
    rows: torch.Tensor | None,
    exclude: torch.Tensor | None = None,
) -> _RowStats:
    t = _temperature_rows(temperature, logits.shape[0], logits.device)
    return _stats_torch(logits, _exp2_scale(t if rows is None else t[rows]), rows, exclude)
