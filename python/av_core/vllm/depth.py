"""Drafting depth for vLLM: decide how far to draft before ``propose`` runs.

Trimming verification cannot refund drafting that already happened. :class:`DraftDepthHook`
decides, before the drafter runs, how many positions to draft (one depth for the batch, which
is what vLLM's ``propose(..., num_speculative_tokens=k)`` takes, or one per request), with
:meth:`av_core.VerificationPlanner.choose_draft_depth` on the confidences each request slot had
at its last drafted step and cost tables that price drafting by depth. It reads nothing of the
step it governs, so it is lossless for every drafter.

Where it goes in vLLM 0.33.0 (``vllm/v1/worker/gpu/model_runner.py``,
``GPUModelRunner.sample_tokens``), around the existing ``propose`` call::

    stale = self.adaptive_verification._stale_confidences[                # new: before drafting
        self.adaptive_verification._stale_idx].np
    depth_hook.catch_up(stale)
    num_spec_tokens = depth_hook.num_speculative_tokens(
        input_batch.idx_mapping_np, limit=num_spec_tokens,
        num_non_draft_tokens=input_batch.num_reqs, num_sampling_requests=input_batch.num_reqs)
    draft_tokens = self.speculator.propose(..., num_speculative_tokens=num_spec_tokens, ...)
    if num_spec_tokens < self.num_speculative_steps:              # vLLM's own line: marks
        draft_tokens[:, num_spec_tokens:] = -1                    # undrafted positions
    depth_hook.mask(draft_tokens)                                 # new (per-request depths)
    self.adaptive_verification.record_confidences(...)           # vLLM's own line
    depth_hook.proposed(input_batch.idx_mapping_np)               # new: what was just drafted

and ``depth_hook.add_request(req_idx)`` beside ``adaptive_verification.add_request``.

Why ``catch_up``/``proposed`` rather than recording right away: vLLM copies each step's
confidences to the host asynchronously into one of two buffers, so the host copy it has
synchronized when the next ``propose`` runs holds the confidences of the ``propose`` *two*
calls back. The hook remembers which depths each of its last ``lag = 2`` proposals used and, in
``catch_up``, records the buffer's rows with the depths of the proposal they came from (only
positions actually drafted; each proposal once). No device sync is added: the buffer is the one
vLLM's own budget reads.

Per-request depths (``mode="per_request"``) go through ``propose`` as their maximum, and
:meth:`DraftDepthHook.mask` writes ``-1`` past each request's own depth, as vLLM marks undrafted
positions. Caveat: with vLLM's asynchronous scheduling the next step's draft slots are
scheduled before the drafts exist, so positions marked ``-1`` may still be sent to the target
(and rejected there); the saving is then the drafter's passes, and the verification only where
adaptive verification's budget trims it. The next step's non-draft token count is not known
when ``propose`` runs; the decode-only count (one per request) is the natural estimate.

:mod:`av_core.vllm.plugin` installs exactly this when ``AV_CORE_VLLM_DEPTH`` is set (off by
default). Note for EAGLE-style speculators in vLLM 0.33.0: at depth 0 the drafter still runs its
first pass over the accepted tokens (its KV cache must stay current) and only skips sampling, so
profile ``draft_depth_ms`` as the cost above that floor.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from av_core._checks import _check_int
from av_core._native import (
    DEFAULT_EXPLORATION,
    CostTables,
    DepthPlan,
    InvalidTypeError,
    InvalidValueError,
    VerificationPlanner,
    choose_draft_depth,
)
from av_core.vllm import metrics as vllm_metrics
from av_core.vllm.budget import ShapeCostTables

__all__ = ["DraftDepthHook"]

DepthMode = Literal["batch", "per_request"]


def _host(value: Any, name: str) -> npt.NDArray[Any]:
    """A numpy view of ``value`` (a CUDA tensor is copied once; pass host copies to avoid it).

    A torch tensor is read as the values it stands for (a lazily negated view is resolved) and
    bfloat16, which numpy lacks, is widened to float32 (exactly)."""
    if isinstance(value, np.ndarray):
        return value
    detach = getattr(value, "detach", None)
    if detach is not None:
        tensor = detach().cpu().resolve_conj().resolve_neg()
        if str(tensor.dtype) == "torch.bfloat16":
            tensor = tensor.float()
        try:
            return np.asarray(tensor.numpy())
        except (TypeError, RuntimeError) as error:
            raise InvalidTypeError(
                f"{name}: cannot read a tensor of dtype {tensor.dtype}"
            ) from error
    try:
        return np.asarray(value)
    except (TypeError, ValueError, OverflowError) as error:
        raise InvalidTypeError(f"{name}: expected an array, got {type(value).__name__}") from error


def _integers(value: Any, name: str) -> npt.NDArray[Any]:
    """An integer array as given (no cast yet: a float would truncate, a uint64 wrap), copied:
    the entries checked are the entries used, whatever another thread writes meanwhile."""
    array = np.array(_host(value, name))
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise InvalidTypeError(f"{name}: expected integers, got dtype {array.dtype}")
    return array


def _in_range(array: npt.NDArray[Any], name: str, low: int, high: int) -> npt.NDArray[np.int64]:
    """``array`` as int64 after checking, in its own dtype, that it lies in ``low..=high``."""
    if array.size:
        smallest, largest = array.min(), array.max()
        if smallest < low or largest > high:
            bad = smallest if smallest < low else largest
            raise InvalidValueError(f"{name}: must be in {low}..{high}, got {int(bad)}")
    return array.astype(np.int64)


def _probability(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InvalidTypeError(f"exploration: must be a number, got {type(value).__name__}")
    return float(value)  # the planner checks the range


@dataclass(frozen=True)
class ShapeDepthPlan:
    """A depth decision priced with the tables of the step's batch size (a
    :class:`~av_core.vllm.budget.ShapeCostTables` hook): the fields of ``av_core.DepthPlan``."""

    depths: npt.NDArray[np.int32]
    max_depth: int
    drafts: int
    budget: int
    expected_accepted_tokens: float
    predicted_cost_ms: float


class DraftDepthHook:
    """Chooses each step's drafting depth from remembered confidences and depth-priced costs.

    ``cost_tables`` must carry a draft-depth table over exactly ``0..num_speculative_steps``
    (:meth:`CostTables.with_draft_depth`); a :class:`~av_core.vllm.budget.ShapeCostTables`
    (verify costs by batch size and drafts per request) prices each decision with the tables of
    its own batch size. State: one row of ``K`` confidences per request slot, 1.0 for a new
    request (vLLM's optimistic start); :meth:`record` overwrites only the positions a request
    actually drafted. :meth:`proposed` and :meth:`catch_up` pair a host buffer that lags ``lag``
    proposals behind with the depths those proposals drafted (module docs). ``exploration`` and
    ``seed`` are the planner's exploration policy (one draw per request per decision, from the
    seed, the step and the slot, never from tokens; each :meth:`choose` counts one step): a
    request that explores drafts as deep as the batch does, and in an exploration step
    (probability ``exploration``) its whole cap, so deep positions keep being drafted and
    verified even after depth has fallen to 0.
    """

    def __init__(
        self,
        cost_tables: CostTables | ShapeCostTables,
        max_num_reqs: int,
        num_speculative_steps: int,
        *,
        mode: DepthMode = "batch",
        exploration: float = DEFAULT_EXPLORATION,
        seed: int = 0,
        lag: int = 2,
    ) -> None:
        if not isinstance(cost_tables, CostTables | ShapeCostTables):
            raise InvalidTypeError(
                "cost_tables: expected av_core.CostTables or ShapeCostTables, got "
                f"{type(cost_tables).__name__}"
            )
        max_num_reqs = _check_int(max_num_reqs, "max_num_reqs", 1)
        num_speculative_steps = _check_int(num_speculative_steps, "num_speculative_steps", 1)
        depth = cost_tables.max_draft_depth
        if depth != num_speculative_steps:
            raise InvalidValueError(
                f"cost_tables: needs a draft-depth table over depths 0..{num_speculative_steps}, "
                f"has {'none' if depth is None else f'depths 0..{depth}'} "
                "(CostTables.with_draft_depth)"
            )
        if mode not in ("batch", "per_request"):
            raise InvalidValueError(f"mode: must be 'batch' or 'per_request', got {mode!r}")
        seed = _check_int(seed, "seed", 0)
        if not isinstance(lag, int) or isinstance(lag, bool) or lag < 1:
            raise InvalidValueError(f"lag: must be a positive int, got {lag!r}")
        self.cost_tables = cost_tables
        self.num_speculative_steps = num_speculative_steps
        self.mode: DepthMode = mode
        # The remembered rows live in the core planner (which stores only drafted positions),
        # and so does the exploration policy: the planner draws the explorers, the hook counts
        # the steps (verification is vLLM's, so no `plan` call counts them).
        # With tables by batch shape the planner keeps the slots and the exploration draws;
        # each decision is priced with the tables of its own batch size (_choose_by_shape).
        self._shapes: ShapeCostTables | None = None
        if isinstance(cost_tables, ShapeCostTables):
            self._shapes = cost_tables
            planner_tables = cost_tables.for_batch(1, 0)
        else:
            planner_tables = cost_tables
        self._planner = VerificationPlanner(
            planner_tables,
            num_speculative_steps,
            num_slots=max_num_reqs,
            exploration=_probability(exploration),
            exploration_seed=seed,
        )
        # The last `lag` proposals: (slots, depths), oldest first, each marked once recorded.
        self._proposals: deque[list[Any]] = deque(maxlen=lag)
        self.lag = lag
        #: The last decision: the planner's plan (exploration included), whether it was an
        #: exploration step in which some request drafted its whole cap, which requests
        #: explored, and the depths used.
        self.last_plan: DepthPlan | ShapeDepthPlan | None = None
        self.explored = False
        self.explorers: npt.NDArray[np.bool_] | None = None
        self.last_depths: npt.NDArray[np.int32] | None = None

    @property
    def max_num_reqs(self) -> int:
        return self._planner.num_slots

    @property
    def exploration(self) -> float:
        """The exploration probability (the planner's; setting it keeps the seed and the step
        count)."""
        return self._planner.exploration

    @exploration.setter
    def exploration(self, value: float) -> None:
        self._planner.set_exploration(_probability(value), exploration_seed=self.seed)

    @property
    def seed(self) -> int:
        """The seed of the exploration draws (the planner's)."""
        return self._planner.exploration_seed

    def _slots(self, idx_mapping: Any) -> npt.NDArray[np.int64]:
        raw = _integers(idx_mapping, "idx_mapping").reshape(-1)
        if raw.size:
            bad = raw[(raw < 0) | (raw >= self.max_num_reqs)]
            if bad.size:
                raise InvalidValueError(
                    f"idx_mapping: {int(bad[0])} is outside 0..{self.max_num_reqs - 1}"
                )
        slots = raw.astype(np.int64)
        if np.unique(slots).size != slots.size:
            raise InvalidValueError("idx_mapping: a request slot appears twice")
        return slots

    def add_request(self, slot: int) -> None:
        """A new request took ``slot``: forget the old one's confidences (back to 1.0)."""
        slot = _check_int(slot, "slot", 0)
        if slot >= self.max_num_reqs:
            raise InvalidValueError(f"slot: {slot} is outside 0..{self.max_num_reqs - 1}")
        self._planner.add_request(slot)
        # Confidences the old request drafted before it left must not land on the new one.
        for entry in self._proposals:
            entry[1] = np.where(entry[0] == slot, 0, entry[1])

    def proposed(self, idx_mapping: Any, depths: Any = None) -> None:
        """Notes a ``propose`` that just ran for ``idx_mapping`` with ``depths`` per request
        (default: the last decision's depths, which must be for these requests)."""
        slots = self._slots(idx_mapping)
        if depths is None:
            if self.last_depths is None or self.last_depths.size != slots.size:
                raise InvalidValueError(
                    "depths: no decision for these requests; pass the depths they drafted"
                )
            chosen = self.last_depths.astype(np.int64)
        else:
            raw = _integers(depths, "depths")
            if raw.shape not in ((), slots.shape):
                raise InvalidValueError(
                    f"depths: expected one int or one per request ({slots.size}), got shape "
                    f"{raw.shape}"
                )
            chosen = np.broadcast_to(
                _in_range(raw, "depths", 0, self.num_speculative_steps), slots.shape
            ).copy()
        self._proposals.append([slots.copy(), chosen, False])

    def catch_up(self, stale: Any) -> None:
        """Records, from a per-slot buffer ``[max_num_reqs, K]`` of confidences (vLLM's
        synchronized host copy), the proposal ``lag`` calls back, with the depths it drafted;
        each proposal once."""
        if len(self._proposals) < self.lag:
            return
        entry = self._proposals[0]
        if entry[2]:
            return
        rows = np.asarray(_host(stale, "stale"))
        if rows.ndim != 2 or rows.shape[0] < self.max_num_reqs:
            raise InvalidValueError(
                f"stale: expected shape [{self.max_num_reqs}, {self.num_speculative_steps}] "
                f"or larger, got {rows.shape}"
            )
        slots, depths = entry[0], entry[1]
        self.record(slots, rows[slots], depths)
        entry[2] = True

    def remembered(self, slot: int) -> npt.NDArray[np.float64]:
        """The confidences remembered for ``slot`` (a copy)."""
        return self._planner.previous_confidences(slot)

    def record(self, idx_mapping: Any, confidences: Any, num_drafted: Any) -> None:
        """Remember this step's confidences ``[R, K]`` of the requests in ``idx_mapping``, for
        the positions each drafted (``num_drafted``: one int for all, or one per request).
        Validated in full before anything changes."""
        slots = self._slots(idx_mapping)
        conf = _host(confidences, "confidences")
        if conf.size and not (
            np.issubdtype(conf.dtype, np.floating) or np.issubdtype(conf.dtype, np.integer)
        ):
            raise InvalidTypeError(f"confidences: expected numbers, got dtype {conf.dtype}")
        k = self.num_speculative_steps
        if conf.ndim != 2 or conf.shape[0] < slots.size or conf.shape[1] < k:
            raise InvalidValueError(
                f"confidences: expected shape [{slots.size}, {k}] or larger, got {conf.shape}"
            )
        conf = conf[: slots.size, :k].astype(np.float64)
        raw = np.array(_host(num_drafted, "num_drafted"))  # a copy: checked, then used
        if raw.dtype.kind not in "iu" or raw.shape not in ((), slots.shape):
            raise InvalidValueError(
                f"num_drafted: expected one int or one per request ({slots.size}), got "
                f"{raw.dtype} array of shape {raw.shape}"
            )
        if raw.size and (raw.min() < 0 or raw.max() > k):
            raise InvalidValueError(f"num_drafted: must be in 0..{k}, got {raw.min()}..{raw.max()}")
        drafted = np.broadcast_to(raw.astype(np.int64), slots.shape)
        self._planner.remember(slots, np.ascontiguousarray(conf), np.ascontiguousarray(drafted))

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
        ``K``), the planner's exploration included: explorers draft as deep as the batch, and
        their whole cap in an exploration step. Counts one step of the planner's exploration
        draws. The decision's details stay in :attr:`last_plan`, :attr:`explored` and
        :attr:`explorers`."""
        slots = self._slots(idx_mapping)
        k = self.num_speculative_steps
        if max_depths is None:
            caps = np.full(slots.size, k, dtype=np.int64)
        else:
            raw = _integers(max_depths, "max_depths").reshape(-1)
            if raw.shape != slots.shape:
                raise InvalidValueError(
                    f"max_depths: expected one per request ({slots.size}), got {raw.size}"
                )
            caps = _in_range(raw, "max_depths", 0, k)
        plan: DepthPlan | ShapeDepthPlan
        if self._shapes is None:
            plan = self._planner.choose_draft_depth(
                slots,
                caps,
                num_non_draft_tokens=num_non_draft_tokens,
                num_sampling_requests=num_sampling_requests,
                max_draft_budget=max_draft_budget,
                mode=self.mode,
            )
        else:
            plan = self._choose_by_shape(
                slots, caps, num_non_draft_tokens, num_sampling_requests, max_draft_budget
            )
        # The draws the decision just used (the coming step's); then the step is counted, as
        # the planner's `plan` would count it.
        whole, explorers = self._planner.coming_explorers(slots)
        self._planner.count_step()
        self.last_plan = plan
        self.explorers = explorers
        self.explored = whole and bool((explorers & (caps > 0)).any())
        self.last_depths = plan.depths.copy()
        return self.last_depths

    def _choose_by_shape(
        self,
        slots: npt.NDArray[np.int64],
        caps: npt.NDArray[np.int64],
        num_non_draft_tokens: int,
        num_sampling_requests: int,
        max_draft_budget: int | None,
    ) -> ShapeDepthPlan:
        """The planner's decision (``VerificationPlanner.choose_draft_depth``: the core's rule
        on the slots' remembered confidences, then exploration) with the tables of this step's
        batch size, which the planner's own tables cannot be."""
        shapes = self._shapes
        assert shapes is not None
        t = _check_int(num_non_draft_tokens, "num_non_draft_tokens", 0)
        largest = int(caps.sum()) if max_draft_budget is None else int(max_draft_budget)
        tables = shapes.for_batch(max(slots.size, 1), t + max(largest, 0))
        k = self.num_speculative_steps
        remembered = np.empty((slots.size, k))
        for row, slot in enumerate(slots.tolist()):
            remembered[row] = self._planner.previous_confidences(slot)
        chosen = choose_draft_depth(
            remembered,
            caps,
            num_non_draft_tokens=t,
            num_sampling_requests=num_sampling_requests,
            cost_tables=tables,
            max_draft_budget=max_draft_budget,
            mode=self.mode,
        )
        depths = np.asarray(chosen.depths, dtype=np.int32).copy()
        cost = chosen.predicted_cost_ms
        if self._planner.exploration > 0.0 and slots.size:
            # The planner's exploration (VerificationPlanner.choose_draft_depth): explorers
            # draft as deep as the batch does, their whole cap in an exploration step.
            whole, explorers = self._planner.coming_explorers(slots)
            reach_of = caps if whole else np.minimum(caps, chosen.max_depth)
            widened = explorers & (depths < reach_of)
            if widened.any():
                depths[widened] = reach_of[widened]
                cost = tables.step_draft_cost_ms(depths) + float(
                    tables.verify_ms[t + chosen.budget]
                )
        return ShapeDepthPlan(
            depths=depths,
            max_depth=int(depths.max(initial=0)),
            drafts=int(depths.sum()),
            budget=chosen.budget,
            expected_accepted_tokens=chosen.expected_accepted_tokens,
            predicted_cost_ms=cost,
        )

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
        if isinstance(limit, bool) or not isinstance(limit, int | np.integer) or limit < 0:
            raise InvalidValueError(f"limit: must be a non-negative int, got {limit!r}")
        metrics = vllm_metrics.current()
        started = time.perf_counter() if metrics is not None else 0.0
        count = int(np.size(_host(idx_mapping, "idx_mapping")))
        depths = self.choose(
            idx_mapping,
            num_non_draft_tokens=num_non_draft_tokens,
            num_sampling_requests=num_sampling_requests,
            max_depths=np.full(count, min(limit, self.num_speculative_steps)),
        )
        depth = int(depths.max(initial=0))
        if metrics is not None:
            metrics.host_time(vllm_metrics.DEPTH, time.perf_counter() - started)
            plan = self.last_plan
            metrics.depth_chosen(depth, None if plan is None else plan.predicted_cost_ms)
        return depth

    def mask(self, draft_tokens: Any) -> None:
        """Writes ``-1`` into ``draft_tokens[r, d_r:]`` for the last decision's per-request
        depths (in batch mode this matters only in exploration steps, where explorers draft
        deeper than the rest). Works on numpy arrays and on torch tensors of any device (one
        small host-to-device copy)."""
        shape = getattr(draft_tokens, "shape", None)
        if shape is None or not hasattr(draft_tokens, "__setitem__"):
            raise InvalidTypeError(
                f"draft_tokens: expected a numpy array or a torch tensor, got "
                f"{type(draft_tokens).__name__}"
            )
        if self.last_depths is None:
            return
        depths = self.last_depths.astype(np.int64)
        if len(shape) != 2 or shape[0] < depths.size:
            raise InvalidValueError(
                f"draft_tokens: expected shape [>= {depths.size}, K], got {tuple(shape)}"
            )
        width = draft_tokens.shape[1]
        keep = np.arange(width)[None, :] < depths[:, None]
        if isinstance(draft_tokens, np.ndarray):
            draft_tokens[: depths.size][~keep] = -1
            return
        import torch

        mask = torch.from_numpy(~keep).to(draft_tokens.device, non_blocking=True)
        draft_tokens[: depths.size].masked_fill_(mask, -1)
