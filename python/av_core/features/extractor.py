"""Persistent per-request slots: :class:`FeatureExtractor`, the feature buffer of a serving
engine in vLLM's layout (slot = request-state index, column = draft position).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from av_core._native import InvalidTypeError, InvalidValueError
from av_core.features.checks import (
    MAX_LOG_ODDS,
    _check_device,
    _check_integer_tensor,
    _check_logits,
    _check_max_log_odds,
    _dense,
    _per_row,
    _snapshot,
)
from av_core.features.host import to_host
from av_core.features.log_odds import draft_log_odds

#: The most feature slots a :class:`FeatureExtractor` holds, ``(max_num_reqs + 1) x
#: num_speculative_steps`` (256 MiB of float32): the bound the core's planner puts on its own
#: per-slot state, so that a size typed by mistake is refused before anything is allocated.
MAX_FEATURE_ENTRIES = 1 << 26


class FeatureExtractor:
    """Owns the feature buffer of a serving engine: ``features[slot, step]`` for a fixed
    ``max_num_reqs x num_speculative_steps``, in vLLM's persistent layout (slot = request-state
    index, column = draft position), plus a pinned host buffer for the hand-over.

    :meth:`write` turns one draft step's logits into features and scatters them into their slots.
    Padded rows (request index -1) are not computed and write nothing; they are routed to a spare
    row so the scatter needs no host synchronisation.
    """

    def __init__(
        self,
        max_num_reqs: int,
        num_speculative_steps: int,
        device: torch.device | str = "cpu",
        *,
        max_log_odds: float = MAX_LOG_ODDS,
    ) -> None:
        for name, value in (
            ("max_num_reqs", max_num_reqs),
            ("num_speculative_steps", num_speculative_steps),
        ):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise InvalidValueError(f"{name} must be >= 1, got {value}")
        # Checked before anything is allocated: the slots (and a host copy) would otherwise ask
        # for whatever the product is, and fail only after trying.
        entries = (int(max_num_reqs) + 1) * int(num_speculative_steps)
        if entries > MAX_FEATURE_ENTRIES:
            raise InvalidValueError(
                f"max_num_reqs x num_speculative_steps must stay within {MAX_FEATURE_ENTRIES} "
                f"feature slots (MAX_FEATURE_ENTRIES), got {max_num_reqs} x "
                f"{num_speculative_steps}"
            )
        self.max_num_reqs = int(max_num_reqs)
        self.num_speculative_steps = int(num_speculative_steps)
        self.device = _check_device(device)
        self.max_log_odds = _check_max_log_odds(max_log_odds)
        try:
            self._slots = torch.zeros(
                self.max_num_reqs + 1,
                self.num_speculative_steps,
                dtype=torch.float32,
                device=self.device,
            )
        except (RuntimeError, AssertionError) as error:  # an absent or exhausted device
            raise InvalidValueError(
                f"device: cannot hold the features on {self.device} ({error})"
            ) from None
        self.features = self._slots[: self.max_num_reqs]
        self._host: torch.Tensor | None = None
        if self.device.type != "cpu":
            self._host = torch.empty(
                self.max_num_reqs,
                self.num_speculative_steps,
                dtype=torch.float32,
                pin_memory=self.device.type == "cuda",
            )

    def _slot_index(self, idx_mapping: object, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot per row with padding sent to the spare row, validity per row)."""
        idx_mapping = _check_integer_tensor(idx_mapping, "idx_mapping")
        if idx_mapping.shape != (n,):
            raise InvalidValueError(
                f"idx_mapping must have shape [{n}] (one per logits row), got "
                f"{tuple(idx_mapping.shape)}"
            )
        idx_mapping = _snapshot(idx_mapping)
        if idx_mapping.device.type == "cpu" and n:
            low, high = int(idx_mapping.min()), int(idx_mapping.max())
            if low < -1 or high >= self.max_num_reqs:
                bad = low if low < -1 else high
                raise InvalidValueError(
                    f"idx_mapping entries must lie in [-1, {self.max_num_reqs}), got {bad}"
                )
        idx = idx_mapping.to(device=self.device, dtype=torch.int64)
        valid = (idx >= 0) & (idx < self.max_num_reqs)
        return torch.where(valid, idx, self.max_num_reqs), valid

    def _by_slot(self, value: Any, name: str, slot: torch.Tensor) -> Any:
        """A per-slot sampling parameter gathered per row (a number or 0-d tensor as is)."""
        if value is None or not isinstance(value, torch.Tensor) or value.dim() == 0:
            return value
        if value.shape != (self.max_num_reqs,):
            raise InvalidValueError(
                f"{name} must be a scalar or have shape [{self.max_num_reqs}] (one per request "
                f"slot), got {tuple(value.shape)}"
            )
        value = _dense(value.detach(), name).to(self.device)
        padded = torch.cat([value, value[:1]])
        return padded[slot]

    def _step_index(self, draft_step: object, n: int) -> torch.Tensor:
        k = self.num_speculative_steps
        if isinstance(draft_step, bool):
            raise InvalidTypeError("draft_step must be an int or an integer torch.Tensor, got bool")
        if isinstance(draft_step, numbers.Integral):
            draft_step = int(draft_step)
            if not 0 <= draft_step < k:
                raise InvalidValueError(f"draft_step must lie in [0, {k}), got {draft_step}")
            return torch.full((n,), draft_step, dtype=torch.int64, device=self.device)
        if not isinstance(draft_step, torch.Tensor):
            raise InvalidTypeError(
                f"draft_step must be an int or an integer torch.Tensor, got "
                f"{type(draft_step).__name__}"
            )
        draft_step = _snapshot(_check_integer_tensor(draft_step, "draft_step"))
        if draft_step.device.type == "cpu" and draft_step.numel():
            low, high = int(draft_step.min()), int(draft_step.max())
            if low < 0 or high >= k:
                raise InvalidValueError(
                    f"draft_step entries must lie in [0, {k}), got {low if low < 0 else high}"
                )
        return _per_row(draft_step, n, "draft_step", self.device).to(torch.int64)

    def write(
        self,
        logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        draft_step: int | torch.Tensor,
        temperature: float | torch.Tensor | None = None,
        *,
        top_k: int | torch.Tensor | None = None,
        top_p: float | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Compute one draft step's features and store them in ``features[slot, step]``.

        Args:
            logits: ``[N, V]`` drafter logits, one row per (request, draft position).
            idx_mapping: ``[N]`` request-state index per row, -1 for padding. On the host,
                entries outside ``[-1, max_num_reqs)`` raise; on a device they count as padding
                (checking them would synchronise).
            draft_step: the draft position of every row (int or 0-d tensor), or ``[N]`` per row;
                like ``idx_mapping``, a device entry outside ``[0, K)`` counts as padding.
            temperature, top_k, top_p: scalars, or ``[max_num_reqs]`` tensors indexed by
                request-state index (vLLM keeps sampling parameters in that layout); host
                tensors are checked on the slots this call uses (:func:`draft_log_odds`).

        Returns the ``[N]`` features in row order (0 on padded rows). A call that raises has
        written nothing.
        """
        logits = _check_logits(logits)
        n = logits.shape[0]
        slot, valid = self._slot_index(idx_mapping, n)
        step = self._step_index(draft_step, n)
        # A device step outside [0, K) (not checked: it would synchronise) counts as padding, as
        # an out-of-range request index does: not computed, written to the spare row.
        in_range = (step >= 0) & (step < self.num_speculative_steps)
        valid = valid & in_range
        slot = torch.where(valid, slot, self.max_num_reqs)
        step = step.clamp(0, self.num_speculative_steps - 1)
        x = draft_log_odds(
            logits.to(self.device),
            self._by_slot(temperature, "temperature", slot),
            top_k=self._by_slot(top_k, "top_k", slot),
            top_p=self._by_slot(top_p, "top_p", slot),
            max_log_odds=self.max_log_odds,
            row_valid=valid,
        )
        self._slots.index_put_((slot, step), x)
        return x

    def gather(self, idx_mapping: torch.Tensor) -> torch.Tensor:
        """``[R, K]`` features of the given request slots in batch order (zeros for -1)."""
        slot, valid = self._slot_index(idx_mapping, _length(idx_mapping, "idx_mapping"))
        rows = self._slots[slot]
        return torch.where(valid[:, None], rows, torch.zeros_like(rows))

    def to_host(self, idx_mapping: torch.Tensor | None = None) -> np.ndarray:
        """The features (all slots, or :meth:`gather` of ``idx_mapping``) as a host numpy array,
        staged through the extractor's pinned buffer: valid until the next call."""
        values = self.features if idx_mapping is None else self.gather(idx_mapping)
        return to_host(values, out=self._host)


def _length(value: object, name: str) -> int:
    if not isinstance(value, torch.Tensor):
        raise InvalidTypeError(
            f"{name} must be an integer torch.Tensor, got {type(value).__name__}"
        )
    if value.dim() != 1:
        raise InvalidValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
    return int(value.shape[0])
