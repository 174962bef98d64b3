"""The sampling math of speculative sampling, in pure functions on float64 torch tensors (tested on
tiny explicit distributions): the distribution sampled from, the acceptance probability, the
residual after a rejection, verification of a block, its labels and the drafter features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from av_core import _native
from av_core._native import InvalidValueError
from av_core.tools.trace import UNLABELED

if TYPE_CHECKING:
    import torch


#: Features are clamped to [-X, X] like the estimator's (``docs/design.md``, "The estimator"), so
#: one overconfident position cannot dominate a fit: the core's clamp.
LOG_ODDS_CLAMP = _native.MAX_LOG_ODDS


def sampling_distribution(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution a model samples from, in float64: ``softmax(z / T)`` cut to the top-p set.

    ``temperature <= 0`` is greedy: a one-hot row at the argmax. ``top_p < 1`` keeps the smallest
    set of most likely tokens whose mass reaches ``top_p`` (a token is kept while the mass strictly
    before it is below ``top_p``, so the most likely token always survives) and renormalizes.
    Drafter and target use the same rule, and speculative sampling is exact for any pair of
    distributions, so top-p changes what is sampled, never the losslessness.
    """
    import torch

    if not 0.0 < top_p <= 1.0:
        raise InvalidValueError(f"top_p must lie in (0, 1], got {top_p}")
    if not math.isfinite(temperature):
        raise InvalidValueError(f"temperature must be finite, got {temperature}")
    z = logits.to(torch.float64)
    if temperature <= 0.0:
        greedy = torch.zeros_like(z)
        return greedy.scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
    probs = torch.softmax(z / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, before < top_p)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def acceptance_probability(p_token: torch.Tensor, q_token: torch.Tensor) -> torch.Tensor:
    """``min(1, p(x) / q(x))`` for drafted tokens x (q(x) > 0 because x was drawn from q).

    This is the largest acceptance rule that never emits x more often than the target would:
    accepted mass ``q(x) * min(1, p/q) = min(q(x), p(x)) <= p(x)``; the residual supplies the rest.
    """
    import torch

    if bool((q_token <= 0).any()):
        raise InvalidValueError(
            f"q_token must be > 0 (drafted tokens have q > 0), got {q_token.tolist()}"
        )
    return torch.clamp(p_token / q_token, max=1.0)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))``: where a rejection resamples from.

    It carries exactly the mass ``p(x) - min(p(x), q(x))`` that acceptance left out, so accepted
    plus resampled tokens are distributed as p. If p == q (no residual mass; a rejection then has
    probability 0) it falls back to p.
    """
    import torch

    residual = torch.clamp(p - q, min=0.0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / torch.where(total > 0, total, 1.0), p)


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from a 1-D distribution by inverse CDF: the first x with ``cumsum(probs)[x] > u``.

    ``u ~ U(0, total)``, so x is drawn with probability ``probs[x] / total`` and an entry of
    probability 0 is never drawn. Several times faster than ``torch.multinomial`` on a 150k
    vocabulary in float64.
    """
    import torch

    cumulative = probs.cumsum(-1)
    u = torch.rand(1, generator=generator, dtype=torch.float64) * cumulative[-1]
    index = int(torch.searchsorted(cumulative, u, right=True))
    return min(index, int(probs.shape[-1]) - 1)


@dataclass(frozen=True)
class Verdict:
    """The target's verdict on one block of K drafts."""

    num_accepted: int
    next_token: int
    acceptance_probability: list[float]


def verify_drafts(
    p: torch.Tensor, q: torch.Tensor, drafts: Sequence[int], generator: torch.Generator
) -> Verdict:
    """Speculative sampling over one block: accepts a prefix of ``drafts`` and draws one more token.

    ``p`` is [K + 1, V] (the target's distribution at each drafted position and one past the
    block), ``q`` is [K, V] (the drafter's), ``drafts`` the K drafted token ids. Draws K uniforms
    (always K, so a block consumes the same randomness whatever its outcome), accepts draft k
    while ``u_k < min(1, p_k(x_k) / q_k(x_k))``, and at the first rejection A draws the next
    token from :func:`residual_distribution` (p_A, q_A); if all K are accepted, from p_K.
    """
    import torch

    num_drafts = len(drafts)
    if q.ndim != 2 or q.shape[0] != num_drafts:
        raise InvalidValueError(f"q must have shape [{num_drafts}, V], got {tuple(q.shape)}")
    if p.ndim != 2 or p.shape[0] != num_drafts + 1 or p.shape[1] != q.shape[1]:
        raise InvalidValueError(
            f"p must have shape [{num_drafts + 1}, {q.shape[1]}], got {tuple(p.shape)}"
        )
    index = torch.as_tensor(list(drafts), dtype=torch.long).reshape(-1, 1)
    p_token = p[:num_drafts].gather(1, index).squeeze(1)
    q_token = q.gather(1, index).squeeze(1)
    accept = acceptance_probability(p_token, q_token)
    uniforms = torch.rand(num_drafts, generator=generator, dtype=torch.float64)
    rejected = torch.nonzero(uniforms >= accept).flatten()
    num_accepted = int(rejected[0]) if rejected.numel() else num_drafts
    if num_accepted < num_drafts:
        source = residual_distribution(p[num_accepted], q[num_accepted])
    else:
        source = p[num_drafts]
    next_token = sample_token(source, generator)
    return Verdict(num_accepted, next_token, [float(a) for a in accept.tolist()])


def draft_labels(num_accepted: int, num_admitted: int) -> list[int]:
    """Labels of K positions: 1 for k < A, 0 for k = A < admitted, unlabeled (-1) otherwise."""
    if not 0 <= num_accepted <= num_admitted:
        raise InvalidValueError(
            f"num_accepted must lie in [0, num_admitted={num_admitted}], got {num_accepted}"
        )
    return [
        1 if k < num_accepted else 0 if k == num_accepted else UNLABELED
        for k in range(num_admitted)
    ]


def _log_odds_at(z: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``z_i - logsumexp(z without entry i)``, i.e. log q_i - log(1 - q_i) without cancellation."""
    import torch

    chosen = z.gather(-1, index)
    others = torch.logsumexp(z.scatter(-1, index, -math.inf), dim=-1, keepdim=True)
    return (chosen - others).squeeze(-1).clamp(-LOG_ODDS_CLAMP, LOG_ODDS_CLAMP)


def draft_feature_columns(
    logits: torch.Tensor, temperature: float, drafts: Sequence[int]
) -> dict[str, list[float]]:
    """Drafter features of K positions from their logits [K, V], computed in float64.

    - ``logit_q_max = m - logsumexp(z without one occurrence of the max m)``, z = logits / T
      (T <= 0 leaves z unscaled): exact as q_max -> 1, clamped to ±40. It never reads the
      drafted token, which is what keeps adaptive verification lossless (``docs/design.md``,
      "Losslessness").
    - ``logit_q_sampled``: the same log-odds for the drafted token (lossy: it reads the token).
    - ``top2_margin = z_(1) - z_(2) = log q_(1) - log q_(2)``.
    - ``entropy = -sum q log q`` in nats.
    """
    import torch

    z = logits.to(torch.float64)
    if temperature > 0.0:
        z = z / temperature
    max_index = z.argmax(-1, keepdim=True)
    drafted = torch.as_tensor(list(drafts), dtype=torch.long).reshape(-1, 1)
    top2 = z.topk(min(2, z.shape[-1]), dim=-1).values
    margin = top2[:, 0] - top2[:, 1] if z.shape[-1] > 1 else torch.full_like(top2[:, 0], math.nan)
    log_q = torch.log_softmax(z, dim=-1)
    entropy = -torch.where(log_q > -math.inf, log_q.exp() * log_q, torch.zeros_like(log_q)).sum(-1)
    return {
        "logit_q_max": _log_odds_at(z, max_index).tolist(),
        "logit_q_sampled": _log_odds_at(z, drafted).tolist(),
        "top2_margin": margin.tolist(),
        "entropy": entropy.tolist(),
    }
