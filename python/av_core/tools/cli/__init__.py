"""The ``av-core`` command line (also ``python -m av_core``); reference in ``docs/cli.md``.

One error boundary: every expected failure (a bad option, a missing, unreadable or malformed
file, a missing extra) prints ``av-core COMMAND: error: MESSAGE`` on one line of stderr, naming
the option or the file, and exits 2; a run that fails for another reason prints one line too and
exits 1. A traceback is printed only with ``--debug`` or ``AV_CORE_DEBUG=1``. Output closed by
the reader (``av-core evaluate | head -1``) ends quietly with status 141, like a tool killed by
SIGPIPE. Options are checked while the arguments are parsed (:mod:`av_core.tools.argtypes`),
before a trace is read or a model loaded; output paths are checked writable before the work
starts.

Results go to stdout (text tables, ``--markdown`` or ``--json``); progress, notes (``wrote
FILE``), warnings and errors go to stderr. Progress is drawn only on a terminal, and ``-q``
silences progress and notes.

One module per command group: :mod:`~av_core.tools.cli.analysis` (``demo``, ``evaluate``,
``simulate``) and :mod:`~av_core.tools.cli.data` (``traces``, ``profile``, ``collect``), on what
:mod:`~av_core.tools.cli.common` shares; :mod:`~av_core.tools.cli.main` builds the parser and runs
a command.
"""

from av_core.tools.cli.common import (
    DEBUG_VARIABLE,
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    CommandError,
    RunFailed,
    shipped_names,
)
from av_core.tools.cli.data import collect_summary
from av_core.tools.cli.main import build_parser, main

__all__ = [
    "DEBUG_VARIABLE",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "PROG",
    "CommandError",
    "RunFailed",
    "build_parser",
    "collect_summary",
    "main",
    "shipped_names",
]
