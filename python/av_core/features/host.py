"""Hand-over to the host: numpy views of tensors for the Rust core to read without a copy,
staged through a pinned buffer when the tensor lives on an accelerator.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from av_core._native import InvalidTypeError, InvalidValueError
from av_core.features.checks import _dense


def to_host(features: torch.Tensor, out: torch.Tensor | None = None) -> np.ndarray:
    """A numpy view of ``features`` on the host, for the Rust core to read without a copy.

    A CPU tensor passes through as a view (``out`` is then ignored). An accelerator tensor is
    copied into ``out`` (a CPU tensor of the same dtype and trailing shape, with at least as many
    rows; allocated pinned when None) with a non-blocking copy and one event wait, so a pinned
    ``out`` reused across steps costs one DMA and no allocation. The view aliases ``out``: it is
    overwritten by the next call that reuses the buffer.
    """
    if not isinstance(features, torch.Tensor):
        raise InvalidTypeError(f"features must be a torch.Tensor, got {type(features).__name__}")
    features = _dense(features.detach(), "features")
    if features.device.type == "cpu":
        return _numpy_view(features, "features")
    if out is None:
        host = torch.empty(
            features.shape,
            dtype=features.dtype,
            pin_memory=features.device.type == "cuda",
        )
    else:
        host = _check_host_buffer(out, features)
    if features.device.type == "cuda":
        host.copy_(features, non_blocking=True)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(features.device))
        event.synchronize()
    else:
        host.copy_(features)
    return _numpy_view(host, "features")


def _check_host_buffer(out: object, features: torch.Tensor) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise InvalidTypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.device.type != "cpu":
        raise InvalidValueError(f"out must be a host (CPU) tensor, got device {out.device}")
    if out.dtype != features.dtype:
        raise InvalidTypeError(f"out must have dtype {features.dtype}, got {out.dtype}")
    if not out.is_contiguous():
        raise InvalidValueError("out must be contiguous")
    if out.is_neg() or out.is_conj() or out.layout != torch.strided:
        raise InvalidValueError(
            "out must be a plain dense tensor, not a negated or conjugated view"
        )
    if features.dim() == 0:
        if out.dim() != 0:
            raise InvalidValueError(f"out must have shape [], got {tuple(out.shape)}")
        return out
    if out.dim() != features.dim() or out.shape[1:] != features.shape[1:]:
        trailing = "".join(f", {size}" for size in features.shape[1:])
        raise InvalidValueError(
            f"out must have shape [>= {features.shape[0]}{trailing}], got {tuple(out.shape)}"
        )
    if out.shape[0] < features.shape[0]:
        raise InvalidValueError(
            f"out must have at least {features.shape[0]} rows, got shape {tuple(out.shape)}"
        )
    return out[: features.shape[0]]


def _numpy_view(tensor: torch.Tensor, name: str) -> np.ndarray:
    try:
        return tensor.resolve_conj().resolve_neg().numpy()
    except TypeError as error:
        raise InvalidTypeError(
            f"{name} has dtype {tensor.dtype}, which numpy cannot hold; convert it first"
        ) from error


def as_numpy(x: Any, argument_name: str) -> np.ndarray:
    """``x`` as a numpy array, without a copy where possible.

    numpy arrays pass through; CPU tensors become views; accelerator tensors go through
    :func:`to_host`. Anything else raises TypeError naming ``argument_name``.
    """
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, torch.Tensor):
        return to_host(x) if x.device.type != "cpu" else _numpy_view(x.detach(), argument_name)
    raise InvalidTypeError(
        f"{argument_name} must be a numpy array or a torch tensor, got {type(x).__name__}"
    )
