"""Writes the vLLM drop-in's warm-restart files as a build that saves the core's bytes writes
them (``<key>.avcore`` and ``<key>.key.json``, builds since the JSON document went), from a
drop-in ``state_dict`` a real drop-in produced (``warm_<update>_889c5ec.expected.json``): the
fixtures ``tests/persist/test_legacy_states.py`` loads with the current build. The build's own
``WarmStart`` writes the files; the drop-in is stood in for by an object that gives that state,
so no torch is needed. Run it with the build importable (see ``make_legacy_states.py``)::

    PYTHONPATH=/tmp/old/python python tests/data/legacy/make_warm_files.py e96aef9
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import av_core

# The module itself, without the package's import of torch.
_SPEC = importlib.util.spec_from_file_location(
    "av_core_vllm_state", Path(av_core.__file__).parent / "vllm" / "state.py"
)
assert _SPEC is not None and _SPEC.loader is not None
_STATE = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = _STATE
_SPEC.loader.exec_module(_STATE)
StateKey, WarmStart = _STATE.StateKey, _STATE.WarmStart

#: The key the fixture is saved under.
KEY = StateKey("org/target-8b", "org/draft-1b", "eagle3", 4, "dp0-rank0")
DATA = Path(__file__).resolve().parent


class SavedDropIn:
    """Gives the drop-in ``state_dict`` it holds, as the drop-in's host snapshot does."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self, flush: bool = True) -> dict[str, Any]:
        return self.state


def main() -> None:
    build = sys.argv[1]
    for update in ("vllm", "map"):
        state = json.loads((DATA / f"warm_{update}_889c5ec.expected.json").read_text())
        with tempfile.TemporaryDirectory() as directory:
            WarmStart(directory, KEY).save(SavedDropIn(state))
            names = sorted(p.name for p in Path(directory).iterdir())
            assert names == [KEY.filename(), KEY.key_filename()], names
            avcore = (Path(directory) / KEY.filename()).read_bytes()
            key = (Path(directory) / KEY.key_filename()).read_bytes()
        name = f"warm_{update}_{build}"
        (DATA / f"{name}.avcore").write_bytes(avcore)
        (DATA / f"{name}.key.json").write_bytes(key)
        print(DATA / f"{name}.avcore", len(avcore), avcore[8:12].hex())


if __name__ == "__main__":
    main()
