"""Argument checks shared by the runtime, the engine integrations and the tools (numpy only, so
that any of them may use it without importing torch)."""

from __future__ import annotations

import numpy as np

from av_core._native import InvalidTypeError, InvalidValueError


def _check_int(value: object, name: str, minimum: int) -> int:
    """An int (Python or numpy, not bool) of any size that is at least ``minimum``, as a Python
    int; else ``TypeError``/``ValueError`` naming ``name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)
