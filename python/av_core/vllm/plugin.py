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
touching anything it checks vLLM's version, every signature and constant the replacements
mirror, what vLLM's own bodies of the replaced functions do (:data:`REPLACED_BODIES`: a
broadcast from rank 0, a new attribute or helper, another ``_batch_budget`` layout would be
dropped by the replacement) and how vLLM and its subclasses read ``_batch_budget``. An
*additive* change (a new optional parameter that the replacement takes too, a newer vLLM) is
accepted and logged; on any other difference it raises :class:`VllmCompatibilityError` listing
them and patches nothing: silently serving with a half-patched or mismatched vLLM would be worse
than not starting. ``AV_CORE_VLLM_ANY_VERSION=1`` waives the check that refuses versions older
than 0.32 only; the interface checks always run.

A subclass that defines ``get_num_tokens`` itself (where the base's patch never runs) is patched
the same way when its own definition keeps the contract (:func:`_get_num_tokens_contract`: the
signature and what the body does), and otherwise refused by name when a server builds one
(vllm#52559's ``DFlashAdaptiveKManager``: one K for the batch and the graph hints vLLM's model
runner reads); :mod:`av_core.vllm.patching` has the rules. Cost tables whose verify table is
by batch size and K (the same pull request's profile) price each step with its own batch
size's row (:class:`av_core.vllm.budget.ShapeCostTables`).

``AV_CORE_STATE_DIR`` (warm restarts) and ``AV_CORE_SHARE_STATS=dp`` (pooled statistics across
data-parallel ranks) wrap ``DraftModelSpeculator.load_model`` (and, for sharing,
``Worker.execute_dummy_batch``) as :mod:`av_core.vllm.serving` describes; their interfaces are
checked with the rest, before anything is patched. ``AV_CORE_VLLM_EXACT=1`` gives the estimator
vLLM's unbounded refit; metrics (``AV_CORE_METRICS_PORT``, ``PROMETHEUS_MULTIPROC_DIR``) start
with the first estimator, plugin or not.

Drafting-depth control (:mod:`av_core.vllm.depth_control`) is off unless ``AV_CORE_VLLM_DEPTH`` is
set to ``batch`` (or ``1``) or ``per_request``; :func:`register` then installs it too.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from av_core import _settings as settings
from av_core._engine_interface import (
    InterfaceReport,
    check_signature,
    engine_version,
    older_than,
    record_signature,
    resolve,
    signature_text,
)
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
from av_core.vllm.depth_control import (
    DEPTH_MANAGER_SIGNATURES,
    DEPTH_SPECULATORS,
    ENV_DEPTH,
    ENV_DRAFTER,
    _DepthState,
    install_depth_control,
)
from av_core.vllm.depth_control import DEPTH_READS as DEPTH_READS
from av_core.vllm.depth_control import _depth_hook as _depth_hook
from av_core.vllm.interface import (
    BUDGET_MODULE,
    ESTIMATOR_MODULE,
    PatchTarget,
    VllmCompatibilityError,
    body_problems,
    cost_table_layout,
    overrides,
    replaced_body_problems,
)
from av_core.vllm.interface import REPLACED_BODIES as REPLACED_BODIES
from av_core.vllm.patching import (
    Replacement,
    apply,
    installed,
    override_plan,
    restore,
    subclass_guard,
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
#: The releases whose interfaces the contract tests check: every 0.32 point release (0.32.x) and
#: 0.33.0 (their estimator files are identical; the manager differs in what av_core leaves alone).
SUPPORTED_VLLM_VERSIONS = ("0.32.x", "0.33.0")

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


def _signature_problems(
    modules: Mapping[str, ModuleType],
    expected: Mapping[tuple[str, str], str],
    report: InterfaceReport | None = None,
    replacements: Mapping[tuple[str, str], str] | None = None,
) -> list[str]:
    """Every live signature that differs from ``expected`` (``(module, dotted) -> text``) in a
    way that matters: an additive change (a new optional parameter) is accepted, and noted in
    ``report``, unless the definition is one av_core replaces (``replacements``: its
    replacement's signature) and the replacement does not take it."""
    found_report = InterfaceReport([], [])
    for (module_name, dotted), text in expected.items():
        taken_by = (replacements or {}).get((module_name, dotted))
        check_signature(found_report, modules, module_name, dotted, text, taken_by=taken_by)
    if report is not None:
        report.accepted.extend(found_report.accepted)
    return found_report.problems


def _replacement_signatures() -> dict[tuple[str, str], str]:
    """The signatures of av_core's replacements of :data:`EXPECTED_SIGNATURES`."""
    from av_core import vllm as drop_ins

    estimator = drop_ins.OnlineAcceptanceEstimator
    ours: dict[str, Callable[..., Any]] = {
        "OnlineAcceptanceEstimator.__init__": estimator.__init__,
        "OnlineAcceptanceEstimator.step": estimator.step,
        "OnlineAcceptanceEstimator.predict": estimator.predict,
        "build_cost_tables_from_curves": drop_ins.build_cost_tables_from_curves,
        "_assign_draft_token_budget": drop_ins.assign_draft_token_budget,
        "AdaptiveVerificationManager.get_num_tokens": _get_num_tokens,
    }
    return {key: signature_text(ours[key[1]]) for key in EXPECTED_SIGNATURES}


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


def interface_report(modules: Mapping[str, ModuleType], version: str | None) -> InterfaceReport:
    """Every difference between the live vLLM modules and what the drop-ins mirror, split into
    refusals and accepted additive changes. ``version=None`` skips the version check."""
    report = InterfaceReport([], [])
    if version is not None and not version_supported(version):
        if older_than(version, "0.32.0"):
            report.problems.append(
                f"vLLM version {version} is older than those av_core's plugin was written "
                f"against ({', '.join(SUPPORTED_VLLM_VERSIONS)}); set {ENV_ANY_VERSION}=1 to "
                "try it anyway (the interface checks still apply)"
            )
        else:
            report.accepted.append(
                f"vLLM {version} is not a release the contract tests read "
                f"({', '.join(SUPPORTED_VLLM_VERSIONS)}): installed because every interface "
                "check passes"
            )
    report.problems.extend(
        _signature_problems(modules, EXPECTED_SIGNATURES, report, _replacement_signatures())
    )
    for (module_name, dotted), expected_value in EXPECTED_CONSTANTS.items():
        where = f"{module_name}.{dotted}"
        try:
            value = resolve(modules[module_name], dotted)
        except (AttributeError, KeyError) as error:
            report.problems.append(f"{where}: not found ({error})")
            continue
        if value != expected_value:
            report.problems.append(f"{where} = {value!r}, expected {expected_value!r}")
    budget_module = modules.get(BUDGET_MODULE)
    if budget_module is not None and not hasattr(
        budget_module, "_assign_draft_token_budget_compiled"
    ):
        report.problems.append(f"{BUDGET_MODULE}._assign_draft_token_budget_compiled: not found")
    report.problems.extend(body_problems(modules, report))
    return report


def check_interface(modules: Mapping[str, ModuleType], version: str | None) -> list[str]:
    """The refusals of :func:`interface_report` (empty when compatible)."""
    return interface_report(modules, version).problems


def _get_num_tokens(
    self: Any, num_tokens_per_req: dict[str, int], draft_tokens: dict[str, list[int]]
) -> int:
    """``AdaptiveVerificationManager.get_num_tokens`` on av_core's planner: the step's token
    count once the draft budget is trimmed, with the budget stashed in ``_batch_budget`` for the
    compaction that follows, exactly as vLLM's method does."""
    from av_core.vllm import batch_draft_budget

    if self.cost_tables is None:
        raise RuntimeError("adaptive verification has no cost tables yet (profiling did not run)")
    cost_table_layout(self.cost_tables, type(self).__name__)
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


_GET_NUM_TOKENS = (BUDGET_MODULE, "AdaptiveVerificationManager.get_num_tokens")


def _get_num_tokens_contract(method: Any, where: str) -> list[str]:
    """How a subclass's own ``get_num_tokens`` departs from vLLM's, which av_core's replaces:
    its signature (an addition :func:`_get_num_tokens` takes is fine) and what its body does
    beyond :data:`REPLACED_BODIES` (other attributes, helpers, a collective, another
    ``_batch_budget``)."""
    report = InterfaceReport([], [])
    try:
        found = signature_text(method)
    except (TypeError, ValueError) as error:
        return [f"{where}: not inspectable ({error})"]
    expected = EXPECTED_SIGNATURES[_GET_NUM_TOKENS]
    record_signature(report, where, expected, found, taken_by=signature_text(_get_num_tokens))
    body = replaced_body_problems(method, where, *REPLACED_BODIES[_GET_NUM_TOKENS])
    if body is None:
        body = [f"{where}: source not readable, its body cannot be checked"]
    return report.problems + body


def _budget_targets(manager: type) -> list[PatchTarget]:
    return [
        PatchTarget(
            manager,
            f"{BUDGET_MODULE}.AdaptiveVerificationManager",
            "get_num_tokens",
            _get_num_tokens_contract,
            lambda _original: _get_num_tokens,
        )
    ]


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
        *override_plan(overrides(_budget_targets(manager))),
        *subclass_guard(_budget_targets(manager)),
    ]
    # Modules that bound a name with `from ... import` before the patch keep the original unless
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


def install() -> list[Replacement]:
    """Check vLLM and swap in av_core's drop-ins (see the module doc); idempotent.

    Raises :class:`VllmCompatibilityError`, with every difference found, and patches nothing if
    vLLM's interfaces differ from those mirrored; ``SettingError`` (a ``ValueError``) naming
    every variable, and patches nothing, for a value of a variable it or its drop-ins read
    (``av_core._settings.VLLM_SETTINGS``, ``AV_CORE_SIMD`` included) that it does not take, or
    ``exact`` with ``map``.
    """
    if any(entry.attribute == "OnlineAcceptanceEstimator" for entry in installed()):
        return installed()
    # Every variable the plugin and its drop-ins read (AV_CORE_SIMD included), checked before
    # anything is patched: a value one does not take fails here, naming it (docs/settings.md).
    settings.check(settings.VLLM_SETTINGS)
    any_version = settings.VLLM_ANY_VERSION.require()
    # What every drop-in estimator will be built with: a bad value fails here, naming the
    # variable, before anything is patched (not later, inside vLLM's model runner).
    update, exact = choose_update(None, None, strict=True)
    version = engine_version("vllm")
    modules = {name: importlib.import_module(name) for name in (ESTIMATOR_MODULE, BUDGET_MODULE)}
    report = interface_report(modules, None if any_version else version)
    problems = report.problems
    serving = vllm_serving.wanted()
    if serving:
        serving_modules = {name: _import(name) for name in vllm_serving.modules_needed()}
        missing = [name for name, module in serving_modules.items() if module is None]
        problems += [f"{name}: cannot be imported" for name in missing]
        present = {name: m for name, m in serving_modules.items() if m is not None}
        problems += vllm_serving.problems(
            present, lambda mods, expected: _signature_problems(mods, expected, report)
        )
    if problems:
        raise VllmCompatibilityError(
            f"av_core's vLLM plugin ({ENV_ENABLE}=1) cannot run on this vLLM ({version}); "
            "nothing was patched. Differences:\n  - " + "\n  - ".join(problems)
        )
    plan = _plan(modules)
    if serving:
        plan += _serving_plan(present)
    apply(plan)
    for change in report.accepted:
        logger.info("av_core: accepted an additive change of vLLM: %s", change)
    logger.info("av_core: vLLM %s runs adaptive verification on av_core", version)
    if exact:
        logger.info("av_core: %s=1: estimators refit with vLLM's unbounded update", ENV_EXACT)
    if update == "map":
        logger.info("av_core: %s=map: estimators refit with av_core's own update", ENV_ESTIMATOR)
    return installed()


def uninstall() -> None:
    """Undo :func:`install` and :func:`install_depth_control` (for tests and for engines that
    switch back at runtime)."""
    _DepthState.hook = _DepthState.manager = _DepthState.tables_source = None
    _DepthState.last = None
    for entry in restore():
        logger.info("av_core: restored %s.%s", entry.owner_name, entry.attribute)


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
