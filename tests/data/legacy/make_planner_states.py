"""Writes the cost tables and verification planners an av_core build saves, and what that build
does next with them, to ``tests/data/legacy/planner_<build>.json.gz``: the fixtures of
``tests/persist/test_legacy_planner_and_tables.py``.

Run it with an earlier build of av_core importable (a worktree of that commit, its extension
built into its ``python/av_core/``), e.g.::

    git worktree add --detach /tmp/old 7a95997
    cd /tmp/old && cargo build -p av_core_py
    cp target/debug/lib_native.so python/av_core/_native.abi3.so
    PYTHONPATH=/tmp/old/python python tests/data/legacy/make_planner_states.py 7a95997

Cost tables are recorded in every form the build writes: ``to_json``, ``to_bytes`` (builds
since the one persistence module) and pickles, with what the build computes from them next (the
tables' values, a verification plan and, where the build has depth tables, a depth decision).
Planners are driven through a fixed workload (plans, depth decisions and remembered rows where
the build has them; both budget sources; exploration on and off; with and without a depth
table) and recorded as ``to_bytes`` and pickles (where the build pickles planners), with every
slot's remembered confidences and the build's next steps from the saved state: each plan's
budget, assignment, expected tokens and cost, each depth decision, and the remembered rows and
bytes after them; once with the workload's scheduled drafts, and once with every request drafting
all K positions (the first builds remembered whole rows even where fewer were drafted).
Only what the build has is used (the first planners had no depth tables, no ``remember`` and
no pickling).
"""

from __future__ import annotations

import base64
import gzip
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

import av_core
from av_core import CostTables, VerificationPlanner

#: name: (draft_ms, verify_ms, draft_depth_ms or None). Values with long decimal expansions,
#: so that the JSON text's number formatting matters.
TABLES: dict[str, tuple[list[float], list[float], list[float] | None]] = {
    "plain": (
        [0.0, 0.37, 0.71, 1.0 / 3.0 + 0.5, 1.9, 2.0, 2.2, 2.21, 2.5],
        [1.0 + t / 7.0 + (t % 3) * 0.013 for t in range(41)],
        None,
    ),
    "steep": (
        [0.0, 2.5, 2.75, 3.125, 3.3, 3.9, 4.0, 4.0, 4.5],
        [0.1 * 1.07**t for t in range(60)],
        None,
    ),
    "depth": (
        [0.0, 0.37, 0.71, 1.0 / 3.0 + 0.5, 1.9, 2.0, 2.2, 2.21, 2.5],
        [1.0 + t / 7.0 + (t % 3) * 0.013 for t in range(41)],
        [0.0, 0.45, 0.9, 1.1 / 3.0 + 1.0, 1.75],
    ),
    "depth_wide": (
        [0.0, 1.0, 1.2, 1.3, 1.45, 1.5, 1.6, 1.7, 1.8],
        [2.0 + 0.05 * t + 1e-7 * t * t for t in range(80)],
        [0.0, 0.6, 1.1, 1.5, 1.8, 2.05, 2.25, 2.4, 2.5],
    ),
}

#: name: (tables, K, num_slots, budget_source, exploration, seed, steps, depth mode or None).
PLANNERS: dict[str, tuple[str, int, int, str, float, int, int, str | None]] = {
    "fresh": ("plain", 3, 4, "previous", 0.01, 0, 0, None),
    "previous_explore": ("plain", 3, 6, "previous", 0.3, 7, 5, None),
    "current_no_explore": ("steep", 4, 8, "current", 0.0, 0, 4, None),
    "previous_default_exploration": ("plain", 2, 5, "previous", -1.0, 0, 6, None),
    "depth_batch": ("depth", 4, 6, "current", 0.5, 11, 6, "batch"),
    "depth_per_request": ("depth_wide", 8, 5, "previous", 0.2, 3, 5, "per_request"),
    "depth_table_no_decisions": ("depth", 4, 4, "previous", 0.4, 5, 3, None),
}

#: Steps each saved planner takes next (the continuation the current build must reproduce).
NEXT_STEPS = 5


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def f64bits(values: Any) -> list[str]:
    return [float(v).hex() for v in np.asarray(values, dtype=np.float64).ravel()]


def has_depth() -> bool:
    return hasattr(CostTables, "with_draft_depth")


def tables_of(name: str) -> CostTables:
    draft, verify, depth = TABLES[name]
    tables = CostTables(np.array(draft), np.array(verify))
    if depth is not None:
        tables = tables.with_draft_depth(np.array(depth))
    return tables


def tables_values(tables: CostTables) -> dict[str, Any]:
    depth = getattr(tables, "draft_depth_ms", None)
    return {
        "draft_ms": f64bits(tables.draft_ms),
        "verify_ms": f64bits(tables.verify_ms),
        "draft_depth_ms": None if depth is None else f64bits(depth),
        "max_num_reqs": tables.max_num_reqs,
        "max_batch_tokens": tables.max_batch_tokens,
    }


def pickles(obj: Any) -> dict[str, str]:
    """The object's pickles at protocols 2 and 5, or none if the build cannot pickle it."""
    out = {}
    for protocol in (2, 5):
        try:
            out[str(protocol)] = b64(pickle.dumps(obj, protocol=protocol))
        except (TypeError, pickle.PicklingError):
            return {}
    return out


def workload(seed: int, k: int, num_slots: int, steps: int) -> list[dict[str, Any]]:
    """``steps`` decode steps: the slots, confidences, scheduled drafts and depth caps."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        rows = int(rng.integers(1, num_slots + 1))
        slots = np.sort(rng.choice(num_slots, size=rows, replace=False)).astype(np.int64)
        confidences = rng.uniform(0.02, 0.98, size=(rows, k))
        confidences[rng.random((rows, k)) < 0.1] = 1.0
        scheduled = rng.integers(0, k + 1, size=rows).astype(np.int64)
        max_depths = rng.integers(0, k + 1, size=rows).astype(np.int64)
        out.append(
            {
                "slots": slots,
                "confidences": confidences,
                "scheduled": scheduled,
                "max_depths": max_depths,
                "non_draft": rows + int(rng.integers(0, 3)),
                "sampling": rows,
                "cap": None if rng.random() < 0.7 else int(rng.integers(0, rows * k + 1)),
            }
        )
    return out


def plan_record(plan: Any) -> dict[str, Any]:
    return {
        "budget": plan.budget,
        "admitted": [int(a) for a in plan.admitted],
        "expected_accepted_tokens": float(plan.expected_accepted_tokens).hex(),
        "predicted_cost_ms": float(plan.predicted_cost_ms).hex(),
    }


def depth_record(plan: Any) -> dict[str, Any]:
    return {
        "depths": [int(d) for d in plan.depths],
        "max_depth": plan.max_depth,
        "drafts": plan.drafts,
        "budget": plan.budget,
        "expected_accepted_tokens": float(plan.expected_accepted_tokens).hex(),
        "predicted_cost_ms": float(plan.predicted_cost_ms).hex(),
    }


def step(planner: VerificationPlanner, s: dict[str, Any], mode: str | None) -> dict[str, Any]:
    """One decode step: a depth decision (when ``mode``), then the plan."""
    out: dict[str, Any] = {}
    if mode is not None:
        out["depth"] = depth_record(
            planner.choose_draft_depth(
                s["slots"],
                s["max_depths"],
                num_non_draft_tokens=s["non_draft"],
                num_sampling_requests=s["sampling"],
                max_draft_budget=s["cap"],
                mode=mode,
            )
        )
    out["plan"] = plan_record(
        planner.plan(
            s["slots"],
            s["confidences"],
            s["scheduled"],
            num_non_draft_tokens=s["non_draft"],
            num_sampling_requests=s["sampling"],
            max_draft_budget=s["cap"],
        )
    )
    return out


def remembered(planner: VerificationPlanner) -> list[list[str]]:
    return [f64bits(planner.previous_confidences(s)) for s in range(planner.num_slots)]


def drive(name: str) -> tuple[VerificationPlanner, int, str | None]:
    tables, k, slots, source, exploration, seed, steps, mode = PLANNERS[name]
    options: dict[str, Any] = {"num_slots": slots, "budget_source": source}
    if exploration >= 0.0:
        options.update(exploration=exploration, exploration_seed=seed)
    planner = VerificationPlanner(tables_of(tables), k, **options)
    for i, s in enumerate(workload(100 + seed, k, slots, steps)):
        if mode is not None and i == 2 and hasattr(planner, "remember"):
            # A step planned elsewhere: the engine hands the planner the rows it drafted.
            planner.remember(s["slots"], s["confidences"], s["scheduled"])
            continue
        if i == 3:
            planner.add_request(int(s["slots"][0]))  # a slot handed to a new request
        step(planner, s, mode)
    return planner, k, mode


def record_planner(name: str) -> dict[str, Any]:
    planner, _, _ = drive(name)
    record: dict[str, Any] = {
        "bytes": b64(planner.to_bytes()),
        "pickles": pickles(planner),
        "num_slots": planner.num_slots,
        "num_positions": planner.num_positions,
        "budget_source": planner.budget_source,
        "exploration": float(planner.exploration).hex(),
        "remembered": remembered(planner),
        "tables": tables_values(planner.cost_tables),
    }
    twin = planner.copy()
    for key, full, p in (("next", False, planner), ("next_full", True, twin)):
        record[key] = continuation(p, name, full)
    return record


def next_workload(name: str, full: bool) -> list[dict[str, Any]]:
    """The steps after the save; ``full``: every request drafts all K positions (where the
    rules of every build store the same rows)."""
    _, k, slots, _, _, seed, _, _ = PLANNERS[name]
    steps = workload(7 + seed, k, slots, NEXT_STEPS)
    if full:
        for s in steps:
            s["scheduled"][:] = k
            s["max_depths"][:] = k
    return steps


def continuation(planner: VerificationPlanner, name: str, full: bool) -> dict[str, Any]:
    """What ``planner`` does next: each step's depth decision and plan, then its remembered
    rows and bytes."""
    mode = PLANNERS[name][7]
    steps = [step(planner, s, mode) for s in next_workload(name, full)]
    return {"steps": steps, "remembered": remembered(planner), "bytes": b64(planner.to_bytes())}


def record_tables(name: str) -> dict[str, Any]:
    tables = tables_of(name)
    record: dict[str, Any] = {
        "json": tables.to_json(),
        "bytes": b64(tables.to_bytes()) if hasattr(tables, "to_bytes") else None,
        "pickles": pickles(tables),
        "values": tables_values(tables),
    }
    # What the build computes from the tables next: a plan, and a depth decision.
    k = 4 if TABLES[name][2] is None else len(TABLES[name][2]) - 1
    s = workload(5, k, 4, 1)[0]
    plan = av_core.plan_verification(
        s["confidences"],
        s["scheduled"],
        num_non_draft_tokens=s["non_draft"],
        num_sampling_requests=s["sampling"],
        cost_tables=tables,
    )
    record["plan"] = plan_record(plan)
    if TABLES[name][2] is not None:
        depth = av_core.choose_draft_depth(
            s["confidences"],
            s["max_depths"],
            num_non_draft_tokens=s["non_draft"],
            num_sampling_requests=s["sampling"],
            cost_tables=tables,
        )
        record["depth"] = depth_record(depth)
    return record


def main() -> None:
    build = sys.argv[1]
    depth = has_depth()
    out: dict[str, Any] = {"build": build, "tables": {}, "planners": {}}
    for name, (_, _, table_depth) in TABLES.items():
        if table_depth is None or depth:
            out["tables"][name] = record_tables(name)
    for name, spec in PLANNERS.items():
        if TABLES[spec[0]][2] is None or depth:
            out["planners"][name] = record_planner(name)
    path = Path(__file__).resolve().parent / f"planner_{build}.json.gz"
    text = json.dumps(out, indent=None, separators=(",", ":"), sort_keys=True)
    path.write_bytes(gzip.compress(text.encode(), mtime=0))
    print(f"{path}: {sorted(out['tables'])} {sorted(out['planners'])} ({path.stat().st_size} B)")


if __name__ == "__main__":
    main()
