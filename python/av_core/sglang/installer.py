"""Installing :class:`~av_core.sglang.policy.CostAwarePolicy` into a running SGLang.

With ``AV_CORE_SGLANG=1`` the ``sglang.srt.plugins`` entry point (:func:`register`, which SGLang
calls in every scheduler process before building its workers) runs :func:`install`: it checks
SGLang's version and every signature and call site the policy relies on (:func:`check_interface`)
and, on any difference, raises :class:`SglangCompatibilityError` listing them and patches nothing
(SGLang logs the error and keeps its own policy). Compatible, it rebinds
``AdaptiveSpeculativeParams`` in ``eagle_worker_v2`` (the only name ``EAGLEWorkerV2.__init__``
constructs its policy through) to a factory that builds a :class:`CostAwarePolicy` with the
candidate steps of SGLang's own adaptive config (per batch-size tier, so the same runtime states
and CUDA graphs are built) and the cost tables of ``AV_CORE_SGLANG_COSTS`` (a
``CostTables.to_json`` file or an ``av-core profile`` cost file). ``docs/sglang.md`` has the
details. Nothing here imports SGLang until :func:`install` runs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import logging
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from av_core import _settings as settings
from av_core._engine_interface import engine_version, resolve, signature_text
from av_core._native import CostTables, Error
from av_core._settings import SGLANG_OFF as SGLANG_OFF
from av_core._settings import SGLANG_ON as SGLANG_ON
from av_core.sglang.policy import CostAwarePolicy, config_candidate_steps, load_cost_tables

logger = logging.getLogger("sglang.av_core")

ENV_ENABLE = settings.SGLANG.name
ENV_COSTS = settings.SGLANG_COSTS.name
ENV_DRAFTER = settings.SGLANG_DRAFTER.name
ENV_MAX_BATCH = settings.SGLANG_MAX_BATCH.name
ENV_ANY_VERSION = settings.SGLANG_ANY_VERSION.name
#: SGLang's own switch: at 0 steps it still runs the drafter's extend pass unless this is set.
ENV_SKIP_ZERO_STEP_EXTEND = settings.SGLANG_SKIP_ZERO_STEP_EXTEND.name
SUPPORTED_SGLANG_VERSIONS = ("0.5.23",)
RUNTIME_STATE_MODULE = "sglang.srt.speculative.adaptive_runtime_state"
PARAMS_MODULE = "sglang.srt.speculative.adaptive_spec_params"
WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
#: Where the scheduler feeds each verify's accepted counts to the worker (read, not imported).
PROCESSOR_MODULE = "sglang.srt.managers.scheduler_components.batch_result_processor"

#: ``AdaptiveSpecPolicy``'s methods, as :func:`~av_core._engine_interface.signature_text` writes
#: them; :class:`CostAwarePolicy` has the same.
POLICY_METHODS: dict[str, str] = {
    "set_cuda_graph_bs": "(self, cuda_graph_bs)",
    "get_steps_for_batch": "(self, batch_size)",
    "on_verify_complete": "(self, num_correct_drafts_per_req, batch_size)",
    "cuda_graph_bs_for_step": "(self, step)",
}
POLICY_PROPERTIES = ("candidate_steps",)

#: The SGLang definitions the policy and the installer rely on: (module, dotted) → signature.
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


class SglangCompatibilityError(Error, RuntimeError):
    """SGLang's interfaces differ from those the policy relies on; nothing was patched. An
    ``av_core.Error`` and a ``RuntimeError``."""


@dataclass(frozen=True)
class _Replacement:
    owner: ModuleType
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
    modules: Mapping[str, ModuleType], sources: Mapping[str, str | None]
) -> list[str]:
    problems = []
    for module_name, dotted, callee, keywords in CALL_SITES:
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


def check_interface(
    modules: Mapping[str, ModuleType],
    version: str | None,
    sources: Mapping[str, str | None] | None = None,
) -> list[str]:
    """Every difference between the live SGLang modules and what the policy and the installer
    rely on (empty when compatible). ``version=None`` skips the version check. ``sources``: the
    text of modules read rather than imported (:data:`PROCESSOR_MODULE`; default: found with
    :func:`module_source`)."""
    if sources is None:
        sources = {PROCESSOR_MODULE: module_source(PROCESSOR_MODULE)}
    problems: list[str] = []
    if version is not None and version not in SUPPORTED_SGLANG_VERSIONS:
        problems.append(
            f"SGLang version {version} is not one av_core's policy was written against "
            f"({', '.join(SUPPORTED_SGLANG_VERSIONS)}); set {ENV_ANY_VERSION}=1 to try it "
            "anyway (the interface checks still apply)"
        )
    missing = [name for name in (RUNTIME_STATE_MODULE, PARAMS_MODULE, WORKER_MODULE)]
    missing = [name for name in missing if name not in modules]
    if missing:
        return [*problems, *(f"{name}: not imported" for name in missing)]
    runtime, params, worker = (
        modules[RUNTIME_STATE_MODULE],
        modules[PARAMS_MODULE],
        modules[WORKER_MODULE],
    )
    protocol = getattr(runtime, "AdaptiveSpecPolicy", None)
    if protocol is None:
        problems.append(f"{RUNTIME_STATE_MODULE}.AdaptiveSpecPolicy: not found")
    else:
        members = {name for name in vars(protocol) if not name.startswith("_")}
        expected = set(POLICY_METHODS) | set(POLICY_PROPERTIES)
        if members != expected:
            problems.append(
                f"{RUNTIME_STATE_MODULE}.AdaptiveSpecPolicy has members {sorted(members)}, "
                f"expected {sorted(expected)}"
            )
        for name, text in POLICY_METHODS.items():
            where = f"{RUNTIME_STATE_MODULE}.AdaptiveSpecPolicy.{name}"
            try:
                found = signature_text(resolve(runtime, f"AdaptiveSpecPolicy.{name}"))
            except (AttributeError, TypeError, ValueError) as error:
                problems.append(f"{where}: not found or not inspectable ({error})")
                continue
            if found != text:
                problems.append(f"{where}{found} differs from the expected {text}")
        for name in POLICY_PROPERTIES:
            if not isinstance(inspect.getattr_static(protocol, name, None), property):
                problems.append(f"{RUNTIME_STATE_MODULE}.AdaptiveSpecPolicy.{name}: not a property")
    for (module_name, dotted), text in CONTROLLER_SIGNATURES.items():
        where = f"{module_name}.{dotted}"
        try:
            found = signature_text(resolve(modules[module_name], dotted))
        except (AttributeError, TypeError, ValueError) as error:
            problems.append(f"{where}: not found or not inspectable ({error})")
            continue
        if found != text:
            problems.append(f"{where}{found} differs from the expected {text}")
    for name, text in POLICY_METHODS.items():  # av_core's side of the protocol
        found = signature_text(getattr(CostAwarePolicy, name))
        if found != text:
            problems.append(f"av_core.sglang.CostAwarePolicy.{name}{found} is not {text}")
    controller = getattr(runtime, "AdaptiveController", None)
    try:
        calls = policy_calls(inspect.getsource(controller))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError) as error:
        problems.append(f"{RUNTIME_STATE_MODULE}.AdaptiveController: source not readable ({error})")
    else:
        unknown = sorted(set(calls) - set(POLICY_METHODS) - set(POLICY_PROPERTIES))
        if unknown:
            problems.append(
                f"{RUNTIME_STATE_MODULE}.AdaptiveController uses policy members av_core's "
                f"policy does not implement: {unknown}"
            )
        for name in ("get_steps_for_batch", "on_verify_complete"):
            if name not in calls:
                problems.append(
                    f"{RUNTIME_STATE_MODULE}.AdaptiveController no longer calls the policy's {name}"
                )
    if not isinstance(getattr(params, "DEFAULT_ADAPTIVE_CONFIG", None), Mapping):
        problems.append(f"{PARAMS_MODULE}.DEFAULT_ADAPTIVE_CONFIG: not found")
    bound = getattr(worker, "AdaptiveSpeculativeParams", None)
    original = getattr(params, "AdaptiveSpeculativeParams", None)
    if bound is None or bound is not original:
        problems.append(
            f"{WORKER_MODULE}.AdaptiveSpeculativeParams is not "
            f"{PARAMS_MODULE}.AdaptiveSpeculativeParams"
        )
    try:
        init = resolve(worker, "EAGLEWorkerV2.__init__")
        sites = construction_sites(inspect.getsource(init))
    except (AttributeError, OSError, TypeError, SyntaxError) as error:
        problems.append(f"{WORKER_MODULE}.EAGLEWorkerV2.__init__: source not readable ({error})")
    else:
        if len(sites) != 1:
            problems.append(
                f"{WORKER_MODULE}.EAGLEWorkerV2.__init__: expected one AdaptiveController(self, "
                f"AdaptiveSpeculativeParams(initial_steps=..., cfg_path=...)), found {len(sites)}"
            )
    problems += _call_site_problems(modules, sources)
    return problems


def _drafter_kind() -> Literal["autoregressive", "parallel"]:
    return "parallel" if settings.SGLANG_DRAFTER.require() == "parallel" else "autoregressive"


def _sglang_flag(name: str) -> bool:
    """SGLang's boolean variable ``name`` as SGLang reads it (unset: off; ``SGLANG_ON``,
    ``SGLANG_OFF``), so that the policy charges what SGLang runs; a value SGLang itself would
    not take is a ``SettingError`` naming it (SGLang would only warn and treat it as off)."""
    value: bool = settings.named(name).require()
    return value


def _max_batch() -> int:
    value: int = settings.SGLANG_MAX_BATCH.require()
    return value


def _policy_factory(
    cost_tables: CostTables | None,
    default_config: Mapping[str, Any],
    options: Mapping[str, Any],
) -> Callable[..., CostAwarePolicy]:
    drafter = _drafter_kind()
    max_batch = _max_batch()
    skip_extend = _sglang_flag(ENV_SKIP_ZERO_STEP_EXTEND)
    costs_path = settings.SGLANG_COSTS.require()

    def AdaptiveSpeculativeParams(  # noqa: N802 - stands in for SGLang's class
        initial_steps: int, cfg_path: str | None = None
    ) -> CostAwarePolicy:
        tiers = config_candidate_steps(cfg_path, default_config)
        k = max(s for steps in tiers.values() for s in steps)
        tables = cost_tables
        if tables is None:
            assert costs_path is not None
            tables = load_cost_tables(costs_path, k, drafter=drafter, max_batch=max_batch)
        settings: dict[str, Any] = {
            "drafter": drafter,
            "draft_extend_at_zero": not skip_extend,
            **options,
        }
        policy = CostAwarePolicy(tables, tiers, initial_steps=initial_steps, **settings)
        logger.info(
            "av_core: SGLang's adaptive speculation runs av_core's cost-aware policy "
            "(candidate steps %s, K = %d)",
            tiers,
            k,
        )
        return policy

    return AdaptiveSpeculativeParams


def install(cost_tables: CostTables | None = None, **options: Any) -> list[str]:
    """Checks SGLang and makes ``EAGLEWorkerV2`` build a :class:`CostAwarePolicy` where it builds
    ``AdaptiveSpeculativeParams`` (module doc). ``cost_tables`` (else the file named by
    ``AV_CORE_SGLANG_COSTS``) and ``options`` (keywords of :class:`CostAwarePolicy`) configure
    the policy. Returns what was replaced; idempotent. Raises :class:`SglangCompatibilityError`
    (every difference) or :class:`ValueError` (no cost tables, or a value of one of its
    environment variables or of ``AV_CORE_SIMD`` that it does not take, named) and patches
    nothing."""
    if _installed:
        return [f"{WORKER_MODULE}.{entry.attribute}" for entry in _installed]
    if cost_tables is not None and not isinstance(cost_tables, CostTables):
        raise TypeError(f"cost_tables must be av_core.CostTables, got {type(cost_tables)!r}")
    accepted = set(inspect.signature(CostAwarePolicy).parameters) - {
        "cost_tables",
        "candidate_steps",
        "initial_steps",
    }
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(
            f"install: {unknown} are not CostAwarePolicy options ({sorted(accepted)}); "
            "nothing was patched"
        )
    if cost_tables is None and not settings.SGLANG_COSTS.is_set():
        raise ValueError(
            f"av_core's SGLang policy needs cost tables: pass install(cost_tables=...) or set "
            f"{ENV_COSTS} to a CostTables JSON or an av-core profile file; nothing was patched"
        )
    # Every setting is read before anything is patched: a bad value fails here, naming it
    # (docs/settings.md).
    settings.check(settings.SGLANG_SETTINGS)
    any_version = settings.SGLANG_ANY_VERSION.require()
    version = engine_version("sglang")
    modules = {
        name: importlib.import_module(name)
        for name in (RUNTIME_STATE_MODULE, PARAMS_MODULE, WORKER_MODULE)
    }
    problems = check_interface(modules, None if any_version else version)
    if problems:
        raise SglangCompatibilityError(
            f"av_core's SGLang policy ({ENV_ENABLE}=1) cannot run on this SGLang ({version}); "
            "nothing was patched. Differences:\n  - " + "\n  - ".join(problems)
        )
    worker, attribute = modules[WORKER_MODULE], "AdaptiveSpeculativeParams"
    original = getattr(worker, attribute)
    factory = _policy_factory(
        cost_tables, modules[PARAMS_MODULE].DEFAULT_ADAPTIVE_CONFIG, dict(options)
    )
    setattr(worker, attribute, factory)
    _installed.append(_Replacement(worker, attribute, original, factory))
    logger.info(
        "av_core: %s.AdaptiveSpeculativeParams -> av_core.sglang.CostAwarePolicy (SGLang %s)",
        WORKER_MODULE,
        version,
    )
    return [f"{WORKER_MODULE}.AdaptiveSpeculativeParams"]


def uninstall() -> None:
    """Undo :func:`install`."""
    while _installed:
        entry = _installed.pop()
        setattr(entry.owner, entry.attribute, entry.original)
        logger.info("av_core: restored %s.%s", WORKER_MODULE, entry.attribute)


def installed() -> list[str]:
    """The replacements in effect."""
    return [f"{WORKER_MODULE}.{entry.attribute}" for entry in _installed]


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: :func:`install` when ``AV_CORE_SGLANG=1``."""
    if not settings.SGLANG.require():
        logger.debug("av_core: %s is not set, SGLang keeps its own adaptive policy", ENV_ENABLE)
        return
    install()
