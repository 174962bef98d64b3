"""Shared timing helpers for the benchmarks: interleaved repeats and quartile summaries."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(
    calls: dict[str, Callable[[], object]], repeats: int, inner: int
) -> dict[str, list[float]]:
    """Microseconds per call, `inner` calls per sample, the calls alternated sample by sample so
    drift on a shared machine hits all of them alike."""
    for call in calls.values():
        call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(inner):
                call()
            samples[name].append((time.perf_counter() - start) / inner * 1e6)
    return samples


def timed_each(
    calls: dict[str, tuple[Callable[[], object], Callable[[], object]]], repeats: int, inner: int
) -> dict[str, list[float]]:
    """Like :func:`timed` for calls that consume state: each entry is ``(setup, call)``;
    ``setup`` runs untimed before every ``call`` and only ``call`` is timed (one
    ``perf_counter`` pair per call, about 0.05 µs, charged to every entry alike)."""
    for setup, call in calls.values():
        setup()
        call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    clock = time.perf_counter
    for _ in range(repeats):
        for name, (setup, call) in calls.items():
            total = 0.0
            for _ in range(inner):
                setup()
                start = clock()
                call()
                total += clock() - start
            samples[name].append(total / inner * 1e6)
    return samples


def summary(samples: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile)."""
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return median, q1, q3
