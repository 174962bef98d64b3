"""Other confidence signals, for offline comparison only (``av-core evaluate``): raw ``q_max``,
the top-2 margin, the entropy, and the ``sampled_*`` features of the drawn token.

The ``sampled_*`` functions read the sampled token, so gating verification on them would bias
the emitted distribution: they are LOSSY and exist for evaluation alone.
"""

from __future__ import annotations

import math

import torch

from av_core.features.checks import (
    MAX_LOG_ODDS,
    _check_logits,
    _check_max_log_odds,
    _check_temperature,
    _check_tokens,
    _temperature_rows,
)
from av_core.features.stats import (
    _CPU_BLOCK_BYTES,
    _LN2,
    _block_rows,
    _log_odds_from_stats,
    _stats_for_rows,
)


def q_max(logits: torch.Tensor, temperature: float | torch.Tensor | None = None) -> torch.Tensor:
    """Raw ``q_max = 1 / (1 + complement)`` in float32, for offline comparison.

    It saturates at exactly 1 once the complement falls below ``2**-24``, which is the loss of
    resolution :func:`draft_log_odds` exists to avoid; do not feed it to the estimator.
    """
    logits = _check_logits(logits)
    temp = _check_temperature(temperature, logits.shape[0], logits.device)
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        stats = _stats_for_rows(logits, temp, None)
        q = 1.0 / (1.0 + stats.complement)
        return torch.where(torch.isfinite(stats.max), q, torch.full_like(q, math.nan))


def _drawn_token_args(
    logits: object, tokens: object, temperature: float | torch.Tensor | None, max_log_odds: float
) -> tuple[torch.Tensor, torch.Tensor, float | torch.Tensor, float]:
    """The checked ``(logits, tokens, temperature, max_log_odds)`` of the ``sampled_*`` features."""
    checked = _check_logits(logits)
    max_log_odds = _check_max_log_odds(max_log_odds)
    n, vocab = checked.shape
    token_rows = _check_tokens(tokens, n, vocab, checked.device)
    return checked, token_rows, _check_temperature(temperature, n, checked.device), max_log_odds


def sampled_log_odds(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
    *,
    max_log_odds: float = MAX_LOG_ODDS,
) -> torch.Tensor:
    """``logit(q(token))`` of the drawn token, clamped. OFFLINE EVALUATION ONLY: LOSSY.

    It reads the sampled token, so gating verification on it biases the emitted distribution
    (with p = (.5, .5), q = (.2, .8) and "verify only if q(x) >= .5" the output is (.4, .6);
    ``docs/design.md``, "Losslessness"). Computed as
    ``(z_t - m) / T - log(sum over j != t of exp((z_j - m) / T))``.
    """
    logits, tokens, temp, max_log_odds = _drawn_token_args(
        logits, tokens, temperature, max_log_odds
    )
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        return _log_odds_from_stats(_stats_for_rows(logits, temp, None, tokens), max_log_odds)


def sampled_gumbel(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
    *,
    max_log_odds: float = MAX_LOG_ODDS,
) -> torch.Tensor:
    """``-log(-log q(token))`` of the drawn token, clamped. OFFLINE EVALUATION ONLY: LOSSY.

    Reads the sampled token, with the same bias as :func:`sampled_log_odds`. ``-log q`` is
    ``log1p(complement)`` when the token is a maximum (exact as q -> 1) and
    ``log(exp(d) + complement) - d`` with ``d = (z_t - m) / T < 0`` otherwise.
    """
    logits, tokens, temp, max_log_odds = _drawn_token_args(
        logits, tokens, temperature, max_log_odds
    )
    if logits.shape[0] == 0:
        return torch.empty(0, dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        stats = _stats_for_rows(logits, temp, None, tokens)
        d = stats.excluded * _LN2
        neg_log_q = torch.where(
            d == 0.0,
            torch.log1p(stats.complement),
            torch.log(torch.exp(d) + stats.complement) - d,
        )
        g = (-torch.log(neg_log_q)).clamp(min=-max_log_odds, max=max_log_odds)
        return torch.where(torch.isfinite(stats.max), g, torch.full_like(g, math.nan))


def top2_margin(
    logits: torch.Tensor, temperature: float | torch.Tensor | None = None
) -> torch.Tensor:
    """``(z_(1) - z_(2)) / T``, the gap between the two largest scaled logits, float32.

    An alternative confidence signal for offline comparison. It ignores every entry below the
    second, so it cannot tell a two-way split from a long tail. ``+inf`` when a row has fewer than
    two finite entries; 0 with a tie at the maximum.
    """
    logits = _check_logits(logits)
    n, vocab = logits.shape
    temp = _temperature_rows(_check_temperature(temperature, n, logits.device), n, logits.device)
    if vocab < 2:
        return torch.full((n,), math.inf, dtype=torch.float32, device=logits.device)
    out = torch.empty(n, dtype=torch.float32, device=logits.device)
    block = _block_rows(vocab, _CPU_BLOCK_BYTES)
    with torch.no_grad():
        for start in range(0, n, block):
            top2 = torch.topk(logits[start : start + block], 2, dim=1).values.to(torch.float64)
            gap = (top2[:, 0] - top2[:, 1]) / temp[start : start + block]
            gap = torch.where(top2[:, 1] == -math.inf, math.inf, gap)
            out[start : start + block] = gap.to(torch.float32)
    return out


def entropy(logits: torch.Tensor, temperature: float | torch.Tensor | None = None) -> torch.Tensor:
    """Shannon entropy of q in nats, float32: ``log S - sum_j e_j y_j / S`` with
    ``y = (z - m) / T``, ``e = exp(y)``, ``S = sum e``. For offline comparison of features."""
    logits = _check_logits(logits)
    n, vocab = logits.shape
    temp = _check_temperature(temperature, n, logits.device)
    temp = _temperature_rows(temp, n, logits.device).to(torch.float32)
    out = torch.empty(n, dtype=torch.float32, device=logits.device)
    block = _block_rows(vocab, _CPU_BLOCK_BYTES)
    with torch.no_grad():
        for start in range(0, n, block):
            # Contiguous: the sums below then run in the same order for every layout.
            z = logits[start : start + block].to(torch.float32).contiguous()
            y = (z - z.amax(dim=1, keepdim=True)).div_(temp[start : start + block, None])
            e = torch.exp(y)
            total = e.sum(dim=1)
            weighted = torch.where(e > 0.0, e * y, 0.0).sum(dim=1)
            out[start : start + block] = torch.log(total) - weighted / total
    return out
