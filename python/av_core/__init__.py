"""av_core: adaptive verification for speculative decoding with any drafter.

Each decode step a serving engine asks two questions, and av_core answers both fast enough for
a scheduler's critical path:

1. How likely is each drafted token to be accepted by the target? :class:`AcceptanceEstimator`
   fits ``p = sigmoid(slope * x + intercept[k])`` online on the drafter's ``x = logit(q_max)``,
   recalibrated from the target's own verdicts.
2. Which drafts are worth verifying? The planner weighs expected accepted tokens against
   measured step costs.

``import av_core`` needs only numpy; torch is imported by :mod:`av_core.features`,
:mod:`av_core.planner_torch` and :mod:`av_core.vllm` alone.

The package has three roles: the runtime a scheduler imports (this module, :mod:`av_core.features`,
:mod:`av_core.planner_torch`, :mod:`av_core.distributed`, :mod:`av_core.testing`), the engine
integrations (:mod:`av_core.vllm`, :mod:`av_core.sglang`) and the offline tools
(:mod:`av_core.tools`: the ``av-core`` command line, traces, evaluation, simulation), which
importing av_core never imports.

Errors: every exception class av_core defines derives from :class:`Error`, and each is still
the builtin it always was, so ``except ValueError`` and ``except av_core.Error`` both work. Bad
input raises :class:`InvalidValueError` (a ``ValueError``) or :class:`InvalidTypeError` (a
``TypeError``) naming the argument. Some value errors have their own subclass of
:class:`InvalidValueError`, so that a caller can tell them apart without reading the message:
:class:`StateError` (saved state that is corrupt, truncated, of another kind or of a format
version this build does not read), :class:`DepthTableError` (the cost tables lack the
draft-depth table a depth decision needs, or it covers other positions),
:class:`BufferChangedError` (another thread wrote an input buffer during the call),
:class:`OutOfMemoryError` (no memory for a copy of an argument) and :class:`SettingError` (an
environment variable holds a value av_core does not take; docs/settings.md). The engine
integrations' compatibility errors are ``av_core.Error`` and ``RuntimeError``. A call that does
not match a signature at all (an unknown keyword, a missing argument) is Python's own
``TypeError``, as for any function.
"""

from av_core._native import (
    AcceptanceEstimator,
    BufferChangedError,
    CostTables,
    DepthPlan,
    DepthTableError,
    Error,
    EstimatorConfig,
    InvalidTypeError,
    InvalidValueError,
    OutOfMemoryError,
    StateError,
    VerificationPlan,
    VerificationPlanner,
    __version__,
    assign_draft_budget,
    choose_draft_budget,
    choose_draft_depth,
    plan_verification,
)
from av_core._settings import SIMD as _SIMD
from av_core._settings import SettingError

# AV_CORE_SIMD, read leniently here (docs/settings.md): a typo must not pass unnoticed, and the
# kernels run on the baseline.
if (_problem := _SIMD.problem()) is not None:
    import warnings as _warnings

    _warnings.warn(f"{_problem} (running the baseline kernels)", RuntimeWarning, stacklevel=2)

__all__ = [
    "AcceptanceEstimator",
    "BufferChangedError",
    "CostTables",
    "DepthPlan",
    "DepthTableError",
    "Error",
    "EstimatorConfig",
    "InvalidTypeError",
    "InvalidValueError",
    "OutOfMemoryError",
    "SettingError",
    "StateError",
    "VerificationPlan",
    "VerificationPlanner",
    "__version__",
    "assign_draft_budget",
    "choose_draft_budget",
    "choose_draft_depth",
    "plan_verification",
]
