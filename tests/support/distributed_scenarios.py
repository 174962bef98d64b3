"""Scenarios for tests/distributed/test_distributed.py, run by real processes
(``python this_file.py``).

Each scenario is a deterministic stream of verdicts made from a seed; a rank takes its share of
every step (its requests), in its own order. The parent process feeds one estimator everything
and compares bits.

    python distributed_scenarios.py dp RANK WORLD PORT OUT        # gloo on 127.0.0.1, pooled
    python distributed_scenarios.py mismatch RANK WORLD PORT OUT  # ranks whose rounds differ
    python distributed_scenarios.py tp RANK WORLD - OUT           # no torch.distributed at all
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from av_core import AcceptanceEstimator
from av_core.vllm import OnlineAcceptanceEstimator
from av_core.vllm.selfcheck import _synthetic_steps

#: Shares of the requests per rank in the pooled scenarios; rank 3 serves nothing.
SHARES = (0.45, 0.3, 0.25, 0.0)
NATIVE_K, NATIVE_STEPS, NATIVE_ROWS, NATIVE_ROUND = 3, 24, 12, 6
DROP_IN_M, DROP_IN_K, DROP_IN_STEPS, DROP_IN_INTERVAL, VOCAB = 16, 3, 23, 5, 64


def bits(value: float) -> str:
    return float(value).hex()


def coefficient_bits(slope: float, intercepts: Any) -> list[str]:
    return [bits(slope), *(bits(v) for v in np.asarray(intercepts, dtype=np.float64))]


def native_steps(seed: int = 5) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per step: features [R, K], admitted, accepted, and each row's rank."""
    rng = np.random.default_rng(seed)
    for _ in range(NATIVE_STEPS):
        x = rng.normal(0.0, 3.0, size=(NATIVE_ROWS, NATIVE_K)).astype(np.float32)
        admitted = rng.integers(0, NATIVE_K + 1, size=NATIVE_ROWS)
        accepted = np.minimum(rng.integers(0, NATIVE_K + 1, size=NATIVE_ROWS), admitted)
        owner = rng.choice(len(SHARES), size=NATIVE_ROWS, p=SHARES)
        yield x, admitted, accepted, owner


def new_native(update: str = "map") -> AcceptanceEstimator:
    # The estimator's own round end never fires: the scenario ends rounds after pooling (under
    # map, each rank also fits within the round on its own share, which the round end ignores).
    return AcceptanceEstimator(NATIVE_K, refit_interval=1 << 40, update=update)


def position_counts(round_stats: dict[str, Any]) -> list[int]:
    """Labels per position of a round under either update."""
    if "n" in round_stats:
        return [int(n) for n in round_stats["n"]]
    counts = np.asarray(round_stats["count"], dtype=np.int64).reshape(NATIVE_K, -1)
    return [int(n) for n in counts.sum(axis=1)]


def native_reference(update: str = "map") -> list[list[str]]:
    """One estimator fed every verdict: coefficients after each refit."""
    est, out = new_native(update), []
    for step, (x, admitted, accepted, _) in enumerate(native_steps(), start=1):
        est.observe(x, admitted, accepted)
        if step % NATIVE_ROUND == 0:
            est.refit()
            out.append(coefficient_bits(est.slope, est.intercepts))
    return out


def run_native(rank: int, group: Any, update: str = "map") -> dict[str, Any]:
    from av_core.distributed import pool_round

    est, out, pooled_counts = new_native(update), [], []
    order_rng = np.random.default_rng(100 + rank)
    for step, (x, admitted, accepted, owner) in enumerate(native_steps(), start=1):
        mine = np.flatnonzero(owner == rank)
        if mine.size:
            mine = order_rng.permutation(mine)
            est.observe(x[mine], admitted[mine], accepted[mine])
        if step % NATIVE_ROUND == 0:
            pooled = pool_round(est, group)
            pooled_counts.append(position_counts(pooled))
            est.refit()
            out.append(coefficient_bits(est.slope, est.intercepts))
    return {"coefficients": out, "pooled_counts": pooled_counts}


def slot_owner(slot: int) -> int:
    """The rank serving a request slot: 0, 1, 2 (none on rank 3)."""
    return slot % 3


def drop_in_trace() -> list[dict[str, torch.Tensor]]:
    return list(_synthetic_steps(DROP_IN_STEPS, DROP_IN_M, DROP_IN_K, VOCAB, seed=77))


def drive_drop_in(
    est: OnlineAcceptanceEstimator, trace: list[dict[str, torch.Tensor]], keep: Any, order: Any
) -> list[list[str]]:
    """Feed the rows whose slot ``keep`` accepts, permuted by ``order(n)``; coefficients after
    every step."""
    k, m = est.num_speculative_steps, est.max_num_reqs
    conf = torch.zeros(m + 4, k)
    trajectory = []
    for batch in trace:
        verdict_slots = batch["verdict_idx_mapping"]
        rows = [r for r in range(verdict_slots.shape[0]) if keep(int(verdict_slots[r]))]
        rows = [rows[i] for i in order(len(rows))]
        index = torch.tensor(rows, dtype=torch.int64)
        est.step(
            verdict_slots[index],
            batch["verdict_num_sampled"][index],
            batch["verdict_num_rejected"][index],
        )
        live = batch["idx_mapping"]
        rows = [r for r in range(live.shape[0]) if int(live[r]) >= 0 and keep(int(live[r]))]
        rows = [rows[i] for i in order(len(rows))]
        index = torch.tensor(rows, dtype=torch.int64)
        for position in range(k):
            est.predict(
                batch["logits"][index, position],
                live[index],
                torch.tensor(position),
                conf,
                batch["temperature"],
            )
        trajectory.append(coefficient_bits(*est.host_coefficients))
    return trajectory


def new_drop_in(process_group: Any = None, update: str = "vllm") -> OnlineAcceptanceEstimator:
    est = OnlineAcceptanceEstimator(
        DROP_IN_M, DROP_IN_K, torch.device("cpu"), process_group=process_group, update=update
    )
    est.REFIT_INTERVAL = DROP_IN_INTERVAL
    return est


def drop_in_reference(update: str = "vllm") -> list[list[str]]:
    return drive_drop_in(new_drop_in(update=update), drop_in_trace(), lambda slot: True, range)


def run_drop_in(rank: int, group: Any, update: str = "vllm") -> list[list[str]]:
    rng = np.random.default_rng(200 + rank)
    est = new_drop_in(group, update)
    return drive_drop_in(
        est, drop_in_trace(), lambda slot: slot_owner(slot) == rank, lambda n: rng.permutation(n)
    )


#: Estimators whose rounds have another layout on the last rank than on the others: every rank
#: must refuse (a ValueError on each, nothing added), none may hang or abort.
MISMATCHES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "positions": ({}, {"num_positions": NATIVE_K + 1}),
    "bins": ({"bins": 64}, {"bins": 32}),
    "update": ({"update": "map"}, {"update": "vllm"}),
}


def run_mismatch(rank: int, world: int, group: Any) -> dict[str, str]:
    """Each entry of :data:`MISMATCHES` in turn, on the same group: the error text per case (or
    ``no error``), and ``added`` when the refusal changed this rank's round."""
    from av_core.distributed import pool_round

    out = {}
    x = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)
    for case, (common, last) in MISMATCHES.items():
        options = {"num_positions": NATIVE_K, "refit_interval": 1 << 40, **common}
        if rank == world - 1:
            options.update(last)
        est = AcceptanceEstimator(**options)
        k = est.num_positions
        est.observe(x[:, :k], [k], [1])
        before = est.state_dict()
        try:
            pool_round(est, group)
        except ValueError as error:
            out[case] = f"ValueError: {error}"
        else:
            out[case] = "no error"
        if est.state_dict() != before:
            out[case] += " (added)"
    return out


def join_gloo(rank: int, world: int, port: str) -> Any:
    """This rank joins a gloo group of ``world`` processes on 127.0.0.1: the whole group."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    return dist.group.WORLD


def _leave(group: Any) -> None:
    """Waits until every rank is done with every collective (the process then ends through
    :func:`exit_now`, which tears nothing down)."""
    import torch.distributed as dist

    dist.barrier(group)


def exit_now() -> None:
    """Ends a rank's process once its result file is closed: streams flushed, then
    ``os._exit(0)``. A gloo group torn down at exit (``destroy_process_group`` or the
    interpreter's finalisation) aborts now and then with "terminate called without an active
    exception" while the other rank closes its connection; skipping the teardown leaves nothing
    to race, and the operating system closes the sockets."""
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str]) -> None:
    mode, rank, world, port, out = argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5]
    torch.set_num_threads(1)
    result: dict[str, Any] = {"rank": rank}
    if mode == "dp":
        group = join_gloo(rank, world, port)
        result["native"] = run_native(rank, group)
        result["native_vllm"] = run_native(rank, group, "vllm")
        result["drop_in"] = run_drop_in(rank, group)
        result["drop_in_map"] = run_drop_in(rank, group, "map")
        _leave(group)
    elif mode == "mismatch":
        group = join_gloo(rank, world, port)
        result["mismatch"] = run_mismatch(rank, world, group)
        _leave(group)
    elif mode == "tp":
        for key, update in (("drop_in", "vllm"), ("drop_in_map", "map")):
            rng = np.random.default_rng(300 + rank)
            result[key] = drive_drop_in(
                new_drop_in(update=update),
                drop_in_trace(),
                lambda slot: True,
                lambda n, rng=rng: rng.permutation(n),
            )
        result["torch_distributed_initialized"] = bool(
            torch.distributed.is_available() and torch.distributed.is_initialized()
        )
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    with open(out, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(sys.argv)
    exit_now()
