"""Writes the version-1 estimator fixture (``estimator_v1.*``): run once, against the build
before issue #23 (format version 1), to pin what that release wrote. Kept for provenance; it
cannot regenerate the fixture after the change (the current build writes version 2).

``estimator_v1.bin``: ``to_bytes()``; ``estimator_v1.json``: ``state_dict()``, and what that build
computed from the state: its predictions on a grid of features (float32 bits), and its
coefficients after a fixed continuation (more observes, then a refit).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from av_core import AcceptanceEstimator

HERE = Path(__file__).resolve().parent
K = 3


def batch(seed: int, rows: int = 12) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(1.0, 2.5, size=(rows, K)).astype(np.float32)
    # Drafts accepted with probability sigmoid(0.9 x + 0.6 - 0.5 k), up to the first rejection.
    p = 1.0 / (1.0 + np.exp(-(0.9 * x + 0.6 - 0.5 * np.arange(K))))
    ok = rng.random((rows, K)) < p
    accepted = np.where(ok.all(axis=1), K, np.argmin(ok, axis=1)).astype(np.int64)
    admitted = np.minimum(accepted + rng.integers(0, 2, size=rows), K).astype(np.int64)
    return x, admitted, accepted, x  # the last entry is replaced by predictions below


def continuation(est: AcceptanceEstimator) -> dict[str, object]:
    for seed in range(100, 107):
        x, admitted, accepted, _ = batch(seed)
        est.observe(x, admitted, accepted, est.predict(x))
    est.refit()
    return {
        "slope": est.slope,
        "intercepts": est.intercepts.tolist(),
        "num_refits": est.num_refits,
    }


GRID = np.linspace(-45.0, 45.0, 61, dtype=np.float32).repeat(K).reshape(-1, K)


def main() -> None:
    est = AcceptanceEstimator(K, refit_interval=5)
    for seed in range(13):
        x, admitted, accepted, _ = batch(seed)
        est.observe(x, admitted, accepted, est.predict(x))
    state = est.state_dict()
    assert state["format_version"] == 1, "run this against the version-1 build"
    data = est.to_bytes()
    (HERE / "estimator_v1.bin").write_bytes(data)
    predictions = est.predict(GRID).view(np.uint32).ravel().tolist()
    after = continuation(AcceptanceEstimator.from_state_dict(state))
    record = {
        "state_dict": state,
        "grid": GRID.ravel().tolist(),
        "predictions_f32_bits": predictions,
        "continuation": after,
    }
    (HERE / "estimator_v1.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {len(data)} bytes; slope {est.slope}, refits {est.num_refits}", file=sys.stderr)


if __name__ == "__main__":
    main()
