"""Measured cost tables for the loop (``av-core profile --engine llama.cpp``): the step costs of
exactly what :class:`~av_core.llama_cpp.engine.SpeculativeEngine` runs at R requests, timed
through the loop's own stage methods (so the host work of each stage is in its price).

- **verify**: :meth:`~SpeculativeEngine.verify_pass` of R sequences, each a block of its last
  token and ``a`` drafts (``t = R (1 + a)`` entries with logits, the sampler's distributions,
  exact speculative sampling per request): ``(t, ms)`` for ``a = 0..K``.
- **draft**: :meth:`~SpeculativeEngine.draft_pass` over ``n`` requests, one token each (the
  decode, each row's distribution and a draw): ``(n, ms)`` for ``n = 1..R``.
- **catchup**: one request's drafter pass that also feeds ``c`` tokens the drafter had not seen
  (after steps without drafting): ``(1 + c, ms)``.
- **draft_depth**: ``d`` drafter passes over the R requests, one after another: ``(d, ms)``.

Every sequence first holds ``context`` tokens; each timed call is rolled back afterwards.

:meth:`EngineCosts.tables` builds the planner's ``CostTables`` with the simulator's own
:func:`~av_core.tools.simulate.cost_tables_for` (linear between points, an autoregressive
drafter: ``d`` passes for depth ``d``), so the planner and the simulation price a step alike.
:meth:`EngineCosts.price` prices a step's forward passes as llama.cpp runs them: with one KV
stream per sequence it splits a batch into micro-batches of equal length per sequence over
consecutive sequence ids (``split_equal``), one graph each (:func:`llama_ubatches`). A target
micro-batch costs by its tokens, whatever the number of sequences they belong to, so its price
reads one curve of tokens that pools the verify points of every profiled concurrency; each curve
the price reads is the least-squares non-decreasing fit of its points (:func:`monotone_fit`),
which averages a noisy point with its neighbours instead of raising every later point to it.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from av_core import CostTables
from av_core._native import InvalidValueError
from av_core.llama_cpp.engine import Draft, SpeculativeEngine
from av_core.llama_cpp.policies import FixedK
from av_core.llama_cpp.sampling import NumpySource
from av_core.tools.simulate import MeasuredCost, cost_tables_for
from av_core.tools.simulate.costs import FloatArray
from av_core.tools.simulate.run import PassShape, StepShape

#: Version of the file :func:`write_engine_costs` writes.
FORMAT = "av_core.llama_cpp.costs/1"
#: Drafter catch-up lengths the profile times (tokens fed in one request's pass).
CATCHUP_TOKENS = (1, 2, 3, 5, 9, 33)
Points = list[tuple[int, float]]


def monotone_fit(points: Sequence[tuple[float, float]]) -> tuple[FloatArray, FloatArray]:
    """The least-squares non-decreasing fit of ``(x, ms)`` points (pool adjacent violators; the
    points of one ``x`` weigh by their number): the distinct ``x`` in order and the fitted
    milliseconds at each."""
    merged: dict[float, list[float]] = {}
    for x, ms in points:
        merged.setdefault(float(x), []).append(float(ms))
    xs = sorted(merged)
    # Blocks of consecutive x sharing one fitted value: (how many x, sum of ms, points).
    blocks: list[tuple[int, float, int]] = []
    for x in xs:
        count, total, weight = 1, sum(merged[x]), len(merged[x])
        while blocks and blocks[-1][1] * weight > total * blocks[-1][2]:
            before = blocks.pop()
            count, total, weight = count + before[0], total + before[1], weight + before[2]
        blocks.append((count, total, weight))
    fitted = np.repeat([total / weight for _, total, weight in blocks], [c for c, _, _ in blocks])
    return np.asarray(xs, dtype=np.float64), fitted


def _at(curve: tuple[FloatArray, FloatArray], x: float) -> float:
    """A fitted curve at ``x``: linear between points, extended along the first segment below
    the first point (never below 0 ms) and along the last one past the last."""
    xs, ys = curve
    if len(xs) == 1:
        return float(ys[0])
    if x < xs[0]:
        return max(float(ys[0] + (x - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0])), 0.0)
    if x > xs[-1]:
        return float(ys[-1] + (x - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
    return float(np.interp(x, xs, ys))


def llama_ubatches(shape: PassShape) -> list[tuple[int, int]]:
    """The micro-batches llama.cpp runs for one batch (``(slot, tokens)`` blocks in batch
    order) when every sequence has its own KV stream: ``llama_batch_allocr::split_equal`` with
    sequential ids takes the first sequence with tokens left and each following one whose id is
    the previous plus one, and as many tokens from each as the shortest has left. Returns
    ``(sequences, tokens)`` of each micro-batch."""
    left = [[slot, tokens] for slot, tokens in shape if tokens > 0]
    out = []
    while left:
        chosen = [left[0]]
        for block in left[1:]:
            if block[0] == chosen[-1][0] + 1:
                chosen.append(block)
        take = min(block[1] for block in chosen)
        out.append((len(chosen), take * len(chosen)))
        for block in chosen:
            block[1] -= take
        left = [block for block in left if block[1] > 0]
    return out


@dataclass(frozen=True)
class EngineCosts:
    """Measured points per concurrency: ``points[R] = {"verify": [(t, ms)], "draft": [(n, ms)],
    "catchup": [(tokens, ms)], "draft_depth": [(d, ms)]}`` (medians), with the settings they
    were measured under."""

    points: dict[int, dict[str, Points]]
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
        cost = self.measured_cost(requests)
        return cost_tables_for(
            cost, "autoregressive", self.num_positions, requests, depth_table=True
        )

    @cached_property
    def _curves(self) -> dict[str, tuple[FloatArray, FloatArray]]:
        """The curves :meth:`price` reads: the target's milliseconds by tokens (every profiled
        concurrency's verify points), the drafter's by requests and its catch-up by tokens
        (the largest concurrency's profile)."""
        largest = self.points[max(self.points)]
        return {
            "verify": monotone_fit([p for entry in self.points.values() for p in entry["verify"]]),
            "draft": monotone_fit(largest["draft"]),
            "catchup": monotone_fit(largest.get("catchup") or [(1, 0.0)]),
        }

    def price(self, shape: StepShape) -> float:
        """A step's milliseconds from its forward passes, micro-batch by micro-batch: a target
        micro-batch of t tokens at the target's curve of tokens, a drafter one of n sequences
        and t tokens at the pass over n requests plus what its other t - n tokens add on the
        catch-up curve (the layers cost by tokens, the output layer by logits rows: one per
        request)."""
        curves = self._curves
        total = 0.0
        for one_pass in shape.draft_passes:
            for n, t in llama_ubatches(one_pass):
                extra = _at(curves["catchup"], t) - _at(curves["catchup"], n)
                total += _at(curves["draft"], n) + max(extra, 0.0)
        for _, t in llama_ubatches(shape.verify):
            total += _at(curves["verify"], t)
        return total

    def _entry(self, requests: int) -> dict[str, Points]:
        if requests not in self.points:
            raise InvalidValueError(
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
                    **{k: [[int(x), float(ms)] for x, ms in v] for k, v in entry.items()},
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
            raise InvalidValueError(f"{path}: not a llama.cpp cost file ({error})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InvalidValueError(
                f"{path}: not a llama.cpp cost file (no 'format': {FORMAT!r}); write one with "
                "'av-core profile --engine llama.cpp'"
            )
        keys = ("verify", "draft", "draft_depth", "catchup")
        try:
            points = {
                int(r): {
                    key: [(int(x), float(ms)) for x, ms in entry[key]]
                    for key in keys
                    if key != "catchup" or key in entry
                }
                for r, entry in data["concurrency"].items()
            }
            num_positions = int(data["num_positions"])
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidValueError(f"{path}: malformed llama.cpp cost file ({error!r})") from None
        for entry in points.values():
            for key, values in entry.items():
                if not values or any(not math.isfinite(ms) or ms < 0 for _, ms in values):
                    raise InvalidValueError(f"{path}: {key!r} needs finite, non-negative times")
        metadata = {
            k: v
            for k, v in data.items()
            if k not in ("format", "engine", "num_positions", "concurrency")
        }
        return EngineCosts(points, num_positions, metadata)


def profile_tokens(context: int, num_positions: int) -> int:
    """The ``tokens_per_request`` of ``open_engine`` that :func:`profile_engine` needs at
    ``context`` cached tokens and ``num_positions`` positions: the context, the longest
    catch-up and a draft block after it."""
    return context + max(CATCHUP_TOKENS) + num_positions


def _median_ms(
    call: Callable[[], None],
    undo: Callable[[], None],
    repeats: int,
    clock: Callable[[], float],
) -> float:
    call()  # warm-up
    undo()
    times = []
    for _ in range(repeats):
        start = clock()
        call()
        times.append((clock() - start) * 1000.0)
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
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Points]:
    """The verify, draft, catch-up and draft-depth points of the loop at ``requests`` requests
    (module docstring), timed by ``clock``; ``progress(done, total, status)`` after each."""
    target, drafter = engine.target, engine.drafter
    rng = np.random.default_rng(seed)
    vocab = target.n_vocab
    prompts = [list(map(int, rng.integers(0, vocab, size=context))) for _ in range(requests)]
    engine.check_capacity(prompts, max(CATCHUP_TOKENS) + num_positions)
    prefill = [t for p in prompts for t in p]
    positions = [i for _ in prompts for i in range(context)]
    seq_ids = [r for r in range(requests) for _ in range(context)]
    for runtime in (target, drafter):
        runtime.clear()
        runtime.decode(prefill, positions, seq_ids, [False] * len(prefill))
    source, policy = NumpySource(seed), FixedK(1)
    total = (num_positions + 1) + requests + len(CATCHUP_TOKENS) + num_positions
    done = [0]

    def timed(
        kind: str, size: int, call: Callable[[], Any], runtime: Any, slots: range
    ) -> tuple[int, float]:
        def undo() -> None:
            for r in slots:
                runtime.remove(r, context)

        ms = _median_ms(call, undo, repeats, clock)
        done[0] += 1
        if progress is not None:
            progress(done[0], total, f"{kind} {size}")
        return size, ms

    def tokens(n: int) -> list[int]:
        return list(map(int, rng.integers(0, vocab, size=n)))

    def verify(a: int) -> Callable[[], None]:
        def call() -> None:
            blocks = [(r, context, tokens(1 + a)) for r in range(requests)]
            drafts = [[_greedy_draft(t, vocab) for t in block[2][1:]] for block in blocks]
            engine.verify_pass(blocks, drafts, source)

        return call

    def passes(sizes: Sequence[int], depth: int = 1) -> Callable[[], None]:
        def call() -> None:
            for d in range(depth):
                blocks = [(r, context + d * n, tokens(n)) for r, n in enumerate(sizes)]
                engine.draft_pass(blocks, policy, source)

        return call

    everyone = range(requests)
    depth = [
        timed("drafting depth", d, passes([1] * requests, d), drafter, everyone)
        for d in range(1, num_positions + 1)
    ]
    points = {
        "verify": [
            timed("target, drafts", a, verify(a), target, everyone)
            for a in range(num_positions + 1)
        ],
        "draft": [
            timed("drafter pass, requests", n, passes([1] * n), drafter, range(n))
            for n in range(1, requests + 1)
        ],
        "catchup": [
            timed("drafter catch-up, tokens", c, passes([c]), drafter, range(1))
            for c in CATCHUP_TOKENS
        ],
        "draft_depth": [(0, 0.0), *depth],
    }
    points["verify"] = [(requests * (1 + a), ms) for a, ms in points["verify"]]
    for runtime in (target, drafter):
        runtime.clear()
    return points


def _greedy_draft(token: int, vocab: int) -> Draft:
    """A draft of ``token`` drawn greedily (one-hot q): what verification reads of a draft."""
    q = np.zeros(vocab)
    q[token] = 1.0
    return Draft(token, q, np.empty(0, dtype=np.float32), math.nan)


class OnlineCosts:
    """Re-measures the loop's step costs while it runs (the option of measuring online): each
    step's target pass joins the samples of its size (tokens), each drafter pass those of its
    size (requests), the last ``window`` of each size kept; every ``interval`` steps the tables
    are rebuilt from the profile's points with each size seen online at its median, priced as
    :meth:`EngineCosts.tables` prices them. Feed it with :meth:`record` (an adaptive policy built
    with ``online=`` does, and switches to the tables it returns)."""

    def __init__(
        self,
        points: dict[str, Points],
        num_positions: int,
        requests: int,
        *,
        interval: int = 25,
        window: int = 16,
    ) -> None:
        if interval < 1 or window < 1:
            raise InvalidValueError(
                f"interval and window must be >= 1, got {interval} and {window}"
            )
        self.base = {key: dict(points[key]) for key in ("verify", "draft")}
        self.num_positions, self.requests = num_positions, requests
        self.interval, self.window = interval, window
        self.samples: dict[str, dict[int, list[float]]] = {"verify": {}, "draft": {}}
        self.steps = 0

    def _add(self, key: str, size: int, ms: float) -> None:
        kept = self.samples[key].setdefault(size, [])
        kept.append(ms)
        del kept[: -self.window]

    def points(self, key: str) -> Points:
        """The profile's points of ``key`` with each size measured online at its median."""
        merged = dict(self.base[key])
        for size, times in self.samples[key].items():
            merged[size] = float(statistics.median(times))
        return sorted(merged.items())

    def record(self, step: Any) -> CostTables | None:
        """Adds a step's timings (a :class:`~av_core.llama_cpp.engine.StepRecord`); the rebuilt
        tables every ``interval`` steps, else None."""
        self._add("verify", sum(t for _, t in step.shape.verify), float(step.verify_ms))
        for one_pass, ms in zip(step.shape.draft_passes, step.draft_pass_ms, strict=True):
            self._add("draft", len(one_pass), float(ms))
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


__all__ = [
    "CATCHUP_TOKENS",
    "FORMAT",
    "EngineCosts",
    "OnlineCosts",
    "llama_ubatches",
    "monotone_fit",
    "profile_engine",
    "profile_tokens",
    "write_engine_costs",
]
