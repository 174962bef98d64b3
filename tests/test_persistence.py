"""Saving and loading estimator state: versioned, checksummed, atomic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from av_core import AcceptanceEstimator


def fitted_estimator() -> AcceptanceEstimator:
    rng = np.random.default_rng(0)
    est = AcceptanceEstimator(4, refit_interval=5)
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
