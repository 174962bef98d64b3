"""``python -m av_core`` runs the ``av-core`` command line; :func:`run` is also the ``av-core``
console script (``pyproject.toml``), so that a Ctrl-C while the command line's modules are still
being imported ends as quietly as one during a command (status 130, one line)."""

from __future__ import annotations

import sys

#: ``av_core.tools.cli.common``'s ``PROG`` and ``EXIT_INTERRUPTED``, spelled out: an import
#: interrupted half-way cannot be relied on to import them (tests/test_edges.py checks they agree).
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
