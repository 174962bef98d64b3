"""av_core driving speculative decoding inside llama.cpp (through llama-cpp-python's low-level
API): the loop (:class:`SpeculativeEngine`), the policies it compares, measured cost tables
(:mod:`~av_core.llama_cpp.profile`) and the real-runtime benchmark
(:mod:`~av_core.llama_cpp.bench`). Needs ``pip install "av_core[llama]"``; see
``docs/llama-cpp.md``.
"""

from __future__ import annotations

import os

from av_core._checks import _check_int
from av_core._native import InvalidValueError
from av_core.llama_cpp.engine import RunResult, Runtime, SpeculativeEngine, StepRecord
from av_core.llama_cpp.policies import (
    DEFAULT_POLICIES,
    AdaptivePolicy,
    FixedK,
    LlamaCppPolicy,
    Policy,
    PolicySpec,
    llama_cpp_confidence,
)
from av_core.llama_cpp.runtime import Context, Model, check_same_vocabulary, llama_api
from av_core.llama_cpp.sampling import NumpySource, RandomSource, SamplingParams, verify


def open_engine(
    target: str | os.PathLike[str],
    drafter: str | os.PathLike[str],
    *,
    requests: int,
    tokens_per_request: int,
    params: SamplingParams | None = None,
    max_positions: int = 8,
    threads: int = 1,
    n_ctx: int | None = None,
    cache_prefill: bool = False,
) -> SpeculativeEngine:
    """Loads both GGUF files, checks they share a vocabulary, and builds the loop over a
    target and a drafter context of ``requests`` sequences. ``tokens_per_request``: the
    longest prompt plus the new tokens; ``n_ctx`` defaults to what that needs (with room for
    a draft block); ``cache_prefill``: see :class:`SpeculativeEngine`. ``ValueError`` naming
    the file or setting for a missing or corrupt GGUF, differing vocabularies or a context too
    small; ``TypeError``/``ValueError`` naming a number that is not an int in its range."""
    requests = _check_int(requests, "requests", 1)
    tokens_per_request = _check_int(tokens_per_request, "tokens_per_request", 1)
    max_positions = _check_int(max_positions, "max_positions", 0)
    threads = _check_int(threads, "threads", 1)
    if n_ctx is not None:
        n_ctx = _check_int(n_ctx, "n_ctx", 1)
    per_sequence = tokens_per_request + max_positions + 1
    need = requests * per_sequence
    size = need if n_ctx is None else int(n_ctx)
    if size < need:
        raise InvalidValueError(
            f"n_ctx = {size} is too small for {requests} requests x ({tokens_per_request} "
            f"tokens + {max_positions + 1} for a draft block): at least {need}"
        )
    target_model = Model(target)
    drafter_model = Model(drafter)
    check_same_vocabulary(target_model, drafter_model)
    contexts = [
        Context(model, n_ctx=size, n_seq_max=requests, threads=threads)
        for model in (target_model, drafter_model)
    ]
    return SpeculativeEngine(
        contexts[0],
        contexts[1],
        params,
        max_positions=max_positions,
        cache_prefill=cache_prefill,
    )


__all__ = [
    "DEFAULT_POLICIES",
    "AdaptivePolicy",
    "Context",
    "FixedK",
    "LlamaCppPolicy",
    "Model",
    "NumpySource",
    "Policy",
    "PolicySpec",
    "RandomSource",
    "RunResult",
    "Runtime",
    "SamplingParams",
    "SpeculativeEngine",
    "StepRecord",
    "check_same_vocabulary",
    "llama_api",
    "llama_cpp_confidence",
    "open_engine",
    "verify",
]
