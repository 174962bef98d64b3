"""The models: the small :class:`CausalLM` protocol (with KV caches, so a request costs linear, not
quadratic, work) and :class:`HuggingFaceCausalLM`, a transformers model loaded from a directory
or a GGUF file (``pip install 'av_core[collect]'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from av_core._native import InvalidValueError

if TYPE_CHECKING:
    import torch


class CausalLM(Protocol):
    """A causal LM with an explicit KV cache, as the collector needs it."""

    def new_cache(self) -> Any:
        """An empty cache."""

    def forward(self, input_ids: Sequence[int], cache: Any, num_logits: int) -> torch.Tensor:
        """Appends ``input_ids`` to the cache; returns the last ``num_logits`` logits [n, V]."""

    def cache_length(self, cache: Any) -> int:
        """Number of tokens the cache covers."""

    def crop(self, cache: Any, length: int) -> None:
        """Keeps the first ``length`` tokens of the cache."""


class HuggingFaceCausalLM:
    """:class:`CausalLM` over a transformers model (a local directory or a ``.gguf`` file).

    GGUF files are dequantized by transformers to ``dtype`` (float32 by default); this needs the
    ``gguf`` and ``accelerate`` packages. Logits come back as float32 on the CPU.
    """

    def __init__(self, model: Any, device: str) -> None:
        import inspect

        self.model = model
        self.device = device
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    @staticmethod
    def load(path: str | Path, device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
        """Loads ``(model, tokenizer)`` from a model directory or a GGUF file."""
        import importlib

        import torch

        transformers: Any = importlib.import_module("transformers")
        path = Path(path)
        if path.is_file() and path.suffix == ".gguf":
            location, extra = str(path.parent), {"gguf_file": path.name}
        elif path.is_dir():
            location, extra = str(path), {}
        else:
            raise InvalidValueError(
                f"path must be a model directory or a .gguf file, got {str(path)!r}"
            )
        tokenizer = transformers.AutoTokenizer.from_pretrained(location, **extra)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            location, dtype=getattr(torch, dtype), **extra
        )
        model.to(device).eval()
        return model, tokenizer

    def new_cache(self) -> Any:
        import importlib

        dynamic_cache: Any = importlib.import_module("transformers").DynamicCache
        try:
            return dynamic_cache(config=self.model.config)
        except TypeError:  # older transformers
            return dynamic_cache()

    def forward(self, input_ids: Sequence[int], cache: Any, num_logits: int) -> torch.Tensor:
        import torch

        ids = torch.as_tensor([list(input_ids)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            output = self.model(
                input_ids=ids,
                use_cache=True,
                logits_to_keep=num_logits,
                **{self._cache_argument: cache},
            )
        logits: torch.Tensor = output.logits[0, -num_logits:].float().cpu()
        return logits

    def cache_length(self, cache: Any) -> int:
        return int(cache.get_seq_length())

    def crop(self, cache: Any, length: int) -> None:
        remove = self.cache_length(cache) - length
        if remove > 0:
            cache.crop(-remove)  # a negative argument removes tokens in every transformers version
