"""Progress on stderr for long ``av-core`` commands, only when stderr is a terminal.

With tqdm installed (``pip install 'av_core[progress]'``, part of ``av_core[demo]``) a tqdm bar;
without it a plain one-line counter redrawn with a carriage return, so the command line works
the same either way. Nothing is drawn for work that finishes within ``delay`` seconds, when
stderr is not a terminal (a pipe, a file, a test) or when the command was asked to be quiet.
"""

from __future__ import annotations

import importlib
import sys
import time
from types import TracebackType
from typing import Any, TextIO

#: Seconds before anything is drawn: quick work stays silent.
DEFAULT_DELAY = 1.0


def progress_enabled(quiet: bool, stream: TextIO | None = None) -> bool:
    """Whether to draw progress: not quiet and the stream (default stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return not quiet and bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """``with Progress(total, "simulate", enabled) as bar: bar.advance(1, "R=64")``."""

    def __init__(
        self,
        total: int,
        description: str,
        enabled: bool,
        *,
        unit: str = "step",
        delay: float = DEFAULT_DELAY,
        stream: TextIO | None = None,
    ) -> None:
        self.total = max(int(total), 0)
        self.description = description
        self.done = 0
        self._stream = sys.stderr if stream is None else stream
        self._enabled = enabled
        self._delay = delay
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._drawn = False
        self._bar: Any = None
        if enabled:
            try:
                tqdm = importlib.import_module("tqdm").tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(
                    total=self.total,
                    desc=description,
                    unit=unit,
                    file=self._stream,
                    leave=False,
                    delay=delay,
                    dynamic_ncols=True,
                )

    def advance(self, count: int = 1, status: str = "") -> None:
        """``count`` more units done; ``status`` says what was just finished."""
        self.done += count
        if not self._enabled:
            return
        if self._bar is not None:
            if status:
                self._bar.set_postfix_str(status, refresh=False)
            self._bar.update(count)
            return
        now = time.monotonic()
        if now - self._start < self._delay or now - self._last_draw < 0.2:
            return
        self._last_draw = now
        self._drawn = True
        tail = f" ({status})" if status else ""
        self._stream.write(f"\r{self.description}: {self.done}/{self.total}{tail}\x1b[K")
        self._stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._drawn:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._drawn = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["DEFAULT_DELAY", "Progress", "progress_enabled"]
