"""Every cost table and verification planner an earlier build saved still loads bit for bit and
continues as that build continued it.

``tests/data/legacy/planner_<build>.json.gz`` holds what each build wrote
(``make_planner_states.py``, run against each build's own extension): cost tables as JSON text,
bytes and pickles, planners as bytes and pickles after a fixed workload, with what the build did
next from each state (the tables' values, a plan and a depth decision from the tables; each
planner's remembered rows, its next plans and depth decisions, and its remembered rows and
bytes after them). The C ABI's ``avc_planner_save`` and ``avc_cost_tables_save`` write these
same bytes (``to_bytes``) in every build that has them:

- ``7a95997``: the last build before depth tables: planner bytes of version 1 without a depth
  table (the frame's version was the estimator's), cost tables as JSON and pickles of it;
  planners did not pickle;
- ``9f3a823``: the last build before explorers' drafting was priced by depth (9948241): its
  planners with a depth table load as they were, but decide differently since, so only the
  others are held to its continuation;
- ``0434a0a``: the last build before the one persistence module: planner bytes of version 1
  with the depth table after the remembered rows (no flag says so), JSON with
  ``draft_depth_ms``;
- ``7556d47``: planner version 2, cost tables' bytes version 1, planners and tables pickled as
  their bytes;
- ``889c5ec`` and ``e96aef9``: the same formats, written by later code (the builds before and
  after the state's declaration moved to serde); their records equal ``7556d47``'s.

A state whose format version this build still writes must re-encode to the same bytes; an older
one must continue exactly as its build continued it, and this build's bytes of the state after
those steps must equal its re-encoding of the bytes the old build wrote after them.
"""

from __future__ import annotations

import base64
import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from legacy_data import DATA, generator

from av_core import CostTables, VerificationPlanner, choose_draft_depth, plan_verification

GEN = generator("make_planner_states")
#: Each build and the kinds of state it wrote (module docs).
BUILDS = {
    "7a95997": {"planner_version": 1, "depth": False, "table_bytes": False, "pickled": False},
    "9f3a823": {"planner_version": 1, "depth": True, "table_bytes": False, "pickled": False},
    "0434a0a": {"planner_version": 1, "depth": True, "table_bytes": False, "pickled": False},
    "7556d47": {"planner_version": 2, "depth": True, "table_bytes": True, "pickled": True},
    "889c5ec": {"planner_version": 2, "depth": True, "table_bytes": True, "pickled": True},
    "e96aef9": {"planner_version": 2, "depth": True, "table_bytes": True, "pickled": True},
}
RECORDS = {
    build: json.loads(gzip.decompress((DATA / f"planner_{build}.json.gz").read_bytes()))
    for build in BUILDS
}
TABLE_CASES = [(b, name) for b, r in RECORDS.items() for name in sorted(r["tables"])]
PLANNER_CASES = [(b, name) for b, r in RECORDS.items() for name in sorted(r["planners"])]
#: The cases whose build could write cost-table bytes, and those whose build pickled planners.
TABLE_BYTES_CASES = [(b, n) for b, n in TABLE_CASES if RECORDS[b]["tables"][n]["bytes"] is not None]
PICKLED_PLANNER_CASES = [(b, n) for b, n in PLANNER_CASES if RECORDS[b]["planners"][n]["pickles"]]
#: The planner's bytes version this build writes.
PLANNER_VERSION = 2
#: Builds whose planners with a depth table were priced by rules changed since (module docs).
REPRICED = {"9f3a823"}


def version_of(data: bytes) -> int:
    return int.from_bytes(data[8:12], "little")


def test_every_build_is_recorded_with_what_it_could_write() -> None:
    for build, facts in BUILDS.items():
        record = RECORDS[build]
        assert record["build"] == build
        depth_tables = {n for n, spec in GEN.TABLES.items() if spec[2] is not None}
        expected_tables = set(GEN.TABLES) - (set() if facts["depth"] else depth_tables)
        assert set(record["tables"]) == expected_tables, build
        depth_planners = {n for n, spec in GEN.PLANNERS.items() if spec[0] in depth_tables}
        expected_planners = set(GEN.PLANNERS) - (set() if facts["depth"] else depth_planners)
        assert set(record["planners"]) == expected_planners, build
        for name, planner in record["planners"].items():
            data = base64.b64decode(planner["bytes"])
            assert data[:8] == b"AVCORE\0P"
            assert version_of(data) == facts["planner_version"], (build, name)
            assert bool(planner["pickles"]) == facts["pickled"], (build, name)
        for name, tables in record["tables"].items():
            assert (tables["bytes"] is not None) == facts["table_bytes"], (build, name)
            assert bool(tables["pickles"]) is True, (build, name)


# -- cost tables ----------------------------------------------------------------------------


def tables_continue_as_recorded(tables: CostTables, record: dict[str, Any], what: str) -> None:
    assert GEN.tables_values(tables) == record["values"], what
    name = what.split()[1]
    k = 4 if GEN.TABLES[name][2] is None else len(GEN.TABLES[name][2]) - 1
    s = GEN.workload(5, k, 4, 1)[0]
    plan = plan_verification(
        s["confidences"],
        s["scheduled"],
        num_non_draft_tokens=s["non_draft"],
        num_sampling_requests=s["sampling"],
        cost_tables=tables,
    )
    assert GEN.plan_record(plan) == record["plan"], what
    if "depth" in record:
        depth = choose_draft_depth(
            s["confidences"],
            s["max_depths"],
            num_non_draft_tokens=s["non_draft"],
            num_sampling_requests=s["sampling"],
            cost_tables=tables,
        )
        assert GEN.depth_record(depth) == record["depth"], what


@pytest.mark.parametrize(("build", "name"), TABLE_CASES)
def test_the_json_text_of_earlier_cost_tables_loads_and_is_written_again(
    build: str, name: str
) -> None:
    record = RECORDS[build]["tables"][name]
    tables = CostTables.from_json(record["json"])
    tables_continue_as_recorded(tables, record, f"{build} {name} json")
    assert tables.to_json() == record["json"]


@pytest.mark.parametrize(("build", "name"), TABLE_BYTES_CASES)
def test_the_bytes_of_earlier_cost_tables_load_and_are_written_again(build: str, name: str) -> None:
    record = RECORDS[build]["tables"][name]
    data = base64.b64decode(record["bytes"])
    tables = CostTables.from_bytes(data)
    tables_continue_as_recorded(tables, record, f"{build} {name} bytes")
    assert tables.to_bytes() == data


@pytest.mark.parametrize(("build", "name"), TABLE_CASES)
def test_pickles_of_earlier_cost_tables_load(build: str, name: str) -> None:
    record = RECORDS[build]["tables"][name]
    for protocol, data in record["pickles"].items():
        tables = pickle.loads(base64.b64decode(data))
        assert isinstance(tables, CostTables)
        tables_continue_as_recorded(tables, record, f"{build} {name} pickle {protocol}")


# -- planners -------------------------------------------------------------------------------


def planner_continues_as_recorded(
    planner: VerificationPlanner, build: str, name: str, how: str
) -> None:
    """``planner``, loaded from what ``build`` saved, holds what it held and takes the steps
    ``build`` took next. Builds before depth tables remembered whole rows where fewer positions
    were drafted (since, only drafted positions are news): for them only the continuation in
    which every request drafts all K positions, where both rules store the same rows, is theirs
    to reproduce."""
    record = RECORDS[build]["planners"][name]
    what = f"{build} {name} {how}"
    assert (planner.num_slots, planner.num_positions, planner.budget_source) == (
        record["num_slots"],
        record["num_positions"],
        record["budget_source"],
    ), what
    assert float(planner.exploration).hex() == record["exploration"], what
    assert GEN.tables_values(planner.cost_tables) == record["tables"], what
    assert GEN.remembered(planner) == record["remembered"], what
    data = base64.b64decode(record["bytes"])
    if version_of(data) == PLANNER_VERSION:
        assert planner.to_bytes() == data, what
    if build in REPRICED and GEN.TABLES[GEN.PLANNERS[name][0]][2] is not None:
        return
    full_rows_only = not BUILDS[build]["depth"]
    twin = planner.copy()
    for key, full, p in (("next", False, planner), ("next_full", True, twin)):
        if full_rows_only and not full:
            continue
        expected = record[key]
        mode = GEN.PLANNERS[name][7]
        for i, s in enumerate(GEN.next_workload(name, full)):
            assert GEN.step(p, s, mode) == expected["steps"][i], f"{what} {key} step {i}"
        assert GEN.remembered(p) == expected["remembered"], f"{what} {key}"
        after = base64.b64decode(expected["bytes"])
        assert p.to_bytes() == VerificationPlanner.from_bytes(after).to_bytes(), f"{what} {key}"
        if version_of(after) == PLANNER_VERSION:
            assert p.to_bytes() == after, f"{what} {key}"


def test_the_repriced_builds_decided_otherwise_with_a_depth_table() -> None:
    """Why ``9f3a823``'s depth-table planners are held to their state only: from the same
    state, this build's next steps differ from that build's."""
    record = RECORDS["9f3a823"]["planners"]["depth_table_no_decisions"]
    planner = VerificationPlanner.from_bytes(base64.b64decode(record["bytes"]))
    steps = [
        GEN.step(planner, s, None) for s in GEN.next_workload("depth_table_no_decisions", False)
    ]
    assert steps != record["next"]["steps"]
    assert [s["plan"]["budget"] for s in steps] == [
        s["plan"]["budget"] for s in record["next"]["steps"]
    ]


def test_the_first_builds_remembered_whole_rows() -> None:
    """Why ``7a95997``'s continuation is compared with every request drafting all K: with the
    workload's partial rows its remembered rows after the steps differ from this build's."""
    record = RECORDS["7a95997"]["planners"]["previous_explore"]
    planner = VerificationPlanner.from_bytes(base64.b64decode(record["bytes"]))
    for s in GEN.next_workload("previous_explore", False):
        GEN.step(planner, s, None)
    assert GEN.remembered(planner) != record["next"]["remembered"]


@pytest.mark.parametrize(("build", "name"), PLANNER_CASES)
def test_the_bytes_of_an_earlier_planner_load_and_continue_bit_for_bit(
    build: str, name: str
) -> None:
    data = base64.b64decode(RECORDS[build]["planners"][name]["bytes"])
    planner = VerificationPlanner.from_bytes(data)
    planner_continues_as_recorded(planner, build, name, "bytes")


@pytest.mark.parametrize(("build", "name"), PLANNER_CASES)
def test_an_earlier_planner_saved_to_a_file_loads(tmp_path: Path, build: str, name: str) -> None:
    path = tmp_path / "planner.avcore"
    path.write_bytes(base64.b64decode(RECORDS[build]["planners"][name]["bytes"]))
    planner_continues_as_recorded(VerificationPlanner.load(path), build, name, "file")


@pytest.mark.parametrize(("build", "name"), PICKLED_PLANNER_CASES)
def test_pickles_of_an_earlier_planner_load_and_continue_bit_for_bit(build: str, name: str) -> None:
    pickles = RECORDS[build]["planners"][name]["pickles"]
    for protocol, data in pickles.items():
        planner = pickle.loads(base64.b64decode(data))
        assert isinstance(planner, VerificationPlanner)
        planner_continues_as_recorded(planner, build, name, f"pickle {protocol}")


@pytest.mark.parametrize(("build", "name"), PLANNER_CASES)
def test_a_version_1_planner_is_written_as_version_2_that_reads_back(build: str, name: str) -> None:
    data = base64.b64decode(RECORDS[build]["planners"][name]["bytes"])
    planner = VerificationPlanner.from_bytes(data)
    again = planner.to_bytes()
    assert version_of(again) == PLANNER_VERSION
    assert VerificationPlanner.from_bytes(again).to_bytes() == again
    planner_continues_as_recorded(VerificationPlanner.from_bytes(again), build, name, "again")
