"""The package's three roles stay apart: the runtime (``av_core``), the engine integrations
(``av_core.vllm``, ``av_core.sglang``) and the offline tools (``av_core.tools``).

What each import pulls in is read from ``sys.modules`` in a fresh interpreter; module sizes are
counted on the files; the stable aliases and the declared entry points are resolved.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from child_env import child_env

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "av_core"
#: The most lines a production module may have (tests and stubs are not production modules).
MAX_MODULE_LINES = 700
#: The most lines a Rust source file may have, outside tests.
MAX_RUST_FILE_LINES = 900
#: The Rust crates whose sources the limit covers.
RUST_SOURCES = ("av_core/src", "av_core_capi/src", "rust/src")


def modules_after(statement: str) -> list[str]:
    """The modules loaded in a fresh interpreter after ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    env = child_env(drop=("AV_CORE_", "PROMETHEUS"))
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def under(loaded: list[str], package: str) -> list[str]:
    return [name for name in loaded if name == package or name.startswith(package + ".")]


def test_import_av_core_loads_the_runtime_only() -> None:
    loaded = modules_after("import av_core")
    assert "torch" not in loaded, "import av_core imported torch"
    for package in ("av_core.tools", "av_core.vllm", "av_core.sglang", "av_core.features"):
        assert under(loaded, package) == [], f"import av_core imported {under(loaded, package)}"
    assert {"av_core", "av_core._native"} <= set(loaded)


def test_import_av_core_vllm_imports_no_tool() -> None:
    pytest.importorskip("torch")
    loaded = modules_after("import av_core.vllm")
    assert under(loaded, "av_core.tools") == [], under(loaded, "av_core.tools")
    assert "av_core.vllm.estimator" in loaded  # the check above looked at a real import


def test_the_vllm_plugin_imports_no_tool() -> None:
    pytest.importorskip("torch")
    loaded = modules_after("import av_core.vllm_plugin, av_core.vllm.plugin")
    assert under(loaded, "av_core.tools") == [], under(loaded, "av_core.tools")


def test_import_av_core_sglang_imports_neither_vllm_nor_torch_nor_a_tool() -> None:
    loaded = modules_after("import av_core.sglang")
    assert "torch" not in loaded
    assert under(loaded, "av_core.vllm") == [], under(loaded, "av_core.vllm")
    assert under(loaded, "av_core.tools") == [], under(loaded, "av_core.tools")
    assert "av_core.sglang.policy" in loaded


def test_no_production_module_is_longer_than_the_limit() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 40, "the walk found too few modules to be the package"
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in modules}
    too_long = {path: lines for path, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert too_long == {}, f"modules over {MAX_MODULE_LINES} lines: {too_long}"


def is_rust_test_file(path: Path) -> bool:
    """A unit-test file (``tests.rs``, ``examples.rs`` or anything under a ``tests/`` folder)."""
    return path.name in ("tests.rs", "examples.rs") or "tests" in path.parts


def test_no_rust_file_over_the_limit_outside_tests() -> None:
    files = [
        path
        for source in RUST_SOURCES
        for path in sorted((ROOT / source).rglob("*.rs"))
        if not is_rust_test_file(path.relative_to(ROOT / source))
    ]
    assert len(files) > 40, "the walk found too few Rust files to be the workspace"
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in files}
    too_long = {path: lines for path, lines in sizes.items() if lines > MAX_RUST_FILE_LINES}
    assert too_long == {}, f"Rust files over {MAX_RUST_FILE_LINES} lines: {too_long}"


@pytest.mark.parametrize(
    ("alias", "target"),
    [
        ("av_core.trace", "av_core.tools.trace"),
        ("av_core.metrics", "av_core.tools.metrics"),
        ("av_core.vllm_plugin", "av_core.vllm.plugin"),
    ],
)
def test_stable_aliases_export_the_same_objects(alias: str, target: str) -> None:
    if alias == "av_core.vllm_plugin":
        pytest.importorskip("torch")
    old, new = importlib.import_module(alias), importlib.import_module(target)
    assert list(old.__all__) == list(new.__all__) and len(new.__all__) > 5
    for name in new.__all__:
        assert getattr(old, name) is getattr(new, name), f"{alias}.{name}"


def _resolve(spec: str) -> object:
    module_name, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def test_entry_points_and_the_console_script_resolve() -> None:
    pytest.importorskip("torch")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    from av_core.sglang import register as sglang_register
    from av_core.tools.cli import main
    from av_core.vllm.plugin import register as vllm_register

    assert _resolve(project["scripts"]["av-core"]) is main
    assert _resolve(project["entry-points"]["vllm.general_plugins"]["av_core"]) is vllm_register
    assert _resolve(project["entry-points"]["sglang.srt.plugins"]["av_core"]) is sglang_register
    # Users' configs that name the plugin's old module keep working.
    assert _resolve("av_core.vllm_plugin:register") is vllm_register


def test_child_processes_import_the_av_core_the_tests_import() -> None:
    """A test that starts a Python child sets its ``PYTHONPATH`` through ``child_env``: a path
    built from the source tree (``python/``) has no native module once CI installs the wheel,
    and such a child fails only there."""
    offenders = [
        path.name
        for path in sorted((ROOT / "tests").rglob("*.py"))
        # data/ holds fixture writers, run by hand against an earlier build's source tree.
        if "data" not in path.relative_to(ROOT / "tests").parts
        and path.name != "child_env.py"
        and "PYTHONPATH" in path.read_text()
        and "from child_env import child_env" not in path.read_text()
    ]
    assert offenders == []
