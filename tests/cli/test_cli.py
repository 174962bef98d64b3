"""The ``av-core`` command line as a product: one-line errors through the real executable,
options refused while parsing, closed pipes, shipped traces by name, titled tables with
Markdown and JSON, progress only on a terminal, the profile sweep checks, and the README's
quick start."""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from child_env import child_env

from av_core.tools.argtypes import parse_int_list
from av_core.tools.cli import collect_summary, shipped_names
from av_core.tools.collect import CollectSummary
from av_core.tools.evaluate import Correlation, evaluate_trace, evaluation_tables
from av_core.tools.profile import measure_forward_samples, sweep_warnings
from av_core.tools.progress import Progress, progress_enabled
from av_core.tools.simulate import GpuLikeCost, MeasuredCost, simulate_trace
from av_core.tools.tables import Table, col, fixed, general, percent_change, signed
from av_core.tools.trace import DraftTrace, load_shipped_trace, write_trace

REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = child_env(**extra)
    if "AV_CORE_DEBUG" not in extra:
        env.pop("AV_CORE_DEBUG", None)
    return env


def run_cli(
    *args: str, cwd: Path, prelude: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m av_core ARGS`` (the console script's code) in a fresh process; with a
    ``prelude``, that Python runs first (to hide an installed module)."""
    if prelude:
        command = [
            sys.executable,
            "-c",
            f"{prelude}\nimport sys\nfrom av_core.tools.cli import main\n"
            "sys.exit(main(sys.argv[1:]))",
            *args,
        ]
    else:
        command = [sys.executable, "-m", "av_core", *args]
    return subprocess.run(
        command, cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=300
    )


def assert_one_line_error(
    result: subprocess.CompletedProcess[str], command: str, *needles: str, code: int = 2
) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith(f"av-core {command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Malformed inputs, one per failure class, and a small valid trace."""
    root = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(20)
    noise = rng.integers(0, 256, size=4000, dtype=np.uint8).tobytes()
    (root / "empty.csv").write_text("")
    (root / "columns.csv").write_text("a,b\n1,2\n")
    header = "request_id,step,position,workload,logit_q_max,admitted,label\n"
    (root / "nan.csv").write_text(header + "0,0,0,w,nan,1,1\n")
    (root / "trace.txt").write_text(header)
    (root / "folder.csv").mkdir()
    (root / "random.csv").write_bytes(b"\xff\xfe\x80" + noise)
    (root / "random.csv.gz").write_bytes(b"\x00\x01" + noise)
    (root / "random.parquet").write_bytes(noise)
    small = load_shipped_trace().select(np.arange(400))
    write_trace(small, root / "small.csv")
    compressed = gzip.compress((root / "small.csv").read_bytes())
    (root / "truncated.csv.gz").write_bytes(compressed[: len(compressed) // 2])
    columns = small.select(np.arange(20)).to_dict()
    columns["label"] = np.full(20, -1, dtype=np.int8)
    write_trace(DraftTrace(**columns), root / "unlabeled.csv")
    columns["admitted"] = np.zeros(20, dtype=bool)
    write_trace(DraftTrace(**columns), root / "unadmitted.csv")
    (root / "cost.json").write_text("{not json")
    (root / "cost-list.json").write_text("[[1, 5.0]]")
    (root / "cost-bytes.json").write_bytes(b"\xff" + noise[:100])
    (root / "model").mkdir()
    (root / "prompts.jsonl").write_text('{"prompt_id": "a", "workload": "w", "prompt": "p"}\n')
    return root


# ---------------------------------------------------------------------------------------------
# Failure classes through the executable: exit 2, one line naming the file or the option


INPUT_FAILURES = [
    (["evaluate", "missing.csv"], "evaluate", ["missing.csv", "no such file"]),
    (["evaluate", "empty.csv"], "evaluate", ["empty.csv", "empty file"]),
    (["evaluate", "columns.csv"], "evaluate", ["columns.csv", "'a'"]),
    (["evaluate", "nan.csv"], "evaluate", ["nan.csv", "logit_q_max"]),
    (["evaluate", "folder.csv"], "evaluate", ["folder.csv", "directory"]),
    (["evaluate", "trace.txt"], "evaluate", ["trace.txt"]),
    (["simulate", "missing.csv"], "simulate", ["missing.csv"]),
    (["simulate", "unlabeled.csv", "--no-plots"], "simulate", ["unlabeled.csv", "no labeled"]),
    (["simulate", "unadmitted.csv", "--no-plots"], "simulate", ["unadmitted.csv", "admitted"]),
    (["evaluate", "unadmitted.csv", "--no-plots"], "evaluate", ["unadmitted.csv", "no labeled"]),
    (["demo", "--trace", "empty.csv"], "demo", ["empty.csv"]),
    (
        ["simulate", "small.csv", "--cost-model", "measured", "cost.json"],
        "simulate",
        ["cost.json", "JSON"],
    ),
    (
        ["simulate", "small.csv", "--cost-model", "measured", "cost-list.json"],
        "simulate",
        ["cost-list.json"],
    ),
    (
        ["simulate", "small.csv", "--cost-model", "measured", "cost-bytes.json"],
        "simulate",
        ["cost-bytes.json"],
    ),
    (
        ["simulate", "small.csv", "--cost-model", "measured", "nowhere.json"],
        "simulate",
        ["--cost-model", "nowhere.json"],
    ),
    (["simulate", "small.csv", "--cost-model", "exact"], "simulate", ["--cost-model", "exact"]),
    (["simulate", "small.csv", "--out", "small.csv"], "simulate", ["--out", "small.csv"]),
    (
        [
            "collect",
            "--target",
            "model",
            "--drafter",
            "model",
            "--prompts",
            "prompts.jsonl",
            "--output",
            "o.parquet",
        ],
        "collect",
        ["--output", "o.parquet"],
    ),
]

#: Decoding failures of the trace readers. Today the CLI boundary names the file; the readers
#: themselves will raise ValueErrors naming the file (another branch), same contract.
DECODING_FAILURES = [
    (["evaluate", "random.csv"], "evaluate", ["random.csv"]),
    (["evaluate", "random.csv.gz"], "evaluate", ["random.csv.gz"]),
    (["evaluate", "truncated.csv.gz"], "evaluate", ["truncated.csv.gz"]),
    (["evaluate", "random.parquet"], "evaluate", ["random.parquet"]),
    (["simulate", "random.csv.gz"], "simulate", ["random.csv.gz"]),
]

OPTION_FAILURES = [
    (["simulate", "--verify-base-ms", "-1"], "--verify-base-ms", "'-1'"),
    (["simulate", "--verify-base-ms", "0"], "--verify-base-ms", "'0'"),
    (["simulate", "--verify-knee", "-10"], "--verify-knee", "'-10'"),
    (["simulate", "--verify-per-token-ms", "-0.03"], "--verify-per-token-ms", "'-0.03'"),
    (["simulate", "--draft-base-ms", "nan"], "--draft-base-ms", "'nan'"),
    (["simulate", "--concurrency", "8-2"], "--concurrency", "'8-2'"),
    (["simulate", "--concurrency", "3-20"], "--concurrency", "'3-20'"),
    (["simulate", "--concurrency", "0,2"], "--concurrency", "0"),
    (["simulate", "--concurrency", "4,2"], "--concurrency", "4"),
    (["simulate", "--seed", "-1"], "--seed", "'-1'"),
    (["simulate", "--steps", "0"], "--steps", "'0'"),
    (["simulate", "--warmup-steps", "-1"], "--warmup-steps", "'-1'"),
    (["simulate", "--refit-interval", "0"], "--refit-interval", "'0'"),
    (["simulate", "--refit-interval", "-5"], "--refit-interval", "'-5'"),
    (["simulate", "--exploration", "1.5"], "--exploration", "'1.5'"),
    (["simulate", "--memory", "1"], "--memory", "'1'"),
    (["simulate", "--depth-control", "deep"], "--depth-control", "'deep'"),
    (["simulate", "--trt-schedule", "8"], "--trt-schedule", "'8'"),
    (["simulate", "--trt-schedule", "4:4"], "--trt-schedule", "--peers"),
    (["simulate", "--peers", "--trt-schedule", "4:4,4:2"], "--trt-schedule", "'4:4,4:2'"),
    (["simulate", "--steps", "2000000000"], "--steps", "2000000000"),
    (["simulate", "--concurrency", "65536", "--steps", "100000"], "--concurrency", "65536"),
    (["demo", "--steps", "1000000"], "--steps", "1000000"),
    (["evaluate", "--refit-interval", "0"], "--refit-interval", "'0'"),
    (["evaluate", "--groups-per-workload", "0"], "--groups-per-workload", "'0'"),
    (["evaluate", "--batch-rounds", "x"], "--batch-rounds", "'x'"),
    (["evaluate", "--memory", "-0.1"], "--memory", "'-0.1'"),
    (["demo", "--steps", "0"], "--steps", "'0'"),
    (["demo", "--out", "small.csv"], "--out", "small.csv"),
    (["profile", "--target", "model", "--output", "c.json", "--repeats", "0"], "--repeats", "'0'"),
    (
        ["profile", "--target", "model", "--output", "c.json", "--context", "-1"],
        "--context",
        "'-1'",
    ),
    (["profile", "--target", "model", "--output", "c.json", "--tokens", "0"], "--tokens", "0"),
    (
        ["profile", "--target", "model", "--output", "/nonexistent/c.json"],
        "--output",
        "/nonexistent",
    ),
    (["profile", "--target", "nowhere", "--output", "c.json"], "--target", "nowhere"),
    (["profile", "--target", "model", "--output", "c.json", "--device", "gpu"], "--device", "gpu"),
    (
        [
            "collect",
            "--target",
            "model",
            "--drafter",
            "model",
            "--prompts",
            "prompts.jsonl",
            "--output",
            "o.csv",
            "--k",
            "0",
        ],
        "--k",
        "'0'",
    ),
    (
        [
            "collect",
            "--target",
            "model",
            "--drafter",
            "model",
            "--prompts",
            "prompts.jsonl",
            "--output",
            "o.csv",
            "--top-p",
            "0",
        ],
        "--top-p",
        "'0'",
    ),
    (
        [
            "collect",
            "--target",
            "model",
            "--drafter",
            "model",
            "--prompts",
            "missing.jsonl",
            "--output",
            "o.csv",
        ],
        "--prompts",
        "missing.jsonl",
    ),
    (["nonsense"], "COMMAND", "'nonsense'"),
]


@pytest.mark.parametrize(("argv", "command", "needles"), INPUT_FAILURES + DECODING_FAILURES)
def test_input_failures_are_one_line_naming_the_file(
    files: Path, argv: list[str], command: str, needles: list[str]
) -> None:
    assert_one_line_error(run_cli(*argv, cwd=files), command, *needles)


@pytest.mark.parametrize(("argv", "option", "value"), OPTION_FAILURES)
def test_options_are_refused_while_parsing_naming_the_option_and_value(
    files: Path, argv: list[str], option: str, value: str
) -> None:
    command = argv[0] if option != "COMMAND" else ""
    result = run_cli(*argv, cwd=files)
    line = assert_one_line_error(result, command.strip()) if command else None
    if line is None:
        assert result.returncode == 2 and "Traceback" not in result.stderr
        line = result.stderr.strip().splitlines()[-1]
    assert option in line and value in line, line
    # Refused before any work: nothing was written next to the inputs.
    assert not (files / "c.json").exists() and not (files / "o.csv").exists()


#: A folder no one can create files in, whatever the permission bits say (root passes every
#: os.access check): the kernel refuses new entries under /proc.
UNWRITABLE = Path("/proc/av-core-refuses-this")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["evaluate", "small.csv", "--out", str(UNWRITABLE)], "--out"),
        (["simulate", "small.csv", "--steps", "5", "--out", str(UNWRITABLE / "sub")], "--out"),
        (["demo", "--trace", "small.csv", "--steps", "5", "--out", str(UNWRITABLE)], "--out"),
        (["profile", "--target", "model", "--output", f"{UNWRITABLE}.json"], "--output"),
        (
            [
                "collect",
                "--target",
                "model",
                "--drafter",
                "model",
                "--prompts",
                "prompts.jsonl",
                "--output",
                f"{UNWRITABLE}.csv",
            ],
            "--output",
        ),
    ],
)
def test_outputs_that_refuse_writes_are_found_before_the_work(
    files: Path, argv: list[str], option: str
) -> None:
    result = run_cli(*argv, cwd=files)
    assert_one_line_error(result, argv[0], option, str(UNWRITABLE))
    assert result.stdout == ""  # no table printed: nothing ran before the refusal


def test_output_probes_leave_files_as_they_were(tmp_path: Path) -> None:
    from av_core.tools.argtypes import prepare_output_dir, probe_output_file

    existing = tmp_path / "kept.csv"
    existing.write_text("header\n")
    assert probe_output_file(existing) is None
    assert existing.read_text() == "header\n"
    missing = tmp_path / "new.json"
    assert probe_output_file(missing) is None
    assert not missing.exists()
    folder = tmp_path / "a" / "b"
    assert prepare_output_dir(folder) is None
    assert folder.is_dir() and list(folder.iterdir()) == []
    assert prepare_output_dir(existing) is not None  # a file, not a folder


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["evaluate", "small.csv", "--no-plots", "--refit-interval", "5000"], "--refit-interval"),
        (["evaluate", "small.csv", "--no-plots", "--batch-rounds", "100000"], "--batch-rounds"),
        (
            ["simulate", "small.csv", "--no-plots", "--steps", "10", "--refit-interval", "500"],
            "--refit-interval",
        ),
    ],
)
def test_a_run_that_never_refits_says_so(files: Path, argv: list[str], option: str) -> None:
    result = (
        run_cli(*argv, "--concurrency", "1", cwd=files)
        if argv[0] == "simulate"
        else (run_cli(*argv, cwd=files))
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"av-core {argv[0]}: warning: "), lines
    assert "never refit" in lines[0] and option in lines[0]
    quiet = (
        run_cli(
            argv[0], "small.csv", "--no-plots", "--steps", "10", "--concurrency", "1", cwd=files
        )
        if argv[0] == "simulate"
        else run_cli(*argv[:3], cwd=files)
    )
    assert "warning" not in quiet.stderr  # the defaults refit


def test_no_arguments_print_usage_and_exit_2(files: Path) -> None:
    result = run_cli(cwd=files)
    assert result.returncode == 2
    assert "usage: av-core" in result.stderr and "a command is required" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["profile", "collect"])
def test_missing_extras_give_a_pip_hint(files: Path, command: str) -> None:
    # Hide transformers whether it is installed or not: find_spec returns None for it.
    prelude = "import sys\nsys.modules['transformers'] = None"
    argv = {
        "profile": ["profile", "--target", "model", "--output", "c.json"],
        "collect": [
            "collect",
            "--target",
            "model",
            "--drafter",
            "model",
            "--prompts",
            "prompts.jsonl",
            "--output",
            "o.csv",
        ],
    }[command]
    result = run_cli(*argv, cwd=files, prelude=prelude)
    assert_one_line_error(result, command, "transformers", "pip install 'av_core[collect]'")


def test_debug_prints_the_traceback(files: Path) -> None:
    for result in (
        run_cli("evaluate", "empty.csv", "--debug", cwd=files),
        run_cli("evaluate", "empty.csv", cwd=files, AV_CORE_DEBUG="1"),
    ):
        assert result.returncode == 2
        assert "Traceback" in result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("av-core evaluate: error: ")


def test_an_unexpected_failure_is_one_line_exit_1(files: Path) -> None:
    prelude = (
        "import av_core.tools.evaluate\n"
        "def boom(*args, **kwargs):\n    raise RuntimeError('the estimator exploded')\n"
        "av_core.tools.evaluate.evaluate_trace = boom"
    )
    result = run_cli("evaluate", "small.csv", "--no-plots", cwd=files, prelude=prelude)
    line = assert_one_line_error(result, "evaluate", "RuntimeError", "exploded", code=1)
    assert "--debug" in line


def test_output_into_a_closed_pipe_ends_quietly(files: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "av_core", "evaluate", "small.csv", "--no-plots"],
        cwd=files,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before anything is written
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 141
    assert stderr == ""


@pytest.mark.parametrize(
    "argv",
    [["evaluate", "small.csv", "--bogus"], ["simulate", "--steps", "5", "--no-such-option"]],
)
def test_an_unknown_option_is_named_by_its_command(files: Path, argv: list[str]) -> None:
    line = assert_one_line_error(run_cli(*argv, cwd=files), argv[0], "unknown option")
    assert f"'{argv[-1]}' for {argv[0]}" in line


def test_a_closed_stdout_is_one_line_before_any_work(files: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "av_core", "evaluate", "small.csv", "--no-plots"],
        cwd=files,
        env=_env(),
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.close(1),
    )
    assert_one_line_error(result, "evaluate", "standard output is closed")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [["traces"], ["evaluate", "small.csv", "--no-plots", "--json"]])
def test_a_full_stdout_is_one_line_naming_it(files: Path, argv: list[str]) -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "av_core", *argv],
            cwd=files,
            env=_env(),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert_one_line_error(result, argv[0], "standard output", "No space left")


def test_piping_into_head(files: Path) -> None:
    result = subprocess.run(
        f"{sys.executable} -m av_core evaluate small.csv --no-plots | head -1",
        shell=True,
        cwd=files,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.stdout.startswith("trace: 400 rows")
    assert len(result.stdout.splitlines()) == 1
    assert "Traceback" not in result.stderr and "Error" not in result.stderr


# ---------------------------------------------------------------------------------------------
# The option grammar


def test_integer_list_grammar() -> None:
    assert parse_int_list("1,2,4") == [1, 2, 4]
    assert parse_int_list("1-512") == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert parse_int_list("3-24") == [3, 6, 12, 24]
    assert parse_int_list("1,2,3,4,8-64") == [1, 2, 3, 4, 8, 16, 32, 64]
    assert parse_int_list(" 5 ") == [5]
    assert parse_int_list("", allow_empty=True) == []
    for text, message in (
        ("8-2", "decreases"),
        ("3-20", "does not reach 20"),
        ("0,2", ">= 1"),
        ("2,2", "increase"),
        ("4,2", "increase"),
        ("1-4,3", "increase"),
        ("", "list"),
        ("a", "'a'"),
        ("1-", "LOW-HIGH"),
        ("1,,2", "empty item"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_int_list(text)
    with pytest.raises(ValueError, match=r"\[1, 8\]"):
        parse_int_list("4-16", high=8)


def test_options_take_their_typed_values(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from av_core.tools.cli import build_parser

    args = build_parser().parse_args(
        [
            "simulate",
            "shipped-t0.6",
            "--concurrency",
            "1-8,32",
            "--depth-control",
            "none",
            "--seed",
            "12",
            "--exploration",
            "0.05",
            "--trt-schedule",
            "4:4,8:2",
        ]
    )
    assert args.concurrency == [1, 2, 4, 8, 32]
    assert args.depth_control == ()
    assert (args.seed, args.exploration, args.trt_schedule) == (12, 0.05, {4: 4, 8: 2})
    assert args.trace.shipped == "qwen2.5-coder-1.5b_0.5b_k4_t0.6.csv.gz"
    assert build_parser().parse_args(["evaluate"]).trace.shipped == (
        "qwen2.5-coder-1.5b_0.5b_k4_t1.csv.gz"
    )
    # --help shows every default.
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: 1000)", "(default: 200)", "(default: 0)", "(default: 6.0)"):
        assert shown in text, shown


def test_every_option_help_states_its_default() -> None:
    """Every option that takes a value and is not required says what happens without it."""
    import argparse

    from av_core.tools.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    silent = []
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if not action.option_strings or action.required or action.nargs == 0:
                continue
            if action.help == argparse.SUPPRESS:
                continue
            help_text = " ".join(sub._get_formatter()._get_help_string(action).split())  # type: ignore[union-attr]
            if "default" not in help_text:
                silent.append(f"{name} {action.option_strings[-1]}")
    assert silent == []


# ---------------------------------------------------------------------------------------------
# Shipped traces, tables, Markdown and JSON


def test_traces_lists_the_shipped_traces(files: Path) -> None:
    result = run_cli("traces", cwd=files)
    assert result.returncode == 0, result.stderr
    for name in shipped_names():
        assert name in result.stdout
    assert "4860" in result.stdout and "4500" in result.stdout  # docs/collect.md's row counts
    assert "Qwen2.5-Coder-1.5B-Instruct" in result.stdout
    document = json.loads(run_cli("traces", "--json", cwd=files).stdout)
    rows = document["tables"][0]["rows"]
    assert [r["rows"] for r in rows] == [4860, 4500, 23173]
    assert [r["labeled"] for r in rows] == [3758, 3666, 20155]


def test_simulate_takes_the_shipped_trace_and_prints_json_and_markdown(files: Path) -> None:
    base = ["simulate", "--concurrency", "1,64", "--steps", "20", "--warmup-steps", "5"]
    result = run_cli(*base, "--json", "--no-plots", cwd=files)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["trace"] == "shipped"
    titles = [t["title"] for t in document["tables"]]
    assert all(titles) and len(set(titles)) == len(titles)
    throughput = {
        (r["concurrency"], r["policy"]): r["throughput_tokens_per_ms"] for r in document["results"]
    }
    table = document["tables"][0]["rows"]
    assert table[1]["AV"] == pytest.approx(throughput[(64, "AV")])
    markdown = run_cli(*base, "--markdown", "--no-plots", cwd=files)
    assert markdown.returncode == 0, markdown.stderr
    assert "| R | K=0 | best fixed K≥1 | AV | AV+D | AV+Dr |" in markdown.stdout
    assert markdown.stdout.count("\n**") >= 5  # every table has a bold title


def test_a_trace_after_the_cost_model_is_the_trace(files: Path) -> None:
    """``--cost-model`` takes one or two words; a TRACE written after them (its nargs took it)
    is the trace, unless one was given before."""
    (files / "cost-ok.json").write_text('{"verify": [[1, 5.0], [512, 9.0]]}')
    base = ["--no-plots", "--json", "--steps", "5", "--warmup-steps", "2", "--concurrency", "1"]
    for argv, trace in (
        (["simulate", "--cost-model", "gpu-like", "small.csv"], "small.csv"),
        (["simulate", "--cost-model", "measured", "cost-ok.json", "shipped-t0.6"], "shipped-t0.6"),
        (["simulate", "shipped-t0.6", "--cost-model", "gpu-like"], "shipped-t0.6"),
    ):
        result = run_cli(*argv, *base, cwd=files)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["trace"] == trace
    twice = run_cli("simulate", "small.csv", "--cost-model", "gpu-like", "small.csv", cwd=files)
    assert_one_line_error(twice, "simulate", "--cost-model", "gpu-like small.csv")
    missing = run_cli("simulate", "--cost-model", "gpu-like", "nowhere.csv", cwd=files)
    assert_one_line_error(missing, "simulate", "TRACE", "nowhere.csv")


def test_text_tables_never_run_together() -> None:
    table = Table(
        "a title",
        [col("name", align="<"), col("AV+D/best", fixed(3)), col("AV+Dr/best", fixed(3))],
    )
    table.add("a-long-policy-name", 1.23456, 123456.0)
    table.add("x", -0.00001, math.nan)
    text = table.to_text().splitlines()
    assert text[0] == "a title"
    assert re.split(r"\s{2,}", text[1]) == ["name", "AV+D/best", "AV+Dr/best"]
    assert re.split(r"\s{2,}", text[3]) == ["a-long-policy-name", "1.235", "123456.000"]
    assert re.split(r"\s{2,}", text[4].strip()) == ["x", "0.000", "n/a"]  # no "-0.000"
    assert table.to_dict()["rows"][1]["AV+Dr/best"] is None


def test_significant_digits_keep_their_trailing_zeros() -> None:
    three, four = general(3), general(4)
    assert [four(v) for v in (2.2, 38.0, 1.095, 1234.0, 0.5444)] == [
        "2.200",
        "38.00",
        "1.095",
        "1234",
        "0.5444",
    ]
    assert three(0.63) == "0.630" and three(-0.0001) == "-0.000100" and three(math.nan) == "n/a"


def test_no_negative_zero() -> None:
    assert percent_change(0.99996) == "+0.0%"
    assert percent_change(1.0) == "+0.0%"
    assert percent_change(0.999) == "-0.1%"
    assert percent_change(1.169) == "+16.9%"
    assert signed(3)(-0.0001) == "+0.000" and signed(3)(-0.25) == "-0.250"
    assert fixed(1)(-0.04) == "0.0"


def test_simulation_and_evaluation_tables_have_titles_and_separated_columns() -> None:
    trace = load_shipped_trace().select(np.arange(800))
    simulation = simulate_trace(trace, concurrency=[1, 256], steps=30, warmup_steps=5)
    for t in simulation.tables():
        # The headers (wrapped onto lines above the rule when the table is wide), column by
        # column under the rule's runs of dashes.
        lines = t.to_text().splitlines()
        rule = next(i for i, line in enumerate(lines) if line and not set(line) - {"-", " "})
        spans = [m.span() for m in re.finditer(r"-+", lines[rule])]
        names = [
            " ".join(h[a:b].strip() for h in lines[1:rule] if h[a:b].strip()) for a, b in spans
        ]
        assert lines[0] == t.title and names == [c.name for c in t.columns], t.title
    text = simulation.to_text()
    assert "-0.0" not in text
    assert "drafting and verification of the adaptive policies" in text


# ---------------------------------------------------------------------------------------------
# Correlations, simulate's refusal, cost models, collect's summary


def test_correlation_needs_three_points_and_skips_missing_values() -> None:
    assert math.isnan(Correlation.of([0.5, 0.8], [1.2, 0.1]).r)  # two points: always ±1
    assert "needs >= 3" in Correlation.of([0.5, 0.8], [1.2, 0.1]).to_text()
    a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    b = [2.0, 1.0, math.nan, 3.0, 6.0, 5.0]
    corr = Correlation.of(a, b)
    keep = [0, 1, 3, 4, 5]
    assert corr.n == 5
    assert corr.r == pytest.approx(np.corrcoef(np.array(a)[keep], np.array(b)[keep])[0, 1])


def test_partly_empty_entropy_uses_the_rows_that_have_it() -> None:
    trace = load_shipped_trace()
    assert trace.entropy is not None
    columns = trace.to_dict()
    entropy = columns["entropy"].copy()
    entropy[::3] = math.nan
    columns["entropy"] = entropy
    evaluation = evaluate_trace(DraftTrace(**columns))
    assert all(math.isfinite(g.mean_entropy) for g in evaluation.groups)
    # Each group's mean is over its rows with an entropy: the first group against numpy.
    assert trace.prompt_id is not None
    pairs = dict.fromkeys(zip(trace.prompt_id.tolist(), trace.workload.tolist(), strict=True))
    code = [p for p, w in pairs if w == "humaneval"]
    first = np.array_split(np.array(code), 4)[0]
    rows = np.isin(trace.prompt_id, first)
    assert evaluation.groups[0].mean_entropy == pytest.approx(float(np.nanmean(entropy[rows])))
    agreement = evaluation_tables(evaluation)[-1].to_dict()["rows"]
    by_fits = {row["fits"]: row for row in agreement}
    assert by_fits["prompt groups"]["n"] == 8
    r = by_fits["prompt groups"]["r(b0, entropy)"]
    assert r is not None and -1.0 < r < 1.0  # a number, not n/a
    expected = Correlation.of(
        [float(g.fit.intercepts[0]) for g in evaluation.groups],
        [g.mean_entropy for g in evaluation.groups],
    ).r
    assert r == pytest.approx(expected)
    assert by_fits["workloads"]["r(b0, entropy)"] is None  # two workloads: no r = ±1.00
    assert "r = -1.00" not in evaluation.to_text() and "r = +1.00" not in evaluation.to_text()


def test_simulate_refuses_a_trace_without_verdicts() -> None:
    trace = load_shipped_trace().select(np.arange(40))
    columns = trace.to_dict()
    columns["label"] = np.full(40, -1, dtype=np.int8)
    with pytest.raises(ValueError, match="no labeled drafts"):
        simulate_trace(DraftTrace(**columns), concurrency=[1], steps=5)
    columns["admitted"] = np.zeros(40, dtype=bool)
    with pytest.raises(ValueError, match="admitted"):
        simulate_trace(DraftTrace(**columns), concurrency=[1], steps=5)


def test_cost_models_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="verify_base_ms"):
        GpuLikeCost(verify_base_ms=0.0)
    with pytest.raises(ValueError, match="verify_knee"):
        GpuLikeCost(verify_knee=-10)
    with pytest.raises(ValueError, match="draft_per_token_ms"):
        GpuLikeCost(draft_per_token_ms=math.inf)
    for text, message in (
        ("{", "not valid JSON"),
        ("[1]", "JSON object"),
        ('{"verify": [["a", 1]]}', "pairs of numbers"),
        ('{"verify": [[1, 0.0]]}', "> 0 ms"),
    ):
        path = tmp_path / "cost.json"
        path.write_text(text)
        with pytest.raises(ValueError, match=message) as error:
            MeasuredCost.load(path)
        assert str(path) in str(error.value)


def test_collect_summary_of_a_rerun_has_no_nan(tmp_path: Path) -> None:
    output = tmp_path / "trace.csv"
    whole = load_shipped_trace()
    rerun = CollectSummary(output, 0, 36, 0, 0, 0)
    line = collect_summary(rerun, whole)
    assert "nan" not in line
    assert "nothing new" in line and "3758 labeled drafts" in line and "0.845" in line
    fresh = collect_summary(CollectSummary(output, 2, 0, 10, 8, 6), None)
    assert "acceptance rate 0.750" in fresh


# ---------------------------------------------------------------------------------------------
# Progress and the profile sweep checks


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_terminal_and_not_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not progress_enabled(False, io.StringIO())
    assert progress_enabled(False, _Terminal())
    assert not progress_enabled(True, _Terminal())
    # Without tqdm: the plain fallback line, drawn after the delay and cleared at the end.
    import importlib

    real = importlib.import_module

    def no_tqdm(name: str, *args: Any) -> Any:
        if name == "tqdm":
            raise ImportError("no tqdm")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_tqdm)
    stream = _Terminal()
    with Progress(3, "work", True, delay=0.0, stream=stream) as bar:
        bar.advance(1, "first")
    assert "work: 1/3 (first)" in stream.getvalue()
    silent = io.StringIO()
    with Progress(3, "work", False, delay=0.0, stream=silent) as bar:
        bar.advance(3)
    assert silent.getvalue() == ""


def test_progress_with_tqdm_writes_to_the_stream() -> None:
    pytest.importorskip("tqdm")
    stream = _Terminal()
    with Progress(4, "simulate", True, delay=0.0, stream=stream) as bar:
        for i in range(4):
            bar.advance(1, f"R={i}")
    assert "simulate" in stream.getvalue()


def test_sweep_warnings_on_synthetic_timings() -> None:
    # The busy machine: 2 tokens 20 ms, 3 tokens 1.3 ms.
    busy = [(1, [1.2, 1.3, 1.2]), (2, [20.0, 19.0, 21.0]), (3, [1.3, 1.3, 1.4]), (4, [1.4] * 3)]
    warnings = sweep_warnings("target", busy, repeats=3)
    assert len(warnings) == 1
    assert "not monotone" in warnings[0] and "3 tokens" in warnings[0] and "20.00" in warnings[0]
    assert "--threads 1" in warnings[0] and "--repeats (now 3)" in warnings[0]
    clean = [(1, [5.0, 5.1, 5.0]), (2, [5.0, 5.2, 5.1]), (64, [6.0, 6.1, 5.9]), (512, [20.0] * 3)]
    assert sweep_warnings("target", clean, repeats=3) == []
    # A flat memory-bound sweep that dips within noise is not flagged.
    assert sweep_warnings("target", [(1, [5.0]), (2, [4.5]), (4, [5.1])]) == []
    noisy = [(1, [5.0, 15.0, 5.1]), (2, [5.0, 5.2, 5.1])]
    warnings = sweep_warnings("drafter", noisy, threads=1, repeats=3)
    assert len(warnings) == 1 and "noisy" in warnings[0] and "1 token" in warnings[0]
    assert "--threads" not in warnings[0]  # already 1 thread


def test_profile_samples_feed_the_checks() -> None:
    ticks = iter(
        # warm-up call is untimed; then 2 repeats at each size: start, stop pairs
        [0.0, 0.020, 1.0, 1.021, 2.0, 2.0013, 3.0, 3.0013]
    )
    samples = measure_forward_samples(
        lambda t: None, [2, 3], repeats=2, warmup=1, clock=lambda: next(ticks)
    )
    assert [t for t, _ in samples] == [2, 3]
    assert samples[0][1] == pytest.approx([20.0, 21.0])
    assert any("not monotone" in w for w in sweep_warnings("target", samples))


# ---------------------------------------------------------------------------------------------
# The README's quick start


def test_quickstart_runs_and_the_readme_shows_it() -> None:
    script = REPO / "examples" / "quickstart.py"
    result = subprocess.run(
        [sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    slope = float(re.search(r"slope (\d+\.\d+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert abs(slope - 0.6) < 0.1  # the toy target's true slope
    readme = (REPO / "README.md").read_text()
    use = readme[readme.index("## Use") :]
    block = use[use.index("```python\n") + len("```python\n") : use.index("```\n", 10)]
    source = script.read_text()
    begin, end = '# --- README "Use" begins\n', '# --- README "Use" ends'
    region = source[source.index(begin) + len(begin) : source.index(end)]
    assert block == region  # the file's marked part, verbatim
    # Pasted alone (a newcomer's first try), the block runs: nothing it uses is defined elsewhere.
    pasted = subprocess.run(
        [sys.executable, "-c", block], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert pasted.returncode == 0, pasted.stderr
    assert "slope" in pasted.stdout


def test_readme_first_command_installs_what_the_demo_draws_with() -> None:
    readme = (REPO / "README.md").read_text()
    assert 'pip install ".[demo]" && av-core demo' in readme
    pyproject = (REPO / "pyproject.toml").read_text()
    demo = re.search(r"^demo = \[(.*)\]$", pyproject, re.M)
    assert demo is not None and "matplotlib" in demo.group(1)
    assert re.search(r'^dependencies = \["numpy>=[\d.]+"\]$', pyproject, re.M)


def test_a_run_that_never_ends_a_round_says_what_the_update_did(files: Path) -> None:
    # vLLM's update never fits before a round ends: every prediction is the cold start. The map
    # update (the default) fits after the 1st, 2nd, 4th, ... observes of its first round.
    argv = ["evaluate", "small.csv", "--no-plots", "--refit-interval", "5000"]
    vllm = run_cli(*argv, "--update", "vllm", cwd=files)
    assert vllm.returncode == 0, vllm.stderr
    assert "every prediction is the cold start" in vllm.stderr, vllm.stderr
    for mapped in (run_cli(*argv, "--update", "map", cwd=files), run_cli(*argv, cwd=files)):
        assert mapped.returncode == 0, mapped.stderr
        lines = mapped.stderr.strip().splitlines()
        assert len(lines) == 1 and "at a round's end" in lines[0], lines
        assert "cold start" not in lines[0]
