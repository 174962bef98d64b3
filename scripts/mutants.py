"""Mutation check: applies each listed mutant (one small, realistic bug) to a copy of the
worktree, runs the suites that should catch it, and reports which mutants the tests kill.

    python scripts/mutants.py [--only ID ...] [--markdown] [--keep]

Every mutant names the exact source text it replaces, so a refactor that moves the code makes
the script fail loudly ("mutant X: text not found") instead of silently testing nothing. The
Rust suite is ``cargo test -p av_core --lib --tests`` (unit and integration tests, *no*
doctests: a mutant only a doctest catches counts as surviving). A mutant may also list Python
test files; those run against a native module built from the mutated copy, with hypothesis'
example database off so one mutant's failure cannot be replayed into the next run.

Before any mutant, the unmutated copy runs the same suites; a test that fails there is
reported and excluded (``--skip``) so it cannot pass for a kill. Exit status 1 if any mutant
survives. About 1 minute per Rust-only mutant and 2-3 per mutant with Python suites on two
cores (incremental builds in a shared target directory).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUST = "rust"
#: The numpy estimator the refit benchmark times, checked against av_core round after round.
REFIT_REFERENCE = (
    "tests/test_benches.py::test_the_refit_reference_tracks_the_estimator_round_after_round"
)


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    old: str
    new: str
    what: str
    #: "rust" and/or Python test paths; Python paths need the native module rebuilt.
    suites: tuple[str, ...] = (RUST,)
    #: The test expected to kill it (documentation; the run reports what actually failed).
    killer: str = ""


MUTANTS: tuple[Mutant, ...] = (
    # --- M1–M6: each breaks a property that has a test named for it ---
    Mutant(
        "M1",
        "av_core/src/estimator/refit.rs",
        "(slope + limit(step.slope)).clamp(0.0, self.max_slope)",
        "(slope + step.slope).clamp(0.0, self.max_slope)",
        "the slope's Newton step not capped by max_step",
        killer="refit_bounds.rs",
    ),
    Mutant(
        "M2",
        "av_core/src/estimator/memory.rs",
        "chi_square_quantile(intercepts.len() + 1, drift_z)",
        "chi_square_quantile(intercepts.len(), drift_z)",
        "the drift χ² test with K degrees of freedom instead of K + 1",
        killer="drift_test.rs",
    ),
    Mutant(
        "M3",
        "av_core/src/planner/stateful.rs",
        "let limit = step.max_draft_budget.map_or(total, |cap| cap.min(total));",
        "let limit = total;",
        "exploration ignoring max_draft_budget",
        killer="exploration_cap.rs",
    ),
    Mutant(
        "M4",
        "av_core/src/estimator/refit.rs",
        "matrix[row * n] = self.b[position];\n            matrix[row] = self.b[position];",
        "matrix[row * n] = -self.b[position];\n            matrix[row] = -self.b[position];",
        "the Hessian's slope/intercept coupling with the wrong sign",
        killer="newton_system.rs",
    ),
    Mutant(
        "M5",
        "av_core/src/estimator/config.rs",
        "pub const DEFAULT_DAMPING: f64 = 50.0;",
        "pub const DEFAULT_DAMPING: f64 = 49.0;",
        "damping 50 → 49",
        killer="newton_system.rs (default damping)",
    ),
    Mutant(
        "M6",
        "av_core/src/planner/stateful.rs",
        "                    confidences,\n                    Some(stale),",
        "                    confidences,\n                    None::<MatrixView<'_, f64>>,",
        "the stateful planner sizing the budget from the current step's confidences",
        suites=(RUST, "tests/test_lossless.py"),
        killer="budget_source.rs; test_lossless.py (revealing family)",
    ),
    # --- more realistic slips ---
    Mutant(
        "M7",
        "av_core/src/estimator/refit.rs",
        "(self.g1[position] - self.b[position] * slope_step)",
        "(self.g1[position] + self.b[position] * slope_step)",
        "intercept step conditioned on the slope step with the wrong sign",
    ),
    Mutant(
        "M8",
        "av_core/src/estimator/refit.rs",
        "* (count / (count + damping));",
        "* (self.total / (self.total + damping));",
        "intercepts damped by the total count instead of their own",
    ),
    Mutant(
        "M9",
        "av_core/src/estimator/refit.rs",
        "*beta = (*beta + limit(delta)).clamp(-self.max_intercept, self.max_intercept);",
        "*beta += limit(delta);",
        "intercept range β ∈ [−max_intercept, max_intercept] not enforced",
    ),
    Mutant(
        "M10",
        "av_core/src/estimator/labels.rs",
        "    if accepted < admitted {\n        accepted + 1",
        "    if accepted < admitted {\n        accepted",
        "the first rejected position left unlabeled",
        suites=(RUST, "tests/test_estimator.py"),
    ),
    Mutant(
        "M11",
        "av_core/src/estimator/batch.rs",
        "let x: [f64; K] = raw.map(|v| v.into().clamp(-limit, limit));",
        "let x: [f64; K] = raw.map(|v| v.into());",
        "observe's statistics skip the ±max_log_odds feature clamp (K ≤ 16 path)",
        suites=(RUST, "tests/test_estimator.py"),
    ),
    Mutant(
        "M12",
        "av_core/src/estimator/memory.rs",
        "nu * (1.0 - h + z * h.sqrt()).powi(3)",
        "nu * (1.0 + h + z * h.sqrt()).powi(3)",
        "Wilson–Hilferty quantile with the wrong bias term",
    ),
    Mutant(
        "M13",
        "av_core/src/estimator/memory.rs",
        "            .chain(&mut self.rhs)\n",
        "",
        "memory decay forgets to discount the right-hand side",
        suites=(RUST, "tests/test_memory.py", REFIT_REFERENCE),
    ),
    Mutant(
        "M14",
        "av_core/src/cost_tables.rs",
        "        for j in (1..deepest).rev() {\n            counts[j] += counts[j + 1];\n        }",
        "",
        "step drafting cost without the suffix sums (pass j priced over depth == j only)",
        suites=(RUST, "tests/test_depth.py"),
        killer="test_depth.py (independent pricing)",
    ),
    Mutant(
        "M15",
        "av_core/src/planner/budget.rs",
        "    e / c > best_e / best_c\n}",
        "    e / c >= best_e / best_c\n}",
        "budget ties go to the larger budget instead of the first maximum",
        suites=(RUST, "tests/test_planner.py"),
    ),
    Mutant(
        "M16",
        "av_core/src/estimator/update/map.rs",
        "chi_square_quantile(k + 1, config.drift_z)",
        "chi_square_quantile(k, config.drift_z)",
        "the map update's drift χ² test with K degrees of freedom instead of K + 1",
        killer="drift_test.rs",
    ),
)


@dataclass
class Outcome:
    mutant: Mutant
    killed: bool
    by: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 1800) -> tuple[int, str]:
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout


def copy_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        check=True,
    ).stdout.split(b"\0")
    for name in files:
        if not name:
            continue
        src = ROOT / name.decode()
        if src.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


FAILED_TEST = re.compile(r"^test (\S+) \.\.\. FAILED", re.M)
PYTEST_FAILED = re.compile(r"^FAILED (\S+)", re.M)


def rust_suite(copy: Path, env: dict[str, str], skip: list[str]) -> tuple[bool, list[str]]:
    args = ["cargo", "test", "-p", "av_core", "--lib", "--tests", "--no-fail-fast", "--"]
    for name in skip:
        args += ["--skip", name]
    code, out = run(args, copy, env)
    failed = FAILED_TEST.findall(out)
    if code != 0 and not failed:  # did not compile, or crashed
        return False, ["(rust build or harness: " + out.strip().splitlines()[-1][:120] + ")"]
    return code == 0, failed


def build_native(copy: Path, env: dict[str, str]) -> None:
    build_env = dict(env, CARGO_PROFILE_RELEASE_LTO="off", CARGO_PROFILE_RELEASE_CODEGEN_UNITS="16")
    code, out = run(
        [
            "cargo",
            "build",
            "--release",
            "-p",
            "av_core_py",
            "--features",
            "pyo3/extension-module",
        ],
        copy,
        build_env,
    )
    if code != 0:
        raise RuntimeError("native build failed:\n" + out[-2000:])
    target = Path(env["CARGO_TARGET_DIR"]) / "release" / "lib_native.so"
    shutil.copy2(target, copy / "python" / "av_core" / "_native.abi3.so")


def python_suite(
    copy: Path, env: dict[str, str], files: list[str], skip: list[str]
) -> tuple[bool, list[str]]:
    shutil.rmtree(copy / ".hypothesis", ignore_errors=True)
    py_env = dict(env, PYTHONPATH=str(copy / "python"))
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", *files]
    for name in skip:
        args += ["--deselect", name]
    code, out = run(args, copy, py_env)
    failed = PYTEST_FAILED.findall(out)
    if code not in (0, 1):
        return False, [f"(pytest exited {code}: {out.strip().splitlines()[-1][:120]})"]
    return code == 0, failed


def apply(copy: Path, mutant: Mutant) -> str:
    path = copy / mutant.file
    original = path.read_text()
    if original.count(mutant.old) != 1:
        raise SystemExit(
            f"mutant {mutant.id}: the text to replace occurs {original.count(mutant.old)} times "
            f"in {mutant.file} (expected once); update scripts/mutants.py"
        )
    path.write_text(original.replace(mutant.old, mutant.new))
    return original


def markdown(outcomes: list[Outcome], baseline_failures: list[str]) -> str:
    lines = [
        "| mutant | what | suites | result | failing tests |",
        "|---|---|---|---|---|",
    ]
    for o in outcomes:
        m = o.mutant
        suites = ", ".join("Rust (no doctests)" if s == RUST else s for s in m.suites)
        shown = ", ".join(f"`{t}`" for t in o.by[:4]) + (
            f" (+{len(o.by) - 4} more)" if len(o.by) > 4 else ""
        )
        verdict = "killed" if o.killed else "**survived**"
        lines.append(f"| {m.id} | {m.what} | {suites} | {verdict} | {shown or '-'} |")
    if baseline_failures:
        lines += ["", "Excluded (failing before any mutation): " + ", ".join(baseline_failures)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutant ids to run (default: all)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory to reuse")
    args = parser.parse_args()
    mutants = [m for m in MUTANTS if not args.only or m.id in args.only]

    work = args.work or Path(tempfile.mkdtemp(prefix="av_core_mutants_"))
    copy = work / "tree"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    copy_tree(copy)
    env = dict(os.environ, CARGO_TARGET_DIR=str(work / "target"), CARGO_TERM_COLOR="never")
    env.pop("PYTHONPATH", None)

    started = time.perf_counter()
    print(f"== baseline (unmutated copy in {copy})", flush=True)
    ok, rust_fail = rust_suite(copy, env, [])
    python_files = sorted({s for m in mutants for s in m.suites if s != RUST})
    py_fail: list[str] = []
    if python_files:
        build_native(copy, env)
        ok_py, py_fail = python_suite(copy, env, python_files, [])
        ok = ok and ok_py
    baseline = rust_fail + py_fail
    if any(name.startswith("(") for name in baseline):
        raise SystemExit(f"baseline does not build or run: {baseline}")
    if not ok:
        print(f"   failing before mutation, excluded from every run: {baseline}", flush=True)

    outcomes: list[Outcome] = []
    for m in mutants:
        t0 = time.perf_counter()
        original = apply(copy, m)
        try:
            by: list[str] = []
            survived, failed = rust_suite(copy, env, rust_fail)
            by += failed
            py_files = [s for s in m.suites if s != RUST]
            if py_files:
                build_native(copy, env)
                passed, failed = python_suite(copy, env, py_files, py_fail)
                survived = survived and passed
                by += failed
        finally:
            (copy / m.file).write_text(original)
        outcome = Outcome(m, killed=not survived, by=by, seconds=time.perf_counter() - t0)
        outcomes.append(outcome)
        verdict = "killed" if outcome.killed else "SURVIVED"
        print(
            f"== {m.id} {verdict} in {outcome.seconds:.0f} s: {m.what}; "
            f"failing: {', '.join(by[:6]) or '-'}",
            flush=True,
        )
    if any(s != RUST for m in mutants for s in m.suites):
        build_native(copy, env)  # leave the copy's module unmutated
    print(
        f"\n{sum(o.killed for o in outcomes)} of {len(outcomes)} mutants killed "
        f"({time.perf_counter() - started:.0f} s)\n"
    )
    if args.markdown:
        print(markdown(outcomes, baseline))
    if not args.keep and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if all(o.killed for o in outcomes) else 1)


if __name__ == "__main__":
    main()
