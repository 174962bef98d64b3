"""Instructions per call of the whole decode step (callgrind), call by call.

The workload of ``bench_planner.step_rows`` (the four public calls of one decode step in
sequence: ``VerificationPlanner.choose_draft_depth``, ``AcceptanceEstimator.predict``,
``VerificationPlanner.plan``, ``AcceptanceEstimator.observe``), run under callgrind with
collection switched on only inside the bindings' methods, so each call's instructions (argument
extraction, copies, the core, the result objects) are counted and the Python loop is not.
Instruction counts are stable on a loaded machine, where timings are not.

    python benches/callgrind_step.py [--rows R] [--positions K] [--steps N] [--warmup W]
                                     [--breakdown] [--keep PATH]

prints the instructions per call of each method and of the four together, and the step's
ratio to one ``predict``; ``--breakdown`` adds each method's callees (inclusive instructions
per call: argument conversion, the core call, the result objects), ``--keep`` keeps the
callgrind output for ``callgrind_annotate``. Needs valgrind. ``--inner`` runs this process's
loop without valgrind (what the outer process runs under it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

#: The bindings' method symbols (demangled) and the names they are reported under.
METHODS = {
    "PyVerificationPlanner::__pymethod_choose_draft_depth__": "choose_draft_depth",
    "PyAcceptanceEstimator::__pymethod_predict__": "predict",
    "PyVerificationPlanner::__pymethod_plan__": "plan",
    "PyAcceptanceEstimator::__pymethod_observe__": "observe",
}


def inner(rows: int, k: int, steps: int, warmup: int) -> None:
    """``warmup + steps`` steps of ``bench_planner``'s whole-step workload."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_planner import StepWorkload, profiled_tables

    work = StepWorkload(rows, k, profiled_tables())
    for _ in range(warmup + steps):
        work.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--positions", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--breakdown", action="store_true", help="each method's callees")
    parser.add_argument("--keep", help="copy the callgrind output here")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args.rows, args.positions, args.steps, args.warmup)
        return
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        toggles = [f"--toggle-collect=*{symbol}*" for symbol in METHODS]
        command = ["valgrind", "--tool=callgrind", "--collect-atstart=no", *toggles]
        command += [f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__)]
        command += ["--inner", f"--rows={args.rows}", f"--positions={args.positions}"]
        command += [f"--steps={args.steps}", f"--warmup={args.warmup}"]
        subprocess.run(command, check=True, capture_output=True)
        report = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        tree = ""
        if args.breakdown:
            tree = subprocess.run(
                ["callgrind_annotate", "--inclusive=yes", "--tree=calling", "--threshold=100", out],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        if args.keep:
            shutil.copyfile(out, args.keep)
    calls = args.steps + args.warmup
    per_call: dict[str, float] = {}
    for line in report.splitlines():
        match = re.match(r"\s*([\d,]+)\s.*?(\S+::__pymethod_\w+__)", line)
        if not match:
            continue
        for symbol, name in METHODS.items():
            if match.group(2).endswith(symbol) and name not in per_call:
                per_call[name] = int(match.group(1).replace(",", "")) / calls
    total = sum(per_call.values())
    print(f"R = {args.rows}, K = {args.positions}, {calls} steps: instructions per call")
    for name in METHODS.values():
        print(f"  {name:20} {per_call.get(name, float('nan')):>10,.0f}")
    print(f"  {'whole step':20} {total:>10,.0f}")
    if per_call.get("predict"):
        print(f"  step / predict       {total / per_call['predict']:>10.2f}")
    if tree:
        print_breakdown(tree, calls)


def print_breakdown(tree: str, calls: int) -> None:
    """Each method's direct callees from ``callgrind_annotate --tree=calling``, per call."""
    blocks = tree.split("\n\n")
    for symbol, name in METHODS.items():
        for block in blocks:
            lines = block.strip().splitlines()
            head = [line for line in lines if "*" in line and symbol in line]
            if not head:
                continue
            print(f"\n{name}: callees, instructions per call")
            for line in lines:
                match = re.match(r"\s*([\d,]+)\s.*?>\s+(.*)", line)
                if match:
                    count = int(match.group(1).replace(",", "")) / calls
                    if count >= 50:
                        print(f"  {count:>10,.0f}  {match.group(2)[:150]}")
            break


if __name__ == "__main__":
    main()
