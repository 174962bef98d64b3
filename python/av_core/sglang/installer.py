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

import importlib
import importlib.util
import inspect
import json
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from av_core import _settings as settings
from av_core._engine_interface import (
    engine_version,
    resolve,
)
from av_core._native import CostTables, InvalidTypeError, InvalidValueError
from av_core._settings import SGLANG_OFF as SGLANG_OFF
from av_core._settings import SGLANG_ON as SGLANG_ON
from av_core.sglang.interface import (
    ENV_COSTS,
    ENV_ENABLE,
    ENV_SKIP_ZERO_STEP_EXTEND,
    PARAMS_MODULE,
    POLICY_CLASSES,
    RUNTIME_STATE_MODULE,
    THROUGHPUT_MODULE,
    WORKER_MODULE,
    SglangCompatibilityError,
    interface_report,
    policy_constructions,
)
from av_core.sglang.policy import (
    CostAwarePolicy,
    config_candidate_steps,
    load_cost_tables,
)
from av_core.sglang.profiling import ProfilingCostAwarePolicy

logger = logging.getLogger("sglang.av_core")


@dataclass(frozen=True)
class _Replacement:
    owner: ModuleType
    owner_name: str
    attribute: str
    original: Any
    replacement: Any


_installed: list[_Replacement] = []


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
    costs_path = settings.SGLANG_COSTS.require()
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
            raise InvalidValueError("no adaptive config given and SGLang has no default for it")
        return default
    config = json.loads(Path(path).read_text())
    if not isinstance(config, Mapping):
        raise InvalidValueError(f"adaptive config {path}: expected a JSON object")
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
        raise InvalidTypeError(f"cost_tables must be av_core.CostTables, got {type(cost_tables)!r}")
    if profile is not None and not isinstance(profile, bool):
        raise InvalidTypeError(f"profile must be a bool or None, got {profile!r}")
    # Every setting is read before anything is patched: a bad value fails here, naming it
    # (docs/settings.md).
    settings.check(settings.SGLANG_SETTINGS)
    costs_given = cost_tables is not None or settings.SGLANG_COSTS.is_set()
    wanted = (
        profile if profile is not None else (settings.SGLANG_PROFILE.require() or not costs_given)
    )
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
        raise InvalidTypeError(
            f"install: {unknown} are not {policy.__name__} options ({sorted(accepted)}); "
            "nothing was patched"
        )
    if not costs_given:
        runtime = _import_optional(RUNTIME_STATE_MODULE)
        if runtime is None or getattr(runtime, "AdaptiveProfilingPolicy", None) is None:
            raise InvalidValueError(
                f"av_core's SGLang policy needs cost tables: pass install(cost_tables=...) or "
                f"set {ENV_COSTS} to a CostTables JSON or an av-core profile file (this SGLang "
                "has no start-up profiling to price steps from); nothing was patched"
            )
    any_version = settings.SGLANG_ANY_VERSION.require()
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
    if not settings.SGLANG.require():
        logger.debug("av_core: %s is not set, SGLang keeps its own adaptive policy", ENV_ENABLE)
        return
    install()
