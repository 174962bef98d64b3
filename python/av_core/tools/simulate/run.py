"""The replay of one finite run (:func:`simulate_run`): what a policy would do on R requests that
each generate ``max_new_tokens`` tokens, from a trace's rounds, and what its steps cost.

Unlike :func:`~av_core.tools.simulate.simulate_trace` (a steady state: every slot always busy,
the estimator warmed up), the replay follows a run of the speculative loop step by step: request
r replays trace request r's rounds in order (from its first again when it needs more steps than
the trace has), its depth is capped by the tokens it still needs, it leaves the batch when it has
them all, and the policy starts cold. Each step is described by its forward passes
(:class:`StepShape`, the shape a runtime receives) and priced by a :data:`Pricer`, so a run
measured on a runtime and its replay are priced by the same function.

The policy is any object with the hooks of :class:`StepPolicy` — the policies of
:mod:`av_core.llama_cpp.policies` are the ones the loop runs. The replay never needs a verdict
the trace lacks: the tokens a request accepts are ``min(accepted under the trace's verification,
admitted)``, exact for a trace verified in full (every drafted position up to the first
rejection is labeled). A policy that drafts more positions than a round holds gets the round's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from av_core._checks import _check_int
from av_core._native import InvalidTypeError, InvalidValueError
from av_core.tools.evaluate import DraftRounds
from av_core.tools.simulate.costs import FloatArray, IntArray

#: A forward pass as ``(slot, tokens)`` pairs, in batch order.
PassShape = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class StepShape:
    """One decode step's forward passes: each drafter pass (logits on each slot's last token;
    a slot's first pass also feeds what the drafter has not seen yet), then the target pass
    (logits on every token: the slot's last token and its admitted drafts)."""

    draft_passes: tuple[PassShape, ...]
    verify: PassShape


#: The milliseconds a step costs, from its shape.
Pricer = Callable[[StepShape], float]


class StepPolicy(Protocol):
    """The hooks a replayed policy has (:class:`av_core.llama_cpp.policies.Policy`)."""

    num_positions: int
    greedy: bool

    def add_request(self, slot: int) -> None: ...
    def depths(self, slots: IntArray, max_depths: IntArray) -> IntArray: ...
    def stop(self, confidence: float) -> bool: ...
    def drafted(self, counts: IntArray) -> IntArray: ...
    def admit(
        self, slots: IntArray, features: npt.NDArray[np.float32], drafted: IntArray
    ) -> IntArray: ...
    def observe(self, admitted: IntArray, accepted: IntArray) -> None: ...


@dataclass(frozen=True)
class RunReplay:
    """Totals of a replayed run: emitted tokens, priced time, steps, drafted, admitted and
    accepted drafts, steps that ran without the drafter."""

    tokens: int
    time_ms: float
    steps: int
    drafted: int
    admitted: int
    accepted: int
    depth0_steps: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.time_ms, 1e-9) * 1000.0


def simulate_run(
    rounds: DraftRounds,
    policy: StepPolicy,
    price: Pricer,
    max_new_tokens: int,
    *,
    features: FloatArray,
    confidences: FloatArray | None = None,
) -> RunReplay:
    """Replays ``policy`` on one request per trace request (module docstring).

    ``features`` and ``confidences``: [rounds, K] columns of the trace
    (:meth:`DraftRounds.column`): each position's ``logit_q_max`` and, for a greedy policy
    (llama.cpp's), the confidence its ``stop`` reads (``top10_confidence``)."""
    if not isinstance(rounds, DraftRounds):
        raise InvalidTypeError(f"rounds must be DraftRounds, got {type(rounds).__name__}")
    max_new_tokens = _check_int(max_new_tokens, "max_new_tokens", 1)
    if policy.greedy and confidences is None:
        raise InvalidValueError(
            "confidences: a greedy (llama.cpp) policy reads each position's confidence"
        )
    for name, column in (("features", features), ("confidences", confidences)):
        if column is not None and np.shape(column) != rounds.rows.shape:
            raise InvalidValueError(
                f"{name} must be [rounds, K] = {list(rounds.rows.shape)} (DraftRounds.column), "
                f"got shape {list(np.shape(column))}"
            )
    ids, first = np.unique(rounds.request_id, return_index=True)
    by_request = [np.flatnonzero(rounds.request_id == r) for r in ids[np.argsort(first)]]
    n = len(by_request)
    emitted, cursor = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    unseen = np.ones(n, dtype=np.int64)  # tokens the drafter has not been fed yet
    for slot in range(n):
        policy.add_request(slot)
    width = max(policy.num_positions, 1)
    known = min(width, features.shape[1])
    time_ms, steps, drafted_total, admitted_total, accepted_total, depth0 = 0.0, 0, 0, 0, 0, 0
    while (emitted < max_new_tokens).any():
        slots = np.flatnonzero(emitted < max_new_tokens)
        index = np.array([by_request[s][cursor[s] % len(by_request[s])] for s in slots])
        wanted = np.asarray(policy.depths(slots, max_new_tokens - emitted[slots] - 1))
        depths = np.minimum(wanted.astype(np.int64), rounds.num_drafted[index])
        counts, took = np.zeros(len(slots), np.int64), np.zeros(len(slots), np.int64)
        stopped = np.zeros(len(slots), dtype=bool)
        passes: list[PassShape] = []
        while (drafting := np.flatnonzero((counts < depths) & ~stopped)).size:
            passes.append(
                tuple(
                    (int(slots[i]), int(unseen[slots[i]]) if took[i] == 0 else 1) for i in drafting
                )
            )
            took[drafting] += 1
            for i in drafting:
                if policy.greedy and policy.stop(float(confidences[index[i], counts[i]])):  # type: ignore[index]
                    stopped[i] = True
                else:
                    counts[i] += 1
        drafted = np.minimum(np.asarray(policy.drafted(counts), dtype=np.int64), counts)
        x = np.zeros((len(slots), width), dtype=np.float32)
        x[:, :known] = features[index, :known]
        x[np.arange(width) >= drafted[:, None]] = 0.0
        verified = np.asarray(policy.admit(slots, x, drafted), dtype=np.int64)
        admitted = np.minimum(verified, drafted)
        accepted = np.minimum(rounds.num_accepted[index], admitted)
        policy.observe(admitted, accepted)
        verify = tuple((int(s), 1 + int(a)) for s, a in zip(slots, admitted, strict=True))
        time_ms += price(StepShape(tuple(passes), verify))
        # The drafter saw the step's tokens and took - 1 drafts; it keeps what was accepted.
        unseen[slots] = np.where(
            took > 0, accepted + 1 - np.minimum(took - 1, accepted), unseen[slots] + accepted + 1
        )
        emitted[slots] += accepted + 1
        cursor[slots] += 1
        steps += 1
        drafted_total += int(drafted.sum())
        admitted_total += int(admitted.sum())
        accepted_total += int(accepted.sum())
        depth0 += int(depths.max(initial=0) == 0)
    return RunReplay(
        int(emitted.sum()), time_ms, steps, drafted_total, admitted_total, accepted_total, depth0
    )


__all__ = [
    "PassShape",
    "Pricer",
    "RunReplay",
    "StepPolicy",
    "StepShape",
    "simulate_run",
]
