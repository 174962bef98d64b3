"""Staging of graded drafts to the host: a ring of (pinned, on CUDA) host buffers that the
estimator's :meth:`step` copies into without waiting, and the events that say when a copy landed.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

# Steps whose verdicts may be in flight to the host at once (CUDA). A full ring waits for the
# oldest copy, which was issued this many steps earlier and has long landed in practice.
_STAGING_DEPTH = 4


def _sync_allowed() -> contextlib.AbstractContextManager[Any]:
    """vLLM's ``gpu_sync_allowed()`` when running inside vLLM, so the rare deliberate wait on a
    staged copy is not reported by ``VLLM_GPU_SYNC_CHECK``; a no-op elsewhere."""
    if "vllm" in sys.modules:
        try:
            from vllm.utils.gpu_sync_debug import gpu_sync_allowed  # type: ignore[import-not-found]
        except Exception:  # noqa: BLE001 - any vLLM without the helper simply does not check
            return contextlib.nullcontext()
        return gpu_sync_allowed()  # type: ignore[no-any-return]
    return contextlib.nullcontext()


class _Event(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class _DoneEvent:
    """The event of a copy that was synchronous (host tensors): always complete."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


@dataclass
class _HostBuffers:
    """One ring entry: a host copy of every slot's features and predictions, and the step's
    per-row request index and counts. Pinned on CUDA so the copies are asynchronous DMAs."""

    slots: torch.Tensor  # [2, max_num_reqs + 1, K] float32: features, predictions
    vectors: dict[str, torch.Tensor] = field(default_factory=dict)

    def vector(self, name: str, like: torch.Tensor, capacity: int, pin: bool) -> torch.Tensor:
        held = self.vectors.get(name)
        if held is None or held.dtype != like.dtype:
            held = torch.empty(capacity, dtype=like.dtype, pin_memory=pin)
            self.vectors[name] = held
        return held


@dataclass
class _Staged:
    buffers: _HostBuffers
    rows: int
    has_skip: bool
    event: _Event
