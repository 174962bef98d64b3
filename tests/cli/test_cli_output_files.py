"""Output files of ``av-core demo``, ``evaluate`` and ``simulate`` that cannot be written.

Every file a command writes under ``--out`` is probed before any work starts, so that a file
that refuses it (a directory in its place) ends the run with one line naming it, exit 2 and
nothing on stdout; a write that fails later (a full disk) goes through the error boundary as one
line naming the file, exit 2, never a traceback.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, run_cli

from av_core.tools.cli import main

pytest.importorskip("matplotlib")


@pytest.mark.parametrize(
    ("command", "blocked"),
    [
        (["demo", "--steps", "5"], "evaluate.txt"),
        (["demo", "--steps", "5"], "simulate_autoregressive.txt"),
        (["demo", "--steps", "5"], "pareto_parallel.png"),
        (["evaluate"], "coefficients.png"),
        (["simulate", "--steps", "5", "--drafter", "autoregressive"], "pareto_autoregressive.png"),
    ],
)
def test_an_output_file_that_is_a_directory_stops_the_run_before_any_work(
    tmp_path: Path, command: list[str], blocked: str
) -> None:
    (tmp_path / "out" / blocked).mkdir(parents=True)
    result = run_cli(*command, "--out", "out", "-q", cwd=tmp_path)
    assert_one_line_error(result, command[0], "--out", f"out/{blocked}", "is a directory")
    assert result.stdout == ""  # nothing ran: no table printed
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [blocked]


def test_a_write_that_fails_after_the_probe_is_one_line_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full disk when the demo writes its first table: the boundary's one line, exit 2."""
    real = Path.write_text

    def full_disk(self: Path, *args: object, **kwargs: object) -> int:
        if self.name == "evaluate.txt":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", full_disk)
    monkeypatch.delenv("AV_CORE_DEBUG", raising=False)
    status = main(["demo", "--out", str(tmp_path / "out"), "--steps", "5", "-q"])
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 2, error
    assert len(error) == 1 and "Traceback" not in error[0]
    assert error[0].startswith("av-core demo: error: cannot write ")
    assert "evaluate.txt" in error[0] and "No space left on device" in error[0]
