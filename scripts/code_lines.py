#!/usr/bin/env python3
"""Code lines of Rust files: lines that are not blank, not comments (`//`, `///`, `//!`,
`/* */`) and not inside a `#[cfg(test)]` item (an inline test module; a `mod tests;` file is
not counted unless named).

    python3 scripts/code_lines.py [FILE ...]

Without files it counts what issue 31 measures: `av_core/src/persist.rs`, every non-test
`.rs` file below `av_core/src/persist/` and the Python value tree `rust/src/tree.rs`.
"""

import glob
import re
import sys


def code_lines(text: str) -> int:
    count = depth = 0
    in_block = pending_test = False
    skip_depth: int | None = None  # brace depth at which a #[cfg(test)] item ends
    for raw in text.splitlines():
        line = raw.strip()
        if in_block:
            if "*/" not in line:
                continue
            in_block = False
            line = line.split("*/", 1)[1].strip()
        if line.startswith("/*"):
            in_block = "*/" not in line
            continue
        if not line or line.startswith("//"):
            continue
        # String literals and trailing comments hold no braces that count.
        code = re.sub(r'"(\\.|[^"\\])*"', '""', line)
        code = re.sub(r"'(\\.|[^'\\])'", "''", code).split("//", 1)[0]
        if skip_depth is None and line.startswith("#[cfg(test)]"):
            pending_test = True
            continue
        opens, closes = code.count("{"), code.count("}")
        if pending_test:
            pending_test = False
            if code.rstrip().endswith(";") and opens == 0:
                continue  # `mod tests;`
            skip_depth = depth
            depth += opens - closes
            if depth == skip_depth:
                skip_depth = None
            continue
        depth += opens - closes
        if skip_depth is not None:
            if depth <= skip_depth:
                skip_depth = None
            continue
        count += 1
    return count


def main() -> None:
    paths = sys.argv[1:] or [
        "av_core/src/persist.rs",
        *sorted(
            path
            for path in glob.glob("av_core/src/persist/**/*.rs", recursive=True)
            if not path.endswith("tests.rs") and "/tests/" not in path
        ),
        "rust/src/tree.rs",
    ]
    total = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            n = code_lines(f.read())
        total += n
        print(f"{n:6d}  {path}")
    print(f"{total:6d}  total")


if __name__ == "__main__":
    main()
