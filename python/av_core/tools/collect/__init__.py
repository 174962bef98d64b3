"""Collects a real labeled draft trace with speculative sampling between two causal LMs.

The drafter proposes K tokens one at a time from its distribution q; the target scores the whole
block in one forward pass, giving p at each drafted position and one past it. Draft k is accepted
with probability ``min(1, p(x_k) / q(x_k))``; the first rejection resamples from
``norm(max(0, p - q))``; a fully accepted block samples a bonus token from p. This is Leviathan
et al.'s / Chen et al.'s speculative sampling, whose output is distributed exactly as the target's.
Verification is full (every draft is admitted), so each position up to and including the first
rejection gets a label, which is what an unbiased offline evaluation of the estimator needs.

The sampling math is in pure functions on float64 torch tensors (:func:`sampling_distribution`,
:func:`acceptance_probability`, :func:`residual_distribution`, :func:`verify_drafts`), tested on
tiny explicit distributions. Models are reached through the small :class:`CausalLM` protocol
(with KV caches, so a request costs linear, not quadratic, work); :class:`HuggingFaceCausalLM`
adapts a transformers model loaded from a directory or a GGUF file. transformers, gguf and
accelerate are needed for a real collection only (``pip install 'av_core[collect]'``).

One module per concern: :mod:`~av_core.tools.collect.sampling` (the math),
:mod:`~av_core.tools.collect.models` (the models), :mod:`~av_core.tools.collect.decoding` (one
request), :mod:`~av_core.tools.collect.prompts` (the prompts) and
:mod:`~av_core.tools.collect.collection` (a whole collection).
"""

from av_core.tools.collect.collection import (
    CollectSummary,
    collect,
    collect_prompts,
    completed_prompt_ids,
)
from av_core.tools.collect.decoding import (
    CollectConfig,
    RequestResult,
    speculative_decode,
)
from av_core.tools.collect.models import (
    CausalLM,
    HuggingFaceCausalLM,
)
from av_core.tools.collect.prompts import (
    Prompt,
    default_prompts,
    read_prompts,
    write_prompts,
)

# Importable here too, outside __all__.
from av_core.tools.collect.sampling import LOG_ODDS_CLAMP as LOG_ODDS_CLAMP
from av_core.tools.collect.sampling import (
    Verdict,
    acceptance_probability,
    draft_feature_columns,
    draft_labels,
    residual_distribution,
    sample_token,
    sampling_distribution,
    verify_drafts,
)

__all__ = [
    "CausalLM",
    "CollectConfig",
    "CollectSummary",
    "HuggingFaceCausalLM",
    "Prompt",
    "RequestResult",
    "Verdict",
    "acceptance_probability",
    "collect",
    "collect_prompts",
    "completed_prompt_ids",
    "default_prompts",
    "draft_feature_columns",
    "draft_labels",
    "read_prompts",
    "residual_distribution",
    "sample_token",
    "sampling_distribution",
    "speculative_decode",
    "verify_drafts",
    "write_prompts",
]
