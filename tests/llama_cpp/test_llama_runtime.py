"""The loop on a real llama.cpp (the tiny GGUF pair): KV bookkeeping against a fresh context,
token accounting, and the emitted law by a chi-square test."""

from __future__ import annotations

import numpy as np
import pytest
from llama_fakes import tiny_models
from scipy import stats

from av_core import CostTables
from av_core.llama_cpp import open_engine
from av_core.llama_cpp.policies import PolicySpec
from av_core.llama_cpp.runtime import Context
from av_core.llama_cpp.sampling import SamplingParams, probabilities

R = 3
PROMPTS = [[5, 9, 11, 4, 7], [20, 3, 3, 8, 9, 30, 31, 40], [12]]
TABLES = CostTables.from_curves(
    [(1, 1.0), (4, 2.0)], [(1, 3.0), (20, 9.0)], max_num_reqs=4, max_batch_tokens=32
)


@pytest.fixture(scope="module")
def engine(tiny_pair):  # type: ignore[no-untyped-def]
    return open_engine(*tiny_pair, requests=R, tokens_per_request=64, max_positions=4)


@pytest.fixture(scope="module")
def tiny_pair() -> tuple[str, str]:
    return tiny_models()


def _fresh_next_logits(context: Context, sequences: list[list[int]]) -> np.ndarray:
    """A fresh context of the same model fed ``sequences[r][:-1]`` and then each last token:
    the logits of every request's next position."""
    fresh = Context(context.model, n_ctx=context.n_ctx, n_seq_max=context.n_seq_max)
    tokens, positions, seq_ids = [], [], []
    for r, seq in enumerate(sequences):
        tokens += seq[:-1]
        positions += range(len(seq) - 1)
        seq_ids += [r] * (len(seq) - 1)
    if tokens:
        fresh.decode(tokens, positions, seq_ids, [False] * len(tokens))
    last = [seq[-1] for seq in sequences]
    return fresh.decode(
        last, [len(s) - 1 for s in sequences], list(range(len(sequences))), [True] * len(sequences)
    )


#: How far a token's logits may move with the batch shapes its cache was built in (llama.cpp's
#: CPU kernels differ between one-token and multi-token batches: about 3e-5 on the tiny model);
#: a wrong cache moves them by far more (checked below).
SHAPE_TOLERANCE = 1e-3


def test_batch_shapes_move_the_tiny_models_logits_only_slightly(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    """The cache built in one batch or token by token gives the next logits within
    SHAPE_TOLERANCE, and a cache missing one token gives them far outside it."""
    from av_core.llama_cpp.runtime import Model

    model = Model(tiny_pair[0])
    seq = [5, 9, 11, 4, 7, 30, 2]
    one = Context(model, n_ctx=256, n_seq_max=1)
    one.decode(seq[:-1], list(range(6)), [0] * 6, [False] * 6)
    batched = one.decode([seq[-1]], [6], [0], [True])
    two = Context(model, n_ctx=256, n_seq_max=1)
    for i, token in enumerate(seq[:-1]):
        two.decode([token], [i], [0], [False])
    single = two.decode([seq[-1]], [6], [0], [True])
    np.testing.assert_allclose(batched, single, rtol=0, atol=SHAPE_TOLERANCE)
    three = Context(model, n_ctx=256, n_seq_max=1)
    three.decode(seq[1:-1], list(range(5)), [0] * 5, [False] * 5)
    wrong = three.decode([seq[-1]], [5], [0], [True])
    assert np.abs(wrong - batched).max() > 100 * SHAPE_TOLERANCE


@pytest.mark.parametrize("policy", ["K=4", "llama.cpp-p0.3", "AV+D", "vLLM-AV"])
@pytest.mark.parametrize("seed", [0, 1])
def test_kv_caches_hold_exactly_the_emitted_tokens(engine, policy: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    """After a run of accepts and rejects, both models' next logits equal a fresh context's fed
    the same tokens (within SHAPE_TOLERANCE: the fresh cache is built in other batch shapes),
    for every request."""
    result = engine.generate(PROMPTS, 40, PolicySpec(policy).build(TABLES, 4, R), seed=seed)
    assert 0 < result.accepted < result.admitted  # both accepts and rejects happened
    sequences = [p + t for p, t in zip(PROMPTS, result.tokens, strict=True)]
    # The target holds every token but the last; decode the last in the loop's context.
    assert result.target_cached == [len(s) - 1 for s in sequences]
    loop = engine.target.decode(
        [s[-1] for s in sequences], [len(s) - 1 for s in sequences], list(range(R)), [True] * R
    )
    fresh = _fresh_next_logits(engine.target, sequences)
    np.testing.assert_allclose(loop, fresh, rtol=0, atol=SHAPE_TOLERANCE)
    # The drafter holds a prefix of each sequence; feed it the rest in the loop's context.
    assert all(n <= len(s) - 1 for s, n in zip(sequences, result.drafter_cached, strict=True))
    tokens, positions, seq_ids, marks = [], [], [], []
    for r, (seq, n) in enumerate(zip(sequences, result.drafter_cached, strict=True)):
        tokens += seq[n:]
        positions += range(n, len(seq))
        seq_ids += [r] * (len(seq) - n)
        marks += [False] * (len(seq) - n - 1) + [True]
    loop = engine.drafter.decode(tokens, positions, seq_ids, marks)
    fresh = _fresh_next_logits(engine.drafter, sequences)
    np.testing.assert_allclose(loop, fresh, rtol=0, atol=SHAPE_TOLERANCE)


@pytest.mark.parametrize(
    "policy", ["no-spec", "K=2", "llama.cpp", "llama.cpp-p0.75", "vLLM-AV", "AV+D"]
)
def test_token_accounting(engine, policy: str) -> None:  # type: ignore[no-untyped-def]
    """Every request gets exactly its new tokens; each step emits, per request, its accepted
    drafts plus one token; admitted <= drafted <= depth."""
    result = engine.generate(PROMPTS, 33, PolicySpec(policy).build(TABLES, 4, R), seed=3)
    assert [len(t) for t in result.tokens] == [33] * R
    for step in result.steps:
        np.testing.assert_array_equal(step.emitted, step.accepted + 1)
        assert np.all(step.accepted <= step.admitted)
        assert np.all(step.admitted <= step.drafted)
        assert np.all(step.drafted <= step.depths)
    assert result.emitted == 33 * R == result.accepted + result.verifications


def test_the_first_tokens_follow_the_target_by_chi_square(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    """Many requests from one prompt through the real loop (fixed K = 3, temperature 1): the
    first and the second emitted token follow the target's law (chi-square, p > 0.001), while
    the drafter's own law is rejected (the test has the power to see a wrong law)."""
    requests = 16
    engine = open_engine(*tiny_pair, requests=requests, tokens_per_request=16, max_positions=4)
    prompt = [5, 9, 11, 4]
    firsts, seconds = [], []
    for seed in range(150):
        result = engine.generate(
            [prompt] * requests, 4, PolicySpec("K=3").build(None, 3, requests), seed=seed
        )
        firsts += [t[0] for t in result.tokens]
        seconds += [t[1] for t in result.tokens]
    target = Context(engine.target.model, n_ctx=256, n_seq_max=1)
    drafter = Context(engine.drafter.model, n_ctx=256, n_seq_max=1)
    params = SamplingParams(1.0)
    p1 = probabilities(_fresh_next_logits(target, [prompt])[0], params)
    q1 = probabilities(_fresh_next_logits(drafter, [prompt])[0], params)
    # The second token's law: sum over the first.
    p2 = np.zeros_like(p1)
    for token in np.flatnonzero(p1 > 1e-6):
        p2 += p1[token] * probabilities(
            _fresh_next_logits(target, [[*prompt, int(token)]])[0], params
        )

    def chi_square_p(samples: list[int], law: np.ndarray) -> float:
        counts = np.bincount(samples, minlength=law.shape[0]).astype(float)
        expected = law * len(samples)
        big = expected >= 5
        observed = np.r_[counts[big], counts[~big].sum()]
        wanted = np.r_[expected[big], expected[~big].sum()]
        return float(stats.chisquare(observed, wanted * observed.sum() / wanted.sum()).pvalue)

    assert chi_square_p(firsts, p1) > 1e-3
    assert chi_square_p(seconds, p2) > 1e-3
    assert chi_square_p(firsts, q1) < 1e-3


def test_a_cached_prefill_gives_the_same_run(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    """With cache_prefill, a second run on the same prompts starts from the saved caches and
    emits what a run that decoded its prefill emits (the same seed), token for token."""
    plain = open_engine(*tiny_pair, requests=R, tokens_per_request=64, max_positions=4)
    cached = open_engine(
        *tiny_pair, requests=R, tokens_per_request=64, max_positions=4, cache_prefill=True
    )
    policy = "AV+D"
    first = cached.generate(PROMPTS, 20, PolicySpec("K=2").build(TABLES, 4, R), seed=4)
    calls: list[list[bool]] = []
    decode = cached.target.decode

    def spy(tokens, positions, seq_ids, logits):  # type: ignore[no-untyped-def]
        calls.append(list(logits))
        return decode(tokens, positions, seq_ids, logits)

    cached.target.decode = spy  # type: ignore[method-assign]
    again = cached.generate(PROMPTS, 20, PolicySpec(policy).build(TABLES, 4, R), seed=5)
    assert calls and all(any(marks) for marks in calls)  # no prefill decode (no logits) ran
    reference = plain.generate(PROMPTS, 20, PolicySpec(policy).build(TABLES, 4, R), seed=5)
    assert again.tokens == reference.tokens
    assert first.tokens != again.tokens
    other = [PROMPTS[1], PROMPTS[0], PROMPTS[2]]  # other prompts: prefilled anew
    swapped = cached.generate(other, 20, PolicySpec(policy).build(TABLES, 4, R), seed=5)
    assert (
        swapped.tokens
        == plain.generate(other, 20, PolicySpec(policy).build(TABLES, 4, R), seed=5).tokens
    )
