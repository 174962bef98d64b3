"""Pooled statistics across data-parallel ranks (av_core.distributed), with real processes.

- 4 ranks on 127.0.0.1 (torch.distributed, gloo), each fed a different share of the same verdicts
  in a different order, one of them fed nothing: after every pooled refit every rank's
  coefficients are bit-identical to one estimator fed all verdicts, for the native estimator
  (``pool_round`` + ``refit``) and for the vLLM drop-in (``process_group=``).
- 3 ranks, the last one's round laid out differently (positions, histogram bins, update): every
  rank raises a ValueError naming the difference, instead of hanging or aborting.
- The tensor-parallel promise, without any collective: 2 processes (torch.distributed never
  initialized) fed the same verdicts in different orders agree bit for bit.
- The limb encoding of the 128-bit statistics, against Python integer sums.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from child_env import child_env

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import distributed_scenarios as scenarios  # noqa: E402

from av_core import AcceptanceEstimator  # noqa: E402
from av_core.distributed import (  # noqa: E402
    HISTOGRAM_COLUMNS,
    NUM_LIMBS,
    STAT_COLUMNS,
    limbs_to_round,
    pool_round,
    round_limbs,
)

COLUMNS = HISTOGRAM_COLUMNS

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(mode: str, world: int, tmp_path: Path) -> list[dict[str, Any]]:
    port = "-" if mode == "tp" else str(free_port())
    env = child_env(SUPPORT, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    for name in ("AV_CORE_METRICS_PORT", "PROMETHEUS_MULTIPROC_DIR", "AV_CORE_VLLM_EXACT"):
        env.pop(name, None)
    outputs = [tmp_path / f"{mode}-{rank}.json" for rank in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(SUPPORT / "distributed_scenarios.py"), mode, str(rank), str(world)]
            + [port, str(outputs[rank])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    logs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            logs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    failed = [rank for rank, proc in enumerate(procs) if proc.returncode != 0]
    assert not failed, "\n".join(
        f"rank {rank} exited with {procs[rank].returncode} (-6: SIGABRT):\n{logs[rank][-2000:]}"
        for rank in failed
    )
    return [json.loads(path.read_text()) for path in outputs]


@pytest.fixture(scope="module")
def dp_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks("dp", 4, tmp_path_factory.mktemp("dp"))


@pytest.fixture(scope="module")
def mismatch_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks("mismatch", 3, tmp_path_factory.mktemp("mismatch"))


@pytest.mark.parametrize(("key", "update"), [("native", "map"), ("native_vllm", "vllm")])
def test_four_gloo_ranks_pool_to_the_bits_of_one_estimator(
    dp_results: list[dict[str, Any]], key: str, update: str
) -> None:
    expected = scenarios.native_reference(update)
    assert len(expected) == scenarios.NATIVE_STEPS // scenarios.NATIVE_ROUND
    # The coefficients move from refit to refit, so equality is not the cold start twice.
    assert len({tuple(c) for c in expected}) == len(expected)
    for result in dp_results:
        assert result[key]["coefficients"] == expected, result["rank"]
    # The pooled counts are every row's labels (rank 3 served nothing and contributed zeros).
    counts = [result[key]["pooled_counts"] for result in dp_results]
    assert all(c == counts[0] for c in counts)
    total = np.zeros(scenarios.NATIVE_K, dtype=np.int64)
    for step, (_, admitted, accepted, owner) in enumerate(scenarios.native_steps(), start=1):
        labeled = np.minimum(accepted + 1, admitted)
        total += (np.arange(scenarios.NATIVE_K)[None, :] < labeled[:, None]).sum(axis=0)
        if step % scenarios.NATIVE_ROUND == 0:
            assert counts[0][step // scenarios.NATIVE_ROUND - 1] == total.tolist()
            total[:] = 0
        assert not np.any(owner == 3)


def test_four_gloo_ranks_of_the_drop_in_refit_to_the_bits_of_one_estimator(
    dp_results: list[dict[str, Any]],
) -> None:
    expected = scenarios.drop_in_reference()
    refits = scenarios.DROP_IN_STEPS // scenarios.DROP_IN_INTERVAL
    assert len({tuple(c) for c in expected}) == refits + 1  # the cold start, then each refit
    for result in dp_results:
        assert result["drop_in"] == expected, result["rank"]


def test_four_gloo_ranks_of_the_drop_in_on_the_map_update_end_rounds_on_the_same_bits(
    dp_results: list[dict[str, Any]],
) -> None:
    # With a process group the drop-in fits only at the pooled round ends, so every rank holds
    # the same bits throughout, and at each round's end the bits of one estimator fed every
    # verdict (which also fitted within its rounds: the round's end does not depend on that).
    expected = scenarios.drop_in_reference("map")
    first = dp_results[0]["drop_in_map"]
    for result in dp_results:
        assert result["drop_in_map"] == first, result["rank"]
    ends = [i for i in range(len(expected)) if (i + 1) % scenarios.DROP_IN_INTERVAL == 0]
    assert len(ends) == scenarios.DROP_IN_STEPS // scenarios.DROP_IN_INTERVAL
    assert [first[i] for i in ends] == [expected[i] for i in ends]
    assert len({tuple(expected[i]) for i in ends}) == len(ends)


@pytest.mark.parametrize(
    ("case", "named"),
    [
        ("positions", f"positions {scenarios.NATIVE_K}..{scenarios.NATIVE_K + 1}"),
        ("bins", "histogram bins 32..64"),
        ("update", "histogram bins 0..64"),
    ],
)
def test_a_rank_with_another_layout_makes_every_rank_refuse(
    mismatch_results: list[dict[str, Any]], case: str, named: str
) -> None:
    """Three gloo ranks, the last one's round laid out differently (another K, other histogram
    bins, the other update): each rank raises the same ValueError naming what differs, and none
    adds anything to its round. Without the check, tensors of different sizes meet in one
    all-reduce and gloo aborts the process."""
    assert len(mismatch_results) == 3
    for result in mismatch_results:
        message = result["mismatch"][case]
        assert message.startswith("ValueError: estimator: the ranks of the group disagree"), message
        assert named in message, message
        assert "(added)" not in message


def test_tensor_parallel_ranks_agree_bit_for_bit_without_a_collective(tmp_path: Path) -> None:
    results = run_ranks("tp", 2, tmp_path)
    assert not any(result["torch_distributed_initialized"] for result in results)
    for key, update in (("drop_in", "vllm"), ("drop_in_map", "map")):
        first, second = (result[key] for result in results)
        assert first == second
        assert first == scenarios.drop_in_reference(update)
        assert len({tuple(c) for c in first}) > 1


# --- the encoding, in one process --------------------------------------------------------------


def random_round(rng: np.random.Generator, k: int) -> dict[str, Any]:
    big = 1 << 124  # five of them still sum inside the signed 128-bit range
    out: dict[str, Any] = {"fraction_bits": 40}
    for name in STAT_COLUMNS:
        if name == "n":
            out[name] = [int(v) for v in rng.integers(0, 1 << 62, size=k)]
        else:
            out[name] = [int(rng.integers(-(1 << 62), 1 << 62)) * (1 << 63) % big for _ in range(k)]
            out[name] = [v if i % 2 else -v for i, v in enumerate(out[name])]
    return out


@pytest.mark.parametrize("seed", range(5))
def test_limbs_sum_to_the_python_integer_sum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 9))
    rounds = [random_round(rng, k) for _ in range(int(rng.integers(1, 6)))]
    limbs = [round_limbs(r) for r in rounds]
    assert limbs[0].shape == (len(STAT_COLUMNS), k, NUM_LIMBS)
    assert all(0 <= int(v) < (1 << 32) for v in limbs[0].reshape(-1))
    summed = limbs_to_round(np.sum(limbs, axis=0), 40)
    for name in STAT_COLUMNS:
        assert summed[name] == [sum(r[name][i] for r in rounds) for i in range(k)], name
    # One round decodes to itself.
    assert limbs_to_round(limbs[0], 40) == rounds[0]


def test_limbs_reject_a_wrong_shape_and_ragged_columns() -> None:
    with pytest.raises(ValueError, match="limbs must have shape"):
        limbs_to_round(np.zeros((5, 2, NUM_LIMBS), dtype=np.int64), 40)
    ragged = {name: [0, 0] for name in STAT_COLUMNS}
    ragged["n"] = [0]
    with pytest.raises(ValueError, match="one entry per position"):
        round_limbs(ragged)


def test_pool_round_needs_a_native_estimator_and_an_initialized_group() -> None:
    with pytest.raises(TypeError, match="estimator must be an av_core.AcceptanceEstimator"):
        pool_round(object())  # type: ignore[arg-type]
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="initialized"):
            pool_round(AcceptanceEstimator(2))


def test_add_round_stats_refuses_bad_rounds_and_changes_nothing() -> None:
    # vLLM's update: its IRLS moments (the map update's histograms: the test below).
    est = AcceptanceEstimator(2, refit_interval=1 << 40, update="vllm")
    est.observe(np.array([[1.0, 2.0]], np.float32), [2], [1])
    before = est.state_dict()
    good = est.state_dict()["round_stats"]
    for bad, error in (
        ({**good, "n": [1, 2, 3]}, ValueError),
        ({**good, "a": [-1, 0]}, ValueError),
        ({**good, "fraction_bits": 3}, ValueError),
        ({**good, "n": [-1, 0]}, ValueError),  # an out-of-range integer is a wrong value
        ("not a dict", TypeError),
    ):
        with pytest.raises(error, match="round_stats"):
            est.add_round_stats(bad)  # type: ignore[arg-type]
        assert est.state_dict() == before
    est.add_round_stats(good)
    assert est.round_counts().tolist() == [2 * n for n in before["round_stats"]["n"]]


def test_add_round_stats_refuses_bad_histograms_and_changes_nothing() -> None:
    est = AcceptanceEstimator(2, refit_interval=1 << 40, update="map")
    est.observe(np.array([[1.0, 2.0]], np.float32), [2], [1])
    before = est.state_dict()
    good = est.state_dict()["round_stats"]
    occupied = next(i for i, n in enumerate(good["count"]) if n > 0)
    too_many = list(good["accepted"])
    too_many[occupied] = good["count"][occupied] + 1
    for bad, error in (
        ({**good, "count": good["count"][:-1]}, ValueError),
        ({**good, "accepted": too_many}, ValueError),
        ({**good, "bins": 32}, ValueError),
        ({**good, "fraction_bits": 36}, ValueError),  # a vllm round given to a map estimator
        ({**good, "count": [-1] + good["count"][1:]}, ValueError),
        (before["round_stats"] | {"count": "many"}, TypeError),
    ):
        with pytest.raises(error, match="round_stats"):
            est.add_round_stats(bad)
        assert est.state_dict() == before
    est.add_round_stats(good)
    assert est.round_counts().tolist() == [2, 2]


@pytest.mark.parametrize("seed", range(3))
def test_histogram_limbs_sum_to_the_python_integer_sum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rounds = [
        {
            "fraction_bits": 16,
            "bins": 4,
            **{name: [int(v) for v in rng.integers(0, 1 << 62, size=8)] for name in COLUMNS},
        }
        for _ in range(3)
    ]
    limbs = [round_limbs(r) for r in rounds]
    assert limbs[0].shape == (3, 8, NUM_LIMBS)
    summed = limbs_to_round(np.sum(limbs, axis=0), 16, COLUMNS)
    for name in COLUMNS:
        assert summed[name] == [sum(r[name][i] for r in rounds) for i in range(8)], name
