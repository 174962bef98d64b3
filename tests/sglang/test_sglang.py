"""av_core.sglang.CostAwarePolicy without SGLang: its choices against an independent brute-force
search over the candidate steps (float64, from the estimator's intercepts and the raw tables),
hysteresis, probes out of 0, determinism, the verify bookkeeping, the logit(q_max) hook, config
and cost-file loading, and bad input. tests/sglang/test_sglang_contract.py runs it inside SGLang's
own AdaptiveController from the released wheel."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from av_core import AcceptanceEstimator, CostTables
from av_core.sglang import (
    CostAwarePolicy,
    config_candidate_steps,
    load_cost_tables,
)

# --- an independent reference ---------------------------------------------------------------


def reference_rates(
    intercepts: np.ndarray,
    draft_ms: np.ndarray,
    depth_ms: np.ndarray,
    verify_ms: np.ndarray,
    batch: int,
    allowed: Sequence[int],
    extend_at_zero: bool = False,
) -> dict[int, float]:
    """Expected tokens per ms of each step, float64, from the documented model:
    p_j = σ(β_j) (constant feature 0), S_j = p_1⋯p_j, E(s) = B·(1 + S_1 + … + S_s),
    C(s) = draft_ms[B]·depth[s]/depth[K] + verify_ms[B·(s + 1)]."""
    p = 1.0 / (1.0 + np.exp(-np.asarray(intercepts, dtype=np.float64)))
    survival = np.cumprod(p)
    k = depth_ms.shape[0] - 1
    out = {}
    for s in allowed:
        tokens = batch * (1.0 + survival[:s].sum())
        depth = s if s > 0 else (1 if extend_at_zero else 0)
        draft = draft_ms[batch] * depth_ms[depth] / depth_ms[k] if depth else 0.0
        out[s] = tokens / (draft + verify_ms[batch * (s + 1)])
    return out


def reference_choice(rates: dict[int, float]) -> int:
    """The first (smallest) step with the highest rate, by exhaustive comparison."""
    best = None
    for s in sorted(rates):
        if best is None or rates[s] > rates[best]:
            best = s
    assert best is not None
    return best


def random_tables(rng: np.random.Generator, max_reqs: int, k: int) -> CostTables:
    draft = np.concatenate([[0.0], np.cumsum(rng.uniform(0.0, 0.05, size=max_reqs)) + 0.3])
    verify = 4.0 + np.cumsum(rng.uniform(0.0, 0.06, size=max_reqs * (k + 1) + 1))
    verify[: rng.integers(1, max_reqs * 2)] = verify[0]  # a flat, memory-bound start
    depth = np.concatenate([[0.0], np.cumsum(rng.uniform(0.05, 1.0, size=k))])
    return CostTables(draft, verify, draft_depth_ms=depth)


def feed_verdicts(
    estimator: AcceptanceEstimator, rng: np.random.Generator, p: np.ndarray, rounds: int
) -> None:
    k = estimator.num_positions
    for _ in range(rounds):
        batch = int(rng.integers(1, 32))
        admitted = rng.integers(1, k + 1, size=batch)
        accepted = np.cumprod(rng.random((batch, k)) < p[None, :], axis=1).sum(axis=1)
        estimator.observe(
            np.zeros((batch, k), np.float32),
            admitted.astype(np.int32),
            np.minimum(accepted, admitted).astype(np.int32),
        )


def geometric_counts(rng: np.random.Generator, p: Sequence[float], steps: int, n: int) -> list[int]:
    accepted = np.cumprod(rng.random((n, len(p))) < np.asarray(p)[None, :], axis=1).sum(axis=1)
    return np.minimum(accepted, steps).tolist()


def flat_tables(k: int, max_reqs: int = 512) -> CostTables:
    """gpu-like: verify 6 ms flat to 256 tokens then +0.03 ms/token; 0.6 ms per drafter pass."""
    tokens = np.arange(max_reqs * (k + 1) + 1)
    verify = 6.0 + np.maximum(0, tokens - 256) * 0.03
    draft = np.full(max_reqs + 1, 0.6 * k)
    return CostTables(draft, verify).with_draft_depth("autoregressive", max_depth=k)


# --- the decision against brute force -------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_choices_match_a_brute_force_search(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 9))
    max_reqs = 64
    tables = random_tables(rng, max_reqs, k)
    candidates = sorted(set(rng.integers(0, k + 1, size=int(rng.integers(2, k + 2))).tolist()))
    candidates = sorted({*candidates, k})
    estimator = AcceptanceEstimator(k, refit_interval=7)
    feed_verdicts(estimator, rng, rng.uniform(0.1, 0.98, size=k), int(rng.integers(0, 60)))
    extend = bool(rng.integers(0, 2))
    policy = CostAwarePolicy(
        tables,
        candidates,
        estimator=estimator,
        hysteresis=0.0,
        probe_interval=None,
        draft_extend_at_zero=extend,
    )
    depth_ms = tables.draft_depth_ms
    assert depth_ms is not None
    for batch in rng.integers(1, max_reqs + 1, size=40):
        batch = int(batch)
        rates = reference_rates(
            estimator.intercepts,
            tables.draft_ms,
            depth_ms,
            tables.verify_ms,
            batch,
            candidates,
            extend,
        )
        mine = policy.expected_rates(batch)
        assert mine.keys() == rates.keys()
        for s in rates:
            assert mine[s] == pytest.approx(rates[s], rel=1e-6)
        chosen = policy.get_steps_for_batch(batch)
        expected = reference_choice(rates)
        ordered = sorted(rates.values(), reverse=True)
        if len(ordered) == 1 or ordered[0] > ordered[1] * (1 + 1e-6):
            assert chosen == expected, (batch, rates)
        else:  # a near-tie (float32 predictions): either maximiser is right
            assert rates[chosen] >= ordered[0] * (1 - 1e-6)


def test_a_batch_beyond_the_tables_is_priced_along_their_last_segment() -> None:
    """Tables for 64 requests of a cost that is linear past its knee: a batch of up to 512 must
    be priced as the tables for 512 price it (brute force on those), not as if verifying more
    than the tables' last token count were free (which made deep speculation win at high load)."""
    k, candidates = 7, [0, 1, 3, 5, 7]
    small, large = flat_tables(k, max_reqs=64), flat_tables(k, max_reqs=512)
    rng = np.random.default_rng(5)
    estimator = AcceptanceEstimator(k, refit_interval=5)
    feed_verdicts(estimator, rng, np.full(k, 0.8), 40)
    policy = CostAwarePolicy(
        small, candidates, estimator=estimator, hysteresis=0.0, probe_interval=None
    )
    depth_ms = large.draft_depth_ms
    assert depth_ms is not None
    for batch in (65, 96, 200, 300, 512):
        rates = reference_rates(
            estimator.intercepts, large.draft_ms, depth_ms, large.verify_ms, batch, candidates
        )
        mine = policy.expected_rates(batch)
        for step in candidates:
            assert mine[step] == pytest.approx(rates[step], rel=1e-6), (batch, step)
        assert policy.get_steps_for_batch(batch) == reference_choice(rates)
    assert policy.get_steps_for_batch(512) == 0  # compute-bound: drafting does not pay
    assert policy.counters.beyond_tables == 6
    assert policy.get_steps_for_batch(8) > 0 and policy.counters.beyond_tables == 6


def test_tiers_route_like_sglang_and_price_only_their_candidates() -> None:
    tiers = {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}
    policy = CostAwarePolicy(flat_tables(7), tiers, hysteresis=0.0, probe_interval=None)
    assert policy.candidate_steps == [0, 1, 3, 5, 7]
    assert set(policy.expected_rates(7)) == {1, 3, 5, 7}
    assert set(policy.expected_rates(8)) == {0, 1, 3}
    assert set(policy.expected_rates(63)) == {0, 1}
    assert set(policy.expected_rates(300)) == {0}
    assert policy.get_steps_for_batch(300) == 0
    # Padded to a captured CUDA-graph size first, as SGLang does: 5 runs as 8.
    policy.set_cuda_graph_bs([1, 2, 4, 8, 16, 32, 64])
    assert set(policy.expected_rates(5)) == {0, 1, 3}
    assert policy.cuda_graph_bs_for_step(0) == [8, 16, 32, 64]
    assert policy.cuda_graph_bs_for_step(3) == [1, 2, 4, 8, 16]
    assert policy.cuda_graph_bs_for_step(7) == [1, 2, 4]
    policy.set_cuda_graph_bs(None)
    assert policy.cuda_graph_bs_for_step(3) is None


def test_no_speculation_when_drafting_does_not_pay() -> None:
    """Hopeless drafts (intercepts at −4) and compute-bound verification: 0; confident drafts
    at low load: the deepest step."""
    k = 4
    estimator = AcceptanceEstimator(k, init_intercept=-4.0)
    policy = CostAwarePolicy(flat_tables(k), [0, 1, 2, 3, 4], estimator=estimator)
    assert policy.get_steps_for_batch(256) == 0
    confident = CostAwarePolicy(
        flat_tables(k), [0, 1, 2, 3, 4], estimator=AcceptanceEstimator(k, init_intercept=3.0)
    )
    assert confident.get_steps_for_batch(4) == 4


# --- hysteresis and probes ------------------------------------------------------------------


def test_hysteresis_keeps_the_running_step_within_the_margin() -> None:
    rng = np.random.default_rng(3)
    k = 4
    tables = flat_tables(k)
    estimator = AcceptanceEstimator(k, refit_interval=5)
    policy = CostAwarePolicy(
        tables, [0, 1, 2, 3, 4], estimator=estimator, hysteresis=0.05, probe_interval=None
    )
    depth = tables.draft_depth_ms
    assert depth is not None
    current = None
    for t in range(400):
        batch = int(rng.integers(1, 200)) if t % 50 < 25 else int(rng.integers(100, 400))
        rates = reference_rates(
            estimator.intercepts, tables.draft_ms, depth, tables.verify_ms, batch, range(5)
        )
        best = reference_choice(rates)
        if current is None or rates[best] > rates[current] * 1.05 * (1 + 1e-6):
            expected = {best}
        elif rates[best] < rates[current] * 1.05 * (1 - 1e-6):
            expected = {current}
        else:
            expected = {best, current}
        steps = policy.get_steps_for_batch(batch)
        assert steps in expected, (t, batch, rates, current)
        current = steps
        p = [0.9, 0.8, 0.7, 0.6] if t < 200 else [0.5, 0.3, 0.2, 0.1]
        policy.on_verify_complete(geometric_counts(rng, p, steps, batch), batch)
    assert policy.counters.switches > 0


def test_probes_are_bounded_and_bring_it_back_from_zero() -> None:
    """Acceptance collapses, so the policy turns speculation off; then acceptance recovers at
    the same load. At 0 it learns only from probes (one batch in probe_interval + 1, at the
    smallest positive step), which refit at once: it comes back. Without probes it stays at 0."""
    rng = np.random.default_rng(0)
    k, batch, interval = 4, 128, 20

    def run(probe_interval: int | None) -> list[int]:
        # No drift-triggered refits: only the schedule and the probes' own refits.
        estimator = AcceptanceEstimator(k, refit_interval=10, drift_z=float("inf"))
        policy = CostAwarePolicy(
            flat_tables(k), [0, 1, 2, 3, 4], estimator=estimator, probe_interval=probe_interval
        )
        history = []
        for t in range(1200):
            steps = policy.get_steps_for_batch(batch)
            history.append(steps)
            p = [0.02, 0.02, 0.02, 0.02] if t < 400 else [0.95, 0.9, 0.9, 0.9]
            policy.on_verify_complete(geometric_counts(rng, p, steps, batch), batch)
        return history

    probed = run(interval)
    # Off while drafts fail, but for the probes: at most one batch in interval + 1.
    failing = probed[100:400]
    assert failing.count(0) >= len(failing) - (len(failing) // (interval + 1) + 1)
    assert set(failing) <= {0, 1}
    # Back on the step that is best for the true acceptance once it recovers.
    truth = reference_rates(
        np.log(np.array([0.95, 0.9, 0.9, 0.9]) / np.array([0.05, 0.1, 0.1, 0.1])),
        flat_tables(k).draft_ms,
        np.array([0.0, 0.25, 0.5, 0.75, 1.0]),
        flat_tables(k).verify_ms,
        batch,
        range(k + 1),
    )
    best = reference_choice(truth)
    assert best == 1
    recovered = probed[600:]
    assert recovered.count(best) >= 0.9 * len(recovered)
    # A probe's verdicts are refitted at once: back within two probes, not ten refit windows.
    assert 0 not in probed[400 + 2 * (interval + 1) :]
    locked = run(None)
    assert locked[400:] == [0] * 800  # nothing learnt at 0: locked without probes


def test_probes_run_one_candidate_above_the_choice_every_interval() -> None:
    policy = CostAwarePolicy(
        flat_tables(4),
        [0, 2, 4],
        estimator=AcceptanceEstimator(4, init_intercept=-6.0),
        probe_interval=3,
    )
    runs = [policy.get_steps_for_batch(300) for _ in range(12)]
    assert runs == [0, 0, 0, 2] * 3
    assert policy.counters.probes == 3


# --- determinism, bookkeeping, the feature hook ---------------------------------------------


def test_same_calls_give_the_same_choices_and_bits() -> None:
    """Two ranks seeing the same verdicts: identical choices and identical estimator bytes."""
    rng = np.random.default_rng(5)
    script = []
    for t in range(300):
        batch = int(rng.integers(1, 300))
        script.append((batch, rng.random((batch, 4)) < 0.8 - 0.5 * (t > 150)))
    ranks = [CostAwarePolicy(flat_tables(4), [0, 1, 2, 3, 4], refit_interval=9) for _ in range(2)]
    choices: list[list[int]] = [[], []]
    for batch, u in script:
        for rank, policy in enumerate(ranks):
            steps = policy.get_steps_for_batch(batch)
            choices[rank].append(steps)
            counts = np.minimum(np.cumprod(u, axis=1).sum(axis=1), steps).tolist()
            policy.on_verify_complete(counts, batch)
    assert choices[0] == choices[1]
    assert len(set(choices[0])) > 1
    assert ranks[0].estimator.to_bytes() == ranks[1].estimator.to_bytes()


def test_verdicts_are_matched_to_the_batch_they_verify() -> None:
    estimator = AcceptanceEstimator(3, refit_interval=1)
    policy = CostAwarePolicy(
        flat_tables(3), [3], estimator=estimator, probe_interval=None, hysteresis=0.0
    )
    assert policy.get_steps_for_batch(2) == 3
    assert policy.get_steps_for_batch(5) == 3  # overlap: launched before the first verify
    before = estimator.intercepts.copy()
    policy.on_verify_complete([3, 3], 2)
    assert estimator.num_refits == 1 and estimator.intercepts[2] > before[2]
    policy.on_verify_complete([0, 0, 0], 3)  # no batch of 3 in flight: ignored
    assert policy.counters.unmatched == 1 and estimator.num_refits == 1
    policy.get_steps_for_batch(2)
    policy.on_verify_complete([4, 0], 2)  # 4 > 3 steps: not a verify of this policy's batch
    assert policy.counters.inconsistent == 1 and estimator.num_refits == 1


def test_drafter_logits_fit_the_full_model() -> None:
    """With the drafter's logit(q_max) handed over, the slope is learnt (acceptance follows
    σ(1.5·x − 0.5)); without, the feature is constant and the slope stays at its cold start."""
    rng = np.random.default_rng(1)
    k = 3
    with_x = CostAwarePolicy(
        flat_tables(k), [1, 2, 3], drafter_features=True, refit_interval=10, probe_interval=None
    )
    without = CostAwarePolicy(flat_tables(k), [1, 2, 3], refit_interval=10, probe_interval=None)
    for _ in range(300):
        batch = 16
        x = rng.normal(1.0, 2.0, size=(batch, k)).astype(np.float32)
        accept = rng.random((batch, k)) < 1 / (1 + np.exp(-(1.5 * x - 0.5)))
        for policy in (with_x, without):
            steps = policy.get_steps_for_batch(batch)
            if policy is with_x:
                policy.record_draft_features(x[:, :steps])
            counts = np.minimum(np.cumprod(accept, axis=1).sum(axis=1), steps).tolist()
            policy.on_verify_complete(counts, batch)
    assert with_x.estimator.slope == pytest.approx(1.5, abs=0.25)
    assert without.estimator.slope == 0.5
    # Survivals average over the recent rows under the current coefficients.
    rows = np.stack(list(with_x._feature_rows))
    p = with_x.estimator.predict(np.nan_to_num(rows, nan=0.0)).astype(np.float64)
    assert not np.isnan(rows).any()  # every row drafted all 3 positions here
    np.testing.assert_allclose(with_x.survivals(), np.cumprod(p, axis=1).mean(axis=0), rtol=1e-6)
    with pytest.raises(ValueError, match="drafter_features"):
        without.record_draft_features(x)
    with_x.get_steps_for_batch(4)
    with pytest.raises(ValueError, match="features must be"):
        with_x.record_draft_features(np.zeros((3, 3)))


# --- configuration and bad input ------------------------------------------------------------


def test_sglang_config_and_cost_files(tmp_path: Path) -> None:
    default = {
        "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0},
        "64": {"candidate_steps": [0]},
        "ema_alpha": 0.3,
    }
    assert config_candidate_steps(None, default) == {1: [1, 3, 5, 7], 64: [0]}
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps({"1": {"candidate_steps": [0, 2, 4]}}))
    assert config_candidate_steps(path, default) == {1: [0, 2, 4]}
    path.write_text(json.dumps({"warmup_batches": 3}))
    with pytest.raises(ValueError, match="no batch-size tier"):
        config_candidate_steps(path, default)
    tables = flat_tables(4, max_reqs=32)
    saved = tmp_path / "tables.json"
    saved.write_text(tables.to_json())
    assert load_cost_tables(saved, 4) == tables
    profile = tmp_path / "cost.json"
    profile.write_text(json.dumps({"verify": [[1, 6.0], [256, 6.0], [1024, 30.0]], "draft": None}))
    loaded = load_cost_tables(profile, 4, max_batch=64)
    assert loaded.max_num_reqs == 64 and loaded.max_draft_depth == 4
    assert loaded.draft_cost_ms(8, 4) == 0.0  # no drafter curve: drafting free
    profile.write_text(json.dumps({"nothing": 1}))
    with pytest.raises(ValueError, match="neither"):
        load_cost_tables(profile, 4)


def test_bad_input_names_the_argument_and_changes_nothing() -> None:
    tables = flat_tables(4)
    with pytest.raises(TypeError, match="cost_tables"):
        CostAwarePolicy("tables", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="candidate_steps must include a step >= 1"):
        CostAwarePolicy(tables, [0])
    with pytest.raises(TypeError, match="candidate_steps"):
        CostAwarePolicy(tables, [1, 2.5])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="candidate_steps"):
        CostAwarePolicy(tables, [])
    with pytest.raises(ValueError, match="draft-depth table covers 4"):
        CostAwarePolicy(tables, [1, 6])
    with pytest.raises(ValueError, match="hysteresis"):
        CostAwarePolicy(tables, [1, 4], hysteresis=-0.1)
    with pytest.raises(ValueError, match="probe_interval"):
        CostAwarePolicy(tables, [1, 4], probe_interval=0)
    with pytest.raises(ValueError, match="estimator has 3 positions"):
        CostAwarePolicy(tables, [1, 4], estimator=AcceptanceEstimator(3))
    policy = CostAwarePolicy(tables, [0, 1, 4])
    state = policy.estimator.to_bytes()
    for bad in (-1, 2.0, True):
        with pytest.raises((TypeError, ValueError), match="batch_size"):
            policy.get_steps_for_batch(bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="batch_size"):
        policy.on_verify_complete([1], -3)
    assert policy.counters.decisions == 0 and policy.estimator.to_bytes() == state


def test_importing_the_module_imports_no_sglang_and_install_checks_options_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import subprocess
    import sys

    code = "import sys, av_core.sglang; assert not any(m.startswith('sglang') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
    from av_core import sglang

    with pytest.raises(TypeError, match="not CostAwarePolicy options"):
        sglang.install(cost_tables=flat_tables(4), hysterisis=0.1)
    monkeypatch.delenv(sglang.ENV_COSTS, raising=False)
    with pytest.raises(ValueError, match="AV_CORE_SGLANG_COSTS"):
        sglang.install()
    assert sglang.installed() == []
