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
    """The console script's entry point (``av_core.__main__:run``) imports the command line
    inside its guard: an interrupt there (the slowest part of starting) ends with 130."""
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


def test_the_console_script_runs_the_guarded_entry_point() -> None:
    import tomllib

    import av_core.__main__ as entry
    from av_core.tools.cli import EXIT_INTERRUPTED, PROG

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["av-core"] == "av_core.__main__:run"
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
