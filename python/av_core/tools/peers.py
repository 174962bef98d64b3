"""Other engines' adaptive-speculation rules, written from their documented behaviour.

These are the policies ``av-core simulate --peers`` runs beside av_core's on identical drafting
rounds (``docs/simulate.md``). They are our own code: they reproduce what each engine documents,
not its implementation.

- :class:`EmaTierPolicy`: SGLang 0.5.23's adaptive speculation (``--speculative-adaptive``). An
  exponential moving average of the accepted draft length, per batch-size tier, picks the step
  count among the tier's candidate steps; the EMA is updated after every verify (not at 0 steps),
  a decision is taken every ``update_interval`` batches after ``warmup_batches``, and the step
  moves one or more candidates down while the EMA is at or below the lower candidate minus a half
  (plus ``down_hysteresis``; the threshold of a 0 candidate is 0.5), otherwise up while it is
  above the current candidate minus a half (plus ``up_hysteresis``). At 0 steps nothing is
  learnt, so every decision probes the next candidate. A tier is chosen by the largest
  batch-size key not above the batch size. :data:`SGLANG_DEFAULT_TIERS` is its default
  configuration.
- :func:`trt_draft_length`: TensorRT-LLM's ``draft_len_schedule`` (batch size → draft length):
  with ``{4: 4, 8: 2, 32: 1}``, batch sizes 1-4 draft 4 tokens, 5-8 draft 2, 9-32 draft 1 and
  larger batches do not speculate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from av_core._native import InvalidValueError

__all__ = [
    "SGLANG_DEFAULT_INITIAL_STEPS",
    "SGLANG_DEFAULT_TIERS",
    "TRT_DEFAULT_SCHEDULE",
    "EmaTier",
    "EmaTierPolicy",
    "parse_trt_schedule",
    "trt_draft_length",
]


@dataclass(frozen=True)
class EmaTier:
    """One batch-size tier of SGLang's EMA policy (its per-tier configuration keys)."""

    candidate_steps: tuple[int, ...]
    up_hysteresis: float = 0.0
    down_hysteresis: float = -0.25
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    ceiling_coeff: float = 0.0


#: SGLang 0.5.23's default adaptive configuration: batch-size key → tier.
SGLANG_DEFAULT_TIERS: dict[int, EmaTier] = {
    1: EmaTier((1, 3, 5, 7), up_hysteresis=0.0, down_hysteresis=-0.25),
    8: EmaTier((0, 1, 3), up_hysteresis=0.0, down_hysteresis=0.0),
    32: EmaTier((0, 1), up_hysteresis=0.0, down_hysteresis=0.0),
    64: EmaTier((0,), up_hysteresis=0.0, down_hysteresis=0.0),
}

#: SGLang's default ``--speculative-num-steps`` under adaptive speculation: the middle of the
#: sorted union of candidate steps ({0, 1, 3, 5, 7} → 3).
SGLANG_DEFAULT_INITIAL_STEPS = 3


class _TierState:
    def __init__(self, tier: EmaTier, initial_steps: int) -> None:
        self.tier = tier
        self.candidates = sorted(set(tier.candidate_steps))
        if not self.candidates or any(s < 0 for s in self.candidates):
            raise InvalidValueError(
                f"candidate_steps must be non-negative integers, got {tier.candidate_steps!r}"
            )
        if initial_steps in self.candidates:
            self.steps = initial_steps
        else:
            self.steps = self.candidates[len(self.candidates) // 2]
        self.ema = float(self.steps - 1)
        self.batches = 0

    def update(self, mean_accepted: float | None) -> bool:
        """One verify's mean accepted drafts (``None``: no requests). True when the step moves."""
        if mean_accepted is None:
            return False
        tier = self.tier
        if self.steps > 0:
            self.ema += tier.ema_alpha * (mean_accepted - self.ema)
        self.batches += 1
        since = self.batches - tier.warmup_batches
        if since <= 0 or since % tier.update_interval != 0:
            return False
        before = self.steps
        self.steps = self._decide()
        return self.steps != before

    def _decide(self) -> int:
        c, i = self.candidates, self.candidates.index(self.steps)
        if self.steps == 0:
            up = c[min(i + 1, len(c) - 1)]
            if up > 0 and self.ema < 0:
                self.ema = float(up - 1)
            return up
        start = i
        while i > 0:
            lower = c[i - 1]
            threshold = (0.5 if lower == 0 else lower - 0.5) + self.tier.down_hysteresis
            if self.ema > threshold:
                break
            i -= 1
        if i == start:
            while i + 1 < len(c) and self.ema > c[i] - 0.5 + self.tier.up_hysteresis:
                i += 1
        if self.tier.ceiling_coeff > 0:
            ceiling = max(1, math.ceil(self.ema * self.tier.ceiling_coeff))
            if self.steps >= c[i] > ceiling:
                while i > 0 and c[i] > ceiling:
                    i -= 1
        return c[i]


class EmaTierPolicy:
    """SGLang's EMA-tier step selection (module doc), one state per batch-size tier.

    ``tiers`` maps batch-size keys to :class:`EmaTier` (default: SGLang's). ``max_steps`` clips
    candidate steps above it (a trace with K drafts per round cannot replay deeper steps; the
    clipped candidates become K). :meth:`steps_for` answers the step count for a batch and
    :meth:`update` feeds a verify's accepted counts to that batch's tier.
    """

    def __init__(
        self,
        tiers: Mapping[int, EmaTier] | None = None,
        *,
        initial_steps: int = SGLANG_DEFAULT_INITIAL_STEPS,
        max_steps: int | None = None,
    ) -> None:
        tiers = dict(SGLANG_DEFAULT_TIERS if tiers is None else tiers)
        if not tiers or any(key < 0 for key in tiers):
            raise InvalidValueError(f"tiers must map batch sizes >= 0 to tiers, got {tiers!r}")
        if max_steps is not None and max_steps < 0:
            raise InvalidValueError(f"max_steps must be >= 0, got {max_steps}")
        self._keys = sorted(tiers)
        self._states: dict[int, _TierState] = {}
        for key in self._keys:
            tier = tiers[key]
            if max_steps is not None:
                clipped = tuple(sorted({min(s, max_steps) for s in tier.candidate_steps}))
                tier = EmaTier(
                    clipped,
                    tier.up_hysteresis,
                    tier.down_hysteresis,
                    tier.ema_alpha,
                    tier.update_interval,
                    tier.warmup_batches,
                    tier.ceiling_coeff,
                )
                initial = min(initial_steps, max_steps)
            else:
                initial = initial_steps
            self._states[key] = _TierState(tier, initial)

    def _tier(self, batch_size: int) -> _TierState:
        key = self._keys[0]
        for candidate in self._keys:
            if candidate <= batch_size:
                key = candidate
        return self._states[key]

    def steps_for(self, batch_size: int) -> int:
        """The step count the tier of ``batch_size`` runs now."""
        return self._tier(batch_size).steps

    def candidate_steps(self, batch_size: int) -> list[int]:
        return list(self._tier(batch_size).candidates)

    def ema(self, batch_size: int) -> float:
        """The tier's accepted-length EMA (for inspection)."""
        return self._tier(batch_size).ema

    def update(self, accepted: Sequence[int], batch_size: int) -> int | None:
        """A verify's accepted draft counts per request; the tier's new step when it moves."""
        state = self._tier(batch_size)
        mean = sum(accepted) / len(accepted) if len(accepted) else None
        return state.steps if state.update(mean) else None


#: The schedule used when none is given: the example in TensorRT-LLM's documentation.
TRT_DEFAULT_SCHEDULE: dict[int, int] = {4: 4, 8: 2, 32: 1}


def trt_draft_length(schedule: Mapping[int, int], batch_size: int) -> int:
    """The draft length of the smallest batch-size threshold at or above ``batch_size``; 0
    (no speculation) above every threshold."""
    if batch_size < 1:
        raise InvalidValueError(f"batch_size must be >= 1, got {batch_size}")
    for threshold in sorted(schedule):
        if batch_size <= threshold:
            return int(schedule[threshold])
    return 0


def parse_trt_schedule(text: str) -> dict[int, int]:
    """``"4:4,8:2,32:1"`` → ``{4: 4, 8: 2, 32: 1}`` (batch-size threshold : draft length)."""
    schedule: dict[int, int] = {}
    if not text.strip():
        raise InvalidValueError(
            f"trt schedule must hold at least one BATCH:LENGTH pair, got {text!r}"
        )
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise InvalidValueError(
                f"trt schedule has an empty item in {text!r} (write 4:4,8:2,32:1)"
            )
        threshold, sep, length = part.partition(":")
        try:
            key, value = int(threshold), int(length)
        except ValueError:
            key = value = -1
        if not sep or key < 1 or value < 0:
            raise InvalidValueError(
                f"trt schedule must be BATCH:LENGTH pairs (batch >= 1, length >= 0), got {text!r}"
            )
        if key in schedule:
            raise InvalidValueError(
                f"trt schedule lists the batch size {key} twice in {text!r} (each threshold once)"
            )
        schedule[key] = value
    if not schedule:
        raise InvalidValueError(
            f"trt schedule must hold at least one BATCH:LENGTH pair, got {text!r}"
        )
    return schedule
