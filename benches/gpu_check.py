"""The prepared GPU check for the feature layer: CUDA tests, then the GPU benchmark, one report.

    python benches/gpu_check.py

Run it on a machine with a CUDA GPU from the repository root. It needs torch with CUDA and an
importable av_core: installed, or built here with the compiled ``python/av_core/_native*.so``
carried along (it is abi3, so it loads on any CPython >= 3.11 of the same platform). It prints a
short report and, when ``OUT`` is set, writes it to ``$OUT/report`` and the benchmark rows to
``$OUT/bench_features.json``. Typical wall time on an H100/H200: well under two minutes.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benches"))


def _environment() -> list[str]:
    import torch

    lines = [f"python {platform.python_version()}, torch {torch.__version__}"]
    try:
        import triton

        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton: not installed (torch fallback)")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(
            f"device: {props.name}, {props.multi_processor_count} SMs, "
            f"{props.total_memory / 2**30:.0f} GiB"
        )
    return lines


def _cuda_tests() -> tuple[bool, list[str]]:
    # The installed package (the wheel), not the source tree, which holds no compiled module.
    env = dict(os.environ)
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(ROOT / "tests" / "features" / "test_features.py"),
        str(ROOT / "tests" / "vllm" / "test_vllm.py"),
        str(ROOT / "tests" / "planner" / "test_planner.py"),
        "-m",
        "cuda",
        "-q",
        "-rfEs",
        "-p",
        "no:cacheprovider",
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=400)
    output = (proc.stdout + proc.stderr).strip().splitlines()
    summary = output[-1] if output else "(no output)"
    lines = [f"CUDA tests: {summary}"]
    if proc.returncode != 0:
        lines += ["  " + line for line in output[-40:]]
    return proc.returncode == 0, lines


def _vllm_selfcheck(lines: list[str]) -> bool:
    """av_core.vllm's estimator on CUDA tensors for a few thousand steps against the host path."""
    from av_core.vllm import gpu_selfcheck

    report = gpu_selfcheck(2000)
    lines.append(
        f"vllm drop-in on CUDA: ok={report['ok']} step {report['step_host_us']['mean']:.0f} us, "
        f"predict {report['predict_host_us']['mean']:.0f} us host; "
        f"no_blocking_sync={report['no_blocking_sync']}; graph={report['graph_capture']}; "
        f"max|diff| vs CPU {report['max_abs_diff_vs_cpu']}"
    )
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        Path(out_dir, "vllm_selfcheck.json").write_text(json.dumps(report, indent=2, default=str))
    return bool(report["ok"])


def main() -> int:
    started = time.perf_counter()
    lines = ["av_core feature layer: GPU check", *_environment()]
    import torch

    ok = torch.cuda.is_available()
    if not ok:
        lines.append("no CUDA device: nothing checked")
    else:
        tests_ok, test_lines = _cuda_tests()
        lines += test_lines
        import bench_features

        from av_core import features

        rows = bench_features.run(quick=False)
        backend = (
            "torch fallback"
            if features.triton_kernels.triton is None or features.triton_kernels._triton_failed
            else "triton"
        )
        lines.append(f"benchmark (GPU path: {backend}):")
        lines += ["  " + bench_features.format_row(row) for row in rows]
        out_dir = os.environ.get("OUT")
        if out_dir:
            Path(out_dir, "bench_features.json").write_text(json.dumps(rows, indent=2))
        ok = tests_ok and backend == "triton"
        ok = _vllm_selfcheck(lines) and ok
    lines.append(
        f"wall time {time.perf_counter() - started:.0f} s; overall {'OK' if ok else 'FAIL'}"
    )
    report = "\n".join(lines)
    print(report)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        Path(out_dir, "report").write_text(report + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
