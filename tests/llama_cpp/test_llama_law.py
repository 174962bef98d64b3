"""The loop's emitted law, exactly: every branch of the whole loop (drafting, every policy's
decisions, verification, KV bookkeeping) enumerated with its probability on a runtime whose
logits are a seeded function of the cached tokens, compared with sampling the target alone."""

from __future__ import annotations

import numpy as np
import pytest
from llama_fakes import FakeRuntime, enumerate_law, max_difference, target_law

from av_core import CostTables
from av_core.llama_cpp import sampling
from av_core.llama_cpp.engine import SpeculativeEngine
from av_core.llama_cpp.policies import AdaptivePolicy, FixedK, LlamaCppPolicy, Policy
from av_core.llama_cpp.sampling import SamplingParams

VOCAB = 3
PROMPT = [0, 1]


def _tables() -> CostTables:
    # Verifying a second draft costs nearly a whole step: the planner trims depending on the
    # confidences, so its decisions differ between branches.
    return CostTables.from_curves(
        [(1, 0.5), (2, 0.9)],
        [(1, 4.0), (2, 5.0), (3, 8.0), (6, 12.0)],
        max_num_reqs=2,
        max_batch_tokens=6,
    )


POLICIES = {
    "no-spec": lambda: FixedK(0),
    "K=2": lambda: FixedK(2),
    "llama.cpp p_min=0.5": lambda: LlamaCppPolicy(n_max=2, p_min=0.5),
    "llama.cpp n_min=2": lambda: LlamaCppPolicy(n_max=2, n_min=2, p_min=0.4),
    "vLLM-AV": lambda: AdaptivePolicy(_tables(), 2, num_slots=2, depth=False, vllm=True),
    "AV+D": lambda: AdaptivePolicy(_tables(), 2, num_slots=2, depth=True, exploration_seed=3),
}
PARAMS = {
    "t=1": (1.0, 0, 1.0),
    "t=0.7 top-k=2": (0.7, 2, 1.0),
    "t=1.3 top-p=0.6": (1.3, 0, 0.6),
    "greedy": (0.0, 0, 1.0),
}


def loop_law(make_policy, params, *, length: int = 3, seed: int = 11):  # type: ignore[no-untyped-def]
    target = FakeRuntime(VOCAB, seed)
    drafter = FakeRuntime(VOCAB, seed + 100, scale=1.0)
    engine = SpeculativeEngine(target, drafter, SamplingParams(*params), max_positions=2)

    def run(source):  # type: ignore[no-untyped-def]
        result = engine.generate([PROMPT], length, make_policy(), source=source)
        return tuple(result.tokens[0])

    return enumerate_law(run), target_law(target, PROMPT, length, params)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("params", sorted(PARAMS))
def test_every_policy_emits_the_target_law(policy: str, params: str) -> None:
    law, expected = loop_law(POLICIES[policy], PARAMS[params])
    assert abs(sum(law.values()) - 1.0) < 1e-12
    assert max_difference(law, expected) < 1e-12


def test_two_requests_emit_independent_target_laws() -> None:
    target = FakeRuntime(VOCAB, 5)
    drafter = FakeRuntime(VOCAB, 6, scale=1.0)
    engine = SpeculativeEngine(target, drafter, SamplingParams(1.0), max_positions=2)
    prompts = [[0, 1], [2]]

    def run(source):  # type: ignore[no-untyped-def]
        policy = AdaptivePolicy(_tables(), 2, num_slots=2, depth=True)
        result = engine.generate(prompts, 2, policy, source=source)
        return tuple(tuple(t) for t in result.tokens)

    law = enumerate_law(run)
    a = target_law(target, prompts[0], 2, (1.0, 0, 1.0))
    b = target_law(target, prompts[1], 2, (1.0, 0, 1.0))
    expected = {(x, y): a[x] * b[y] for x in a for y in b}
    assert max_difference(law, expected) < 1e-12


def test_the_law_check_catches_a_residual_that_ignores_the_drafter(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A deliberate bug (resampling from p instead of norm(max(0, p - q)) after a rejection)
    moves the law far from the target's: the check above can fail."""

    def biased(target, drafter, drafts, source):  # type: ignore[no-untyped-def]
        for k, x in enumerate(np.asarray(drafts).tolist()):
            p, q = float(target[k, x]), float(drafter[k, x])
            if p >= q or source.bernoulli(p / q):
                continue
            return k, source.categorical(target[k])
        return len(drafts), source.categorical(target[len(drafts)])

    monkeypatch.setattr("av_core.llama_cpp.engine.verify", biased)
    law, expected = loop_law(POLICIES["K=2"], PARAMS["t=1"])
    assert max_difference(law, expected) > 1e-3


class _PeekingPolicy(Policy):
    """Admits the drafts only when the first one is token 0 — it reads the drafted token
    through the random source, which no real policy can; the law check must flag it."""

    name = "peeking"
    num_positions = 2

    def __init__(self, source) -> None:  # type: ignore[no-untyped-def]
        self.source = source

    def admit(self, slots, features, drafted):  # type: ignore[no-untyped-def]
        first_draft = self.source.choices[0] if self.source.choices else None
        return np.where(first_draft == 0, drafted, 0)


def test_the_law_check_catches_a_decision_that_reads_the_drafted_token() -> None:
    target = FakeRuntime(VOCAB, 11)
    drafter = FakeRuntime(VOCAB, 111, scale=1.0)
    engine = SpeculativeEngine(target, drafter, SamplingParams(1.0), max_positions=2)

    def run(source):  # type: ignore[no-untyped-def]
        return tuple(engine.generate([PROMPT], 3, _PeekingPolicy(source), source=source).tokens[0])

    law = enumerate_law(run)
    assert max_difference(law, target_law(target, PROMPT, 3, (1.0, 0, 1.0))) > 1e-3


def test_verify_alone_matches_the_target_on_injected_distributions() -> None:
    """One verification on hand-made p and q over 3 tokens, enumerated: the emitted token's law
    is p at the first position (a draft drawn from q, then accept or resample)."""
    p = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    q = np.array([[0.2, 0.2, 0.6]])

    def run(source):  # type: ignore[no-untyped-def]
        draft = source.categorical(q[0])
        accepted, token = sampling.verify(p, q, [draft], source)
        return draft if accepted else token

    law = enumerate_law(run)
    assert max(abs(law[t] - p[0, t]) for t in range(3)) < 1e-15
