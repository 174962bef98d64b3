"""Typed values for the ``av-core`` command line, checked when the arguments are parsed.

Every converter takes the option's text and returns the value, or raises
``argparse.ArgumentTypeError`` with a message that quotes the text; argparse prefixes the
option's name (``argument --steps: must be a positive integer, got '0'``). Nothing here reads
a trace or loads a model, so a bad option is refused before any work starts.

Integer lists (``--concurrency``, ``--tokens``, ``--draft-depths``) share one grammar
(:func:`parse_int_list`), documented in ``docs/cli.md``::

    LIST  := ITEM ("," ITEM)*
    ITEM  := N | LOW "-" HIGH
    LOW-HIGH  doubles from LOW up to HIGH: LOW, 2*LOW, 4*LOW, ..., HIGH
              (HIGH must be LOW times a power of two, LOW <= HIGH)

The values, in the order written, must be strictly increasing (so no value repeats) and within
the option's bounds. ``1-512`` is 1, 2, 4, ..., 512; ``1,2,3,4,8-64`` is 1, 2, 3, 4, 8, 16, 32,
64; ``3-24`` is 3, 6, 12, 24. ``8-2`` (decreasing) and ``3-20`` (20 is not 3 doubled) are refused.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from av_core._native import InvalidValueError

#: Upper bound of a count option (an int32 everywhere downstream).
MAX_COUNT = 2**31 - 1
#: Largest seed: numpy's and torch's generators both take any value below 2**63.
MAX_SEED = 2**63 - 1

_INT = re.compile(r"[+-]?\d+")
_DIGITS = re.compile(r"\d+")


def _int(text: str, what: str) -> int:
    stripped = text.strip()
    if not _INT.fullmatch(stripped):
        raise InvalidValueError(f"{what} must be an integer, got {text!r}")
    return int(stripped)


def parse_int_list(
    text: str, *, low: int = 1, high: int = MAX_COUNT, allow_empty: bool = False
) -> list[int]:
    """The integer-list grammar of the module docstring; ``ValueError`` quoting the text.

    ``allow_empty``: an empty (or blank) text is the empty list, otherwise refused.
    """
    if not text.strip():
        if allow_empty:
            return []
        raise InvalidValueError(
            "expected a comma-separated list of integers or LOW-HIGH ranges, got ''"
        )
    values: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise InvalidValueError(f"empty item in {text!r} (write 1,2,4 or 1-512)")
        dash = item.find("-", 1)
        if dash > 0:
            first, second = item[:dash], item[dash + 1 :]
            if not (_DIGITS.fullmatch(first.strip()) and _DIGITS.fullmatch(second.strip())):
                raise InvalidValueError(f"range {item!r} must be LOW-HIGH with two integers >= 1")
            start, stop = int(first), int(second)
            if start > stop:
                raise InvalidValueError(
                    f"range {item!r} decreases: write LOW-HIGH with LOW <= HIGH, e.g. "
                    f"{stop}-{start}"
                )
            if start < 1:
                raise InvalidValueError(
                    f"range {item!r} must start at 1 or more (it doubles from LOW)"
                )
            ratio = stop // start
            if stop % start or ratio & (ratio - 1):
                below = start * 2 ** int(math.log2(stop / start))
                raise InvalidValueError(
                    f"range {item!r} doubles from {start} and does not reach {stop}: HIGH must be "
                    f"LOW times a power of two (e.g. {start}-{below}), or list the values"
                )
            value = start
            while value <= stop:
                values.append(value)
                value *= 2
        else:
            try:
                values.append(_int(item, "each item"))
            except ValueError:
                raise InvalidValueError(
                    f"item {item!r} is neither an integer nor a LOW-HIGH range"
                ) from None
    for value in values:
        if not low <= value <= high:
            bounds = f">= {low}" if high >= MAX_COUNT else f"in [{low}, {high}]"
            raise InvalidValueError(f"values must be {bounds}, got {value} in {text!r}")
    for before, after in zip(values, values[1:], strict=False):
        if after <= before:
            raise InvalidValueError(
                f"values must increase (each listed once), got {after} after {before} in {text!r}"
            )
    return values


def int_list(
    *, low: int = 1, high: int = MAX_COUNT, allow_empty: bool = False
) -> Callable[[str], list[int]]:
    """An argparse type for :func:`parse_int_list`."""

    def convert(text: str) -> list[int]:
        try:
            return parse_int_list(text, low=low, high=high, allow_empty=allow_empty)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = "integer list"
    return convert


def bounded_int(low: int, high: int = MAX_COUNT, what: str = "") -> Callable[[str], int]:
    """An argparse type for an integer in ``[low, high]``."""
    name = what or (
        "a positive integer" if low == 1 else "a non-negative integer" if low == 0 else "an integer"
    )

    def convert(text: str) -> int:
        try:
            value = _int(text, "value")
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {name}, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be {name} in [{low}, {high}], got {text!r}"
                if high < MAX_COUNT
                else f"must be {name}, got {text!r}"
            )
        return value

    convert.__name__ = name
    return convert


positive_int = bounded_int(1)
non_negative_int = bounded_int(0)
seed = bounded_int(0, MAX_SEED, "a seed (an integer in [0, 2**63 - 1])")


def bounded_float(
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    what: str = "",
) -> Callable[[str], float]:
    """An argparse type for a finite float in an interval (open or closed at each end)."""
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    interval = f"{left}{low:g}, {'inf' if math.isinf(high) else f'{high:g}'}{right}"
    name = what or f"a finite number in {interval}"

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {name}, got {text!r}") from None
        inside = (
            math.isfinite(value)
            and (value > low if low_open else value >= low)
            and (value < high if high_open else value <= high)
        )
        if not inside:
            raise argparse.ArgumentTypeError(f"must be {name}, got {text!r}")
        return value

    convert.__name__ = name
    return convert


non_negative_float = bounded_float(0.0, what="a finite number >= 0")
positive_float = bounded_float(0.0, low_open=True, what="a finite number > 0")
probability = bounded_float(0.0, 1.0, what="a probability in [0, 1]")
memory = bounded_float(0.0, 1.0, high_open=True, what="a memory gamma in [0, 1)")

_DEVICE = re.compile(r"(cpu|mps|(cuda|xpu)(:\d+)?)")


def device(text: str) -> str:
    """``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``xpu`` or ``xpu:N``."""
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda, cuda:N, mps or xpu, got {text!r}")
    return text


def path_text(text: str) -> Path:
    """An argparse type for a path that is not checked yet, only refused when empty: ``''`` is
    no path (``Path('')`` would quietly be the current folder; an unset shell variable)."""
    if text == "":
        raise argparse.ArgumentTypeError("must be a path, got '' (an empty string)")
    return Path(text)


def model_path(text: str) -> Path:
    """An existing model directory or ``.gguf`` file (checked before anything is loaded)."""
    path = path_text(text)
    if path.is_dir():
        return path
    if path.is_file():
        if path.suffix != ".gguf":
            raise argparse.ArgumentTypeError(
                f"must be a model directory or a .gguf file, got the file {text!r}"
            )
        if not os.access(path, os.R_OK):
            raise argparse.ArgumentTypeError(f"cannot read {text!r} (permission denied)")
        return path
    raise argparse.ArgumentTypeError(f"no such model directory or .gguf file: {text!r}")


def readable_file(text: str) -> Path:
    """An existing, readable regular file."""
    path = path_text(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, expected a file")
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text!r} (permission denied)")
    return path


def check_writable_file(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file, or ``None`` when it can."""
    if path.is_dir():
        return f"{str(path)!r} is a directory, expected a file name"
    if path.exists():
        if os.access(path, os.W_OK):
            return None
        return f"cannot write {str(path)!r} (permission denied)"
    parent = path.parent
    if not parent.exists():
        return f"cannot write {str(path)!r}: the folder {str(parent)!r} does not exist"
    if not parent.is_dir():
        return f"cannot write {str(path)!r}: {str(parent)!r} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot write {str(path)!r}: the folder {str(parent)!r} is not writable"
    return None


def check_writable_dir(path: Path) -> str | None:
    """Why ``path`` cannot be used (created if missing) as an output folder, or ``None``."""
    if path.exists():
        if not path.is_dir():
            return f"{str(path)!r} is a file, expected a folder"
        if os.access(path, os.W_OK | os.X_OK):
            return None
        return f"folder {str(path)!r} is not writable"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot create the folder {str(path)!r}: {str(ancestor)!r} is a file"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot create the folder {str(path)!r}: {str(ancestor)!r} is not writable"
    return None


def _os_problem(path: Path, what: str, error: OSError) -> str:
    return f"cannot {what} {str(path)!r}: {error.strerror or error}"


def prepare_output_dir(path: Path) -> str | None:
    """Creates the output folder ``path`` (if missing) and writes and removes a probe file in
    it: why it cannot be used, or ``None``. The permission checks of :func:`check_writable_dir`
    cannot see a read-only file system, ``/proc`` or ``/sys`` (nor anything, as root); this
    finds those before any work, so that no result is lost to a folder that refuses it."""
    problem = check_writable_dir(path)
    if problem is not None:
        return problem
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return _os_problem(path, "create the folder", error)
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".av-core-probe-"):
            pass
    except OSError as error:
        return _os_problem(path, "write into the folder", error)
    return None


def probe_output_file(path: Path) -> str | None:
    """Opens ``path`` for appending (an existing file is left as it was; a missing one is created
    and removed again): why it cannot be written, or ``None``. Catches what
    :func:`check_writable_file`'s permission checks cannot see (read-only file systems,
    ``/proc``, ``/sys``, root), before any model is loaded."""
    problem = check_writable_file(path)
    if problem is not None:
        return problem
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as error:
        return _os_problem(path, "write", error)
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()
    return None


def _checked_path(text: str, check: Callable[[Path], str | None]) -> Path:
    path = path_text(text)
    problem = check(path)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return path


def writable_file(text: str) -> Path:
    """An argparse type for an output file whose folder exists and can be written."""
    return _checked_path(text, check_writable_file)


def writable_dir(text: str) -> Path:
    """An argparse type for an output folder (created later when missing)."""
    return _checked_path(text, check_writable_dir)


__all__ = [
    "MAX_COUNT",
    "MAX_SEED",
    "bounded_float",
    "bounded_int",
    "check_writable_dir",
    "check_writable_file",
    "device",
    "int_list",
    "memory",
    "model_path",
    "non_negative_float",
    "non_negative_int",
    "parse_int_list",
    "path_text",
    "positive_float",
    "prepare_output_dir",
    "probe_output_file",
    "positive_int",
    "probability",
    "readable_file",
    "seed",
    "writable_dir",
    "writable_file",
]
