"""The speculative decoding loop: R concurrent requests on one target and one drafter context,
each request its own sequence id, every policy through the same steps.

Per step: the policy chooses each request's depth before the drafter runs; the drafter drafts in
batched decodes (:meth:`SpeculativeEngine.draft_pass`; the first also feeds the tokens the
drafter has not seen yet); the policy admits a prefix of each request's drafts from the features
of the drafter's distributions; ONE target decode verifies every admitted draft of every request
(:meth:`SpeculativeEngine.verify_pass`: variable length per request, exact speculative
sampling); both KV caches drop what was rejected; the policy observes the verdicts.

KV bookkeeping (``cached``: per model, the tokens of each request in its cache): the target's
cache holds every token of a request but the last emitted one, which opens the next
verification block; the drafter's holds a prefix, and the rest is fed at its next drafting pass.
After a step only the entries that match the emitted sequence are kept
(:meth:`SpeculativeEngine.rollback`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from av_core._native import InvalidTypeError, InvalidValueError
from av_core.llama_cpp.policies import Policy, llama_cpp_confidence
from av_core.llama_cpp.sampling import (
    FloatArray,
    NumpySource,
    RandomSource,
    SamplingParams,
    draft_features,
    probabilities,
    verify,
)
from av_core.tools.simulate.run import StepShape

IntArray = npt.NDArray[np.int64]
TOTALS = ("emitted", "admitted", "accepted")
#: One request's block of a batch: ``(seq_id, first position, tokens)``.
Block = tuple[int, int, Sequence[int]]


class Runtime(Protocol):
    """What the loop needs from a model context (:class:`~av_core.llama_cpp.runtime.Context`):
    ``decode(tokens, positions, seq_ids, logits)`` returns the marked entries' logits [n, V];
    ``remove(seq_id, start)`` drops a sequence's cells from ``start`` on."""

    n_vocab: int
    n_seq_max: int

    @property
    def seq_capacity(self) -> int: ...
    def clear(self) -> None: ...
    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        seq_ids: Sequence[int],
        logits: Sequence[bool],
    ) -> npt.NDArray[np.float32]: ...
    def remove(self, seq_id: int, start: int) -> None: ...


@dataclass
class Draft:
    """One drafted position: the token, the distribution it was drawn from (one-hot for a
    greedy draft), the drafter's logits and llama.cpp's confidence (NaN unless greedy)."""

    token: int
    q: FloatArray
    logits: npt.NDArray[np.float32]
    confidence: float


@dataclass
class StepRecord:
    """One decode step over the active requests ``slots``: per request the depth the policy
    allowed, the drafts kept, admitted and accepted, the tokens emitted, ``features`` and
    ``confidences`` [n, max_positions] of the drafted positions (0 and NaN elsewhere); the
    step's forward passes (``shape``); times in ms (the engine's clock): each drafter pass and
    all of them (decodes, distributions, draws), the target pass with its sampling, av_core's
    (the policy's) calls, and the whole step."""

    slots: IntArray
    depths: IntArray
    drafted: IntArray
    admitted: IntArray
    accepted: IntArray
    emitted: IntArray
    features: npt.NDArray[np.float32]
    confidences: FloatArray
    shape: StepShape
    draft_pass_ms: list[float]
    draft_ms: float
    verify_ms: float
    host_ms: float
    step_ms: float


@dataclass
class RunResult:
    """Every request's generated tokens, every step, the run's totals (emitted tokens, admitted
    and accepted drafts, request-verifications: one per active request per step), its wall and
    CPU seconds with the prefill's share, and the tokens of each request in the target's and
    the drafter's cache at the end."""

    policy: str
    tokens: list[list[int]]
    steps: list[StepRecord]
    emitted: int
    admitted: int
    accepted: int
    verifications: int
    wall_s: float
    cpu_s: float
    prefill_s: float
    prefill_cpu_s: float
    target_cached: list[int]
    drafter_cached: list[int]

    @property
    def kept(self) -> int:
        """Tokens the requests keep: every emitted token up to each request's stop token (the
        tokens a step emitted after a stop are dropped, so they are not throughput)."""
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: kept tokens per wall second after the prefill."""
        return self.kept / max(self.wall_s - self.prefill_s, 1e-9)

    @property
    def tokens_per_cpu_s(self) -> float:
        """Kept tokens per CPU second of this process after the prefill (every thread)."""
        return self.kept / max(self.cpu_s - self.prefill_cpu_s, 1e-9)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.admitted if self.admitted else float("nan")


def _batch(
    blocks: Sequence[Block], all_logits: bool
) -> tuple[list[int], list[int], list[int], list[bool]]:
    """A decode's columns (tokens, positions, seq ids, logit marks) from per-request blocks:
    logits on every entry, or on each block's last."""
    tokens: list[int] = []
    positions: list[int] = []
    seq_ids: list[int] = []
    marks: list[bool] = []
    for seq, start, block in blocks:
        tokens += block
        positions += range(start, start + len(block))
        seq_ids += [seq] * len(block)
        marks += [True] * len(block) if all_logits else [False] * (len(block) - 1) + [True]
    return tokens, positions, seq_ids, marks


class SpeculativeEngine:
    """The loop over a target and a drafter context (:class:`Runtime`), sampling with ``params``.

    ``max_positions`` bounds any policy's depth (the features are [n, max_positions]).
    ``cache_prefill``: a run on the prompts of the previous run restores both caches as they
    were after its prefill instead of decoding the prompts again (a benchmark's policies share
    their prompts); the runtimes need ``save()`` and ``restore(state)``. ``clock``: what the
    step records' times read (``time.process_time`` for CPU time on a shared machine)."""

    def __init__(
        self,
        target: Runtime,
        drafter: Runtime,
        params: SamplingParams | None = None,
        *,
        max_positions: int = 8,
        cache_prefill: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if target.n_vocab != drafter.n_vocab:
            raise InvalidValueError(
                f"target and drafter vocabularies differ ({target.n_vocab} against "
                f"{drafter.n_vocab} tokens)"
            )
        self.target, self.drafter = target, drafter
        self.params = params if params is not None else SamplingParams()
        self.max_positions = int(max_positions)
        self.cache_prefill, self.clock = cache_prefill, clock
        self._prefilled: tuple[tuple[tuple[int, ...], ...], list[Any]] | None = None

    def check_capacity(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """``ValueError`` naming ``n_ctx`` (or ``n_seq_max``) when the contexts cannot hold
        every request's prompt, new tokens and a full draft block."""
        r = len(prompts)
        need = max(len(p) for p in prompts) + max_new_tokens + self.max_positions + 1
        for name, runtime in (("target", self.target), ("drafter", self.drafter)):
            if r > runtime.n_seq_max:
                raise InvalidValueError(
                    f"n_seq_max: the {name} context holds {runtime.n_seq_max} sequences, "
                    f"{r} requests were given"
                )
            if need > runtime.seq_capacity:
                raise InvalidValueError(
                    f"n_ctx: the {name} context gives each of its {runtime.n_seq_max} sequences "
                    f"{runtime.seq_capacity} cells, a request needs {need} (prompt + "
                    f"{max_new_tokens} new tokens + {self.max_positions + 1}); raise n_ctx to at "
                    f"least {need * runtime.n_seq_max}"
                )

    def _check_tokens(self, name: str, tokens: Sequence[object]) -> None:
        for i, token in enumerate(tokens):
            if isinstance(token, bool) or not isinstance(token, int | np.integer):
                raise InvalidTypeError(f"{name}[{i}] must be a token id (int), got {token!r}")
            if not 0 <= token < self.target.n_vocab:
                raise InvalidValueError(
                    f"{name}[{i}] = {token} is not a token id of the "
                    f"{self.target.n_vocab}-token vocabulary"
                )

    def _check(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        policy: Policy,
        stop_tokens: Sequence[int],
    ) -> None:
        if len(prompts) == 0 or any(len(p) == 0 for p in prompts):
            raise InvalidValueError("prompts: every request needs at least one prompt token")
        for r, prompt in enumerate(prompts):
            self._check_tokens(f"prompts[{r}]", prompt)
        self._check_tokens("stop_tokens", list(stop_tokens))
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int | np.integer):
            raise InvalidTypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise InvalidValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if policy.num_positions > self.max_positions:
            raise InvalidValueError(
                f"policy {policy.name} drafts up to {policy.num_positions} positions, more than "
                f"max_positions = {self.max_positions}"
            )
        self.check_capacity(prompts, max_new_tokens)

    def _prefill(self, seqs: list[list[int]]) -> None:
        """Both caches hold every prompt token but the last (the first verification feeds it)."""
        runtimes = (self.target, self.drafter)
        key = tuple(tuple(s[:-1]) for s in seqs)
        if self.cache_prefill and self._prefilled is not None and self._prefilled[0] == key:
            for runtime, state in zip(runtimes, self._prefilled[1], strict=True):
                runtime.restore(state)  # type: ignore[attr-defined]
            return
        self._prefilled = None
        tokens, positions, seq_ids, _ = _batch([(r, 0, s[:-1]) for r, s in enumerate(seqs)], True)
        for runtime in runtimes:
            runtime.clear()
            if tokens:
                runtime.decode(tokens, positions, seq_ids, [False] * len(tokens))
        if self.cache_prefill:
            self._prefilled = (key, [runtime.save() for runtime in runtimes])  # type: ignore[attr-defined]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        policy: Policy,
        *,
        source: RandomSource | None = None,
        seed: int = 0,
        stop_tokens: Sequence[int] = (),
    ) -> RunResult:
        """Generates ``max_new_tokens`` tokens for each prompt (token ids, one request each); a
        request that emits one of ``stop_tokens`` ends there (its later tokens are dropped)."""
        self._check(prompts, max_new_tokens, policy, stop_tokens)
        source = source if source is not None else NumpySource(seed)
        seqs = [list(map(int, p)) for p in prompts]
        start = [len(s) for s in seqs]
        wall0, cpu0 = time.perf_counter(), time.process_time()
        self._prefill(seqs)
        cached = [[len(s) - 1 for s in seqs], [len(s) - 1 for s in seqs]]  # target, drafter
        for r in range(len(seqs)):
            policy.add_request(r)
        prefill_s, prefill_cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
        stops, done = set(map(int, stop_tokens)), set()
        steps: list[StepRecord] = []
        while active := [
            r for r, s in enumerate(seqs) if r not in done and len(s) - start[r] < max_new_tokens
        ]:
            left = np.array([max_new_tokens - len(seqs[r]) + start[r] for r in active])
            before = [len(seqs[r]) for r in active]
            steps.append(self._step(seqs, cached, np.array(active), left, policy, source))
            for r, first in zip(active, before, strict=True):
                cut = next((j for j in range(first, len(seqs[r])) if seqs[r][j] in stops), None)
                if cut is not None:
                    del seqs[r][cut + 1 :]
                    done.add(r)
        totals = [sum(int(getattr(s, k).sum()) for s in steps) for k in TOTALS]
        return RunResult(
            policy.name,
            [s[b:] for s, b in zip(seqs, start, strict=True)],
            steps,
            emitted=totals[0],
            admitted=totals[1],
            accepted=totals[2],
            verifications=sum(len(s.slots) for s in steps),
            wall_s=time.perf_counter() - wall0,
            cpu_s=time.process_time() - cpu0,
            prefill_s=prefill_s,
            prefill_cpu_s=prefill_cpu_s,
            target_cached=cached[0],
            drafter_cached=cached[1],
        )

    def draft_pass(
        self, blocks: Sequence[Block], policy: Policy, source: RandomSource
    ) -> list[Draft | None]:
        """One drafter decode of ``blocks`` (logits on each block's last entry) and each row's
        draft: the drafter's most likely token when the policy drafts greedily (None when its
        ``stop`` reads llama.cpp's confidence and stops), else a sample from its distribution."""
        drafts: list[Draft | None] = []
        for row in self.drafter.decode(*_batch(blocks, False)):
            if not policy.greedy:
                q = probabilities(row, self.params)
                drafts.append(Draft(source.categorical(q), q, row, float("nan")))
                continue
            confidence = llama_cpp_confidence(row)
            if policy.stop(confidence):
                drafts.append(None)
                continue
            token = int(np.argmax(row))
            q = np.zeros(row.shape[0])
            q[token] = 1.0
            drafts.append(Draft(token, q, row, confidence))
        return drafts

    def verify_pass(
        self, blocks: Sequence[Block], drafts: Sequence[Sequence[Draft]], source: RandomSource
    ) -> list[tuple[int, int]]:
        """One target decode of every request's block (its last token, then its admitted
        drafts ``drafts[i]``; logits on every entry) and exact speculative sampling of each:
        ``(accepted, token emitted after them)`` per request."""
        tokens, positions, seq_ids, _ = _batch(blocks, True)
        p = probabilities(
            self.target.decode(tokens, positions, seq_ids, [True] * len(tokens)), self.params
        )
        out, offset = [], 0
        for block, admitted in zip(blocks, drafts, strict=True):
            q = np.array([d.q for d in admitted]).reshape(len(admitted), p.shape[1])
            rows = p[offset : offset + len(block[2])]
            out.append(verify(rows, q, [d.token for d in admitted], source))
            offset += len(block[2])
        return out

    def rollback(self, slot: int, cached: list[list[int]], kept: int, accepted: int) -> None:
        """After a verification that kept ``kept`` tokens and accepted ``accepted`` drafts:
        the target keeps its last token and the accepted drafts, the drafter what matches."""
        target = cached[0][slot] + 1 + accepted
        self.target.remove(slot, target)
        cached[0][slot] = target
        valid = min(cached[1][slot], kept + accepted)
        if cached[1][slot] > valid:
            self.drafter.remove(slot, valid)
            cached[1][slot] = valid

    def _step(
        self,
        seqs: list[list[int]],
        cached: list[list[int]],
        slots: IntArray,
        left: IntArray,
        policy: Policy,
        source: RandomSource,
    ) -> StepRecord:
        clock = self.clock
        step0 = clock()
        m = len(slots)
        depths = np.asarray(policy.depths(slots, np.maximum(left - 1, 0)), dtype=np.int64)
        host_ms = (clock() - step0) * 1000.0

        draft0 = clock()
        drafts: list[list[Draft]] = [[] for _ in range(m)]
        drafting = [i for i in range(m) if depths[i] > 0]
        passes: list[tuple[tuple[int, int], ...]] = []
        pass_ms: list[float] = []
        while drafting:
            pass0 = clock()
            blocks = []
            for i in drafting:
                r = int(slots[i])
                feed = [drafts[i][-1].token] if drafts[i] else seqs[r][cached[1][r] :]
                blocks.append((r, cached[1][r], feed))
                cached[1][r] += len(feed)
            passes.append(tuple((r, len(feed)) for r, _, feed in blocks))
            still = []
            for i, draft in zip(drafting, self.draft_pass(blocks, policy, source), strict=True):
                if draft is not None:
                    drafts[i].append(draft)
                    if len(drafts[i]) < depths[i]:
                        still.append(i)
            drafting = still
            pass_ms.append((clock() - pass0) * 1000.0)
        draft_ms = (clock() - draft0) * 1000.0

        host = clock()
        counts = np.array([len(d) for d in drafts], dtype=np.int64)
        drafted = np.minimum(np.asarray(policy.drafted(counts), dtype=np.int64), counts)
        features = np.zeros((m, self.max_positions), dtype=np.float32)
        confidences = np.full((m, self.max_positions), np.nan)
        for i, n in enumerate(drafted.tolist()):
            if n:
                rows = np.stack([d.logits for d in drafts[i][:n]])
                features[i, :n] = draft_features(rows, self.params)
                confidences[i, :n] = [d.confidence for d in drafts[i][:n]]
        verified = policy.admit(slots, features[:, : max(policy.num_positions, 1)], drafted)
        admitted = np.minimum(np.asarray(verified, dtype=np.int64), drafted)
        host_ms += (clock() - host) * 1000.0

        verify0 = clock()
        admitted_drafts = [d[:a] for d, a in zip(drafts, admitted.tolist(), strict=True)]
        blocks = [
            (int(r), cached[0][r], [seqs[r][-1], *(d.token for d in block)])
            for r, block in zip(slots, admitted_drafts, strict=True)
        ]
        verdicts = self.verify_pass(blocks, admitted_drafts, source)
        verify_ms = (clock() - verify0) * 1000.0
        accepted = np.array([a for a, _ in verdicts], dtype=np.int64)
        for i, (a, token) in enumerate(verdicts):
            r = int(slots[i])
            kept = len(seqs[r])
            seqs[r] += [*(d.token for d in admitted_drafts[i][:a]), token]
            self.rollback(r, cached, kept, a)

        host = clock()
        policy.observe(admitted, accepted)
        host_ms += (clock() - host) * 1000.0
        record = StepRecord(
            slots=slots,
            depths=depths,
            drafted=drafted,
            admitted=admitted,
            accepted=accepted,
            emitted=accepted + 1,
            features=features,
            confidences=confidences,
            shape=StepShape(tuple(passes), tuple((b[0], len(b[2])) for b in blocks)),
            draft_pass_ms=pass_ms,
            draft_ms=draft_ms,
            verify_ms=verify_ms,
            host_ms=host_ms,
            step_ms=(clock() - step0) * 1000.0,
        )
        policy.measured(record)
        return record


__all__ = ["Draft", "RunResult", "Runtime", "SpeculativeEngine", "StepRecord"]
