"""Writes the vLLM drop-in's warm-restart JSON file as a build before the drop-in's manual
refits (``cdc06e2``) saves it, and the drop-in ``state_dict`` it holds: the fixture of
``tests/persist/test_legacy_states.py``. Run it with the build importable (see
``make_legacy_states.py``)::

    PYTHONPATH=/tmp/old/python python tests/data/legacy/make_warm_json.py 0434a0a

The build's own ``WarmStart`` writes the file. The drop-in (which needs torch) is stood in for
by its ``state_dict``: its native estimator configured as the build's drop-in configures it
(vLLM's constants of the build's ``av_core/vllm/constants.py``, ``refit_interval`` 2**40, no
memory, av_core's default bounds), driven through a fixed workload with a refit every 3 steps,
and the drop-in's counters.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import av_core
from av_core import AcceptanceEstimator

DATA = Path(__file__).resolve().parent


def module(name: str) -> Any:
    """``av_core/vllm/<name>.py`` of the build, without the package's import of torch."""
    spec = importlib.util.spec_from_file_location(
        f"av_core_vllm_{name}", Path(av_core.__file__).parent / "vllm" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


STATE = module("state")
CONSTANTS = module("constants")
#: The key the fixture is saved under.
KEY = STATE.StateKey("org/target-8b", "org/draft-1b", "eagle3", 4, "dp0-rank0")
#: The drop-in's schedule of the fixture: a refit every 3 steps, 7 steps.
REFIT_INTERVAL, STEPS = 3, 7


class SavedDropIn:
    """Gives the drop-in ``state_dict`` it holds, as the drop-in's host snapshot does."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self, flush: bool = True) -> dict[str, Any]:
        return self.state


def dropin_state() -> dict[str, Any]:
    k = 4
    native = AcceptanceEstimator(
        k,
        refit_interval=1 << 40,
        damping=float(CONSTANTS.DAMPING_OBSERVATIONS),
        l2=float(CONSTANTS.L2),
        init_slope=CONSTANTS.INIT_SLOPE,
        init_intercept=CONSTANTS.INIT_INTERCEPT,
        max_log_odds=CONSTANTS.MAX_LOG_ODDS,
        memory=0.0,
    )
    rng = np.random.default_rng(5)
    steps = 0
    for _ in range(STEPS):
        x = rng.normal(0.5, 2.0, size=(6, k)).astype(np.float32)
        admitted = rng.integers(0, k + 1, size=6)
        accepted = np.array([rng.integers(0, a + 1) for a in admitted])
        native.observe(x, admitted, accepted)
        steps += 1
        if steps == REFIT_INTERVAL:
            native.refit()
            steps = 0
    return {
        "format": "av_core.vllm.OnlineAcceptanceEstimator",
        "estimator": native.state_dict(),
        "steps_since_refit": steps,
        "refits": STEPS // REFIT_INTERVAL,
    }


def main() -> None:
    build = sys.argv[1]
    state = dropin_state()
    with tempfile.TemporaryDirectory() as directory:
        STATE.WarmStart(directory, KEY).save(SavedDropIn(state))
        (saved,) = Path(directory).iterdir()
        text = saved.read_text()
    name = f"warm_vllm_{build}"
    (DATA / f"{name}.file").write_text(text)
    (DATA / f"{name}.expected.json").write_text(json.dumps(state) + "\n")
    print(DATA / f"{name}.file", saved.name, state["estimator"]["config"]["refit_interval"])


if __name__ == "__main__":
    main()
