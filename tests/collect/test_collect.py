"""Speculative sampling in the collector: exact laws on tiny distributions, cache bookkeeping.

No model files or transformers needed: the sampling math is pure, and the decoding loop runs on
a toy causal LM whose logits depend on the whole prefix (so a misaligned KV cache shows).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from av_core.tools.collect import (  # noqa: E402
    CollectConfig,
    Prompt,
    acceptance_probability,
    collect_prompts,
    completed_prompt_ids,
    draft_feature_columns,
    draft_labels,
    read_prompts,
    residual_distribution,
    sample_token,
    sampling_distribution,
    speculative_decode,
    verify_drafts,
    write_prompts,
)
from av_core.tools.trace import UNLABELED, read_trace  # noqa: E402

distributions = st.lists(
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=2, max_size=6
).filter(lambda w: sum(w) > 1e-3)


def normalized(weights: list[float]) -> Any:
    t = torch.tensor(weights, dtype=torch.float64)
    return t / t.sum()


# ----------------------------------------------------------------------------- exact laws


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_one_draft_emits_the_target_distribution_exactly(data: st.DataObject) -> None:
    """Σ_x q(x)·[a(x)·δ_x + (1 − a(x))·residual] == p, enumerated exactly (to 1e-12)."""
    p_weights = data.draw(distributions)
    q_weights = data.draw(
        st.lists(st.floats(0.0, 1.0), min_size=len(p_weights), max_size=len(p_weights)).filter(
            lambda w: sum(w) > 1e-3
        )
    )
    p, q = normalized(p_weights), normalized(q_weights)
    residual = residual_distribution(p, q)
    emitted = torch.zeros_like(p)
    for x in range(len(p)):
        if q[x] == 0:
            continue
        accept = float(acceptance_probability(p[x : x + 1], q[x : x + 1])[0])
        emitted[x] += q[x] * accept
        emitted += q[x] * (1.0 - accept) * residual
    np.testing.assert_allclose(emitted.numpy(), p.numpy(), rtol=0, atol=1e-12)


def test_acceptance_and_residual_on_an_explicit_example() -> None:
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    np.testing.assert_allclose(acceptance_probability(p, q).numpy(), [1.0, 5 / 6, 0.0])
    np.testing.assert_allclose(residual_distribution(p, q).numpy(), [1.0, 0.0, 0.0])
    same = residual_distribution(p, p)
    np.testing.assert_allclose(same.numpy(), p.numpy())
    with pytest.raises(ValueError, match="q_token"):
        acceptance_probability(p, torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64))


def test_verify_drafts_matches_the_exact_block_law() -> None:
    """Monte Carlo of the implementation against the exact law of a K = 2 block.

    Target and drafter rows are fixed per position. Exact: P(A = 0) = Σ q1(x)(1 − a1(x));
    the first emitted token is distributed as p1; given the first draft accepted, the second
    emitted token is distributed as p2; given both accepted, the bonus token as p3. Seeded, with
    bounds far in the tails (6 standard errors; chi-square p ~ 4e-6), yet sensitive to e.g. a
    missing min(1, ·), an unclamped residual or a bonus drawn from the wrong row.
    """
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.7, 0.1], [0.6, 0.2, 0.2]], dtype=torch.float64)
    generator = torch.Generator().manual_seed(1234)
    n = 20_000
    first, second, third, accepted = Counter(), Counter(), Counter(), Counter()
    for _ in range(n):
        drafts = [int(torch.multinomial(q[k], 1, generator=generator)) for k in range(2)]
        verdict = verify_drafts(p, q, drafts, generator)
        emitted = drafts[: verdict.num_accepted] + [verdict.next_token]
        first[emitted[0]] += 1
        accepted[verdict.num_accepted] += 1
        if verdict.num_accepted >= 1:
            second[emitted[1]] += 1
        if verdict.num_accepted == 2:
            third[emitted[2]] += 1  # the bonus token
        expected_a = [min(1.0, float(p[k, drafts[k]] / q[k, drafts[k]])) for k in range(2)]
        assert verdict.acceptance_probability == pytest.approx(expected_a, abs=1e-15)
    a1 = torch.clamp(p[0] / q[0], max=1.0)
    p_reject_first = float((q[0] * (1 - a1)).sum())
    assert abs(accepted[0] / n - p_reject_first) < 6 * math.sqrt(p_reject_first / n)
    for counts, target in ((first, p[0]), (second, p[1]), (third, p[2])):
        total = sum(counts.values())
        observed = np.array([counts[i] for i in range(3)], dtype=np.float64)
        expected = target.numpy() * total
        chi2 = float(((observed - expected) ** 2 / expected).sum())
        assert chi2 < 25.0, (observed, expected)  # 2 dof: P(chi2 > 25) ~ 4e-6


def test_verify_drafts_greedy_accepts_iff_argmax_agrees() -> None:
    logits_p = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    logits_q = torch.tensor([[0.0, 4.0, 1.0], [0.0, 3.0, 1.0]])
    p = sampling_distribution(logits_p, 0.0, 1.0)
    q = sampling_distribution(logits_q, 0.0, 1.0)
    verdict = verify_drafts(p, q, [1, 1], torch.Generator().manual_seed(0))
    assert verdict.num_accepted == 1
    assert verdict.next_token == 0  # target's argmax at the rejected position
    assert verdict.acceptance_probability == [1.0, 0.0]


def test_verify_drafts_rejects_bad_shapes() -> None:
    p = torch.full((3, 4), 0.25, dtype=torch.float64)
    q = torch.full((2, 4), 0.25, dtype=torch.float64)
    with pytest.raises(ValueError, match="p must have shape"):
        verify_drafts(p[:2], q, [0, 1], torch.Generator())
    with pytest.raises(ValueError, match="q must have shape"):
        verify_drafts(p, q[:1], [0, 1], torch.Generator())


def test_sampling_distribution_top_p_and_temperature() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64))
    np.testing.assert_allclose(
        sampling_distribution(logits, 1.0, 0.75).numpy(), [0.625, 0.375, 0.0, 0.0], atol=1e-15
    )
    np.testing.assert_allclose(
        sampling_distribution(logits, 1.0, 0.81).numpy(),
        np.array([0.5, 0.3, 0.15, 0.0]) / 0.95,
        atol=1e-15,
    )
    np.testing.assert_allclose(sampling_distribution(logits, 1.0, 0.1).numpy(), [1, 0, 0, 0])
    hot = sampling_distribution(logits, 0.5, 1.0).numpy()
    np.testing.assert_allclose(hot, np.array([0.25, 0.09, 0.0225, 0.0025]) / 0.365, atol=1e-15)
    with pytest.raises(ValueError, match="top_p"):
        sampling_distribution(logits, 1.0, 0.0)
    with pytest.raises(ValueError, match="temperature"):
        sampling_distribution(logits, math.nan, 1.0)


def test_sample_token_follows_the_distribution_and_skips_zeros() -> None:
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0], dtype=torch.float64)
    generator = torch.Generator().manual_seed(11)
    n = 30_000
    counts = np.bincount([sample_token(probs, generator) for _ in range(n)], minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    expected = probs.numpy()[[1, 3, 4]] * n
    chi2 = float(((counts[[1, 3, 4]] - expected) ** 2 / expected).sum())
    assert chi2 < 25.0, counts
    unnormalized = torch.tensor([0.0, 0.0, 2.0], dtype=torch.float64)
    assert sample_token(unnormalized, generator) == 2


def test_cli_collect_subcommand_parses(tmp_path: Path) -> None:
    from av_core.tools.cli import build_parser

    # Model and prompt paths are checked while parsing: they must exist.
    for name in ("t.gguf", "d.gguf", "p.jsonl"):
        (tmp_path / name).write_text("")
    args = build_parser().parse_args(
        [
            "collect",
            "--target",
            str(tmp_path / "t.gguf"),
            "--drafter",
            str(tmp_path / "d.gguf"),
            "--prompts",
            str(tmp_path / "p.jsonl"),
            "--output",
            str(tmp_path / "o.csv"),
            "--k",
            "5",
            "--top-p",
            "0.9",
            "--device",
            "cuda",
        ]
    )
    assert (args.k, args.top_p, args.temperature, args.device) == (5, 0.9, 1.0, "cuda")
    assert args.max_new_tokens == 128 and args.handler.__name__ == "_collect"


def test_draft_labels() -> None:
    assert draft_labels(0, 4) == [0, UNLABELED, UNLABELED, UNLABELED]
    assert draft_labels(2, 4) == [1, 1, 0, UNLABELED]
    assert draft_labels(4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="num_accepted"):
        draft_labels(5, 4)


def test_draft_features_are_exact_against_float64_references() -> None:
    logits = torch.tensor([[30.0, 0.0, -1.0, 2.0], [1.0, 1.0, 0.5, -2.0]], dtype=torch.float32)
    features = draft_feature_columns(logits, 2.0, [3, 2])
    for row, drafted, x, xs in zip(
        logits.double().numpy() / 2.0,
        [3, 2],
        features["logit_q_max"],
        features["logit_q_sampled"],
        strict=True,
    ):
        q = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        # The textbook form loses ~1e-11 to cancellation at q_max ~ 1: a loose bound here, the
        # exact value is checked below.
        assert x == pytest.approx(math.log(q.max()) - math.log1p(-q.max()), rel=1e-9)
        rest = np.delete(row, drafted)
        assert xs == pytest.approx(row[drafted] - np.log(np.exp(rest).sum()), rel=1e-12)
    # z = (15, 0, -0.5, 1): 1 - q_max ~ 5e-6 is mostly rounding in float32; the complement
    # form keeps every digit.
    expected = 15.0 - math.log(math.exp(0.0) + math.exp(-0.5) + math.exp(1.0))
    assert features["logit_q_max"][0] == pytest.approx(expected, rel=1e-14)
    assert features["top2_margin"] == pytest.approx([14.0, 0.0])
    q1 = torch.softmax(logits[1].double() / 2, -1).numpy()
    assert features["entropy"][1] == pytest.approx(float(-(q1 * np.log(q1)).sum()), rel=1e-12)


# ----------------------------------------------------------------------------- decoding loop


class PrefixLM:
    """A toy causal LM whose next-token logits hash the whole prefix; the cache holds the tokens."""

    def __init__(self, vocab: int, salt: int) -> None:
        self.vocab, self.salt = vocab, salt
        self.forward_tokens = 0

    def logits_after(self, prefix: list[int]) -> Any:
        rng = np.random.default_rng([self.salt, *prefix])
        return torch.tensor(rng.normal(0.0, 1.5, self.vocab), dtype=torch.float32)

    def new_cache(self) -> list[int]:
        return []

    def forward(self, input_ids: list[int], cache: list[int], num_logits: int) -> Any:
        assert input_ids, "empty forward"
        cache.extend(input_ids)
        self.forward_tokens += len(input_ids)
        return torch.stack(
            [self.logits_after(cache[: len(cache) - i]) for i in reversed(range(num_logits))]
        )

    def cache_length(self, cache: list[int]) -> int:
        return len(cache)

    def crop(self, cache: list[int], length: int) -> None:
        del cache[length:]


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_decode_rows_match_a_cache_free_recomputation(temperature: float, top_p: float) -> None:
    target, drafter = PrefixLM(7, 1), PrefixLM(7, 2)
    config = CollectConfig(num_drafts=3, temperature=temperature, top_p=top_p, max_new_tokens=40)
    prompt = [1, 2, 3]
    result = speculative_decode(
        target, drafter, prompt, config, torch.Generator().manual_seed(7), stop_ids=()
    )
    assert len(result.generated) >= 40
    sequence, cursor = list(prompt), 0
    for step, drafts in enumerate(result.drafts):
        rows = result.rows[3 * step : 3 * step + 3]
        labels = [row["label"] for row in rows]
        accepted = labels.count(1)
        assert labels == draft_labels(accepted, 3)
        for k, row in enumerate(rows):
            assert (row["step"], row["position"]) == (step, k)
            q_logits = drafter.logits_after(sequence + drafts[:k])
            p_logits = target.logits_after(sequence + drafts[:k])
            q = sampling_distribution(q_logits, temperature, top_p)
            p = sampling_distribution(p_logits, temperature, top_p)
            expected = min(1.0, float(p[drafts[k]] / q[drafts[k]]))
            assert row["acceptance_probability"] == pytest.approx(expected, abs=1e-12)
            z = q_logits.double() / (temperature if temperature > 0 else 1.0)
            lse = torch.logsumexp(torch.cat([z[: int(z.argmax())], z[int(z.argmax()) + 1 :]]), 0)
            assert row["logit_q_max"] == pytest.approx(float(z.max() - lse), abs=1e-9)
        new = drafts[:accepted] + [result.generated[cursor + accepted]]
        assert result.generated[cursor : cursor + accepted + 1] == new
        sequence += new
        cursor += len(new)
    assert cursor == len(result.generated)
    # KV caches: each generated token is fed to the target about once (plus K drafts per step).
    assert target.forward_tokens <= len(prompt) + len(result.generated) + 3 * len(result.drafts)


def test_decode_stops_at_a_stop_token() -> None:
    target, drafter = PrefixLM(5, 3), PrefixLM(5, 4)
    config = CollectConfig(num_drafts=2, max_new_tokens=500)
    result = speculative_decode(
        target, drafter, [0], config, torch.Generator().manual_seed(0), stop_ids={4}
    )
    assert 4 in result.generated
    assert len(result.generated) < 500


class ToyTokenizer:
    eos_token_id = None
    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 6 for c in text]}

    def get_vocab(self) -> dict[str, int]:
        return {str(i): i for i in range(6)}


def test_collect_prompts_writes_a_valid_trace_and_resumes(tmp_path: Path) -> None:
    prompts = [Prompt(f"p{i}", "code" if i % 2 else "prose", f"prompt {i}") for i in range(3)]
    path = tmp_path / "prompts.jsonl"
    write_prompts(prompts, path)
    assert read_prompts(path) == prompts
    output = tmp_path / "trace.csv"
    config = CollectConfig(num_drafts=4, max_new_tokens=12)
    models = (PrefixLM(6, 5), PrefixLM(6, 6), ToyTokenizer())
    first = collect_prompts(*models, prompts, output, config, progress=False, max_prompts=2)
    assert (first.prompts_done, first.prompts_skipped) == (2, 0)
    assert completed_prompt_ids(output) == {"p0", "p1"}
    second = collect_prompts(*models, prompts, output, config, progress=False)
    assert (second.prompts_done, second.prompts_skipped) == (1, 2)
    trace = read_trace(output)
    assert len(trace) == first.rows_added + second.rows_added
    assert set(trace.prompt_id.tolist()) == {"p0", "p1", "p2"}
    assert sorted(set(trace.request_id.tolist())) == [0, 1, 2]
    assert trace.admitted.all() and trace.num_positions == 4
    # A fresh run over all prompts draws exactly what the interrupted-and-resumed one did.
    fresh = tmp_path / "fresh.csv"
    collect_prompts(*models, prompts, fresh, config, progress=False)
    assert fresh.read_text() == output.read_text()


def test_read_prompts_rejects_malformed_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt_id": "a", "workload": "w", "prompt": ""}) + "\n")
    with pytest.raises(ValueError, match="line 1: field 'prompt'"):
        read_prompts(path)
    path.write_text('{"prompt_id": "a", "workload": "w", "prompt": "x"}\n{oops\n')
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        read_prompts(path)


def test_config_rejects_bad_values() -> None:
    for kwargs, name in [
        ({"num_drafts": 0}, "num_drafts"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ]:
        with pytest.raises(ValueError, match=name):
            CollectConfig(**kwargs)  # type: ignore[arg-type]


def test_huggingface_adapter_on_a_tiny_random_model() -> None:
    """The transformers adapter's cache handling against a cache-free forward pass."""
    transformers = pytest.importorskip("transformers")
    from av_core.tools.collect import HuggingFaceCausalLM

    config = transformers.Qwen2Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    lm = HuggingFaceCausalLM(model, "cpu")
    cache = lm.new_cache()
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    lm.forward(tokens[:5], cache, 1)
    lm.forward([7, 7], cache, 2)
    lm.crop(cache, 5)
    assert lm.cache_length(cache) == 5
    cached = lm.forward(tokens[5:], cache, 3)
    with torch.inference_mode():
        full = model(torch.tensor([tokens])).logits[0, -3:]
    np.testing.assert_allclose(cached.numpy(), full.numpy(), atol=1e-5)


def test_trace_feature_agrees_with_the_serving_feature() -> None:
    """The collector's float64 logit(q_max) matches av_core.features.draft_log_odds (float32)."""
    features = pytest.importorskip("av_core.features")
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(64, 1000, generator=generator) * torch.linspace(0.1, 12.0, 64)[:, None]
    for temperature in (1.0, 0.6, 0.0):
        ours = draft_feature_columns(logits, temperature, [0] * 64)["logit_q_max"]
        serving = features.draft_log_odds(logits, temperature).double().numpy()
        np.testing.assert_allclose(ours, serving, rtol=1e-5, atol=1e-4)
