#!/usr/bin/env python3
"""Interleaved A/B of two builds over the benchmark table: ``benches/run.py`` of this checkout
runs under build A's Python and build B's Python in turn (A B, then B A, ...), so both see the
same machine, and each row's av_core time is compared.

    python scripts/ab_bench.py --a OLD/.venv/bin/python --b NEW/.venv/bin/python \\
        [--rounds 4] [--full] [--only GLOB ...] [--json FILE]

Each build is whatever ``import av_core`` gives under its Python (a venv with a release build:
``maturin develop --release`` or ``pip install .``). A round runs the whole table once under
each build (``--quick`` repeats unless ``--full``). Per row: the median over rounds of av_core's
median time under A and under B, their ratio B / A (above 1: B is slower), and the lowest and
highest per-round ratio (rounds paired in order). Rows one build lacks (a benchmark that calls
an API the older build does not have) are listed as not compared. Prints a markdown table,
worst ratio first, and the count of rows above ``--limit`` (1.05).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def one_run(python: str, quick: bool, only: list[str], out: Path) -> dict[str, float]:
    """The av_core median (µs) of every row of one ``benches/run.py`` run under ``python``."""
    command = [python, str(ROOT / "benches" / "run.py"), "--output", str(out)]
    command += ["--quick"] if quick else []
    for pattern in only:
        command += ["--only", pattern]
    # The benchmarks time one thread; a BLAS pool spinning on the other core is noise.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    subprocess.run(command, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    for note in result["notes"]:
        if "failed" in note:
            print(f"  {Path(python).parent.parent.parent.name}: {note}", file=sys.stderr)
    medians: dict[str, float] = {}
    for row in result["rows"]:
        if row.get("median_us") is None:
            continue
        name, n = row["name"], 1
        while name in medians:  # a row name a module repeats (a scaling series) gets #2, #3
            n += 1
            name = f"{row['name']} #{n}"
        medians[name] = float(row["median_us"])
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="Python of build A (the baseline)")
    parser.add_argument("--b", required=True, help="Python of build B (the candidate)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--full", action="store_true", help="full repeats, not --quick")
    parser.add_argument("--only", action="append", default=[], metavar="GLOB")
    parser.add_argument("--limit", type=float, default=1.05)
    parser.add_argument("--json", help="also write the per-row figures to this file")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    times: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for label in ("a", "b") if i % 2 == 0 else ("b", "a"):
                out = Path(tmp) / f"{label}{i}.json"
                times[label].append(one_run(getattr(args, label), not args.full, args.only, out))
                print(f"round {i + 1}/{args.rounds} {label} done", file=sys.stderr)
    names = list(times["b"][0]) + [n for n in times["a"][0] if n not in times["b"][0]]
    rows: list[dict[str, Any]] = []
    for name in names:
        a = [run[name] for run in times["a"] if name in run]
        b = [run[name] for run in times["b"] if name in run]
        if len(a) < args.rounds or len(b) < args.rounds:
            rows.append({"name": name, "compared": False})
            continue
        paired = [y / x for x, y in zip(a, b, strict=True) if x > 0]
        a_us, b_us = statistics.median(a), statistics.median(b)
        rows.append(
            {
                "name": name,
                "compared": True,
                "a_us": a_us,
                "b_us": b_us,
                "ratio": b_us / a_us if a_us > 0 else float("nan"),
                "lo": min(paired),
                "hi": max(paired),
            }
        )
    compared = sorted((r for r in rows if r["compared"]), key=lambda r: -r["ratio"])
    print(f"Interleaved A/B, {args.rounds} rounds, {time.time() - start:.0f} s.")
    print(f"A = {args.a}\nB = {args.b}\n")
    print("| row | A µs | B µs | B / A | per-round range |")
    print("|---|---|---|---|---|")
    for r in compared:
        print(
            f"| {r['name']} | {r['a_us']:.2f} | {r['b_us']:.2f} | {r['ratio']:.3f} "
            f"| {r['lo']:.3f}–{r['hi']:.3f} |"
        )
    over = [r for r in compared if r["ratio"] > args.limit]
    print(f"\n{len(compared)} rows compared; {len(over)} with B / A above {args.limit}.")
    missing = [r["name"] for r in rows if not r["compared"]]
    if missing:
        print(f"Not compared (a build lacks the row): {', '.join(missing)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
