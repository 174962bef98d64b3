"""A thin layer over llama-cpp-python's low-level (ctypes) API: loading a GGUF model, a context
with one KV stream per sequence, batched decodes that return the logits of the marked entries,
and removing a sequence's tail from the KV cache.

Everything the loop calls is listed in :data:`REQUIRED_API` and checked once, so an
llama-cpp-python without one of them fails with a ``ValueError`` naming it instead of an
``AttributeError`` in the middle of a run.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from av_core import _settings as settings
from av_core._native import InvalidValueError

#: The functions of llama-cpp-python's low-level API the integration calls.
REQUIRED_API = tuple(
    """llama_backend_init llama_log_set llama_model_default_params llama_model_load_from_file
    llama_model_free llama_model_get_vocab llama_vocab_n_tokens llama_vocab_type
    llama_vocab_get_text llama_vocab_is_eog llama_tokenize llama_model_chat_template
    llama_chat_apply_template llama_context_default_params llama_init_from_model llama_free
    llama_n_ctx llama_n_seq_max llama_get_memory llama_memory_clear llama_memory_seq_rm
    llama_batch_init llama_batch_free llama_decode llama_get_logits llama_state_get_size
    llama_state_get_data llama_state_set_data""".split()
)
#: The context parameters the integration sets.
REQUIRED_CONTEXT_FIELDS = tuple(
    "n_ctx n_batch n_ubatch n_seq_max n_threads n_threads_batch kv_unified".split()
)

_STATE: dict[str, Any] = {}


def llama_api(module: ModuleType | None = None) -> ModuleType:
    """llama-cpp-python's low-level module, checked to have every function and context field
    the loop uses (``ValueError`` naming the first missing one); the backend is initialised
    and llama.cpp's log output silenced once (``AV_CORE_LLAMA_LOG`` on keeps it)."""
    if module is None:
        try:
            import llama_cpp
        except ImportError as error:
            raise ImportError(
                'av_core.llama_cpp needs llama-cpp-python: pip install "av_core[llama]"'
            ) from error
    api: ModuleType = llama_cpp if module is None else module
    version = getattr(api, "__version__", "unknown")
    fields = {name for name, *_ in getattr(api.llama_context_params, "_fields_", [])}
    missing = [name for name in REQUIRED_API if not callable(getattr(api, name, None))]
    if missing:
        raise InvalidValueError(
            f"llama-cpp-python {version} has no {missing[0]}: av_core.llama_cpp needs the "
            "low-level API of llama-cpp-python >= 0.3.36"
        )
    for name in REQUIRED_CONTEXT_FIELDS:
        if name not in fields:
            raise InvalidValueError(
                f"llama-cpp-python {version}: llama_context_params has no field {name!r}: "
                "av_core.llama_cpp needs llama-cpp-python >= 0.3.36"
            )
    if _STATE.get("module") is not api:
        api.llama_backend_init()
        if not settings.LLAMA_LOG.get():
            callback = api.llama_log_callback(lambda level, text, data: None)
            _STATE["log_callback"] = callback  # kept alive: llama.cpp holds the pointer
            api.llama_log_set(callback, ctypes.c_void_p(0))
        _STATE["module"] = api
    return api


class Model:
    """A GGUF model loaded by llama.cpp (CPU). ``ValueError`` naming the file when it is missing,
    not GGUF, or llama.cpp cannot load it (truncated, corrupt, unsupported)."""

    def __init__(self, path: str | os.PathLike[str], *, api: ModuleType | None = None) -> None:
        self.api = llama_api(api)
        self.path = Path(path)
        if not self.path.exists():
            raise InvalidValueError(f"{self.path}: no such GGUF file")
        if not self.path.is_file():
            raise InvalidValueError(
                f"{self.path}: not a regular file (a GGUF model file is expected)"
            )
        with self.path.open("rb") as handle:
            magic = handle.read(4)
        if magic != b"GGUF":
            raise InvalidValueError(
                f"{self.path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')"
            )
        params = self.api.llama_model_default_params()
        params.n_gpu_layers = 0
        self.handle = self.api.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.handle:
            raise InvalidValueError(
                f"{self.path}: llama.cpp could not load this GGUF (corrupt or unsupported)"
            )
        self.vocab = self.api.llama_model_get_vocab(self.handle)
        self.n_vocab = int(self.api.llama_vocab_n_tokens(self.vocab))

    def vocabulary(self) -> list[bytes]:
        """Every token's text, by id."""
        text = self.api.llama_vocab_get_text
        return [bytes(text(self.vocab, i) or b"") for i in range(self.n_vocab)]

    def tokenize(self, text: str, *, parse_special: bool = False) -> list[int]:
        """The tokens of ``text``, with the model's begin-of-sequence token if it adds one."""
        data = text.encode("utf-8")
        size = len(data) + 16
        while True:
            buffer = (ctypes.c_int32 * size)()
            n = self.api.llama_tokenize(
                self.vocab, data, len(data), buffer, size, True, parse_special
            )
            if n >= 0:
                return list(buffer[:n])
            size = -n

    def prompt_tokens(self, text: str, *, chat: bool = True) -> list[int]:
        """The tokens of a prompt: with ``chat``, wrapped as one user message by the model's
        own chat template (llama.cpp's built-in templates; the text as it is when the model
        has none or llama.cpp does not know it)."""
        api = self.api
        template = api.llama_model_chat_template(self.handle, None) if chat else None
        if template:
            message = (api.llama_chat_message * 1)()
            message[0].role, message[0].content = b"user", text.encode("utf-8")
            size = n = 4 * len(text) + 256
            while n >= size:
                size = n + 1
                buffer = ctypes.create_string_buffer(size)
                n = api.llama_chat_apply_template(template, message, 1, True, buffer, size)
            if n > 0:
                applied = buffer.raw[:n].decode("utf-8", errors="replace")
                return self.tokenize(applied, parse_special=True)
        return self.tokenize(text)

    def is_end_of_generation(self, token: int) -> bool:
        return bool(self.api.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        if getattr(self, "handle", None):
            self.api.llama_model_free(self.handle)
            self.handle = None

    def __del__(self) -> None:
        self.close()


def check_same_vocabulary(target: Model, drafter: Model) -> None:
    """``ValueError`` naming both files unless target and drafter have the same vocabulary
    (type, size and every token's text): speculative sampling compares their distributions
    token by token."""
    api = target.api
    if api.llama_vocab_type(target.vocab) != api.llama_vocab_type(drafter.vocab):
        why = "tokenizer types differ"
    elif target.n_vocab != drafter.n_vocab:
        why = f"{target.n_vocab} against {drafter.n_vocab} tokens"
    else:
        pairs = enumerate(zip(target.vocabulary(), drafter.vocabulary(), strict=True))
        why = next((f"token {i} is {a!r} against {b!r}" for i, (a, b) in pairs if a != b), "")
    if why:
        raise InvalidValueError(
            f"{target.path} and {drafter.path}: target and drafter vocabularies differ ({why})"
        )


class Context:
    """A llama.cpp context over ``model`` for ``n_seq_max`` sequences, each with its own KV
    stream (``kv_unified = false``, llama.cpp's default: each gets ``n_ctx / n_seq_max`` cells).
    One batch holds up to ``n_ctx`` tokens, in one micro-batch when its shape allows."""

    def __init__(self, model: Model, *, n_ctx: int, n_seq_max: int, threads: int = 1) -> None:
        api = self.api = model.api
        self.model, self.n_vocab = model, model.n_vocab
        params = api.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = int(n_ctx)
        params.n_seq_max = int(n_seq_max)
        params.n_threads = params.n_threads_batch = int(threads)
        params.kv_unified = False
        self.handle = api.llama_init_from_model(model.handle, params)
        if not self.handle:
            raise InvalidValueError(
                f"{model.path}: llama.cpp could not create a context with n_ctx={n_ctx}, "
                f"n_seq_max={n_seq_max}"
            )
        self.n_ctx = int(api.llama_n_ctx(self.handle))
        self.n_seq_max = int(api.llama_n_seq_max(self.handle))
        self.memory = api.llama_get_memory(self.handle)
        self.batch = api.llama_batch_init(self.n_ctx, 0, 1)

    @property
    def seq_capacity(self) -> int:
        """KV cells each sequence has."""
        return self.n_ctx // self.n_seq_max

    def clear(self) -> None:
        self.api.llama_memory_clear(self.memory, True)

    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        seq_ids: Sequence[int],
        logits: Sequence[bool],
    ) -> npt.NDArray[np.float32]:
        """One ``llama_decode`` of the entries; the logits of the entries marked in ``logits``,
        in batch order, float32 [n_marked, V] (a copy)."""
        n = len(tokens)
        if n > self.n_ctx:
            raise InvalidValueError(
                f"n_batch: a batch of {n} tokens exceeds n_batch = {self.n_ctx}"
            )
        batch = self.batch
        batch.n_tokens = n
        for i in range(n):
            batch.token[i], batch.pos[i], batch.logits[i] = tokens[i], positions[i], logits[i]
            batch.n_seq_id[i], batch.seq_id[i][0] = 1, seq_ids[i]
        status = self.api.llama_decode(self.handle, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} ({self.model.path})")
        rows = sum(map(bool, logits))
        if rows == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        pointer = self.api.llama_get_logits(self.handle)
        return np.ctypeslib.as_array(pointer, shape=(rows, self.n_vocab)).copy()

    def save(self) -> tuple[Any, int]:
        """A copy of the context's state (its KV cache), for :meth:`restore`."""
        size = int(self.api.llama_state_get_size(self.handle))
        buffer = (ctypes.c_uint8 * size)()
        return buffer, int(self.api.llama_state_get_data(self.handle, buffer, size))

    def restore(self, state: tuple[Any, int]) -> None:
        """Puts back a state :meth:`save` took."""
        buffer, size = state
        if int(self.api.llama_state_set_data(self.handle, buffer, size)) != size:
            raise RuntimeError(
                f"llama_state_set_data did not read the saved state ({self.model.path})"
            )

    def remove(self, seq_id: int, start: int) -> None:
        """Drops sequence ``seq_id``'s KV entries at positions ``>= start``."""
        if not self.api.llama_memory_seq_rm(self.memory, seq_id, start, -1):
            raise RuntimeError(f"llama_memory_seq_rm({seq_id}, {start}) failed")

    def close(self) -> None:
        if getattr(self, "handle", None):
            self.api.llama_batch_free(self.batch)
            self.api.llama_free(self.handle)
            self.handle = None

    def __del__(self) -> None:
        self.close()


__all__ = [
    "REQUIRED_API",
    "REQUIRED_CONTEXT_FIELDS",
    "Context",
    "Model",
    "check_same_vocabulary",
    "llama_api",
]
