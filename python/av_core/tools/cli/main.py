"""The ``av-core`` parser (every command's options, in the order ``--help`` lists them) and
:func:`main`, the one error boundary every command runs inside.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from av_core import __version__
from av_core import _settings as settings
from av_core.tools import argtypes as types
from av_core.tools.cli.analysis import add_demo, add_evaluate, add_simulate, depth_modes
from av_core.tools.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    PROG,
    CommandError,
    _common,
    _Formatter,
    _Parser,
    describe,
    one_line,
)
from av_core.tools.cli.data import add_collect, add_profile, add_traces
from av_core.tools.cli.engine import add_bench_engine


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Adaptive verification for speculative decoding: estimator and planner. "
        "Every command checks its options before it starts; errors are one line (exit 2).",
        formatter_class=_Formatter,
        epilog=f"{PROG} COMMAND --help describes a command: what it reads and writes, and "
        "each option with its default.",
    )
    parser.add_argument("--version", action="version", version=f"av_core {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    common = _common()

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(
            name, parents=[common], formatter_class=_Formatter, **kwargs
        )
        return sub

    for adds in (
        add_demo,
        add_evaluate,
        add_simulate,
        add_traces,
        add_profile,
        add_collect,
        add_bench_engine,
    ):
        _name_metavars(adds(add))
    for sub in commands.choices.values():
        if isinstance(sub, _Parser):
            sub.commands = commands.choices
    return parser


def _name_metavars(parser: argparse.ArgumentParser) -> None:
    """Short metavars in ``--help`` from each option's type (``--steps N``, ``--out DIR``)."""
    names: dict[Any, str] = {
        types.positive_int: "N",
        types.non_negative_int: "N",
        types.seed: "SEED",
        types.positive_float: "MS",
        types.non_negative_float: "X",
        types.probability: "P",
        types.memory: "GAMMA",
        types.device: "DEVICE",
        types.model_path: "PATH",
        types.readable_file: "FILE",
        types.writable_file: "FILE",
        types.writable_dir: "DIR",
        depth_modes: "MODES",
    }
    for action in parser._actions:
        if action.metavar is not None or not action.option_strings:
            continue
        kind = action.type
        if getattr(kind, "__name__", "") == "integer list":
            action.metavar = "LIST"
        elif kind in names:
            action.metavar = names[kind]
        elif action.dest in ("out",):
            action.metavar = "DIR"


def _command_parser(
    parser: argparse.ArgumentParser, command: str | None
) -> argparse.ArgumentParser:
    """The subparser of ``command`` (the main parser when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    return parser


def _debug_requested(argv: Sequence[str]) -> bool:
    """``--debug`` before any ``--``, or ``AV_CORE_DEBUG`` on (read once it was checked)."""
    if settings.DEBUG.get():
        return True
    return "--debug" in argv[: argv.index("--")] if "--" in argv else "--debug" in argv


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so that the exit flush cannot fail."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def interrupted(command: str = PROG) -> int:
    """Ctrl-C: one line on stderr (when it is open), exit status 130."""
    with contextlib.suppress(OSError, AttributeError, ValueError):
        sys.stderr.write(f"\n{command}: interrupted\n")
    return EXIT_INTERRUPTED


def _stderr_writable() -> bool:
    """Whether ``sys.stderr`` can be written: it exists and, when it is a file descriptor, that
    descriptor is open for writing (``2>&-`` leaves it closed, or the number reused by the
    first file opened, read-only)."""
    stream = sys.stderr
    if stream is None:
        return False
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): trusted
        return True
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: only whether it is open
        try:
            os.fstat(descriptor)
        except OSError:
            return False
        return True
    try:
        mode = fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        return False
    return mode != os.O_RDONLY


@contextlib.contextmanager
def _stderr_open() -> Iterator[None]:
    """Standard error closed (``2>&-``, or no ``sys.stderr`` at all): notes, warnings and the
    error line go to /dev/null instead of failing the run, so that the exit status still tells
    what happened and nothing meant for stderr lands in stdout."""
    if _stderr_writable():
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns its exit status (0, 1 failed run, 2 bad option or input,
    130 interrupted, 141 output closed by the reader)."""
    try:
        with _stderr_open():
            return _main(argv)
    except KeyboardInterrupt:  # before the command was known, or while stderr was set up
        return interrupted()


def _main(argv: Sequence[str] | None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(arguments)
        if extras:  # named by the command they were given to, not by the top-level parser
            _command_parser(parser, args.command).error(
                f"unrecognized arguments: {' '.join(extras)}"
            )
    except SystemExit as stop:  # argparse printed the one-line error, or --help / --version
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    if args.command is None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(parser.format_help())
            sys.stderr.write(f"{PROG}: error: a command is required\n")
        return EXIT_USAGE
    command = f"{PROG} {args.command}"
    try:  # AV_CORE_DEBUG, and AV_CORE_SIMD read by the core: a bad value is a usage error
        settings.check(settings.CLI_SETTINGS)
    except ValueError as error:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"{command}: error: {one_line(str(error))}\n")
        return EXIT_USAGE
    debug = _debug_requested(arguments) or bool(args.debug)
    if sys.stdout is None:  # started with stdout closed (`av-core evaluate >&-`)
        with contextlib.suppress(OSError, AttributeError):
            sys.stderr.write(f"{command}: error: standard output is closed: nowhere to write\n")
        return EXIT_USAGE
    try:
        status: int = args.handler(args)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as error:
            raise CommandError(f"cannot write to standard output: {describe(error)}") from error
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return interrupted(command)
    except Exception as error:
        if debug:
            with contextlib.suppress(OSError, ValueError):
                traceback.print_exc()
        if isinstance(error, CommandError):
            message, code = one_line(str(error)), error.exit_code
        elif isinstance(error, ValueError | OSError | ImportError | EOFError | zlib.error):
            message, code = describe(error), EXIT_USAGE
        else:
            message = f"the run failed: {type(error).__name__}: {one_line(str(error))}"
            if not debug:
                message += " (run with --debug for the traceback)"
            code = EXIT_FAILED
        with contextlib.suppress(OSError):
            sys.stdout.flush()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"{command}: error: {message}\n")
            sys.stderr.flush()
        return code
