""":func:`collect`: a resumable collection of a labeled trace over a prompts file, appended to a
CSV trace request by request.
"""

from __future__ import annotations

import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from av_core._native import InvalidValueError
from av_core.tools.collect.decoding import CollectConfig, speculative_decode
from av_core.tools.collect.models import CausalLM, HuggingFaceCausalLM
from av_core.tools.collect.prompts import Prompt, read_prompts
from av_core.tools.trace import UNLABELED, DraftTrace, append_trace, read_trace, trace_from_rows


@dataclass(frozen=True)
class CollectSummary:
    """What a collection run added and what the output holds."""

    output: Path
    prompts_done: int
    prompts_skipped: int
    rows_added: int
    labeled_added: int
    accepted_added: int


class _Progress:
    """A single stderr status line (carriage-return updates), no dependency."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.start = time.monotonic()
        self.labeled = self.accepted = 0

    def update(self, done: int, prompt_id: str, labels: Sequence[int]) -> None:
        self.labeled += sum(1 for label in labels if label != UNLABELED)
        self.accepted += sum(1 for label in labels if label == 1)
        if not self.enabled:
            return
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.accepted / self.labeled if self.labeled else float("nan")
        sys.stderr.write(
            f"\rcollect {done}/{self.total} prompts | {prompt_id:<24.24} | "
            f"{self.labeled} labeled drafts, acceptance {rate:.3f} | "
            f"{self.labeled / elapsed:.2f} labeled/s | {elapsed / 60:.1f} min "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _prompt_ids(tokenizer: Any, prompt: Prompt) -> list[int]:
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}], tokenize=False, add_generation_prompt=True
        )
    else:
        text = prompt.text
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def _stop_ids(tokenizer: Any) -> set[int]:
    stops: set[int] = set()
    if tokenizer.eos_token_id is not None:
        stops.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for name in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"):
        if name in vocab:
            stops.add(int(vocab[name]))
    return stops


def completed_prompt_ids(output: str | Path) -> set[str]:
    """Prompt ids already present in an output trace (empty if the file does not exist)."""
    path = Path(output)
    if not path.exists() or path.stat().st_size == 0:
        return set()
    trace = read_trace(path)
    if trace.prompt_id is None:
        raise InvalidValueError(f"{path}: cannot resume, the trace has no 'prompt_id' column")
    return {str(value) for value in np.unique(trace.prompt_id)}


def collect_prompts(
    target: CausalLM,
    drafter: CausalLM,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    output: str | Path,
    config: CollectConfig,
    progress: bool = True,
    max_prompts: int | None = None,
) -> CollectSummary:
    """Runs :func:`speculative_decode` on each prompt not yet in ``output`` and appends its rows.

    Resumable: rows are appended once per completed prompt, so a restart skips every prompt
    already written and redoes at most the one that was interrupted. Each prompt's random stream
    is seeded from ``(seed, prompt_id)``, so a resumed run draws what an uninterrupted one would.
    ``request_id`` is the prompt's index in ``prompts``.
    """
    import torch

    output = Path(output)
    done = completed_prompt_ids(output)
    todo = [(index, prompt) for index, prompt in enumerate(prompts) if prompt.prompt_id not in done]
    skipped = len(prompts) - len(todo)
    if max_prompts is not None:
        todo = todo[:max_prompts]
    stops = _stop_ids(tokenizer)
    bar = _Progress(len(prompts), progress)
    finished = skipped
    rows_added = labeled_added = accepted_added = 0
    for request_id, prompt in todo:

        def on_step(
            labels: list[int], done: int = finished, prompt_id: str = prompt.prompt_id
        ) -> None:
            bar.update(done, prompt_id, labels)

        generator = torch.Generator().manual_seed(
            (config.seed * 0x9E3779B1 + zlib.crc32(prompt.prompt_id.encode())) % 2**63
        )
        result = speculative_decode(
            target,
            drafter,
            _prompt_ids(tokenizer, prompt),
            config,
            generator,
            stops,
            on_step=on_step,
        )
        for row in result.rows:
            row.update(request_id=request_id, prompt_id=prompt.prompt_id, workload=prompt.workload)
        trace: DraftTrace = trace_from_rows(result.rows)
        append_trace(trace, output)
        finished += 1
        rows_added += len(trace)
        labeled_added += int(trace.labeled.sum())
        accepted_added += int((trace.label == 1).sum())
    bar.close()
    return CollectSummary(output, len(todo), skipped, rows_added, labeled_added, accepted_added)


def collect(
    target_path: str | Path,
    drafter_path: str | Path,
    prompts_path: str | Path,
    output: str | Path,
    config: CollectConfig,
    device: str = "cpu",
    progress: bool = True,
    max_prompts: int | None = None,
) -> CollectSummary:
    """Loads the two models and collects a trace (see :func:`collect_prompts`).

    The models must share a tokenizer (identical vocabularies are checked); the target's is used.
    """
    output = Path(output)
    if not output.name.endswith((".csv", ".csv.gz")):
        raise InvalidValueError(f"output must be a .csv or .csv.gz file, got {str(output)!r}")
    prompts = read_prompts(prompts_path)
    completed_prompt_ids(output)  # fail on a malformed output before spending minutes loading
    target_model, tokenizer = HuggingFaceCausalLM.load(target_path, device)
    drafter_model, drafter_tokenizer = HuggingFaceCausalLM.load(drafter_path, device)
    if tokenizer.get_vocab() != drafter_tokenizer.get_vocab():
        raise InvalidValueError(
            f"target {str(target_path)!r} and drafter {str(drafter_path)!r} do not share a "
            "tokenizer"
        )
    return collect_prompts(
        HuggingFaceCausalLM(target_model, device),
        HuggingFaceCausalLM(drafter_model, device),
        tokenizer,
        prompts,
        output,
        config,
        progress,
        max_prompts,
    )
