"""The speculative decoding loop: R concurrent requests on one target and one drafter context,
each request its own sequence id, every policy through the same steps.

Per step: the policy chooses each request's depth before the drafter runs; the drafter drafts in
batched decodes (its first pass also feeds the tokens the drafter has not seen yet); the policy
admits a prefix of each request's drafts from the features of the drafter's distributions; ONE
target decode verifies every admitted draft of every request (variable length per request);
exact speculative sampling decides; both KV caches drop what was rejected; the policy observes
the verdicts.

KV bookkeeping: the target's cache holds every token of a request but the last emitted one
(``target_len``), which opens the next verification batch; the drafter's cache holds the first
``drafter_len`` tokens, and the rest are fed at its next drafting pass. After a step only the
entries that match the emitted sequence are kept.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from av_core.llama_cpp.policies import Policy
from av_core.llama_cpp.sampling import (
    NumpySource,
    RandomSource,
    SamplingParams,
    draft_features,
    probabilities,
    verify,
)

IntArray = npt.NDArray[np.int64]


class Runtime(Protocol):
    """What the loop needs from a model context (:class:`~av_core.llama_cpp.runtime.Context`)."""

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
class StepRecord:
    """One decode step over the active requests ``slots``: per request the depth the policy
    allowed, the drafts kept, admitted and accepted, the tokens emitted and ``features`` [n, K]
    (0 past the drafts); the requests in each drafter pass; times in ms: each drafter pass and
    all of them (decode, distributions, draws), the target decode with its distributions, av_core
    (policy) calls, and the whole step."""

    slots: IntArray
    depths: IntArray
    drafted: IntArray
    admitted: IntArray
    accepted: IntArray
    emitted: IntArray
    features: npt.NDArray[np.float32]
    draft_passes: list[int]
    draft_pass_ms: list[float]
    draft_ms: float
    verify_ms: float
    host_ms: float
    step_ms: float


@dataclass
class RunResult:
    """Every request's generated tokens, every step, and the run's wall and CPU seconds (with the
    prefill's share: decode throughput is ``emitted / (wall_s - prefill_s)``)."""

    policy: str
    tokens: list[list[int]]
    steps: list[StepRecord] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    prefill_s: float = 0.0
    prefill_cpu_s: float = 0.0
    #: Tokens of each request in the target's and the drafter's KV cache at the end.
    target_cached: list[int] = field(default_factory=list)
    drafter_cached: list[int] = field(default_factory=list)

    @property
    def emitted(self) -> int:
        return int(sum(int(s.emitted.sum()) for s in self.steps))

    @property
    def accepted(self) -> int:
        return int(sum(int(s.accepted.sum()) for s in self.steps))

    @property
    def admitted(self) -> int:
        return int(sum(int(s.admitted.sum()) for s in self.steps))

    @property
    def target_calls(self) -> int:
        return len(self.steps)

    @property
    def verifications(self) -> int:
        """Request-verifications: one per active request per step."""
        return int(sum(len(s.slots) for s in self.steps))

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: emitted tokens per wall second after the prefill."""
        return self.emitted / max(self.wall_s - self.prefill_s, 1e-9)

    @property
    def tokens_per_cpu_s(self) -> float:
        """Emitted tokens per CPU second of this process after the prefill (every thread)."""
        return self.emitted / max(self.cpu_s - self.prefill_cpu_s, 1e-9)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.admitted if self.admitted else float("nan")


class SpeculativeEngine:
    """The loop over a target and a drafter context (:class:`Runtime`), sampling with ``params``.

    ``max_positions`` bounds any policy's depth (the features are [n, max_positions]).
    ``cache_prefill``: a run on the prompts of the previous run restores both caches as they
    were after its prefill instead of decoding the prompts again (a benchmark's policies share
    their prompts); the runtimes need ``save()`` and ``restore(state)``."""

    def __init__(
        self,
        target: Runtime,
        drafter: Runtime,
        params: SamplingParams | None = None,
        *,
        max_positions: int = 8,
        cache_prefill: bool = False,
    ) -> None:
        if target.n_vocab != drafter.n_vocab:
            raise ValueError(
                f"target and drafter vocabularies differ ({target.n_vocab} against "
                f"{drafter.n_vocab} tokens)"
            )
        self.target = target
        self.drafter = drafter
        self.params = params if params is not None else SamplingParams()
        self.max_positions = int(max_positions)
        # With cache_prefill, both contexts' states after the last prefill are kept, and a run on
        # the same prompts starts from a copy of them (runtimes with save/restore).
        self.cache_prefill = cache_prefill
        self._prefilled: tuple[tuple[tuple[int, ...], ...], list[Any]] | None = None

    def check_capacity(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """``ValueError`` naming ``n_ctx`` (or ``n_seq_max``) when the contexts cannot hold
        every request's prompt, new tokens and a full draft block."""
        r = len(prompts)
        for name, runtime in (("target", self.target), ("drafter", self.drafter)):
            if r > runtime.n_seq_max:
                raise ValueError(
                    f"n_seq_max: the {name} context holds {runtime.n_seq_max} sequences, "
                    f"{r} requests were given"
                )
            need = max(len(p) for p in prompts) + max_new_tokens + self.max_positions + 1
            if need > runtime.seq_capacity:
                raise ValueError(
                    f"n_ctx: the {name} context gives each of its {runtime.n_seq_max} sequences "
                    f"{runtime.seq_capacity} cells, a request needs {need} (prompt + "
                    f"{max_new_tokens} new tokens + {self.max_positions + 1}); raise n_ctx to at "
                    f"least {need * runtime.n_seq_max}"
                )

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
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: every request needs at least one prompt token")
        for r, prompt in enumerate(prompts):
            for i, token in enumerate(prompt):
                if isinstance(token, bool) or not isinstance(token, int | np.integer):
                    raise TypeError(f"prompts[{r}][{i}] must be a token id (int), got {token!r}")
                if not 0 <= token < self.target.n_vocab:
                    raise ValueError(
                        f"prompts[{r}][{i}] = {token} is not a token id of the "
                        f"{self.target.n_vocab}-token vocabulary"
                    )
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if policy.num_positions > self.max_positions:
            raise ValueError(
                f"policy {policy.name} drafts up to {policy.num_positions} positions, more than "
                f"max_positions = {self.max_positions}"
            )
        self.check_capacity(prompts, max_new_tokens)
        source = source if source is not None else NumpySource(seed)
        n = len(prompts)
        seqs = [list(map(int, p)) for p in prompts]
        start_len = [len(p) for p in seqs]
        result = RunResult(policy.name, [[] for _ in range(n)])
        wall0, cpu0 = time.perf_counter(), time.process_time()
        key = tuple(tuple(p[:-1]) for p in seqs)
        runtimes = (self.target, self.drafter)
        if self.cache_prefill and self._prefilled is not None and self._prefilled[0] == key:
            for runtime, state in zip(runtimes, self._prefilled[1], strict=True):
                runtime.restore(state)  # type: ignore[attr-defined]
        else:
            self._prefilled = None
            prefill = [(r, i) for r in range(n) for i in range(len(seqs[r]) - 1)]
            entries = (
                [seqs[r][i] for r, i in prefill],
                [i for _, i in prefill],
                [r for r, _ in prefill],
            )
            for runtime in runtimes:
                runtime.clear()
                if prefill:
                    runtime.decode(*entries, [False] * len(prefill))
            if self.cache_prefill:
                self._prefilled = (key, [runtime.save() for runtime in runtimes])  # type: ignore[attr-defined]
        target_len = [len(s) - 1 for s in seqs]
        drafter_len = list(target_len)
        for r in range(n):
            policy.add_request(r)
        result.prefill_s = time.perf_counter() - wall0
        result.prefill_cpu_s = time.process_time() - cpu0
        stops = set(map(int, stop_tokens))
        stopped: set[int] = set()
        while True:
            slots = np.array(
                [
                    r
                    for r in range(n)
                    if len(seqs[r]) - start_len[r] < max_new_tokens and r not in stopped
                ],
                dtype=np.int64,
            )
            if slots.size == 0:
                break
            step = self._step(
                seqs, start_len, target_len, drafter_len, slots, max_new_tokens, policy, source
            )
            result.steps.append(step)
            for i, r in enumerate(slots.tolist() if stops else ()):
                first = len(seqs[r]) - int(step.emitted[i])
                cut = next((j for j in range(first, len(seqs[r])) if seqs[r][j] in stops), None)
                if cut is not None:
                    del seqs[r][cut + 1 :]
                    stopped.add(r)
        for r in range(n):
            result.tokens[r] = seqs[r][start_len[r] :]
        result.target_cached = target_len
        result.drafter_cached = drafter_len
        result.wall_s = time.perf_counter() - wall0
        result.cpu_s = time.process_time() - cpu0
        return result

    def _step(
        self,
        seqs: list[list[int]],
        start_len: list[int],
        target_len: list[int],
        drafter_len: list[int],
        slots: IntArray,
        max_new_tokens: int,
        policy: Policy,
        source: RandomSource,
    ) -> StepRecord:
        step0 = time.perf_counter()
        k_max = self.max_positions
        m = len(slots)
        remaining = np.array([max_new_tokens - (len(seqs[r]) - start_len[r]) for r in slots])
        host = time.perf_counter()
        depths = np.asarray(policy.depths(slots, np.maximum(remaining - 1, 0)), dtype=np.int64)
        host_ms = (time.perf_counter() - host) * 1000.0

        # Drafting: pass j feeds each drafting request's unseen tokens (the first pass) or its
        # previous draft, and reads the distribution of its next position.
        draft0 = time.perf_counter()
        drafts: list[list[int]] = [[] for _ in range(m)]
        q_rows: list[list[npt.NDArray[np.float64]]] = [[] for _ in range(m)]
        logit_rows: list[list[npt.NDArray[np.float32]]] = [[] for _ in range(m)]
        feed = {i: seqs[slots[i]][drafter_len[slots[i]] :] for i in range(m) if depths[i] > 0}
        passes: list[int] = []
        pass_ms: list[float] = []
        while feed:
            pass0 = time.perf_counter()
            tokens: list[int] = []
            positions: list[int] = []
            seq_ids: list[int] = []
            marks: list[bool] = []
            order = sorted(feed)
            for i in order:
                r = int(slots[i])
                pending = feed[i]
                tokens += pending
                positions += range(drafter_len[r], drafter_len[r] + len(pending))
                seq_ids += [r] * len(pending)
                marks += [False] * (len(pending) - 1) + [True]
                drafter_len[r] += len(pending)
            rows = self.drafter.decode(tokens, positions, seq_ids, marks)
            passes.append(len(order))
            feed = {}
            for row, i in zip(rows, order, strict=True):
                if policy.stop(row):
                    continue
                q = probabilities(row, self.params)
                token = source.categorical(q)
                drafts[i].append(token)
                q_rows[i].append(q)
                logit_rows[i].append(row)
                if len(drafts[i]) < depths[i]:
                    feed[i] = [token]
            pass_ms.append((time.perf_counter() - pass0) * 1000.0)
        draft_ms = (time.perf_counter() - draft0) * 1000.0

        host = time.perf_counter()
        counts = np.array([len(d) for d in drafts], dtype=np.int64)
        drafted = np.minimum(np.asarray(policy.drafted(counts), dtype=np.int64), counts)
        features = np.zeros((m, k_max), dtype=np.float32)
        for i in range(m):
            if drafted[i]:
                features[i, : drafted[i]] = draft_features(
                    np.stack(logit_rows[i][: drafted[i]]), self.params
                )
        admitted = np.minimum(
            np.asarray(
                policy.admit(slots, features[:, : max(policy.num_positions, 1)], drafted),
                dtype=np.int64,
            ),
            drafted,
        )
        host_ms += (time.perf_counter() - host) * 1000.0

        # Verification: one target decode holding, per request, its last token and its
        # admitted drafts, every entry with logits.
        verify0 = time.perf_counter()
        tokens, positions, seq_ids = [], [], []
        for i in range(m):
            r = int(slots[i])
            block = [seqs[r][target_len[r]], *drafts[i][: admitted[i]]]
            tokens += block
            positions += range(target_len[r], target_len[r] + len(block))
            seq_ids += [r] * len(block)
        rows = self.target.decode(tokens, positions, seq_ids, [True] * len(tokens))
        target_rows = probabilities(rows, self.params)
        verify_ms = (time.perf_counter() - verify0) * 1000.0

        accepted = np.zeros(m, dtype=np.int64)
        emitted = np.zeros(m, dtype=np.int64)
        offset = 0
        for i in range(m):
            r = int(slots[i])
            a = int(admitted[i])
            p = target_rows[offset : offset + a + 1]
            offset += a + 1
            q = np.stack(q_rows[i][:a]) if a else np.zeros((0, self.target.n_vocab))
            accepted[i], token = verify(p, q, drafts[i][:a], source)
            new = [*drafts[i][: accepted[i]], token]
            emitted[i] = len(new)
            kept = len(seqs[r])
            seqs[r] += new
            # Target: kept the last token and the accepted drafts; the rejected ones go.
            target_len[r] += 1 + int(accepted[i])
            if a > accepted[i]:
                self.target.remove(r, target_len[r])
            # Drafter: its entries past the accepted drafts are wrong now.
            valid = min(drafter_len[r], kept + int(accepted[i]))
            if drafter_len[r] > valid:
                self.drafter.remove(r, valid)
                drafter_len[r] = valid

        host = time.perf_counter()
        policy.observe(admitted, accepted)
        host_ms += (time.perf_counter() - host) * 1000.0
        record = StepRecord(
            slots=slots,
            depths=depths,
            drafted=drafted,
            admitted=admitted,
            accepted=accepted,
            emitted=emitted,
            features=features,
            draft_passes=passes,
            draft_pass_ms=pass_ms,
            draft_ms=draft_ms,
            verify_ms=verify_ms,
            host_ms=host_ms,
            step_ms=(time.perf_counter() - step0) * 1000.0,
        )
        policy.measured(record)
        return record


__all__ = ["RunResult", "Runtime", "SpeculativeEngine", "StepRecord"]
