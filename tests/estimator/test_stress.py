"""Concurrency stress from Python: 8 producer threads x 10^6 labeled observations while other
threads predict and refit. Nothing is lost or counted twice, and the bits match a serial run."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from av_core import AcceptanceEstimator

K, ROWS, PRODUCERS, OBSERVATIONS = 4, 2000, 8, 1_000_000


def batches() -> list[tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(8):
        x = rng.normal(0.5, 3.0, size=(ROWS, K)).astype(np.float32)
        p = rng.uniform(0.05, 0.95, size=(ROWS, K)).astype(np.float32)
        admitted = np.full(ROWS, K, np.int64)
        accepted = np.arange(ROWS, dtype=np.int64) % (K + 1)
        out.append((x, admitted, accepted, p))
    return out


#: The round's integer columns under each update, and the one that counts labels.
KEYS = {"vllm": ("a", "b", "c", "g0", "g1", "n"), "map": ("count", "accepted", "x_sum")}
LABELS = {"vllm": "n", "map": "count"}


def add(total: dict[str, list[int]], part: dict[str, list[int]], keys: tuple[str, ...]) -> None:
    for key in keys:
        total[key] = [u + v for u, v in zip(total[key], part[key], strict=True)]


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_eight_producers_with_concurrent_predict_and_refit_lose_nothing(update: str) -> None:
    data = batches()
    probe = AcceptanceEstimator(K, update=update)
    probe.observe(*data[0])
    per_call = sum(probe.round_counts())
    calls = -(-OBSERVATIONS // per_call)

    serial = AcceptanceEstimator(K, refit_interval=2**62, update=update)
    for i in range(calls * PRODUCERS):
        serial.observe(*data[i % len(data)])
    expected = serial.state_dict()["round_stats"]

    est = AcceptanceEstimator(K, refit_interval=2**62, update=update)
    done = threading.Event()
    rounds: list[dict[str, list[int]]] = []
    predictions: list[np.ndarray] = []

    def produce(t: int) -> None:
        for i in range(calls):
            est.observe(*data[(t * calls + i) % len(data)])

    def refit() -> None:
        while not done.is_set():
            rounds.append(est.refit(report=True))

    def predict() -> None:
        x = data[0][0][:64]
        while not done.is_set():
            predictions.append(est.predict(x))

    helpers = [threading.Thread(target=refit), threading.Thread(target=predict)]
    producers = [threading.Thread(target=produce, args=(t,)) for t in range(PRODUCERS)]
    for t in helpers + producers:
        t.start()
    for t in producers:
        t.join()
    done.set()
    for t in helpers:
        t.join()

    keys, n = KEYS[update], LABELS[update]
    open_round = est.state_dict()["round_stats"]
    total = {key: list(open_round[key]) for key in keys}
    for r in rounds:
        add(total, r, keys)
    assert total == {key: expected[key] for key in keys}
    assert sum(total[n]) >= PRODUCERS * OBSERVATIONS
    assert len(rounds) > 1
    assert all(sum(r[n]) % per_call == 0 for r in rounds)  # rounds hold whole calls
    assert predictions and all(np.isfinite(p).all() for p in predictions)
