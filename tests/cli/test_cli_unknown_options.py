"""An option a command does not have is refused as unknown *for that command*, by name.

argparse alone sets an unknown option aside and gives the value after it to the next positional
argument, so ``av-core evaluate --concurrency 64`` said ``argument TRACE: no such file: '64'``.
Every command (present and future: the cases are read from the parser) must name the option
as unknown, on one line, exit 2, and say which commands do take it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, run_cli

from av_core.tools.cli import build_parser, main


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _foreign_options() -> list[tuple[str, str, list[str]]]:
    """(command, an option of another command it lacks, the commands that take it)."""
    commands = _commands()
    cases = []
    for name, parser in commands.items():
        mine = _options(parser)
        foreign = sorted(set().union(*(_options(p) for p in commands.values())) - mine)
        for option in foreign:
            if not option.startswith("--") or any(o.startswith(option) for o in mine):
                continue  # an abbreviation of one of this command's own options is taken
            # Commands that take it: exactly, or as an abbreviation (argparse's allow_abbrev).
            owners = [
                n for n, p in commands.items() if any(o.startswith(option) for o in _options(p))
            ]
            cases.append((name, option, owners))
    return cases


def test_there_are_foreign_options_to_try() -> None:
    cases = _foreign_options()
    assert {command for command, _, _ in cases} == set(_commands())
    owners = next(
        o for command, option, o in cases if (command, option) == ("evaluate", "--concurrency")
    )
    assert "simulate" in owners


@pytest.mark.parametrize(("command", "option", "owners"), _foreign_options())
def test_another_commands_option_is_named_as_unknown(
    command: str, option: str, owners: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in ([command, option, "64"], [command, f"{option}=64"], [command, option]):
        assert main(argv) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        line = lines[0]
        assert line.startswith(f"av-core {command}: error: unknown option '{option}' for {command}")
        assert f"({', '.join(owners)} take" in line, line
        assert "TRACE" not in line and "no such file" not in line


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["evaluate", "--concurrency", "64"], "--concurrency"),
        (["evaluate", "--steps", "10"], "--steps"),
        (["simulate", "--bogus", "5"], "--bogus"),
        (["demo", "--steps", "5", "--no-such", "1"], "--no-such"),
        (["traces", "-x"], "-x"),
    ],
)
def test_the_executable_names_the_unknown_option(
    tmp_path: Path, argv: list[str], option: str
) -> None:
    result = run_cli(*argv, cwd=tmp_path)
    line = assert_one_line_error(result, argv[0], f"unknown option '{option}' for {argv[0]}")
    assert "TRACE" not in line
    assert result.stdout == ""


def test_values_that_look_like_options_are_still_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A negative number is the option's value, refused by the option's own check.
    assert main(["simulate", "--exploration", "-0.5"]) == 2
    assert "argument --exploration: must be a probability" in capsys.readouterr().err
    # After "--" nothing is an option: "--weird" is the TRACE.
    assert main(["evaluate", "--", "--weird"]) == 2
    assert "argument TRACE: no such file: '--weird'" in capsys.readouterr().err
    # A stray positional is still "unrecognized arguments".
    assert main(["evaluate", "shipped", "extra"]) == 2
    assert "unrecognized arguments: extra" in capsys.readouterr().err


def test_abbreviations_and_attached_values_are_still_taken() -> None:
    parser = build_parser()
    args = parser.parse_args(["simulate", "--conc", "1,2", "--steps=3", "-q", "--no-plots"])
    assert args.concurrency == [1, 2] and args.steps == 3 and args.quiet and args.no_plots
