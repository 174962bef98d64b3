"""Every command's ``--help`` reads as the user would type: each default shown is the text that,
given back as the option's value, means the default; nothing points to files a pip install does
not have; ``--device`` lists every device it takes."""

from __future__ import annotations

import argparse
import re

import pytest

from av_core.tools.cli import build_parser, main


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*argv, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.fixture(scope="module")
def required(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Values for each command's required options (existing model folder and files)."""
    root = tmp_path_factory.mktemp("help")
    (root / "model").mkdir()
    (root / "prompts.jsonl").write_text('{"prompt_id": "a", "workload": "w", "prompt": "p"}\n')
    model, output = str(root / "model"), str(root / "out.csv")
    return {
        "profile": ["--target", model, "--output", str(root / "cost.json")],
        "collect": ["--target", model, "--drafter", model, "--prompts", str(root / "prompts.jsonl")]
        + ["--output", output],
    }


@pytest.mark.parametrize("command", list(_commands()))
def test_every_default_shown_in_help_means_the_default_when_typed(
    command: str, capsys: pytest.CaptureFixture[str], required: dict[str, list[str]]
) -> None:
    parser = build_parser()
    base = [command, *required.get(command, [])]
    text = _help([command], capsys)
    assert "TraceArg(" not in text and not re.search(r"\w+\(\w+=", text), text
    omitted = vars(parser.parse_args(base))
    checked = 0
    for action in _commands()[command]._actions:
        formatter = _commands()[command]._get_formatter()
        help_text = formatter._get_help_string(action) or ""  # type: ignore[attr-defined]
        if "(default" in (action.help or "") or "(default: " not in help_text:
            continue  # no default, or one its help words itself ("the estimator's")
        shown = help_text.rsplit("(default: ", 1)[1].removesuffix(")")
        if action.option_strings:
            given = [*base, action.option_strings[-1], *shown.split(" ")]
        else:
            given = [*base, shown]
        typed = vars(parser.parse_args(given))
        assert typed[action.dest] == omitted[action.dest], (action.dest, shown)
        assert f"(default: {shown})" in text  # the page shows what the check read
        checked += 1
    assert checked >= (0 if command == "traces" else 1)


def test_the_evaluate_help_shows_the_trace_default_as_typed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help(["evaluate"], capsys)
    assert "(default: shipped)" in text
    assert "TraceArg" not in text


@pytest.mark.parametrize("argv", [[], *([c] for c in _commands())])
def test_no_help_page_points_to_files_a_pip_user_lacks(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(argv, capsys)
    assert not re.search(r"docs/|\.md\b|scripts/", text), text


def test_the_top_level_help_says_where_each_command_is_described(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help([], capsys)
    assert "av-core COMMAND --help describes a command" in text


@pytest.mark.parametrize("command", ["profile", "collect"])
def test_device_help_lists_every_device_it_takes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help([command], capsys)
    assert "--device DEVICE cpu, cuda[:N], mps or xpu[:N]" in text
    device = next(a for a in _commands()[command]._actions if a.dest == "device").type
    for value in ("cpu", "cuda", "cuda:1", "mps", "xpu", "xpu:0"):
        assert device(value) == value  # type: ignore[misc]


def test_traces_names_no_repository_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traces"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"docs/|scripts/", out), out
