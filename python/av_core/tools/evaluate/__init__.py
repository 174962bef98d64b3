"""Prequential evaluation of the online estimator on a labeled draft trace (``av-core evaluate``).

The estimator is replayed over the trace in decode order exactly as it runs in serving: each
decode step it predicts with its current coefficients, then observes that step's verdicts, and
every ``refit_interval`` observes it refits. Every draft is scored with the prediction made *at
draft time*, so no draft is ever scored by coefficients fitted on its own label (prequential,
"test then train"). The same replay is run on the other candidate features (the lossy
``logit(q_sampled)``, the top-2 margin, the entropy, a head score), and raw ``q_max`` is scored
without any fit, which gives the feature comparison table of the original write-up of the
method.

Each workload (prompt source) is also fitted offline by batch IRLS, to check that write-up's claim
that the slope is a property of the model pair (it barely moves across workloads) while the first
intercept tracks the drafter's mean entropy. See ``docs/evaluate.md``.

One module per concern: :mod:`~av_core.tools.evaluate.rounds` (the rounds layout),
:mod:`~av_core.tools.evaluate.online` (the prequential replay), :mod:`~av_core.tools.evaluate.fits`
(offline fits), :mod:`~av_core.tools.evaluate.evaluation` (:func:`evaluate_trace`) and
:mod:`~av_core.tools.evaluate.report` (tables and formats).
"""

from av_core.tools.evaluate.evaluation import (
    evaluate_trace,
)

# Importable here too, outside __all__.
from av_core.tools.evaluate.fits import BATCH_L2 as BATCH_L2
from av_core.tools.evaluate.fits import (
    MIN_CORRELATION_POINTS,
    BatchFit,
    Correlation,
    WorkloadFit,
    fit_batch,
)
from av_core.tools.evaluate.online import (
    DEFAULT_REFIT_INTERVAL,
    Replay,
    Trajectory,
    replay_online,
)
from av_core.tools.evaluate.online import MAX_FEATURE as MAX_FEATURE
from av_core.tools.evaluate.report import (
    ONLINE,
    RAW,
    Evaluation,
    FeatureScore,
    evaluation_preamble,
    evaluation_tables,
    evaluation_to_dict,
    format_evaluation,
    reliability_data,
)
from av_core.tools.evaluate.rounds import (
    MAX_ROUND_ENTRIES,
    DraftRounds,
)
from av_core.tools.evaluate.rounds import FloatArray as FloatArray
from av_core.tools.evaluate.rounds import IntArray as IntArray

__all__ = [
    "DEFAULT_REFIT_INTERVAL",
    "MIN_CORRELATION_POINTS",
    "MAX_ROUND_ENTRIES",
    "ONLINE",
    "RAW",
    "BatchFit",
    "Correlation",
    "DraftRounds",
    "Evaluation",
    "FeatureScore",
    "Replay",
    "Trajectory",
    "WorkloadFit",
    "evaluate_trace",
    "evaluation_preamble",
    "evaluation_tables",
    "evaluation_to_dict",
    "fit_batch",
    "format_evaluation",
    "reliability_data",
    "replay_online",
]
