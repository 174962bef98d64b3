"""Figures quoted in README.md and docs/ agree with the scripts that measure them.

Benchmark figures are spans filled by ``python benches/run.py --update-readme`` from
``benches/results.json``; figures that depend on randomness (seeds, bootstrap resamples) are
spans and tables filled by ``python scripts/seed_study.py --update-docs`` from
``scripts/seed_study.json``. A hand edit of a figure, or a rerun that was not written back,
fails here. The README's prose may not quote a latency outside a span, so a new figure cannot
slip in by hand either."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(path: Path) -> ModuleType:
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


@pytest.fixture(scope="module")
def bench_run() -> ModuleType:
    return load(ROOT / "benches" / "run.py")


@pytest.fixture(scope="module")
def seed_study() -> ModuleType:
    return load(ROOT / "scripts" / "seed_study.py")


@pytest.fixture(scope="module")
def bench_rows() -> list[dict]:  # type: ignore[type-arg]
    rows: list[dict] = json.loads((ROOT / "benches" / "results.json").read_text())  # type: ignore[type-arg]
    return rows


@pytest.mark.parametrize(
    "name", ["README.md", "docs/planner.md", "docs/drafting-depth.md", "docs/reliability.md"]
)
def test_benchmark_figures_match_results_json(
    bench_run: ModuleType,
    bench_rows: list[dict],
    name: str,  # type: ignore[type-arg]
) -> None:
    assert name in bench_run.FIGURE_FILES
    text = (ROOT / name).read_text()
    assert bench_run.stale_figures(text, bench_rows) == []


def test_readme_table_is_the_latest_results(bench_run: ModuleType) -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split(bench_run.README_START, 1)[1].split(bench_run.README_END, 1)[0]
    assert table.strip() == (ROOT / "benches" / "results.md").read_text().strip()


@pytest.mark.parametrize(
    "name",
    [
        "README.md",
        "docs/memory.md",
        "docs/reliability.md",
        "docs/drafting-depth.md",
        "docs/simulate.md",
    ],
)
def test_seed_study_figures_match_its_json(seed_study: ModuleType, name: str) -> None:
    assert name in seed_study.DOC_FILES
    figures = json.loads((ROOT / "scripts" / "seed_study.json").read_text())["figures"]
    assert seed_study.stale_spans((ROOT / name).read_text(), figures) == []


def test_seed_study_covers_twenty_seeds() -> None:
    meta = json.loads((ROOT / "scripts" / "seed_study.json").read_text())["meta"]
    assert meta["seeds"] >= 20 and meta["resamples"] >= 1000


def test_readme_prose_quotes_latencies_only_through_spans(bench_run: ModuleType) -> None:
    readme = (ROOT / "README.md").read_text()
    head, rest = readme.split(bench_run.README_START, 1)
    _, tail = rest.split(bench_run.README_END, 1)
    prose = bench_run.SPAN.sub("", head + tail)
    prose = re.sub(r"```.*?```", "", prose, flags=re.S)
    # Targets ("≤ 5 µs", "a 5 µs target") are not measurements.
    prose = re.sub(r"≤\s*\d[\d.,]*\s*µs|\d[\d.,]*\s*µs\s+target", "", prose)
    assert re.findall(r"\d[\d.,]*\s*(?:µs|us)\b", prose) == []


def test_estimator_doc_tables_match_the_cold_start_study_json() -> None:
    # docs/estimator.md's before/after, switch and benchmark tables are rendered from
    # scripts/cold_start_study.json (python scripts/cold_start_study.py --json --update-docs).
    path = ROOT / "scripts" / "cold_start_study.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    study = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = study  # its dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(study)
    finally:
        sys.modules.pop(path.stem, None)
    figures = json.loads((ROOT / "scripts" / "cold_start_study.json").read_text())
    text = (ROOT / "docs" / "estimator.md").read_text()
    blocks = {m["name"] for m in study.BLOCK.finditer(text)}
    assert blocks == {"main", "switch", "bench"}
    assert study.stale_blocks(text, figures) == []
    # Every configuration of the issue on both traces, before and after.
    cells = {(r["trace"], r["refit"], r["batch"], r["scheme"]) for r in figures["main"]}
    assert len(cells) == 2 * 4 * 2
