"""Whatever sits at a warm-restart path, loading it never stops or stalls the server
(av_core.vllm.state, issue #21: "a corrupt file never stops the server").

``WarmStart.load`` runs inside vLLM's ``load_model``. Before, a FIFO at the state path blocked
start-up forever (and a symlink to ``/dev/zero`` read without end; ``/dev/null`` stands for
devices here), a file nested too deeply raised ``RecursionError``, an edited but consistently
checksummed ``saved_at`` raised ``TypeError``/``OverflowError`` after the state was loaded, an
estimator that raised anything but the four expected errors took the server down, and a save
that failed with anything but ``OSError`` killed the background writer for good. And since every
key has its own file, a changed draft model, method or K cold-started with an info line only:
the warning that the issue asks for ("a state whose key does not match is not loaded, a warning
says why") never appeared in the plugin's flow. Each case: the estimator is left exactly as it
was, a warning says why, and the call returns within seconds.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from av_core import AcceptanceEstimator  # noqa: E402
from av_core.vllm import OnlineAcceptanceEstimator  # noqa: E402
from av_core.vllm.state import (  # noqa: E402
    FORMAT,
    FORMAT_VERSION,
    MAX_STATE_BYTES,
    StateKey,
    WarmStart,
    _payload_digest,
)

CPU = torch.device("cpu")
KEY = StateKey("org/target-8b", "org/draft-1b", "eagle3", 4, "dp0-rank0")
LOGGER = "vllm.av_core"


def trained() -> OnlineAcceptanceEstimator:
    est = OnlineAcceptanceEstimator(8, 4, CPU)
    est.REFIT_INTERVAL = 2
    idx = torch.arange(6, dtype=torch.int32)
    conf = torch.zeros(6, 4)
    gen = torch.Generator().manual_seed(0)
    for step in range(6):
        for k in range(4):
            est.predict(
                torch.randn(6, 40, generator=gen) * 3, idx, torch.tensor(k), conf, torch.ones(8)
            )
        sampled = torch.tensor([(step + r) % 5 + 1 for r in range(6)], dtype=torch.int32)
        est.step(idx, sampled, (sampled <= 4).to(torch.int32))
    assert est.num_refits == 3
    return est


def snapshot(est: OnlineAcceptanceEstimator) -> str:
    return json.dumps(est.state_dict(), sort_keys=True)


def load_within(warm: WarmStart, est: OnlineAcceptanceEstimator, seconds: float = 20.0) -> Any:
    """``warm.load(est)`` on a thread: its result, or "blocked" if it did not return in time."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = warm.load(est)
        except BaseException as error:  # noqa: BLE001 - reported to the test
            result["value"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return result.get("value", "blocked")


def release_fifo(path: Path) -> None:
    """Unblocks a reader stuck opening the FIFO (only needed when the code under test blocks)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_special_file_at_the_state_path_is_refused_without_waiting(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / KEY.filename()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        if not os.path.exists("/dev/null"):
            pytest.skip("no /dev/null here")
        path.symlink_to("/dev/null")  # read as a file it would be empty: refused as a device
    else:
        path.mkdir()
    est = OnlineAcceptanceEstimator(8, 4, CPU)
    before = snapshot(est)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            outcome = load_within(WarmStart(tmp_path, KEY), est)
    finally:
        if kind == "fifo":
            release_fifo(path)
    assert outcome is False, outcome
    assert "not loaded" in caplog.text and "cold start" in caplog.text
    if kind != "directory":
        assert "not a regular file" in caplog.text
    assert snapshot(est) == before


def test_a_file_longer_than_any_state_is_refused_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name, said in [
        (KEY.filename(), "more than any saved state"),  # the core's bound on its bytes
        (KEY.legacy_filename(), "longer than any saved state"),
    ]:
        path = tmp_path / name
        with open(path, "wb") as handle:
            handle.truncate(MAX_STATE_BYTES * 64)  # sparse: costs no disk
        est = OnlineAcceptanceEstimator(8, 4, CPU)
        before = snapshot(est)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert load_within(WarmStart(tmp_path, KEY), est) is False
        assert said in caplog.text
        assert snapshot(est) == before
        path.unlink()


def test_a_state_saved_to_the_bound_is_still_read(tmp_path: Path) -> None:
    """The bound is far above a real state: the largest K's state loads."""
    est = OnlineAcceptanceEstimator(4, 64, CPU)
    key = StateKey("t", "d", "m", 64, "r")
    WarmStart(tmp_path, key).save(est)
    saved = tmp_path / key.filename()
    assert saved.stat().st_size < MAX_STATE_BYTES // 16
    fresh = OnlineAcceptanceEstimator(4, 64, CPU)
    assert WarmStart(tmp_path, StateKey("t", "d", "m", 64, "r")).load(fresh) is True


@pytest.mark.parametrize("where", ["state", "key", "legacy state"])
def test_a_deeply_nested_file_is_refused(
    tmp_path: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    if where == "key":
        WarmStart(tmp_path, KEY).save(trained())
    name = {
        "state": KEY.filename(),
        "key": KEY.key_filename(),
        "legacy state": KEY.legacy_filename(),
    }
    (tmp_path / name[where]).write_text("[" * 100_000 + "]" * 100_000)
    est = OnlineAcceptanceEstimator(8, 4, CPU)
    before = snapshot(est)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_within(WarmStart(tmp_path, KEY), est) is False
    assert "not loaded" in caplog.text
    assert snapshot(est) == before


def save_legacy(path: Path, est: OnlineAcceptanceEstimator, **changes: Any) -> None:
    """Saves ``est`` as the JSON document of earlier releases (key, state and a checksum),
    with ``changes`` to its payload under a recomputed checksum (an edit, not a corruption)."""
    payload = {"key": KEY.__dict__, "saved_at": 1.7e9, "state": est.state_dict(), **changes}
    document = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "sha256": _payload_digest(payload),
        "payload": payload,
    }
    path.write_text(json.dumps(document, sort_keys=True))


@pytest.mark.parametrize("saved_at", ["yesterday", 1e300, -1e300, None, [1], True])
def test_any_saved_at_in_a_consistent_file_never_raises(
    tmp_path: Path, saved_at: Any, caplog: pytest.LogCaptureFixture
) -> None:
    source = trained()
    save_legacy(tmp_path / KEY.legacy_filename(), source, saved_at=saved_at)
    fresh = OnlineAcceptanceEstimator(8, 4, CPU)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert load_within(WarmStart(tmp_path, KEY), fresh) is True
    assert "restored from" in caplog.text and "saved ?" in caplog.text
    assert snapshot(fresh) == snapshot(source)


def test_an_estimator_that_refuses_the_state_any_way_never_stops_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    WarmStart(tmp_path, KEY).save(trained())
    est = OnlineAcceptanceEstimator(8, 4, CPU)

    def refuse(state: Any) -> None:
        raise RuntimeError("the device is gone")

    monkeypatch.setattr(est, "load_state_dict", refuse)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_within(WarmStart(tmp_path, KEY), est) is False
    assert "the device is gone" in caplog.text and "cold start" in caplog.text


@pytest.mark.parametrize(
    ("other", "field"),
    [
        (StateKey("org/target-8b", "org/draft-3b", "eagle3", 4, "dp0-rank0"), "draft_model"),
        (StateKey("org/target-8b", "org/draft-1b", "mtp", 4, "dp0-rank0"), "method"),
        (StateKey("org/target-8b", "org/draft-1b", "eagle3", 3, "dp0-rank0"), "num_speculative"),
    ],
)
def test_a_changed_deployment_warns_naming_the_field_in_the_plugins_flow(
    tmp_path: Path, other: StateKey, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The saved file keeps its own name (its key's): the new key finds no file of its own."""
    WarmStart(tmp_path, KEY).save(trained())
    est = OnlineAcceptanceEstimator(8, other.num_speculative_steps, CPU)
    before = snapshot(est)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_within(WarmStart(tmp_path, other), est) is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert field in warnings[0] and "not loaded" in warnings[0] and KEY.filename() in warnings[0]
    assert snapshot(est) == before


@pytest.mark.parametrize(
    "other",
    [
        StateKey("org/another-70b", "org/draft-1b", "eagle3", 4, "dp0-rank0"),  # another model
        StateKey("org/target-8b", "org/draft-1b", "eagle3", 4, "dp1-rank0"),  # another rank
    ],
)
def test_another_deployment_or_rank_in_a_shared_directory_is_no_warning(
    tmp_path: Path, other: StateKey, caplog: pytest.LogCaptureFixture
) -> None:
    WarmStart(tmp_path, KEY).save(trained())
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert WarmStart(tmp_path, other).load(OnlineAcceptanceEstimator(8, 4, CPU)) is False
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "no saved estimator state" in caplog.text


def test_the_background_writer_survives_any_failed_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    est = OnlineAcceptanceEstimator(8, 4, CPU)
    est.REFIT_INTERVAL = 1
    warm = WarmStart(tmp_path, KEY, save_every=1)
    warm.save_from_now_on(est)
    original = warm._write
    failures = [ValueError("not serialisable")]

    def flaky(document: dict[str, Any]) -> None:
        if failures:
            raise failures.pop()
        original(document)

    monkeypatch.setattr(warm, "_write", flaky)
    idx = torch.arange(4, dtype=torch.int32)
    sampled, rejected = torch.full((4,), 2, dtype=torch.int32), torch.ones(4, dtype=torch.int32)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        est.step(idx, sampled, rejected)  # refit 1: its save fails
        deadline = time.monotonic() + 20
        while "could not save" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
        est.step(idx, sampled, rejected)  # refit 2: saved
        warm.close()
    assert "not serialisable" in caplog.text
    saved = tmp_path / KEY.filename()
    assert stat.S_ISREG(saved.stat().st_mode)
    assert AcceptanceEstimator.load(saved).num_refits == 2
