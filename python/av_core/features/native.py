"""The CPU path: CPU float32 and bfloat16 logits go to the fused Rust kernel
(``_native.draft_log_odds_f32`` / ``_bf16``), one pass over memory instead of the torch path's
several. C-contiguous logits are read in place; any other layout (transposed, strided, a slice)
is copied into a C-contiguous block of rows at a time first, so that every layout gives the
bits of its contiguous copy (the torch path sums in another order).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from av_core import _native
from av_core.features.checks import _FLOAT32_MAX, _FLOAT32_TINY, _temperature_rows

# CPU float32 and bfloat16 logits go to the fused Rust kernel (`_native.draft_log_odds_f32` /
# `_bf16`): one pass over memory instead of the torch path's several. Tests switch it off to
# compare the two.
_NATIVE_CPU = True

# Logits in another layout than C-contiguous are copied this many bytes of rows at a time: the
# kernel is per row, so a block's rows give the same bits as in the whole tensor, and the copy
# stays cache-sized however large the batch.
_COPY_BLOCK_BYTES = 4 << 20


def _use_native(logits: torch.Tensor) -> bool:
    return (
        _NATIVE_CPU
        and logits.device.type == "cpu"
        and logits.dtype in (torch.float32, torch.bfloat16)
        and not logits.is_neg()
    )


def _native_log_odds(
    logits: torch.Tensor,
    temp: float | torch.Tensor,
    valid: torch.Tensor | None,
    max_log_odds: float,
) -> torch.Tensor:
    """The fused Rust kernel on CPU float32 or bfloat16 logits, read in place when C-contiguous
    (``Tensor.numpy`` is a view; bfloat16 goes through an int16 view of the same memory), else
    through C-contiguous copies of a block of rows at a time.

    The kernel takes ``1 / T`` per row: greedy rows are 1 and NaN stays NaN (as in
    _temperature_rows); it is kept within float32's positive normal range, so a temperature
    under ~3e-39 acts like that one and one above ~8e37 like that one.
    """
    n = logits.shape[0]
    inverse = (1.0 / _temperature_rows(temp, n, logits.device)).clamp(
        min=_FLOAT32_TINY, max=_FLOAT32_MAX
    )
    valid_np = None if valid is None else valid.contiguous().numpy()
    inverse_np = inverse.to(torch.float32).numpy()
    logits = logits.detach()
    if logits.is_contiguous():
        return torch.from_numpy(_kernel(logits, inverse_np, max_log_odds, valid_np))
    out = torch.empty(n, dtype=torch.float32)
    vocab = logits.shape[1]
    block = max(1, _COPY_BLOCK_BYTES // (vocab * logits.element_size()))
    for start in range(0, n, block):
        stop = min(start + block, n)
        out[start:stop] = torch.from_numpy(
            _kernel(
                logits[start:stop].contiguous(),
                inverse_np[start:stop],
                max_log_odds,
                None if valid_np is None else valid_np[start:stop],
            )
        )
    return out


def _kernel(
    logits: torch.Tensor,
    inverse: npt.NDArray[np.float32],
    max_log_odds: float,
    valid: npt.NDArray[np.bool_] | None,
) -> npt.NDArray[np.float32]:
    """The kernel on C-contiguous CPU logits."""
    if logits.dtype == torch.bfloat16:
        # numpy has no bfloat16: the kernel reads the bit patterns through an int16 view.
        bits = logits.view(torch.int16).numpy()
        return _native.draft_log_odds_bf16(bits, inverse, max_log_odds, valid)
    return _native.draft_log_odds_f32(logits.numpy(), inverse, max_log_odds, valid)
