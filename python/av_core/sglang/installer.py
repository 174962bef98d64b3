"""Installing :class:`~av_core.sglang.policy.CostAwarePolicy` into a running SGLang.

With ``AV_CORE_SGLANG=1`` the ``sglang.srt.plugins`` entry point (:func:`register`, which SGLang
calls in every scheduler process before building its workers) runs :func:`install`: it checks
SGLang's version and every signature and call site the policy relies on
(:func:`interface_report`) and, on any change that matters, raises
:class:`SglangCompatibilityError` listing them and patches nothing (SGLang logs the error and
keeps its own policy). A change is *additive* when every call the known interface allows keeps
its meaning (a new optional parameter such as main's ``num_steps=None``, a new protocol method
av_core's policy implements such as ``on_state_activated``, a newer version): accepted and
logged; anything else (removed, renamed, moved or newly required parameters, another default, a
protocol member av_core's policy lacks, a construction site building another policy) is
refused by name. SGLang 0.5.23 and main (:data:`MAIN_REVISION`) are the revisions known.

Compatible, it rebinds SGLang's policy classes where SGLang builds them from
(``AdaptiveSpeculativeParams`` in ``eagle_worker_v2``; main's ``ThroughputAwarePolicy`` in its
module, imported when built) to factories that build av_core's policy with the candidate steps
of SGLang's own adaptive config (per batch-size tier, so the same runtime states and CUDA graphs
are built) and the cost tables of ``AV_CORE_SGLANG_COSTS`` (a ``CostTables.to_json`` file or an
``av-core profile`` cost file), or, without tables on SGLang main (or with
``AV_CORE_SGLANG_PROFILE=1``), :class:`~av_core.sglang.policy.ProfilingCostAwarePolicy`, priced
from SGLang's start-up profiling. ``docs/sglang.md`` has the details. Nothing here imports
SGLang until :func:`install` runs.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from av_core import _native
from av_core._engine_interface import (
    InterfaceReport,
    check_signature,
    compare_signatures,
    engine_version,
    older_than,
    record_signature,
    resolve,
    signature_text,
)
from av_core._env import env_flag
from av_core._native import CostTables
from av_core.sglang.policy import (
    CostAwarePolicy,
    ProfilePlan,
    ProfilePoint,
    ProfilingCostAwarePolicy,
    config_candidate_steps,
    load_cost_tables,
)

logger = logging.getLogger("sglang.av_core")

ENV_ENABLE = "AV_CORE_SGLANG"
ENV_COSTS = "AV_CORE_SGLANG_COSTS"
ENV_DRAFTER = "AV_CORE_SGLANG_DRAFTER"
ENV_MAX_BATCH = "AV_CORE_SGLANG_MAX_BATCH"
ENV_ANY_VERSION = "AV_CORE_SGLANG_ANY_VERSION"
#: Price steps from SGLang's own start-up profiling (SGLang main); on by itself without tables.
ENV_PROFILE = "AV_CORE_SGLANG_PROFILE"
#: SGLang's own switch: at 0 steps it still runs the drafter's extend pass unless this is set.
ENV_SKIP_ZERO_STEP_EXTEND = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
SUPPORTED_SGLANG_VERSIONS = ("0.5.23",)
RUNTIME_STATE_MODULE = "sglang.srt.speculative.adaptive_runtime_state"
PARAMS_MODULE = "sglang.srt.speculative.adaptive_spec_params"
WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
#: SGLang main's throughput-aware strategy (``"strategy": "throughput_aware"``), when present.
THROUGHPUT_MODULE = "sglang.srt.speculative.throughput_aware_controller"
#: Where the scheduler feeds each verify's accepted counts to the worker (read, not imported).
PROCESSOR_MODULE = "sglang.srt.managers.scheduler_components.batch_result_processor"

#: SGLang's policy classes av_core replaces, each with its defining module and the keyword that
#: names the adaptive config: 0.5.23's EMA policy, and SGLang main's throughput-aware one.
POLICY_CLASSES: dict[str, tuple[str, str]] = {
    "AdaptiveSpeculativeParams": (PARAMS_MODULE, "cfg_path"),
    "ThroughputAwarePolicy": (THROUGHPUT_MODULE, "config_path"),
}

#: SGLang 0.5.23's ``AdaptiveSpecPolicy`` methods, as :func:`~av_core._engine_interface.
#: signature_text` writes them. A later protocol may add to them (SGLang main adds
#: ``on_state_activated(self, steps)`` and ``on_verify_complete``'s ``num_steps=None``): the
#: installer accepts an addition when :class:`CostAwarePolicy` takes it, and refuses any other
#: change.
POLICY_METHODS: dict[str, str] = {
    "set_cuda_graph_bs": "(self, cuda_graph_bs)",
    "get_steps_for_batch": "(self, batch_size)",
    "on_verify_complete": "(self, num_correct_drafts_per_req, batch_size)",
    "cuda_graph_bs_for_step": "(self, step)",
}
POLICY_PROPERTIES = ("candidate_steps",)

#: The SGLang definitions the policy and the installer rely on: (module, dotted) → signature in
#: SGLang 0.5.23. An additive change (a new optional parameter, as SGLang main's ``num_steps``)
#: is accepted, anything else refused.
CONTROLLER_SIGNATURES: dict[tuple[str, str], str] = {
    (RUNTIME_STATE_MODULE, "AdaptiveController.__init__"): "(self, worker, policy)",
    (RUNTIME_STATE_MODULE, "AdaptiveController.init_states"): "(self, cuda_graph_bs=None)",
    (RUNTIME_STATE_MODULE, "AdaptiveController.activate_step_by_batch"): "(self, batch_size)",
    (RUNTIME_STATE_MODULE, "AdaptiveController.on_verify_complete"): (
        "(self, num_correct_drafts_per_req, batch_size)"
    ),
    (PARAMS_MODULE, "AdaptiveSpeculativeParams.__init__"): "(self, initial_steps, cfg_path=None)",
    (WORKER_MODULE, "EAGLEWorkerV2.on_verify_complete_cpu"): (
        "(self, num_correct_drafts_per_req, batch_size=0)"
    ),
    (WORKER_MODULE, "EAGLEWorkerV2.activate_step_by_batch"): "(self, batch_size)",
}

#: SGLang main's definitions, checked where present: the throughput-aware policy (replaced like
#: the EMA one) and the start-up profiling the profiling policy relies on.
MAIN_SIGNATURES: dict[tuple[str, str], str] = {
    (
        THROUGHPUT_MODULE,
        "ThroughputAwarePolicy.__init__",
    ): "(self, initial_steps, config_path=None)",
    (RUNTIME_STATE_MODULE, "AdaptiveController.run_profiling"): (
        "(self, tree_cache, *, max_running_requests)"
    ),
    (WORKER_MODULE, "EAGLEWorkerV2.run_startup_spec_profiling"): (
        "(self, tree_cache, *, max_running_requests)"
    ),
}

#: SGLang main's optional profiling protocol (``AdaptiveProfilingPolicy``), as written there;
#: :class:`ProfilingCostAwarePolicy` implements it.
PROFILING_METHODS: dict[str, str] = {
    "profile_plan": "(self, worker, *, max_running_requests)",
    "record_profile": "(self, batch_size, steps, avg_ms)",
    "profile_summary": "(self)",
}


#: The SGLang main revision whose interfaces the installer knows (and the tests reproduce).
MAIN_REVISION = "sgl-project/sglang@a12239f6ac74d804d169ee5d3cfed3c49fa7162c"

#: How SGLang main (:data:`MAIN_REVISION`) writes what differs from 0.5.23: the protocol's
#: methods (``on_verify_complete`` gained ``num_steps=None``, ``on_state_activated`` is new) and
#: the definitions of :data:`CONTROLLER_SIGNATURES` it changed. A signature is accepted when it is
#: one of the known ones, or an additive change of the newest; refused otherwise.
MAIN_POLICY_METHODS: dict[str, str] = {
    "on_verify_complete": "(self, num_correct_drafts_per_req, batch_size, num_steps=None)",
    "on_state_activated": "(self, steps)",
}
MAIN_CONTROLLER_SIGNATURES: dict[tuple[str, str], str] = {
    (RUNTIME_STATE_MODULE, "AdaptiveController.on_verify_complete"): (
        "(self, num_correct_drafts_per_req, batch_size, num_steps=None)"
    ),
    (WORKER_MODULE, "EAGLEWorkerV2.on_verify_complete_cpu"): (
        "(self, num_correct_drafts_per_req, batch_size=0, num_steps=None)"
    ),
}


#: The calls the policy's two inputs travel through, each ``(module, function or None for the
#: whole module, callee, keywords every such call must pass)``: before each decode batch the worker
#: asks the controller (hence the policy) for its steps, and after each verify the scheduler hands
#: the accepted counts with the batch size to the worker, which hands them to the controller. A
#: release that drops one of them would leave the policy deciding on nothing, or learning nothing.
CALL_SITES: tuple[tuple[str, str | None, str, tuple[str, ...]], ...] = (
    (WORKER_MODULE, "EAGLEWorkerV2.forward_batch_generation", "self.activate_step_by_batch", ()),
    (
        WORKER_MODULE,
        "EAGLEWorkerV2.activate_step_by_batch",
        "self.adaptive_controller.activate_step_by_batch",
        (),
    ),
    (
        WORKER_MODULE,
        "EAGLEWorkerV2.on_verify_complete_cpu",
        "self.adaptive_controller.on_verify_complete",
        ("batch_size",),
    ),
    (PROCESSOR_MODULE, None, "on_verify_complete_cpu", ("batch_size",)),
)

#: With the profiling policy, the worker must still hand the controller its start-up profiling.
PROFILING_CALL_SITE = (
    WORKER_MODULE,
    "EAGLEWorkerV2.run_startup_spec_profiling",
    "self.adaptive_controller.run_profiling",
    ("max_running_requests",),
)


class SglangCompatibilityError(RuntimeError):
    """SGLang's interfaces differ from those the policy relies on; nothing was patched."""


@dataclass(frozen=True)
class _Replacement:
    owner: ModuleType
    owner_name: str
    attribute: str
    original: Any
    replacement: Any


_installed: list[_Replacement] = []


def construction_sites(source: str) -> list[ast.Call]:
    """``AdaptiveController(self, AdaptiveSpeculativeParams(initial_steps=..., cfg_path=...))``
    calls in ``source`` (the inner call of each)."""
    found = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "AdaptiveController"
            and len(node.args) == 2
            and not node.keywords
        ):
            continue
        inner = node.args[1]
        if (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Name)
            and inner.func.id == "AdaptiveSpeculativeParams"
            and not inner.args
            and sorted(k.arg or "" for k in inner.keywords) == ["cfg_path", "initial_steps"]
        ):
            found.append(inner)
    return found


def policy_calls(source: str) -> dict[str, int]:
    """How often ``source`` (SGLang's ``AdaptiveController``) touches each member of its policy
    (``self.params.<name>``)."""
    counts: dict[str, int] = {}
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "params"
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"
        ):
            counts[node.attr] = counts.get(node.attr, 0) + 1
    return counts


def calls_to(source: str, callee: str) -> list[ast.Call]:
    """The calls in ``source`` whose function is ``callee`` (``self.a.b``), or, for a bare name,
    any attribute of that name (``x.y.callee``)."""
    found = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            text = ast.unparse(node.func)
            if text == callee or ("." not in callee and text.endswith("." + callee)):
                found.append(node)
    return found


def module_source(name: str) -> str | None:
    """The source text of module ``name`` without importing it (its parent packages are); None
    when it cannot be found or read."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if spec is None or not origin or not origin.endswith(".py"):
        return None
    try:
        with open(origin, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError):
        return None


def _call_site_problems(
    modules: Mapping[str, ModuleType],
    sources: Mapping[str, str | None],
    sites: tuple[tuple[str, str | None, str, tuple[str, ...]], ...],
) -> list[str]:
    problems = []
    for module_name, dotted, callee, keywords in sites:
        where = f"{module_name}.{dotted}" if dotted else module_name
        try:
            if dotted is None:
                text = sources.get(module_name)
                if text is None:
                    raise OSError("source not found")
            else:
                text = inspect.getsource(resolve(modules[module_name], dotted))
            calls = calls_to(text, callee)
        except (AttributeError, KeyError, OSError, TypeError, SyntaxError) as error:
            problems.append(f"{where}: source not readable ({error})")
            continue
        if not calls:
            problems.append(f"{where} no longer calls {callee}(...)")
            continue
        for call in calls:
            passed = {k.arg for k in call.keywords}
            missing = [k for k in keywords if k not in passed]
            if missing:
                problems.append(f"{where}: {ast.unparse(call)} does not pass {', '.join(missing)}=")
    return problems


def _public_members(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def _protocol_report(
    runtime: ModuleType,
    name: str,
    expected: Mapping[str, str],
    policy: type,
    report: InterfaceReport,
    *,
    properties: tuple[str, ...] = (),
    newer: Mapping[str, str] | None = None,
) -> None:
    """SGLang's protocol ``name`` against what it was (``expected``) and what ``policy``
    implements: a new member is accepted when the policy has it with a signature taking every
    call the protocol allows; a removed, renamed or changed member is refused."""
    where = f"{RUNTIME_STATE_MODULE}.{name}"
    protocol = getattr(runtime, name, None)
    if protocol is None:
        report.problems.append(f"{where}: not found")
        return
    members = {m for m in vars(protocol) if not m.startswith("_")}
    for missing in sorted((set(expected) | set(properties)) - members):
        report.problems.append(f"{where}.{missing}: removed from the protocol")
    for member in sorted(members):
        if member in properties:
            if not isinstance(inspect.getattr_static(protocol, member, None), property):
                report.problems.append(f"{where}.{member}: not a property")
            continue
        try:
            found = signature_text(resolve(runtime, f"{name}.{member}"))
        except (AttributeError, TypeError, ValueError) as error:
            report.problems.append(f"{where}.{member}: not found or not inspectable ({error})")
            continue
        known = [t for t in (expected.get(member), (newer or {}).get(member)) if t is not None]
        if known:
            record_signature(report, f"{where}.{member}", known, found, newest="SGLang main")
            if member not in expected:
                report.accepted.append(f"{where}.{member}: a protocol method new since 0.5.23")
        else:
            report.accepted.append(f"{where}.{member}{found}: a new protocol method")
        ours = inspect.getattr_static(policy, member, None)
        if ours is None:
            report.problems.append(
                f"{where}.{member}{found}: av_core's {policy.__name__} does not implement it"
            )
            continue
        taken = signature_text(getattr(policy, member))
        change = compare_signatures(found, taken)
        if change.kind == "changed":
            report.problems.append(
                f"{where}.{member}{found}: av_core's {policy.__name__}.{member}{taken} does not "
                f"take every call it allows ({change.describe()})"
            )


def policy_constructions(source: str) -> list[tuple[str, ast.Call]]:
    """Every construction of SGLang's controller in ``source``: ``(policy, call)`` for
    ``AdaptiveController(self, Policy(...))`` (``policy`` is the inner callee's name, empty when
    it is not a plain call of a name; ``call`` the inner call or the outer one), and
    ``("AdaptiveController.from_config", call)`` for the factory classmethod."""
    found: list[tuple[str, ast.Call]] = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if not isinstance(node, ast.Call):
            continue
        callee = ast.unparse(node.func)
        if callee == "AdaptiveController.from_config":
            found.append((callee, node))
        elif callee == "AdaptiveController":
            inner = node.args[1] if len(node.args) == 2 else None
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name):
                found.append((inner.func.id, inner))
            else:
                found.append(("", node))
    return found


def _construction_report(
    modules: Mapping[str, ModuleType], report: InterfaceReport, throughput: ModuleType | None
) -> None:
    worker, runtime = modules[WORKER_MODULE], modules[RUNTIME_STATE_MODULE]
    where = f"{WORKER_MODULE}.EAGLEWorkerV2.__init__"
    try:
        init = resolve(worker, "EAGLEWorkerV2.__init__")
        sites = policy_constructions(inspect.getsource(init))
    except (AttributeError, OSError, TypeError, SyntaxError) as error:
        report.problems.append(f"{where}: source not readable ({error})")
        return
    ema = 0
    for name, call in sites:
        if name == "AdaptiveController.from_config":
            try:
                factory = inspect.getsource(resolve(runtime, "AdaptiveController.from_config"))
            except (AttributeError, OSError, TypeError) as error:
                report.problems.append(f"{where}: AdaptiveController.from_config ({error})")
                continue
            built = [
                (policy, inner)
                for policy in POLICY_CLASSES
                for inner in calls_to(factory, policy)
                if isinstance(inner.func, ast.Name)
            ]
            ema += sum(policy == "AdaptiveSpeculativeParams" for policy, _ in built)
            bad = [i for p, i in built if not _passes_config(p, i)]
            if not built or bad:
                report.problems.append(
                    f"{RUNTIME_STATE_MODULE}.AdaptiveController.from_config builds no policy "
                    "av_core replaces with initial_steps= and its config path"
                )
            continue
        if name not in POLICY_CLASSES:
            shown = ast.unparse(call)
            report.problems.append(
                f"{where} builds AdaptiveController with {shown}: a policy av_core does not "
                "replace, which would run instead of av_core's"
            )
            continue
        if not _passes_config(name, call):
            if name == "AdaptiveSpeculativeParams":
                continue  # counted as missing below
            report.problems.append(
                f"{where}: {ast.unparse(call)} does not pass initial_steps= and "
                f"{POLICY_CLASSES[name][1]}="
            )
            continue
        ema += name == "AdaptiveSpeculativeParams"
        if name == "ThroughputAwarePolicy" and throughput is None:
            report.accepted.append(
                f"{where} builds ThroughputAwarePolicy but {THROUGHPUT_MODULE} cannot be "
                "imported here: SGLang cannot run that strategy either, nothing to replace"
            )
    if ema != 1:
        report.problems.append(
            f"{where}: expected one AdaptiveController(self, AdaptiveSpeculativeParams("
            f"initial_steps=..., cfg_path=...)), found {ema}"
        )


def _passes_config(policy: str, call: ast.Call) -> bool:
    keywords = sorted(k.arg or "" for k in call.keywords)
    return not call.args and keywords == sorted(["initial_steps", POLICY_CLASSES[policy][1]])


def interface_report(
    modules: Mapping[str, ModuleType],
    version: str | None,
    sources: Mapping[str, str | None] | None = None,
    *,
    profile: bool = False,
) -> InterfaceReport:
    """Every difference between the live SGLang modules and what the policy and the installer
    rely on, split into refusals and accepted additions (module doc). ``version=None`` skips
    the version check. ``sources``: the text of modules read rather than imported
    (:data:`PROCESSOR_MODULE`; default: found with :func:`module_source`). ``profile``: the
    policy prices steps from SGLang's start-up profiling (:class:`ProfilingCostAwarePolicy`),
    which this SGLang must then offer. :data:`THROUGHPUT_MODULE` is checked when in
    ``modules``."""
    if sources is None:
        sources = {PROCESSOR_MODULE: module_source(PROCESSOR_MODULE)}
    report = InterfaceReport([], [])
    if version is not None and version not in SUPPORTED_SGLANG_VERSIONS:
        if older_than(version, SUPPORTED_SGLANG_VERSIONS[0]):
            report.problems.append(
                f"SGLang version {version} is older than those av_core's policy was written "
                f"against ({', '.join(SUPPORTED_SGLANG_VERSIONS)}); set {ENV_ANY_VERSION}=1 to "
                "try it anyway (the interface checks still apply)"
            )
        else:
            report.accepted.append(
                f"SGLang {version} is newer than the releases the contract tests read "
                f"({', '.join(SUPPORTED_SGLANG_VERSIONS)}): installed because every interface "
                "check passes"
            )
    missing = [name for name in (RUNTIME_STATE_MODULE, PARAMS_MODULE, WORKER_MODULE)]
    missing = [name for name in missing if name not in modules]
    if missing:
        report.problems.extend([f"{name}: not imported" for name in missing])
        return report
    runtime, params, worker = (
        modules[RUNTIME_STATE_MODULE],
        modules[PARAMS_MODULE],
        modules[WORKER_MODULE],
    )
    throughput = modules.get(THROUGHPUT_MODULE)
    policy: type = ProfilingCostAwarePolicy if profile else CostAwarePolicy
    _protocol_report(
        runtime,
        "AdaptiveSpecPolicy",
        POLICY_METHODS,
        policy,
        report,
        properties=POLICY_PROPERTIES,
        newer=MAIN_POLICY_METHODS,
    )
    factory = "(self, initial_steps, cfg_path=None)"
    for (module_name, dotted), text in CONTROLLER_SIGNATURES.items():
        replaced = dotted == "AdaptiveSpeculativeParams.__init__"
        known = [text, *filter(None, [MAIN_CONTROLLER_SIGNATURES.get((module_name, dotted))])]
        check_signature(
            report,
            modules,
            module_name,
            dotted,
            known,
            newest="SGLang main",
            taken_by=factory if replaced else None,
        )
    profiling = getattr(runtime, "AdaptiveProfilingPolicy", None)
    optional = set(PROFILING_METHODS) if profiling is not None else set()
    controller = getattr(runtime, "AdaptiveController", None)
    try:
        calls = policy_calls(inspect.getsource(controller))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError) as error:
        report.problems.append(
            f"{RUNTIME_STATE_MODULE}.AdaptiveController: source not readable ({error})"
        )
    else:
        unknown = sorted(set(calls) - _public_members(policy) - optional)
        if unknown:
            report.problems.append(
                f"{RUNTIME_STATE_MODULE}.AdaptiveController uses policy members av_core's "
                f"policy does not implement: {unknown}"
            )
        for name in ("get_steps_for_batch", "on_verify_complete"):
            if name not in calls:
                report.problems.append(
                    f"{RUNTIME_STATE_MODULE}.AdaptiveController no longer calls the policy's {name}"
                )
    if profile:
        _profiling_report(modules, report, profiling, sources)
    if throughput is not None:
        text = MAIN_SIGNATURES[(THROUGHPUT_MODULE, "ThroughputAwarePolicy.__init__")]
        check_signature(
            report,
            modules,
            THROUGHPUT_MODULE,
            "ThroughputAwarePolicy.__init__",
            text,
            taken_by=text,
        )
    if not isinstance(getattr(params, "DEFAULT_ADAPTIVE_CONFIG", None), Mapping):
        report.problems.append(f"{PARAMS_MODULE}.DEFAULT_ADAPTIVE_CONFIG: not found")
    bound = getattr(worker, "AdaptiveSpeculativeParams", None)
    original = getattr(params, "AdaptiveSpeculativeParams", None)
    if bound is None or bound is not original:
        report.problems.append(
            f"{WORKER_MODULE}.AdaptiveSpeculativeParams is not "
            f"{PARAMS_MODULE}.AdaptiveSpeculativeParams"
        )
    _construction_report(modules, report, throughput)
    report.problems.extend(_call_site_problems(modules, sources, CALL_SITES))
    return report


def _profiling_report(
    modules: Mapping[str, ModuleType],
    report: InterfaceReport,
    profiling: type | None,
    sources: Mapping[str, str | None],
) -> None:
    """What the profiling policy needs: SGLang main's optional profiling protocol, the plan's
    dataclasses, the controller's ``run_profiling`` and the worker's hand-over to it."""
    runtime = modules[RUNTIME_STATE_MODULE]
    if profiling is None:
        report.problems.append(
            f"{RUNTIME_STATE_MODULE}.AdaptiveProfilingPolicy: not found (this SGLang has no "
            "start-up profiling for adaptive policies): give av_core cost tables instead "
            f"({ENV_COSTS})"
        )
        return
    _protocol_report(
        runtime, "AdaptiveProfilingPolicy", PROFILING_METHODS, ProfilingCostAwarePolicy, report
    )
    for name, ours in (("SpecProfilePlan", ProfilePlan), ("SpecProfilePoint", ProfilePoint)):
        theirs = getattr(runtime, name, None)
        if theirs is None or not dataclasses.is_dataclass(theirs):
            report.problems.append(f"{RUNTIME_STATE_MODULE}.{name}: not found")
            continue
        required = {
            f.name
            for f in dataclasses.fields(theirs)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        given = {f.name for f in dataclasses.fields(ours)}
        if not required <= given or not given <= {f.name for f in dataclasses.fields(theirs)}:
            report.problems.append(
                f"{RUNTIME_STATE_MODULE}.{name} has fields "
                f"{sorted(f.name for f in dataclasses.fields(theirs))} (required "
                f"{sorted(required)}); av_core's policy builds it from {sorted(given)}"
            )
    for (module_name, dotted), text in MAIN_SIGNATURES.items():
        if module_name != THROUGHPUT_MODULE:
            check_signature(report, modules, module_name, dotted, text)
    report.problems.extend(_call_site_problems(modules, sources, (PROFILING_CALL_SITE,)))


def check_interface(
    modules: Mapping[str, ModuleType],
    version: str | None,
    sources: Mapping[str, str | None] | None = None,
    *,
    profile: bool = False,
) -> list[str]:
    """The refusals of :func:`interface_report` (empty when compatible)."""
    return interface_report(modules, version, sources, profile=profile).problems


def _drafter_kind() -> Literal["autoregressive", "parallel"]:
    value = os.environ.get(ENV_DRAFTER, "autoregressive").strip().lower()
    if value == "autoregressive":
        return "autoregressive"
    if value == "parallel":
        return "parallel"
    raise ValueError(f"{ENV_DRAFTER}={value!r}: expected autoregressive or parallel")


#: How SGLang 0.5.23 reads its own boolean variables (``sglang.srt.environ.EnvBool``: lower-cased,
#: not stripped); anything else SGLang warns about and takes as its default, off.
SGLANG_ON = ("true", "1", "yes", "y")
SGLANG_OFF = ("false", "0", "no", "n")


def _sglang_flag(name: str) -> bool:
    """SGLang's boolean variable ``name`` as SGLang reads it (unset: off), so that the policy
    charges what SGLang runs; a value SGLang itself would not take is a ``ValueError`` naming it
    (SGLang would only warn and treat it as off)."""
    text = os.environ.get(name)
    if text is None or text.lower() in SGLANG_OFF:
        return False
    if text.lower() in SGLANG_ON:
        return True
    raise ValueError(
        f"{name}={text!r}: SGLang reads true, 1, yes or y as on and false, 0, no or n as off "
        "(anything else it takes as off, with a warning)"
    )


def _max_batch() -> int:
    value = os.environ.get(ENV_MAX_BATCH, "1024")
    try:
        batch = int(value)
    except ValueError:
        batch = 0
    if batch < 1:
        raise ValueError(f"{ENV_MAX_BATCH}={value!r}: expected an integer >= 1")
    return batch


#: SGLang main's throughput-aware ``profile_run_*`` settings → the profiling policy's keywords.
PROFILE_SETTINGS = {
    "profile_run_batch_sizes": "profile_batch_sizes",
    "max_profile_run_batch_size": "max_profile_batch_size",
    "profile_run_n_warmup": "profile_warmup",
    "profile_run_n_measure": "profile_measure",
    "profile_run_seq_len": "profile_seq_len",
}


def _policy_factories(
    cost_tables: CostTables | None,
    profile: bool,
    options: Mapping[str, Any],
    modules: Mapping[str, ModuleType],
) -> dict[str, Callable[..., CostAwarePolicy]]:
    """Stand-ins for SGLang's policy classes (same arguments) that build av_core's policy."""
    drafter = _drafter_kind()
    max_batch = _max_batch()
    skip_extend = _sglang_flag(ENV_SKIP_ZERO_STEP_EXTEND)
    costs_path = os.environ.get(ENV_COSTS)
    runtime = modules[RUNTIME_STATE_MODULE]
    ema_default = modules[PARAMS_MODULE].DEFAULT_ADAPTIVE_CONFIG
    throughput = modules.get(THROUGHPUT_MODULE)
    types = (
        {"plan_type": runtime.SpecProfilePlan, "point_type": runtime.SpecProfilePoint}
        if profile
        else {}
    )

    def build(
        strategy: str, initial_steps: int, config: Mapping[str, Any], settings: Mapping[str, Any]
    ) -> CostAwarePolicy:
        tiers = config_candidate_steps(None, config)
        k = max(s for steps in tiers.values() for s in steps)
        tables = cost_tables
        if tables is None and costs_path:
            tables = load_cost_tables(costs_path, k, drafter=drafter, max_batch=max_batch)
        keywords: dict[str, Any] = {
            "drafter": drafter,
            "draft_extend_at_zero": not skip_extend,
            **settings,
            **options,
        }
        if profile:
            policy: CostAwarePolicy = ProfilingCostAwarePolicy(
                tables, tiers, initial_steps=initial_steps, **types, **keywords
            )
        else:
            policy = CostAwarePolicy(tables, tiers, initial_steps=initial_steps, **keywords)
        logger.info(
            "av_core: SGLang's adaptive speculation (%s config) runs av_core's cost-aware policy "
            "(candidate steps %s, K = %d, costs from %s)",
            strategy,
            tiers,
            k,
            "SGLang's start-up profiling"
            if profile and tables is None
            else "cost tables" + (" and SGLang's start-up profiling" if profile else ""),
        )
        return policy

    def AdaptiveSpeculativeParams(  # noqa: N802 - stands in for SGLang's class
        initial_steps: int, cfg_path: str | None = None
    ) -> CostAwarePolicy:
        config = _read_config(cfg_path, ema_default)
        return build("ema", initial_steps, config, {})

    factories: dict[str, Callable[..., CostAwarePolicy]] = {
        "AdaptiveSpeculativeParams": AdaptiveSpeculativeParams
    }
    if throughput is not None:
        ta_default = getattr(throughput, "DEFAULT_THROUGHPUT_AWARE_CONFIG", None)

        def ThroughputAwarePolicy(  # noqa: N802 - stands in for SGLang's class
            initial_steps: int, config_path: str | None = None
        ) -> CostAwarePolicy:
            config = _read_config(config_path, ta_default)
            settings = {
                ours: config[theirs]
                for theirs, ours in PROFILE_SETTINGS.items()
                if profile and config.get(theirs) is not None
            }
            return build("throughput_aware", initial_steps, config, settings)

        factories["ThroughputAwarePolicy"] = ThroughputAwarePolicy
    return factories


def _read_config(path: str | None, default: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """SGLang's adaptive config file, or its default (``ValueError`` naming the file)."""
    if path is None:
        if not isinstance(default, Mapping):
            raise ValueError("no adaptive config given and SGLang has no default for it")
        return default
    config = json.loads(Path(path).read_text())
    if not isinstance(config, Mapping):
        raise ValueError(f"adaptive config {path}: expected a JSON object")
    return config


def _import_optional(name: str) -> ModuleType | None:
    """Module ``name``, or None when it is absent or cannot be imported here (then SGLang cannot
    use it either)."""
    try:
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.import_module(name)
    except (ImportError, ValueError):
        return None


def _bindings(
    modules: Mapping[str, ModuleType], *, lazy: bool
) -> list[tuple[str, ModuleType, str, Any]]:
    """Where SGLang builds its policies from: every loaded ``sglang`` module that imported a
    policy class by name (``eagle_worker_v2``'s ``from ... import AdaptiveSpeculativeParams``),
    and the defining module where the class is imported when it is built
    (``ThroughputAwarePolicy`` inside ``EAGLEWorkerV2.__init__``; both with ``lazy``, for
    ``AdaptiveController.from_config``)."""
    found = []
    for name, (home_name, _) in POLICY_CLASSES.items():
        home = modules.get(home_name)
        original = getattr(home, name, None) if home is not None else None
        if original is None:
            continue
        patch_home = lazy or name == "ThroughputAwarePolicy"
        for module_name, module in sorted(sys.modules.items()):
            namespace = getattr(module, "__dict__", None)
            in_sglang = module_name == "sglang" or module_name.startswith("sglang.")
            if module_name == home_name and not patch_home:
                continue
            if in_sglang and isinstance(namespace, dict) and namespace.get(name) is original:
                found.append((module_name, module, name, original))
    return found


def install(
    cost_tables: CostTables | None = None, *, profile: bool | None = None, **options: Any
) -> list[str]:
    """Checks SGLang and makes it build a :class:`CostAwarePolicy` wherever it builds one of its
    own policies (``AdaptiveSpeculativeParams``, and SGLang main's ``ThroughputAwarePolicy``):
    module doc. ``cost_tables`` (else the file named by ``AV_CORE_SGLANG_COSTS``) and ``options``
    (keywords of the policy) configure it. ``profile`` (default: ``AV_CORE_SGLANG_PROFILE``, or
    on when there are no cost tables): price steps from SGLang main's start-up profiling with
    :class:`ProfilingCostAwarePolicy`. Returns what was replaced; idempotent. Raises
    :class:`SglangCompatibilityError` (every difference) or :class:`ValueError` (no cost tables
    and no profiling, or a value of one of its environment variables or of ``AV_CORE_SIMD``
    that it does not take, named) and patches nothing; additive changes it takes as they are
    are logged."""
    if _installed:
        return installed()
    if cost_tables is not None and not isinstance(cost_tables, CostTables):
        raise TypeError(f"cost_tables must be av_core.CostTables, got {type(cost_tables)!r}")
    if profile is not None and not isinstance(profile, bool):
        raise TypeError(f"profile must be a bool or None, got {profile!r}")
    costs_given = cost_tables is not None or bool(os.environ.get(ENV_COSTS))
    wanted = profile if profile is not None else (env_flag(ENV_PROFILE) or not costs_given)
    policy: type = ProfilingCostAwarePolicy if wanted else CostAwarePolicy
    accepted = set(inspect.signature(policy).parameters) - {
        "cost_tables",
        "candidate_steps",
        "initial_steps",
        "options",
        "plan_type",
        "point_type",
    }
    if wanted:
        accepted |= set(inspect.signature(CostAwarePolicy).parameters) - {
            "cost_tables",
            "candidate_steps",
            "initial_steps",
        }
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(
            f"install: {unknown} are not {policy.__name__} options ({sorted(accepted)}); "
            "nothing was patched"
        )
    if not costs_given:
        runtime = _import_optional(RUNTIME_STATE_MODULE)
        if runtime is None or getattr(runtime, "AdaptiveProfilingPolicy", None) is None:
            raise ValueError(
                f"av_core's SGLang policy needs cost tables: pass install(cost_tables=...) or "
                f"set {ENV_COSTS} to a CostTables JSON or an av-core profile file (this SGLang "
                "has no start-up profiling to price steps from); nothing was patched"
            )
    # Every setting is read before anything is patched: a bad value fails here, naming it.
    _native.check_environment()
    _drafter_kind()
    _max_batch()
    _sglang_flag(ENV_SKIP_ZERO_STEP_EXTEND)
    any_version = env_flag(ENV_ANY_VERSION)
    version = engine_version("sglang")
    modules = {
        name: importlib.import_module(name)
        for name in (RUNTIME_STATE_MODULE, PARAMS_MODULE, WORKER_MODULE)
    }
    throughput = _import_optional(THROUGHPUT_MODULE)
    if throughput is not None:
        modules[THROUGHPUT_MODULE] = throughput
    report = interface_report(modules, None if any_version else version, profile=wanted)
    if report.problems:
        raise SglangCompatibilityError(
            f"av_core's SGLang policy ({ENV_ENABLE}=1) cannot run on this SGLang ({version}); "
            "nothing was patched. Differences:\n  - " + "\n  - ".join(report.problems)
        )
    factories = _policy_factories(cost_tables, wanted, dict(options), modules)
    init = inspect.getsource(resolve(modules[WORKER_MODULE], "EAGLEWorkerV2.__init__"))
    lazy = any(name == "AdaptiveController.from_config" for name, _ in policy_constructions(init))
    for module_name, owner, attribute, original in _bindings(modules, lazy=lazy):
        replacement = factories[attribute]
        setattr(owner, attribute, replacement)
        _installed.append(_Replacement(owner, module_name, attribute, original, replacement))
        logger.info(
            "av_core: %s.%s -> av_core.sglang.%s (SGLang %s)",
            module_name,
            attribute,
            policy.__name__,
            version,
        )
    for change in report.accepted:
        logger.info("av_core: accepted an additive change of SGLang: %s", change)
    return installed()


def uninstall() -> None:
    """Undo :func:`install`."""
    while _installed:
        entry = _installed.pop()
        setattr(entry.owner, entry.attribute, entry.original)
        logger.info("av_core: restored %s.%s", entry.owner_name, entry.attribute)


def installed() -> list[str]:
    """The replacements in effect (``module.attribute``)."""
    return [f"{entry.owner_name}.{entry.attribute}" for entry in _installed]


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: :func:`install` when ``AV_CORE_SGLANG=1``."""
    if not env_flag(ENV_ENABLE):
        logger.debug("av_core: %s is not set, SGLang keeps its own adaptive policy", ENV_ENABLE)
        return
    install()
