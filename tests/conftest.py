"""Fixtures shared across test folders. How test files import each other and tests/support is
set in pyproject.toml's ``[tool.pytest.ini_options]``."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_pair() -> tuple[str, str]:
    """The tiny target and drafter GGUF files the llama.cpp tests load (written once)."""
    from llama_fakes import tiny_models

    return tiny_models()
