""":func:`speculative_decode`: one request decoded by speculative sampling between a drafter and a
target, every drafted position with its features and, under full verification, its label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from av_core._native import InvalidValueError
from av_core.tools.collect.models import CausalLM
from av_core.tools.collect.sampling import (
    draft_feature_columns,
    draft_labels,
    sample_token,
    sampling_distribution,
    verify_drafts,
)

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CollectConfig:
    """Sampling settings of a collection (the same for drafter and target)."""

    num_drafts: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_drafts < 1:
            raise InvalidValueError(f"num_drafts must be >= 1, got {self.num_drafts}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise InvalidValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class RequestResult:
    """Rows of one request, the tokens drafted at each step, and the tokens it generated."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)


def speculative_decode(
    target: CausalLM,
    drafter: CausalLM,
    prompt_ids: Sequence[int],
    config: CollectConfig,
    generator: torch.Generator,
    stop_ids: Iterable[int] = (),
    on_step: Callable[[list[int]], None] | None = None,
) -> RequestResult:
    """Generates up to ``max_new_tokens`` tokens by speculative sampling, one row per draft.

    Cache invariants: the target's cache covers the committed sequence minus its last token (the
    last token is fed with the drafts, so one forward pass yields p at every drafted position and
    one past the block); the drafter's covers a prefix of the committed sequence. After a verdict
    both are cropped back to the accepted prefix. Rows carry no request fields; the caller adds
    them. ``on_step`` receives each step's labels.
    """
    import torch

    if not prompt_ids:
        raise InvalidValueError("prompt_ids must not be empty, got []")
    stops = set(stop_ids)
    k_max = config.num_drafts
    sequence = list(prompt_ids)
    target_cache, drafter_cache = target.new_cache(), drafter.new_cache()
    result = RequestResult()
    step = 0
    while len(result.generated) < config.max_new_tokens:
        feed = sequence[drafter.cache_length(drafter_cache) :]
        drafts: list[int] = []
        q_rows, logit_rows = [], []
        for _ in range(k_max):
            logits = drafter.forward(feed, drafter_cache, 1)[-1]
            q = sampling_distribution(logits, config.temperature, config.top_p)
            token = sample_token(q, generator)
            drafts.append(token)
            q_rows.append(q)
            logit_rows.append(logits)
            feed = [token]
        committed = len(sequence)
        target_logits = target.forward(
            sequence[target.cache_length(target_cache) :] + drafts, target_cache, k_max + 1
        )
        if target_logits.shape[-1] != q_rows[0].shape[-1]:
            raise InvalidValueError(
                f"target and drafter vocabularies differ: {target_logits.shape[-1]} vs "
                f"{q_rows[0].shape[-1]} logits"
            )
        p = sampling_distribution(target_logits, config.temperature, config.top_p)
        verdict = verify_drafts(p, torch.stack(q_rows), drafts, generator)
        labels = draft_labels(verdict.num_accepted, k_max)
        features = draft_feature_columns(torch.stack(logit_rows), config.temperature, drafts)
        for k in range(k_max):
            row: dict[str, Any] = {
                "step": step,
                "position": k,
                "temperature": config.temperature,
                "top_p": config.top_p,
                "admitted": True,
                "label": labels[k],
                "acceptance_probability": verdict.acceptance_probability[k],
            }
            row.update({name: values[k] for name, values in features.items()})
            result.rows.append(row)
        result.drafts.append(drafts)
        new_tokens = drafts[: verdict.num_accepted] + [verdict.next_token]
        target.crop(target_cache, committed + verdict.num_accepted)
        drafter.crop(
            drafter_cache,
            min(drafter.cache_length(drafter_cache), committed + verdict.num_accepted),
        )
        sequence.extend(new_tokens)
        result.generated.extend(new_tokens)
        step += 1
        if on_step is not None:
            on_step(labels)
        if stops.intersection(new_tokens):
            break
    return result
