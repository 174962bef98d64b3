"""What the engine integrations (:mod:`av_core.vllm`, :mod:`av_core.sglang`) share to check an
engine's interfaces before patching anything: the text of a signature, the object behind a
dotted name, and the installed engine's version. Nothing here imports an engine until asked."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def signature_text(function: Callable[..., Any]) -> str:
    """``(a, b=1, *, c=None)``: parameter names, kinds and defaults (as ``repr``), no
    annotations. The same text :mod:`ast` gives for the source (``ast.unparse`` of a constant
    default is its ``repr``), so live objects and released source compare as strings."""
    parts: list[str] = []
    star = False
    parameters = list(inspect.signature(function).parameters.values())
    for index, parameter in enumerate(parameters):
        kind = parameter.kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            parts.append(f"*{parameter.name}")
            star = True
        elif kind is inspect.Parameter.VAR_KEYWORD:
            parts.append(f"**{parameter.name}")
        else:
            if kind is inspect.Parameter.KEYWORD_ONLY and not star:
                parts.append("*")
                star = True
            text = parameter.name
            if parameter.default is not inspect.Parameter.empty:
                text += f"={parameter.default!r}"
            parts.append(text)
        is_last_positional_only = kind is inspect.Parameter.POSITIONAL_ONLY and (
            index + 1 == len(parameters)
            or parameters[index + 1].kind is not inspect.Parameter.POSITIONAL_ONLY
        )
        if is_last_positional_only:
            parts.append("/")
    return "(" + ", ".join(parts) + ")"


def resolve(module: ModuleType, dotted: str) -> Any:
    """The object ``module.<dotted>`` names, read without running descriptors (a static or class
    method as its function)."""
    value: Any = module
    for part in dotted.split("."):
        value = inspect.getattr_static(value, part)
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    return value


def engine_version(package: str) -> str:
    """``package.__version__``, else ``package.version.__version__`` (as a string)."""
    version = getattr(sys.modules.get(package), "__version__", None)
    if version is None:
        version = getattr(importlib.import_module(f"{package}.version"), "__version__", None)
    return str(version)
