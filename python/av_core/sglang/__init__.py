"""SGLang: a cost-aware policy for its adaptive speculative decoding, backed by av_core.

SGLang's adaptive mode (``--speculative-adaptive``, EAGLE/EAGLE3, ``topk = 1``) switches the
drafting depth (``speculative_num_steps``) between pre-built runtime states through a small policy
interface, ``AdaptiveSpecPolicy`` (``sglang/srt/speculative/adaptive_runtime_state.py``), driven by
its ``AdaptiveController``: ``get_steps_for_batch(batch_size)`` before each decode batch,
``on_verify_complete(num_correct_drafts_per_req, batch_size)`` after its verify, and on SGLang
main also ``on_state_activated(steps)`` on every switch, ``num_steps`` with each verify and an
optional start-up profiling protocol. Its built-in policies (``AdaptiveSpeculativeParams``, an
EMA of the accepted length; on main also ``ThroughputAwarePolicy``) are replaced by av_core's.

:mod:`av_core.sglang.policy` holds the policy (:class:`CostAwarePolicy`: acceptance from av_core's
estimator, cost from av_core cost tables, hysteresis, probes, deterministic and lossless;
:class:`ProfilingCostAwarePolicy`: costs from SGLang's own start-up profiling) and
:mod:`av_core.sglang.installer` the entry point that swaps it in after checking SGLang's
interfaces (:func:`install`, :func:`register`): SGLang 0.5.23 and main's additive changes are
accepted, anything changed refused by name. ``docs/sglang.md`` has the details. Nothing here
imports SGLang except the installer, and only when it runs.
"""

from av_core._engine_interface import InterfaceReport
from av_core.sglang.installer import install, installed, register, uninstall
from av_core.sglang.interface import (
    CALL_SITES,
    CONTROLLER_SIGNATURES,
    ENV_ANY_VERSION,
    ENV_COSTS,
    ENV_DRAFTER,
    ENV_ENABLE,
    ENV_MAX_BATCH,
    ENV_PROFILE,
    MAIN_SIGNATURES,
    PARAMS_MODULE,
    POLICY_CLASSES,
    POLICY_METHODS,
    POLICY_PROPERTIES,
    PROCESSOR_MODULE,
    PROFILING_METHODS,
    RUNTIME_STATE_MODULE,
    SUPPORTED_SGLANG_VERSIONS,
    THROUGHPUT_MODULE,
    WORKER_MODULE,
    SglangCompatibilityError,
    calls_to,
    check_interface,
    construction_sites,
    interface_report,
    policy_calls,
    policy_constructions,
)
from av_core.sglang.interface import (
    ENV_SKIP_ZERO_STEP_EXTEND as ENV_SKIP_ZERO_STEP_EXTEND,
)
from av_core.sglang.policy import (
    CostAwarePolicy,
    config_candidate_steps,
    load_cost_tables,
)
from av_core.sglang.profiling import ProfilePlan, ProfilePoint, ProfilingCostAwarePolicy

__all__ = [
    "CALL_SITES",
    "CONTROLLER_SIGNATURES",
    "ENV_ANY_VERSION",
    "ENV_COSTS",
    "ENV_DRAFTER",
    "ENV_ENABLE",
    "ENV_MAX_BATCH",
    "ENV_PROFILE",
    "MAIN_SIGNATURES",
    "PARAMS_MODULE",
    "POLICY_CLASSES",
    "POLICY_METHODS",
    "POLICY_PROPERTIES",
    "PROCESSOR_MODULE",
    "PROFILING_METHODS",
    "RUNTIME_STATE_MODULE",
    "SUPPORTED_SGLANG_VERSIONS",
    "THROUGHPUT_MODULE",
    "WORKER_MODULE",
    "CostAwarePolicy",
    "InterfaceReport",
    "ProfilePlan",
    "ProfilePoint",
    "ProfilingCostAwarePolicy",
    "SglangCompatibilityError",
    "calls_to",
    "check_interface",
    "config_candidate_steps",
    "construction_sites",
    "install",
    "installed",
    "interface_report",
    "load_cost_tables",
    "policy_calls",
    "policy_constructions",
    "register",
    "uninstall",
]
