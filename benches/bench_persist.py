"""Persistence of a trained estimator: ``to_bytes``/``from_bytes`` and
``state_dict``/``from_state_dict`` for both updates at K = 4 and 8, against :mod:`pickle` doing
the same job on the same content (the ``state_dict``: what a caller without av_core's format
would store). A server saves and restores these on warm restarts and checkpoints, off the
critical path; the rows exist so a change to the formats shows up in the table (and in
``scripts/ab_bench.py``).

The state: the default estimator after 64 observed steps of R = 64 requests (features from
N(1.5, 2), accepted counts uniform), so the map update's histogram and the vLLM update's
statistics hold data.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from timing import summary, timed

from av_core import AcceptanceEstimator


def trained(k: int, update: str) -> AcceptanceEstimator:
    """The default estimator of this update after 64 steps of R = 64 (seeded)."""
    rng = np.random.default_rng(k)
    estimator = AcceptanceEstimator(k, update=update)
    for _ in range(64):
        x = rng.normal(1.5, 2.0, size=(64, k)).astype(np.float32)
        drafted = np.full(64, k, np.int64)
        estimator.observe(x, drafted, rng.integers(0, k + 1, size=64))
    return estimator


def rows_for(k: int, update: str, repeats: int, inner: int) -> list[dict[str, Any]]:
    estimator = trained(k, update)
    data, state = estimator.to_bytes(), estimator.state_dict()
    pickled = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    pairs = {
        "to_bytes": (estimator.to_bytes, lambda: pickle.dumps(state, pickle.HIGHEST_PROTOCOL)),
        "from_bytes": (lambda: AcceptanceEstimator.from_bytes(data), lambda: pickle.loads(pickled)),
        "state_dict": (estimator.state_dict, lambda: pickle.loads(pickled)),
        "from_state_dict": (
            lambda: AcceptanceEstimator.from_state_dict(state),
            lambda: pickle.loads(pickled),
        ),
    }
    references = {
        "to_bytes": "pickle.dumps of the state_dict",
        "from_bytes": "pickle.loads of the pickled state_dict",
        "state_dict": "pickle.loads of the pickled state_dict",
        "from_state_dict": "pickle.loads of the pickled state_dict",
    }
    rows = []
    for call, (ours, reference) in pairs.items():
        samples = timed({"av_core": ours, "reference": reference}, repeats, inner)
        median, q1, q3 = summary(samples["av_core"])
        reference_median, _, _ = summary(samples["reference"])
        rows.append(
            {
                "group": "persist",
                "name": f"{call} ({update}) K={k}",
                "median_us": median,
                "q1_us": q1,
                "q3_us": q3,
                "reference": f"{references[call]} ({len(data)} B ours, {len(pickled)} B pickled)",
                "reference_median_us": reference_median,
                "speedup": reference_median / median,
            }
        )
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    repeats, inner = (7, 50) if quick else (21, 200)
    rows: list[dict[str, Any]] = []
    for update in ("vllm", "map"):
        for k in (4, 8):
            rows += rows_for(k, update, repeats, inner)
    return rows
