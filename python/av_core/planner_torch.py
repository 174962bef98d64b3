"""The draft assignment on tensors that already live on a GPU, without a host sync.

:func:`assign_draft_budget_torch` gives the same counts as :func:`av_core.assign_draft_budget`:
the ``budget`` highest survivals ``S[r, k] = p[r, 0]·…·p[r, k]`` among the scheduled slots,
ties to the shallower position and then the lower request, so each request gets a prefix.

Two details make the counts match the Rust ones bit for bit rather than approximately:

* Survivals are multiplied left to right in float64, one column at a time. ``torch.cumprod``
  on CUDA is a parallel scan that associates the products differently, and a last-bit
  difference can reorder two near-equal survivals.
* The tie order comes from a *stable* descending sort of the slots laid out depth-major
  (index ``k·R + r``), instead of ``topk``, whose tie order is unspecified.

Every step is a tensor operation on the input's device; ``budget`` may be a Python int or a
0-d tensor on that device (for example computed on the GPU), so nothing waits for the host.

Values are checked as the Rust functions check them only where that costs no device sync, that
is on host (CPU) tensors: every confidence a probability in ``[0, 1]`` (NaN refused), every
``scheduled_drafts[r]`` in ``[0, K]``, a tensor ``budget`` non-negative. On an accelerator these
entries are not read back, so they are not checked: a NaN confidence makes its request's
survivals NaN from that position on, which the sort places first (those slots are admitted
before any other), a confidence outside ``[0, 1]`` is ranked as the number it is, a negative
``scheduled_drafts[r]`` schedules nothing and one above ``K`` is ``K``, a negative tensor
``budget`` admits nothing. Validate on the host (or with the Rust functions) where such values
can occur. Shapes and dtypes are checked everywhere.
"""

from __future__ import annotations

import numbers

import torch

from av_core._native import InvalidTypeError, InvalidValueError
from av_core.features.checks import _LIMITED_INTEGER_DTYPES, _dense

__all__ = ["assign_draft_budget_torch", "survivals_torch"]


def _check_integers(value: object, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidTypeError(f"{name}: expected an integer tensor, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise InvalidTypeError(f"{name}: expected integers, got {value.dtype}")
    if value.dtype in _LIMITED_INTEGER_DTYPES:
        raise InvalidTypeError(f"{name}: expected int8..int64 or uint8, got {value.dtype}")
    return _dense(value.detach(), name)


def _check_confidences(confidences: object) -> torch.Tensor:
    if not isinstance(confidences, torch.Tensor):
        raise InvalidTypeError(
            f"confidences: expected a torch.Tensor, got {type(confidences).__name__}"
        )
    if confidences.dim() != 2:
        raise InvalidValueError(
            f"confidences: expected [R, K], got shape {tuple(confidences.shape)}"
        )
    if not confidences.is_floating_point():
        raise InvalidTypeError(f"confidences: expected a float tensor, got {confidences.dtype}")
    p = _dense(confidences.detach(), "confidences")
    if p.device.type == "cpu":
        # A private float64 copy: what is checked is what is used, whatever another thread
        # writes into the caller's tensor meanwhile.
        p = p.to(torch.float64, copy=True)
    if p.device.type == "cpu" and p.numel():
        bad = torch.nonzero(~((p >= 0.0) & (p <= 1.0)))
        if bad.numel():
            r, k = (int(i) for i in bad[0])
            raise InvalidValueError(
                f"confidences: [{r}, {k}] = {float(p[r, k])!r} is not a probability in [0, 1]"
            )
    return p


def survivals_torch(confidences: torch.Tensor) -> torch.Tensor:
    """``S[r, k] = p[r, 0]·…·p[r, k]`` in float64, multiplied left to right as the Rust core
    does (and vLLM's host ``cumprod``). Host confidences must be probabilities (module docs)."""
    p = _check_confidences(confidences).to(torch.float64)
    out = torch.empty_like(p)
    running = torch.ones(p.shape[0], dtype=torch.float64, device=p.device)
    for k in range(p.shape[1]):
        running = running * p[:, k]
        out[:, k] = running
    return out


def _check_budget(budget: object, slots: int, device: torch.device) -> int | torch.Tensor:
    """A Python budget capped at the number of slots (more admits the same), or a 0-d integer
    tensor on ``device`` (checked on the host only)."""
    if isinstance(budget, bool):
        raise InvalidTypeError("budget: expected an int or a 0-d integer tensor, got bool")
    if isinstance(budget, numbers.Integral):
        if budget < 0:
            raise InvalidValueError(f"budget: must be non-negative, got {budget}")
        return min(int(budget), slots)
    if not isinstance(budget, torch.Tensor):
        raise InvalidTypeError(
            f"budget: expected an int or a 0-d integer tensor, got {type(budget).__name__}"
        )
    tensor = _check_integers(budget, "budget")
    if tensor.dim() != 0:
        raise InvalidValueError(f"budget: expected a 0-d tensor, got shape {tuple(tensor.shape)}")
    if tensor.device.type == "cpu":
        value = int(tensor)  # read once: the value checked is the value used
        if value < 0:
            raise InvalidValueError(f"budget: must be non-negative, got {value}")
        return min(value, slots)
    return tensor.to(device)


def assign_draft_budget_torch(
    confidences: torch.Tensor,
    scheduled_drafts: torch.Tensor,
    budget: int | torch.Tensor,
) -> torch.Tensor:
    """Admitted drafts per request, int32 ``[R]`` on ``confidences``' device.

    Same rule and same counts as :func:`av_core.assign_draft_budget`: a prefix of each
    request, at most ``scheduled_drafts[r]``, summing to ``min(budget, Σ scheduled_drafts)``.
    Host tensors are checked as the Rust function checks them (``ValueError`` naming the
    argument and the entry); on an accelerator the values are not read back and not checked,
    see the module docs for what out-of-range entries do there.
    """
    p = _check_confidences(confidences)
    scheduled = _check_integers(scheduled_drafts, "scheduled_drafts")
    if scheduled.device.type == "cpu":
        scheduled = scheduled.clone()  # checked, then used: a private copy
    if scheduled.dim() != 1 or scheduled.shape[0] != p.shape[0]:
        raise InvalidValueError(
            f"scheduled_drafts: expected shape [{p.shape[0]}], got {tuple(scheduled.shape)}"
        )
    num_requests, num_positions = p.shape
    if scheduled.device.type == "cpu" and scheduled.numel():
        bad = torch.nonzero((scheduled < 0) | (scheduled > num_positions))
        if bad.numel():
            r = int(bad[0, 0])
            raise InvalidValueError(
                f"scheduled_drafts: [{r}] = {int(scheduled[r])} is outside 0..={num_positions} "
                f"(confidences has {num_positions} positions)"
            )
    limit = _check_budget(budget, num_requests * num_positions, p.device)
    survival = survivals_torch(p)
    device = survival.device
    steps = torch.arange(num_positions, device=device)
    valid = steps[None, :] < scheduled.to(device)[:, None]
    # Survivals are >= 0, so -1 ranks every unscheduled slot last.
    score = torch.where(valid, survival, torch.full_like(survival, -1.0))
    depth_major = score.t().reshape(-1)
    order = torch.sort(depth_major, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=device)
    wins = (rank < limit) & valid.t().reshape(-1)
    return wins.view(num_positions, num_requests).sum(dim=0, dtype=torch.int32)
