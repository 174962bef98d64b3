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

from av_core._native import InvalidValueError

DEFAULT_TOKENS = (1, 2, 3, 4, 5, 8, 16, 32, 64, 128, 256)


def measure_forward_samples(
    forward: Callable[[int], None],
    tokens: Sequence[int],
    *,
    repeats: int = 5,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[tuple[int, list[float]]]:
    """Every timed run in ms of ``forward(t)`` for each ``t`` (after ``warmup`` untimed calls).

    ``forward`` must finish its work before returning (synchronize a GPU inside it).
    ``progress(done, total, status)`` is called after each token count.
    """
    if repeats < 1:
        raise InvalidValueError(f"repeats must be >= 1, got {repeats}")
    for t in tokens:
        if t < 1:
            raise InvalidValueError(f"token counts must be >= 1, got {t}")
    samples: list[tuple[int, list[float]]] = []
    for index, t in enumerate(tokens):
        for _ in range(warmup):
            forward(t)
        times = []
        for _ in range(repeats):
            start = clock()
            forward(t)
            times.append((clock() - start) * 1000.0)
        samples.append((int(t), times))
        if progress is not None:
            progress(index + 1, len(tokens), f"{t} tokens")
    return samples


def medians(samples: Sequence[tuple[int, Sequence[float]]]) -> list[tuple[int, float]]:
    """``(t, median ms)`` of each sample list."""
    return [(int(t), float(statistics.median(times))) for t, times in samples]


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
    return medians(
        measure_forward_samples(forward, tokens, repeats=repeats, warmup=warmup, clock=clock)
    )


#: A forward pass over more tokens may not be faster than one over fewer by more than this
#: fraction (memory-bound passes are flat, compute-bound ones grow): a larger drop is noise.
MONOTONE_TOLERANCE = 0.2
#: The spread (max - min) of one size's repeats, relative to their median, above which the
#: sweep is called noisy.
NOISE_TOLERANCE = 0.5


def _tokens(count: int) -> str:
    return f"{count} token" if count == 1 else f"{count} tokens"


def sweep_warnings(
    name: str,
    samples: Sequence[tuple[int, Sequence[float]]],
    *,
    threads: int | None = None,
    repeats: int | None = None,
    monotone_tolerance: float = MONOTONE_TOLERANCE,
    noise_tolerance: float = NOISE_TOLERANCE,
) -> list[str]:
    """What looks wrong with a timing sweep, one sentence each (empty when it looks clean).

    Two checks on ``(tokens, [ms, ...])`` samples, in increasing token order: **non-monotone**,
    a size whose median is more than ``monotone_tolerance`` below the median of a smaller size
    (more tokens cannot take much less time; the worst such pair is named), and **noisy**, a
    size whose repeats spread over more than ``noise_tolerance`` times their median (the
    noisiest size is named). Each warning ends with what to try: ``--threads 1`` (unless
    ``threads`` is already 1) and more ``--repeats``.
    """
    points = sorted((int(t), [float(v) for v in times]) for t, times in samples)
    centre = [(t, statistics.median(times)) for t, times in points if times]
    advice = []
    if threads != 1:
        advice.append("--threads 1 (threads contending on a busy machine skew small passes)")
    advice.append(f"more --repeats (now {repeats})" if repeats is not None else "more --repeats")
    hint = "; try " + " and ".join(advice)
    found: list[str] = []
    worst: tuple[float, int, float, int, float] | None = None
    running_max: tuple[int, float] | None = None
    for t, ms in centre:
        if running_max is not None and running_max[1] > 0:
            drop = 1.0 - ms / running_max[1]
            if drop > monotone_tolerance and (worst is None or drop > worst[0]):
                worst = (drop, running_max[0], running_max[1], t, ms)
        if running_max is None or ms > running_max[1]:
            running_max = (t, ms)
    if worst is not None:
        _, t0, ms0, t1, ms1 = worst
        found.append(
            f"{name} timings are not monotone: {_tokens(t1)} took {ms1:.2f} ms but "
            f"{_tokens(t0)} took {ms0:.2f} ms (a larger pass cannot be much faster: the "
            f"machine was busy or the timing is noisy){hint}"
        )
    noisiest: tuple[float, int, float, float, float] | None = None
    for t, times in points:
        if len(times) < 2:
            continue
        median = statistics.median(times)
        if median <= 0:
            continue
        spread = (max(times) - min(times)) / median
        if spread > noise_tolerance and (noisiest is None or spread > noisiest[0]):
            noisiest = (spread, t, min(times), max(times), median)
    if noisiest is not None:
        _, t, low, high, median = noisiest
        found.append(
            f"{name} timings are noisy: the repeats at {_tokens(t)} range from {low:.2f} to "
            f"{high:.2f} ms around a median of {median:.2f} ms{hint}"
        )
    return found


def model_forward(
    path: str | Path, *, device: str = "cpu", context: int = 128
) -> Callable[[int], None]:
    """A ``forward(t)`` for :func:`measure_forward_ms` over a transformers model (or GGUF file).

    Needs ``av_core[collect]`` (torch, transformers). Token ids are arbitrary: the time of a
    forward pass does not depend on them.
    """
    from av_core.tools.collect import HuggingFaceCausalLM

    model, _ = HuggingFaceCausalLM.load(path, device=device)
    return loaded_model_forward(model, device=device, context=context)


def _warm_cache(model: Any, device: str, context: int, seed: int) -> tuple[Any, Any, int, Any]:
    """The model wrapped, a cache holding ``context`` random tokens, the vocabulary size and a
    seeded generator, after a few untimed passes: freshly loaded (GGUF: freshly dequantized)
    weights are paged in by the first passes, which run several times slower."""
    import torch

    from av_core.tools.collect import HuggingFaceCausalLM

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
    from av_core.tools.collect import HuggingFaceCausalLM

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
    "MONOTONE_TOLERANCE",
    "NOISE_TOLERANCE",
    "format_points",
    "loaded_drafting_forward",
    "loaded_model_forward",
    "measure_forward_ms",
    "measure_forward_samples",
    "medians",
    "model_drafting_forward",
    "model_forward",
    "sweep_warnings",
    "write_cost_file",
]
