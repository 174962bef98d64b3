"""Saving and loading estimator state: versioned, checksummed, atomic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from av_core import AcceptanceEstimator, CostTables, VerificationPlanner


def fitted_estimator() -> AcceptanceEstimator:
    rng = np.random.default_rng(0)
    est = AcceptanceEstimator(4, refit_interval=5, update="vllm")  # a refit per round only
    for _ in range(12):
        x = rng.normal(size=(16, 4)).astype(np.float32)
        admitted = rng.integers(0, 5, size=16)
        accepted = np.array([rng.integers(0, a + 1) for a in admitted])
        est.observe(x, admitted, accepted)
    assert est.num_refits == 2 and est.steps_since_refit == 2
    return est


def test_bytes_round_trip_is_bit_exact() -> None:
    est = fitted_estimator()
    back = AcceptanceEstimator.from_bytes(est.to_bytes())
    assert back.state_dict() == est.state_dict()
    assert back.to_bytes() == est.to_bytes()


def test_save_and_load_warm_start(tmp_path: Path) -> None:
    est = fitted_estimator()
    path = tmp_path / "estimator.avc"
    est.save(path)
    loaded = AcceptanceEstimator.load(str(path))
    assert loaded.state_dict() == est.state_dict()
    assert loaded.slope != 0.5  # fitted values, not the cold start
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


@pytest.mark.parametrize(
    ("mangle", "text"),
    [
        (lambda b: b[:-1], "length mismatch"),
        (lambda b: b[: len(b) // 2], "length mismatch"),
        (lambda b: b[:5], "magic"),
        (lambda b: b"XXXXXXXX" + b[8:], "magic"),
        (lambda b: b[:40] + bytes([b[40] ^ 0x10]) + b[41:], "checksum"),
        (lambda b: b[:8] + (7).to_bytes(4, "little") + b[12:], "format version 7"),
        (lambda b: b + b"\0", "length mismatch"),
    ],
)
def test_corrupt_truncated_or_future_files_are_refused(tmp_path: Path, mangle, text: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "estimator.avc"
    path.write_bytes(mangle(fitted_estimator().to_bytes()))
    with pytest.raises(ValueError, match=text) as info:
        AcceptanceEstimator.load(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match=text):
        AcceptanceEstimator.from_bytes(mangle(fitted_estimator().to_bytes()))


def test_a_crash_mid_write_leaves_the_old_file_valid(tmp_path: Path) -> None:
    path = tmp_path / "estimator.avc"
    old = fitted_estimator()
    old.save(path)
    # A writer that died after writing half of its temporary file: the target is untouched.
    partial = AcceptanceEstimator(4).to_bytes()
    (tmp_path / f".{path.name}.tmp12345").write_bytes(partial[: len(partial) // 2])
    assert AcceptanceEstimator.load(path).state_dict() == old.state_dict()
    # And a later save replaces the file whole.
    new = AcceptanceEstimator(4, damping=10.0)
    new.save(path)
    assert AcceptanceEstimator.load(path).state_dict() == new.state_dict()


def test_unwritable_path_raises_and_leaves_the_estimator_alone(tmp_path: Path) -> None:
    est = fitted_estimator()
    before = est.state_dict()
    with pytest.raises(OSError, match="path"):
        est.save(tmp_path / "missing-dir" / "estimator.avc")
    with pytest.raises(OSError, match="path"):
        AcceptanceEstimator.load(tmp_path / "nothing-here.avc")
    assert est.state_dict() == before


def planner_after_steps() -> VerificationPlanner:
    tables = CostTables(np.zeros(9), 1.0 + 0.1 * np.arange(65))
    planner = VerificationPlanner(tables, 4, num_slots=6, exploration=0.2, exploration_seed=3)
    rng = np.random.default_rng(0)
    for _ in range(5):
        planner.plan(
            np.arange(4),
            rng.uniform(0.1, 0.99, (4, 4)),
            np.full(4, 4),
            num_non_draft_tokens=4,
            num_sampling_requests=4,
        )
    return planner


def test_planner_save_and_load_continue_identically(tmp_path: Path) -> None:
    planner = planner_after_steps()
    path = tmp_path / "planner.avp"
    planner.save(path)
    loaded = VerificationPlanner.load(path)
    copy = VerificationPlanner.from_bytes(planner.to_bytes())
    assert loaded.to_bytes() == copy.to_bytes() == planner.to_bytes()
    assert loaded.exploration == 0.2 and loaded.cost_tables == planner.cost_tables
    rng = np.random.default_rng(1)
    for _ in range(6):
        conf = rng.uniform(0.1, 0.99, (4, 4))
        plans = [
            p.plan(
                np.arange(2, 6),
                conf,
                np.full(4, 4),
                num_non_draft_tokens=4,
                num_sampling_requests=4,
            )
            for p in (planner, loaded)
        ]
        assert plans[0].budget == plans[1].budget
        np.testing.assert_array_equal(plans[0].admitted, plans[1].admitted)


def test_corrupt_planner_files_are_refused_and_crash_safe(tmp_path: Path) -> None:
    path = tmp_path / "planner.avp"
    planner = planner_after_steps()
    planner.save(path)
    data = path.read_bytes()
    for bad, text in [
        (data[:-3], "length"),
        (data[:30] + bytes([data[30] ^ 1]) + data[31:], "checksum"),
        (fitted_estimator().to_bytes(), "magic"),
    ]:
        (tmp_path / "bad.avp").write_bytes(bad)
        with pytest.raises(ValueError, match=text):
            VerificationPlanner.load(tmp_path / "bad.avp")
    (tmp_path / f".{path.name}.tmp999").write_bytes(data[:10])  # a writer died mid-write
    assert VerificationPlanner.load(path).to_bytes() == data


MAX_COUNT = 2**56  # the loader's bound on every counter, written out (not read from the code)


def test_a_state_at_the_loaders_bounds_keeps_working_and_every_state_it_reaches_reloads() -> None:
    """A restored state whose counters sit at the bound (2**56) refuses an observation that
    would pass it (ValueError naming the argument, nothing changed), saturates its refit count,
    and saves bytes that load again, through the state dict and the bytes alike."""
    # vLLM's update: its round holds the per-position counts ``n`` (the map update's round is
    # histograms).
    est = AcceptanceEstimator(2, refit_interval=5, update="vllm")
    x = np.array([[0.5, -1.0]], np.float32)
    est.observe(x, [2], [1])
    state = est.state_dict()
    state["num_refits"] = MAX_COUNT
    state["round_stats"]["n"] = [MAX_COUNT, 3]
    full = AcceptanceEstimator.from_state_dict(state)
    before = full.to_bytes()
    with pytest.raises(ValueError, match="num_admitted"):
        full.observe(x, [2], [1])
    assert full.to_bytes() == before
    full.observe(np.array([[0.5, -1.0]], np.float32), [0], [0])  # labels nothing: accepted
    full.refit()
    assert full.num_refits == MAX_COUNT
    again = AcceptanceEstimator.from_bytes(full.to_bytes())
    again.observe(x, [2], [1])
    again.refit()
    assert again.num_refits == MAX_COUNT
    assert AcceptanceEstimator.from_bytes(again.to_bytes()).num_refits == MAX_COUNT


DATA = Path(__file__).resolve().parents[2] / "av_core" / "tests" / "data"


def test_state_written_by_0_1_0_still_loads() -> None:
    """Bytes, JSON and a pickle written by av_core 0.1.0 (av_core/tests/persist_compat.rs has
    the recipes and checks the states bit for bit; here: through the Python entry points)."""
    import pickle

    for name, source in (("planner_v1.bin", "previous"), ("planner_v1_depth.bin", "current")):
        planner = VerificationPlanner.load(DATA / name)
        assert (planner.num_slots, planner.num_positions) == (12, 4)
        assert planner.budget_source == source and planner.exploration == 0.25
        assert VerificationPlanner.from_bytes((DATA / name).read_bytes()).to_bytes() == (
            planner.to_bytes()
        )
        np.testing.assert_array_equal(planner.previous_confidences(4), np.ones(4))
    depth = CostTables.from_json((DATA / "cost_tables_depth.json").read_text())
    assert depth.max_draft_depth == 4
    assert VerificationPlanner.load(DATA / "planner_v1_depth.bin").cost_tables == depth
    assert depth.to_json() == (DATA / "cost_tables_depth.json").read_text()
    assert pickle.loads((DATA / "cost_tables_depth.pickle").read_bytes()) == depth
    estimator = AcceptanceEstimator.load(DATA / "estimator_v1.bin")
    old = AcceptanceEstimator.from_bytes((DATA / "estimator_v1.bin").read_bytes())
    assert estimator.state_dict() == old.state_dict()
    # Saved again it is this release's format (version 4), which reads back to the same state.
    assert estimator.to_bytes()[8:12] == (4).to_bytes(4, "little")
    assert AcceptanceEstimator.from_bytes(estimator.to_bytes()).state_dict() == old.state_dict()
    # Version 1 is vLLM's update (the default when it was written; map is now): it loads as a
    # vllm estimator, and it refits as vLLM's update does.
    assert estimator.update == "vllm" and AcceptanceEstimator(4).update == "map"
    state = estimator.state_dict()
    assert state["format_version"] == 1
    vllm = AcceptanceEstimator.from_state_dict(state, update="vllm")
    assert vllm.to_bytes() == estimator.to_bytes()
