"""Titled tables rendered as aligned text, Markdown or JSON (``av-core`` output).

A :class:`Table` keeps raw values (numbers, strings, ``None``) and one formatter per column.
Text output sizes every column to its widest cell and separates columns by two spaces, so no
two cells ever run together whatever their widths, and keeps every line within
:data:`TEXT_WIDTH` columns: a table too wide for one header line wraps its headers at spaces
(under each header a rule of its column's width), and one still too wide is split into column
groups, each repeating the first column. Markdown and JSON carry the same rows (JSON keeps the
unformatted numbers, NaN as ``null``). Formatters never print a negative zero (``-0.0%``,
``-0.000``): a value that rounds to zero prints as zero.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from av_core._native import InvalidValueError

Cell = str | int | float | None
#: The widest line of text output: tables, the notes under them and the lines above them.
TEXT_WIDTH = 100
#: Columns between two cells of a text table.
_GAP = 2
Formatter = Callable[[Any], str]


def _no_negative_zero(text: str) -> str:
    """``-0.000`` → ``0.000``, ``-0.0%`` → ``0.0%``, ``+-0.0``-style signs → ``+``."""
    if text.startswith("-") and text[1:] and set(text[1:]) <= set("0.%"):
        return text[1:]
    return text


def fixed(digits: int) -> Formatter:
    """``f"{x:.{digits}f}"``; NaN/None → ``n/a``."""

    def format_cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        return _no_negative_zero(f"{float(value):.{digits}f}")

    return format_cell


def signed(digits: int) -> Formatter:
    """``f"{x:+.{digits}f}"`` (zero prints as ``+0.000``); NaN/None → ``n/a``."""

    def format_cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        text = f"{float(value):+.{digits}f}"
        return "+" + text[1:] if text.startswith("-") and set(text[1:]) <= set("0.") else text

    return format_cell


def general(significant: int) -> Formatter:
    """``significant`` digits, trailing zeros kept so that a column reads evenly (``2.200``
    beside ``1.095``, not ``2.2``; ``38.00``, not ``38``); NaN/None → ``n/a``."""

    def format_cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        text = f"{float(value):#.{significant}g}"
        return _no_negative_zero(text[:-1] if text.endswith(".") else text)

    return format_cell


def percent_change(ratio: float, digits: int = 1) -> str:
    """``ratio - 1`` as a signed percentage, never ``-0.0%``: 0.99996 → ``+0.0%``."""
    text = f"{ratio - 1.0:+.{digits}%}"
    if text.startswith("-") and set(text[1:]) <= set("0.%"):
        return "+" + text[1:]
    return text


def text_cell(value: Any) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Column:
    """A column: its header, how its cells are printed, and its alignment."""

    name: str
    format: Formatter = text_cell
    align: str = ">"  # ">" right (numbers), "<" left (names)


def col(name: str, format_cell: Formatter = text_cell, align: str = ">") -> Column:
    return Column(name, format_cell, align)


@dataclass
class Table:
    """A titled table; ``rows`` hold raw values, one per column."""

    title: str
    columns: list[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise InvalidValueError(
                f"table {self.title!r}: a row needs {len(self.columns)} cells, got {len(cells)}"
            )
        self.rows.append(list(cells))

    def _formatted(self) -> list[list[str]]:
        return [
            [column.format(cell) for column, cell in zip(self.columns, row, strict=True)]
            for row in self.rows
        ]

    def to_text(self, width: int = TEXT_WIDTH) -> str:
        """Aligned text within ``width`` columns where the cells allow it (module doc)."""
        cells = self._formatted()
        widths = [
            max([len(column.name), *(len(row[i]) for row in cells)])
            for i, column in enumerate(self.columns)
        ]
        if _span(widths) <= width:
            return "\n".join(self._block(self.title, range(len(widths)), widths, cells))
        # Headers wrapped at spaces: a column is as wide as its widest cell or header word,
        # then widened back to its whole header, the shortest headers first, while room is left.
        narrow = [
            max([*(len(word) for word in column.name.split()), *(len(row[i]) for row in cells)])
            for i, column in enumerate(self.columns)
        ]
        for i in sorted(range(len(narrow)), key=lambda i: widths[i] - narrow[i]):
            if _span(narrow) + widths[i] - narrow[i] <= width:
                narrow[i] = widths[i]
        groups = _column_groups(narrow, width)
        lines: list[str] = []
        for number, group in enumerate(groups):
            title = self.title if number == 0 else f"{self.title} (continued)"
            if number:
                lines.append("")
            lines += self._block(title, [0, *group], narrow, cells, notes=number == len(groups) - 1)
        return "\n".join(lines)

    def _block(
        self,
        title: str,
        chosen: Sequence[int],
        widths: Sequence[int],
        cells: Sequence[Sequence[str]],
        notes: bool = True,
    ) -> list[str]:
        """The title, the headers of the ``chosen`` columns (wrapped to their ``widths``,
        bottom-aligned), a rule under each, the rows and (with ``notes``) the notes."""
        columns = [self.columns[i] for i in chosen]
        sizes = [widths[i] for i in chosen]

        def line(values: Sequence[str]) -> str:
            parts = [
                f"{value:{column.align}{size}}"
                for value, column, size in zip(values, columns, sizes, strict=True)
            ]
            return (" " * _GAP).join(parts).rstrip()

        headers = [
            textwrap.wrap(c.name, size, break_long_words=False, break_on_hyphens=False) or [""]
            for c, size in zip(columns, sizes, strict=True)
        ]
        depth = max(len(header) for header in headers)
        headers = [[""] * (depth - len(header)) + header for header in headers]
        out = [title]
        out += [line([header[row] for header in headers]) for row in range(depth)]
        out.append((" " * _GAP).join("-" * size for size in sizes))
        out += [line([row[i] for i in chosen]) for row in cells]
        if notes:
            for note in self.notes:
                out.extend(textwrap.wrap(note, width=TEXT_WIDTH) or [""])
        return out

    def to_markdown(self) -> str:
        def escape(text: str) -> str:
            return text.replace("|", "\\|")

        out = [f"**{escape(self.title)}**", ""]
        out.append("| " + " | ".join(escape(c.name) for c in self.columns) + " |")
        out.append("|" + "|".join("---:" if c.align == ">" else ":---" for c in self.columns) + "|")
        out.extend("| " + " | ".join(escape(v) for v in row) + " |" for row in self._formatted())
        if self.notes:
            out.append("")
            out.extend(self.notes)
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "columns": [c.name for c in self.columns],
            "rows": [
                {c.name: json_value(v) for c, v in zip(self.columns, row, strict=True)}
                for row in self.rows
            ],
            "notes": list(self.notes),
        }


def json_value(value: Any) -> Any:
    """A JSON-safe value: NaN and infinities become ``None``, numpy scalars plain numbers."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        number = float(value)
        return number if math.isfinite(number) else None
    return str(value)


def _span(widths: Sequence[int]) -> int:
    """Columns a text line of cells this wide takes, gaps included."""
    return sum(widths) + _GAP * max(len(widths) - 1, 0)


def _column_groups(widths: Sequence[int], width: int) -> list[list[int]]:
    """Columns 1.. in as few contiguous groups as fit within ``width`` beside column 0, as even
    in count as fits (the fewest groups found greedily, then the columns dealt out evenly), so
    that a table one column too wide does not end in a group of one."""
    rest = list(range(1, len(widths)))

    def fits(group: Sequence[int]) -> bool:
        return _span([widths[i] for i in [0, *group]]) <= width

    greedy: list[list[int]] = [[]]
    for i in rest:
        if greedy[-1] and not fits([*greedy[-1], i]):
            greedy.append([])
        greedy[-1].append(i)
    count = len(greedy)
    size = -(-len(rest) // count)
    even = [rest[start : start + size] for start in range(0, len(rest), size)]
    return even if len(even) == count and all(fits(group) for group in even) else greedy


def wrap_text(text: str, width: int = TEXT_WIDTH) -> str:
    """Each line of ``text`` wrapped at spaces to ``width`` columns, its continuation lines
    indented by two spaces (a word longer than the width stays whole)."""
    return "\n".join(
        "\n".join(
            textwrap.wrap(
                line,
                width,
                subsequent_indent="  ",
                break_long_words=False,
                break_on_hyphens=False,
            )
            or [""]
        )
        for line in text.splitlines()
    )


def render(tables: Sequence[Table], style: str, preamble: Sequence[str] = ()) -> str:
    """Tables one after another, a blank line between (``style``: ``text`` or ``markdown``);
    in text, the ``preamble`` lines wrapped to :data:`TEXT_WIDTH`."""
    blocks: list[str] = []
    if preamble:
        lines = "\n".join(preamble)
        blocks.append(wrap_text(lines) if style == "text" else lines)
    for table in tables:
        blocks.append(table.to_markdown() if style == "markdown" else table.to_text())
    return "\n\n".join(blocks)


def to_json(document: dict[str, Any]) -> str:
    """``document`` as indented JSON (NaN refused: use :func:`json_value`)."""
    return json.dumps(document, indent=1, allow_nan=False)


__all__ = [
    "TEXT_WIDTH",
    "Column",
    "Table",
    "col",
    "fixed",
    "general",
    "json_value",
    "percent_change",
    "render",
    "signed",
    "text_cell",
    "to_json",
    "wrap_text",
]
