"""Fetches the vLLM 0.33.0 wheel that tests/test_vllm_contract.py reads, once, into a cache.

    python scripts/fetch_vllm_wheel.py        # prints the wheel's path; exit 1 if unavailable

The cache is ``~/.cache/av_core/vllm-0.33.0`` (``AV_CORE_VLLM_CACHE`` moves it;
``AV_CORE_VLLM_WHEEL`` names a wheel to use instead). A cached wheel is reused after checking
it is a readable zip holding vLLM 0.33.0; a missing or corrupt one is downloaded with
``pip download --no-deps`` (336 MB) into a temporary directory and moved into place only when
complete, so an interrupted download never leaves a broken cache. ``.ci/run`` calls this before
the tests so that CI always runs the contract tests; the tests call it too and skip, with the
reason, when it fails (no network).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VLLM_VERSION = "0.33.0"
CACHE = Path(
    os.environ.get(
        "AV_CORE_VLLM_CACHE", str(Path.home() / ".cache" / "av_core" / f"vllm-{VLLM_VERSION}")
    )
).expanduser()
PATTERN = f"vllm-{VLLM_VERSION}-*.whl"


def is_release(wheel: Path) -> bool:
    try:
        with zipfile.ZipFile(wheel) as archive:
            version_file = archive.read("vllm/_version.py").decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return False
    return f"version = '{VLLM_VERSION}'" in version_file


def fetch() -> Path:
    """The wheel's path; raises ``RuntimeError`` with the reason when it cannot be had."""
    named = os.environ.get("AV_CORE_VLLM_WHEEL")
    if named:
        if not is_release(Path(named)):
            raise RuntimeError(f"AV_CORE_VLLM_WHEEL={named} is not a vLLM {VLLM_VERSION} wheel")
        return Path(named)
    for wheel in sorted(CACHE.glob(PATTERN)):
        if is_release(wheel):
            return wheel
        wheel.unlink()  # corrupt or truncated: fetch again
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".download-") as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            "manylinux_2_28_x86_64",
            "--python-version",
            "3.11",
            f"vllm=={VLLM_VERSION}",
            "-d",
            scratch,
        ]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"pip download timed out after {error.timeout} s") from error
        found = sorted(Path(scratch).glob(PATTERN))
        if proc.returncode != 0 or not found or not is_release(found[0]):
            tail = (proc.stdout[-800:] + proc.stderr[-800:]).strip()
            raise RuntimeError(
                f"could not download vLLM {VLLM_VERSION} ({' '.join(command)}): {tail}"
            )
        target = CACHE / found[0].name
        shutil.move(str(found[0]), target)
        return target


def main() -> None:
    try:
        print(fetch())
    except RuntimeError as error:
        print(f"fetch_vllm_wheel: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
