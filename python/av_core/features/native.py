"""The CPU path: CPU float32 and bfloat16 C-contiguous logits go to the fused Rust kernel
(``_native.draft_log_odds_f32`` / ``_bf16``), one pass over memory instead of the torch path's
several.
"""

from __future__ import annotations

import torch

from av_core import _native
from av_core.features.checks import _FLOAT32_MAX, _FLOAT32_TINY, _temperature_rows

# CPU float32 and bfloat16 C-contiguous logits go to the fused Rust kernel
# (`_native.draft_log_odds_f32` / `_bf16`): one pass over memory instead of the torch path's
# several. Tests switch it off to compare the two.
_NATIVE_CPU = True


def _use_native(logits: torch.Tensor) -> bool:
    return (
        _NATIVE_CPU
        and logits.device.type == "cpu"
        and logits.dtype in (torch.float32, torch.bfloat16)
        and logits.is_contiguous()
        and not logits.is_neg()
    )


def _native_log_odds(
    logits: torch.Tensor,
    temp: float | torch.Tensor,
    valid: torch.Tensor | None,
    max_log_odds: float,
) -> torch.Tensor:
    """The fused Rust kernel on CPU float32 or bfloat16 logits, read in place (``Tensor.numpy``
    is a view; bfloat16 goes through an int16 view of the same memory).

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
    if logits.dtype == torch.bfloat16:
        # numpy has no bfloat16: the kernel reads the bit patterns through an int16 view.
        bits = logits.detach().view(torch.int16).numpy()
        out = _native.draft_log_odds_bf16(bits, inverse_np, max_log_odds, valid_np)
    else:
        values = logits.detach().numpy()
        out = _native.draft_log_odds_f32(values, inverse_np, max_log_odds, valid_np)
    return torch.from_numpy(out)
