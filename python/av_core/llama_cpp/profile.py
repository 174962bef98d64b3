"""Measured cost tables for the loop (``av-core profile --engine llama.cpp``): the step costs of
exactly the shapes :class:`~av_core.llama_cpp.engine.SpeculativeEngine` runs at R requests.

- **verify**: one target decode of R sequences, each appending its last token and ``a`` drafts
  (``t = R (1 + a)`` entries, every entry with logits), plus the sampler's distribution of
  every row: ``(t, ms)`` for ``a = 0..K``.
- **draft**: one drafter pass over ``n`` requests (one token each, with logits), plus each
  row's distribution and a draw from it: ``(n, ms)`` for ``n = 1..R``.
- **draft_depth**: ``d`` such passes over the R requests, one after another: ``(d, ms)``.

Every sequence first holds ``context`` tokens; each timed call is rolled back afterwards.
The file is a cost file of ``av-core simulate`` (``verify``/``draft``/``draft_depth`` points) per
concurrency, with the planner's tables built from it by the simulator's own
:func:`~av_core.tools.simulate.cost_tables_for` (linear between points, an autoregressive
drafter: ``d`` passes for depth ``d``), so the planner and the simulation price a step alike.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from av_core import CostTables
from av_core.llama_cpp.engine import SpeculativeEngine
from av_core.llama_cpp.sampling import NumpySource, probabilities
from av_core.tools.simulate import MeasuredCost, cost_tables_for

#: Version of the file :func:`write_engine_costs` writes.
FORMAT = "av_core.llama_cpp.costs/1"


@dataclass(frozen=True)
class EngineCosts:
    """Measured points per concurrency: ``points[R] = {"verify": [(t, ms)], "draft": [(n, ms)],
    "draft_depth": [(d, ms)]}`` (medians), with the settings they were measured under."""

    points: dict[int, dict[str, list[tuple[int, float]]]]
    num_positions: int
    metadata: dict[str, Any]

    def measured_cost(self, requests: int) -> MeasuredCost:
        """The simulator's cost model of concurrency ``requests``."""
        entry = self._entry(requests)
        return MeasuredCost(
            np.asarray(entry["verify"], dtype=np.float64),
            np.asarray(entry["draft"], dtype=np.float64),
            f"llama.cpp profile, R={requests}",
        )

    def tables(self, requests: int) -> CostTables:
        """The planner's tables at ``requests``: ``draft_ms``, ``verify_ms`` and the depth table,
        priced as the simulator prices them."""
        return cost_tables_for(
            self.measured_cost(requests),
            "autoregressive",
            self.num_positions,
            requests,
            depth_table=True,
        )

    def _entry(self, requests: int) -> dict[str, list[tuple[int, float]]]:
        if requests not in self.points:
            raise ValueError(
                f"requests: the cost file has no profile at R = {requests} (it has "
                f"{', '.join(map(str, sorted(self.points)))}); profile that concurrency"
            )
        return self.points[requests]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "engine": "llama.cpp",
            "num_positions": self.num_positions,
            **self.metadata,
            "concurrency": {
                str(r): {
                    **{
                        key: [[int(x), float(ms)] for x, ms in value]
                        for key, value in entry.items()
                    },
                    "cost_tables": json.loads(self.tables(r).to_json()),
                }
                for r, entry in sorted(self.points.items())
            },
        }

    @staticmethod
    def load(path: str | Path) -> EngineCosts:
        """Reads a file :func:`write_engine_costs` wrote; ``ValueError`` naming the file."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: not a llama.cpp cost file ({error})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(
                f"{path}: not a llama.cpp cost file (no 'format': {FORMAT!r}); write one with "
                "'av-core profile --engine llama.cpp'"
            )
        try:
            points = {
                int(r): {
                    key: [(int(x), float(ms)) for x, ms in entry[key]]
                    for key in ("verify", "draft", "draft_depth")
                }
                for r, entry in data["concurrency"].items()
            }
            num_positions = int(data["num_positions"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: malformed llama.cpp cost file ({error!r})") from None
        for entry in points.values():
            for key, values in entry.items():
                if not values or any(not math.isfinite(ms) or ms < 0 for _, ms in values):
                    raise ValueError(f"{path}: {key!r} needs finite, non-negative times")
        metadata = {
            k: v
            for k, v in data.items()
            if k not in ("format", "engine", "num_positions", "concurrency")
        }
        return EngineCosts(points, num_positions, metadata)


def _median_ms(
    call: Callable[[], None], undo: Callable[[], None], repeats: int, warmup: int = 1
) -> float:
    for _ in range(warmup):
        call()
        undo()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000.0)
        undo()
    return float(statistics.median(times))


def profile_engine(
    engine: SpeculativeEngine,
    requests: int,
    num_positions: int,
    *,
    context: int = 200,
    repeats: int = 3,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, list[tuple[int, float]]]:
    """The verify, draft and draft-depth points of the loop at ``requests`` requests (module
    docstring); ``progress(done, total, status)`` after each point."""
    target, drafter = engine.target, engine.drafter
    rng = np.random.default_rng(seed)
    vocab = target.n_vocab
    prompts = [list(map(int, rng.integers(0, vocab, size=context))) for _ in range(requests)]
    engine.check_capacity(prompts, 1 + num_positions)
    source = NumpySource(seed)
    params = engine.params
    for runtime in (target, drafter):
        runtime.clear()
        tokens = [t for p in prompts for t in p]
        positions = [i for _ in prompts for i in range(context)]
        seq_ids = [r for r in range(requests) for _ in range(context)]
        chunk = int(getattr(runtime, "batch_size", 512))
        for start in range(0, len(tokens), chunk):
            stop = start + chunk
            runtime.decode(
                tokens[start:stop],
                positions[start:stop],
                seq_ids[start:stop],
                [False] * len(tokens[start:stop]),
            )
    total = (num_positions + 1) + requests + num_positions
    done = 0

    def tick(status: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, status)

    def undo(runtime: Any, slots: Sequence[int]) -> Callable[[], None]:
        def call() -> None:
            for r in slots:
                runtime.remove(r, context)

        return call

    verify = []
    for a in range(num_positions + 1):
        n = requests * (1 + a)
        tokens = list(map(int, rng.integers(0, vocab, size=n)))
        positions = [context + i for _ in range(requests) for i in range(1 + a)]
        seq_ids = [r for r in range(requests) for _ in range(1 + a)]

        def call(
            tokens: list[int] = tokens,
            positions: list[int] = positions,
            seq_ids: list[int] = seq_ids,
        ) -> None:
            probabilities(target.decode(tokens, positions, seq_ids, [True] * len(tokens)), params)

        verify.append((n, _median_ms(call, undo(target, range(requests)), repeats)))
        tick(f"target, {a} drafts per request")

    def passes(count: int, depth: int) -> Callable[[], None]:
        def call() -> None:
            last = list(map(int, rng.integers(0, vocab, size=count)))
            for d in range(depth):
                rows = drafter.decode(
                    last, [context + d] * count, list(range(count)), [True] * count
                )
                last = [source.categorical(probabilities(row, params)) for row in rows]

        return call

    draft = []
    for n in range(1, requests + 1):
        draft.append((n, _median_ms(passes(n, 1), undo(drafter, range(n)), repeats)))
        tick(f"drafter pass, {n} requests")
    depth = []
    for d in range(1, num_positions + 1):
        depth.append((d, _median_ms(passes(requests, d), undo(drafter, range(requests)), repeats)))
        tick(f"drafting depth {d}")
    for runtime in (target, drafter):
        runtime.clear()
    return {"verify": verify, "draft": draft, "draft_depth": [(0, 0.0), *depth]}


class OnlineCosts:
    """Re-measures the loop's step costs while it runs (the option of measuring online): each
    step's target decode joins the samples of its size (tokens), each drafter pass those of its
    size (requests), the last ``window`` of each size kept; every ``interval`` steps the tables
    are rebuilt from the profile's points with each size seen online at its median, priced as
    :meth:`EngineCosts.tables` prices them. Feed it with :meth:`record` (an adaptive policy built
    with ``online=`` does, and switches to the tables it returns)."""

    def __init__(
        self,
        points: dict[str, list[tuple[int, float]]],
        num_positions: int,
        requests: int,
        *,
        interval: int = 25,
        window: int = 16,
    ) -> None:
        if interval < 1 or window < 1:
            raise ValueError(f"interval and window must be >= 1, got {interval} and {window}")
        self.base = {key: dict(points[key]) for key in ("verify", "draft")}
        self.num_positions, self.requests = num_positions, requests
        self.interval, self.window = interval, window
        self.samples: dict[str, dict[int, list[float]]] = {"verify": {}, "draft": {}}
        self.steps = 0

    def _add(self, key: str, size: int, ms: float) -> None:
        kept = self.samples[key].setdefault(size, [])
        kept.append(ms)
        del kept[: -self.window]

    def points(self, key: str) -> list[tuple[int, float]]:
        """The profile's points of ``key`` with each size measured online at its median."""
        merged = dict(self.base[key])
        for size, times in self.samples[key].items():
            merged[size] = float(statistics.median(times))
        return sorted(merged.items())

    def record(self, step: Any) -> CostTables | None:
        """Adds a step's timings (a :class:`~av_core.llama_cpp.engine.StepRecord`); the rebuilt
        tables every ``interval`` steps, else None."""
        self._add("verify", len(step.slots) + int(step.admitted.sum()), float(step.verify_ms))
        for size, ms in zip(step.draft_passes, step.draft_pass_ms, strict=True):
            self._add("draft", int(size), float(ms))
        self.steps += 1
        return None if self.steps % self.interval else self.tables()

    def tables(self) -> CostTables:
        """The tables of the current points (the profile's, with the sizes measured online)."""
        cost = MeasuredCost(
            np.asarray(self.points("verify"), dtype=np.float64),
            np.asarray(self.points("draft"), dtype=np.float64),
            "llama.cpp profile, re-measured online",
        )
        return cost_tables_for(
            cost, "autoregressive", self.num_positions, self.requests, depth_table=True
        )


def write_engine_costs(path: str | Path, costs: EngineCosts) -> None:
    """Writes the cost file (JSON) in one replace: an interrupted run leaves no half file."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(costs.to_dict(), indent=1) + "\n", encoding="utf-8")
    partial.replace(path)


__all__ = ["FORMAT", "EngineCosts", "OnlineCosts", "profile_engine", "write_engine_costs"]
