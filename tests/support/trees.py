"""Comparing trees of plain values (``state_dict`` output, refit reports, fixtures) exactly."""

from __future__ import annotations

import struct
from typing import Any


def exact(a: Any, b: Any, where: str = "", fitted: float = 0.0) -> None:
    """``a`` and ``b`` are the same tree: same types (a bool is not an int, an int not a float),
    same key order, floats with the same bits (NaN and -0.0 included). With ``fitted`` > 0,
    floats may differ by that much (absolute): for values a refit computed since the record."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for key in a:
            exact(a[key], b[key], f"{where}[{key!r}]", fitted)
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            exact(x, y, f"{where}[{i}]", fitted)
    elif isinstance(a, float) and fitted > 0.0:
        assert abs(a - b) <= fitted, f"{where}: {a!r} != {b!r} (± {fitted})"
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def with_later_fields(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved``, a ``state_dict`` an earlier build wrote, as this build writes the same state:
    the configuration fields added since (after the record's, in the declaration's order) at
    their defaults, which is what a state saved before a field existed reads as. Format 1
    holds a fixed set of fields and is returned as it is."""
    from av_core import AcceptanceEstimator

    if saved.get("format_version") != 2:
        return saved
    defaults = AcceptanceEstimator(1).config.to_dict()
    config = dict(saved["config"])
    for name, value in defaults.items():
        config.setdefault(name, value)
    return {**saved, "config": config}
