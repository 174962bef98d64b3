"""vllm#52559's DFlash adaptive-K manager reproduced in our own words, and what the tests need
to run it: the upstream tests load :data:`DFLASH_SOURCE` as the module vLLM's pull request adds
(``vllm/v1/worker/gpu/spec_decode/dflash/adaptive_k.py``), on the branch at
vllm-project/vllm b1171c804b96474eafd3e2f0354b8ec67bfa8ab7 (2026-08-17).

What the reproduction keeps, because it is what av_core's plugin meets:

- ``DFlashAdaptiveKManager(AdaptiveVerificationManager)`` overrides ``get_num_tokens`` without
  calling the base's: one K for the whole batch, taken from graph-friendly candidates
  (``0, 1, 3, 7, ..., K``: query lengths that are powers of two), each request admitted
  ``min(drafts, K)``; on the way it starts a runtime event and sets ``batch_query_len`` (vLLM's
  model runner dispatches graphs on it) and ``_batch_is_unmodified``.
- ``set_initial_cost_curves`` prices verification by shape: ``verify[b, k]`` is the median
  forward time of ``b`` requests of ``k + 1`` tokens, one curve over batch sizes per candidate
  K made dense by ``build_cost_tables_from_curves`` (padded up to the largest batch captured at
  that query length), ``inf`` in the other columns; ``draft[b]`` is the drafter's median time
  over graph replays at the full K.

Its K policy (survival history, runtime calibration) is reduced to ``select_k`` returning
``current_k``: av_core never runs it.
"""

from __future__ import annotations

import linecache
import sys
import types

import numpy as np
import pytest

DFLASH_MODULE = "vllm.v1.worker.gpu.spec_decode.dflash.adaptive_k"

DFLASH_SOURCE = '''\
"""vllm#52559's DFlash adaptive-K manager (reproduced by av_core's tests)."""

import numpy as np

from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
    AdaptiveVerificationManager,
    build_cost_tables_from_curves,
)


def k_candidates(max_k):
    """0, then 2**j - 1 below max_k, then max_k: every k + 1 a power of two but the last."""
    found, k = [0], 1
    while k < max_k:
        found.append(k)
        k = 2 * k + 1
    return found + [max_k]


class DFlashAdaptiveKManager(AdaptiveVerificationManager):
    def __init__(self, req_states, query_start_loc, num_bonus_tokens, max_total_logits,
                 history_weight=0.2, decision_interval=2):
        super().__init__(req_states, query_start_loc, num_bonus_tokens, max_total_logits)
        self.candidates = k_candidates(self.num_speculative_steps)
        self.current_k = self.num_speculative_steps
        self._write_idx = 0
        self._batch_is_unmodified = False

    def set_initial_cost_curves(self, samples):
        top = self.num_speculative_steps + 1
        by_shape, drafter = {}, {}
        for sample in samples:
            reqs, tokens = sample.num_reqs, sample.num_target_tokens
            if reqs < 1 or tokens % reqs:
                continue
            by_shape.setdefault((tokens // reqs, reqs), []).append(sample.forward_ms)
            if tokens // reqs == top and sample.full_cudagraph:
                drafter.setdefault(reqs, []).append(sample.drafter_ms)
        max_reqs = self.req_states.max_num_reqs
        draft, _ = build_cost_tables_from_curves(
            [(b, float(np.median(ms))) for b, ms in sorted(drafter.items())],
            [(1, 1.0)], max_reqs, max_reqs, cudagraph_limit=max_reqs,
        )
        verify = np.full((max_reqs + 1, top), np.inf)
        for k in self.candidates:
            width = k + 1
            curve = [(b, float(np.median(ms))) for (w, b), ms in sorted(by_shape.items())
                     if w == width]
            captured = [size // width for size in self._capture_sizes if size % width == 0]
            _, verify[:, k] = build_cost_tables_from_curves(
                [(1, 0.0)], curve, max_reqs, max_reqs,
                cudagraph_limit=min(max(captured, default=0), max_reqs),
            )
        self.cost_tables = (draft, verify)

    def select_k(self, batch_size):
        return self.current_k if batch_size else self.num_speculative_steps

    def get_num_tokens(self, num_tokens_per_req, draft_tokens):
        req_ids = list(num_tokens_per_req)
        drafts = np.array([len(draft_tokens.get(r, ())) for r in req_ids], dtype=np.int64)
        rest = np.array([num_tokens_per_req[r] for r in req_ids], dtype=np.int64) - drafts
        verifying = int(np.count_nonzero(drafts))
        k = self.select_k(verifying)
        if k > 0 and verifying > 0:
            self._runtime_start_events[self._write_idx].record()
        admitted = np.minimum(drafts, k)
        self.batch_query_len = int(np.max(rest + admitted, initial=1))
        budget = int(admitted.sum())
        self._batch_budget = (
            dict(zip(req_ids, admitted.tolist())), dict(zip(req_ids, rest.tolist())), budget
        )
        self._batch_is_unmodified = budget == int(drafts.sum())
        return int(rest.sum()) + budget
'''


def define(source: str, name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``source`` executed as module ``name`` (with its source readable, as on disk; both undone
    by ``monkeypatch``)."""
    filename = f"<av_core test {name}>"
    monkeypatch.setitem(
        linecache.cache, filename, (len(source), None, source.splitlines(True), filename)
    )
    module = types.ModuleType(name)
    module.__file__ = filename
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102
    return module


def timing_samples(
    max_reqs: int, candidates: list[int], seed: int = 0
) -> list[types.SimpleNamespace]:
    """Profiling samples as vLLM's step-timing collector records them (``num_reqs``,
    ``num_target_tokens``, ``forward_ms``, ``drafter_ms``, ``full_cudagraph``), 3 noisy replays
    of every (batch size, candidate K) shape; the forward time depends on the shape, not only
    on the token count (long queries cost more per token, as hybrid attention does)."""
    rng = np.random.default_rng(seed)
    samples = []
    for reqs in sorted({1, 2, 3, 4, 6, 8, max_reqs}):
        for k in candidates:
            tokens = reqs * (k + 1)
            for _ in range(3):
                forward = 2.0 + 0.05 * tokens + 0.02 * reqs * k * k + rng.uniform(0.0, 0.1)
                samples.append(
                    types.SimpleNamespace(
                        num_reqs=reqs,
                        num_target_tokens=tokens,
                        forward_ms=forward,
                        drafter_ms=0.3 + 0.01 * reqs + rng.uniform(0.0, 0.02),
                        full_cudagraph=reqs <= 8,
                    )
                )
    return samples
