"""vLLM general plugin: run vLLM's adaptive verification on av_core (vLLM 0.32.x and 0.33.0).

Registered as the entry point ``av_core`` of the group ``vllm.general_plugins``, which vLLM calls
in every process it starts. With ``AV_CORE_VLLM=1`` in the environment, :func:`register` swaps, in
place and before any of them is used:

- ``acceptance_estimator.OnlineAcceptanceEstimator`` (and every module that already bound the
  name, e.g. ``speculator.py`` by ``from ... import``) for :class:`av_core.vllm.
  OnlineAcceptanceEstimator`;
- ``adaptive_verification.build_cost_tables_from_curves``, ``_assign_draft_token_budget`` and
  ``_assign_draft_token_budget_compiled`` for av_core's;
- ``adaptive_verification.AdaptiveVerificationManager.get_num_tokens`` for a method that sizes
  the budget with :func:`av_core.vllm.batch_draft_budget`.

Each replacement is logged (logger ``vllm.av_core``, so it shows in vLLM's own log). Before
touching anything it checks vLLM's version and every signature and constant the replacements
mirror; on any difference it raises :class:`VllmCompatibilityError` listing them and patches
nothing: silently serving with a half-patched or mismatched vLLM would be worse than not starting.
``AV_CORE_VLLM_ANY_VERSION=1`` waives the version check only (for a point release or a source
build whose interfaces still match); the signature checks always run.

``AV_CORE_STATE_DIR`` (warm restarts) and ``AV_CORE_SHARE_STATS=dp`` (pooled statistics across
data-parallel ranks) wrap ``DraftModelSpeculator.load_model`` (and, for sharing,
``Worker.execute_dummy_batch``) as :mod:`av_core.vllm.serving` describes; their interfaces are
checked with the rest, before anything is patched. ``AV_CORE_VLLM_EXACT=1`` gives the estimator
vLLM's unbounded refit; metrics (``AV_CORE_METRICS_PORT``, ``PROMETHEUS_MULTIPROC_DIR``) start
with the first estimator, plugin or not.

Drafting-depth control (:mod:`av_core.vllm.depth`) is off unless ``AV_CORE_VLLM_DEPTH`` is set
to ``batch`` (or ``1``) or ``per_request``; ``AV_CORE_VLLM_DRAFTER`` (``autoregressive``, the
default, or ``parallel``) gives the shape of the drafter's cost by depth. Then
:func:`install_depth_control` wraps ``propose`` of vLLM's autoregressive speculators (EAGLE/MTP
``TargetDependentARSpeculator``, ``StandaloneARSpeculator``, ``MultiModuleMTPSpeculator``): before
drafting, a :class:`~av_core.vllm.depth.DraftDepthHook` catches up on the confidences vLLM's
``AdaptiveVerificationManager`` has copied to the host (two proposals back; so vLLM's adaptive
verification must be on), chooses the depth from them and the manager's profiled cost tables,
passes it as ``num_speculative_tokens`` and marks undrafted positions ``-1``. The manager's
``record_confidences`` and ``add_request`` are wrapped to tell the hook which depths each
proposal drafted and when a new request takes a slot.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from av_core import _settings as settings
from av_core._engine_interface import engine_version, resolve, signature_text
from av_core._native import Error
from av_core.vllm import serving as vllm_serving
from av_core.vllm.constants import (
    DAMPING_OBSERVATIONS,
    ENV_ESTIMATOR,
    ENV_EXACT,
    INIT_INTERCEPT,
    INIT_SLOPE,
    L2,
    MAX_LOG_ODDS,
    REFIT_INTERVAL,
)
from av_core.vllm.update import choose_update

__all__ = [
    "BUDGET_MODULE",
    "DEPTH_MANAGER_SIGNATURES",
    "DEPTH_SPECULATORS",
    "ENV_ANY_VERSION",
    "ENV_DEPTH",
    "ENV_DRAFTER",
    "ENV_ENABLE",
    "ESTIMATOR_MODULE",
    "EXPECTED_CONSTANTS",
    "EXPECTED_SIGNATURES",
    "GET_NUM_TOKENS_READS",
    "SUPPORTED_VLLM_VERSIONS",
    "Replacement",
    "version_supported",
    "VllmCompatibilityError",
    "check_interface",
    "install",
    "install_depth_control",
    "installed",
    "register",
    "signature_text",
    "uninstall",
]

logger = logging.getLogger("vllm.av_core")

ENV_ENABLE = settings.VLLM.name
ENV_ANY_VERSION = settings.VLLM_ANY_VERSION.name
ENV_DEPTH = settings.VLLM_DEPTH.name
ENV_DRAFTER = settings.VLLM_DRAFTER.name
#: The releases whose interfaces the contract tests check: every 0.32 point release (0.32.x) and
#: 0.33.0 (their estimator files are identical; the manager differs in what av_core leaves alone).
SUPPORTED_VLLM_VERSIONS = ("0.32.x", "0.33.0")
ESTIMATOR_MODULE = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator"
BUDGET_MODULE = "vllm.v1.worker.gpu.spec_decode.adaptive_verification"

#: Every signature the replacements mirror, as ``signature_text`` writes it (names, order,
#: kinds and defaults; annotations ignored). tests/test_vllm_contract.py checks this table
#: against the released vLLM source.
EXPECTED_SIGNATURES: dict[tuple[str, str], str] = {
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.__init__"): (
        "(self, max_num_reqs, num_speculative_steps, device)"
    ),
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.step"): (
        "(self, idx_mapping, num_sampled, num_rejected)"
    ),
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.predict"): (
        "(self, logits, idx_mapping, draft_step, confidence_probs, temperature)"
    ),
    (BUDGET_MODULE, "build_cost_tables_from_curves"): (
        "(draft_curve, verify_curve, max_num_reqs, max_batch_tokens, cudagraph_limit=0)"
    ),
    (BUDGET_MODULE, "_assign_draft_token_budget"): (
        "(confidence_probs, idx_mapping, capacities, draft_budget, num_steps)"
    ),
    (BUDGET_MODULE, "AdaptiveVerificationManager.get_num_tokens"): (
        "(self, num_tokens_per_req, draft_tokens)"
    ),
}

#: The speculators whose ``propose`` depth control wraps: (module, class). Each ``propose`` takes
#: ``input_batch`` first and a ``num_speculative_tokens=None`` keyword (checked before patching,
#: and against the released source by tests/test_vllm_contract.py).
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

#: Constants whose values the drop-ins reproduce: vLLM's must equal the core's vLLM preset
#: (``av_core._native.VLLM_ESTIMATOR``, read through ``av_core.vllm.constants``).
EXPECTED_CONSTANTS: dict[tuple[str, str], float] = {
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.REFIT_INTERVAL"): REFIT_INTERVAL,
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.DAMPING_OBSERVATIONS"): DAMPING_OBSERVATIONS,
    (ESTIMATOR_MODULE, "OnlineAcceptanceEstimator.L2"): L2,
    (ESTIMATOR_MODULE, "_MAX_LOG_ODDS"): MAX_LOG_ODDS,
    (ESTIMATOR_MODULE, "_INIT_SLOPE"): INIT_SLOPE,
    (ESTIMATOR_MODULE, "_INIT_BIAS"): INIT_INTERCEPT,
}

#: Attributes of ``AdaptiveVerificationManager`` (and of its ``req_states``) that the
#: replacement ``get_num_tokens`` reads or writes; the contract test finds each in vLLM's own
#: ``get_num_tokens``.
GET_NUM_TOKENS_READS = (
    "cost_tables",
    "req_states",
    "_stale_confidences",
    "_stale_idx",
    "_max_total_logits",
    "num_bonus_tokens",
    "_batch_budget",
    "req_id_to_index",
    "num_computed_tokens_np",
    "prefill_len",
)


class VllmCompatibilityError(Error, RuntimeError):
    """vLLM's interfaces differ from those av_core's drop-ins mirror; nothing was patched. An
    ``av_core.Error`` and a ``RuntimeError``."""


@dataclass(frozen=True)
class Replacement:
    """One attribute swapped by :func:`install`."""

    owner: Any
    owner_name: str
    attribute: str
    original: Any
    replacement: Any

    def describe(self) -> str:
        new = f"{self.replacement.__module__}.{self.replacement.__qualname__}"
        return f"{self.owner_name}.{self.attribute} -> {new}"


_installed: list[Replacement] = []


def _signature_problems(
    modules: Mapping[str, ModuleType], expected: Mapping[tuple[str, str], str]
) -> list[str]:
    """Every live signature that differs from ``expected`` (``(module, dotted) -> text``)."""
    problems: list[str] = []
    for (module_name, dotted), text in expected.items():
        where = f"{module_name}.{dotted}"
        try:
            found = signature_text(resolve(modules[module_name], dotted))
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            problems.append(f"{where}: not found or not inspectable ({error})")
            continue
        if found != text:
            problems.append(f"{where}{found} differs from the expected {where}{text}")
    return problems


def version_supported(version: str) -> bool:
    """Whether ``version`` is one of :data:`SUPPORTED_VLLM_VERSIONS` (``0.32.x``: any release
    ``0.32.N``; pre-releases and source builds are not releases: waive with
    ``AV_CORE_VLLM_ANY_VERSION=1``)."""
    for supported in SUPPORTED_VLLM_VERSIONS:
        if supported.endswith(".x"):
            prefix = supported[:-1]
            if version.startswith(prefix) and version[len(prefix) :].isdigit():
                return True
        elif version == supported:
            return True
    return False


def check_interface(modules: Mapping[str, ModuleType], version: str | None) -> list[str]:
    """Every difference between the live vLLM modules and what the drop-ins mirror (empty when
    compatible). ``version=None`` skips the version check."""
    problems: list[str] = []
    if version is not None and not version_supported(version):
        problems.append(
            f"vLLM version {version} is not one av_core's plugin was written against "
            f"({', '.join(SUPPORTED_VLLM_VERSIONS)}); set {ENV_ANY_VERSION}=1 to try it anyway "
            "(the signature checks still apply)"
        )
    problems += _signature_problems(modules, EXPECTED_SIGNATURES)
    for (module_name, dotted), expected_value in EXPECTED_CONSTANTS.items():
        where = f"{module_name}.{dotted}"
        try:
            value = resolve(modules[module_name], dotted)
        except (AttributeError, KeyError) as error:
            problems.append(f"{where}: not found ({error})")
            continue
        if value != expected_value:
            problems.append(f"{where} = {value!r}, expected {expected_value!r}")
    budget_module = modules.get(BUDGET_MODULE)
    if budget_module is not None and not hasattr(
        budget_module, "_assign_draft_token_budget_compiled"
    ):
        problems.append(f"{BUDGET_MODULE}._assign_draft_token_budget_compiled: not found")
    return problems


def _get_num_tokens(
    self: Any, num_tokens_per_req: dict[str, int], draft_tokens: dict[str, list[int]]
) -> int:
    """``AdaptiveVerificationManager.get_num_tokens`` on av_core's planner: the step's token
    count once the draft budget is trimmed, with the budget stashed in ``_batch_budget`` for the
    compaction that follows, exactly as vLLM's method does."""
    from av_core.vllm import batch_draft_budget

    if self.cost_tables is None:
        raise RuntimeError("adaptive verification has no cost tables yet (profiling did not run)")
    req_states = self.req_states
    plan = batch_draft_budget(
        num_tokens_per_req,
        draft_tokens,
        req_id_to_index=req_states.req_id_to_index,
        stale_confidences=self._stale_confidences[self._stale_idx].np,
        num_computed_tokens=req_states.num_computed_tokens_np,
        prefill_len=req_states.prefill_len.np,
        cost_tables=self.cost_tables,
        max_total_logits=self._max_total_logits,
        num_bonus_tokens=self.num_bonus_tokens,
    )
    self._batch_budget = (
        plan.num_drafts_per_req,
        plan.num_non_draft_tokens_per_req,
        plan.draft_budget,
    )
    return plan.num_tokens


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _serving_plan(modules: Mapping[str, ModuleType]) -> list[Replacement]:
    """The wrappers of :mod:`av_core.vllm.serving` (warm restarts, data-parallel pooling)."""
    speculator = modules[vllm_serving.SPECULATOR_MODULE].DraftModelSpeculator
    original = inspect.getattr_static(speculator, "load_model")
    plan = [
        Replacement(
            speculator,
            f"{vllm_serving.SPECULATOR_MODULE}.DraftModelSpeculator",
            "load_model",
            original,
            vllm_serving.wrap_load_model(original),
        )
    ]
    if vllm_serving.share_mode() == "dp":
        worker = modules[vllm_serving.WORKER_MODULE].Worker
        original = inspect.getattr_static(worker, "execute_dummy_batch")
        plan.append(
            Replacement(
                worker,
                f"{vllm_serving.WORKER_MODULE}.Worker",
                "execute_dummy_batch",
                original,
                vllm_serving.wrap_execute_dummy_batch(original),
            )
        )
    return plan


def _plan(modules: Mapping[str, ModuleType]) -> list[Replacement]:
    from av_core import vllm as drop_ins

    estimator_module, budget_module = modules[ESTIMATOR_MODULE], modules[BUDGET_MODULE]
    manager = budget_module.AdaptiveVerificationManager
    plan = [
        Replacement(
            estimator_module,
            ESTIMATOR_MODULE,
            "OnlineAcceptanceEstimator",
            estimator_module.OnlineAcceptanceEstimator,
            drop_ins.OnlineAcceptanceEstimator,
        ),
        Replacement(
            budget_module,
            BUDGET_MODULE,
            "build_cost_tables_from_curves",
            budget_module.build_cost_tables_from_curves,
            drop_ins.build_cost_tables_from_curves,
        ),
        Replacement(
            budget_module,
            BUDGET_MODULE,
            "_assign_draft_token_budget",
            budget_module._assign_draft_token_budget,
            drop_ins.assign_draft_token_budget,
        ),
        Replacement(
            budget_module,
            BUDGET_MODULE,
            "_assign_draft_token_budget_compiled",
            budget_module._assign_draft_token_budget_compiled,
            drop_ins.assign_draft_token_budget,
        ),
        Replacement(
            manager,
            f"{BUDGET_MODULE}.AdaptiveVerificationManager",
            "get_num_tokens",
            inspect.getattr_static(manager, "get_num_tokens"),
            _get_num_tokens,
        ),
    ]
    # Modules that bound a name with `from ... import` before now keep the original unless
    # rebound too (vLLM's speculator.py imports the estimator class that way).
    owners = {id(estimator_module), id(budget_module)}
    module_level = [entry for entry in plan if isinstance(entry.owner, ModuleType)]
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if id(module) in owners or not isinstance(namespace, dict):
            continue
        for entry in module_level:
            if namespace.get(entry.attribute) is entry.original:
                plan.append(
                    Replacement(module, name, entry.attribute, entry.original, entry.replacement)
                )
    return plan


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

    def record_confidences(self: Any, confidence_probs: Any, input_batch: Any) -> None:
        original(self, confidence_probs, input_batch)
        hook, last = _DepthState.hook, _DepthState.last
        if hook is not None and last is not None:
            hook.proposed(*last)
        _DepthState.last = None

    record_confidences.__wrapped__ = original  # type: ignore[attr-defined]
    return record_confidences


def _add_request(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``AdaptiveVerificationManager.add_request``: a new request in a slot starts at 1.0
    in the hook too."""

    def add_request(self: Any, req_idx: int) -> None:
        original(self, req_idx)
        if _DepthState.hook is not None:
            _DepthState.hook.add_request(int(req_idx))

    add_request.__wrapped__ = original  # type: ignore[attr-defined]
    return add_request


def _depth_hook(manager: Any, num_speculative_steps: int) -> Any:
    """The hook, built on first use from vLLM's profiled tables (rebuilt if they change)."""
    from av_core import CostTables
    from av_core.vllm.depth import DraftDepthHook

    tables = manager.cost_tables
    if _DepthState.hook is None or _DepthState.tables_source is not tables:
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


def _depth_problems(modules: Mapping[str, ModuleType]) -> list[str]:
    problems = []
    for module_name, class_name in DEPTH_SPECULATORS:
        where = f"{module_name}.{class_name}.propose"
        try:
            text = signature_text(resolve(modules[module_name], f"{class_name}.propose"))
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            problems.append(f"{where}: not found or not inspectable ({error})")
            continue
        if not text.startswith("(self, input_batch,") or "num_speculative_tokens=None" not in text:
            expected = "(self, input_batch, ..., num_speculative_tokens=None)"
            problems.append(f"{where}{text}: expected {expected}")
    problems += _signature_problems(
        modules,
        {(BUDGET_MODULE, dotted): text for dotted, text in DEPTH_MANAGER_SIGNATURES.items()},
    )
    return problems


def install_depth_control() -> list[Replacement]:
    """Checks the speculators and wraps their ``propose`` with drafting-depth control (module
    doc); raises :class:`VllmCompatibilityError` and patches nothing on any difference, and
    ``SettingError`` for a value of ``AV_CORE_VLLM_DEPTH`` or ``AV_CORE_VLLM_DRAFTER`` it does
    not take. Idempotent."""
    done = [entry for entry in _installed if entry.attribute == "propose"]
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
            attribute,
            inspect.getattr_static(manager, attribute),
            wrap(inspect.getattr_static(manager, attribute)),
        )
        for attribute, wrap in (
            ("__init__", _record_manager),
            ("record_confidences", _record_confidences),
            ("add_request", _add_request),
        )
    ]
    for module_name, class_name in DEPTH_SPECULATORS:
        owner = getattr(modules[module_name], class_name)
        original = inspect.getattr_static(owner, "propose")
        plan.append(
            Replacement(
                owner, f"{module_name}.{class_name}", "propose", original, _depth_propose(original)
            )
        )
    for entry in plan:
        setattr(entry.owner, entry.attribute, entry.replacement)
        _installed.append(entry)
        logger.info("av_core: depth control wraps %s.%s", entry.owner_name, entry.attribute)
    return [entry for entry in plan if entry.attribute == "propose"]


def install() -> list[Replacement]:
    """Check vLLM and swap in av_core's drop-ins (see the module doc); idempotent.

    Raises :class:`VllmCompatibilityError`, with every difference found, and patches nothing if
    vLLM's interfaces differ from those mirrored; ``SettingError`` (a ``ValueError``) naming
    every variable, and patches nothing, for a value of a variable it or its drop-ins read
    (``av_core._settings.VLLM_SETTINGS``, ``AV_CORE_SIMD`` included) that it does not take, or
    ``exact`` with ``map``.
    """
    if _installed:
        return list(_installed)
    # Every variable the plugin and its drop-ins read (AV_CORE_SIMD included), checked before
    # anything is patched: a value one does not take fails here, naming it (docs/settings.md).
    settings.check(settings.VLLM_SETTINGS)
    any_version = settings.VLLM_ANY_VERSION.require()
    # What every drop-in estimator will be built with: a bad value fails here, naming the
    # variable, before anything is patched (not later, inside vLLM's model runner).
    update, exact = choose_update(None, None, strict=True)
    version = engine_version("vllm")
    modules = {name: importlib.import_module(name) for name in (ESTIMATOR_MODULE, BUDGET_MODULE)}
    problems = check_interface(modules, None if any_version else version)
    serving = vllm_serving.wanted()
    if serving:
        serving_modules = {name: _import(name) for name in vllm_serving.modules_needed()}
        missing = [name for name, module in serving_modules.items() if module is None]
        problems += [f"{name}: cannot be imported" for name in missing]
        present = {name: m for name, m in serving_modules.items() if m is not None}
        problems += vllm_serving.problems(present, _signature_problems)
    if problems:
        raise VllmCompatibilityError(
            f"av_core's vLLM plugin ({ENV_ENABLE}=1) cannot run on this vLLM ({version}); "
            "nothing was patched. Differences:\n  - " + "\n  - ".join(problems)
        )
    plan = _plan(modules)
    if serving:
        plan += _serving_plan(present)
    for entry in plan:
        setattr(entry.owner, entry.attribute, entry.replacement)
        _installed.append(entry)
        logger.info("av_core: replaced %s", entry.describe())
    logger.info("av_core: vLLM %s runs adaptive verification on av_core", version)
    if exact:
        logger.info("av_core: %s=1: estimators refit with vLLM's unbounded update", ENV_EXACT)
    if update == "map":
        logger.info("av_core: %s=map: estimators refit with av_core's own update", ENV_ESTIMATOR)
    return list(_installed)


def uninstall() -> None:
    """Undo :func:`install` and :func:`install_depth_control` (for tests and for engines that
    switch back at runtime)."""
    _DepthState.hook = _DepthState.manager = _DepthState.tables_source = None
    _DepthState.last = None
    while _installed:
        entry = _installed.pop()
        setattr(entry.owner, entry.attribute, entry.original)
        logger.info("av_core: restored %s.%s", entry.owner_name, entry.attribute)


def installed() -> list[Replacement]:
    """The replacements in effect."""
    return list(_installed)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: :func:`install` when ``AV_CORE_VLLM=1``, and
    :func:`install_depth_control` when ``AV_CORE_VLLM_DEPTH`` is set (off by default)."""
    if settings.VLLM.require():
        install()
    else:
        logger.debug("av_core: %s is not set, vLLM keeps its own adaptive verification", ENV_ENABLE)
        ignored = [s.name for s in (settings.VLLM_ESTIMATOR, settings.VLLM_EXACT) if s.is_set()]
        if ignored:
            logger.warning(
                "av_core: %s set without %s=1: vLLM keeps its own estimator, so %s has no effect",
                " and ".join(ignored),
                ENV_ENABLE,
                "it" if len(ignored) == 1 else "they",
            )
    if settings.VLLM_DEPTH.require() != "off":
        install_depth_control()
