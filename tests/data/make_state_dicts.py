"""Writes ``state_dicts.json``: what ``state_dict()`` and ``refit(report=True)`` returned for a
few estimators driven by fixed observations, under the build before the ``state_dict`` codec
moved into the core (issue #19: main at 68d2910, where rust/src/estimator.rs wrote it). Run
once against that build to pin its output; tests/persist/test_state_dict_codec.py replays the same
observations on the current build and compares key order, Python types and values bit for bit.

Each record: the constructor's keywords, ``state``: ``state_dict()`` after the observations,
``report``: ``refit(report=True)`` right after, ``after``: ``state_dict()`` after that refit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from av_core import AcceptanceEstimator

HERE = Path(__file__).resolve().parent

#: name -> (K, keywords, observe calls)
SCENARIOS: dict[str, tuple[int, dict[str, Any], int]] = {
    # A vllm estimator at the defaults (the default update when recorded): format version 1.
    "vllm_default": (3, {"refit_interval": 5}, 13),
    # vllm with non-default map settings: format version 2 with moments.
    "vllm_bins32": (2, {"refit_interval": 3, "bins": 32, "memory": 0.5}, 8),
    # vLLM's preset (memoryless, unbounded).
    "vllm_preset": (
        4,
        {
            "refit_interval": 2,
            "memory": 0.0,
            "max_step": float("inf"),
            "max_slope": float("inf"),
            "max_intercept": float("inf"),
        },
        5,
    ),
    # av_core's map update: version 2 with histograms, reference and fitted labels.
    "map": (3, {"update": "map", "refit_interval": 4, "bins": 16}, 9),
}


def drive(k: int, options: dict[str, Any], steps: int) -> AcceptanceEstimator:
    # The records were written when vllm was the default update: a scenario without ``update``
    # is a vllm estimator.
    est = AcceptanceEstimator(k, **{"update": "vllm", **options})
    rng = np.random.default_rng(k * 1000 + steps)
    for _ in range(steps):
        rows = int(rng.integers(1, 9))
        x = rng.normal(0.5, 2.5, size=(rows, k)).astype(np.float32)
        admitted = rng.integers(0, k + 1, size=rows)
        accepted = np.minimum(rng.integers(0, k + 1, size=rows), admitted)
        est.observe(x, admitted, accepted, est.predict(x))
    return est


def record(k: int, options: dict[str, Any], steps: int) -> dict[str, Any]:
    est = drive(k, options, steps)
    state = est.state_dict()
    report = est.refit(report=True)
    return {
        "k": k,
        "options": options,
        "steps": steps,
        "state": state,
        "report": report,
        "after": est.state_dict(),
    }


def main() -> None:
    records = {name: record(*scenario) for name, scenario in SCENARIOS.items()}
    (HERE / "state_dicts.json").write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {len(records)} records", file=sys.stderr)


if __name__ == "__main__":
    main()
