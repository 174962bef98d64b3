"""``python -m av_core`` runs the ``av-core`` command line: :func:`run` imports it inside a guard,
so that a Ctrl-C while its modules are still being imported ends as quietly as one during a
command (status 130, one line). (The ``av-core`` console script's entry point stays
``av_core.tools.cli:main``, whose import its generated wrapper does unguarded.)"""

from __future__ import annotations

import sys

#: ``av_core.tools.cli.common``'s ``PROG`` and ``EXIT_INTERRUPTED``, spelled out: an import
#: interrupted half-way cannot be relied on to import them (tests/cli/test_edges.py checks they
#: agree).
PROG, EXIT_INTERRUPTED = "av-core", 130


def run() -> int:
    """Imports the command line and runs it on ``sys.argv``; returns the exit status."""
    try:
        from av_core.tools.cli import main
    except KeyboardInterrupt:
        try:
            sys.stderr.write(f"\n{PROG}: interrupted\n")
        except (OSError, AttributeError, ValueError):
            pass
        return EXIT_INTERRUPTED
    return main()


if __name__ == "__main__":
    raise SystemExit(run())
