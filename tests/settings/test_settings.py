"""One reader of the environment, one rule for a bad value (av_core._settings, docs/settings.md).

- Only ``av_core/_settings.py`` reads ``os.environ`` (found by reading every module's syntax
  tree), and every ``AV_CORE_*`` name the package mentions is declared there.
- Every declared variable, given a value it does not take, is refused by :func:`check` with a
  ``SettingError`` naming it and the value, and read by ``get`` as one warning and the default,
  never an exception: the same values, both ways.
- The switches' spellings, and the entry points: the command line (one line, exit 2), the vLLM
  plugin and the SGLang installer (nothing patched) refuse before they start.
"""

from __future__ import annotations

import ast
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from child_env import child_env

import av_core
from av_core import _settings as settings

PACKAGE = Path(av_core.__file__).resolve().parent
DOCS = Path(__file__).resolve().parents[2] / "docs"

#: A value each variable does not take (written here, not derived from the parsers).
BAD: dict[str, str] = {
    "AV_CORE_DEBUG": "maybe",
    "AV_CORE_LLAMA_LOG": "2",
    "AV_CORE_SIMD": "sse2",
    "AV_CORE_VLLM": "enable",
    "AV_CORE_VLLM_ANY_VERSION": "sure",
    "AV_CORE_VLLM_EXACT": "exact",
    "AV_CORE_VLLM_ESTIMATOR": "newton",
    "AV_CORE_VLLM_DEPTH": "deep",
    "AV_CORE_VLLM_DRAFTER": "tree",
    "AV_CORE_SHARE_STATS": "tp",
    "AV_CORE_STATE_SAVE_EVERY": "0",
    "AV_CORE_METRICS": "2",
    "AV_CORE_METRICS_PORT": "70000",
    "AV_CORE_METRICS_WINDOW": "1e3",
    "AV_CORE_METRICS_INTERVAL": "soon",
    "LOCAL_RANK": "-1",
    "RANK": "first",
    "AV_CORE_SGLANG": "2",
    "AV_CORE_SGLANG_ANY_VERSION": "y",
    "AV_CORE_SGLANG_PROFILE": "auto",
    "AV_CORE_SGLANG_DRAFTER": "tree",
    "AV_CORE_SGLANG_MAX_BATCH": "0",
    "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": " true",
}
#: Variables that take any text (a path, a host): nothing to refuse.
ANY_TEXT = {
    "AV_CORE_STATE_DIR",
    "AV_CORE_METRICS_HOST",
    "PROMETHEUS_MULTIPROC_DIR",
    "AV_CORE_SGLANG_COSTS",
}


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for setting in settings.SETTINGS:
        monkeypatch.delenv(setting.name, raising=False)
    settings._warned.clear()
    return monkeypatch


def _environment_reads(tree: ast.AST) -> list[int]:
    """Lines that touch ``os.environ``/``os.getenv``/``environ``/``getenv`` in any spelling."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "getenv") for alias in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in ("environ", "getenv"):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_only_the_settings_module_reads_the_environment() -> None:
    readers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = _environment_reads(ast.parse(path.read_text(), str(path)))
        if lines:
            readers[str(path.relative_to(PACKAGE))] = lines
    assert list(readers) == ["_settings.py"], readers


def test_the_scan_finds_a_read() -> None:
    code = "import os\nfrom os import environ as e\nx = os.environ.get('A')\ny = os.getenv('B')\n"
    assert _environment_reads(ast.parse(code)) == [2, 3, 4]


def test_every_variable_the_package_names_is_declared() -> None:
    declared = {setting.name for setting in settings.SETTINGS}
    named = set()
    for path in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r"\bAV_CORE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert named - declared == set()
    assert declared == set(BAD) | ANY_TEXT


def test_the_settings_document_lists_every_variable() -> None:
    text = (DOCS / "settings.md").read_text()
    for setting in settings.SETTINGS:
        assert f"`{setting.name}`" in text, setting.name


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_value_a_variable_does_not_take_is_refused_at_a_check_and_a_warning_in_a_read(
    clean: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    setting = settings.named(name)
    default = setting.get()  # unset
    clean.setenv(name, BAD[name])
    with pytest.raises(settings.SettingError) as error:
        settings.check(settings.SETTINGS)
    assert isinstance(error.value, av_core.Error) and isinstance(error.value, ValueError)
    assert name in str(error.value) and BAD[name].strip() in str(error.value)
    if name == "AV_CORE_SIMD":
        return  # the core reads it: it runs its baseline kernels (import warns: test_edges.py)
    with pytest.raises(settings.SettingError, match=re.escape(f"{name}={BAD[name]!r}")):
        setting.require()
    with caplog.at_level(logging.WARNING):
        first, second = setting.get(), setting.get()
    assert first == second
    if name != "AV_CORE_METRICS_PORT" and name != "AV_CORE_METRICS_INTERVAL":
        assert first == default
    warnings = [r for r in caplog.records if name in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]  # once per value
    assert repr(BAD[name]) in warnings[0].getMessage()


def test_an_interval_outside_its_bounds_is_the_nearest_bound_when_read_leniently(
    clean: pytest.MonkeyPatch,
) -> None:
    for text, expected in (("1e300", 86_400.0), ("1e-300", 0.01), ("-5", 0.01), ("x", 1.0)):
        clean.setenv("AV_CORE_METRICS_INTERVAL", text)
        assert settings.METRICS_INTERVAL.get() == expected, text
        with pytest.raises(settings.SettingError):
            settings.METRICS_INTERVAL.require()


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), (" TRUE ", True), ("yes", True), ("On", True), ("", False), ("0", False)]
    + [("false", False), ("NO", False), ("off\n", False), (" ", False)],
)
def test_switch_spellings(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    flag = settings.switch("AV_CORE_TEST_FLAG")
    monkeypatch.setenv("AV_CORE_TEST_FLAG", value)
    assert flag.require() is on and flag.get() is on


@pytest.mark.parametrize("value", ["2", "enable", "y", "exact", "-1", "0.5", "1 1"])
def test_a_switch_refuses_other_values_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    flag = settings.switch("AV_CORE_TEST_FLAG")
    monkeypatch.setenv("AV_CORE_TEST_FLAG", value)
    with pytest.raises(ValueError, match=rf"AV_CORE_TEST_FLAG={value!r}"):
        flag.require()


def test_a_switch_that_defaults_on_is_on_when_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AV_CORE_METRICS", "")
    assert settings.METRICS.require() is True
    monkeypatch.setenv("AV_CORE_METRICS", "off")
    assert settings.METRICS.require() is False


@pytest.mark.parametrize(
    ("value", "mode"),
    [("", "off"), ("0", "off"), ("1", "batch"), ("on", "batch"), (" Batch ", "batch")]
    + [("per_request", "per_request"), ("OFF", "off")],
)
def test_the_depth_variable_takes_a_switch_or_a_mode(
    monkeypatch: pytest.MonkeyPatch, value: str, mode: str
) -> None:
    monkeypatch.setenv("AV_CORE_VLLM_DEPTH", value)
    assert settings.VLLM_DEPTH.require() == mode


def _cli(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "av_core", "traces"],
        cwd=tmp_path,
        env=child_env(drop=("AV_CORE_",), **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_line_refuses_a_bad_value_in_one_line(tmp_path: Path) -> None:
    result = _cli({"AV_CORE_DEBUG": "maybe"}, tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("av-core traces: error: AV_CORE_DEBUG='maybe'")
    assert result.stdout == ""
    assert _cli({"AV_CORE_DEBUG": "off"}, tmp_path).returncode == 0


def test_the_sglang_installer_refuses_before_it_patches(clean: pytest.MonkeyPatch) -> None:
    from av_core import sglang as av_sglang

    clean.setenv("AV_CORE_SGLANG_COSTS", "costs.json")
    for name in ("AV_CORE_SGLANG_MAX_BATCH", "AV_CORE_SGLANG_DRAFTER"):
        clean.setenv(name, BAD[name])
        with pytest.raises(settings.SettingError, match=name):
            av_sglang.install()
        assert av_sglang.installed() == []
        clean.delenv(name)


def test_named_knows_every_variable_and_no_other() -> None:
    for setting in settings.SETTINGS:
        assert settings.named(setting.name) is setting
    with pytest.raises(KeyError):
        settings.named("AV_CORE_NO_SUCH")


def _declared(module: Any) -> list[str]:
    return [s.name for s in vars(module).values() if isinstance(s, settings.Setting)]


def test_every_declared_setting_is_in_the_registry() -> None:
    assert sorted(_declared(settings)) == sorted(s.name for s in settings.SETTINGS)
