"""The drafter-side feature: log-odds of the drafter's most likely token, from raw logits.

For one row of drafter logits ``z`` and temperature ``T`` the drafter samples from
``q = softmax(z / T)`` (``T <= 0`` is greedy and leaves the logits unscaled, as vLLM does). The
feature is ``x = logit(q_max) = log q_max - log(1 - q_max)``, computed as

    x = -log( sum over every entry but one occurrence of the maximum m of exp((z - m) / T) )

so the mass ``1 - q_max`` is summed directly instead of being recovered as ``total - 1``, which in
float32 loses everything below ``2**-24`` and sends a confident row to the clamp. Ties at the
maximum keep the second occurrence in the sum, so two equal maxima give ``x = log(q / (1 - q))`` of
one of them. A row with a single finite entry gives ``+max_log_odds``; every value is clamped to
``[-max_log_odds, max_log_odds]``.

The feature reads the drafter's distribution, never the token drawn from it: a verification
decision that depended on the drawn token would bias the emitted distribution (``docs/design.md``,
"Losslessness"). The ``sampled_*`` functions do read it, and exist for offline evaluation only.

One concern per module: ``checks`` (arguments), ``stats`` (the torch path), ``native`` (the
fused Rust kernel on the CPU), ``triton_kernels`` (the CUDA kernels), ``truncation`` (top-k and
top-p), ``log_odds`` (:func:`draft_log_odds`), ``partials`` (vocabulary-parallel drafters),
``alternatives`` (other signals, offline only), ``host`` (hand-over to the host) and
``extractor`` (:class:`FeatureExtractor`). The names below are the public interface.

torch is an optional dependency (``pip install "av_core[torch]"``); ``import av_core`` does not
import this package.
"""

try:
    import torch  # noqa: F401 - checked here, once, before any module that needs it
except ImportError as error:  # pragma: no cover - exercised in a subprocess without torch
    raise ImportError(
        'av_core.features needs PyTorch, an optional dependency: pip install "av_core[torch]"'
    ) from error

from av_core.features.alternatives import (
    entropy,
    q_max,
    sampled_gumbel,
    sampled_log_odds,
    top2_margin,
)
from av_core.features.checks import MAX_LOG_ODDS
from av_core.features.extractor import MAX_FEATURE_ENTRIES, FeatureExtractor
from av_core.features.host import as_numpy, to_host
from av_core.features.log_odds import draft_log_odds
from av_core.features.partials import combine_partials, partial_stats
from av_core.features.stats import PartialStats

__all__ = [
    "MAX_FEATURE_ENTRIES",
    "MAX_LOG_ODDS",
    "FeatureExtractor",
    "PartialStats",
    "as_numpy",
    "combine_partials",
    "draft_log_odds",
    "entropy",
    "partial_stats",
    "q_max",
    "sampled_gumbel",
    "sampled_log_odds",
    "to_host",
    "top2_margin",
]
