"""Tiny llama-architecture GGUF models from seeded random weights, for tests and demos that must
run without a download: a target and a drafter sharing a vocabulary (needs the ``gguf``
package, in ``av_core[test]``).

The drafter is the target's weights plus seeded noise, so its distributions resemble the
target's and drafts are accepted at a moderate rate. Weights are float32: llama.cpp loads them
as they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from av_core._native import InvalidValueError

#: Special tokens of the SentencePiece-style vocabulary: unknown, begin and end of sequence.
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


#: The 256 byte tokens SentencePiece falls back to for a character it has no piece for.
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
#: The word boundary and every printable ASCII character, so that ASCII text tokenizes
#: character by character.
CHARACTER_TOKENS = ("\u2581", *(chr(c) for c in range(33, 127)))
MIN_VOCAB = len(SPECIAL_TOKENS) + len(BYTE_TOKENS) + len(CHARACTER_TOKENS)


def tiny_vocabulary(vocab_size: int = 384) -> list[str]:
    """``<unk>``, ``<s>``, ``</s>``, the byte tokens, the characters, then word pieces up to
    ``vocab_size`` tokens: any text tokenizes (characters, else bytes)."""
    if vocab_size < MIN_VOCAB:
        raise InvalidValueError(f"vocab_size must be >= {MIN_VOCAB}, got {vocab_size}")
    words = (f"\u2581w{i}" for i in range(vocab_size - MIN_VOCAB))
    return [*SPECIAL_TOKENS, *BYTE_TOKENS, *CHARACTER_TOKENS, *words]


def write_tiny_model(
    path: str | Path,
    *,
    vocab_size: int = 384,
    embedding: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    feed_forward: int = 64,
    context: int = 2048,
    seed: int = 0,
    noise: float = 0.0,
    noise_seed: int = 1,
    tokens: list[str] | None = None,
) -> Path:
    """Writes a llama-architecture GGUF with weights drawn from ``seed`` (plus ``noise`` times
    weights drawn from ``noise_seed``: a drafter resembling the target of the same ``seed``)."""
    import gguf

    path = Path(path)
    tokens = tiny_vocabulary(vocab_size) if tokens is None else tokens
    base = np.random.default_rng(seed)
    jitter = np.random.default_rng(noise_seed)

    def weight(*shape: int, scale: float) -> np.ndarray:
        w = base.standard_normal(shape) + noise * jitter.standard_normal(shape)
        return np.asarray(w * scale, dtype=np.float32)

    head_dim = embedding // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(context)
    writer.add_embedding_length(embedding)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(feed_forward)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    kinds = [gguf.TokenType.NORMAL] * len(tokens)
    for index, token in enumerate(tokens):
        if token in SPECIAL_TOKENS:
            kinds[index] = gguf.TokenType.UNKNOWN if token == "<unk>" else gguf.TokenType.CONTROL
        elif token in BYTE_TOKENS:
            kinds[index] = gguf.TokenType.BYTE
    writer.add_token_types(kinds)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    n_vocab = len(tokens)
    writer.add_tensor("token_embd.weight", weight(n_vocab, embedding, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(embedding, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, embedding, scale=0.6))
    for i in range(layers):
        scale = 1.0 / np.sqrt(embedding)
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(embedding, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(embedding, embedding, scale=scale))
        writer.add_tensor(
            f"blk.{i}.attn_k.weight", weight(kv_heads * head_dim, embedding, scale=scale)
        )
        writer.add_tensor(
            f"blk.{i}.attn_v.weight", weight(kv_heads * head_dim, embedding, scale=scale)
        )
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(embedding, embedding, scale=scale))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(embedding, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(feed_forward, embedding, scale=scale))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(feed_forward, embedding, scale=scale))
        down = 1.0 / np.sqrt(feed_forward)
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(embedding, feed_forward, scale=down))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_pair(
    directory: str | Path, *, vocab_size: int = 384, seed: int = 0
) -> tuple[Path, Path]:
    """``(target, drafter)``: a tiny target and a drafter that resembles it (same vocabulary)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = write_tiny_model(directory / "tiny-target.gguf", vocab_size=vocab_size, seed=seed)
    drafter = write_tiny_model(
        directory / "tiny-drafter.gguf", vocab_size=vocab_size, seed=seed, noise=0.5
    )
    return target, drafter


__all__ = [
    "BYTE_TOKENS",
    "CHARACTER_TOKENS",
    "MIN_VOCAB",
    "SPECIAL_TOKENS",
    "tiny_vocabulary",
    "write_tiny_model",
    "write_tiny_pair",
]
