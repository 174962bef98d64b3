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

Errors: bad input raises ``ValueError`` or ``TypeError`` naming the argument. Some value errors
have their own subclass of ``ValueError``, so that a caller can tell them apart without reading
the message: :class:`StateError` (saved state that is corrupt, truncated, of another kind or of
a format version this build does not read), :class:`DepthTableError` (the cost tables lack the
draft-depth table a depth decision needs, or it covers other positions),
:class:`BufferChangedError` (another thread wrote an input buffer during the call) and
:class:`OutOfMemoryError` (no memory for a copy of an argument).
"""

from av_core import _native
from av_core._native import (
    AcceptanceEstimator,
    BufferChangedError,
    CostTables,
    DepthPlan,
    DepthTableError,
    EstimatorConfig,
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

try:
    _native.check_environment()
except ValueError as _error:  # a typo must not pass unnoticed; the kernels run on the baseline
    import warnings as _warnings

    _warnings.warn(f"{_error} (running the baseline kernels)", RuntimeWarning, stacklevel=2)

__all__ = [
    "AcceptanceEstimator",
    "BufferChangedError",
    "CostTables",
    "DepthPlan",
    "DepthTableError",
    "EstimatorConfig",
    "OutOfMemoryError",
    "StateError",
    "VerificationPlan",
    "VerificationPlanner",
    "__version__",
    "assign_draft_budget",
    "choose_draft_budget",
    "choose_draft_depth",
    "plan_verification",
]
