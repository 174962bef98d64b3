"""Top-k and top-p: the arguments' checks, and the complement of the truncated distribution
(vLLM's rule: top-k first, then the smallest prefix holding at least p of what it kept).
"""

from __future__ import annotations

import numbers

import torch

from av_core._native import InvalidTypeError, InvalidValueError
from av_core.features.checks import (
    _check_integer_tensor,
    _first_bad_row,
    _per_row,
    _real,
    _snapshot,
)

_TRUNCATED_BLOCK_BYTES = 32 << 20


def _truncation_args(
    top_k: int | torch.Tensor | None,
    top_p: float | torch.Tensor | None,
    n: int,
    vocab: int,
    device: torch.device,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-row k (vocab where off) and p (1 where off), or None when the argument is absent.

    Host tensors are checked like the scalars on the rows that ``valid`` keeps (a padded row's
    value is never used): a top-k below -1, a top-p that is NaN or <= 0 raise. Device tensors are
    not checked (it would synchronise); see :func:`draft_log_odds` for what such entries do.
    """
    k_rows = p_rows = None
    if top_k is not None:
        if isinstance(top_k, bool):
            raise InvalidTypeError("top_k must be an int or an integer torch.Tensor, got bool")
        if isinstance(top_k, numbers.Integral):
            top_k = int(top_k)
            if top_k < -1:
                raise InvalidValueError(f"top_k must be >= 1, or 0 or -1 for no top-k, got {top_k}")
            # Anything above the vocabulary is no top-k: the same row, and it fits int64.
            k_rows = torch.full((n,), min(top_k, vocab), dtype=torch.int64, device=device)
        else:
            if isinstance(top_k, torch.Tensor):
                top_k = _check_integer_tensor(top_k, "top_k")
            k_rows = _snapshot(_per_row(top_k, n, "top_k", device).to(torch.int64))
            if k_rows.device.type == "cpu":
                row = _first_bad_row(k_rows < -1, valid)
                if row is not None:
                    raise InvalidValueError(
                        f"top_k[{row}] must be >= 1, or 0 or -1 for no top-k, got "
                        f"{int(k_rows[row])}"
                    )
        k_rows = torch.where((k_rows <= 0) | (k_rows > vocab), vocab, k_rows)
    if top_p is not None:
        if isinstance(top_p, bool):
            raise InvalidTypeError("top_p must be a float or a torch.Tensor, got bool")
        if isinstance(top_p, numbers.Real):
            value = _real(top_p, "top_p")
            if not 0.0 < value <= 1.0:
                raise InvalidValueError(f"top_p must lie in (0, 1], got {top_p!r}")
            p_rows = torch.full((n,), value, dtype=torch.float64, device=device)
        else:
            p_rows = _snapshot(_per_row(top_p, n, "top_p", device).to(torch.float64))
            if p_rows.device.type == "cpu":
                row = _first_bad_row(~(p_rows > 0.0), valid)
                if row is not None:
                    raise InvalidValueError(
                        f"top_p[{row}] must lie in (0, 1] (>= 1 is no top-p), got "
                        f"{float(p_rows[row])!r}"
                    )
            p_rows = torch.where(p_rows >= 1.0, torch.ones_like(p_rows), p_rows)
    return k_rows, p_rows


def _truncated_complement(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    rows: torch.Tensor,
    k_rows: torch.Tensor | None,
    p_rows: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row max, complement) after top-k then top-p, for the given rows.

    The row's scaled logits are sorted in descending order; top-k keeps the first k, and top-p,
    on the renormalised top-k distribution, keeps position j while the mass before it is below
    p (vLLM's rule: the smallest prefix holding at least p, and never fewer than one token).
    Position 0 is one occurrence of the maximum; the complement is the kept mass after it. The
    cumulative mass used for the cut is float64 so the cut does not move with summation order.
    """
    vocab = logits.shape[1]
    device = logits.device
    n = rows.numel()
    row_max = torch.empty(n, dtype=torch.float32, device=device)
    complement = torch.empty(n, dtype=torch.float32, device=device)
    positions = torch.arange(vocab, device=device)
    block = max(1, _TRUNCATED_BLOCK_BYTES // (32 * vocab))
    for start in range(0, n, block):
        index = rows[start : start + block]
        z = logits.index_select(0, index).to(torch.float32)
        top = z.amax(dim=1, keepdim=True)
        y = (z - top).div_(temperature[index].to(torch.float32)[:, None])
        k = k_rows[start : start + block] if k_rows is not None else None
        k_max = int(k.max()) if k is not None else vocab
        if p_rows is None and k_max < vocab:
            ordered = torch.topk(y, k_max, dim=1, sorted=True).values
        else:
            ordered = torch.sort(y, dim=1, descending=True).values
        terms = ordered.exp_()
        width = terms.shape[1]
        keep = torch.ones_like(terms, dtype=torch.bool)
        if k is not None:
            keep &= positions[:width] < k[:, None]
        if p_rows is not None:
            p = p_rows[start : start + block]
            kept = torch.where(keep, terms, 0.0).to(torch.float64)
            total = kept.sum(dim=1, keepdim=True)
            before = kept.cumsum(dim=1) - kept
            keep &= before < p[:, None] * total
        keep[:, 0] = False
        complement[start : start + block] = torch.where(keep, terms, 0.0).sum(dim=1)
        row_max[start : start + block] = top.squeeze(1)
    return row_max, complement
