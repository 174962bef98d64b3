"""``python -m av_core`` runs the ``av-core`` command line."""

from av_core.tools.cli import main

raise SystemExit(main())
