"""What av_core's vLLM plugin reads in vLLM's source before patching, beyond signatures and
constants: what vLLM's own bodies of the functions it replaces do (:data:`REPLACED_BODIES`: a
broadcast from rank 0, another attribute, helper or ``_batch_budget`` layout would be dropped),
the subclasses that override what it patches (:func:`classify_override`: each is patched the
same way when its own definition keeps the contract, else refused when constructed), an
early-stopping drafter inside a ``propose`` that depth control wraps, and the layout of the cost
tables it reads. ``docs/vllm.md`` lists the upstream changes each of these catches."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import numpy as np

from av_core._engine_interface import InterfaceReport, overriding_subclasses, resolve
from av_core._native import Error

ESTIMATOR_MODULE = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator"


BUDGET_MODULE = "vllm.v1.worker.gpu.spec_decode.adaptive_verification"


#: What vLLM's own bodies of the functions av_core replaces do in every checked release (0.32.x,
#: 0.33.0; tests/vllm/test_vllm_contract.py reads them from the wheels): the attributes of ``self``
#: they touch and the functions they call (each callee's last name). A body that does more (a
#: broadcast, a new attribute, another helper) holds behaviour the replacement would drop, so
#: the install is refused naming it.
REPLACED_BODIES: dict[tuple[str, str], tuple[frozenset[str], frozenset[str]]] = {
    (BUDGET_MODULE, "AdaptiveVerificationManager.get_num_tokens"): (
        frozenset(
            {
                "_batch_budget",
                "_max_total_logits",
                "_stale_confidences",
                "_stale_idx",
                "cost_tables",
                "num_bonus_tokens",
                "num_speculative_steps",
                "req_states",
            }
        ),
        frozenset(
            {
                "arange",
                "argmax",
                "astype",
                "concatenate",
                "count_nonzero",
                "cumprod",
                "cumsum",
                "fromiter",
                "get",
                "int",
                "len",
                "list",
                "map",
                "max",
                "min",
                "sort",
                "sum",
                "values",
                "zip",
            }
        ),
    ),
    (BUDGET_MODULE, "_assign_draft_token_budget"): (
        frozenset(),
        frozenset(
            {
                "arange",
                "cumprod",
                "flatten",
                "float",
                "index_fill_",
                "masked_fill",
                "sum",
                "topk",
                "view_as",
                "zeros_like",
            }
        ),
    ),
    (BUDGET_MODULE, "build_cost_tables_from_curves"): (
        frozenset(),
        frozenset(
            {
                "accumulate",
                "any",
                "arange",
                "asarray",
                "build_table",
                "interp",
                "len",
                "maximum",
                "minimum",
                "searchsorted",
            }
        ),
    ),
}


#: Calls that communicate across ranks (or fetch the group to): inside a replaced body they are
#: a decision made on one rank and shared (vllm#56831 broadcasts the budget from rank 0).
COLLECTIVES = frozenset(
    {
        "all_gather",
        "all_gather_object",
        "all_reduce",
        "barrier",
        "broadcast",
        "broadcast_object",
        "broadcast_object_list",
        "get_dp_group",
        "get_tp_group",
        "get_world_group",
        "reduce",
        "scatter",
    }
)


#: ``_batch_budget`` as vLLM's compaction reads it and av_core's ``get_num_tokens`` writes it:
#: (drafts per request, non-draft tokens per request, budget).
BATCH_BUDGET_ARITY = 3


#: Modules that may define subclasses of what av_core patches (imported, when present, before
#: the check for overrides): vllm#52559's DFlash manager overrides ``get_num_tokens``.
SUBCLASS_MODULES = ("vllm.v1.worker.gpu.spec_decode.dflash.adaptive_k",)


class VllmCompatibilityError(Error, RuntimeError):
    """vLLM's interfaces differ from those av_core's drop-ins mirror; nothing was patched. An
    ``av_core.Error`` and a ``RuntimeError``."""


def callee_names(function: ast.AST) -> set[str]:
    """The last name of every callee in ``function`` (``np.cumsum(...)`` → ``cumsum``)."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            callee = node.func
            if isinstance(callee, ast.Name):
                names.add(callee.id)
            elif isinstance(callee, ast.Attribute):
                names.add(callee.attr)
    return names


def self_attributes(function: ast.AST) -> set[str]:
    """The attributes of ``self`` that ``function`` reads or writes."""
    return {
        node.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


def parsed(function: Any) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None


def replaced_body_problems(
    function: Any, where: str, attributes: frozenset[str], calls: frozenset[str]
) -> list[str] | None:
    """What ``function``'s body does beyond ``attributes`` of ``self`` and ``calls`` (one entry
    of :data:`REPLACED_BODIES`): a collective, another helper or attribute, another
    ``_batch_budget`` layout. ``None`` when its source cannot be read."""
    tree = parsed(function)
    if tree is None:
        return None
    problems: list[str] = []
    called = callee_names(tree)
    shared = sorted(called & COLLECTIVES)
    if shared:
        problems.append(
            f"{where} communicates across ranks ({', '.join(shared)}): av_core's "
            "replacement would drop that (vLLM deciding on rank 0 and broadcasting it, as "
            "vllm#56831 does for the draft budget)"
        )
    extra_calls = sorted(called - calls - COLLECTIVES)
    if extra_calls:
        problems.append(
            f"{where} calls {', '.join(extra_calls)}, which av_core's replacement does not"
        )
    extra_attributes = sorted(self_attributes(tree) - attributes)
    if extra_attributes:
        problems.append(
            f"{where} uses self.{', self.'.join(extra_attributes)}, which av_core's "
            "replacement ignores"
        )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Tuple)
            and any(
                isinstance(t, ast.Attribute) and t.attr == "_batch_budget" for t in node.targets
            )
            and len(node.value.elts) != BATCH_BUDGET_ARITY
        ):
            problems.append(
                f"{where} stores a {len(node.value.elts)}-tuple in _batch_budget; av_core's "
                "replacement stores (drafts per request, non-draft tokens per request, budget)"
            )
    return problems


def body_problems(modules: Mapping[str, ModuleType], report: InterfaceReport) -> list[str]:
    """What the bodies av_core replaces do beyond :data:`REPLACED_BODIES` (module doc), and
    whether vLLM still reads ``_batch_budget`` as av_core writes it."""
    problems: list[str] = []
    for (module_name, dotted), (attributes, calls) in REPLACED_BODIES.items():
        where = f"{module_name}.{dotted}"
        try:
            function = resolve(modules[module_name], dotted)
        except (AttributeError, KeyError):
            continue  # reported by the signature check
        found = replaced_body_problems(function, where, attributes, calls)
        if found is None:
            report.accepted.append(f"{where}: source not readable, its body is not checked")
            continue
        problems += found
    manager = getattr(modules.get(BUDGET_MODULE), "AdaptiveVerificationManager", None)
    if isinstance(manager, type):
        import_subclass_modules()
        for cls in [manager, *_subclasses(manager)]:
            problems += _budget_unpacking(cls, report)
    return problems


def _subclasses(owner: type) -> list[type]:
    """Every class below ``owner`` that exists now, each once."""
    found: dict[int, type] = {}
    pending: list[type] = list(type.__subclasses__(owner))
    while pending:
        cls = pending.pop()
        if id(cls) not in found:
            found[id(cls)] = cls
            pending.extend(type.__subclasses__(cls))
    return list(found.values())


def _budget_unpacking(cls: type, report: InterfaceReport) -> list[str]:
    """Where ``cls``'s own source unpacks ``_batch_budget`` into other than
    :data:`BATCH_BUDGET_ARITY` values (vLLM's compaction reads what av_core's
    ``get_num_tokens`` stores)."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    tree = parsed(cls)
    if tree is None:
        report.accepted.append(
            f"{name}: source not readable, its reads of _batch_budget are not checked"
        )
        return []
    problems = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)):
            continue
        value = node.value
        reads_budget = (isinstance(value, ast.Name) and value.id == "batch_budget") or (
            isinstance(value, ast.Attribute) and value.attr == "_batch_budget"
        )
        arity = len(node.targets[0].elts)
        if reads_budget and arity != BATCH_BUDGET_ARITY:
            problems.append(
                f"{name} unpacks _batch_budget into {arity} values ({ast.unparse(node)}); "
                f"av_core's get_num_tokens stores {BATCH_BUDGET_ARITY}"
            )
    return problems


@dataclass(frozen=True)
class PatchTarget:
    """A method av_core patches on ``owner``. ``contract(method, where)`` lists how a
    subclass's own definition of it departs from what the patch stands in for (its signature,
    and for a replaced body what the body does); when it lists nothing, ``patch(method)`` is
    what the subclass gets, as the base does."""

    owner: type
    owner_name: str
    attribute: str
    contract: Callable[[Any, str], list[str]]
    patch: Callable[[Any], Any]


@dataclass(frozen=True)
class Override:
    """A subclass's own definition of what a :class:`PatchTarget` patches: ``calls_super``
    (the base's patch runs through it), else patched (``problems`` empty) or refused."""

    cls: type
    name: str
    target: PatchTarget
    calls_super: bool
    problems: tuple[str, ...]

    @property
    def method(self) -> Any:
        return vars(self.cls)[self.target.attribute]


def import_subclass_modules() -> None:
    """Imports :data:`SUBCLASS_MODULES` where present, so their subclasses are seen."""
    for module_name in SUBCLASS_MODULES:
        if module_name in sys.modules:
            continue
        try:
            if importlib.util.find_spec(module_name) is not None:
                importlib.import_module(module_name)
        except (ImportError, ValueError, VllmCompatibilityError):
            continue  # vLLM cannot import it either


def classify_override(cls: type, target: PatchTarget) -> Override:
    """How av_core treats ``cls``'s own ``target.attribute`` (see :class:`Override`)."""
    method = vars(cls)[target.attribute]
    name = f"{cls.__module__}.{cls.__qualname__}"
    if calls_super(method, target.attribute):
        return Override(cls, name, target, True, ())
    where = f"{name}.{target.attribute}"
    return Override(cls, name, target, False, tuple(target.contract(method, where)))


def overrides(targets: list[PatchTarget]) -> list[Override]:
    """Every subclass (as far as imported, :data:`SUBCLASS_MODULES` included) that defines what
    a target patches, classified."""
    import_subclass_modules()
    return [
        classify_override(cls, target)
        for target in targets
        for cls in overriding_subclasses(target.owner, target.attribute)
    ]


def calls_super(method: Any, attribute: str) -> bool:
    tree = parsed(method)
    return tree is not None and any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attribute
        and isinstance(node.func.value, ast.Call)
        and ast.unparse(node.func.value.func) == "super"
        for node in ast.walk(tree)
    )


def cost_table_layout(cost_tables: Any, owner: str) -> Literal["tokens", "shape"]:
    """How ``owner``'s cost tables price verification: ``"tokens"``, a verify table by token
    count (vLLM 0.32.x/0.33.0), or ``"shape"``, by batch size and drafts per request
    (vllm#52559's DFlash profile, read through :class:`av_core.vllm.budget.ShapeCostTables`).
    Any other layout is refused by name, never read as one of these."""
    from av_core import CostTables
    from av_core.vllm.budget import ShapeCostTables

    if isinstance(cost_tables, ShapeCostTables):
        return "shape"
    if isinstance(cost_tables, CostTables):
        return "tokens"
    shapes = [np.shape(table) for table in cost_tables] if isinstance(cost_tables, tuple) else None
    if shapes is not None and len(shapes) == 2 and len(shapes[0]) == 1:
        if len(shapes[1]) in (1, 2):
            return "tokens" if len(shapes[1]) == 1 else "shape"
    raise VllmCompatibilityError(
        f"{owner}.cost_tables have shapes {shapes}; av_core reads a drafter table by batch size "
        "with a verify table by token count (1-D) or by batch size and drafts per request "
        "(2-D, as vllm#52559's DFlash manager profiles it), not this"
    )


#: What an early-stopping drafter calls inside ``propose`` (vLLM's ``DraftConfidenceStop``, on a
#: branch, vllm-project/vllm 41f9ab88bf8c4dd4f2d22f31d625006a9619b612: ``propose`` begins the
#: round, or drafts it whole, and hands the stop to the decode loop, which ends the round once
#: no chain's top-1 probability reaches a threshold).
CONFIDENCE_STOP_CALLS = frozenset(
    {"should_continue", "begin_round", "full_round", "num_verifiable_drafts"}
)

#: The speculator's attribute holding that stop.
CONFIDENCE_STOP_ATTRIBUTE = "confidence_stop"


def confidence_stops(propose: Any) -> list[str]:
    """The signs in ``propose``'s own source that it stops drafting on its own: the stop's
    calls, and ``self.confidence_stop`` (passed on to a helper that stops)."""
    tree = parsed(propose)
    if tree is None:
        return []
    found = callee_names(tree) & CONFIDENCE_STOP_CALLS
    if CONFIDENCE_STOP_ATTRIBUTE in self_attributes(tree):
        found.add(f"self.{CONFIDENCE_STOP_ATTRIBUTE}")
    return sorted(found)
