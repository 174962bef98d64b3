"""Each policy's decisions against its definition: llama.cpp's p_min / n_min / n_max on hand
cases (as common/speculative.cpp applies them), AV+D's depth against the cost tables, vLLM's AV
at a fixed depth."""

from __future__ import annotations

import math

import numpy as np
import pytest
from llama_fakes import FakeRuntime

from av_core import CostTables
from av_core.llama_cpp.engine import SpeculativeEngine
from av_core.llama_cpp.policies import (
    LLAMA_CPP_N_MAX,
    LLAMA_CPP_N_MIN,
    LLAMA_CPP_P_MIN,
    AdaptivePolicy,
    LlamaCppPolicy,
    PolicySpec,
    llama_cpp_confidence,
)
from av_core.llama_cpp.sampling import SamplingParams


def test_llama_cpp_defaults_are_the_vendored_common_h() -> None:
    # common/common.h of the llama.cpp llama-cpp-python 0.3.36 vendors:
    # int32_t n_max = 3; int32_t n_min = 0; float p_min = 0.0f;
    assert (LLAMA_CPP_N_MAX, LLAMA_CPP_N_MIN, LLAMA_CPP_P_MIN) == (3, 0, 0.0)
    policy = PolicySpec("llama.cpp").build(None, 4, 1)
    assert (policy.num_positions, policy.n_min, policy.p_min) == (3, 0, 0.0)
    assert PolicySpec("llama.cpp-p0.75").build(None, 4, 1).p_min == 0.75


def test_confidence_is_the_first_of_ten_candidates() -> None:
    # Ten equal logits and the rest far below: 1/10.
    assert llama_cpp_confidence([1.0] * 10 + [-50.0] * 30) == pytest.approx(0.1, abs=1e-12)
    # One logit of 5 and eleven of 0: only nine zeros are among the ten candidates.
    expected = math.exp(5) / (math.exp(5) + 9)
    assert llama_cpp_confidence([0.0] * 11 + [5.0]) == pytest.approx(expected, rel=1e-12)
    # A vocabulary under ten tokens: every token is a candidate. Temperature plays no part.
    assert llama_cpp_confidence([2.0, 0.0, 0.0]) == pytest.approx(
        math.exp(2) / (math.exp(2) + 2), rel=1e-12
    )


def test_stop_below_p_min_and_drop_below_n_min() -> None:
    policy = LlamaCppPolicy(n_max=4, n_min=2, p_min=0.5)
    confident = llama_cpp_confidence([3.0] + [0.0] * 11)  # e^3 / (e^3 + 9) = 0.69
    unsure = llama_cpp_confidence([1.0] + [0.0] * 11)  # e / (e + 9) = 0.23
    assert not policy.stop(confident)
    assert policy.stop(unsure)
    # p_min is a strict bound: exactly p_min keeps drafting (cur_p->data[0].p < p_min stops).
    assert not LlamaCppPolicy(p_min=confident).stop(confident)
    np.testing.assert_array_equal(policy.drafted(np.array([0, 1, 2, 4])), [0, 0, 2, 4])


def _drafter_rows(confidences: dict[int, float]):  # type: ignore[no-untyped-def]
    """Drafter logits over 12 tokens whose llama.cpp confidence at draft position k (by
    prefix length past the prompt) is ``confidences[k]``: token 3 leads, the rest tie."""

    def rows(prefix: tuple[int, ...]) -> np.ndarray:
        k = len(prefix) - 2  # the prompt has 2 tokens
        c = confidences.get(k, 0.9)
        lead = math.log(9 * c / (1 - c))
        return np.array([lead if i == 3 else 0.0 for i in range(12)])

    return rows


@pytest.mark.parametrize(
    ("confidences", "policy", "expected"),
    [
        ({0: 0.9, 1: 0.6, 2: 0.9}, LlamaCppPolicy(n_max=3, p_min=0.75), 1),
        ({0: 0.6}, LlamaCppPolicy(n_max=3, p_min=0.75), 0),
        ({0: 0.9, 1: 0.9, 2: 0.9}, LlamaCppPolicy(n_max=3, p_min=0.75), 3),
        ({0: 0.9, 1: 0.9, 2: 0.9, 3: 0.9}, LlamaCppPolicy(n_max=2, p_min=0.75), 2),
        ({0: 0.9, 1: 0.6}, LlamaCppPolicy(n_max=3, n_min=2, p_min=0.75), 0),
        ({0: 0.9, 1: 0.9, 2: 0.6}, LlamaCppPolicy(n_max=3, n_min=2, p_min=0.75), 2),
        ({0: 0.05, 1: 0.05}, LlamaCppPolicy(n_max=3), 3),  # the default p_min = 0 never stops
    ],
)
def test_llama_cpp_drafts_in_the_loop(confidences, policy, expected) -> None:  # type: ignore[no-untyped-def]
    """The first step's kept drafts, with a drafter whose confidence by position is given: the
    draft stops before the first position below p_min, at n_max, and is dropped under n_min.
    Every kept draft is verified."""
    target = FakeRuntime(12, 1)
    # Greedy drafting picks token 3 every time, so the drafts' prefixes are known.
    drafter = FakeRuntime(12, 2, rows=_drafter_rows(confidences))
    engine = SpeculativeEngine(target, drafter, SamplingParams(0.0), max_positions=4)
    step = engine.generate([[0, 1]], 8, policy, seed=0).steps[0]
    assert int(step.drafted[0]) == expected
    assert int(step.admitted[0]) == expected
    # A draft stopped by p_min decoded one more drafter pass than it kept (the one whose
    # confidence stopped it), as llama.cpp does.
    assert len(step.shape.draft_passes) == min(
        policy.num_positions, _first_below(confidences, policy)
    )


def _first_below(confidences: dict[int, float], policy: LlamaCppPolicy) -> int:
    k = 0
    while k < policy.num_positions and confidences.get(k, 0.9) >= policy.p_min:
        k += 1
    return k + 1 if k < policy.num_positions else k


class _NoRandom:
    """A random source that must not be asked: greedy drafts draw nothing."""

    def bernoulli(self, probability: float) -> bool:
        raise AssertionError("a greedy draft drew a Bernoulli")

    def categorical(self, weights: np.ndarray) -> int:
        raise AssertionError("a greedy draft drew a token")


def test_llama_cpp_drafts_the_drafters_most_likely_token() -> None:
    """common/speculative.cpp drafts ``cur_p->data[0].id``, the first candidate of the top-10
    sampler: the drafter's most likely token, whatever the sampler's temperature; the loop
    verifies it against a one-hot q and records llama.cpp's confidence."""
    drafter = FakeRuntime(40, 7, n_seq_max=3)
    engine = SpeculativeEngine(FakeRuntime(40, 1, n_seq_max=3), drafter, SamplingParams(1.3))
    prefixes = [[1, 2], [3], [4, 5, 6]]
    blocks = [(r, 0, p) for r, p in enumerate(prefixes)]
    drafts = engine.draft_pass(blocks, LlamaCppPolicy(p_min=0.0), _NoRandom())
    for prefix, draft in zip(prefixes, drafts, strict=True):
        logits = drafter.logits_of(prefix)
        assert draft is not None and draft.token == int(np.argmax(logits))
        assert draft.q[draft.token] == 1.0 and draft.q.sum() == 1.0
        assert draft.confidence == llama_cpp_confidence(logits)
    # Stopped below p_min: no draft for that request.
    drafter.clear()
    highest = max(d.confidence for d in drafts if d is not None)
    stopped = engine.draft_pass(blocks, LlamaCppPolicy(p_min=highest), _NoRandom())
    assert [d is None for d in stopped] == [d.confidence < highest for d in drafts if d]


def _tables(draft_ms: float) -> CostTables:
    """Drafting all 4 positions costs ``draft_ms`` at any batch; t tokens verify in 10 + t/2 ms."""
    return CostTables(np.full(5, draft_ms), 10.0 + 0.5 * np.arange(21.0))


def test_av_d_drafts_nothing_where_drafting_costs_more_than_it_can_return() -> None:
    """Drafting a position costs 40 ms against a 10 ms step: AV+D chooses depth 0 on every
    step but exploration's (probability 0.01), so the loop runs as no speculation."""
    policy = AdaptivePolicy(_tables(160.0), 4, num_slots=4, depth=True)
    engine = SpeculativeEngine(
        FakeRuntime(5, 1, capacity=128),
        FakeRuntime(5, 2, capacity=128),
        SamplingParams(1.0),
        max_positions=4,
    )
    result = engine.generate([[0], [1], [2], [3]], 60, policy, seed=0)
    zero = sum(int(s.depths.max()) == 0 for s in result.steps)
    assert zero >= 0.9 * len(result.steps)
    assert result.steps[0].depths.max() == 0  # new requests start at confidence 1.0: still 0


def test_av_d_drafts_where_drafting_is_cheap() -> None:
    policy = AdaptivePolicy(_tables(0.4), 4, num_slots=4, depth=True)
    engine = SpeculativeEngine(
        FakeRuntime(5, 1), FakeRuntime(5, 1), SamplingParams(1.0), max_positions=4
    )
    result = engine.generate([[0], [1]], 40, policy, seed=0)
    assert result.steps[0].depths.tolist() == [4, 4]  # new requests: confidence 1.0, full depth
    assert result.acceptance == 1.0  # the drafter is the target


def test_vllm_av_drafts_the_full_depth_and_trims_only_verification() -> None:
    policy = PolicySpec("vLLM-AV").build(_tables(1.0), 3, 2)
    assert policy.planner.exploration == 0.0
    engine = SpeculativeEngine(
        FakeRuntime(5, 1), FakeRuntime(5, 3), SamplingParams(1.0), max_positions=3
    )
    result = engine.generate([[0], [1]], 30, policy, seed=1)
    for step in result.steps:
        remaining_cap = step.depths  # capped only by the tokens left
        np.testing.assert_array_equal(step.drafted, remaining_cap)
    assert any((s.admitted < s.drafted).any() for s in result.steps)


def _timed_step(verify_tokens: int, verify_ms: float, pass_sizes: list[int], pass_ms: float):  # type: ignore[no-untyped-def]
    """The fields of a StepRecord that online cost tables read."""
    from types import SimpleNamespace

    from av_core.tools.simulate.run import StepShape

    return SimpleNamespace(
        shape=StepShape(
            tuple(tuple((r, 1) for r in range(n)) for n in pass_sizes),
            ((0, verify_tokens - 1), (1, 1)),
        ),
        verify_ms=verify_ms,
        draft_pass_ms=[pass_ms] * len(pass_sizes),
    )


def test_online_costs_replace_the_profiled_sizes_by_their_medians() -> None:
    from av_core.llama_cpp.profile import OnlineCosts

    points = {"verify": [(2, 10.0), (4, 12.0), (6, 14.0)], "draft": [(1, 1.0), (2, 1.5)]}
    online = OnlineCosts(points, 2, 2, interval=3, window=2)
    assert online.record(_timed_step(4, 50.0, [2, 2], 9.0)) is None
    assert online.record(_timed_step(4, 30.0, [2], 7.0)) is None
    tables = online.record(_timed_step(4, 20.0, [2], 5.0))
    assert tables is not None
    # verify at 4 tokens: the median of the last window (2) samples, 30 and 20; others profiled.
    assert online.points("verify") == [(2, 10.0), (4, 25.0), (6, 14.0)]
    np.testing.assert_allclose(tables.verify_ms[[2, 4, 6]], [10.0, 25.0, 25.0])
    # A 2-request pass: median of the last two passes (7 and 5) = 6; drafting K = 2 costs 2 passes.
    assert online.points("draft") == [(1, 1.0), (2, 6.0)]
    assert tables.draft_ms[2] == pytest.approx(12.0)
    assert tables.max_draft_depth == 2


def test_re_measured_costs_move_av_d_and_keep_the_remembered_confidences() -> None:
    """AV+D drafts while the profile says drafting is cheap; once the online measurements say a
    drafter pass costs 200 ms, the rebuilt tables make it draft nothing, and the planner still
    holds each slot's remembered confidences."""
    from av_core.llama_cpp.profile import OnlineCosts

    points = {"verify": [(2, 10.0), (6, 12.0)], "draft": [(1, 0.1), (2, 0.1)]}
    online = OnlineCosts(points, 2, 2, interval=2)
    policy = AdaptivePolicy(online.tables(), 2, num_slots=2, depth=True, online=online)
    slots = np.arange(2)
    assert policy.depths(slots, np.array([2, 2])).tolist() == [2, 2]
    policy.admit(slots, np.array([[3.0, 1.0], [2.0, -1.0]], dtype=np.float32), np.array([2, 2]))
    remembered = [policy.planner.previous_confidences(s).copy() for s in (0, 1)]
    for _ in range(2):
        policy.measured(_timed_step(6, 12.0, [2, 2], 200.0))  # type: ignore[arg-type]
    assert policy.depths(slots, np.array([2, 2])).tolist() == [0, 0]
    for s in (0, 1):
        np.testing.assert_array_equal(policy.planner.previous_confidences(s), remembered[s])
