"""Text tables within the text width: a table too wide for one header line wraps its headers,
one still too wide splits into column groups repeating the first column; every cell, every
header word and every note is still there, read back by the rule under the headers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from av_core.tools.tables import TEXT_WIDTH, Table, col, fixed, render, wrap_text


def read_blocks(text: str, num_rows: int) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, column names, rows) of each block of a text table of ``num_rows`` rows: columns
    found from the rule of dashes under the headers (one run per column), the headers joined
    across their lines (those between the title and the rule)."""
    lines = text.splitlines()
    blocks = []
    rules = [i for i, line in enumerate(lines) if line and not set(line) - {"-", " "}]
    for index in rules:
        spans = [m.span() for m in re.finditer(r"-+", lines[index])]
        start = index - 1
        while start > 0 and lines[start - 1] and not lines[start - 1].startswith("a title"):
            start -= 1
        names = [
            " ".join(h[a:b].strip() for h in lines[start:index] if h[a:b].strip()) for a, b in spans
        ]
        rows = [
            [row[a:b].strip() for a, b in spans] for row in lines[index + 1 : index + 1 + num_rows]
        ]
        blocks.append((lines[start - 1], names, rows))
    return blocks


def make_table(rng: np.random.Generator, columns: int, name_words: int) -> Table:
    names = ["key"] + [
        " ".join(f"w{c}x{'y' * int(rng.integers(0, 6))}" for _ in range(name_words))
        for c in range(1, columns)
    ]
    table = Table("a title", [col(names[0], align="<")] + [col(n, fixed(3)) for n in names[1:]])
    for r in range(4):
        table.add(
            f"row{r}", *(float(v) for v in rng.normal(0, 10 ** rng.integers(0, 5), columns - 1))
        )
    table.notes.append("a note " * 40)
    return table


@pytest.mark.parametrize("seed", range(30))
def test_every_table_fits_and_keeps_every_cell_and_header(seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = make_table(rng, int(rng.integers(2, 16)), int(rng.integers(1, 4)))
    text = table.to_text()
    assert max(len(line) for line in text.splitlines()) <= TEXT_WIDTH, text
    blocks = read_blocks(text, 4)
    names = [c.name for c in table.columns]
    seen: dict[str, list[str]] = {}
    for number, (title, block_names, rows) in enumerate(blocks):
        assert title == ("a title" if number == 0 else "a title (continued)"), text
        assert block_names[0] == "key"
        assert len(rows) == 4, text
        for position, name in enumerate(block_names):
            seen[name] = [row[position] for row in rows]
    assert list(seen) == names, (list(seen), names)
    for index, column in enumerate(table.columns):
        assert seen[column.name] == [column.format(row[index]) for row in table.rows]
    assert " ".join(text.split()).count("a note") == 40  # the notes once, after the last block


def test_a_table_that_fits_is_unchanged_in_shape() -> None:
    table = Table("t", [col("name", align="<"), col("value", fixed(2))])
    table.add("a", 1.0)
    assert table.to_text().splitlines() == ["t", "name  value", "----  -----", "a      1.00"]


def test_headers_wrap_before_columns_split() -> None:
    columns = [col("R")] + [col(f"policy {i} verified/drafted", fixed(3)) for i in range(5)]
    table = Table("a title", columns)
    table.add(1, *[0.5] * 5)
    lines = table.to_text().splitlines()
    assert "(continued)" not in "\n".join(lines)
    assert max(len(line) for line in lines) <= TEXT_WIDTH
    (block,) = read_blocks("\n".join(lines), 1)
    assert block[1] == [c.name for c in table.columns]


def test_one_column_too_many_is_split_evenly() -> None:
    table = Table("a title", [col("R")] + [col(f"c{i}", fixed(4)) for i in range(12)])
    table.add(1, *[123456.0] * 12)  # 11 chars a cell: 13 columns need 167 columns
    blocks = read_blocks(table.to_text(), 1)
    sizes = [len(names) - 1 for _, names, _ in blocks]
    assert sum(sizes) == 12 and max(sizes) - min(sizes) <= 1, sizes


def test_preambles_wrap_in_text_only() -> None:
    line = "word " * 60
    text = render([], "text", [line.strip()])
    assert max(len(x) for x in text.splitlines()) <= TEXT_WIDTH
    assert " ".join(text.split()) == " ".join(line.split())
    assert text.splitlines()[1].startswith("  word")  # continuation lines indented
    assert render([], "markdown", [line.strip()]) == line.strip()
    assert wrap_text("a\n\nb") == "a\n\nb"
