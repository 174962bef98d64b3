"""Drafting depth for vLLM: decide how far to draft before ``propose`` runs.

Trimming verification cannot refund drafting that already happened. :class:`DraftDepthHook`
decides, before the drafter runs, how many positions to draft (one depth for the batch, which
is what vLLM's ``propose(..., num_speculative_tokens=k)`` takes, or one per request), with
:func:`av_core.choose_draft_depth` on the confidences each request slot had at its last drafted
step and cost tables that price drafting by depth. It reads nothing of the step it governs, so
it is lossless for every drafter.

Where it goes in vLLM 0.33.0 (``vllm/v1/worker/gpu/model_runner.py``,
``GPUModelRunner.sample_tokens``), around the existing ``propose`` call::

    num_spec_tokens = depth_hook.num_speculative_tokens(          # new: before drafting
        input_batch.idx_mapping_np, limit=num_spec_tokens,
        num_non_draft_tokens=input_batch.num_reqs, num_sampling_requests=input_batch.num_reqs)
    draft_tokens = self.speculator.propose(..., num_speculative_tokens=num_spec_tokens, ...)
    if num_spec_tokens < self.num_speculative_steps:              # vLLM's own line: marks
        draft_tokens[:, num_spec_tokens:] = -1                    # undrafted positions
    ...
    self.adaptive_verification.record_confidences(...)           # vLLM's own line
    depth_hook.record(input_batch.idx_mapping_np, host_confidences, num_spec_tokens)  # new

``host_confidences`` is the host copy vLLM's ``AdaptiveVerificationManager`` already keeps
(``_stale_confidences[_stale_idx].np`` rows of the batch), so the hook adds no device sync.
Per-request depths (``mode="per_request"``) go through ``propose`` as their maximum, and
:meth:`DraftDepthHook.mask` writes ``-1`` past each request's own depth, so the target never
verifies positions the decision did not buy. The next step's non-draft token count is not
known when ``propose`` runs; the decode-only count (one per request) is the natural estimate.

:mod:`av_core.vllm_plugin` installs exactly this when ``AV_CORE_VLLM_DEPTH`` is set (off by
default). Note for EAGLE-style speculators in vLLM 0.33.0: at depth 0 the drafter still runs its
first pass over the accepted tokens (its KV cache must stay current) and only skips sampling, so
profile ``draft_depth_ms`` as the cost above that floor.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from av_core._native import CostTables, DepthPlan, choose_draft_depth

__all__ = ["DraftDepthHook"]

DepthMode = Literal["batch", "per_request"]


def _host(value: Any, name: str) -> npt.NDArray[Any]:
    """A numpy view of ``value`` (a CUDA tensor is copied once; pass host copies to avoid it)."""
    if isinstance(value, np.ndarray):
        return value
    detach = getattr(value, "detach", None)
    if detach is not None:
        return np.asarray(detach().cpu().numpy())
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name}: expected an array, got {type(value).__name__}") from error


class DraftDepthHook:
    """Chooses each step's drafting depth from remembered confidences and depth-priced costs.

    ``cost_tables`` must carry a draft-depth table covering ``num_speculative_steps``
    (:meth:`CostTables.with_draft_depth`). State: one row of ``K`` confidences per request
    slot, 1.0 for a new request (vLLM's optimistic start); :meth:`record` overwrites only the
    positions a request actually drafted. ``exploration`` is the probability that a step is an
    exploration step, in which a few requests (each with that probability, at least one) draft
    their whole block (draws from ``seed``, never from tokens), so deep positions keep being
    drafted and verified even after depth has fallen to 0.
    """

    def __init__(
        self,
        cost_tables: CostTables,
        max_num_reqs: int,
        num_speculative_steps: int,
        *,
        mode: DepthMode = "batch",
        exploration: float = 0.01,
        seed: int = 0,
    ) -> None:
        if not isinstance(cost_tables, CostTables):
            raise TypeError(
                f"cost_tables: expected av_core.CostTables, got {type(cost_tables).__name__}"
            )
        depth = cost_tables.max_draft_depth
        if depth is None or depth < num_speculative_steps:
            raise ValueError(
                f"cost_tables: needs a draft-depth table covering depth {num_speculative_steps}, "
                f"has {'none' if depth is None else f'depths 0..{depth}'} "
                "(CostTables.with_draft_depth)"
            )
        if not isinstance(max_num_reqs, int) or max_num_reqs < 1:
            raise ValueError(f"max_num_reqs: must be a positive int, got {max_num_reqs!r}")
        if not isinstance(num_speculative_steps, int) or num_speculative_steps < 1:
            raise ValueError(
                f"num_speculative_steps: must be a positive int, got {num_speculative_steps!r}"
            )
        if mode not in ("batch", "per_request"):
            raise ValueError(f"mode: must be 'batch' or 'per_request', got {mode!r}")
        if not 0.0 <= exploration <= 1.0:
            raise ValueError(f"exploration: must be in [0, 1], got {exploration!r}")
        self.cost_tables = cost_tables
        self.num_speculative_steps = num_speculative_steps
        self.mode: DepthMode = mode
        self.exploration = float(exploration)
        self._rng = np.random.default_rng(seed)
        self._memory = np.ones((max_num_reqs, num_speculative_steps), dtype=np.float64)
        self._drafted = np.full(max_num_reqs, num_speculative_steps, dtype=np.int64)
        #: The last decision: the planner's plan, whether the step explored, the depths used.
        self.last_plan: DepthPlan | None = None
        self.explored = False
        self.last_depths: npt.NDArray[np.int32] | None = None

    @property
    def max_num_reqs(self) -> int:
        return int(self._memory.shape[0])

    def _slots(self, idx_mapping: Any) -> npt.NDArray[np.int64]:
        slots = _host(idx_mapping, "idx_mapping").astype(np.int64, copy=False).reshape(-1)
        if slots.size and (slots.min() < 0 or slots.max() >= self.max_num_reqs):
            bad = slots[(slots < 0) | (slots >= self.max_num_reqs)][0]
            raise ValueError(f"idx_mapping: {bad} is outside 0..{self.max_num_reqs - 1}")
        if np.unique(slots).size != slots.size:
            raise ValueError("idx_mapping: a request slot appears twice")
        return slots

    def add_request(self, slot: int) -> None:
        """A new request took ``slot``: forget the old one's confidences (back to 1.0)."""
        if not 0 <= slot < self.max_num_reqs:
            raise ValueError(f"slot: {slot} is outside 0..{self.max_num_reqs - 1}")
        self._memory[slot] = 1.0
        self._drafted[slot] = self.num_speculative_steps

    def drafted(self, idx_mapping: Any) -> npt.NDArray[np.int64]:
        """The depth each slot was last given (``K`` before any decision): which positions of
        its next recorded confidences are real."""
        return self._drafted[self._slots(idx_mapping)].copy()

    def remembered(self, slot: int) -> npt.NDArray[np.float64]:
        """The confidences remembered for ``slot`` (a copy)."""
        if not 0 <= slot < self.max_num_reqs:
            raise ValueError(f"slot: {slot} is outside 0..{self.max_num_reqs - 1}")
        row: npt.NDArray[np.float64] = self._memory[slot].copy()
        return row

    def record(self, idx_mapping: Any, confidences: Any, num_drafted: Any) -> None:
        """Remember this step's confidences ``[R, K]`` of the requests in ``idx_mapping``, for
        the positions each drafted (``num_drafted``: one int for all, or one per request).
        Validated in full before anything changes."""
        slots = self._slots(idx_mapping)
        conf = np.asarray(_host(confidences, "confidences"), dtype=np.float64)
        k = self.num_speculative_steps
        if conf.ndim != 2 or conf.shape[0] < slots.size or conf.shape[1] < k:
            raise ValueError(
                f"confidences: expected shape [{slots.size}, {k}] or larger, got {conf.shape}"
            )
        conf = conf[: slots.size, :k]
        drafted = np.broadcast_to(
            np.asarray(_host(num_drafted, "num_drafted"), dtype=np.int64), slots.shape
        )
        if drafted.size and (drafted.min() < 0 or drafted.max() > k):
            raise ValueError(
                f"num_drafted: must be in 0..{k}, got {drafted.min()}..{drafted.max()}"
            )
        positions = np.arange(k)[None, :] < drafted[:, None]
        if not np.all((conf[positions] >= 0.0) & (conf[positions] <= 1.0)):
            raise ValueError("confidences: drafted positions must be probabilities in [0, 1]")
        rows = self._memory[slots]
        rows[positions] = conf[positions]
        self._memory[slots] = rows

    def choose(
        self,
        idx_mapping: Any,
        *,
        num_non_draft_tokens: int,
        num_sampling_requests: int,
        max_depths: Any = None,
        max_draft_budget: int | None = None,
    ) -> npt.NDArray[np.int32]:
        """Depths for the requests in ``idx_mapping`` (``max_depths`` caps each, default
        ``K``); in an exploration step a few requests draft their whole cap. The decision's
        details stay in :attr:`last_plan` and :attr:`explored`."""
        slots = self._slots(idx_mapping)
        k = self.num_speculative_steps
        caps = (
            np.full(slots.size, k, dtype=np.int64)
            if max_depths is None
            else np.asarray(_host(max_depths, "max_depths"), dtype=np.int64).reshape(-1)
        )
        plan = choose_draft_depth(
            self._memory[slots],
            caps,
            num_non_draft_tokens=num_non_draft_tokens,
            num_sampling_requests=num_sampling_requests,
            cost_tables=self.cost_tables,
            max_draft_budget=max_draft_budget,
            mode=self.mode,
        )
        self.last_plan = plan
        depths = plan.depths.copy()
        # An exploration step: a few requests (each with probability `exploration`, at least
        # one) draft their whole block. Only they widen: the rest, whose remembered rows may be
        # stale or optimistic, would otherwise be pulled into a verification budget.
        self.explored = self.exploration > 0.0 and bool(self._rng.random() < self.exploration)
        if self.explored and slots.size:
            explorers = self._rng.random(slots.size) < self.exploration
            if not explorers.any():
                explorers[self._rng.integers(slots.size)] = True
            depths[explorers] = caps[explorers]
        self.last_depths = depths
        self._drafted[slots] = depths
        return depths

    def num_speculative_tokens(
        self,
        idx_mapping: Any,
        *,
        limit: int,
        num_non_draft_tokens: int,
        num_sampling_requests: int,
    ) -> int:
        """The ``num_speculative_tokens`` to pass to ``propose``: the deepest chosen depth, at
        most ``limit`` (the scheduler's own count)."""
        count = int(np.size(_host(idx_mapping, "idx_mapping")))
        depths = self.choose(
            idx_mapping,
            num_non_draft_tokens=num_non_draft_tokens,
            num_sampling_requests=num_sampling_requests,
            max_depths=np.full(count, min(limit, self.num_speculative_steps)),
        )
        return int(depths.max(initial=0))

    def mask(self, draft_tokens: Any) -> None:
        """Writes ``-1`` into ``draft_tokens[r, d_r:]`` for the last decision's per-request
        depths (a no-op in batch mode beyond vLLM's own masking). Works on numpy arrays and on
        torch tensors of any device (one small host-to-device copy)."""
        if self.last_depths is None:
            return
        depths = self.last_depths.astype(np.int64)
        width = draft_tokens.shape[1]
        keep = np.arange(width)[None, :] < depths[:, None]
        if isinstance(draft_tokens, np.ndarray):
            draft_tokens[: depths.size][~keep] = -1
            return
        import torch

        mask = torch.from_numpy(~keep).to(draft_tokens.device, non_blocking=True)
        draft_tokens[: depths.size].masked_fill_(mask, -1)
