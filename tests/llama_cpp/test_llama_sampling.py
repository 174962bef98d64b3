"""The sampler against an independent reference: distributions under temperature / top-k /
top-p, the feature under the same transform, the random source's draws, stop tokens."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from llama_fakes import FakeRuntime, reference_distribution
from scipy import stats

from av_core.features import draft_log_odds
from av_core.llama_cpp.engine import SpeculativeEngine
from av_core.llama_cpp.policies import FixedK
from av_core.llama_cpp.sampling import NumpySource, SamplingParams, draft_features, probabilities

SETTINGS = [
    (1.0, 0, 1.0),
    (0.6, 0, 1.0),
    (1.7, 5, 1.0),
    (1.0, 0, 0.7),
    (0.8, 12, 0.5),
    (0.0, 0, 1.0),
    (1.0, 1, 1.0),
]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("seed", range(4))
def test_probabilities_match_the_reference(setting, seed: int) -> None:  # type: ignore[no-untyped-def]
    logits = (np.random.default_rng(seed).standard_normal((3, 40)) * 2.5).astype(np.float32)
    logits[1, 7] = logits[1, 9] = logits[1].max() + 0.5  # a tie at the top
    got = probabilities(logits, SamplingParams(*setting))
    for row in range(3):
        want = reference_distribution(logits[row], *setting)
        assert np.abs(got[row] - want).max() < 1e-12


def test_top_k_ties_keep_the_lower_index() -> None:
    logits = np.array([0.0, 2.0, 1.0, 2.0, 1.0, 1.0], dtype=np.float32)
    got = probabilities(logits, SamplingParams(1.0, top_k=3))
    want = reference_distribution(logits, 1.0, 3)
    assert np.abs(got - want).max() < 1e-15
    assert got[2] > 0 and got[4] == 0 and got[5] == 0


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_feature_is_logit_q_max_of_the_sampled_distribution(setting) -> None:  # type: ignore[no-untyped-def]
    logits = (np.random.default_rng(9).standard_normal((5, 300)) * 2.0).astype(np.float32)
    params = SamplingParams(*setting)
    x = draft_features(logits, params)
    # Greedy sampling keeps the feature of the unscaled logits (av_core.features' and vLLM's
    # convention: T <= 0 leaves the logits unscaled), so it still ranks drafts.
    feature_setting = (1.0, *setting[1:]) if setting[0] <= 0 else setting
    for row in range(5):
        q = reference_distribution(logits[row], *feature_setting)
        top = q.max()
        expected = 40.0 if top >= 1.0 else min(40.0, math.log(top) - math.log1p(-top))
        assert x[row] == pytest.approx(expected, abs=2e-4)
    # The same numbers av_core.features gives (the untruncated path is its CPU kernel).
    reference = draft_log_odds(
        torch.from_numpy(logits),
        params.temperature,
        top_k=params.top_k or None,
        top_p=params.top_p if params.top_p < 1 else None,
    ).numpy()
    np.testing.assert_array_equal(x, reference)


def test_categorical_draws_follow_the_weights_across_blocks() -> None:
    """A 3,000-entry law spread over three of the source's 1,024-entry blocks, with zeros: no
    zero-weight entry is ever drawn, and a chi-square does not reject the law."""
    rng = np.random.default_rng(4)
    weights = np.zeros(3000)
    support = rng.choice(3000, size=12, replace=False)
    weights[support] = rng.random(12) + 0.05
    source = NumpySource(5)
    draws = np.array([source.categorical(weights) for _ in range(12000)])
    assert set(draws.tolist()) <= set(support.tolist())
    counts = np.array([(draws == s).sum() for s in support])
    expected = weights[support] / weights.sum() * draws.size
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # The power to see a wrong law: the uniform law over the support is rejected.
    assert stats.chisquare(counts, np.full(12, draws.size / 12)).pvalue < 1e-3


def test_bernoulli_frequency() -> None:
    source = NumpySource(2)
    hits = sum(source.bernoulli(0.3) for _ in range(20000))
    assert abs(hits / 20000 - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 20000)


def test_a_stop_token_ends_its_request_and_leaves_the_others() -> None:
    target, drafter = FakeRuntime(4, 3, capacity=128), FakeRuntime(4, 4, capacity=128)
    engine = SpeculativeEngine(target, drafter, SamplingParams(1.0), max_positions=3)
    free = engine.generate([[0], [1]], 40, FixedK(3), seed=5)
    stop = free.tokens[0][5]
    result = engine.generate([[0], [1]], 40, FixedK(3), seed=5, stop_tokens=[stop])
    for tokens in result.tokens:
        if stop in tokens:
            assert tokens.index(stop) == len(tokens) - 1
        else:
            assert len(tokens) == 40
    assert len(result.tokens[0]) <= 6
