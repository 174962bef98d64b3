"""Every line a command prints as text fits in 100 columns (tables, the lines above them and
the demo's summary); Markdown and JSON are for other programs and are left whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from av_core.tools.cli import main

#: The widest line a command may print as text.
WIDTH = 100


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "--no-plots"],
        ["simulate", "--no-plots", "--steps", "100", "--peers"],
        ["simulate", "--no-plots", "--steps", "100", "--drafter", "autoregressive"],
        ["traces"],
        ["demo", "--steps", "100"],
    ],
)
def test_text_output_fits_in_100_columns(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if argv[0] == "demo":
        pytest.importorskip("matplotlib")
        argv = [*argv, "--out", str(tmp_path / "demo")]
    assert main([*argv, "-q"]) == 0
    out = capsys.readouterr().out
    long = [line for line in out.splitlines() if len(line) > WIDTH]
    assert long == [], "\n".join(long)
    assert len(out.splitlines()) > 10
    if argv[0] == "demo":
        for table in ("evaluate.txt", "simulate_parallel.txt"):
            text = (tmp_path / "demo" / table).read_text()
            assert max(len(line) for line in text.splitlines()) <= WIDTH
