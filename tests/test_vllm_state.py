"""Warm restarts of the vLLM drop-in estimator (av_core.vllm.state).

The main test is a real restart: one process serves 300 steps of a synthetic workload and exits
(its state saved at exit), a new process loads it and serves the next 100 steps, and a third,
cold, process serves the same 100 steps. The restored coefficients must be the saved ones, bit
for bit, and the first 100 steps after the restart better calibrated (prequential log-loss of
the draft-time predictions) than the cold start's. The rest: a state for another key or another
configuration is refused with a warning naming the field; a corrupt, truncated or invalid file
gives a warning and a cold start, never an exception; periodic saves land atomically.
"""

from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from child_env import child_env

torch = pytest.importorskip("torch")

from av_core import AcceptanceEstimator  # noqa: E402
from av_core.vllm import OnlineAcceptanceEstimator  # noqa: E402
from av_core.vllm.state import StateKey, WarmStart  # noqa: E402

HERE = Path(__file__).resolve().parent
KEY = StateKey("org/target-8b", "org/draft-1b", "eagle3", 4, "dp0-rank0")

# Serves steps [start, stop) of a fixed synthetic trace (av_core.vllm's self-check trace: the
# target accepts a draft with probability q_max ** 0.7) and reports the prequential log-loss of
# the drafts it made and saw graded, and its coefficients.
_SERVE = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO)
import numpy as np, torch
from av_core.vllm import OnlineAcceptanceEstimator
from av_core.vllm.selfcheck import _synthetic_steps
from av_core.vllm.state import StateKey, WarmStart

directory, start, stop, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
M, K = 32, 4
est = OnlineAcceptanceEstimator(M, K, torch.device("cpu"))
est.REFIT_INTERVAL = 25
restored = False
if directory != "-":
    warm = WarmStart(directory, StateKey("org/target-8b", "org/draft-1b", "eagle3", K, "dp0-rank0"))
    restored = warm.attach(est)
after_load = [float(est.host_coefficients[0]).hex()] + [
    float(v).hex() for v in est.host_coefficients[1]
]
conf = torch.zeros(M + 4, K)
trace = list(_synthetic_steps(stop + 1, M, K, 256, seed=11))
losses, drafted = [], {}
for t in range(start, stop + 1):
    batch = trace[t]
    slots = batch["verdict_idx_mapping"]
    if t == start:  # its drafts were made before this process started: nothing to grade
        slots = slots[:0]
    sampled = batch["verdict_num_sampled"][: len(slots)]
    rejected = batch["verdict_num_rejected"][: len(slots)]
    for row, slot in enumerate(slots.tolist()):
        accepted = int(sampled[row]) - 1
        admitted = accepted + int(rejected[row])
        for k in range(min(accepted + 1, admitted)):
            p = float(np.clip(drafted[slot][k], 1e-15, 1 - 1e-15))
            losses.append(-np.log(p) if k < accepted else -np.log1p(-p))
    est.step(slots, sampled, rejected)
    if t == stop:
        break
    live = batch["idx_mapping"]
    for k in range(K):
        est.predict(batch["logits"][:, k], live, torch.tensor(k), conf, batch["temperature"])
    drafted = {int(s): est.predictions[int(s)].tolist() for s in live.tolist() if s >= 0}
slope, intercepts = est.host_coefficients
json.dump({
    "restored": restored,
    "after_load": after_load,
    "log_loss": float(np.mean(losses)),
    "labels": len(losses),
    "refits": est.num_refits,
    "final": [float(slope).hex()] + [float(v).hex() for v in intercepts],
}, open(out, "w"))
"""


def serve(directory: Path | str, start: int, stop: int, tmp_path: Path, name: str) -> Any:
    out = tmp_path / f"{name}.json"
    env = child_env(drop=("AV_CORE", "PROMETHEUS"))
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE, str(directory), str(start), str(stop), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stderr


def test_a_restarted_process_resumes_and_is_better_calibrated_than_a_cold_start(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    first, _ = serve(state, 0, 300, tmp_path, "first")
    assert not first["restored"] and first["refits"] >= 11
    # The state and its key; nothing temporary left.
    assert sorted(p.name for p in state.iterdir()) == sorted([KEY.filename(), KEY.key_filename()])
    warm, log = serve(state, 300, 400, tmp_path, "warm")
    assert warm["restored"], log
    assert "restored from" in log
    # The coefficients the first process ended with, bit for bit.
    assert warm["after_load"] == first["final"]
    cold, _ = serve("-", 300, 400, tmp_path, "cold")
    assert cold["after_load"] != first["final"]
    assert warm["labels"] == cold["labels"] > 1000
    assert warm["log_loss"] < cold["log_loss"], (warm["log_loss"], cold["log_loss"])


# --- one process ---------------------------------------------------------------------------------


def trained(exact: bool = False, steps: int = 12) -> OnlineAcceptanceEstimator:
    est = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"), exact=exact)
    est.REFIT_INTERVAL = 3
    gen = torch.Generator().manual_seed(0)
    idx = torch.arange(6, dtype=torch.int32)
    conf = torch.zeros(8, 4)
    for step in range(steps):
        for k in range(4):
            logits = torch.randn(6, 50, generator=gen) * 4
            est.predict(logits, idx, torch.tensor(k), conf, torch.ones(8))
        sampled = torch.tensor([(step + r) % 5 + 1 for r in range(6)], dtype=torch.int32)
        est.step(idx, sampled, (sampled <= 4).to(torch.int32))
    return est


def snapshot(est: OnlineAcceptanceEstimator) -> str:
    return json.dumps(est.state_dict(), sort_keys=True)


def test_save_and_load_round_trip_the_whole_state(tmp_path: Path) -> None:
    est = trained()
    WarmStart(tmp_path, KEY).save(est)
    fresh = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"))
    assert WarmStart(tmp_path, KEY).load(fresh)
    assert snapshot(fresh) == snapshot(est)
    assert torch.equal(fresh.slope, est.slope) and torch.equal(fresh.intercepts, est.intercepts)


@pytest.mark.parametrize(
    ("other", "field"),
    [
        (StateKey("org/target-70b", "org/draft-1b", "eagle3", 4, "dp0-rank0"), "target_model"),
        (StateKey("org/target-8b", "org/draft-3b", "eagle3", 4, "dp0-rank0"), "draft_model"),
        (StateKey("org/target-8b", "org/draft-1b", "mtp", 4, "dp0-rank0"), "method"),
        (StateKey("org/target-8b", "org/draft-1b", "eagle3", 4, "dp1-rank0"), "rank"),
    ],
)
def test_a_state_for_another_key_is_refused_naming_the_field(
    tmp_path: Path, other: StateKey, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    WarmStart(tmp_path, KEY).save(trained())
    # Another key has other files: moved over this key's names, the key saved still refuses it.
    (tmp_path / KEY.filename()).rename(tmp_path / other.filename())
    (tmp_path / KEY.key_filename()).rename(tmp_path / other.key_filename())
    fresh = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"))
    before = snapshot(fresh)
    with caplog.at_level(logging.WARNING, logger="vllm.av_core"):
        assert not WarmStart(tmp_path, other).load(fresh)
    assert f"it is for {field} =" in caplog.text and "cold start" in caplog.text
    assert snapshot(fresh) == before


def test_another_configuration_or_k_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    WarmStart(tmp_path, KEY).save(trained())
    exact = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"), exact=True)
    before = snapshot(exact)
    with caplog.at_level(logging.WARNING, logger="vllm.av_core"):
        assert not WarmStart(tmp_path, KEY).load(exact)
    assert "max_intercept" in caplog.text or "max_slope" in caplog.text
    assert snapshot(exact) == before
    caplog.clear()
    three = OnlineAcceptanceEstimator(8, 3, torch.device("cpu"))
    with caplog.at_level(logging.WARNING, logger="vllm.av_core"):
        assert not WarmStart(tmp_path, KEY).load(three)
    assert "num_positions" in caplog.text


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        path.write_bytes(data[:40] + bytes([data[40] ^ 0x10]) + data[41:])
    elif how == "binary":
        path.write_bytes(b"\x00\xff" * 64)
    elif how == "invalid":  # a consistent checksum over an invalid state: a negative slope
        state = AcceptanceEstimator.from_bytes(data).state_dict()
        state["slope"] = 0.3251  # a value no other field holds, to find the slope's bytes
        marked = AcceptanceEstimator.from_state_dict(state).to_bytes()
        at = marked.index(struct.pack("<d", 0.3251))
        body = marked[:at] + struct.pack("<d", -1.0) + marked[at + 8 : -4]
        path.write_bytes(body + zlib.crc32(body).to_bytes(4, "little"))
    elif how == "other format":
        path.write_text(json.dumps({"format": "something else"}))


@pytest.mark.parametrize("how", ["truncated", "flipped", "binary", "invalid", "other format"])
def test_a_corrupt_file_warns_and_cold_starts(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    WarmStart(tmp_path, KEY).save(trained())
    _corrupt(tmp_path / KEY.filename(), how)
    fresh = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"))
    before = snapshot(fresh)
    with caplog.at_level(logging.WARNING, logger="vllm.av_core"):
        assert not WarmStart(tmp_path, KEY).load(fresh)
    assert "not loaded" in caplog.text and "cold start" in caplog.text
    assert snapshot(fresh) == before


def test_saves_every_n_refits_in_the_background_and_atomically(tmp_path: Path) -> None:
    est = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"))
    est.REFIT_INTERVAL = 1
    warm = WarmStart(tmp_path, KEY, save_every=3)
    assert not warm.attach(est)
    idx = torch.arange(4, dtype=torch.int32)
    sampled, rejected = torch.full((4,), 2, dtype=torch.int32), torch.ones(4, dtype=torch.int32)
    for _ in range(2):
        est.step(idx, sampled, rejected)
    assert not (tmp_path / KEY.filename()).exists()  # 2 refits: no save due yet
    for _ in range(7):
        est.step(idx, sampled, rejected)
    warm.close()  # waits for the writer
    saved = AcceptanceEstimator.load(tmp_path / KEY.filename())  # the core's bytes
    assert saved.num_refits == 9  # saves at refits 3, 6 and 9: the last
    # The state and its key; nothing temporary left.
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([KEY.filename(), KEY.key_filename()])
    assert json.loads((tmp_path / KEY.key_filename()).read_text()) == KEY.__dict__
    before = (tmp_path / KEY.filename()).read_bytes()
    for _ in range(3):  # closed: refits save nothing more
        est.step(idx, sampled, rejected)
    assert (tmp_path / KEY.filename()).read_bytes() == before


def test_a_failing_save_never_reaches_the_serving_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    est = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"))
    est.REFIT_INTERVAL = 1
    warm = WarmStart(blocker / "state", KEY, save_every=1)
    warm.attach(est)
    idx = torch.arange(2, dtype=torch.int32)
    with caplog.at_level(logging.WARNING, logger="vllm.av_core"):
        est.step(idx, torch.full((2,), 2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
        warm.close()
    assert est.num_refits == 1
    assert "could not save" in caplog.text


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="key must be a StateKey"):
        WarmStart("/tmp", ("a", "b"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="save_every"):
        WarmStart("/tmp", KEY, save_every=0)
