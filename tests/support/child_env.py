"""The environment for a test's child Python process: it imports the same av_core as the tests.

``PYTHONPATH`` starts with the directory holding the ``av_core`` package this process imported
(``python/`` in a development checkout with the built module in place, site-packages after
``pip install``), so a child never picks up the source tree without its native module.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import av_core

PACKAGE_ROOT = Path(av_core.__file__).resolve().parent.parent


def child_env(
    *extra_paths: Path | str, drop: Iterable[str] = (), **variables: str
) -> dict[str, str]:
    """``os.environ`` without the variables whose names start with one of ``drop``, with
    ``PYTHONPATH`` = av_core's root, then ``extra_paths``, then the caller's own, and
    ``variables`` set."""
    prefixes = tuple(drop)
    env = {k: v for k, v in os.environ.items() if not (prefixes and k.startswith(prefixes))}
    paths = [str(PACKAGE_ROOT), *map(str, extra_paths)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(variables)
    return env
