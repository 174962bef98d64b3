"""Losslessness, proven by exact enumeration (``av_core.testing``): every draft outcome weighted
by its probability, the real planner run on each, standard rejection sampling, and the emitted
law compared with the target's to 1e-12.

* ``budget_source="previous"`` is lossless for every drafter, autoregressive included.
* ``budget_source="current"`` is lossless for drafters whose positions do not depend on earlier
  draft tokens, and biased for an autoregressive one (a concrete case below).
* A trimming rule that reads the sampled token's probability is biased (the known
  counterexample: p = (.5, .5), q = (.2, .8) emits (.4, .6)).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from av_core import CostTables, VerificationPlanner
from av_core.testing import (
    DraftOutcome,
    SpecTables,
    confidence_matrices,
    cost_tables,
    emitted_distribution,
    is_lossless,
    max_abs_difference,
    plan_rule,
    planner_rule,
    position_marginal,
    spec_tables,
)

EXACT = 1e-12


def lossless(law: dict, tables: SpecTables) -> bool:  # type: ignore[type-arg]
    return is_lossless(law, tables, EXACT)


def test_known_counterexample_sampled_token_rule_is_biased() -> None:
    """Verify the draft only if the drafter gave the sampled token q(x) >= .5."""
    tables = SpecTables.from_functions(
        vocab_size=2,
        num_positions=1,
        num_requests=1,
        target=lambda r, prefix: [0.5, 0.5],
        drafter=lambda r, prefix: [0.2, 0.8],
    )

    def reads_the_token(outcome: DraftOutcome) -> list[int]:
        token = outcome.tokens[0][0]
        return [int(outcome.draft_probs[0, 0, token] >= 0.5)]

    law = emitted_distribution(reads_the_token, tables)
    np.testing.assert_allclose(position_marginal(law, 0, 0), [0.4, 0.6], atol=EXACT)
    assert not lossless(law, tables)
    # The same threshold on q_max (what the estimator reads) does not look at the token.
    law = emitted_distribution(lambda outcome: [int(outcome.confidences[0, 0] >= 0.5)], tables)
    assert lossless(law, tables)


def biased_case() -> tuple[SpecTables, CostTables]:
    """An autoregressive drafter whose second-position confidence reveals the first token.

    Draft 1 is 0 or 1 with equal odds; after a 0 the drafter is certain of draft 2 (q_max = 1),
    after a 1 it is not (q_max = .5). Costs: verifying one draft is ruinous (100 ms), two cost
    1.9 ms, none 1 ms. Sized from the current confidences, the budget is 2 after a 0 (E = 2,
    ratio 1.05) and 0 after a 1 (E = 1.75, ratio .92): whether draft 1 is verified depends on
    draft 1 itself, and the first emitted token is 0 with probability .5 + .5 * .9 = .95
    instead of the target's .9.
    """
    tables = SpecTables.from_functions(
        vocab_size=2,
        num_positions=2,
        num_requests=1,
        target=lambda r, prefix: [0.9, 0.1],
        drafter=lambda r, prefix: {(): [0.5, 0.5], (0,): [1.0, 0.0], (1,): [0.5, 0.5]}[prefix],
    )
    costs = CostTables([0.0, 0.0], [1.0, 1.0, 100.0, 1.9])
    return tables, costs


def test_current_budget_is_biased_for_an_autoregressive_drafter() -> None:
    tables, costs = biased_case()
    current = VerificationPlanner(costs, 2, budget_source="current")
    law = emitted_distribution(current, tables)
    np.testing.assert_allclose(position_marginal(law, 0, 0), [0.95, 0.05], atol=EXACT)
    assert not lossless(law, tables)
    # The stateless call sized from the current confidences is the same rule.
    assert max_abs_difference(emitted_distribution(plan_rule(costs), tables), law) < EXACT


def test_previous_budget_is_lossless_on_the_same_case() -> None:
    tables, costs = biased_case()
    fresh = VerificationPlanner(costs, 2)  # budget_source="previous"; fresh slots remember 1.0
    assert lossless(emitted_distribution(fresh, tables), tables)
    for remembered in ([[0.5, 1.0]], [[0.5, 0.5]], [[0.0, 0.0]]):
        primed = VerificationPlanner(costs, 2)
        primed.plan([0], np.array(remembered), [2], num_non_draft_tokens=1, num_sampling_requests=1)
        assert lossless(emitted_distribution(primed, tables), tables)


def test_verifying_everything_or_nothing_is_lossless() -> None:
    tables, _ = biased_case()
    assert lossless(emitted_distribution(lambda outcome: [2], tables), tables)
    assert lossless(emitted_distribution(lambda outcome: [0], tables), tables)


@st.composite
def planning_case(
    draw: st.DrawFn, drafter: str
) -> tuple[SpecTables, CostTables, np.ndarray, list[int]]:
    r = draw(st.integers(1, 2))
    if r == 1:
        tables = draw(spec_tables(num_requests=1, drafter=drafter))  # type: ignore[arg-type]
    else:
        # V^(R·K) outcomes are enumerated: keep two-request cases small.
        v, k = draw(st.sampled_from([(2, 2), (2, 3), (3, 2), (3, 3), (4, 2)]))
        tables = draw(
            spec_tables(num_requests=2, vocab_size=v, num_positions=k, drafter=drafter)  # type: ignore[arg-type]
        )
    k = tables.num_positions
    costs = draw(cost_tables(max_num_reqs=2, max_batch_tokens=2 + 2 * k, max_size=2 + 2 * k))
    previous = draw(confidence_matrices(r, k))
    scheduled = draw(st.lists(st.integers(0, k), min_size=r, max_size=r))
    return tables, costs, previous, scheduled


@st.composite
def revealing_case(draw: st.DrawFn) -> tuple[SpecTables, CostTables, np.ndarray, list[int]]:
    """The family :func:`biased_case` belongs to: an autoregressive drafter whose second
    confidence reveals the first draft token (high after one token, low after the other), and a
    verify curve whose one-draft budget is ruinous and whose two-draft cost sits between the
    two values the second confidence implies. A budget sized from the current confidences then
    verifies draft 1 only after one of its tokens, which biases the first emitted token for any
    target with 0 < p(0) < 1; a budget sized from the previous step cannot see it."""
    root = draw(st.integers(2, 6)) / 8
    high = draw(st.sampled_from([7 / 8, 1.0]))
    low = draw(st.sampled_from([4 / 8, 5 / 8]))
    revealing_token = draw(st.integers(0, 1))
    after = {revealing_token: [high, 1 - high], 1 - revealing_token: [low, 1 - low]}
    target = draw(spec_tables(num_requests=1, vocab_size=2, num_positions=2)).target
    tables = SpecTables.from_functions(
        vocab_size=2,
        num_positions=2,
        num_requests=1,
        target=lambda r, prefix: target[0][prefix],
        drafter=lambda r, prefix: [root, 1 - root] if not prefix else after[prefix[0]],
    )
    first = max(root, 1 - root)
    two_drafts = 1 + first + first * (high + low) / 2  # between the two E(2) values
    costs = CostTables([0.0, 0.0], [1.0, 1.0, draw(st.sampled_from([50.0, 100.0])), two_drafts])
    previous = draw(confidence_matrices(1, 2))
    return tables, costs, previous, [2]


def test_revealing_cases_are_biased_when_sized_from_the_current_step() -> None:
    """The harness sees what the generated family is for: every member with 0 < p(0) < 1 is
    biased under a budget sized from the current confidences, on every grid point."""
    for root in range(2, 7):
        for high in (7 / 8, 1.0):
            for low in (4 / 8, 5 / 8):
                for token in (0, 1):
                    for p0 in (0.1, 0.5, 0.9):
                        after = {token: [high, 1 - high], 1 - token: [low, 1 - low]}
                        tables = SpecTables.from_functions(
                            vocab_size=2,
                            num_positions=2,
                            num_requests=1,
                            target=lambda r, prefix, p0=p0: [p0, 1 - p0],
                            drafter=lambda r, prefix, root=root, after=after: (
                                [root / 8, 1 - root / 8] if not prefix else after[prefix[0]]
                            ),
                        )
                        first = max(root / 8, 1 - root / 8)
                        costs = CostTables(
                            [0.0, 0.0], [1.0, 1.0, 100.0, 1 + first + first * (high + low) / 2]
                        )
                        current = VerificationPlanner(
                            costs, 2, budget_source="current", exploration=0.0
                        )
                        assert not lossless(emitted_distribution(current, tables), tables)
                        previous = VerificationPlanner(costs, 2, exploration=0.0)
                        assert lossless(emitted_distribution(previous, tables), tables)


@settings(max_examples=120, deadline=None)
@given(case=st.one_of(planning_case("autoregressive"), revealing_case()))
def test_previous_budget_is_lossless_for_every_drafter(
    case: tuple[SpecTables, CostTables, np.ndarray, list[int]],
) -> None:
    tables, costs, previous, scheduled = case
    r, k = previous.shape
    planner = VerificationPlanner(costs, k, num_slots=r)
    # The previous step's confidences, remembered per slot (fixed before this step's drafts).
    planner.plan(np.arange(r), previous, [k] * r, num_non_draft_tokens=r, num_sampling_requests=r)
    rule = planner_rule(planner, scheduled_drafts=scheduled)
    assert lossless(emitted_distribution(rule, tables), tables)
    # The stateless call with fixed budget confidences is the same guarantee.
    fixed = plan_rule(costs, budget_confidences=previous, scheduled_drafts=scheduled)
    assert lossless(emitted_distribution(fixed, tables), tables)


@settings(max_examples=60, deadline=None)
@given(case=planning_case("parallel"))
def test_current_budget_is_lossless_for_parallel_drafters(
    case: tuple[SpecTables, CostTables, np.ndarray, list[int]],
) -> None:
    tables, costs, _, scheduled = case
    r = tables.num_requests
    k = tables.num_positions
    planner = VerificationPlanner(costs, k, num_slots=r, budget_source="current")
    rule = planner_rule(planner, scheduled_drafts=scheduled)
    assert lossless(emitted_distribution(rule, tables), tables)


@settings(max_examples=25, deadline=None)
@given(tables=spec_tables(num_requests=2, vocab_size=2, num_positions=3, drafter="autoregressive"))
def test_verifying_every_draft_is_lossless_for_any_drafter(tables: SpecTables) -> None:
    """Plain speculative sampling, a check on the harness itself."""
    k = tables.num_positions
    assert lossless(emitted_distribution(lambda outcome: [k, k], tables), tables)
    assert lossless(emitted_distribution(lambda outcome: [0, 1], tables), tables)


def test_two_requests_current_biased_previous_exact() -> None:
    """Two requests with the autoregressive drafter of :func:`biased_case`: sized from the
    current confidences the budget again reads the first drafts; from the previous ones it
    does not, and the joint law of both requests' outputs is exactly the product of targets."""
    tables = SpecTables.from_functions(
        vocab_size=2,
        num_positions=2,
        num_requests=2,
        target=lambda r, prefix: [0.9, 0.1] if r == 0 else [0.3, 0.7],
        drafter=lambda r, prefix: {(): [0.5, 0.5], (0,): [1.0, 0.0], (1,): [0.5, 0.5]}[prefix],
    )
    costs = CostTables([0.0] * 3, [2.25, 2.5, 2.5, 2.75, 100.0, 3.75, 4.0])
    current = VerificationPlanner(costs, 2, num_slots=2, budget_source="current")
    assert not lossless(emitted_distribution(current, tables), tables)
    for remembered in (
        [[1.0, 1.0], [1.0, 1.0]],
        [[0.5, 1.0], [0.5, 0.5]],
        [[0.5, 0.5], [0.0, 1.0]],
    ):
        previous = VerificationPlanner(costs, 2, num_slots=2)
        previous.plan(
            [0, 1], np.array(remembered), [2, 2], num_non_draft_tokens=2, num_sampling_requests=2
        )
        assert lossless(emitted_distribution(previous, tables), tables)
