"""What av_core's vLLM plugin reads in vLLM's source before patching, beyond signatures and
constants: what vLLM's own bodies of the functions it replaces do (:data:`REPLACED_BODIES`: a
broadcast from rank 0, another attribute, helper or ``_batch_budget`` layout would be dropped),
the subclasses that override what it patches, an early-stopping drafter inside a ``propose`` that
depth control wraps, and the shape of the cost tables it reads. ``docs/vllm.md`` lists the
upstream changes each of these catches."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from av_core._engine_interface import InterfaceReport, overriding_subclasses, resolve
from av_core._native import Error

ESTIMATOR_MODULE = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator"


BUDGET_MODULE = "vllm.v1.worker.gpu.spec_decode.adaptive_verification"


#: What vLLM's own bodies of the functions av_core replaces do in every checked release (0.32.x,
#: 0.33.0; tests/test_vllm_contract.py reads them from the wheels): the attributes of ``self``
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


def body_problems(modules: Mapping[str, ModuleType], report: InterfaceReport) -> list[str]:
    """What the bodies av_core replaces do beyond :data:`REPLACED_BODIES` (module doc), and
    whether vLLM still reads ``_batch_budget`` as av_core writes it."""
    problems: list[str] = []
    for (module_name, dotted), (attributes, calls) in REPLACED_BODIES.items():
        where = f"{module_name}.{dotted}"
        try:
            tree = parsed(resolve(modules[module_name], dotted))
        except (AttributeError, KeyError):
            continue  # reported by the signature check
        if tree is None:
            report.accepted.append(f"{where}: source not readable, its body is not checked")
            continue
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
                    "replacement stores (drafts per request, non-draft tokens per request, "
                    "budget)"
                )
    manager = getattr(modules.get(BUDGET_MODULE), "AdaptiveVerificationManager", None)
    tree = parsed(manager) if manager is not None else None
    if manager is not None and tree is None:
        report.accepted.append(
            f"{BUDGET_MODULE}.AdaptiveVerificationManager: source not readable, its reads of "
            "_batch_budget are not checked"
        )
    for node in ast.walk(tree) if tree is not None else ():
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)):
            continue
        value = node.value
        reads_budget = (isinstance(value, ast.Name) and value.id == "batch_budget") or (
            isinstance(value, ast.Attribute) and value.attr == "_batch_budget"
        )
        arity = len(node.targets[0].elts)
        if reads_budget and arity != BATCH_BUDGET_ARITY:
            problems.append(
                f"{BUDGET_MODULE}.AdaptiveVerificationManager unpacks _batch_budget into "
                f"{arity} values ({ast.unparse(node)}); av_core's get_num_tokens stores "
                f"{BATCH_BUDGET_ARITY}"
            )
    return problems


def override_problems(targets: list[tuple[type, str, str]], report: InterfaceReport) -> list[str]:
    """Subclasses (as far as imported) that define what av_core patches on their base: the
    patch never runs for them. One that calls the base's method through ``super()`` keeps it
    running and is accepted."""
    for module_name in SUBCLASS_MODULES:
        if module_name in sys.modules:
            continue
        try:
            if importlib.util.find_spec(module_name) is not None:
                importlib.import_module(module_name)
        except (ImportError, ValueError, VllmCompatibilityError):
            continue  # vLLM cannot import it either
    problems = []
    for owner, owner_name, attribute in targets:
        for cls in overriding_subclasses(owner, attribute):
            name = f"{cls.__module__}.{cls.__qualname__}"
            if calls_super(vars(cls)[attribute], attribute):
                report.accepted.append(f"{name}.{attribute} overrides and calls super()")
                continue
            problems.append(
                f"{name} overrides {attribute}: av_core's replacement of "
                f"{owner_name}.{attribute} would never run for it"
            )
    return problems


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


def check_one_dimensional(cost_tables: Any, owner: str) -> None:
    """av_core prices verification by token count: a verify table of another shape (vllm#52559's
    DFlash manager keeps one by batch size and K) is refused by name, never read as if flat."""
    shapes = [np.shape(table) for table in cost_tables]
    if len(shapes) != 2 or any(len(shape) != 1 for shape in shapes):
        raise VllmCompatibilityError(
            f"{owner}.cost_tables have shapes {shapes}; av_core prices drafting by batch size "
            "and verification by token count (two 1-D tables): a verify table by batch size "
            "and K, as vllm#52559's DFlashAdaptiveKManager keeps, is not one it can read"
        )


#: What an early-stopping drafter calls inside ``propose`` (vLLM's ``DraftConfidenceStop``, on a
#: branch: the round ends once no chain's top-1 probability reaches a threshold).
CONFIDENCE_STOP_CALLS = frozenset({"should_continue", "begin_round", "num_verifiable_drafts"})


def confidence_stops(propose: Any) -> list[str]:
    tree = parsed(propose)
    if tree is None:
        return []
    return sorted(callee_names(tree) & CONFIDENCE_STOP_CALLS)
