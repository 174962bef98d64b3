"""Runs every benchmark, writes benches/results.json and benches/results.md, and (with
--update-readme) replaces the benchmark table in README.md between its markers.

    python benches/run.py [--quick] [--update-readme] [--figures-only] [--only GLOB ...]
                          [--output PATH]

``--only GLOB`` (repeatable) runs just the rows whose name matches a shell-style pattern, for
example ``--only "whole step*" --only "VerificationPlanner.plan*"``, and merges them into the
saved results: each re-run row replaces the saved row of the same name, the others stay, so the
table and the figures keep every row. Modules whose ``run`` takes ``only`` time only the matching
rows; a module without it runs only when a pattern names the module itself (``bench_stress``).
A full run takes about three minutes on the 2-core development machine (the whole-step rows
about 25 s of it).

Time the module a user gets: the release profile (``pip install .``; fat LTO, one codegen unit).
A build without LTO and with 16 codegen units made ``observe`` about 7× slower in one comparison
(55 µs against 8 µs at R = 256, K = 8, same machine, minutes apart; the cause was not
investigated).

Each benchmark module exposes ``run(quick) -> list[dict]``; every row times av_core and a
reference implementation of the same math in the same run. Rows are normalized here to: name,
median and interquartile range (microseconds), the reference and its median, the figure of merit
(speedup = reference / av_core, or ratio = av_core / reference where the target is a ratio), the
target of docs/design.md ("Performance targets") and pass/miss.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import inspect
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODULES = [
    "bench_estimator",
    "bench_planner",
    "bench_features",
    "bench_vllm",
    "bench_vllm_metrics",
    "bench_stress",
    "bench_persist",
]
README_START = "<!-- benchmarks:start -->"
README_END = "<!-- benchmarks:end -->"
ROOT = HERE.parent
#: The prose files whose figure spans are filled from the results.
FIGURE_FILES = ("README.md", "docs/planner.md", "docs/drafting-depth.md", "docs/reliability.md")
SPAN = re.compile(r"<!--b:(?P<spec>[^>]*?)-->(?P<value>.*?)<!--/b-->", re.S)


def _us(row: dict[str, Any], stem: str) -> float | None:
    if f"{stem}_us" in row:
        return float(row[f"{stem}_us"])
    if f"{stem}_ms" in row:
        return float(row[f"{stem}_ms"]) * 1e3
    return None


def normalize(module: str, row: dict[str, Any]) -> dict[str, Any]:
    reference_median = _us(row, "reference_median")
    if reference_median is None:
        reference_median = _us(row, "baseline_median")
    figure, value = None, None
    if "speedup" in row:
        figure, value = "speedup", float(row["speedup"])
    elif "ratio" in row:
        figure, value = "ratio", float(row["ratio"])
    target = row.get("target")
    return {
        "module": module,
        "group": row.get("group", module.removeprefix("bench_")),
        "name": row["name"],
        "median_us": _us(row, "median"),
        "q1_us": _us(row, "q1"),
        "q3_us": _us(row, "q3"),
        "reference": row.get("reference", row.get("baseline")),
        "reference_median_us": reference_median,
        "figure": figure,
        "value": value,
        "target": None if target is None else str(target),
        "pass": row.get("pass"),
        "raw": row,
    }


def name_filter(patterns: list[str] | None) -> Any:
    """Whether a row (or module) name matches one of the shell-style patterns (all without)."""
    if not patterns:
        return None
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _call(function: Any, quick: bool, only: Any) -> list[dict[str, Any]]:
    if only is not None and "only" in inspect.signature(function).parameters:
        rows: list[dict[str, Any]] = function(quick, only=only)
        return rows
    rows = function(quick)
    return rows


def run_all(
    quick: bool, patterns: list[str] | None = None, tolerant: bool = False
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every module's rows and a note per module. ``tolerant``: a module that raises (an older
    build without an API a benchmark calls) is noted and its rows left out."""
    sys.path.insert(0, str(HERE))
    only = name_filter(patterns)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as error:
            notes.append(f"{name}: skipped ({error})")
            continue
        filters = "only" in inspect.signature(module.run).parameters
        if only is not None and not filters and not only(name):
            continue
        start = time.perf_counter()
        try:
            module_rows = _call(module.run, quick, only if filters else None)
            if hasattr(module, "scaling"):
                module_rows += _call(module.scaling, quick, only if filters else None)
        except Exception as error:
            if not tolerant:
                raise
            notes.append(f"{name}: failed ({type(error).__name__}: {error})")
            continue
        rows += [normalize(name, r) for r in module_rows]
        notes.append(f"{name}: {len(module_rows)} rows in {time.perf_counter() - start:.0f} s")
    return rows, notes


def merged(saved: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The saved rows with each fresh row in place of the saved row of its name; fresh rows
    without one follow the last saved row of their module (or come last)."""
    by_name = {row["name"]: row for row in fresh}
    out = [by_name.pop(row["name"], row) for row in saved]
    for row in fresh:
        if row["name"] not in by_name:
            continue
        at = max(
            (i + 1 for i, saved_row in enumerate(out) if saved_row["module"] == row["module"]),
            default=len(out),
        )
        out.insert(at, row)
        del by_name[row["name"]]
    return out


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _cpu() -> str:
    """The processor's model name and its widest vector extension (the CPU decides the figures:
    a different model gives different ratios), from ``/proc/cpuinfo`` where there is one."""
    try:
        info = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return platform.machine()
    first = info.split("\n\n", 1)[0]  # the first processor's block
    fields = {
        key.strip(): value.strip()
        for key, value in (line.split(":", 1) for line in first.splitlines() if ":" in line)
    }
    model = fields.get("model name") or platform.machine()
    flags = fields.get("flags", "").split()
    vectors = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {vectors}"


def markdown(rows: list[dict[str, Any]], notes: list[str]) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {_cpu()} "
        f"({os.cpu_count()} CPUs), Python {platform.python_version()}; "
        "medians of interleaved repeats, IQR in brackets.",
        "",
        "| benchmark | av_core µs | reference | reference µs | figure | target | |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["group"] in ("scaling", "stress"):
            continue
        spread = f" [{_fmt(r['q1_us'])}, {_fmt(r['q3_us'])}]" if r["q1_us"] is not None else ""
        figure = "-" if r["figure"] is None else f"{r['figure']} {_fmt(r['value'])}"
        verdict = {True: "pass", False: "**miss**", None: ""}[r["pass"]]
        lines.append(
            f"| {r['name']} | {_fmt(r['median_us'])}{spread} | {r['reference'] or '-'} | "
            f"{_fmt(r['reference_median_us'])} | {figure} | {r['target'] or '-'} | {verdict} |"
        )
    scaling = [r for r in rows if r["group"] == "scaling"]
    if scaling:
        exponents = {r["raw"].get("growth_exponent") for r in scaling}
        lines += ["", "Scaling with R (cost per call, µs):", ""]
        lines.append("| " + " | ".join(r["name"] for r in scaling) + " |")
        lines.append("|" + "---|" * len(scaling))
        lines.append("| " + " | ".join(_fmt(r["median_us"]) for r in scaling) + " |")
        lines.append("")
        lines.append(
            "Fitted growth exponents (log cost vs log R, R >= 128): "
            + ", ".join(f"{e:.2f}" for e in sorted(e for e in exponents if e is not None))
            + " (1.0 = linear)."
        )
    stress = [r for r in rows if r["group"] == "stress"]
    if stress:
        lines += [
            "",
            "Observation throughput (labeled observations per second, one estimator):",
            "",
        ]
        lines += ["| producers | av_core | numpy, 1 thread |", "|---|---|---|"]
        for r in stress:
            raw = r["raw"]
            lines.append(
                f"| {r['name']} | {raw['observations_per_s'] / 1e6:.1f} M/s | "
                f"{raw['reference_observations_per_s'] / 1e6:.2f} M/s |"
            )
    lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def figure(rows: list[dict[str, Any]], spec: str) -> str:
    """The text of one figure span (see the module docs)."""
    parts = spec.split("|")
    if len(parts) not in (3, 4):
        raise ValueError(f"figure span {spec!r}: expected NAME|FIELD|FORMAT[|min|max]")
    name, field, fmt = parts[:3]
    if "*" in name:  # a pattern; "[" is literal (row names hold shapes like [448, 129280])
        pattern = name.replace("[", "[[]")
        matches = [r for r in rows if fnmatch.fnmatchcase(r["name"], pattern)]
    else:
        matches = [r for r in rows if r["name"] == name]
    if not matches:
        raise ValueError(f"figure span {spec!r}: no benchmark row is called {name!r}")
    if len(matches) > 1 and len(parts) != 4:
        raise ValueError(f"figure span {spec!r}: {len(matches)} rows match; add |min or |max")
    scale = 1.0
    if "/" in field:
        field, divisor = field.split("/")
        scale = 1.0 / float(divisor)
    if field == "verdict":
        verdicts = {r["pass"] for r in matches}
        if len(verdicts) != 1:
            raise ValueError(f"figure span {spec!r}: the rows disagree on pass/miss")
        return {True: "pass", False: "miss", None: "no target"}[verdicts.pop()]
    values = []
    for r in matches:
        value = r["raw"][field[4:]] if field.startswith("raw.") else r[field]
        values.append(float(value) * scale)
    chosen = values[0] if len(parts) == 3 else {"min": min, "max": max}[parts[3]](values)
    return format(chosen, fmt)


def fill_figures(text: str, rows: list[dict[str, Any]]) -> str:
    return SPAN.sub(lambda m: f"<!--b:{m['spec']}-->{figure(rows, m['spec'])}<!--/b-->", text)


def stale_figures(text: str, rows: list[dict[str, Any]]) -> list[str]:
    """Each span whose shown value differs from the results, as 'spec: shown, expected'."""
    return [
        f"{m['spec']}: shows {m['value']!r}, results give {figure(rows, m['spec'])!r}"
        for m in SPAN.finditer(text)
        if m["value"] != figure(rows, m["spec"])
    ]


def update_figures(rows: list[dict[str, Any]]) -> None:
    for name in FIGURE_FILES:
        path = ROOT / name
        text = path.read_text()
        filled = fill_figures(text, rows)
        if filled != text:
            path.write_text(filled)


def update_readme(table: str) -> None:
    readme = HERE.parent / "README.md"
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        raise SystemExit(f"README.md lacks the markers {README_START} / {README_END}")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_START}\n{table}{README_END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--update-readme", action="store_true")
    parser.add_argument(
        "--figures-only",
        action="store_true",
        help="refill the prose figures from the saved results.json; run nothing",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="GLOB",
        help="run only the rows matching this pattern (repeatable); merge into the saved results",
    )
    parser.add_argument(
        "--output",
        metavar="PATH",
        help="write the rows as JSON to PATH and nothing else (a module that fails is left out)",
    )
    args = parser.parse_args()
    if args.figures_only:
        update_figures(json.loads((HERE / "results.json").read_text()))
        return
    start = time.perf_counter()
    rows, notes = run_all(args.quick, args.only, tolerant=args.output is not None)
    if args.output:
        Path(args.output).write_text(json.dumps({"rows": rows, "notes": notes}, default=str))
        return
    notes.append(f"total {time.perf_counter() - start:.0f} s")
    if args.only:
        rows = merged(json.loads((HERE / "results.json").read_text()), rows)
        saved_notes = [
            line[2:]
            for line in (HERE / "results.md").read_text().splitlines()
            if line.startswith("- ")
        ]
        rerun = f"re-run {time.strftime('%Y-%m-%d')}: {', '.join(args.only)}"
        notes = saved_notes + [f"{rerun} ({'; '.join(notes)})"]
    (HERE / "results.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    table = markdown(rows, notes)
    (HERE / "results.md").write_text(table)
    print(table)
    if args.update_readme:
        update_readme(table)
        update_figures(rows)


if __name__ == "__main__":
    main()
