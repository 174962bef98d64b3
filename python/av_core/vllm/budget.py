"""vLLM's budget logic on av_core's Rust planner (the drop-ins for
``vllm.v1.worker.gpu.spec_decode.adaptive_verification``): :func:`build_cost_tables_from_curves`,
:func:`assign_draft_token_budget` (``_assign_draft_token_budget``) and
:func:`batch_draft_budget` (the arithmetic of ``AdaptiveVerificationManager.get_num_tokens``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from av_core._native import InvalidTypeError, InvalidValueError
from av_core.vllm import metrics as vllm_metrics
from av_core.vllm.checks import (
    _check_confidences,
    _check_count,
    _check_int_tensor,
    _check_output,
    _check_positive_int,
    _check_range_on_host,
    _check_tensor,
    _check_vector,
)

if TYPE_CHECKING:
    from av_core import CostTables


def _planner(*names: str) -> tuple[Any, ...]:
    """The Rust planner's entry points, from the compiled module (an older build lacks them)."""
    from av_core import _native

    missing = [name for name in names if not hasattr(_native, name)]
    if missing:
        raise ImportError(
            f"this build of av_core lacks the planner ({', '.join(missing)}); rebuild av_core"
        )
    return tuple(getattr(_native, name) for name in names)


class CostTablePair(tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]):
    """``(draft_ms, verify_ms)`` as vLLM holds its cost tables, carrying the native
    ``av_core.CostTables`` they came from so the budget does not rebuild it every step."""

    native: Any

    def __new__(
        cls, draft_ms: npt.NDArray[np.float64], verify_ms: npt.NDArray[np.float64], native: Any
    ) -> CostTablePair:
        pair = super().__new__(cls, (draft_ms, verify_ms))
        pair.native = native
        return pair

    def __getnewargs__(self) -> tuple[Any, ...]:
        return (self[0], self[1], self.native)


def build_cost_tables_from_curves(
    draft_curve: list[tuple[int, float]],
    verify_curve: list[tuple[int, float]],
    max_num_reqs: int,
    max_batch_tokens: int,
    cudagraph_limit: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's ``build_cost_tables_from_curves``: dense ``(draft_ms, verify_ms)`` tables.

    Costs take their running maximum; up to ``cudagraph_limit`` a size is charged at the next
    profiled size (captured graphs pad to it, so cost is a step function); above it costs are
    interpolated between profiled points above the limit (crossing it loses the graphs, a real
    jump); past the last point the last segment is extended. Draft entries are floored at 0,
    verify entries at 1e-6. Computed by ``av_core.CostTables.from_curves``.
    """
    (cost_tables,) = _planner("CostTables")
    native = cost_tables.from_curves(
        _curve_points(draft_curve, "draft_curve"),
        _curve_points(verify_curve, "verify_curve"),
        max_num_reqs=max_num_reqs,
        max_batch_tokens=max_batch_tokens,
        cudagraph_limit=cudagraph_limit,
    )
    draft_ms = np.asarray(native.draft_ms, dtype=np.float64)
    verify_ms = np.asarray(native.verify_ms, dtype=np.float64)
    return CostTablePair(draft_ms, verify_ms, native)


def _curve_points(curve: object, name: str) -> list[tuple[float, float]]:
    """``[(size, ms), ...]`` as float pairs; ranges are the core's to check."""
    if isinstance(curve, str | bytes) or not isinstance(curve, Sequence):
        raise InvalidTypeError(
            f"{name} must be a list of (size, ms) pairs, got {type(curve).__name__}"
        )
    points: list[tuple[float, float]] = []
    for index, point in enumerate(curve):
        if isinstance(point, str | bytes) or not isinstance(point, Sequence) or len(point) != 2:
            raise InvalidTypeError(f"{name}[{index}] must be a (size, ms) pair, got {point!r}")
        pair: list[float] = []
        for value in point:
            if isinstance(value, bool) or not isinstance(
                value, int | float | np.integer | np.floating
            ):
                raise InvalidTypeError(f"{name}[{index}] must hold numbers, got {point!r}")
            try:
                pair.append(float(value))
            except OverflowError:
                raise InvalidValueError(
                    f"{name}[{index}] must hold finite numbers, got {point!r}"
                ) from None
        points.append((pair[0], pair[1]))
    return points


def _float_table(value: object, name: str, ndim: int) -> npt.NDArray[np.float64]:
    """``value`` as a float64 array of ``ndim`` dimensions (a private copy)."""
    try:
        array = np.array(value, dtype=np.float64)
    except (ValueError, TypeError, OverflowError) as error:
        raise InvalidTypeError(f"{name} must be a {ndim}-D array of numbers ({error})") from None
    if array.ndim != ndim:
        raise InvalidValueError(f"{name} must be {ndim}-D, got shape {array.shape}")
    return array


class ShapeCostTables:
    """Step costs by batch shape, as vllm#52559's DFlash manager profiles them.

    ``draft_ms[b]``: the drafter's ms for ``b`` requests (1-D). ``verify_ms[b, k]``: the
    target's ms for one pass over ``b`` requests that each verify ``k`` drafts (``k + 1``
    tokens per request), ``inf`` where that shape was not profiled (2-D, ``[max_reqs + 1,
    K + 1]``). Equal token counts can cost differently in different shapes (32 requests of 16
    tokens against 128 of 4), which one curve by token count cannot express.

    av_core's planner prices a step of ``R`` requests, ``T`` non-draft tokens and ``b`` admitted
    drafts as ``draft_ms[R] + verify(T + b)`` by token count (the admitted counts differ from
    request to request). :meth:`for_batch` derives that curve for one batch size from row ``R``:
    its profiled shapes are the points ``(R (k + 1), verify_ms[R, k])``; a token count between
    two is charged at the next one up (as a captured graph pads to the next captured shape,
    which also prices a batch whose counts differ at the uniform shape it fits in), past the
    last the last segment is extended (:meth:`av_core.CostTables.from_curves` with no capture
    limit). A row is converted on first use and kept.
    """

    def __init__(self, draft_ms: npt.ArrayLike, verify_ms: npt.ArrayLike) -> None:
        draft = _float_table(draft_ms, "draft_ms", 1)
        verify = _float_table(verify_ms, "verify_ms", 2)
        if draft.size < 2 or not np.all(np.isfinite(draft) & (draft >= 0.0)):
            raise InvalidValueError(
                f"draft_ms must hold finite ms >= 0 for 0.. requests (at least 2), got {draft}"
            )
        bad = np.isnan(verify) | (verify < 0.0)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidValueError(
                f"verify_ms{list(where)} = {verify[where]}: entries must be ms >= 0, or inf "
                "for a shape not profiled"
            )
        if verify.shape[0] < 2 or verify.shape[1] < 2:
            raise InvalidValueError(
                f"verify_ms must have shape [requests + 1 >= 2, K + 1 >= 2], got {verify.shape}"
            )
        self._draft = draft
        self._verify = verify
        self._depth: tuple[Any, int | None] | None = None
        self._max_draft_depth: int | None = None
        # batch size -> (largest token count covered, tables)
        self._rows: dict[int, tuple[int, CostTables]] = {}

    @property
    def draft_ms(self) -> npt.NDArray[np.float64]:
        return self._draft.copy()

    @property
    def verify_ms(self) -> npt.NDArray[np.float64]:
        return self._verify.copy()

    @property
    def max_num_reqs(self) -> int:
        """The largest batch size both tables cover."""
        return int(min(self._draft.size, self._verify.shape[0])) - 1

    @property
    def max_draft_depth(self) -> int | None:
        """Deepest depth the draft-depth table covers (K), or None without one."""
        return self._max_draft_depth

    def with_draft_depth(
        self, draft_depth_ms: Any, *, max_depth: int | None = None
    ) -> ShapeCostTables:
        """A copy whose tables of every batch size carry a draft-cost-by-depth table (the
        arguments of :meth:`av_core.CostTables.with_draft_depth`, checked here)."""
        (cost_tables,) = _planner("CostTables")
        checked = cost_tables(self._draft, np.ones(2)).with_draft_depth(
            draft_depth_ms, max_depth=max_depth
        )
        copy = ShapeCostTables(self._draft, self._verify)
        copy._depth = (draft_depth_ms, max_depth)
        copy._max_draft_depth = checked.max_draft_depth
        return copy

    def for_batch(self, num_requests: int, num_tokens: int) -> CostTables:
        """``av_core.CostTables`` for steps of ``num_requests`` requests, with verify costs by
        token count over at least ``0..=num_tokens`` (class doc)."""
        from av_core._checks import _check_int

        requests = _check_int(num_requests, "num_requests", 1)
        tokens = _check_int(num_tokens, "num_tokens", 0)
        if requests > self.max_num_reqs:
            raise InvalidValueError(
                f"num_requests must be at most {self.max_num_reqs} (the batch sizes the cost "
                f"tables cover), got {requests}"
            )
        cached = self._rows.get(requests)
        if cached is not None and cached[0] >= tokens:
            return cached[1]
        row = self._verify[requests]
        profiled = np.flatnonzero(np.isfinite(row))
        if profiled.size < 2:
            raise InvalidValueError(
                f"verify_ms[{requests}] prices {profiled.size} shape(s) ({row}); pricing drafts "
                "needs at least two"
            )
        points = [(float(requests * (k + 1)), float(row[k])) for k in profiled]
        # Grown geometrically, so a step needing a few more tokens does not convert again.
        covered = max(tokens, int(points[-1][0]), 2 * cached[0] if cached is not None else 0)
        (cost_tables,) = _planner("CostTables")
        verify = cost_tables.from_curves(
            [(1.0, 0.0)], points, max_num_reqs=1, max_batch_tokens=covered
        ).verify_ms
        tables: CostTables = cost_tables(self._draft, verify)
        if self._depth is not None:
            tables = tables.with_draft_depth(self._depth[0], max_depth=self._depth[1])
        self._rows[requests] = (covered, tables)
        return tables


def _shape_tables(cost_tables: Any) -> ShapeCostTables | None:
    """``cost_tables`` read as tables by batch shape: a :class:`ShapeCostTables`, or a
    ``(draft_ms, verify_ms)`` pair whose verify table is 2-D (converted once per pair object:
    vLLM's manager keeps the pair it profiled until it profiles again)."""
    if isinstance(cost_tables, ShapeCostTables):
        return cost_tables
    if not (isinstance(cost_tables, tuple) and len(cost_tables) == 2):
        return None
    if np.ndim(cost_tables[1]) != 2:
        return None
    last = _ShapeCache.last
    if last is not None and last[0] is cost_tables:
        return last[1]
    shaped = ShapeCostTables(*cost_tables)
    _ShapeCache.last = (cost_tables, shaped)
    return shaped


class _ShapeCache:
    """The last ``(draft_ms, verify_ms)`` pair read by shape, and its conversion."""

    last: tuple[Any, ShapeCostTables] | None = None


def _step_cost_tables(cost_tables: Any, num_requests: int, num_tokens: int) -> Any:
    """The ``av_core.CostTables`` that price a step of ``num_requests`` requests reading verify
    costs up to ``num_tokens`` tokens, from any cost tables the budget takes."""
    shaped = _shape_tables(cost_tables)
    if shaped is not None:
        return shaped.for_batch(num_requests, num_tokens)
    return _native_cost_tables(cost_tables)


def _native_cost_tables(cost_tables: Any) -> Any:
    native = getattr(cost_tables, "native", None)
    if native is not None:
        return native
    (cost_tables_type,) = _planner("CostTables")
    if isinstance(cost_tables, cost_tables_type):
        return cost_tables
    if isinstance(cost_tables, tuple) and len(cost_tables) == 2:
        tables = []
        for name, table in zip(("draft_ms", "verify_ms"), cost_tables, strict=True):
            try:
                tables.append(np.ascontiguousarray(table, dtype=np.float64))
            except (ValueError, TypeError, OverflowError) as error:
                raise InvalidValueError(
                    f"cost_tables: {name} must be a 1-D array of numbers ({error})"
                ) from None
        return cost_tables_type(tables[0], tables[1])
    raise InvalidTypeError(
        "cost_tables must be av_core.CostTables or a (draft_ms, verify_ms) pair, got "
        f"{type(cost_tables).__name__}"
    )


def assign_draft_token_budget(
    confidence_probs: torch.Tensor,
    idx_mapping: torch.Tensor,
    capacities: torch.Tensor,
    draft_budget: int,
    num_steps: int,
) -> None:
    """vLLM's ``_assign_draft_token_budget``: admit the ``draft_budget`` best draft slots.

    Slot ``(r, k)`` scores its survival ``prod_{j <= k} confidence_probs[idx_mapping[r], j]``,
    the probability that the target accepts it; slots with ``k >= capacities[r]`` are not
    eligible. The highest scores win, ties to the shallower position and then the lower row, so
    the winners are a prefix of each request. ``capacities`` enters holding each request's
    scheduled drafts and leaves holding its admitted count, in place; the counts sum to
    ``min(draft_budget, capacities.sum())``.

    Host tensors go through av_core's Rust planner; device tensors through its torch assignment,
    which reads nothing back to the host.
    """
    confidence_probs = _check_tensor(confidence_probs, "confidence_probs")
    num_steps = _check_positive_int(num_steps, "num_steps")
    confidence_probs = _check_confidences(confidence_probs, "S", num_steps)
    idx_mapping = _check_int_tensor(idx_mapping, "idx_mapping")
    if idx_mapping.dim() != 1:
        raise InvalidValueError(f"idx_mapping must be 1-D, got shape {tuple(idx_mapping.shape)}")
    if isinstance(capacities, torch.Tensor):
        _check_output(capacities, "capacities")
    output = capacities
    # A private copy on the host (checked, then used); the result goes into the caller's tensor.
    capacities = _check_vector(capacities, "capacities", idx_mapping.shape[0])
    _check_count(draft_budget, "draft_budget")
    _check_range_on_host(idx_mapping, "idx_mapping", 0, confidence_probs.shape[0])
    _check_range_on_host(capacities, "capacities", 0, num_steps + 1)
    # A budget beyond every slot admits every slot: capped, it fits any integer type.
    budget = min(int(draft_budget), idx_mapping.shape[0] * num_steps)
    with torch.inference_mode():
        confidences = confidence_probs[idx_mapping.to(torch.int64), :num_steps]
        if capacities.device.type == "cpu" and confidences.device.type == "cpu":
            (assign,) = _planner("assign_draft_budget")
            admitted = assign(
                # float64 holds every float dtype exactly (numpy has no bfloat16).
                np.ascontiguousarray(confidences.to(torch.float64).numpy()),
                capacities.numpy().astype(np.int64),
                budget,
            )
            output.copy_(torch.from_numpy(np.asarray(admitted)))
            return
        admitted_t = _assign_on_device(confidences, capacities, budget)
        output.copy_(admitted_t)


def _assign_on_device(
    confidences: torch.Tensor, capacities: torch.Tensor, budget: int
) -> torch.Tensor:
    """The assignment in torch ops that read nothing back to the host (graph-safe), with the
    Rust planner's rule and counts (:func:`av_core.planner_torch.assign_draft_budget_torch`)."""
    from av_core.planner_torch import assign_draft_budget_torch

    return assign_draft_budget_torch(confidences, capacities, budget).to(capacities.dtype)


_INT64_MAX = 2**63 - 1


def _draft_count(draft_tokens: Mapping[str, Sequence[int]], req_id: str) -> int:
    tokens = draft_tokens.get(req_id, ())
    try:
        return len(tokens)
    except TypeError:
        raise InvalidTypeError(
            f"draft_tokens[{req_id!r}] must be a sequence of tokens, got {type(tokens).__name__}"
        ) from None


def _slot_of(req_id_to_index: Mapping[str, int], req_id: str, num_slots: int) -> int:
    if req_id not in req_id_to_index:
        raise InvalidValueError(f"req_id_to_index has no slot for request {req_id!r}")
    slot = req_id_to_index[req_id]
    name = f"req_id_to_index[{req_id!r}]"
    if isinstance(slot, bool) or not isinstance(slot, int | np.integer):
        raise InvalidTypeError(f"{name} must be an int, got {type(slot).__name__}")
    if not 0 <= slot < num_slots:
        raise InvalidValueError(
            f"{name} must lie in [0, {num_slots}) (stale_confidences rows), got {slot}"
        )
    return int(slot)


def _per_slot(value: object, name: str) -> npt.NDArray[Any]:
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as error:
        raise InvalidValueError(f"{name} must be a 1-D integer array: {error}") from None
    if array.ndim != 1:
        raise InvalidValueError(f"{name} must be 1-D (one per slot), got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise InvalidTypeError(f"{name} must hold integers, got dtype {array.dtype}")
    return array


class BatchDraftBudget(NamedTuple):
    """What vLLM's ``get_num_tokens`` computes for one step.

    ``num_tokens`` is the step's token count after trimming (what it returns);
    ``(num_drafts_per_req, num_non_draft_tokens_per_req, draft_budget)`` is what it stashes in
    ``AdaptiveVerificationManager._batch_budget`` for the compaction that follows.
    """

    num_tokens: int
    draft_budget: int
    num_drafts_per_req: dict[str, int]
    num_non_draft_tokens_per_req: dict[str, int]


def batch_draft_budget(
    num_tokens_per_req: Mapping[str, int],
    draft_tokens: Mapping[str, Sequence[int]],
    *,
    req_id_to_index: Mapping[str, int],
    stale_confidences: npt.NDArray[Any],
    num_computed_tokens: npt.NDArray[Any],
    prefill_len: npt.NDArray[Any],
    cost_tables: Any,
    max_total_logits: int,
    num_bonus_tokens: int,
) -> BatchDraftBudget:
    """The draft budget of one step, from the inputs of vLLM's ``get_num_tokens``.

    With ``R`` requests, ``T`` scheduled non-draft tokens, ``s`` requests that sample a token
    whatever the budget (computed + non-draft tokens reach the prefill length), and the
    survivals of every scheduled draft slot from the *previous* step's confidences (so the
    budget never reads this step's drafts: lossless for autoregressive drafters), sorted
    descending: ``E(b) = s + sum_{j <= b} score_j``, ``C(b) = draft_ms[R] + verify_ms[T + b]``,
    and the budget is the first ``b`` maximising ``E(b) / C(b)``, up to
    ``min(scheduled drafts, max_total_logits - R * num_bonus_tokens)`` (the sampler verifies the
    logits in one chunk). Computed by ``av_core.choose_draft_budget``.

    Args:
        num_tokens_per_req: scheduled tokens per request id, in batch order.
        draft_tokens: scheduled draft tokens per request id (absent: none).
        req_id_to_index: request id to request-state slot.
        stale_confidences: ``[max_num_reqs, K]`` confidences by slot from the previous step.
        num_computed_tokens, prefill_len: per slot.
        cost_tables: what :func:`build_cost_tables_from_curves` returned, a
            ``(draft_ms, verify_ms)`` pair, an ``av_core.CostTables``, or costs by batch
            shape (a :class:`ShapeCostTables`, or a pair whose ``verify_ms`` is 2-D,
            ``[batch size, drafts per request]``: verification is priced from the row of the
            step's ``R``).
        max_total_logits, num_bonus_tokens: the sampler's logits cap and bonus tokens per request.
    """
    metrics = vllm_metrics.current()
    started = time.perf_counter() if metrics is not None else 0.0
    if not isinstance(num_tokens_per_req, Mapping):
        raise InvalidTypeError(
            f"num_tokens_per_req must be a mapping, got {type(num_tokens_per_req).__name__}"
        )
    for name, mapping in (("draft_tokens", draft_tokens), ("req_id_to_index", req_id_to_index)):
        if not isinstance(mapping, Mapping):
            raise InvalidTypeError(f"{name} must be a mapping, got {type(mapping).__name__}")
    max_total_logits = _check_count(max_total_logits, "max_total_logits")
    num_bonus_tokens = _check_count(num_bonus_tokens, "num_bonus_tokens")
    req_ids = list(num_tokens_per_req)
    num_reqs = len(req_ids)
    tokens_list = [
        _check_count(num_tokens_per_req[req_id], f"num_tokens_per_req[{req_id!r}]")
        for req_id in req_ids
    ]
    drafts_list = [_draft_count(draft_tokens, req_id) for req_id in req_ids]
    for req_id, tokens, drafts in zip(req_ids, tokens_list, drafts_list, strict=True):
        if tokens < drafts:
            raise InvalidValueError(
                f"num_tokens_per_req[{req_id!r}] = {tokens} is less than its {drafts} draft tokens"
            )
    if sum(tokens_list) > _INT64_MAX:
        raise InvalidValueError(
            f"num_tokens_per_req: {sum(tokens_list)} tokens in all exceed int64 (2**63 - 1)"
        )
    non_draft_list = [t - d for t, d in zip(tokens_list, drafts_list, strict=True)]
    num_drafts_per_req = dict(zip(req_ids, drafts_list, strict=True))
    num_non_draft_per_req = dict(zip(req_ids, non_draft_list, strict=True))
    # Python integers: a sum of int64 entries could wrap.
    total_non_draft = sum(non_draft_list)
    total_drafts = sum(drafts_list)
    max_draft_budget = min(total_drafts, max(0, max_total_logits - num_reqs * num_bonus_tokens))
    if max_draft_budget == 0:
        budget = 0
    else:
        stale = np.asarray(stale_confidences)
        if stale.ndim != 2:
            raise InvalidValueError(
                f"stale_confidences must have shape [max_num_reqs, K], got shape {stale.shape}"
            )
        computed = _per_slot(num_computed_tokens, "num_computed_tokens")
        prefill = _per_slot(prefill_len, "prefill_len")
        slots = np.asarray(
            [_slot_of(req_id_to_index, req_id, stale.shape[0]) for req_id in req_ids],
            dtype=np.int64,
        )
        for name, array in (("num_computed_tokens", computed), ("prefill_len", prefill)):
            if slots.size and array.shape[0] <= int(slots.max()):
                raise InvalidValueError(
                    f"{name} has {array.shape[0]} entries, slot {int(slots.max())} is used"
                )
        # Compared as Python integers: computed + non-draft tokens can exceed int64.
        num_sampling = sum(
            int(computed[slot]) + non_draft >= int(prefill[slot])
            for slot, non_draft in zip(slots.tolist(), non_draft_list, strict=True)
        )
        (choose,) = _planner("choose_draft_budget")
        budget = int(
            choose(
                np.ascontiguousarray(stale[slots]),
                np.asarray(drafts_list, dtype=np.int64),
                num_non_draft_tokens=total_non_draft,
                num_sampling_requests=num_sampling,
                cost_tables=_step_cost_tables(
                    cost_tables, num_reqs, total_non_draft + max_draft_budget
                ),
                max_draft_budget=max_draft_budget,
            )
        )
    plan = BatchDraftBudget(
        total_non_draft + budget, budget, num_drafts_per_req, num_non_draft_per_req
    )
    if metrics is None:
        return plan
    cost = _predicted_cost_ms(cost_tables, num_reqs, plan.num_tokens)
    metrics.host_time(vllm_metrics.BUDGET, time.perf_counter() - started)
    metrics.budget_chosen(plan.draft_budget, cost)
    return plan


def _predicted_cost_ms(cost_tables: Any, num_reqs: int, num_tokens: int) -> float | None:
    """``draft_ms[R] + verify_ms[T + b]``: the planner's cost of the step it chose (metrics)."""
    shaped = _shape_tables(cost_tables)
    if shaped is not None:
        if not 1 <= num_reqs <= shaped.max_num_reqs:
            return None
        try:
            native = shaped.for_batch(num_reqs, num_tokens)
        except ValueError:  # a row without two profiled shapes prices nothing
            return None
        draft_ms, verify_ms = native.draft_ms, native.verify_ms
    elif isinstance(cost_tables, tuple) and len(cost_tables) == 2:
        draft_ms, verify_ms = cost_tables
    else:
        native = _native_cost_tables(cost_tables)
        draft_ms, verify_ms = native.draft_ms, native.verify_ms
    if num_reqs >= len(draft_ms) or num_tokens >= len(verify_ms):
        return None
    return float(draft_ms[num_reqs]) + float(verify_ms[num_tokens])
