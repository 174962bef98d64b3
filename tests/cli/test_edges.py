"""The edges a user touches besides the estimator's arrays: the ``av-core`` command line with its
standard error closed, full or read-only, Ctrl-C while it starts, empty paths, cost times that
overflow a run; and the vLLM drop-in's environment variables (unknown values refused naming the
variable and the value, the estimator's update checked before anything is patched)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from child_env import child_env

from av_core.tools.simulate import MAX_COST_MS, GpuLikeCost, MeasuredCost, simulate_trace
from av_core.tools.trace import load_shipped_trace, write_trace


def _env() -> dict[str, str]:
    env = child_env()
    env.pop("AV_CORE_DEBUG", None)
    return env


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("edges")
    write_trace(load_shipped_trace().select(np.arange(400)), root / "small.csv")
    (root / "empty.csv").write_text("")
    (root / "model").mkdir()
    return root


def _close_stderr() -> None:
    os.close(2)


def _read_only_stderr() -> None:
    """Descriptor 2 reused by a file open for reading, as when a program started with ``2>&-``
    opens its first file (or a wrapper script leaves its own open there)."""
    os.close(2)
    os.open(os.devnull, os.O_RDONLY)


def _full_stderr() -> None:
    os.dup2(os.open("/dev/full", os.O_WRONLY), 2)


STDERR_STATES: dict[str, Callable[[], None]] = {
    "closed": _close_stderr,
    "read-only": _read_only_stderr,
    "full": _full_stderr,
}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("state", sorted(STDERR_STATES))
@pytest.mark.parametrize(
    ("argv", "code"),
    [
        # A run that warns (the estimator never ends a round) and prints JSON: status 0, and
        # the JSON unharmed by the warning.
        (["evaluate", "small.csv", "--no-plots", "--json", "--refit-interval", "100000"], 0),
        (["evaluate", "empty.csv"], 2),  # a malformed file
        (["evaluate", "empty.csv", "--debug"], 2),  # ... with the traceback asked for
        (["evaluate", "--refit-interval", "0"], 2),  # a bad option (argparse's own line)
        ([], 2),  # no command
    ],
)
def test_a_closed_or_failing_stderr_keeps_the_exit_status(
    folder: Path, state: str, argv: list[str], code: int
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "av_core", *argv],
        cwd=folder,
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
        timeout=300,
        preexec_fn=STDERR_STATES[state],
    )
    assert result.returncode == code, (state, result.returncode)
    if code == 0:
        import json

        assert json.loads(result.stdout)["command"] == "evaluate"


def test_without_sys_stderr_notes_do_not_go_to_stdout(
    folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from av_core.tools.cli import main

    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "stderr", None)
    argv = ["evaluate", "small.csv", "--no-plots", "--json", "--refit-interval", "100000"]
    assert main(argv) == 0
    assert main(["evaluate", "empty.csv"]) == 2
    assert sys.stderr is None  # given back as it was
    out = capsys.readouterr().out
    assert out.lstrip().startswith("{") and "warning" not in out and "error" not in out


# ---------------------------------------------------------------------------------------------
# Ctrl-C while the command line starts


def test_ctrl_c_before_the_command_runs_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    cli_main = importlib.import_module("av_core.tools.cli.main")

    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "build_parser", interrupt)
    assert cli_main.main(["evaluate"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "av-core: interrupted" and "Traceback" not in err


def test_ctrl_c_while_the_command_line_is_imported_is_one_line_and_130(folder: Path) -> None:
    """``python -m av_core`` (``av_core.__main__.run``) imports the command line inside its
    guard: an interrupt there (the slowest part of starting) ends with 130."""
    prelude = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'av_core.tools.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from av_core.__main__ import run\n"
        "sys.exit(run())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", prelude, "traces"],
        cwd=folder,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() == "av-core: interrupted"


def test_the_guard_spells_the_command_lines_name_and_status() -> None:
    import av_core.__main__ as entry
    from av_core.tools.cli import EXIT_INTERRUPTED, PROG

    assert (entry.PROG, entry.EXIT_INTERRUPTED) == (PROG, EXIT_INTERRUPTED)


# ---------------------------------------------------------------------------------------------
# Empty paths and times past any real pass


def _one_line(result: subprocess.CompletedProcess[str], command: str, *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"av-core {command}: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["evaluate", ""], "TRACE"),
        (["evaluate", "small.csv", "--out", ""], "--out"),
        (["simulate", "small.csv", "--out", ""], "--out"),
        (["demo", "--out", ""], "--out"),
        (["demo", "--trace", ""], "--trace"),
        (["simulate", "small.csv", "--cost-model", "measured", ""], "--cost-model"),
        (["profile", "--target", "", "--output", "c.json"], "--target"),
        (["profile", "--target", "model", "--output", ""], "--output"),
        (
            ["collect", "--target", "model", "--drafter", "model", "--prompts", ""]
            + ["--output", "o.csv"],
            "--prompts",
        ),
    ],
)
def test_an_empty_path_is_refused_naming_the_option(
    folder: Path, argv: list[str], option: str
) -> None:
    """``''`` (an unset shell variable) is no path: before, ``--out ''`` wrote the plots into
    the current folder and ``--target ''`` took it for a model."""
    result = subprocess.run(
        [sys.executable, "-m", "av_core", *argv],
        cwd=folder,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    _one_line(result, argv[0], option, "''")
    assert result.stdout == "" and not list(folder.glob("*.png")) and not list(folder.glob("*.txt"))


def test_a_range_of_non_ascii_digits_is_refused_as_a_range() -> None:
    from av_core.tools.argtypes import parse_int_list

    with pytest.raises(ValueError, match="range '1-²' must be LOW-HIGH"):
        parse_int_list("1-²")  # '²'.isdigit() is true, and int('²') fails


@pytest.mark.parametrize(
    "flag",
    ["--verify-base-ms", "--verify-per-token-ms", "--draft-base-ms", "--draft-per-token-ms"],
)
def test_cost_times_that_would_overflow_a_run_are_refused_while_parsing(
    folder: Path, flag: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "av_core", "simulate", "small.csv", flag, "1e308", "--no-plots"],
        cwd=folder,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    _one_line(result, "simulate", flag, "'1e308'")


def test_cost_models_refuse_times_past_the_ceiling(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="verify_base_ms must be at most"):
        GpuLikeCost(verify_base_ms=1e308)
    with pytest.raises(ValueError, match="draft_per_token_ms must be at most"):
        GpuLikeCost(draft_per_token_ms=MAX_COST_MS * 2)
    path = tmp_path / "cost.json"
    path.write_text('{"verify": [[1, 5.0], [8, 1e308]]}')
    with pytest.raises(ValueError, match=r"cost.json: 'verify' must hold times of at most"):
        MeasuredCost.load(path)
    path.write_text('{"verify": [[1, 5.0], [8, 6.0]], "draft": [[1, 1e300]]}')
    with pytest.raises(ValueError, match=r"'draft' must hold times of at most"):
        MeasuredCost.load(path)


def test_the_largest_times_allowed_still_simulate_to_finite_throughputs() -> None:
    """At the ceiling, every time and knee at its worst, the run's sums stay finite: the
    ceiling is low enough (the throughput is tokens over the summed ms, checked > 0)."""
    trace = load_shipped_trace().select(np.arange(400))
    cost = GpuLikeCost(
        verify_base_ms=MAX_COST_MS,
        verify_knee=0,
        verify_per_token_ms=MAX_COST_MS,
        draft_base_ms=MAX_COST_MS,
        draft_knee=0,
        draft_per_token_ms=MAX_COST_MS,
    )
    simulation = simulate_trace(trace, cost=cost, concurrency=[1, 4096], steps=5, warmup_steps=0)
    for concurrency in (1, 4096):
        throughput = simulation.adaptive(concurrency).throughput
        assert np.isfinite(throughput) and throughput > 0


# ---------------------------------------------------------------------------------------------
# Helpers for the vLLM drop-in's environment, below


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in list(os.environ):
        if name.startswith("AV_CORE_"):
            monkeypatch.delenv(name)
    yield monkeypatch


# ---------------------------------------------------------------------------------------------
# The vLLM drop-in's environment (fake vLLM module trees with vLLM 0.33.0's interfaces)


@pytest.fixture
def fake_vllm(clean_env: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    pytest.importorskip("torch")
    from test_vllm import build_fake_vllm

    from av_core.vllm import plugin

    for name, module in build_fake_vllm().items():
        clean_env.setitem(sys.modules, name, module)
    plugin.uninstall()
    yield clean_env
    plugin.uninstall()


def _patched() -> object:
    return sys.modules["vllm.v1.worker.gpu.spec_decode.acceptance_estimator"].__dict__[
        "OnlineAcceptanceEstimator"
    ]


@pytest.mark.parametrize("value", ["2", "enable", "y"])
def test_an_unknown_av_core_vllm_is_refused_not_taken_for_off(
    fake_vllm: pytest.MonkeyPatch, value: str
) -> None:
    """Before, ``AV_CORE_VLLM=on`` (or any typo) quietly left vLLM's own estimator in place."""
    from av_core.vllm import plugin

    fake_vllm.setenv("AV_CORE_VLLM", value)
    before = _patched()
    with pytest.raises(ValueError, match=rf"AV_CORE_VLLM={value!r}"):
        plugin.register()
    assert plugin.installed() == [] and _patched() is before


def test_av_core_vllm_on_installs(fake_vllm: pytest.MonkeyPatch) -> None:
    from av_core.vllm import OnlineAcceptanceEstimator, plugin

    fake_vllm.setenv("AV_CORE_VLLM", "on")
    plugin.register()
    assert _patched() is OnlineAcceptanceEstimator


@pytest.mark.parametrize(
    ("variables", "needle"),
    [
        ({"AV_CORE_VLLM_ESTIMATOR": "bad"}, "AV_CORE_VLLM_ESTIMATOR='bad'"),
        ({"AV_CORE_VLLM_ESTIMATOR": "1"}, "AV_CORE_VLLM_ESTIMATOR='1'"),
        ({"AV_CORE_VLLM_EXACT": "2"}, "AV_CORE_VLLM_EXACT='2'"),
        ({"AV_CORE_VLLM_EXACT": "exact"}, "AV_CORE_VLLM_EXACT='exact'"),
        ({"AV_CORE_VLLM_ANY_VERSION": "sure"}, "AV_CORE_VLLM_ANY_VERSION='sure'"),
        ({"AV_CORE_VLLM_EXACT": "1", "AV_CORE_VLLM_ESTIMATOR": "map"}, "AV_CORE_VLLM_ESTIMATOR"),
        ({"AV_CORE_SIMD": "sse2"}, 'AV_CORE_SIMD: "sse2" is not a level'),
    ],
)
def test_the_plugin_refuses_a_bad_estimator_setting_before_patching(
    fake_vllm: pytest.MonkeyPatch, variables: dict[str, str], needle: str
) -> None:
    """Before, the plugin installed and the first estimator vLLM built (deep in its model
    runner) raised; ``AV_CORE_VLLM_EXACT=2`` was quietly off."""
    from av_core.vllm import plugin

    fake_vllm.setenv("AV_CORE_VLLM", "1")
    for name, value in variables.items():
        fake_vllm.setenv(name, value)
    before = _patched()
    with pytest.raises(ValueError, match="AV_CORE_") as error:
        plugin.register()
    assert needle in str(error.value)
    assert plugin.installed() == [] and _patched() is before


@pytest.mark.parametrize(("value", "exact"), [("on", True), ("TRUE", True), ("off", False)])
def test_the_drop_in_reads_exact_in_every_spelling(
    clean_env: pytest.MonkeyPatch, value: str, exact: bool
) -> None:
    torch = pytest.importorskip("torch")
    from av_core.vllm import OnlineAcceptanceEstimator

    clean_env.setenv("AV_CORE_VLLM_EXACT", value)
    assert OnlineAcceptanceEstimator(8, 4, torch.device("cpu")).exact is exact


def test_a_drop_in_built_without_the_plugin_warns_of_a_bad_value_and_serves(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Built inside a running server (no plugin checked the environment first), the drop-in
    never raises for an environment value: one warning naming it, and the default
    (docs/settings.md); the plugin refuses the same values before patching (above)."""
    import logging

    torch = pytest.importorskip("torch")
    from av_core.vllm import OnlineAcceptanceEstimator

    clean_env.setenv("AV_CORE_VLLM_EXACT", "exact")
    clean_env.setenv("AV_CORE_VLLM_ESTIMATOR", "mapp")
    with caplog.at_level(logging.WARNING, logger="vllm.av_core"):
        estimator = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"))
    assert estimator.exact is False and estimator.update == "vllm"
    assert "AV_CORE_VLLM_EXACT='exact'" in caplog.text and "using off" in caplog.text
    assert "AV_CORE_VLLM_ESTIMATOR='mapp'" in caplog.text and "using vllm" in caplog.text
    # Both from the environment and contradictory: map wins, exact dropped, with a warning.
    clean_env.setenv("AV_CORE_VLLM_EXACT", "1")
    clean_env.setenv("AV_CORE_VLLM_ESTIMATOR", "map")
    with caplog.at_level(logging.WARNING, logger="vllm.av_core"):
        estimator = OnlineAcceptanceEstimator(8, 4, torch.device("cpu"))
    assert estimator.update == "map" and estimator.exact is False
    assert "applies to update='vllm' only" in caplog.text


def test_the_map_opt_in_without_the_plugin_is_a_warning(
    fake_vllm: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from av_core.vllm import plugin

    fake_vllm.setenv("AV_CORE_VLLM_ESTIMATOR", "map")
    with caplog.at_level(logging.WARNING, logger="vllm.av_core"):
        plugin.register()
    assert plugin.installed() == []
    assert any(
        "AV_CORE_VLLM_ESTIMATOR" in r.getMessage() and "no effect" in r.getMessage()
        for r in caplog.records
    )


def test_the_map_opt_in_through_the_plugin_builds_map_estimators(
    fake_vllm: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    from av_core.vllm import plugin

    fake_vllm.setenv("AV_CORE_VLLM", "1")
    fake_vllm.setenv("AV_CORE_VLLM_ESTIMATOR", " Map ")
    plugin.register()
    estimator = _patched()(8, 4, torch.device("cpu"))  # type: ignore[operator]
    assert estimator.update == "map" and estimator._native.update == "map"


# ---------------------------------------------------------------------------------------------
# AV_CORE_SIMD, read by the core: every documented level is taken, anything else is named


def _python(code: str, simd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", code],
        env=child_env(drop=("AV_CORE_SIMD",), AV_CORE_SIMD=simd),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("simd", ["", "baseline", " Baseline ", "AVX2", "avx512"])
def test_every_documented_simd_level_imports_quietly(simd: str) -> None:
    result = _python("import av_core; av_core._native.check_environment()", simd)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("simd", ["sse2", "avx", "none", "0"])
def test_an_unknown_simd_level_is_named_by_the_api_and_the_cli(simd: str, folder: Path) -> None:
    # import av_core warns (a RuntimeWarning, an error under -W error), naming it and the value.
    imported = _python("import av_core", simd)
    assert imported.returncode != 0 and "RuntimeWarning" in imported.stderr, imported.stderr
    assert f'AV_CORE_SIMD: "{simd}" is not a level' in imported.stderr
    # check_environment raises ValueError, naming it.
    checked = _python(
        "import warnings; warnings.simplefilter('ignore')\n"
        "import av_core\n"
        "try:\n    av_core._native.check_environment()\n"
        "except ValueError as e:\n    print(e)\n",
        simd,
    )
    assert checked.stdout.strip().startswith(f'AV_CORE_SIMD: "{simd}" is not a level'), checked
    # The CLI: one error line (after the import's warning) and status 2, no traceback.
    cli = subprocess.run(
        [sys.executable, "-W", "ignore::RuntimeWarning", "-m", "av_core", "evaluate", "small.csv"],
        cwd=folder,
        env=child_env(drop=("AV_CORE_SIMD",), AV_CORE_SIMD=simd),
        capture_output=True,
        text=True,
        timeout=120,
    )
    _one_line(cli, "evaluate", "AV_CORE_SIMD", f'"{simd}"')
