"""Drafting-depth control inside vLLM (``AV_CORE_VLLM_DEPTH=batch|per_request``), installed by
:mod:`av_core.vllm.plugin`: :func:`install_depth_control` wraps ``propose`` of vLLM's
autoregressive speculators (EAGLE/MTP ``TargetDependentARSpeculator``,
``StandaloneARSpeculator``, ``MultiModuleMTPSpeculator``): before drafting, a
:class:`~av_core.vllm.depth.DraftDepthHook` catches up on the confidences vLLM's
``AdaptiveVerificationManager`` has copied to the host (two proposals back; so vLLM's adaptive
verification must be on), chooses the depth from them and the manager's profiled cost tables,
passes it as ``num_speculative_tokens`` and marks undrafted positions ``-1``. The manager's
``record_confidences`` and ``add_request`` are wrapped to tell the hook which depths each
proposal drafted and when a new request takes a slot. ``AV_CORE_VLLM_DRAFTER``
(``autoregressive``, the default, or ``parallel``) gives the shape of the drafter's cost by
depth; tables whose verify costs go by batch size and K price each decision with its batch
size's row. Everything it wraps is checked first (a changed signature, a speculator that stops
drafting on its own: refused by name, nothing patched); a subclass with its own definition of a
wrapped method gets the same wrapper when that definition keeps the contract, else is refused
by name when built (:mod:`av_core.vllm.patching`)."""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from av_core import _settings as settings
from av_core._engine_interface import (
    InterfaceReport,
    parse_signature,
    record_signature,
    resolve,
    signature_text,
)
from av_core.vllm.interface import (
    BUDGET_MODULE,
    PatchTarget,
    VllmCompatibilityError,
    confidence_stops,
    cost_table_layout,
    overrides,
)

if TYPE_CHECKING:
    from av_core.vllm.patching import Replacement

logger = logging.getLogger("vllm.av_core")

ENV_DEPTH = settings.VLLM_DEPTH.name


ENV_DRAFTER = settings.VLLM_DRAFTER.name


#: The speculators whose ``propose`` depth control wraps: (module, class). Each ``propose`` takes
#: ``input_batch`` first and a ``num_speculative_tokens=None`` keyword (checked before patching,
#: and against the released source by tests/vllm/test_vllm_contract.py).
DEPTH_SPECULATORS = (
    (
        "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator",
        "TargetDependentARSpeculator",
    ),
    ("vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator", "StandaloneARSpeculator"),
    ("vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator", "MultiModuleMTPSpeculator"),
)


#: Attributes of ``AdaptiveVerificationManager`` that depth control reads (set in its
#: ``__init__`` and profiling in vLLM 0.33.0).
DEPTH_READS = ("cost_tables", "_stale_confidences", "_stale_idx")


#: ``AdaptiveVerificationManager`` methods depth control wraps, with their 0.33.0 signatures.
DEPTH_MANAGER_SIGNATURES = {
    "AdaptiveVerificationManager.record_confidences": "(self, confidence_probs, input_batch)",
    "AdaptiveVerificationManager.add_request": "(self, req_idx)",
}


class _DepthState:
    """The process's depth hook and the vLLM manager it reads (one model runner per process)."""

    hook: Any = None
    manager: Any = None
    tables_source: Any = None
    # The requests and depths of the `propose` that ran last, noted at the next
    # `record_confidences` (the call that starts copying that proposal's confidences).
    last: tuple[Any, Any] | None = None


def _record_manager(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``AdaptiveVerificationManager.__init__`` to remember the instance."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _DepthState.manager = self

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def _record_confidences(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``AdaptiveVerificationManager.record_confidences``: the proposal that just ran is
    the one whose confidences this call starts copying to the host."""

    def record_confidences(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        hook, last = _DepthState.hook, _DepthState.last
        if hook is not None and last is not None:
            hook.proposed(*last)
        _DepthState.last = None

    record_confidences.__wrapped__ = original  # type: ignore[attr-defined]
    return record_confidences


def _add_request(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``AdaptiveVerificationManager.add_request``: a new request in a slot starts at 1.0
    in the hook too."""

    def add_request(self: Any, req_idx: int, *args: Any, **kwargs: Any) -> None:
        original(self, req_idx, *args, **kwargs)
        if _DepthState.hook is not None:
            _DepthState.hook.add_request(int(req_idx))

    add_request.__wrapped__ = original  # type: ignore[attr-defined]
    return add_request


def _depth_hook(manager: Any, num_speculative_steps: int) -> Any:
    """The hook, built on first use from vLLM's profiled tables (rebuilt if they change)."""
    from av_core import CostTables
    from av_core.vllm.budget import ShapeCostTables, _shape_tables
    from av_core.vllm.depth import DraftDepthHook

    tables = manager.cost_tables
    if _DepthState.hook is None or _DepthState.tables_source is not tables:
        costs: CostTables | ShapeCostTables
        if cost_table_layout(tables, type(manager).__name__) == "shape":
            shaped = _shape_tables(tables)
            assert shaped is not None  # the layout says so
            costs = shaped.with_draft_depth(_drafter_kind(), max_depth=num_speculative_steps)
        else:
            draft_ms, verify_ms = (np.asarray(t, dtype=np.float64) for t in tables)
            costs = CostTables(draft_ms, verify_ms).with_draft_depth(
                _drafter_kind(), max_depth=num_speculative_steps
            )
        _DepthState.hook = DraftDepthHook(
            costs,
            manager._stale_confidences[0].np.shape[0],
            num_speculative_steps,
            mode="per_request" if _depth_mode() == "per_request" else "batch",
        )
        _DepthState.tables_source = tables
    return _DepthState.hook


def _depth_propose(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a speculator's ``propose``: choose the depth first, draft that deep, mask the rest."""

    def propose(self: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        manager = _DepthState.manager
        k = self.num_speculative_steps
        given = kwargs.get("num_speculative_tokens")
        limit = k if given is None else int(given)
        slots = np.asarray(input_batch.idx_mapping_np[: input_batch.num_reqs], dtype=np.int64)
        if (
            manager is None
            or getattr(manager, "cost_tables", None) is None
            or kwargs.get("dummy_run")
            or limit == 0
        ):
            if not kwargs.get("dummy_run"):
                _DepthState.last = (slots, np.full(slots.size, min(limit, k)))
            return original(self, input_batch, *args, **kwargs)
        hook = _depth_hook(manager, k)
        hook.catch_up(manager._stale_confidences[manager._stale_idx].np)
        depth = hook.num_speculative_tokens(
            slots,
            limit=limit,
            num_non_draft_tokens=len(slots),
            num_sampling_requests=len(slots),
        )
        kwargs["num_speculative_tokens"] = depth
        draft_tokens = original(self, input_batch, *args, **kwargs)
        if depth < limit:
            draft_tokens[:, depth:] = -1
        hook.mask(draft_tokens)
        _DepthState.last = (slots, hook.last_depths)
        return draft_tokens

    propose.__wrapped__ = original  # type: ignore[attr-defined]
    return propose


def _depth_mode() -> str:
    """``off``, ``batch`` or ``per_request`` from ``AV_CORE_VLLM_DEPTH`` (a switch's on
    spellings mean batch, its off spellings off; checked by :func:`install_depth_control`)."""
    return settings.VLLM_DEPTH.get()


def _drafter_kind() -> str:
    return settings.VLLM_DRAFTER.get()


def _propose_contract(method: Any, where: str) -> list[str]:
    """How a speculator's ``propose`` departs from what depth control wraps: ``input_batch``
    first and a ``num_speculative_tokens=None`` it can pass by keyword, and no early stop of
    its own."""
    try:
        text = signature_text(method)
    except (TypeError, ValueError) as error:
        return [f"{where}: not inspectable ({error})"]
    problems = []
    parameters = parse_signature(text)
    depth = next((p for p in parameters if p.name == "num_speculative_tokens"), None)
    if (
        [p.name for p in parameters[:2]] != ["self", "input_batch"]
        or depth is None
        or depth.default != "None"
        or depth.kind == "positional_only"
    ):
        problems.append(
            f"{where}{text}: expected (self, input_batch, ..., num_speculative_tokens=None)"
        )
    stops = confidence_stops(method)
    if stops:
        problems.append(
            f"{where} stops drafting early on its own ({', '.join(stops)}: a "
            "DraftConfidenceStop): the depth it drafts is not the depth av_core chose, so "
            "the hook would record confidences for positions never drafted"
        )
    return problems


def _manager_contract(dotted: str) -> Callable[[Any, str], list[str]]:
    """The contract of a manager method depth control wraps: its signature (the wrapper
    passes any further argument through)."""

    def contract(method: Any, where: str) -> list[str]:
        report = InterfaceReport([], [])
        try:
            found = signature_text(method)
        except (TypeError, ValueError) as error:
            return [f"{where}: not inspectable ({error})"]
        record_signature(report, where, DEPTH_MANAGER_SIGNATURES[dotted], found)
        return report.problems

    return contract


def _depth_targets(modules: Mapping[str, ModuleType]) -> list[PatchTarget]:
    """What depth control wraps, as far as present: each speculator's ``propose`` and the
    manager's ``record_confidences`` and ``add_request``."""
    targets = [
        PatchTarget(
            owner, f"{module_name}.{class_name}", "propose", _propose_contract, _depth_propose
        )
        for module_name, class_name in DEPTH_SPECULATORS
        if isinstance(owner := getattr(modules[module_name], class_name, None), type)
    ]
    manager = modules[BUDGET_MODULE].AdaptiveVerificationManager
    for attribute, wrap in (
        ("record_confidences", _record_confidences),
        ("add_request", _add_request),
    ):
        dotted = f"AdaptiveVerificationManager.{attribute}"
        targets.append(
            PatchTarget(
                manager,
                f"{BUDGET_MODULE}.AdaptiveVerificationManager",
                attribute,
                _manager_contract(dotted),
                wrap,
            )
        )
    return targets


def _depth_problems(
    modules: Mapping[str, ModuleType], report: InterfaceReport | None = None
) -> list[str]:
    report = report if report is not None else InterfaceReport([], [])
    problems = []
    for module_name, class_name in DEPTH_SPECULATORS:
        where = f"{module_name}.{class_name}.propose"
        try:
            propose = resolve(modules[module_name], f"{class_name}.propose")
        except (AttributeError, KeyError) as error:
            problems.append(f"{where}: not found ({error})")
            continue
        problems += _propose_contract(propose, where)
    from av_core.vllm.plugin import _signature_problems

    problems += _signature_problems(
        modules,
        {(BUDGET_MODULE, dotted): text for dotted, text in DEPTH_MANAGER_SIGNATURES.items()},
        report,
    )
    return problems


def install_depth_control() -> list[Replacement]:
    """Checks the speculators and wraps their ``propose`` with drafting-depth control (module
    doc); raises :class:`VllmCompatibilityError` and patches nothing on any difference, and
    ``SettingError`` for a value of ``AV_CORE_VLLM_DEPTH`` or ``AV_CORE_VLLM_DRAFTER`` it does
    not take. Idempotent."""
    from av_core.vllm.patching import (
        Replacement,
        apply,
        installed,
        override_plan,
        subclass_guard,
    )

    done = [entry for entry in installed() if entry.attribute == "propose"]
    if done:
        return done
    settings.check((settings.VLLM_DEPTH, settings.VLLM_DRAFTER, settings.SIMD))
    names = [module for module, _ in DEPTH_SPECULATORS] + [BUDGET_MODULE]
    modules = {name: importlib.import_module(name) for name in names}
    problems = _depth_problems(modules)
    if problems:
        raise VllmCompatibilityError(
            f"av_core's drafting-depth control ({ENV_DEPTH}) cannot run on this vLLM; nothing "
            "was patched. Differences:\n  - " + "\n  - ".join(problems)
        )
    manager = modules[BUDGET_MODULE].AdaptiveVerificationManager
    owner_name = f"{BUDGET_MODULE}.AdaptiveVerificationManager"
    plan = [
        Replacement(
            manager,
            owner_name,
            "__init__",
            inspect.getattr_static(manager, "__init__"),
            _record_manager(inspect.getattr_static(manager, "__init__")),
        )
    ]
    targets = _depth_targets(modules)
    for target in targets:
        original = inspect.getattr_static(target.owner, target.attribute)
        plan.append(
            Replacement(
                target.owner,
                target.owner_name,
                target.attribute,
                original,
                target.patch(original),
            )
        )
    plan += override_plan(overrides(targets))
    plan += subclass_guard(targets)
    apply(plan, "depth control wraps")
    return [entry for entry in plan if entry.attribute == "propose"]
