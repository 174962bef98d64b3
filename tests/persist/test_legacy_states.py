"""Every state an earlier release wrote still loads bit for bit and continues as that release
continued it.

``tests/data/legacy/<build>.json`` holds what three builds wrote (the bytes and the
``state_dict`` of several estimators: vLLM's update and the map update, several K and bins,
memory on and off, manual refits, mid-round and after refits), with what each build did next
from there: its predictions, and after one more step and a refit its coefficients, counters and
``state_dict`` (``make_legacy_states.py``, run against each build's own extension):

- ``c56ee9b``: the first build that saved states (format version 1 before the memory of past
  rounds existed: no ``memory``, ``drift_z`` or ``memory_state``; the current layout of
  version 1 came later without a version bump, so this build's states had stopped loading);
- ``7556d47``: the last build before the map update became the default (format 1 for vLLM's
  update at the default map settings, format 2 for every other state);
- ``889c5ec``: the build before the state's declaration moved to serde.

The map update's Newton step has been solved by its structure since ``7556d47``: a refit from
that build's state may differ from its record by rounding (``REFITTED_SINCE``); everything
else, and everything of the other builds, is compared bit for bit.
"""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trees import exact, with_later_fields

from av_core import AcceptanceEstimator

DATA = Path(__file__).resolve().parents[1] / "data" / "legacy"


def _load_generator() -> Any:
    spec = importlib.util.spec_from_file_location(
        "make_legacy_states", DATA / "make_legacy_states.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = _load_generator()
BUILDS = ("c56ee9b", "7556d47", "889c5ec")
RECORDS = {build: json.loads((DATA / f"{build}.json").read_text()) for build in BUILDS}
CASES = [(build, name) for build, record in RECORDS.items() for name in sorted(record["scenarios"])]
#: Builds whose map refits may differ from this build's by rounding (module docs).
REFITTED_SINCE = {"7556d47": 1e-12}


def test_every_build_is_recorded_with_the_scenarios_it_supports() -> None:
    assert sorted(RECORDS["c56ee9b"]["scenarios"]) == [
        "first_k1",
        "first_k4_refits",
        "first_k8_unbounded",
    ]
    for build in ("7556d47", "889c5ec"):
        assert sorted(RECORDS[build]["scenarios"]) == sorted(
            name for name in GENERATOR.SCENARIOS if not name.startswith("first")
        )


def completed(saved: dict[str, Any]) -> dict[str, Any]:
    """A state_dict an earlier build wrote as this build writes the same state: with the
    configuration fields added since at their defaults, and for the first builds memoryless,
    with the fields the memory of past rounds brought (before it existed, every estimator was
    this)."""
    if "memory_state" in saved:
        return with_later_fields(saved)
    out = copy.deepcopy(saved)
    config = out["config"]
    config["memory"] = 0.0
    config["drift_z"] = 3.09
    k = config["num_positions"]
    out["memory_state"] = {
        "a": 0.0,
        "b": [0.0] * k,
        "c": [0.0] * k,
        "rhs": [0.0] * (k + 1),
        "total": 0.0,
        "counts": [0.0] * k,
        "resets": 0,
    }
    return out


def continues_as_recorded(est: AcceptanceEstimator, build: str, name: str) -> None:
    record = RECORDS[build]["scenarios"][name]
    k = record["k"]
    exact(est.state_dict(), completed(record["state_dict"]), f"{build} {name}")
    probe = np.resize(GENERATOR.PROBE, (4, k))
    assert GENERATOR.bits(est.predict(probe)) == record["probe"], f"{build} {name} predict"
    fitted = REFITTED_SINCE.get(build, 0.0) if record["options"].get("update") == "map" else 0.0
    after = GENERATOR.continuation(est, k)
    expected = record["next"]
    exact(after["state_dict"], completed(expected["state_dict"]), f"{build} {name} next", fitted)
    exact(after["slope"], expected["slope"], f"{build} {name} slope", fitted)
    exact(after["intercepts"], expected["intercepts"], f"{build} {name} intercepts", fitted)
    assert (after["num_refits"], after["steps_since_refit"]) == (
        expected["num_refits"],
        expected["steps_since_refit"],
    )
    if not fitted:
        assert after["probe"] == expected["probe"], f"{build} {name} predict after"


@pytest.mark.parametrize(("build", "name"), CASES)
def test_the_bytes_of_an_earlier_build_load_and_continue_bit_for_bit(build: str, name: str) -> None:
    data = base64.b64decode(RECORDS[build]["scenarios"][name]["bytes"])
    est = AcceptanceEstimator.from_bytes(data)
    continues_as_recorded(est, build, name)
    # This build writes the state in its own format, which reads back to the same state.
    again = AcceptanceEstimator.from_bytes(AcceptanceEstimator.from_bytes(data).to_bytes())
    exact(again.state_dict(), AcceptanceEstimator.from_bytes(data).state_dict())


@pytest.mark.parametrize(("build", "name"), CASES)
def test_the_state_dict_of_an_earlier_build_loads_and_continues_bit_for_bit(
    build: str, name: str
) -> None:
    saved = copy.deepcopy(RECORDS[build]["scenarios"][name]["state_dict"])
    continues_as_recorded(AcceptanceEstimator.from_state_dict(saved), build, name)


@pytest.mark.parametrize(("build", "name"), CASES)
def test_trailing_bytes_after_an_earlier_payload_are_refused(build: str, name: str) -> None:
    data = base64.b64decode(RECORDS[build]["scenarios"][name]["bytes"])
    payload = data[20:-4] + b"\0" * 8
    header = data[:12] + len(payload).to_bytes(8, "little")
    crc = zlib.crc32(header + payload).to_bytes(4, "little")
    with pytest.raises(ValueError, match="unexpected bytes"):
        AcceptanceEstimator.from_bytes(header + payload + crc)


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_a_warm_restart_file_of_the_previous_release_loads(tmp_path: Path, update: str) -> None:
    """The vLLM drop-in's warm-restart file as ``889c5ec`` wrote it (one JSON document: key,
    state and checksum) restores the drop-in it was saved from, whose next save is the core's
    bytes (``make_warm_state.py`` wrote the fixture)."""
    torch = pytest.importorskip("torch")
    from av_core.vllm import OnlineAcceptanceEstimator
    from av_core.vllm.state import StateKey, WarmStart

    key = StateKey("org/target-8b", "org/draft-1b", "eagle3", 4, "dp0-rank0")
    legacy = tmp_path / key.legacy_filename()
    legacy.write_text((DATA / f"warm_{update}_889c5ec.file").read_text())
    expected = json.loads((DATA / f"warm_{update}_889c5ec.expected.json").read_text())
    expected["estimator"] = with_later_fields(expected["estimator"])
    est = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"), update=update)
    warm = WarmStart(tmp_path, key)
    assert warm.load(est) is True
    exact(est.state_dict(), expected)
    warm.save(est)
    fresh = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"), update=update)
    legacy.unlink()
    assert WarmStart(tmp_path, key).load(fresh) is True  # from the core's bytes now
    exact(fresh.state_dict(), expected)
