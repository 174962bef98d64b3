"""The test suite's own import setup: no folder of tests/ stands in for an installed package.

tests/vllm, tests/sglang and tests/llama_cpp are folders of tests named like the engines. Were
tests/ itself on ``sys.path``, ``import vllm`` would find tests/vllm as a namespace package when
vLLM is not installed, and code that asks ``importlib.util.find_spec("vllm")`` (or tries
``import vllm``) would take vLLM for installed. These tests ask the import system itself, with
the engines' real or fake modules taken out of ``sys.modules`` for the question.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
ENGINES = ("vllm", "sglang", "llama_cpp")
FOLDERS = sorted(
    p.name for p in TESTS.iterdir() if p.is_dir() and p.name.isidentifier() and p.name[0] != "_"
)


def _inside_tests(location: str | None) -> bool:
    return location is not None and Path(location).resolve().is_relative_to(TESTS)


@pytest.mark.parametrize("name", sorted(set(ENGINES) | set(FOLDERS)))
def test_no_test_folder_is_importable_under_its_own_name(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        monkeypatch.delitem(sys.modules, module)
    spec = importlib.util.find_spec(name)
    found = [] if spec is None else [spec.origin, *(spec.submodule_search_locations or [])]
    assert [where for where in found if _inside_tests(where)] == []


def test_the_tests_folder_is_not_on_sys_path() -> None:
    on_path = [entry for entry in sys.path if Path(entry or ".").resolve() == TESTS]
    assert on_path == []
