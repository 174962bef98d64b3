"""Argument checks shared by every feature function, and the temperature's normal form.

Each check names the argument and the value it refuses (``TypeError`` for a wrong type or dtype,
``ValueError`` for a wrong shape or range) and returns the argument in the form the kernels read:
dense, lazy negation and conjugation resolved, host tensors as private snapshots (what was checked
is what is used, even if another thread writes the caller's tensor meanwhile).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from av_core import _native
from av_core._native import InvalidTypeError, InvalidValueError

#: The core's log-odds clamp (vLLM's `_MAX_LOG_ODDS`, the estimator's default ``max_log_odds``):
#: |x| beyond 40 means q_max within e**-40 of 0 or 1, which no drafter resolves and no acceptance
#: rate distinguishes.
MAX_LOG_ODDS = _native.MAX_LOG_ODDS

_LOG2E = 1.0 / math.log(2.0)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)
_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# torch's unsigned types wider than 8 bits have "limited support": min/max and comparisons are
# missing on CPU, so an argument of those dtypes is refused up front rather than failing inside.
_LIMITED_INTEGER_DTYPES = tuple(
    getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)
)


def _dense(value: torch.Tensor, name: str) -> torch.Tensor:
    """``value`` with torch's lazy negation and conjugation applied, and a strided layout.

    A tensor with the negative bit set (``x._neg_view()``, the imaginary part of a conjugated
    tensor) stores ``-x`` and negates on read; a dtype-converting ``copy_`` and a kernel that
    reads memory (numpy, Triton, the Rust kernel) would see ``-x``. Resolving costs a copy only
    when a bit is set.
    """
    if value.layout != torch.strided:
        raise InvalidTypeError(
            f"{name} must be a dense (strided) tensor, got layout {value.layout}"
        )
    if value.is_neg() or value.is_conj():
        value = value.resolve_conj().resolve_neg()
    return value


def _check_logits(logits: object, name: str = "logits") -> torch.Tensor:
    if not isinstance(logits, torch.Tensor):
        raise InvalidTypeError(f"{name} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in _LOGIT_DTYPES:
        raise InvalidTypeError(
            f"{name} must be float32, bfloat16 or float16, got dtype {logits.dtype}"
        )
    if logits.dim() != 2:
        raise InvalidValueError(f"{name} must have shape [N, V], got shape {tuple(logits.shape)}")
    if logits.shape[1] == 0:
        raise InvalidValueError(
            f"{name} must have at least one vocabulary column, got shape [N, 0]"
        )
    return _dense(logits.detach(), name)


def _check_device(device: object) -> torch.device:
    if not isinstance(device, str | torch.device):
        raise InvalidTypeError(
            f"device must be a str or a torch.device, got {type(device).__name__}"
        )
    try:
        return torch.device(device)
    except (RuntimeError, ValueError) as error:
        raise InvalidValueError(
            f"device must name a torch device, got {device!r} ({error})"
        ) from None


def _check_integer_tensor(value: object, name: str) -> torch.Tensor:
    """An integer tensor argument (int8..int64 or uint8), dense, negation resolved."""
    if not isinstance(value, torch.Tensor):
        raise InvalidTypeError(
            f"{name} must be an integer torch.Tensor, got {type(value).__name__}"
        )
    if value.dtype.is_floating_point or value.dtype == torch.bool or value.is_complex():
        raise InvalidTypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if value.dtype in _LIMITED_INTEGER_DTYPES:
        raise InvalidTypeError(
            f"{name} must be int8, int16, int32, int64 or uint8, got dtype {value.dtype} "
            "(which torch supports only in part)"
        )
    return _dense(value.detach(), name)


#: The clamp of every feature is float32, so ``max_log_odds`` must be a positive normal float32:
#: the same bound on every dtype and path (the Rust kernel takes it as float32 too).
_MAX_LOG_ODDS_RANGE = (_FLOAT32_TINY, _FLOAT32_MAX)


def _check_max_log_odds(max_log_odds: float) -> float:
    if isinstance(max_log_odds, bool) or not isinstance(max_log_odds, numbers.Real):
        raise InvalidTypeError(f"max_log_odds must be a number, got {type(max_log_odds).__name__}")
    try:
        value = float(max_log_odds)
    except OverflowError:
        value = math.inf
    low, high = _MAX_LOG_ODDS_RANGE
    if not (math.isfinite(value) and value > 0.0):
        raise InvalidValueError(f"max_log_odds must be finite and positive, got {max_log_odds!r}")
    if not low <= value <= high:
        raise InvalidValueError(
            f"max_log_odds must lie in float32's normal range [{low:.4g}, {high:.4g}] (the "
            f"features are float32), got {max_log_odds!r}"
        )
    return value


def _per_row(value: object, n: int, name: str, device: torch.device) -> torch.Tensor:
    """A per-row tensor argument as a 1-D tensor of length n on device (a 0-d one is broadcast)."""
    if not isinstance(value, torch.Tensor):
        raise InvalidTypeError(
            f"{name} must be a number or a torch.Tensor, got {type(value).__name__}"
        )
    if value.dtype == torch.bool or value.is_complex():
        raise InvalidTypeError(f"{name} must be a real-valued tensor, got dtype {value.dtype}")
    if value.dtype in _LIMITED_INTEGER_DTYPES:
        raise InvalidTypeError(
            f"{name} must not have dtype {value.dtype} (torch supports it only in part)"
        )
    value = _dense(value.detach(), name)
    if value.dim() == 0:
        return value.to(device).expand(n)
    if value.dim() != 1 or value.shape[0] != n:
        raise InvalidValueError(
            f"{name} must be a scalar or have shape [{n}] (one per row), got shape "
            f"{tuple(value.shape)}"
        )
    return value.to(device)


def _first_bad_row(bad: torch.Tensor, valid: torch.Tensor | None) -> int | None:
    """The first row flagged in ``bad`` among the valid ones (host tensors only), else None."""
    if valid is not None:
        bad = bad & valid
    rows = torch.nonzero(bad)
    return int(rows[0, 0]) if rows.numel() else None


def _real(value: numbers.Real, name: str) -> float:
    try:
        return float(value)
    except OverflowError:
        raise InvalidValueError(f"{name} must be finite, got {value!r}") from None


def _check_temperature(
    temperature: float | torch.Tensor | None, n: int, device: torch.device
) -> float | torch.Tensor:
    """A validated temperature: a float with greedy (<= 0) and None read as 1, or a per-row
    tensor on device, left as given (greedy rows are resolved where it is used; a NaN or
    ``+inf`` row gives a NaN feature, see :func:`draft_log_odds`)."""
    if temperature is None:
        return 1.0
    if isinstance(temperature, bool):
        raise InvalidTypeError("temperature must be a number or a torch.Tensor, got bool")
    if isinstance(temperature, numbers.Real):
        value = _real(temperature, "temperature")
        if not math.isfinite(value):
            raise InvalidValueError(f"temperature must be finite, got {temperature!r}")
        return value if value > 0.0 else 1.0
    return _per_row(temperature, n, "temperature", device)


def _temperature_rows(
    temperature: float | torch.Tensor, n: int, device: torch.device
) -> torch.Tensor:
    """Per-row float64 temperature: greedy rows (T <= 0) at 1, NaN and +inf as NaN."""
    if isinstance(temperature, float):
        return torch.full((n,), temperature, dtype=torch.float64, device=device)
    t = temperature.to(torch.float64)
    t = torch.where(t <= 0.0, torch.ones_like(t), t)
    return torch.where(t == math.inf, torch.full_like(t, math.nan), t)


def _exp2_scale(temperature: torch.Tensor) -> torch.Tensor:
    """log2(e) / T as float32, so that exp((z - m) / T) = exp2((z - m) * scale).

    Clamped to float32's largest finite value: a temperature under ~4e-39 then behaves like that
    one instead of producing 0 * inf = NaN at the maximum.
    """
    return (_LOG2E / temperature).clamp(max=_FLOAT32_MAX).to(torch.float32)


def _check_row_valid(row_valid: object, n: int, device: torch.device) -> torch.Tensor | None:
    if row_valid is None:
        return None
    if not isinstance(row_valid, torch.Tensor):
        raise InvalidTypeError(
            f"row_valid must be a bool torch.Tensor or None, got {type(row_valid).__name__}"
        )
    if row_valid.dtype != torch.bool:
        raise InvalidTypeError(f"row_valid must have dtype torch.bool, got {row_valid.dtype}")
    if row_valid.shape != (n,):
        raise InvalidValueError(
            f"row_valid must have shape [{n}], got shape {tuple(row_valid.shape)}"
        )
    # Contiguous: the Triton kernels and the Rust kernel index it as a flat array.
    return _dense(row_valid.detach(), "row_valid").to(device).contiguous()


def _check_tokens(tokens: object, n: int, vocab: int, device: torch.device) -> torch.Tensor:
    tokens = _check_integer_tensor(tokens, "tokens")
    if tokens.shape != (n,):
        raise InvalidValueError(f"tokens must have shape [{n}], got shape {tuple(tokens.shape)}")
    tokens = _snapshot(tokens)
    if n:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise InvalidValueError(f"tokens must lie in [0, {vocab}), got {bad}")
    return tokens.to(device=device, dtype=torch.int64)


def _snapshot(value: torch.Tensor) -> torch.Tensor:
    """A private copy of a host tensor that is checked and then used: what was validated must be
    what is used, even if another thread writes the caller's tensor in between (a device tensor
    is not read on the host, so it is used as given)."""
    return value.clone() if value.device.type == "cpu" else value
