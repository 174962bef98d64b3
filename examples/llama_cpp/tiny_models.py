"""Writes two tiny llama-architecture GGUF models that share a vocabulary, a target and a
drafter, from seeded random weights: what CI runs the C example on (no download).

    python examples/llama_cpp/tiny_models.py OUT_DIR [--seed 0] [--noise 0.06] [--other-vocab]

writes OUT_DIR/target.gguf and OUT_DIR/drafter.gguf (and, with --other-vocab,
OUT_DIR/other_vocab.gguf: a drafter whose vocabulary is one token longer, for the vocabulary
check). The vocabulary is a SentencePiece-style one: <unk>, <s>, </s>, the 256 byte tokens
(so any text tokenizes) and a few dozen word pieces. The drafter is the target's weights plus
seeded noise (by default 6% of each matrix's spread, --noise), so its distribution is close to
the target's but not equal: acceptance lands between the trivial 0 and 1 (about 0.7 at
temperature 1). Needs numpy and the `gguf` package.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

N_EMBD = 64
N_HEAD = 4
N_FF = 128
CONTEXT = 4096
WORDS = (
    "def return if else for in while import from class self print None True False and or not "
    "the a of to is list int str len range value result"
).split()


def vocabulary(extra: int = 0) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (1 normal, 2 unknown, 3 control, 6 byte)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = [f"\u2581{w}" for w in WORDS] + ["\u2581", "(", ")", ":", "\u2581=", "\n"]
    pieces += [f"\u2581extra{i}" for i in range(extra)]
    tokens += pieces
    types += [1] * len(pieces)
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def weights(rng: np.random.Generator, n_vocab: int, n_layer: int) -> dict[str, np.ndarray]:
    """Random float32 weights in numpy's row-major shapes (out, in), as gguf-py expects."""

    def matrix(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    tensors = {
        "token_embd.weight": matrix(n_vocab, N_EMBD, np.sqrt(N_EMBD)),
        "output_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        # A large output scale makes the next-token distributions peaked, as a real model's are.
        "output.weight": matrix(n_vocab, N_EMBD, 6.0),
    }
    for i in range(n_layer):
        tensors.update(
            {
                f"blk.{i}.attn_norm.weight": np.ones(N_EMBD, dtype=np.float32),
                f"blk.{i}.attn_q.weight": matrix(N_EMBD, N_EMBD, 1.0),
                f"blk.{i}.attn_k.weight": matrix(N_EMBD, N_EMBD, 1.0),
                f"blk.{i}.attn_v.weight": matrix(N_EMBD, N_EMBD, 1.0),
                f"blk.{i}.attn_output.weight": matrix(N_EMBD, N_EMBD, 1.0),
                f"blk.{i}.ffn_norm.weight": np.ones(N_EMBD, dtype=np.float32),
                f"blk.{i}.ffn_gate.weight": matrix(N_FF, N_EMBD, 1.0),
                f"blk.{i}.ffn_up.weight": matrix(N_FF, N_EMBD, 1.0),
                f"blk.{i}.ffn_down.weight": matrix(N_EMBD, N_FF, 1.0),
            }
        )
    return tensors


def write_model(
    path: Path, tensors: dict[str, np.ndarray], n_layer: int, vocab_extra: int = 0
) -> None:
    import gguf  # the `gguf` package: only this script needs it

    tokens, scores, types = vocabulary(vocab_extra)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all float32
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_pair(
    out_dir: Path, seed: int = 0, noise: float = 0.06, other_vocab: bool = False
) -> dict[str, Path]:
    """Writes the pair (and the mismatched drafter) into out_dir; returns their paths. The
    drafter's matrices are the target's plus `noise` times their spread of seeded noise."""
    out_dir.mkdir(parents=True, exist_ok=True)
    n_vocab = len(vocabulary()[0])
    rng = np.random.default_rng(seed)
    target = weights(rng, n_vocab, n_layer=2)
    rng_noise = np.random.default_rng(seed + 1)
    drafter = {
        name: (array + noise * array.std() * rng_noise.standard_normal(array.shape)).astype(
            np.float32
        )
        if array.ndim == 2
        else array
        for name, array in target.items()
    }
    paths = {"target": out_dir / "target.gguf", "drafter": out_dir / "drafter.gguf"}
    write_model(paths["target"], target, n_layer=2)
    write_model(paths["drafter"], drafter, n_layer=2)
    if other_vocab:
        extra = weights(np.random.default_rng(seed + 2), n_vocab + 1, n_layer=1)
        paths["other_vocab"] = out_dir / "other_vocab.gguf"
        write_model(paths["other_vocab"], extra, n_layer=1, vocab_extra=1)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=0.06)
    parser.add_argument("--other-vocab", action="store_true")
    args = parser.parse_args()
    for role, path in write_pair(args.out_dir, args.seed, args.noise, args.other_vocab).items():
        print(f"{role}: {path}")


if __name__ == "__main__":
    main()
