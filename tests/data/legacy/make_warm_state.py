"""Writes a warm-restart file of the vLLM drop-in as a build saves it, and the drop-in's
``state_dict`` it holds: the fixture ``tests/persist/test_legacy_states.py`` loads with the
current build. Run it with the build importable (see ``make_legacy_states.py``)::

    PYTHONPATH=/tmp/old/python python tests/data/legacy/make_warm_state.py 889c5ec
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from av_core.vllm import OnlineAcceptanceEstimator
from av_core.vllm.state import StateKey, WarmStart

#: The key the fixture is saved under.
KEY = StateKey("org/target-8b", "org/draft-1b", "eagle3", 4, "dp0-rank0")


def trained(update: str) -> OnlineAcceptanceEstimator:
    """A drop-in after 7 steps of a fixed workload, rounds of 3 steps."""
    est = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"), update=update)
    est.REFIT_INTERVAL = 3
    gen = torch.Generator().manual_seed(0)
    idx = torch.arange(6, dtype=torch.int32)
    conf = torch.zeros(8, 4)
    for step in range(7):
        for k in range(4):
            est.predict(
                torch.randn(6, 50, generator=gen) * 4, idx, torch.tensor(k), conf, torch.ones(8)
            )
        sampled = torch.tensor([(step + r) % 5 + 1 for r in range(6)], dtype=torch.int32)
        est.step(idx, sampled, (sampled <= 4).to(torch.int32))
    return est


def main() -> None:
    build = sys.argv[1]
    out = Path(__file__).resolve().parent
    for update in ("vllm", "map"):
        est = trained(update)
        with tempfile.TemporaryDirectory() as directory:
            WarmStart(directory, KEY).save(est)
            (saved,) = Path(directory).iterdir()
            text = saved.read_text()
        name = f"warm_{update}_{build}"
        (out / f"{name}.file").write_text(text)
        (out / f"{name}.expected.json").write_text(json.dumps(est.state_dict()) + "\n")
        print(out / f"{name}.file", saved.name)


if __name__ == "__main__":
    main()
