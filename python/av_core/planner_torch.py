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
Values are not validated (that would need a sync): pass probabilities in ``[0, 1]``, or
validate on the host with the Rust functions.
"""

from __future__ import annotations

import torch

__all__ = ["assign_draft_budget_torch", "survivals_torch"]


def survivals_torch(confidences: torch.Tensor) -> torch.Tensor:
    """``S[r, k] = p[r, 0]·…·p[r, k]`` in float64, multiplied left to right as the Rust core
    does (and vLLM's host ``cumprod``)."""
    if confidences.dim() != 2:
        raise ValueError(f"confidences: expected [R, K], got shape {tuple(confidences.shape)}")
    if not confidences.is_floating_point():
        raise TypeError(f"confidences: expected a float tensor, got {confidences.dtype}")
    p = confidences.to(torch.float64)
    out = torch.empty_like(p)
    running = torch.ones(p.shape[0], dtype=torch.float64, device=p.device)
    for k in range(p.shape[1]):
        running = running * p[:, k]
        out[:, k] = running
    return out


def assign_draft_budget_torch(
    confidences: torch.Tensor,
    scheduled_drafts: torch.Tensor,
    budget: int | torch.Tensor,
) -> torch.Tensor:
    """Admitted drafts per request, int32 ``[R]`` on ``confidences``' device.

    Same rule and same counts as :func:`av_core.assign_draft_budget`: a prefix of each
    request, at most ``scheduled_drafts[r]``, summing to ``min(budget, Σ scheduled_drafts)``.
    """
    if confidences.dim() != 2:
        raise ValueError(f"confidences: expected [R, K], got shape {tuple(confidences.shape)}")
    if scheduled_drafts.dim() != 1 or scheduled_drafts.shape[0] != confidences.shape[0]:
        raise ValueError(
            f"scheduled_drafts: expected shape [{confidences.shape[0]}], "
            f"got {tuple(scheduled_drafts.shape)}"
        )
    if scheduled_drafts.is_floating_point() or scheduled_drafts.dtype == torch.bool:
        raise TypeError(f"scheduled_drafts: expected integers, got {scheduled_drafts.dtype}")
    if isinstance(budget, int) and budget < 0:
        raise ValueError(f"budget: must be non-negative, got {budget}")
    survival = survivals_torch(confidences)
    num_requests, num_positions = survival.shape
    device = survival.device
    steps = torch.arange(num_positions, device=device)
    valid = steps[None, :] < scheduled_drafts.to(device)[:, None]
    # Survivals are >= 0, so -1 ranks every unscheduled slot last.
    score = torch.where(valid, survival, torch.full_like(survival, -1.0))
    depth_major = score.t().reshape(-1)
    order = torch.sort(depth_major, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=device)
    if isinstance(budget, torch.Tensor):
        budget = budget.to(device)
    wins = (rank < budget) & valid.t().reshape(-1)
    return wins.view(num_positions, num_requests).sum(dim=0, dtype=torch.int32)
