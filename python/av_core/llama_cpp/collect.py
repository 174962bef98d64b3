"""``av-core collect --engine llama.cpp``: a labeled trace (``docs/trace-format.md``) collected
through the loop on the GGUF models users deploy, with full verification (fixed K: every draft
up to the first rejection is labeled).

Resumable like the transformers collector: each prompt's rows are appended once it is done, its
random stream is seeded from ``(seed, prompt_id)``, and prompts already in the output are
skipped. A request ends at an end-of-generation token or after ``max_new_tokens``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

from av_core._native import InvalidValueError
from av_core.llama_cpp import open_engine
from av_core.llama_cpp.bench import run_trace
from av_core.llama_cpp.policies import FixedK
from av_core.llama_cpp.sampling import SamplingParams
from av_core.tools.collect.collection import CollectSummary, completed_prompt_ids
from av_core.tools.collect.prompts import Prompt
from av_core.tools.trace import append_trace


def collect_llama(
    target: str | Path,
    drafter: str | Path,
    prompts: Sequence[Prompt],
    output: str | Path,
    *,
    num_drafts: int = 4,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 128,
    seed: int = 0,
    threads: int = 1,
    max_prompts: int | None = None,
    max_prompt_tokens: int = 1024,
    progress: Callable[[int, int, str], None] | None = None,
) -> CollectSummary:
    """Collects every prompt not yet in ``output`` (``.csv`` or ``.csv.gz``); ``request_id``
    is the prompt's index in ``prompts``. A prompt longer than ``max_prompt_tokens`` is kept to
    its last ``max_prompt_tokens`` tokens."""
    output = Path(output)
    if not output.name.endswith((".csv", ".csv.gz")):
        raise InvalidValueError(f"output must be a .csv or .csv.gz file, got {str(output)!r}")
    done = completed_prompt_ids(output)
    todo = [(i, p) for i, p in enumerate(prompts) if p.prompt_id not in done]
    skipped = len(prompts) - len(todo)
    if max_prompts is not None:
        todo = todo[:max_prompts]
    params = SamplingParams(temperature, top_p=top_p)
    engine = open_engine(
        target,
        drafter,
        requests=1,
        tokens_per_request=max_prompt_tokens + max_new_tokens,
        params=params,
        max_positions=num_drafts,
        threads=threads,
    )
    model = engine.target.model  # type: ignore[attr-defined]
    stops = [t for t in range(model.n_vocab) if model.is_end_of_generation(t)]
    rows = labeled = accepted = 0
    for count, (index, prompt) in enumerate(todo, start=1):
        tokens = model.prompt_tokens(prompt.text, chat=prompt.chat)[-max_prompt_tokens:]
        prompt_seed = (seed * 0x9E3779B1 + zlib.crc32(prompt.prompt_id.encode())) % 2**63
        result = engine.generate(
            [tokens], max_new_tokens, FixedK(num_drafts), seed=prompt_seed, stop_tokens=stops
        )
        trace = run_trace(
            result,
            [prompt.workload],
            params,
            request_ids=[index],
            prompt_ids=[prompt.prompt_id],
        )
        if trace is not None:  # a prompt that drafted nothing has no rows (and is redone)
            append_trace(trace, output)
            rows += len(trace)
            labeled += int(trace.labeled.sum())
            accepted += int((trace.label == 1).sum())
        if progress is not None:
            rate = accepted / labeled if labeled else float("nan")
            progress(count, len(todo), f"{prompt.prompt_id}: acceptance {rate:.3f}")
    return CollectSummary(output, len(todo), skipped, rows, labeled, accepted)


__all__ = ["collect_llama"]
