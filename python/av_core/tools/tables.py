"""Titled tables rendered as aligned text, Markdown or JSON (``av-core`` output).

A :class:`Table` keeps raw values (numbers, strings, ``None``) and one formatter per column.
Text output sizes every column to its widest cell and separates columns by two spaces, so no
two cells ever run together whatever their widths; Markdown and JSON carry the same rows
(JSON keeps the unformatted numbers, NaN as ``null``). Formatters never print a negative zero
(``-0.0%``, ``-0.000``): a value that rounds to zero prints as zero.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Cell = str | int | float | None
#: Notes under a text table wrap at this width.
NOTE_WIDTH = 100
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
            raise ValueError(
                f"table {self.title!r}: a row needs {len(self.columns)} cells, got {len(cells)}"
            )
        self.rows.append(list(cells))

    def _formatted(self) -> list[list[str]]:
        return [
            [column.format(cell) for column, cell in zip(self.columns, row, strict=True)]
            for row in self.rows
        ]

    def to_text(self) -> str:
        cells = self._formatted()
        widths = [
            max([len(column.name), *(len(row[i]) for row in cells)])
            for i, column in enumerate(self.columns)
        ]

        def line(values: Sequence[str]) -> str:
            parts = [
                f"{value:{column.align}{width}}"
                for value, column, width in zip(values, self.columns, widths, strict=True)
            ]
            return "  ".join(parts).rstrip()

        header = line([c.name for c in self.columns])
        out = [self.title, header, "-" * len(header)]
        out.extend(line(row) for row in cells)
        for note in self.notes:
            out.extend(textwrap.wrap(note, width=NOTE_WIDTH) or [""])
        return "\n".join(out)

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


def render(tables: Sequence[Table], style: str, preamble: Sequence[str] = ()) -> str:
    """Tables one after another, a blank line between (``style``: ``text`` or ``markdown``)."""
    blocks: list[str] = []
    if preamble:
        blocks.append("\n".join(preamble))
    for table in tables:
        blocks.append(table.to_markdown() if style == "markdown" else table.to_text())
    return "\n\n".join(blocks)


def to_json(document: dict[str, Any]) -> str:
    """``document`` as indented JSON (NaN refused: use :func:`json_value`)."""
    return json.dumps(document, indent=1, allow_nan=False)


__all__ = [
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
]
