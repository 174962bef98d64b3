"""The C ABI gives the Python API's bits.

``examples/c/estimator_demo.c`` drives an estimator and a stateful planner through 300 decode
steps whose inputs come from a 64-bit LCG, and prints coefficients, plan totals and a hash of
the saved state with ``%.17g``. This module runs the same steps, from the same LCG, through
``av_core``'s Python API and requires the demo's output to match line for line. It also runs
the C error-path tests (``examples/c/error_paths.c``); ``scripts/check_capi.sh`` runs both
under valgrind in CI.

The library and the two programs are built by ``scripts/check_capi.sh --build-only``. The
tests skip only when there is no C compiler.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import av_core
import av_core._native

ROOT = Path(__file__).resolve().parents[2]
CHECK_SCRIPT = ROOT / "scripts" / "check_capi.sh"

# The demo's constants (examples/c/estimator_demo.c).
ROWS, K, STEPS, REFIT_INTERVAL, REPORT_EVERY = 8, 4, 300, 50, 100
DRAFT_CURVE = [(1, 0.8), (4, 0.9), (8, 1.1), (16, 1.4)]
VERIFY_CURVE = [(1, 6.0), (8, 6.2), (16, 6.6), (32, 7.5), (48, 9.0), (64, 11.0)]
MASK64 = (1 << 64) - 1


def api(name: str) -> Any:
    """A public name from ``av_core``, or from the native module while the package does not
    re-export it yet."""
    return getattr(av_core, name, None) or getattr(av_core._native, name)


class Lcg:
    """Knuth's MMIX LCG, high 31 bits out: the demo's ``next_random``."""

    def __init__(self, seed: int = 20240607) -> None:
        self.state = seed

    def __call__(self) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & MASK64
        return self.state >> 33


def fnv1a(data: bytes) -> int:
    value = 14695981039346656037
    for byte in data:
        value = ((value ^ byte) * 1099511628211) & MASK64
    return value


def g17(value: float) -> str:
    return f"{value:.17g}"


def coefficient_line(label: str, estimator: Any) -> str:
    intercepts = " ".join(g17(b) for b in estimator.intercepts)
    return (
        f"{label} refits {estimator.num_refits} steps_since_refit {estimator.steps_since_refit}"
        f" slope {g17(estimator.slope)} intercepts {intercepts}"
    )


def python_transcript() -> list[str]:
    """What the demo prints, computed with the Python API."""
    next_random = Lcg()
    lines = [f"av_core {av_core.__version__}"]
    estimator = av_core.AcceptanceEstimator(K, refit_interval=REFIT_INTERVAL)
    tables = api("CostTables").from_curves(
        DRAFT_CURVE, VERIFY_CURVE, max_num_reqs=16, max_batch_tokens=64, cudagraph_limit=32
    )
    planner = api("VerificationPlanner")(tables, K, num_slots=ROWS, budget_source="previous")
    slots = np.arange(ROWS, dtype=np.int64)
    budget_total = admitted_total = accepted_total = refit_calls = 0
    expected_total = cost_total = 0.0
    units = np.zeros((ROWS, K), dtype=np.int64)
    scheduled = np.zeros(ROWS, dtype=np.int64)
    features: npt.NDArray[np.float32] = np.zeros((ROWS, K), dtype=np.float32)
    probabilities: npt.NDArray[np.float32] = np.zeros((ROWS, K), dtype=np.float32)

    for t in range(1, STEPS + 1):
        for r in range(ROWS):
            for k in range(K):
                units[r, k] = next_random() % 2049 - 1024 - 128 * k
            scheduled[r] = 1 + next_random() % K
        features = units.astype(np.float32) / np.float32(128.0)
        probabilities = estimator.predict(features)

        plan = planner.plan(
            slots,
            probabilities,
            scheduled,
            num_non_draft_tokens=ROWS,
            num_sampling_requests=ROWS,
        )
        budget_total += plan.budget
        expected_total += plan.expected_accepted_tokens
        cost_total += plan.predicted_cost_ms
        admitted = np.asarray(plan.admitted, dtype=np.int64)

        accepted = np.zeros(ROWS, dtype=np.int64)
        for r in range(ROWS):
            run, broken = 0, False
            for k in range(K):
                threshold = (int(units[r, k]) + 8192) // 2 - 3584
                if not next_random() % 1024 < threshold:
                    broken = True
                if not broken and k < admitted[r]:
                    run += 1
            accepted[r] = run
        admitted_total += int(admitted.sum())
        accepted_total += int(accepted.sum())

        refit_calls += estimator.observe(features, admitted, accepted, probabilities)

        for r in range(ROWS):
            if next_random() % 16 == 0:
                planner.add_request(r)

        if t % REPORT_EVERY == 0:
            lines.append(coefficient_line(f"step {t}", estimator))

    lines.append(f"refitted_by_observe {refit_calls}")
    lines.append(
        f"budget_total {budget_total} admitted_total {admitted_total}"
        f" accepted_total {accepted_total}"
    )
    lines.append(
        f"expected_tokens_total {g17(expected_total)} predicted_cost_ms_total {g17(cost_total)}"
    )

    state = estimator.to_bytes()
    restored = av_core.AcceptanceEstimator.from_bytes(state)
    same = np.array_equal(restored.predict(features), estimator.predict(features))
    lines.append(
        f"state {len(state)} bytes fnv1a {fnv1a(state):016x}"
        f" round_trip {'identical' if same else 'DIFFERENT'}"
    )

    budget = api("choose_draft_budget")(
        probabilities,
        scheduled,
        num_non_draft_tokens=ROWS,
        num_sampling_requests=ROWS,
        cost_tables=tables,
    )
    assigned = api("assign_draft_budget")(probabilities, scheduled, budget)
    lines.append(f"last_step budget {budget} admitted " + " ".join(str(a) for a in assigned))
    lines.append(coefficient_line("final", restored))
    return lines


@pytest.fixture(scope="module")
def c_programs() -> Path:
    """Builds the library and both C programs; returns their directory."""
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler: {compiler!r} is not on PATH, so the C ABI cannot be tested")
    built = subprocess.run(
        ["bash", str(CHECK_SCRIPT), "--build-only"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert built.returncode == 0, f"scripts/check_capi.sh --build-only failed:\n{built.stderr}"
    demo = Path(built.stdout.strip().splitlines()[-1])
    assert demo.is_file(), demo
    return demo.parent


def run(program: Path) -> str:
    done = subprocess.run([str(program)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{program.name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_transcript_exercises_refits_and_the_planner() -> None:
    # Guards the comparison against being vacuous: coefficients moved, rounds refitted,
    # the planner trimmed, the state round-tripped.
    lines = python_transcript()
    assert lines[0] == f"av_core {av_core.__version__}"
    final = lines[-1].split()
    # The default map update refits after the 1st, 2nd, 4th, ... step of every round and at its end.
    doubling = sum(1 for s in range(1, REFIT_INTERVAL) if s & (s - 1) == 0)
    assert final[final.index("refits") + 1] == str(STEPS // REFIT_INTERVAL * (doubling + 1))
    assert float(final[final.index("slope") + 1]) != 0.5
    words = next(line for line in lines if line.startswith("budget_total")).split()
    totals = dict(zip(words[::2], words[1::2], strict=True))
    assert 0 < int(totals["accepted_total"]) < int(totals["budget_total"]) < STEPS * ROWS * K
    assert any(line.endswith("round_trip identical") for line in lines)


def test_c_demo_prints_what_the_python_api_computes(c_programs: Path) -> None:
    c_lines = run(c_programs / "estimator_demo").splitlines()
    python_lines = python_transcript()
    for number, (c_line, python_line) in enumerate(zip(c_lines, python_lines, strict=False)):
        assert c_line == python_line, (
            f"line {number + 1} differs:\nC:      {c_line}\nPython: {python_line}"
        )
    assert len(c_lines) == len(python_lines)


def test_c_error_paths(c_programs: Path) -> None:
    output = run(c_programs / "error_paths")
    assert output.rstrip().endswith(" 0 failures"), output


def test_c_and_python_write_the_same_planner_and_cost_table_bytes(c_programs: Path) -> None:
    """avc_cost_tables_save/avc_planner_save write the bytes that CostTables.to_bytes and
    VerificationPlanner.to_bytes write for the same state, and each side loads the other's
    (through ctypes on the shared library check_capi.sh built)."""
    import ctypes

    lib = ctypes.CDLL(str(ROOT / "target" / "release" / "libav_core_capi.so"))
    c_double_p, c_int64_p = ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int64)
    lib.avc_last_error.restype = ctypes.c_char_p

    def ok(status: int) -> None:
        assert status == 0, lib.avc_last_error().decode()

    def saved(save: Any, handle: ctypes.c_void_p) -> bytes:
        needed = ctypes.c_size_t(0)
        assert save(handle, None, ctypes.c_size_t(0), ctypes.byref(needed)) != 0  # size query
        buf = (ctypes.c_uint8 * needed.value)()
        ok(save(handle, buf, needed, ctypes.byref(needed)))
        return bytes(buf)

    draft = np.array([0.5, 0.6, 0.7, 0.8])
    verify = np.array([5.0] * 9 + [6.0, 7.0, 8.0, 9.0])
    depth = np.array([0.0, 0.4, 0.8, 1.2])
    k, slots_n = 3, 4
    python_tables = av_core.CostTables(draft, verify, draft_depth_ms=depth)
    plain, tables = ctypes.c_void_p(), ctypes.c_void_p()
    ok(
        lib.avc_cost_tables_new(
            draft.ctypes.data_as(c_double_p),
            ctypes.c_size_t(draft.size),
            verify.ctypes.data_as(c_double_p),
            ctypes.c_size_t(verify.size),
            ctypes.byref(plain),
        )
    )
    ok(
        lib.avc_cost_tables_with_draft_depth(
            plain,
            depth.ctypes.data_as(c_double_p),
            ctypes.c_size_t(depth.size),
            ctypes.byref(tables),
        )
    )
    ok(lib.avc_cost_tables_free(plain))
    c_table_bytes = saved(lib.avc_cost_tables_save, tables)
    assert c_table_bytes == python_tables.to_bytes()
    assert av_core.CostTables.from_bytes(c_table_bytes) == python_tables

    python_planner = av_core.VerificationPlanner(
        python_tables, k, num_slots=slots_n, exploration=0.3, exploration_seed=11
    )
    planner = ctypes.c_void_p()
    ok(
        lib.avc_planner_new(
            tables, ctypes.c_size_t(slots_n), ctypes.c_size_t(k), 0, ctypes.byref(planner)
        )
    )
    ok(lib.avc_planner_set_exploration(planner, ctypes.c_double(0.3), ctypes.c_uint64(11)))
    ok(lib.avc_cost_tables_free(tables))
    # One planned step, so the state holds a step count and remembered confidences.
    slots = np.array([0, 2], np.int64)
    confidences = np.array([[0.9, 0.8, 0.5], [0.7, 0.2, 0.1]], np.float32)
    scheduled = np.array([3, 2], np.int64)
    python_planner.plan(
        slots, confidences, scheduled, num_non_draft_tokens=2, num_sampling_requests=2
    )

    class Step(ctypes.Structure):
        _fields_ = [("t", ctypes.c_size_t), ("s", ctypes.c_size_t), ("cap", ctypes.c_size_t)]

    class Plan(ctypes.Structure):
        _fields_ = [("budget", ctypes.c_size_t), ("e", ctypes.c_double), ("c", ctypes.c_double)]

    admitted = np.zeros(2, np.int32)
    plan = Plan()
    ok(
        lib.avc_planner_plan(
            planner,
            slots.ctypes.data_as(c_int64_p),
            ctypes.c_size_t(2),
            confidences.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            ctypes.c_size_t(2),
            ctypes.c_size_t(k),
            scheduled.ctypes.data_as(c_int64_p),
            ctypes.c_size_t(2),
            ctypes.byref(Step(2, 2, ctypes.c_size_t(-1).value)),
            admitted.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            ctypes.c_size_t(2),
            ctypes.byref(plan),
        )
    )
    c_planner_bytes = saved(lib.avc_planner_save, planner)
    ok(lib.avc_planner_free(planner))
    assert c_planner_bytes == python_planner.to_bytes()
    assert c_planner_bytes[:8] == b"AVCORE\0P"

    # Python's bytes load in C and save back unchanged.
    python_bytes = python_planner.to_bytes()
    data = (ctypes.c_uint8 * len(python_bytes)).from_buffer_copy(python_bytes)
    ok(lib.avc_planner_load(data, ctypes.c_size_t(len(python_bytes)), ctypes.byref(planner)))
    assert saved(lib.avc_planner_save, planner) == python_bytes
    ok(lib.avc_planner_free(planner))
