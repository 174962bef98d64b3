"""The fixtures of earlier builds' saved states (``tests/data/legacy``) and the generator scripts
that wrote them, loaded as modules (each script runs against its own build's API)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

DATA = Path(__file__).resolve().parents[1] / "data" / "legacy"


def generator(name: str) -> ModuleType:
    """``tests/data/legacy/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, DATA / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
