"""The plugin's warm restarts and data-parallel pooling (av_core.vllm.serving), on fake vLLM
modules with the control flow tests/vllm/test_vllm_contract.py checks in each release's source.

- In one process: ``AV_CORE_STATE_DIR`` wraps ``DraftModelSpeculator.load_model``; an estimator
  built by it saves at its refits and the next one built for the same key resumes from it, one
  for another draft model starts cold; ``uninstall`` restores vLLM's method; a bad
  ``AV_CORE_SHARE_STATS`` or a changed signature is refused before anything is patched; a
  data-parallel group of one rank (vLLM's dense-model data parallelism) warns and pools nothing.
- With 2 real processes (gloo on 127.0.0.1) in vLLM's lockstep: rank 0 serves requests, rank 1 only
  dummy batches. Nothing deadlocks, the idle rank reaches every refit, and both ranks hold, after
  every step, the bits of one estimator fed rank 0's verdicts. Restarted with different saved
  states per rank, both start from rank 0's.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from child_env import child_env

torch = pytest.importorskip("torch")

import vllm_serving_fakes as fakes  # noqa: E402

from av_core import AcceptanceEstimator, SettingError  # noqa: E402
from av_core.vllm import OnlineAcceptanceEstimator  # noqa: E402
from av_core.vllm import plugin as vllm_plugin  # noqa: E402
from av_core.vllm.state import StateKey, WarmStart  # noqa: E402

HERE = Path(__file__).resolve().parent
SUPPORT = HERE.parent / "support"
SPECULATOR = f"{fakes.SPEC}.speculator"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    modules = fakes.build()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    for name in ("AV_CORE_VLLM_ANY_VERSION", "AV_CORE_SHARE_STATS", "AV_CORE_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AV_CORE_VLLM", "1")
    yield modules
    vllm_plugin.uninstall()


def new_speculator(config: Any = None) -> Any:
    speculator = sys.modules[SPECULATOR].DraftModelSpeculator(
        config or fakes.vllm_config(), torch.device("cpu")
    )
    speculator.load_model(None)
    return speculator


def serve(speculator: Any, steps: int) -> None:
    runner = sys.modules["vllm.v1.worker.gpu_worker"].GPUModelRunner(speculator)
    for step in fakes.trace(steps):
        runner.execute_model(object())
        runner.sample_tokens(step["verdict"], step["batch"])


def writers(estimator: OnlineAcceptanceEstimator) -> list[WarmStart]:
    return [c.__self__ for c in estimator._refit_listeners if isinstance(c.__self__, WarmStart)]


def test_state_dir_makes_every_built_estimator_resume(
    fake: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = sys.modules[SPECULATOR].DraftModelSpeculator.load_model
    monkeypatch.setenv("AV_CORE_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("AV_CORE_STATE_SAVE_EVERY", "1")
    vllm_plugin.register()
    assert any(entry.attribute == "load_model" for entry in vllm_plugin.installed())
    first = new_speculator()
    est = first.acceptance_estimator
    assert isinstance(est, OnlineAcceptanceEstimator)
    est.REFIT_INTERVAL = 4
    serve(first, 13)
    assert est.num_refits == 3
    for writer in writers(est):
        writer.close()
    key = StateKey("org/target", "org/draft", "eagle3", fakes.K, "dp0-rank0")
    assert sorted(p.name for p in tmp_path.iterdir()) == [key.filename(), key.key_filename()]
    again = new_speculator()
    assert fakes.bits(again.acceptance_estimator) == fakes.bits(est)
    assert again.acceptance_estimator.num_refits == 3
    other = new_speculator(fakes.vllm_config(draft="org/another-draft"))
    assert fakes.bits(other.acceptance_estimator) != fakes.bits(est)
    assert other.acceptance_estimator.num_refits == 0
    vllm_plugin.uninstall()
    assert sys.modules[SPECULATOR].DraftModelSpeculator.load_model is original


def test_bad_share_mode_or_changed_signature_patches_nothing(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AV_CORE_SHARE_STATS", "tp")
    with pytest.raises(SettingError, match="AV_CORE_SHARE_STATS='tp'"):
        vllm_plugin.register()
    assert vllm_plugin.installed() == []
    monkeypatch.setenv("AV_CORE_SHARE_STATS", "dp")

    def execute_dummy_batch(self: Any, num_tokens: int) -> None:
        return None

    worker = sys.modules["vllm.v1.worker.gpu_worker"].Worker
    monkeypatch.setattr(worker, "execute_dummy_batch", execute_dummy_batch)
    with pytest.raises(vllm_plugin.VllmCompatibilityError, match="execute_dummy_batch"):
        vllm_plugin.register()
    assert vllm_plugin.installed() == []


def test_a_data_parallel_group_of_one_pools_nothing_and_says_so(
    fake: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AV_CORE_SHARE_STATS", "dp")
    vllm_plugin.register()
    with caplog.at_level(logging.WARNING, logger="vllm.av_core"):
        speculator = new_speculator()
    assert speculator.acceptance_estimator.process_group is None
    assert "independent engines" in caplog.text


# --- two real processes in vLLM's data-parallel lockstep -----------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(state_dir: str, tmp_path: Path, tag: str, **variables: str) -> list[dict[str, Any]]:
    """``variables``: environment variables for the ranks (every other AV_CORE_* is dropped)."""
    port = str(free_port())
    env = child_env(
        HERE,
        drop=("AV_CORE", "PROMETHEUS"),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
        **variables,
    )
    outs = [tmp_path / f"{tag}-{rank}.json" for rank in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(SUPPORT / "vllm_serving_fakes.py"), str(rank), "2", port]
            + [state_dir, str(outs[rank])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank}:\n{logs[rank][-3000:]}"
    return [json.loads(path.read_text()) for path in outs]


def single_estimator_trajectory() -> list[list[str]]:
    est = OnlineAcceptanceEstimator(fakes.M, fakes.K, torch.device("cpu"))
    est.REFIT_INTERVAL = 5
    conf = torch.zeros(fakes.M, fakes.K)
    out = []
    for step in fakes.trace(23):
        est.step(*step["verdict"])
        batch = step["batch"]
        for k, logits in enumerate(batch["logits"]):
            est.predict(logits, batch["idx"], torch.tensor(k), conf, torch.ones(fakes.M))
        out.append(fakes.bits(est))
    return out


def test_an_idle_rank_reaches_every_refit_and_both_hold_the_same_bits(tmp_path: Path) -> None:
    busy, idle = run_ranks("-", tmp_path, "lockstep")
    assert idle["dummy_proposes"] == 23 and busy["dummy_proposes"] == 0
    assert busy["refits"] == idle["refits"] == 4
    assert busy["trajectory"] == idle["trajectory"]
    assert busy["trajectory"] == single_estimator_trajectory()
    assert len({tuple(bits) for bits in busy["trajectory"]}) == 5  # cold start + 4 refits


@pytest.mark.parametrize("update", ["vllm", "map"])
def test_restarted_ranks_start_from_rank_zeros_state(
    tmp_path: Path, update: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The drop-in's update (vLLM's by default; av_core's map opted into by the environment, in
    # this process and in the ranks): both restart equal.
    monkeypatch.setenv("AV_CORE_VLLM_ESTIMATOR", update)
    state = tmp_path / "state"
    run_ranks(str(state), tmp_path, "first", AV_CORE_VLLM_ESTIMATOR=update)
    files = sorted(state.glob("*.avcore"))
    assert len(files) == 2  # one per rank (dp0-rank0, dp1-rank1)
    # Give rank 1 a different saved state (another history), with a valid file.
    key = StateKey("org/target", "org/draft", "eagle3", fakes.K, "dp1-rank1")
    other = OnlineAcceptanceEstimator(fakes.M, fakes.K, torch.device("cpu"))
    other.REFIT_INTERVAL = 1
    idx = torch.arange(3, dtype=torch.int32)
    for _ in range(3):
        other.step(idx, torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32))
    WarmStart(state, key).save(other)
    saved = {
        path.name: AcceptanceEstimator.load(path).state_dict() for path in state.glob("*.avcore")
    }
    rank0 = saved[StateKey("org/target", "org/draft", "eagle3", fakes.K, "dp0-rank0").filename()]
    assert saved[key.filename()]["intercepts"] != rank0["intercepts"]
    busy, idle = run_ranks(str(state), tmp_path, "second", AV_CORE_VLLM_ESTIMATOR=update)
    expected = [float(rank0["slope"]).hex()] + [float(v).hex() for v in rank0["intercepts"]]
    assert busy["after_load"] == idle["after_load"] == expected
    assert busy["trajectory"] == idle["trajectory"]
    assert busy["refits"] == idle["refits"]
