"""What av_core's SGLang installer checks before patching anything: the SGLang definitions the
policy and the installer rely on, in SGLang 0.5.23 and on SGLang main (:data:`MAIN_REVISION`),
and how a live SGLang is compared with them (:func:`interface_report`): an *additive* change
(every call the known interface allows keeps its meaning) is accepted and reported, anything
else refused, naming what changed. ``docs/sglang.md`` lists what is checked and why. Nothing here
imports SGLang: the installer hands over the modules.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import textwrap
from collections.abc import Mapping
from types import ModuleType

from av_core import _settings as settings
from av_core._engine_interface import (
    InterfaceReport,
    check_signature,
    compare_signatures,
    older_than,
    record_signature,
    resolve,
    signature_text,
)
from av_core._native import Error
from av_core.sglang.policy import CostAwarePolicy
from av_core.sglang.profiling import ProfilePlan, ProfilePoint, ProfilingCostAwarePolicy

ENV_ENABLE = settings.SGLANG.name


ENV_COSTS = settings.SGLANG_COSTS.name


ENV_DRAFTER = settings.SGLANG_DRAFTER.name


ENV_MAX_BATCH = settings.SGLANG_MAX_BATCH.name


ENV_ANY_VERSION = settings.SGLANG_ANY_VERSION.name


#: Price steps from SGLang's own start-up profiling (SGLang main); on by itself without tables.
ENV_PROFILE = settings.SGLANG_PROFILE.name


#: SGLang's own switch: at 0 steps it still runs the drafter's extend pass unless this is set.
ENV_SKIP_ZERO_STEP_EXTEND = settings.SGLANG_SKIP_ZERO_STEP_EXTEND.name


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


class SglangCompatibilityError(Error, RuntimeError):
    """SGLang's interfaces differ from those the policy relies on; nothing was patched."""


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
                f"SGLang {version} is not one of the releases the contract tests read "
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
