"""Fetches the released wheels the contract tests read (vLLM 0.32.0 and 0.33.0, SGLang 0.5.23),
once, into a cache.

    python scripts/fetch_reference_wheels.py            # all of them; prints each path
    python scripts/fetch_reference_wheels.py vllm==0.33.0

The cache is ``~/.cache/av_core/<package>-<version>/`` (``AV_CORE_CACHE`` moves
``~/.cache/av_core``). ``AV_CORE_VLLM_WHEEL`` / ``AV_CORE_SGLANG_WHEEL`` name wheels to use
instead (several separated by ``os.pathsep``; each serves the version its file name carries).
A cached wheel is reused after checking it is a readable zip of that release; a missing or
corrupt one is downloaded with ``pip download --no-deps`` into a temporary directory and moved
into place only when complete, so an interrupted download never leaves a broken cache. The
wheels are read, never installed (both packages need CUDA). ``.ci/run`` calls this before the
tests so CI always runs the contract tests; the tests call :func:`fetch` too and skip, with the
reason, when it fails (no network, no cache).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: Every release a contract test reads, with the platform tag of its published wheel.
REFERENCES: dict[tuple[str, str], str] = {
    ("vllm", "0.32.0"): "manylinux_2_28_x86_64",
    ("vllm", "0.33.0"): "manylinux_2_28_x86_64",
    ("sglang", "0.5.23"): "manylinux_2_34_x86_64",
}


def cache_root() -> Path:
    return Path(
        os.environ.get("AV_CORE_CACHE", str(Path.home() / ".cache" / "av_core"))
    ).expanduser()


def is_release(wheel: Path, package: str, version: str) -> bool:
    """Whether ``wheel`` is a readable wheel of ``package==version`` (its dist-info says so)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            metadata = archive.read(f"{package}-{version}.dist-info/METADATA").decode()
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError):
        return False
    return f"\nVersion: {version}\n" in metadata


def fetch(package: str, version: str) -> Path:
    """The wheel's path; raises ``RuntimeError`` with the reason when it cannot be had."""
    if (package, version) not in REFERENCES:
        raise RuntimeError(
            f"{package}=={version} is not a reference release ({sorted(REFERENCES)})"
        )
    override = f"AV_CORE_{package.upper()}_WHEEL"
    for named in filter(None, os.environ.get(override, "").split(os.pathsep)):
        if Path(named).name.startswith(f"{package}-{version}-"):
            if not is_release(Path(named), package, version):
                raise RuntimeError(f"{override}: {named} is not a {package} {version} wheel")
            return Path(named)
    cache = cache_root() / f"{package}-{version}"
    pattern = f"{package}-{version}-*.whl"
    for wheel in sorted(cache.glob(pattern)):
        if is_release(wheel, package, version):
            return wheel
        wheel.unlink()  # corrupt or truncated: fetch it again
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            REFERENCES[package, version],
            "--python-version",
            "3.11",
            f"{package}=={version}",
            "-d",
            scratch,
        ]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"pip download timed out after {error.timeout} s") from error
        found = sorted(Path(scratch).glob(pattern))
        if proc.returncode != 0 or not found or not is_release(found[0], package, version):
            tail = (proc.stdout[-800:] + proc.stderr[-800:]).strip()
            raise RuntimeError(
                f"could not download {package} {version} ({' '.join(command)}): {tail}"
            )
        target = cache / found[0].name
        shutil.move(str(found[0]), target)
        return target


def main(argv: list[str]) -> int:
    wanted = [tuple(arg.split("==", 1)) for arg in argv] or list(REFERENCES)
    failed = False
    for package, version in wanted:
        try:
            print(fetch(package, version))
        except RuntimeError as error:
            print(f"fetch_reference_wheels: {error}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
