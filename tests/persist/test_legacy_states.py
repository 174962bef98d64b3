"""Every state an earlier release wrote still loads bit for bit and continues as that release
continued it.

``tests/data/legacy/<build>.json`` holds what seven builds wrote (the bytes, the ``state_dict``
and the pickles of several estimators: vLLM's update and the map update, several K and bins,
memory on and off, manual refits, mid-round and after refits, and the pickled configuration
where the build pickles it), with what each build did next from there: its predictions, and
after one more step and a refit its coefficients, counters and ``state_dict``
(``make_legacy_states.py``, run against each build's own extension):

- ``c56ee9b``: the first build that saved states (format version 1 before the memory of past
  rounds existed: no ``memory``, ``drift_z`` or ``memory_state``; the current layout of
  version 1 came later without a version bump, so this build's states had stopped loading);
- ``7a95997`` and ``0434a0a``: format 1 with the memory (off, then on by default), before the
  update was an option; pickles through ``from_state_dict``; ``0434a0a``'s vLLM warm-restart
  JSON file (``make_warm_json.py``), whose native estimator refits every 2**40 steps;
- ``7556d47``: the last build before the map update became the default (format 1 for vLLM's
  update at the default map settings, format 2 for every other state);
- ``889c5ec``: the build before the state's declaration moved to serde (configurations
  pickle);
- ``e96aef9``: format 3 as the value tree's binary, which this build's format 3 (postcard)
  replaced under the same version number; its vLLM warm-restart files
  (``make_warm_files.py``) hold the same bytes;
- ``a1dffe7``: the first build of format 3 in postcard (the configuration by position), whose
  statistics this build's format 4 writes again byte for byte after the configuration by name.

The map update's Newton step has been solved by its structure since ``7556d47``: a refit from
that build's state may differ from its record by rounding (``REFITTED_SINCE``); everything
else, and everything of the other builds, is compared bit for bit.
"""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import pickle
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from legacy_data import DATA, generator
from trees import exact, with_later_fields

from av_core import AcceptanceEstimator, EstimatorConfig

GENERATOR = generator("make_legacy_states")
BUILDS = ("c56ee9b", "7a95997", "0434a0a", "7556d47", "889c5ec", "e96aef9", "a1dffe7")
#: The builds before the update rule was an option (vLLM's update only).
FIRST_BUILDS = {
    "c56ee9b": ["first_k1", "first_k4_refits", "first_k8_unbounded"],
    "7a95997": ["first_k1", "first_k3_memory", "first_k4_refits", "first_k8_unbounded"],
    "0434a0a": ["first_k1", "first_k3_memory", "first_k4_refits", "first_k8_unbounded"],
}
RECORDS = {build: json.loads((DATA / f"{build}.json").read_text()) for build in BUILDS}
CASES = [(build, name) for build, record in RECORDS.items() for name in sorted(record["scenarios"])]
#: Builds whose bytes hold the statistics in this build's layout (format 3 in postcard).
POSTCARD_BUILDS = {"a1dffe7"}
#: Builds whose map refits may differ from this build's by rounding (module docs).
REFITTED_SINCE = {"7556d47": 1e-12}


def test_every_build_is_recorded_with_the_scenarios_it_supports() -> None:
    for build, scenarios in FIRST_BUILDS.items():
        assert sorted(RECORDS[build]["scenarios"]) == scenarios
    for build in set(BUILDS) - set(FIRST_BUILDS):
        assert sorted(RECORDS[build]["scenarios"]) == sorted(
            name for name in GENERATOR.SCENARIOS if not name.startswith("first")
        )


def test_each_build_wrote_the_byte_format_it_is_recorded_for() -> None:
    """The estimator's bytes: version 1 (before and after the memory), 2, and the value tree's
    version 3 (``e96aef9``), which this build's version 3 (postcard) replaced without a new
    version number."""
    versions = {
        build: {
            int.from_bytes(base64.b64decode(record["bytes"])[8:12], "little")
            for record in RECORDS[build]["scenarios"].values()
        }
        for build in BUILDS
    }
    assert versions == {
        "c56ee9b": {1},
        "7a95997": {1},
        "0434a0a": {1},
        "7556d47": {1, 2},
        "889c5ec": {1, 2},
        "e96aef9": {3},
        "a1dffe7": {3},
    }
    tree_payload = base64.b64decode(RECORDS["e96aef9"]["scenarios"]["map_k4"]["bytes"])[20:]
    assert tree_payload[0] == 7 and tree_payload[9:23] == b"\x06\0\0\0\0\0\0\0format"
    postcard_payload = base64.b64decode(RECORDS["a1dffe7"]["scenarios"]["map_k4"]["bytes"])[20:]
    assert postcard_payload[0] == 4  # K, postcard's first field


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


def postcard_config_len(payload: bytes) -> int:
    """The length of format 3's configuration at the start of ``payload`` (postcard, by
    position): num_positions, refit_interval (an option), ten floats, the update, bins, four
    floats; integers as varints."""
    at = 0

    def varint() -> None:
        nonlocal at
        while payload[at] & 0x80:
            at += 1
        at += 1

    varint()  # num_positions
    at += 1  # refit_interval's option tag
    if payload[at - 1] == 1:
        varint()
    at += 10 * 8
    varint()  # update
    varint()  # bins
    return at + 4 * 8


@pytest.mark.parametrize(("build", "name"), CASES)
def test_the_bytes_of_an_earlier_build_load_and_continue_bit_for_bit(build: str, name: str) -> None:
    data = base64.b64decode(RECORDS[build]["scenarios"][name]["bytes"])
    est = AcceptanceEstimator.from_bytes(data)
    continues_as_recorded(est, build, name)
    written = AcceptanceEstimator.from_bytes(data).to_bytes()
    assert written[8:12] == (4).to_bytes(4, "little")
    if build in POSTCARD_BUILDS:
        # Format 4 keeps format 3's statistics byte for byte behind the configuration.
        statistics = data[20 + postcard_config_len(data[20:]) : -4]
        assert len(statistics) > 100 and written[:-4].endswith(statistics)
    # This build writes the state in its own format, which reads back to the same state.
    again = AcceptanceEstimator.from_bytes(AcceptanceEstimator.from_bytes(data).to_bytes())
    exact(again.state_dict(), AcceptanceEstimator.from_bytes(data).state_dict())


@pytest.mark.parametrize(("build", "name"), CASES)
def test_an_earlier_build_saved_to_a_file_loads_and_continues_bit_for_bit(
    tmp_path: Path, build: str, name: str
) -> None:
    """``save`` (and the C ABI's ``avc_estimator_save``) wrote the same bytes as ``to_bytes``."""
    path = tmp_path / "estimator.avcore"
    path.write_bytes(base64.b64decode(RECORDS[build]["scenarios"][name]["bytes"]))
    continues_as_recorded(AcceptanceEstimator.load(path), build, name)


@pytest.mark.parametrize(("build", "name"), CASES)
def test_the_state_dict_of_an_earlier_build_loads_and_continues_bit_for_bit(
    build: str, name: str
) -> None:
    saved = copy.deepcopy(RECORDS[build]["scenarios"][name]["state_dict"])
    continues_as_recorded(AcceptanceEstimator.from_state_dict(saved), build, name)


PICKLED = [(b, n) for b, n in CASES if RECORDS[b]["scenarios"][n].get("pickles")]


def test_the_recorded_builds_pickled_their_estimators() -> None:
    assert {b for b, _ in PICKLED} == set(BUILDS)


@pytest.mark.parametrize(("build", "name"), PICKLED)
def test_a_pickle_of_an_earlier_build_loads_and_continues_bit_for_bit(
    build: str, name: str
) -> None:
    record = RECORDS[build]["scenarios"][name]
    for protocol, data in record["pickles"].items():
        est = pickle.loads(base64.b64decode(data))
        assert isinstance(est, AcceptanceEstimator), protocol
        continues_as_recorded(est, build, name)


CONFIGS = [(b, n) for b, n in CASES if RECORDS[b]["scenarios"][n].get("config_pickles")]


def test_the_builds_since_configurations_pickle_are_recorded_with_them() -> None:
    assert {b for b, _ in CONFIGS} == {"889c5ec", "e96aef9", "a1dffe7"}


@pytest.mark.parametrize(("build", "name"), CONFIGS)
def test_a_pickled_configuration_of_an_earlier_build_loads(build: str, name: str) -> None:
    """The configuration's pickle reads as the configuration of the state saved with it (which
    the tests above hold to what the build wrote)."""
    record = RECORDS[build]["scenarios"][name]
    saved = AcceptanceEstimator.from_state_dict(copy.deepcopy(record["state_dict"])).config
    for protocol, data in record["config_pickles"].items():
        config = pickle.loads(base64.b64decode(data))
        assert isinstance(config, EstimatorConfig), protocol
        assert config == saved, f"{build} {name} config pickle {protocol}"
        exact(config.to_dict(), saved.to_dict(), f"{build} {name} config pickle {protocol}")


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


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_the_core_bytes_of_an_earlier_warm_restart_load(update: str) -> None:
    """The ``.avcore`` file ``e96aef9``'s warm restart wrote (the value tree's format 3, with
    the drop-in's counters in the state's; ``make_warm_files.py``, from a real drop-in's
    ``state_dict``) loads as that state."""
    data = (DATA / f"warm_{update}_e96aef9.avcore").read_bytes()
    assert data[:12] == b"AVCORE\0E" + (3).to_bytes(4, "little")
    dropin = json.loads((DATA / f"warm_{update}_889c5ec.expected.json").read_text())
    state = dict(dropin["estimator"])
    state["steps_since_refit"], state["num_refits"] = dropin["steps_since_refit"], dropin["refits"]
    exact(AcceptanceEstimator.from_bytes(data).state_dict(), with_later_fields(state))


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_a_warm_restart_of_the_core_bytes_era_loads(tmp_path: Path, update: str) -> None:
    """``e96aef9``'s two warm-restart files (the state's bytes and its key) restore the drop-in
    whose state they hold."""
    torch = pytest.importorskip("torch")
    from av_core.vllm import OnlineAcceptanceEstimator
    from av_core.vllm.state import StateKey, WarmStart

    key = StateKey("org/target-8b", "org/draft-1b", "eagle3", 4, "dp0-rank0")
    (tmp_path / key.filename()).write_bytes((DATA / f"warm_{update}_e96aef9.avcore").read_bytes())
    (tmp_path / key.key_filename()).write_bytes(
        (DATA / f"warm_{update}_e96aef9.key.json").read_bytes()
    )
    expected = json.loads((DATA / f"warm_{update}_889c5ec.expected.json").read_text())
    expected["estimator"] = with_later_fields(expected["estimator"])
    est = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"), update=update)
    assert WarmStart(tmp_path, key).load(est) is True
    exact(est.state_dict(), expected)


def _warm_state_module() -> Any:
    """``av_core/vllm/state.py`` itself, without the package's import of torch (the warm
    restart's file handling needs none)."""
    import av_core

    path = Path(av_core.__file__).parent / "vllm" / "state.py"
    spec = importlib.util.spec_from_file_location("legacy_av_core_vllm_state", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class RunningDropIn:
    """The vLLM drop-in as a warm restart sees it: its configuration (a real drop-in's, from
    ``warm_vllm_889c5ec.expected.json``, which the test above holds the drop-in to) and what it
    is given to load."""

    def __init__(self) -> None:
        dropin = json.loads((DATA / "warm_vllm_889c5ec.expected.json").read_text())
        self.config = dropin["estimator"]["config"]
        self.loaded: list[dict[str, Any]] = []

    def state_dict(self, flush: bool = True) -> dict[str, Any]:
        return {"estimator": {"config": self.config}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded.append(state)

    @property
    def num_refits(self) -> int:
        return int(self.loaded[-1]["refits"])


def test_a_warm_restart_file_saved_before_the_manual_refits_loads(tmp_path: Path) -> None:
    """``0434a0a``'s JSON file (``make_warm_json.py``): its native estimator was configured
    with ``refit_interval`` 2**40 (never), which the drop-in loads as its manual schedule, the
    same estimator; the warm restart must not cold-start it as another configuration."""
    warm = _warm_state_module()
    key = warm.StateKey("org/target-8b", "org/draft-1b", "eagle3", 4, "dp0-rank0")
    (tmp_path / key.legacy_filename()).write_text((DATA / "warm_vllm_0434a0a.file").read_text())
    expected = json.loads((DATA / "warm_vllm_0434a0a.expected.json").read_text())
    assert expected["estimator"]["config"]["refit_interval"] == 1 << 40
    dropin = RunningDropIn()
    assert warm.WarmStart(tmp_path, key).load(dropin) is True
    assert dropin.loaded == [expected]
