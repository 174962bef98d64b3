"""The hand-written stub of the native module must match the compiled module."""

import subprocess
import sys

import pytest


def test_native_stub_matches_the_compiled_module() -> None:
    pytest.importorskip("mypy")
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "av_core._native"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_does_not_pull_in_torch() -> None:
    code = "import sys, av_core; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
