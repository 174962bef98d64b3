"""Drop-in replacements for vLLM's adaptive-verification pieces (0.32.x, 0.33.0), backed by av_core.

vLLM ships adaptive verification in ``vllm/v1/worker/gpu/spec_decode/``: an online acceptance
estimator (``acceptance_estimator.OnlineAcceptanceEstimator``) and the budget logic
(``adaptive_verification.build_cost_tables_from_curves``, ``_assign_draft_token_budget`` and
``AdaptiveVerificationManager.get_num_tokens``). This package mirrors their signatures, tensor
layouts and meaning, so :mod:`av_core.vllm.plugin` can swap them in without a fork:

- :class:`OnlineAcceptanceEstimator` (:mod:`~av_core.vllm.estimator`): same constructor, ``step``
  and ``predict``; the feature and the predictions are computed on the logits' device, the
  statistics and the Newton refit run in av_core's Rust estimator on the host. Its fixed-point
  statistics are order-independent, so every tensor-parallel rank fits bit-identical
  coefficients from the same verdicts, with no collective.
- :func:`build_cost_tables_from_curves`, :func:`assign_draft_token_budget` and
  :func:`batch_draft_budget` (the arithmetic of ``get_num_tokens``), on av_core's Rust planner
  (:mod:`~av_core.vllm.budget`).
- :func:`gpu_selfcheck` (:mod:`~av_core.vllm.selfcheck`): the estimator on CUDA against the host.

Around them, what the plugin wires into a running server: drafting-depth control
(:mod:`~av_core.vllm.depth`), warm restarts (:mod:`~av_core.vllm.state`), data-parallel pooling and
the serving hooks (:mod:`~av_core.vllm.serving`), Prometheus metrics (:mod:`~av_core.vllm.metrics`)
and the plugin itself (:mod:`~av_core.vllm.plugin`, also importable as ``av_core.vllm.plugin``).

torch is required (``pip install "av_core[torch]"``); vLLM is not: nothing here imports it.
"""

try:
    import torch  # noqa: F401 - checked here, once, before any module that needs it
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError(
        'av_core.vllm needs PyTorch, an optional dependency: pip install "av_core[torch]"'
    ) from error

from av_core.vllm.budget import (
    BatchDraftBudget,
    CostTablePair,
    assign_draft_token_budget,
    batch_draft_budget,
    build_cost_tables_from_curves,
)
from av_core.vllm.constants import (
    DAMPING_OBSERVATIONS,
    ENV_ESTIMATOR,
    ENV_EXACT,
    INIT_INTERCEPT,
    INIT_SLOPE,
    L2,
    MAX_LOG_ODDS,
    REFIT_INTERVAL,
    VLLM_VERSION,
)
from av_core.vllm.estimator import OnlineAcceptanceEstimator
from av_core.vllm.selfcheck import gpu_selfcheck

__all__ = [
    "DAMPING_OBSERVATIONS",
    "ENV_ESTIMATOR",
    "ENV_EXACT",
    "INIT_INTERCEPT",
    "INIT_SLOPE",
    "L2",
    "MAX_LOG_ODDS",
    "REFIT_INTERVAL",
    "VLLM_VERSION",
    "BatchDraftBudget",
    "CostTablePair",
    "OnlineAcceptanceEstimator",
    "assign_draft_token_budget",
    "batch_draft_budget",
    "build_cost_tables_from_curves",
    "gpu_selfcheck",
]
