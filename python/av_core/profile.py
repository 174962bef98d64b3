"""Measuring a real model's forward time into a cost file (``av-core profile``).

For each token count t of a grid, the model appends t tokens to a KV cache already holding
``context`` tokens (one sequence, as a verification pass appends the drafts of a request) and the
cache is cropped back afterwards; the median of ``repeats`` timed runs is kept. The file holds
``verify`` points for the target and, when a drafter is given, ``draft`` points (one drafter pass
over t tokens), and with drafting depths ``draft_depth`` points: the drafter drafting d positions
one after another (d sequential one-token passes, as an autoregressive drafter drafts), the
profile of the draft-cost-by-depth table (``CostTables.from_curves(draft_depth_curve=...)``).
``av-core simulate --cost-model measured FILE`` reads them. See ``docs/simulate.md``.

One sequence of t tokens is a lower bound on a batch of R requests holding t tokens in all
(batched attention reads R caches instead of one); it is exact for the weight-bound part,
which is what decides whether speculation pays.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_TOKENS = (1, 2, 3, 4, 5, 8, 16, 32, 64, 128, 256)


def measure_forward_ms(
    forward: Callable[[int], None],
    tokens: Sequence[int],
    *,
    repeats: int = 5,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> list[tuple[int, float]]:
    """Median wall time in ms of ``forward(t)`` for each ``t`` (after ``warmup`` untimed calls).

    ``forward`` must finish its work before returning (synchronize a GPU inside it).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    points: list[tuple[int, float]] = []
    for t in tokens:
        if t < 1:
            raise ValueError(f"token counts must be >= 1, got {t}")
        for _ in range(warmup):
            forward(t)
        times = []
        for _ in range(repeats):
            start = clock()
            forward(t)
            times.append((clock() - start) * 1000.0)
        points.append((int(t), float(statistics.median(times))))
    return points


def model_forward(
    path: str | Path, *, device: str = "cpu", context: int = 128
) -> Callable[[int], None]:
    """A ``forward(t)`` for :func:`measure_forward_ms` over a transformers model (or GGUF file).

    Needs ``av_core[collect]`` (torch, transformers). Token ids are arbitrary: the time of a
    forward pass does not depend on them.
    """
    from av_core.collect import HuggingFaceCausalLM

    model, _ = HuggingFaceCausalLM.load(path, device=device)
    return loaded_model_forward(model, device=device, context=context)


def _warm_cache(model: Any, device: str, context: int, seed: int) -> tuple[Any, Any, int, Any]:
    """The model wrapped, a cache holding ``context`` random tokens, the vocabulary size and a
    seeded generator, after a few untimed passes: freshly loaded (GGUF: freshly dequantized)
    weights are paged in by the first passes, which run several times slower."""
    import torch

    from av_core.collect import HuggingFaceCausalLM

    lm = HuggingFaceCausalLM(model, device)
    cache = lm.new_cache()
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    lm.forward(torch.randint(0, vocab, (context,), generator=generator).tolist(), cache, 1)
    for _ in range(3):
        lm.forward([0], cache, 1)
        lm.crop(cache, context)
    return lm, cache, vocab, generator


def loaded_model_forward(
    model: Any, *, device: str = "cpu", context: int = 128
) -> Callable[[int], None]:
    """:func:`model_forward` for a transformers model already in memory."""
    import torch

    lm, cache, vocab, generator = _warm_cache(model, device, context, seed=0)

    def forward(t: int) -> None:
        ids = torch.randint(0, vocab, (t,), generator=generator).tolist()
        lm.forward(ids, cache, 1)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        lm.crop(cache, context)

    return forward


def loaded_drafting_forward(
    model: Any, *, device: str = "cpu", context: int = 128
) -> Callable[[int], None]:
    """A ``forward(d)`` that drafts ``d`` positions autoregressively: ``d`` sequential
    one-token passes, each appending the previous pass's token, then the cache is cropped back.
    Timed by :func:`measure_forward_ms`, it gives the draft-cost-by-depth profile."""
    import torch

    lm, cache, vocab, generator = _warm_cache(model, device, context, seed=1)

    def forward(depth: int) -> None:
        token = int(torch.randint(0, vocab, (1,), generator=generator))
        for _ in range(depth):
            token = int(lm.forward([token], cache, 1)[-1].argmax())
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        lm.crop(cache, context)

    return forward


def model_drafting_forward(
    path: str | Path, *, device: str = "cpu", context: int = 128
) -> Callable[[int], None]:
    """:func:`loaded_drafting_forward` for a model directory or GGUF file."""
    from av_core.collect import HuggingFaceCausalLM

    model, _ = HuggingFaceCausalLM.load(path, device=device)
    return loaded_drafting_forward(model, device=device, context=context)


def write_cost_file(
    path: str | Path,
    verify: Sequence[tuple[int, float]],
    draft: Sequence[tuple[int, float]] | None = None,
    draft_depth: Sequence[tuple[int, float]] | None = None,
    **metadata: Any,
) -> None:
    """Writes ``{"verify": [[t, ms], ...], "draft": [...] | null, "draft_depth": [[d, ms], ...]
    (when profiled), ...metadata}`` as JSON."""
    data: dict[str, Any] = dict(metadata)
    data["verify"] = [[int(t), float(ms)] for t, ms in verify]
    data["draft"] = [[int(t), float(ms)] for t, ms in draft] if draft else None
    if draft_depth:
        data["draft_depth"] = [[int(d), float(ms)] for d, ms in draft_depth]
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def format_points(name: str, points: Sequence[tuple[int, float]]) -> str:
    """One table: tokens, ms, and the cost relative to a one-token forward."""
    base = points[0][1] if points and points[0][1] > 0 else float("nan")
    lines = [f"{name}: {'tokens':>7}{'ms':>10}{'x 1st':>8}"]
    for t, ms in points:
        lines.append(f"{'':>{len(name) + 2}}{t:>7}{ms:>10.2f}{ms / base:>8.2f}")
    return "\n".join(lines)


__all__ = [
    "DEFAULT_TOKENS",
    "format_points",
    "loaded_drafting_forward",
    "loaded_model_forward",
    "measure_forward_ms",
    "model_drafting_forward",
    "model_forward",
    "write_cost_file",
]
