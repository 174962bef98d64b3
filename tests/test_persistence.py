"""Saving and loading estimator state: versioned, checksummed, atomic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from av_core import AcceptanceEstimator, CostTables, VerificationPlanner


def fitted_estimator() -> AcceptanceEstimator:
    rng = np.random.default_rng(0)
    est = AcceptanceEstimator(4, refit_interval=5)
    for _ in range(12):
        x = rng.normal(size=(16, 4)).astype(np.float32)
        admitted = rng.integers(0, 5, size=16)
        accepted = np.array([rng.integers(0, a + 1) for a in admitted])
        est.observe(x, admitted, accepted)
    # Two rounds of 5 fitted after their 1st, 2nd, 4th and 5th observe, then 2 more fits
    # (the map schedule; vLLM's would have refitted twice).
    assert est.num_refits == 10 and est.steps_since_refit == 2
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
