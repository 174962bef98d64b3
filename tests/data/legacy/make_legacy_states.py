"""Writes the states an av_core build saves, and what that build does next with them, to
``tests/data/legacy/<build>.json``: the fixtures of ``tests/persist/test_legacy_states.py``.

Run it with an earlier build of av_core importable (a worktree of that commit, its extension
built into its ``python/av_core/``), e.g.::

    git worktree add --detach /tmp/old c56ee9b
    cd /tmp/old && cargo build -p av_core_py
    cp target/debug/lib_native.so python/av_core/_native.abi3.so
    PYTHONPATH=/tmp/old/python python tests/data/legacy/make_legacy_states.py c56ee9b

Each scenario drives one estimator through a fixed workload and records its bytes
(``to_bytes``), its ``state_dict``, its pickles and its configuration's (where the build
pickles them), its predictions on a probe, and, after one more step and a
refit, its coefficients, counters and ``state_dict``: what a later build must reproduce from
the saved state. Only the options the build knows are used (the first builds had no memory,
no update and no manual refits).
"""

from __future__ import annotations

import base64
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

from av_core import AcceptanceEstimator

#: name: (K, options, steps, refit_interval). An option the build does not take skips the
#: scenario.
SCENARIOS: dict[str, tuple[int, dict[str, Any], int]] = {
    "first_k1": (1, {"refit_interval": 100}, 5),
    "first_k4_refits": (4, {"refit_interval": 3}, 7),
    "first_k8_unbounded": (
        8,
        {"refit_interval": 4, "max_step": np.inf, "max_slope": np.inf, "max_intercept": np.inf},
        9,
    ),
    "first_k3_memory": (3, {"refit_interval": 2, "memory": 0.6, "max_step": np.inf}, 8),
    "vllm_memory": (4, {"update": "vllm", "refit_interval": 3, "memory": 0.8}, 8),
    "vllm_memoryless": (3, {"update": "vllm", "refit_interval": 2, "memory": 0.0}, 5),
    "vllm_bins16": (4, {"update": "vllm", "refit_interval": 3, "bins": 16}, 7),
    "vllm_manual": (2, {"update": "vllm", "refit_interval": None}, 6),
    "map_k4": (4, {"update": "map", "refit_interval": 4}, 7),
    "map_k2_bins16": (2, {"update": "map", "refit_interval": 5, "bins": 16}, 12),
    "map_k3_memoryless_manual": (
        3,
        {"update": "map", "refit_interval": None, "memory": 0.0, "bins": 32},
        5,
    ),
}

#: The features every prediction is recorded on.
PROBE = np.linspace(-6.0, 9.0, 16, dtype=np.float32)


def step_batch(rng: np.random.Generator, k: int, rows: int = 12) -> tuple[Any, Any, Any, Any]:
    """One decode step: features, admitted and accepted counts, draft-time predictions."""
    x = rng.normal(1.0, 2.5, size=(rows, k)).astype(np.float32)
    admitted = rng.integers(0, k + 1, size=rows)
    accepted = np.array([rng.integers(0, a + 1) for a in admitted])
    p = (1.0 / (1.0 + np.exp(-(0.6 * x + 0.3)))).astype(np.float32)
    return x, admitted, accepted, p


def supported(options: dict[str, Any]) -> bool:
    """Whether this build takes ``options`` (an unknown keyword or a None it cannot read is a
    TypeError)."""
    try:
        AcceptanceEstimator(1, **options)
    except TypeError:
        return False
    return True


def manual(options: dict[str, Any]) -> bool:
    return "refit_interval" in options and options["refit_interval"] is None


def drive(k: int, options: dict[str, Any], steps: int) -> AcceptanceEstimator:
    rng = np.random.default_rng(1000 + k * 7 + steps)
    est = AcceptanceEstimator(k, **options)
    for step in range(steps):
        x, admitted, accepted, p = step_batch(rng, k)
        est.observe(x, admitted, accepted, p if step % 2 else None)
        if manual(options) and step % 3 == 2:
            est.refit()
    return est


def bits(values: Any) -> list[int]:
    return [int(v) for v in np.asarray(values, dtype=np.float32).view(np.uint32).ravel()]


def continuation(est: AcceptanceEstimator, k: int) -> dict[str, Any]:
    """What ``est`` does next: one more step (with predictions) and a refit."""
    rng = np.random.default_rng(77)
    x, admitted, accepted, p = step_batch(rng, k)
    est.observe(x, admitted, accepted, p)
    est.refit()
    return {
        "slope": est.slope,
        "intercepts": [float(b) for b in est.intercepts],
        "num_refits": est.num_refits,
        "steps_since_refit": est.steps_since_refit,
        "state_dict": est.state_dict(),
        "probe": bits(est.predict(np.resize(PROBE, (4, k)))),
    }


def pickles(obj: Any) -> dict[str, str]:
    """``obj``'s pickles at protocols 2 and 5, or none where the build cannot pickle it."""
    out = {}
    for protocol in (2, 5):
        try:
            out[str(protocol)] = base64.b64encode(pickle.dumps(obj, protocol=protocol)).decode()
        except (TypeError, pickle.PicklingError):
            return {}
    return out


def record(k: int, options: dict[str, Any], steps: int) -> dict[str, Any]:
    est = drive(k, options, steps)
    saved = est.to_bytes()
    config = getattr(est, "config", None)
    return {
        "k": k,
        "options": {name: value for name, value in options.items()},
        "steps": steps,
        "bytes": base64.b64encode(saved).decode(),
        "state_dict": est.state_dict(),
        "pickles": pickles(est),
        "config_pickles": {} if config is None else pickles(config),
        "probe": bits(est.predict(np.resize(PROBE, (4, k)))),
        "next": continuation(est, k),
    }


def main() -> None:
    build = sys.argv[1]
    out: dict[str, Any] = {"build": build, "scenarios": {}}
    for name, (k, options, steps) in SCENARIOS.items():
        # The first builds had vLLM's update only, without memory; later builds are covered
        # by the other scenarios.
        if name.startswith("first") == supported({"update": "vllm"}):
            continue
        if not supported(options):
            continue
        out["scenarios"][name] = record(k, options, steps)
    path = Path(__file__).resolve().parent / f"{build}.json"
    path.write_text(json.dumps(out, indent=None, separators=(",", ":")) + "\n")
    print(f"{path}: {sorted(out['scenarios'])}")


if __name__ == "__main__":
    main()
