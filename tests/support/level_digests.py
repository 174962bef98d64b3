"""A workload's output under every ``AV_CORE_SIMD`` level, each in a child process (the level is
read once per process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from child_env import child_env

LEVELS = ("baseline", "avx2", "avx512", "")


def level_digests(workload: str, *paths: Path) -> dict[str, str]:
    """What ``python -c workload`` prints (stripped) under each level of :data:`LEVELS` (``""``:
    no cap), with ``paths`` and ``tests/support`` importable."""
    support = Path(__file__).parent
    out = {}
    for level in LEVELS:
        run = subprocess.run(
            [sys.executable, "-c", workload],
            env=child_env(*paths, support, drop=("AV_CORE_SIMD",), AV_CORE_SIMD=level),
            capture_output=True,
            text=True,
            check=True,
        )
        out[level] = run.stdout.strip()
    return out
