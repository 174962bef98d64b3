"""What pooled statistics across data-parallel ranks buy, on the shipped traces.

Each shipped trace is served by 4 simulated data-parallel ranks: every request goes to one rank
(at random, one assignment per seed), and the ranks step in lockstep, one drafting round of their
own per engine step (a rank whose requests are done steps with nothing). Every
``--interval`` engine steps each rank refits, either **alone** (on its own round, what vLLM's
estimator does on each rank) or **pooled** (on the sum of the four rounds, exactly what
``av_core.distributed.pool_round`` computes with an all-reduce; here summed in-process with
``add_round_stats``). Every draft is scored prequentially: by the coefficients its rank held when
it was drafted.

Reported per rank, over ``--seeds`` assignments (median and worst): the prequential log-loss,
the coefficient jitter (RMS change of the K + 1 coefficients from one refit to the next after
``--warmup`` refits) and, for alone, the spread of the coefficients across ranks (RMS difference
from their mean at each refit; pooled ranks hold identical bits, 0). The estimator is the vLLM
drop-in's (vLLM's update, ``update="vllm"``, memoryless, gamma = 0) unless ``--memory`` says
otherwise; manual (``refit_interval=None``), refitted by the study's own schedule.

    python scripts/pooling_study.py [--seeds 20] [--interval 25] [--memory 0]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from av_core import AcceptanceEstimator
from av_core.tools.evaluate import MAX_FEATURE, DraftRounds, fit_batch
from av_core.tools.synthetic import SyntheticWorkload, labeled_log_loss
from av_core.tools.trace import SHIPPED_TRACES, load_shipped_trace

RANKS = 4
STATS = ("a", "b", "c", "g0", "g1", "n")


def pool(estimators: list[AcceptanceEstimator]) -> None:
    """Every estimator's open round becomes the sum of all of them (exact integers)."""
    rounds = [est.state_dict()["round_stats"] for est in estimators]
    total = {
        name: [sum(r[name][i] for r in rounds) for i in range(len(rounds[0]["n"]))]
        for name in STATS
    }
    for est, mine in zip(estimators, rounds, strict=True):
        others = {"fraction_bits": mine["fraction_bits"]}
        others.update(
            {name: [t - m for t, m in zip(total[name], mine[name], strict=True)] for name in STATS}
        )
        est.add_round_stats(others)


def serve(
    rounds: DraftRounds,
    x: np.ndarray,
    owner: np.ndarray,
    pooled: bool,
    interval: int,
    memory: float,
) -> dict[str, Any]:
    """One assignment of requests to ranks, served alone or pooled."""
    k = rounds.num_positions
    queues = [np.flatnonzero(owner == r) for r in range(RANKS)]
    estimators = [
        AcceptanceEstimator(k, refit_interval=None, memory=memory, update="vllm")
        for _ in range(RANKS)
    ]
    loss_sum = np.zeros(RANKS)
    labels = np.zeros(RANKS, dtype=np.int64)
    history: list[np.ndarray] = []  # [refit] -> [rank, K + 1]
    verified = rounds.num_verified.astype(np.int64)
    accepted = rounds.num_accepted.astype(np.int64)
    steps = max(len(q) for q in queues)
    for step in range(steps):
        for rank, est in enumerate(estimators):
            if step >= len(queues[rank]):
                continue
            row = queues[rank][step]
            features = x[row : row + 1]
            p = est.predict(features).astype(np.float64)[0]
            labeled = rounds.labels[row] >= 0
            y = rounds.labels[row][labeled] == 1
            q = np.clip(p[labeled], 1e-15, 1 - 1e-15)
            loss_sum[rank] -= np.sum(np.where(y, np.log(q), np.log1p(-q)))
            labels[rank] += int(labeled.sum())
            est.observe(
                features,
                verified[row : row + 1],
                accepted[row : row + 1],
                p[None, :].astype(np.float32),
            )
        if (step + 1) % interval == 0:
            if pooled:
                pool(estimators)
            for est in estimators:
                est.refit()
            history.append(np.array([[est.slope, *est.intercepts] for est in estimators]))
    return {
        "log_loss": loss_sum / np.maximum(labels, 1),
        "labels": labels,
        "history": np.array(history),
    }


def summarize(result: dict[str, Any], warmup: int, target: np.ndarray) -> dict[str, np.ndarray]:
    history = result["history"][warmup:]  # [refits, ranks, K + 1]
    steps = np.diff(history, axis=0)
    return {
        "log_loss": result["log_loss"],
        # Refit-to-refit RMS change of the coefficients, per rank.
        "jitter": np.sqrt(np.mean(steps**2, axis=(0, 2))),
        # RMS distance from the batch fit of the whole trace, per rank.
        "error": np.sqrt(np.mean((history - target) ** 2, axis=(0, 2))),
        # RMS difference between the ranks' coefficients at each refit.
        "spread": np.array(np.sqrt(np.mean((history - history.mean(axis=1, keepdims=True)) ** 2))),
    }


def synthetic(
    pooled: bool, seed: int, memory: float, rounds: int = 50, warmup: int = 15
) -> dict[str, np.ndarray]:
    """A stationary workload (docs/memory.md's: slope 0.55, intercepts 1.4 0.9 0.5 0.1), 10
    requests per engine step dealt at random to the 4 ranks, 100 engine steps per round."""
    workload = SyntheticWorkload(slope=0.55, intercepts=(1.4, 0.9, 0.5, 0.1))
    rng = np.random.default_rng(1000 + seed)
    k = workload.num_positions
    estimators = [
        AcceptanceEstimator(k, refit_interval=None, memory=memory, update="vllm")
        for _ in range(RANKS)
    ]
    history = []
    for _ in range(rounds):
        for _ in range(100):
            counts = np.bincount(rng.integers(0, RANKS, 10), minlength=RANKS)
            for est, count in zip(estimators, counts, strict=True):
                if count:
                    s = workload.step(rng, int(count))
                    est.observe(s.features, s.num_admitted, s.num_accepted, est.predict(s.features))
        if pooled:
            pool(estimators)
        for est in estimators:
            est.refit()
        history.append([[est.slope, *est.intercepts] for est in estimators])
    h = np.array(history)[warmup:]  # [rounds, ranks, K + 1]
    truth = np.array([workload.slope, *workload.intercepts])
    return {
        "jitter": h.std(axis=0).max(axis=1),  # per rank: the worst coefficient's std
        "excess": np.array([labeled_log_loss(e, workload) for e in estimators])
        - labeled_log_loss(None, workload),
        "error": np.sqrt(np.mean((h - truth) ** 2, axis=(0, 2))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--interval", type=int, default=25, help="engine steps per refit")
    parser.add_argument("--warmup", type=int, default=3, help="refits left out of the jitter")
    parser.add_argument("--memory", type=float, default=0.0, help="estimator memory gamma")
    args = parser.parse_args()
    print(
        f"4 ranks, refit every {args.interval} engine steps, memory {args.memory:g}, "
        f"{args.seeds} random assignments of requests to ranks; per rank: median (worst)\n"
    )
    print(
        "| trace | refits | log-loss alone | log-loss pooled | jitter alone | jitter pooled "
        "| error alone | error pooled | spread across ranks alone |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in SHIPPED_TRACES:
        trace = load_shipped_trace(name)
        rounds = DraftRounds.from_trace(trace)
        x = np.ascontiguousarray(
            np.clip(rounds.column(trace.logit_q_max), -MAX_FEATURE, MAX_FEATURE), dtype=np.float32
        )
        labeled = rounds.labels >= 0
        positions = np.broadcast_to(np.arange(rounds.num_positions), labeled.shape)[labeled]
        batch = fit_batch(x[labeled], positions, rounds.labels[labeled], rounds.num_positions)
        target = np.array([batch.slope, *batch.intercepts])
        requests = np.unique(rounds.request_id)
        figures: dict[str, dict[str, list[np.ndarray]]] = {"alone": {}, "pooled": {}}
        refits = 0
        for seed in range(args.seeds):
            rng = np.random.default_rng(seed)
            ranks = rng.integers(0, RANKS, requests.size).tolist()
            rank_of = dict(zip(requests.tolist(), ranks, strict=True))
            owner = np.array([rank_of[r] for r in rounds.request_id.tolist()])
            for mode in ("alone", "pooled"):
                result = serve(rounds, x, owner, mode == "pooled", args.interval, args.memory)
                refits = len(result["history"])
                for key, value in summarize(result, args.warmup, target).items():
                    figures[mode].setdefault(key, []).append(value)
        short = name.removeprefix("qwen2.5-coder-1.5b_0.5b_k4_").removesuffix(".csv.gz")
        row = [short, str(refits)]
        for key, digits in (("log_loss", 4), ("jitter", 3), ("error", 3)):
            row += [cell(figures, "alone", key, digits), cell(figures, "pooled", key, digits)]
        row.append(cell(figures, "alone", "spread", 3))
        print("| " + " | ".join(row) + " |")

    print(
        "\nStationary synthetic workload (slope 0.55, intercepts 1.4 0.9 0.5 0.1), 10 requests "
        "per engine step dealt to the 4 ranks, 100 steps per round, 35 rounds after 15; "
        "per rank: median (worst)\n"
    )
    print(
        "| | jitter (std of the worst coefficient) | excess log-loss over the true model "
        "| RMS error vs the true coefficients |"
    )
    print("|---|---|---|---|")
    for mode in ("alone", "pooled"):
        figures = {"": {}}
        for seed in range(args.seeds):
            for key, value in synthetic(mode == "pooled", seed, args.memory).items():
                figures[""].setdefault(key, []).append(value)
        row = [mode] + [cell(figures, "", key, 4) for key in ("jitter", "excess", "error")]
        print("| " + " | ".join(row) + " |")


def cell(figures: dict[str, dict[str, list[np.ndarray]]], mode: str, key: str, digits: int) -> str:
    values = np.concatenate([np.atleast_1d(v) for v in figures[mode][key]])
    return f"{np.median(values):.{digits}f} ({values.max():.{digits}f})"


if __name__ == "__main__":
    main()
