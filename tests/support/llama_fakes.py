"""Helpers of the llama.cpp integration's tests: a runtime whose logits are a seeded function of
each sequence's cached tokens (it enforces llama.cpp's position rules), a random source that
enumerates every branch of the loop with its exact probability, an independent sampler, and the
tiny GGUF pair.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence

import numpy as np


class FakeRuntime:
    """A model context whose logits at an entry are a seeded function of every token its
    sequence holds up to and including that entry. Like llama.cpp it requires each sequence's
    entries in a batch to continue its cache at consecutive positions, and ``remove`` drops a
    tail. ``logits_of(prefix)`` is the model itself, for references."""

    def __init__(
        self,
        vocab: int,
        seed: int,
        *,
        n_seq_max: int = 4,
        capacity: int = 64,
        scale: float = 1.5,
        rows: Callable[[tuple[int, ...]], np.ndarray] | None = None,
    ) -> None:
        self.n_vocab = vocab
        self.n_seq_max = n_seq_max
        self.capacity = capacity
        self.seed = seed
        self.scale = scale
        self.rows = rows
        self.kv: list[list[int]] = [[] for _ in range(n_seq_max)]
        self.decodes: list[list[tuple[int, int]]] = []

    @property
    def seq_capacity(self) -> int:
        return self.capacity

    def logits_of(self, prefix: Sequence[int]) -> np.ndarray:
        if self.rows is not None:
            return np.asarray(self.rows(tuple(prefix)), dtype=np.float32)
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        return (rng.standard_normal(self.n_vocab) * self.scale).astype(np.float32)

    def clear(self) -> None:
        self.kv = [[] for _ in range(self.n_seq_max)]

    def decode(self, tokens, positions, seq_ids, logits):  # type: ignore[no-untyped-def]
        out = []
        self.decodes.append(list(zip(seq_ids, positions, strict=True)))
        for token, position, seq, want in zip(tokens, positions, seq_ids, logits, strict=True):
            assert position == len(self.kv[seq]), (
                f"sequence {seq}: position {position} does not continue its cache of "
                f"{len(self.kv[seq])}"
            )
            assert len(self.kv[seq]) < self.capacity
            self.kv[seq].append(int(token))
            if want:
                out.append(self.logits_of(self.kv[seq]))
        return np.array(out, dtype=np.float32).reshape(len(out), self.n_vocab)

    def remove(self, seq_id: int, start: int) -> None:
        assert 0 <= start <= len(self.kv[seq_id])
        del self.kv[seq_id][start:]


class ScriptedSource:
    """A random source that follows a script of choices and then takes the first possible
    outcome, recording every choice point's outcomes and the path's probability."""

    def __init__(self, script: Sequence[Hashable]) -> None:
        self.script = list(script)
        self.choices: list[Hashable] = []
        self.options: list[list[tuple[Hashable, float]]] = []
        self.probability = 1.0

    def _choose(self, options: list[tuple[Hashable, float]]) -> Hashable:
        depth = len(self.choices)
        choice = self.script[depth] if depth < len(self.script) else options[0][0]
        weight = dict(options)[choice]
        self.choices.append(choice)
        self.options.append(options)
        self.probability *= weight
        return choice

    def bernoulli(self, probability: float) -> bool:
        options = [(v, w) for v, w in ((True, probability), (False, 1.0 - probability)) if w > 0]
        return bool(self._choose(options))

    def categorical(self, weights: np.ndarray) -> int:
        w = np.asarray(weights, dtype=np.float64)
        total = w.sum()
        options = [(int(i), float(w[i] / total)) for i in np.flatnonzero(w > 0)]
        return int(self._choose(options))  # type: ignore[call-overload]


def enumerate_law(run: Callable[[ScriptedSource], Hashable]) -> dict[Hashable, float]:
    """The exact law of ``run``'s result: every path of choices, each run once, weighted by
    its probability."""
    law: dict[Hashable, float] = defaultdict(float)
    pending: list[list[Hashable]] = [[]]
    while pending:
        script = pending.pop()
        source = ScriptedSource(script)
        outcome = run(source)
        law[outcome] += source.probability
        for depth in range(len(script), len(source.choices)):
            for value, _ in source.options[depth]:
                if value != source.choices[depth]:
                    pending.append([*source.choices[:depth], value])
    return dict(law)


def reference_distribution(
    logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> np.ndarray:
    """The sampling distribution written out entry by entry (independent of the package):
    greedy at T <= 0; else softmax(z / T), the k largest kept, then the smallest prefix of the
    renormalised rest (descending) with mass >= p."""
    z = [float(v) for v in logits]
    n = len(z)
    if temperature <= 0:
        best = max(range(n), key=lambda i: (z[i], -i))
        return np.array([1.0 if i == best else 0.0 for i in range(n)])
    order = sorted(range(n), key=lambda i: (-z[i], i))
    if 0 < top_k < n:
        order = order[:top_k]
    top = max(z)
    mass = {i: float(np.exp((z[i] - top) / temperature)) for i in order}
    total = sum(mass.values())
    kept, before = [], 0.0
    for i in order:
        if kept and before >= top_p * total:
            break
        kept.append(i)
        before += mass[i]
    out = np.zeros(n)
    norm = sum(mass[i] for i in kept)
    for i in kept:
        out[i] = mass[i] / norm
    return out


def target_law(
    model: FakeRuntime, prompt: Sequence[int], length: int, params: tuple[float, int, float]
) -> dict[tuple[int, ...], float]:
    """The law of the next ``length`` tokens sampled from ``model`` alone after ``prompt``."""
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        grown: dict[tuple[int, ...], float] = {}
        for tokens, probability in law.items():
            p = reference_distribution(model.logits_of([*prompt, *tokens]), *params)
            for token in np.flatnonzero(p > 0):
                grown[(*tokens, int(token))] = probability * float(p[token])
        law = grown
    return law


def max_difference(a: dict[Hashable, float], b: dict[Hashable, float]) -> float:
    return max(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in set(a) | set(b))


@functools.cache
def tiny_models() -> tuple[str, str]:
    """A tiny target and drafter GGUF (384 tokens, seeded random weights), written once per
    test process into a folder removed at exit."""
    from av_core.llama_cpp.tiny import write_tiny_pair

    folder = tempfile.mkdtemp(prefix="av_core_tiny_gguf_")
    atexit.register(shutil.rmtree, folder, True)
    target, drafter = write_tiny_pair(folder)
    return str(target), str(drafter)
