"""Argument checks of the drop-ins: tensors as vLLM passes them (per-request buffers that may
be longer than the batch), each refusal naming the argument and the value.
"""

from __future__ import annotations

import numpy as np
import torch

from av_core._checks import _check_int
from av_core._native import InvalidTypeError, InvalidValueError
from av_core.features.checks import _check_integer_tensor, _dense, _snapshot


def _check_tensor(value: object, name: str) -> torch.Tensor:
    """A dense tensor argument, read as the values it stands for (a lazily negated view is
    resolved: the host copies below read memory)."""
    if not isinstance(value, torch.Tensor):
        raise InvalidTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return _dense(value, name)


def _check_int_tensor(value: object, name: str) -> torch.Tensor:
    """An integer tensor argument; a host one as a private copy, so that the entries checked
    are the entries used even if another thread writes the caller's tensor meanwhile."""
    return _snapshot(_check_integer_tensor(value, name))


def _check_output(value: torch.Tensor, name: str) -> torch.Tensor:
    """A tensor written in place: resolving a lazy view would write to a copy, so refuse it."""
    if value.is_neg() or value.is_conj() or value.layout != torch.strided:
        raise InvalidValueError(
            f"{name} is written in place: pass a plain tensor, not a negated view"
        )
    return value


def _check_vector(
    value: object, name: str, length: int, *, integer: bool = True, longer_ok: bool = False
) -> torch.Tensor:
    """A 1-D tensor of ``length`` entries; with ``longer_ok``, its first ``length`` entries of a
    longer one (vLLM's kernels read per-request buffers that may be padded past the batch)."""
    tensor = _check_int_tensor(value, name) if integer else _check_tensor(value, name)
    size = tensor.shape[0] if tensor.dim() == 1 else -1
    if size == length or (longer_ok and size > length):
        return tensor[:length]
    wanted = f">= {length}" if longer_ok else f"{length}"
    raise InvalidValueError(f"{name} must have shape [{wanted}], got shape {tuple(tensor.shape)}")


def _check_positive_int(value: object, name: str) -> int:
    return _check_int(value, name, 1)


def _check_count(value: object, name: str) -> int:
    """A non-negative int of any size (token counts), as a Python int."""
    return _check_int(value, name, 0)


def _check_setting(value: object, name: str, *, integer: bool = False) -> None:
    """An instance setting (vLLM lets a caller change them on a live instance): checked before a
    step changes anything, so a bad one is refused without advancing the schedule."""
    if integer:
        _check_positive_int(value, name)
        return
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InvalidTypeError(f"{name} must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        number = float("inf")
    if not (np.isfinite(number) and number >= 0.0):
        raise InvalidValueError(f"{name} must be finite and non-negative, got {value!r}")


def _check_range_on_host(tensor: torch.Tensor, name: str, low: int, high: int) -> None:
    """Entries in [low, high), checked only for host tensors: on a device it would synchronise."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return
    smallest, largest = int(tensor.min()), int(tensor.max())
    if smallest < low or largest >= high:
        bad = smallest if smallest < low else largest
        raise InvalidValueError(f"{name} entries must lie in [{low}, {high}), got {bad}")


def _check_confidences(value: torch.Tensor, rows: str, width: int) -> torch.Tensor:
    """``confidence_probs``: a 2-D float tensor of shape ``[rows, >= width]``."""
    if value.dim() != 2 or value.shape[1] < width:
        raise InvalidValueError(
            f"confidence_probs must have shape [{rows}, >= {width}], got shape {tuple(value.shape)}"
        )
    if not value.dtype.is_floating_point:
        raise InvalidTypeError(f"confidence_probs must be a float tensor, got dtype {value.dtype}")
    return value
