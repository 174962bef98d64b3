"""av_core.vllm's drop-ins and av_core.vllm.plugin, on host tensors.

References are independent of the code under test: float64 numpy for features, labels and the
refit (tests/support/reference.py), brute force for the assignment and the budget. The plugin is
tested against fake vLLM module trees with vLLM 0.33.0's real signatures (vLLM itself is not
needed); tests/vllm/test_vllm_contract.py checks those signatures against the released source.
"""

from __future__ import annotations

import inspect
import logging
import math
import pickle
import sys
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from av_core import vllm as av_vllm  # noqa: E402
from av_core.vllm import (  # noqa: E402
    BatchDraftBudget,
    OnlineAcceptanceEstimator,
    assign_draft_token_budget,
    batch_draft_budget,
    build_cost_tables_from_curves,
)
from av_core.vllm import plugin as vllm_plugin  # noqa: E402

import reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
FIXED_POINT = 2.0**36


# --- helpers -----------------------------------------------------------------------------------


def round_stats(est: OnlineAcceptanceEstimator) -> dict[str, np.ndarray]:
    """The native round statistics as float64 (fixed point undone)."""
    stats = est.state_dict()["estimator"]["round_stats"]
    scale = 2.0 ** stats["fraction_bits"]
    out = {
        name: np.asarray(stats[name], dtype=np.float64) / scale for name in "a b c g0 g1".split()
    }
    out["n"] = np.asarray(stats["n"], dtype=np.float64)
    return out


def ivec(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def fill_slots(est: OnlineAcceptanceEstimator, seed: int) -> None:
    """Give every slot finite features and predictions in (0, 1), as predict would."""
    gen = torch.Generator().manual_seed(seed)
    shape = est.features.shape
    est.features.copy_(torch.randn(shape, generator=gen) * 3)
    est.predictions.copy_(torch.rand(shape, generator=gen) * 0.98 + 0.01)


def grade(est: OnlineAcceptanceEstimator, seed: int, rows: int) -> dict[str, torch.Tensor]:
    """Random verdicts for `rows` distinct slots, in vLLM's (num_sampled, num_rejected) terms."""
    gen = torch.Generator().manual_seed(seed)
    k = est.num_speculative_steps
    slots = torch.randperm(est.max_num_reqs, generator=gen)[:rows].to(torch.int32)
    admitted = torch.randint(0, k + 1, (rows,), generator=gen)
    accepted = (torch.rand(rows, generator=gen) * (admitted + 1)).floor().long().clamp(max=admitted)
    return {
        "idx_mapping": slots,
        "num_sampled": (accepted + (torch.rand(rows, generator=gen) < 0.9)).to(torch.int32),
        "num_rejected": (admitted - accepted).to(torch.int32),
    }


def expected_stats(
    est: OnlineAcceptanceEstimator, batch: dict[str, torch.Tensor], keep: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """reference.round_statistics of one graded batch: vLLM's accepted/admitted, read from the
    slots as they were at draft time."""
    slots = batch["idx_mapping"].numpy().astype(np.int64)
    sampled = batch["num_sampled"].numpy().astype(np.int64)
    rejected = batch["num_rejected"].numpy().astype(np.int64)
    accepted = np.maximum(sampled - 1, 0)
    admitted = accepted + rejected
    if keep is not None:
        slots, accepted, admitted = slots[keep], accepted[keep], admitted[keep]
    return reference.round_statistics(
        est.features.numpy()[slots].astype(np.float64),
        admitted,
        accepted,
        est.predictions.numpy()[slots].astype(np.float64),
    )


def add_stats(total: dict[str, np.ndarray], more: dict[str, np.ndarray]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, 0.0) + value


# --- step: labels, skip_rows, schedule ---------------------------------------------------------


def test_step_labels_match_vllm_accounting() -> None:
    # accepted = max(num_sampled - 1, 0) (the bonus token), admitted = accepted + num_rejected;
    # statistics read the features and predictions stored in each row's slot.
    est = OnlineAcceptanceEstimator(16, 5, CPU)
    fill_slots(est, 0)
    total: dict[str, np.ndarray] = {}
    for seed in range(6):
        batch = grade(est, seed, rows=12)
        add_stats(total, expected_stats(est, batch))
        est.step(**batch)
    got = round_stats(est)
    for name in total:
        np.testing.assert_allclose(got[name], total[name], rtol=1e-9, atol=1e-9, err_msg=name)
    assert got["n"].sum() > 20


def test_hand_made_verdicts() -> None:
    est = OnlineAcceptanceEstimator(4, 3, CPU)
    fill_slots(est, 1)
    # slot 2: 2 accepted + bonus, 1 rejected -> labels 1, 1, 0
    # slot 0: nothing accepted, bonus only, 1 rejected -> label 0 at position 0
    # slot 3: all 3 accepted + bonus -> labels 1, 1, 1
    # slot 1: no drafts verified (num_sampled 1, num_rejected 0) -> nothing
    # Entries past the batch (padding in vLLM's buffers) are ignored.
    est.step(ivec([2, 0, 3, 1]), ivec([3, 1, 4, 1, 4]), ivec([1, 1, 0, 0, 3]))
    assert round_stats(est)["n"].tolist() == [3.0, 2.0, 2.0]


def test_skip_rows_do_not_train_the_coefficients() -> None:
    est = OnlineAcceptanceEstimator(16, 4, CPU)
    fill_slots(est, 2)
    batch = grade(est, 3, rows=10)
    skip = torch.tensor([i % 3 == 0 for i in range(10)])
    expected = expected_stats(est, batch, keep=~skip.numpy())
    est.step(**batch, skip_rows=skip)
    got = round_stats(est)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, atol=1e-9, err_msg=name)
    # Skipping everything adds nothing at all.
    before = est.state_dict()
    est.step(**batch, skip_rows=torch.ones(10, dtype=torch.bool))
    assert est.state_dict()["estimator"]["round_stats"] == before["estimator"]["round_stats"]


def test_refit_every_refit_interval_steps_matches_the_float64_reference() -> None:
    est = OnlineAcceptanceEstimator(32, 4, CPU)
    fill_slots(est, 4)
    total: dict[str, np.ndarray] = {}
    for seed in range(99):
        batch = grade(est, 100 + seed, rows=20)
        add_stats(total, expected_stats(est, batch))
        est.step(**batch)
    assert est.num_refits == 0 and est.steps_since_refit == 99
    assert est.slope.tolist() == [np.float32(0.5)]
    batch = grade(est, 999, rows=20)
    add_stats(total, expected_stats(est, batch))
    est.step(**batch)
    assert est.num_refits == 1 and est.steps_since_refit == 0
    slope, intercepts = reference.vllm_refit(0.5, np.full(4, -0.2), total)
    assert est.slope.dtype == torch.float32 and est.intercepts.dtype == torch.float32
    assert est.slope.item() == pytest.approx(slope, rel=1e-6)
    np.testing.assert_allclose(est.intercepts.numpy(), intercepts, rtol=1e-6, atol=1e-7)
    assert round_stats(est)["n"].sum() == 0  # each round fits its own window


def test_class_constants_are_read_from_the_instance() -> None:
    est = OnlineAcceptanceEstimator(16, 3, CPU)
    est.REFIT_INTERVAL = 3
    est.L2 = 0.25
    est.DAMPING_OBSERVATIONS = 5.0
    fill_slots(est, 5)
    total: dict[str, np.ndarray] = {}
    for seed in range(3):
        batch = grade(est, 200 + seed, rows=14)
        add_stats(total, expected_stats(est, batch))
        est.step(**batch)
    assert est.num_refits == 1
    slope, intercepts = reference.vllm_refit(0.5, np.full(3, -0.2), total, l2=0.25, damping=5.0)
    assert est.slope.item() == pytest.approx(slope, rel=1e-6)
    np.testing.assert_allclose(est.intercepts.numpy(), intercepts, rtol=1e-6, atol=1e-7)
    assert OnlineAcceptanceEstimator.REFIT_INTERVAL == 100  # the class is untouched


def test_non_finite_features_drop_their_rows_instead_of_stopping_serving() -> None:
    est = OnlineAcceptanceEstimator(4, 3, CPU)
    fill_slots(est, 6)
    est.features[1, 0] = math.nan  # labelled below: the row is dropped
    est.features[2, 2] = math.nan  # never labelled: the row still counts
    est.step(ivec([1, 2]), ivec([1, 2]), ivec([1, 1]))
    assert round_stats(est)["n"].tolist() == [1.0, 1.0, 0.0]
    assert est.num_dropped_rows == 1


# --- staged hand-over (the CUDA path, run on host tensors with controllable events) ------------


class FakeEvent:
    """A CUDA event stand-in: complete once the test says so, or when waited on."""

    def __init__(self, log: list[str]) -> None:
        self.done = False
        self.log = log

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append("wait")
        self.done = True


def staged_with_fake_events(m: int, k: int) -> tuple[OnlineAcceptanceEstimator, list[FakeEvent]]:
    est = OnlineAcceptanceEstimator(m, k, CPU, staged=True)
    events: list[FakeEvent] = []
    log: list[str] = []

    def new_event() -> FakeEvent:
        events.append(FakeEvent(log))
        return events[-1]

    est._new_event = new_event  # type: ignore[method-assign]
    return est, events


def trace(m: int, k: int, steps: int, seed: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """(logits [N, K, V], idx_mapping [N] with padding, temperature, num_sampled, num_rejected)."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        live = int(torch.randint(1, m + 1, (1,), generator=gen))
        idx = torch.cat([torch.randperm(m, generator=gen)[:live], torch.full((2,), -1)])
        logits = torch.randn(live + 2, k, 50, generator=gen) * 2
        temperature = torch.rand(m, generator=gen) + 0.3
        admitted = torch.randint(0, k + 1, (live,), generator=gen)
        accepted = (torch.rand(live, generator=gen) * (admitted + 1)).floor().long()
        accepted = accepted.clamp(max=admitted)
        yield logits, idx.to(torch.int32), temperature, accepted + 1, admitted - accepted


def drive(est: OnlineAcceptanceEstimator, batch: tuple[torch.Tensor, ...]) -> None:
    logits, idx, temperature, sampled, rejected = batch
    live = sampled.shape[0]
    est.step(idx[:live], sampled, rejected)
    conf = torch.zeros(est.max_num_reqs + 2, est.num_speculative_steps)
    for position in range(est.num_speculative_steps):
        est.predict(logits[:, position], idx, torch.tensor(position), conf, temperature)


def test_staged_refit_lags_one_step_and_fits_the_same_round() -> None:
    m, k = 8, 3
    direct = OnlineAcceptanceEstimator(m, k, CPU)
    staged = OnlineAcceptanceEstimator(m, k, CPU, staged=True)
    assert not direct.staged and staged.staged
    batches = list(trace(m, k, 101, seed=7))
    for step, batch in enumerate(batches[:100], start=1):
        drive(direct, batch)
        drive(staged, batch)
        if step == 100:
            assert direct.num_refits == 1 and staged.num_refits == 0
            assert staged.slope.item() == np.float32(0.5)
            refit_slope, refit_intercepts = direct.slope.clone(), direct.intercepts.clone()
    drive(staged, batches[100])  # its step() folds step 100's verdicts, then refits
    assert staged.num_refits == 1
    assert torch.equal(staged.slope, refit_slope)
    assert torch.equal(staged.intercepts, refit_intercepts)


def test_staged_steps_fold_only_landed_copies_and_wait_only_at_a_refit() -> None:
    m, k = 8, 2
    est, events = staged_with_fake_events(m, k)
    est.REFIT_INTERVAL = 3
    fill_slots(est, 8)
    batch = grade(est, 9, rows=6)
    est.step(**batch)
    est.step(**batch)
    assert est._native.round_counts().sum() == 0  # nothing landed: nothing folded, no wait
    assert events[0].log == []
    events[0].done = True
    est.step(**batch)  # folds step 1; step 3 makes a refit due
    assert est._native.round_counts().sum() > 0
    assert est.num_refits == 0 and events[0].log == []
    est.step(**batch)  # the refit needs steps 2 and 3: it waits for them, then refits
    assert events[0].log == ["wait", "wait"]
    assert est.num_refits == 1


def test_a_full_staging_ring_waits_for_its_oldest_copy() -> None:
    est, events = staged_with_fake_events(8, 2)
    fill_slots(est, 10)
    batch = grade(est, 11, rows=5)
    depth = av_vllm.staging._STAGING_DEPTH
    for _ in range(depth):
        est.step(**batch)
    assert events[0].log == []
    est.step(**batch)
    assert events[0].log == ["wait"] and events[0].done and not events[1].done
    est.flush()
    assert all(event.done for event in events)
    assert est._native.round_counts().sum() > 0


@pytest.mark.parametrize("build_in_inference_mode", [True, False])
@pytest.mark.parametrize("staged", [True, False])
def test_works_in_and_out_of_inference_mode(build_in_inference_mode: bool, staged: bool) -> None:
    # vLLM builds and drives the estimator under torch.inference_mode() in some paths and not
    # in others; every write must work either way.
    if build_in_inference_mode:
        with torch.inference_mode():
            est = OnlineAcceptanceEstimator(8, 3, CPU, staged=staged)
    else:
        est = OnlineAcceptanceEstimator(8, 3, CPU, staged=staged)
    est.REFIT_INTERVAL = 2
    batches = list(trace(8, 3, 4, seed=14))
    for index, batch in enumerate(batches):
        if index % 2:
            with torch.inference_mode():
                drive(est, batch)
        else:
            drive(est, batch)
    est.flush()
    assert est.num_refits == 2


def test_state_dict_round_trips() -> None:
    est = OnlineAcceptanceEstimator(8, 3, CPU)
    est.REFIT_INTERVAL = 5
    for batch in trace(8, 3, 12, seed=12):
        drive(est, batch)
    state = est.state_dict()
    other = OnlineAcceptanceEstimator(8, 3, CPU)
    other.load_state_dict(state)
    assert torch.equal(other.slope, est.slope) and torch.equal(other.intercepts, est.intercepts)
    assert other.state_dict() == state
    with pytest.raises(ValueError, match="positions"):
        OnlineAcceptanceEstimator(8, 4, CPU).load_state_dict(state)
    with pytest.raises(ValueError, match="state"):
        other.load_state_dict({"format": "something else"})


def test_selfcheck_harness_runs_on_the_host() -> None:
    # gpu_selfcheck's body with the host as "device": the staged path against the direct one.
    report = av_vllm.selfcheck._compare_with_host(
        CPU, 24, max_num_reqs=8, num_speculative_steps=3, vocab=64, refit_interval=10
    )
    assert report["ok"], report
    assert report["refits"] == {"device": 2, "cpu": 2}
    assert set(report["max_abs_diff_vs_cpu"].values()) == {0.0}
    assert report["step_host_us"]["mean"] > 0 and report["predict_host_us"]["p99"] > 0
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            av_vllm.gpu_selfcheck(10)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_selfcheck_passes() -> None:
    report = av_vllm.gpu_selfcheck(300)
    assert report["ok"], report


# --- predict: layouts --------------------------------------------------------------------------


def log_odds_64(logits: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    t = np.where(temperature > 0, temperature, 1.0).astype(np.float64)
    y = z / t[:, None]
    y = y - y.max(axis=1, keepdims=True)
    e = np.exp(y)
    top = e.argmax(axis=1)
    rest = e.copy()
    rest[np.arange(len(rest)), top] = 0.0
    return np.clip(-np.log(rest.sum(axis=1)), -40.0, 40.0)


def test_per_row_draft_step_uses_block_layout() -> None:
    # One pass drafts the whole block: rows t = r * K + k; batch_idx = t // K, step = draft_step[t].
    m, k = 6, 3
    est = OnlineAcceptanceEstimator(m, k, CPU)
    gen = torch.Generator().manual_seed(13)
    slots = [4, 1]
    idx = torch.tensor([s for s in slots for _ in range(k)] + [-1] * k, dtype=torch.int32)
    step = torch.tensor(list(range(k)) * 3)
    logits = torch.randn(3 * k, 40, generator=gen) * 2
    temperature = torch.tensor([1.0, 0.5, 1.0, 1.0, 0.0, 2.0])
    conf = torch.full((4, k), -7.0)
    est.predict(logits, idx, step, conf, temperature)
    x = log_odds_64(logits.numpy(), temperature.numpy()[np.maximum(idx.numpy(), 0)])
    p = 1.0 / (1.0 + np.exp(-(0.5 * x - 0.2)))
    for t in range(2 * k):
        slot, position, batch = int(idx[t]), int(step[t]), t // k
        assert est.features[slot, position].item() == pytest.approx(x[t], abs=1e-4)
        assert est.predictions[slot, position].item() == pytest.approx(p[t], abs=1e-6)
        assert conf[batch, position].item() == pytest.approx(p[t], abs=1e-6)
    assert (conf[2:] == -7.0).all()  # the padded block writes nothing


def test_predict_rejects_bad_input_naming_the_argument_and_writes_nothing() -> None:
    est = OnlineAcceptanceEstimator(4, 2, CPU)
    logits = torch.randn(2, 10)
    idx = ivec([0, 1])
    conf = torch.zeros(4, 2)
    temp = torch.ones(4)
    good = {
        "logits": logits,
        "idx_mapping": idx,
        "draft_step": torch.tensor(0),
        "confidence_probs": conf,
        "temperature": temp,
    }
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"logits": logits.numpy()}, TypeError, "logits"),
        ({"logits": torch.randn(2, 3, 4)}, ValueError, "logits"),
        ({"idx_mapping": idx.float()}, TypeError, "idx_mapping"),
        ({"idx_mapping": ivec([0])}, ValueError, "idx_mapping"),
        ({"idx_mapping": ivec([0, 4])}, ValueError, "idx_mapping"),
        ({"idx_mapping": ivec([0, -2])}, ValueError, "idx_mapping"),
        ({"draft_step": torch.tensor(2)}, ValueError, "draft_step"),
        ({"draft_step": torch.tensor([0])}, ValueError, "draft_step"),
        ({"draft_step": torch.tensor([[0, 1]])}, ValueError, "draft_step"),
        ({"draft_step": torch.tensor(0.0)}, TypeError, "draft_step"),
        ({"confidence_probs": torch.zeros(4, 1)}, ValueError, "confidence_probs"),
        ({"confidence_probs": torch.zeros(1, 2)}, ValueError, "confidence_probs"),
        ({"temperature": torch.ones(2)}, ValueError, "temperature"),
    ]
    for change, error, name in cases:
        with pytest.raises(error, match=name):
            est.predict(**{**good, **change})
    assert (est.features == 0).all() and (conf == 0).all()


def test_step_rejects_bad_input_naming_the_argument_and_changes_nothing() -> None:
    est = OnlineAcceptanceEstimator(4, 2, CPU)
    good = {"idx_mapping": ivec([0, 1]), "num_sampled": ivec([1, 2]), "num_rejected": ivec([1, 0])}
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"idx_mapping": [0, 1]}, TypeError, "idx_mapping"),
        ({"idx_mapping": ivec([0, 1, 2, 3, 0])}, ValueError, "idx_mapping"),
        ({"idx_mapping": ivec([0, 9])}, ValueError, "idx_mapping"),
        ({"num_sampled": ivec([1])}, ValueError, "num_sampled"),
        ({"num_sampled": ivec([1, -1])}, ValueError, "num_sampled"),
        ({"num_rejected": torch.tensor([0.0, 1.0])}, TypeError, "num_rejected"),
        ({"num_rejected": ivec([0, 3])}, ValueError, "num_rejected"),
        ({"skip_rows": ivec([0, 1])}, TypeError, "skip_rows"),
        ({"skip_rows": torch.zeros(1, dtype=torch.bool)}, ValueError, "skip_rows"),
    ]
    for change, error, name in cases:
        with pytest.raises(error, match=name):
            est.step(**{**good, **change})
    assert est.steps_since_refit == 0 and round_stats(est)["n"].sum() == 0
    for name, value in (("max_num_reqs", 0), ("num_speculative_steps", 1.5)):
        kwargs: dict[str, Any] = {"max_num_reqs": 4, "num_speculative_steps": 2, name: value}
        with pytest.raises((TypeError, ValueError), match=name):
            OnlineAcceptanceEstimator(device=CPU, **kwargs)


# --- budget helpers ----------------------------------------------------------------------------


def cost_table_reference(
    curve: list[tuple[int, float]], limit: int, graph_limit: int
) -> np.ndarray:
    """The cost-table rule of docs/design.md ("The planner and its cost tables"), per entry:
    running max; a step function up to the capture limit; linear between profiled points above
    it; the last segment extended."""
    xs = [float(x) for x, _ in curve]
    ys = list(np.maximum.accumulate([float(y) for _, y in curve]))
    out = np.empty(limit + 1)
    above = [(x, y) for x, y in zip(xs, ys, strict=True) if x > graph_limit] if graph_limit else []
    for size in range(limit + 1):
        if len(xs) > 1 and size > xs[-1]:
            out[size] = ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (size - xs[-1])
        elif above and size > graph_limit:
            if size <= above[0][0]:
                out[size] = above[0][1]
            else:
                j = next(i for i in range(1, len(above)) if above[i][0] >= size)
                (x0, y0), (x1, y1) = above[j - 1], above[j]
                out[size] = y0 + (y1 - y0) * (size - x0) / (x1 - x0)
        else:
            out[size] = next((y for x, y in zip(xs, ys, strict=True) if x >= size), ys[-1])
    return out


@pytest.mark.parametrize("graph_limit", [0, 8, 24])
def test_cost_tables_follow_the_documented_rule(graph_limit: int) -> None:
    draft_curve = [(1, 0.5), (4, 0.9), (8, 0.8), (16, 1.6)]
    verify_curve = [(1, 3.0), (8, 3.5), (16, 4.0), (32, 6.0), (64, 9.5)]
    tables = build_cost_tables_from_curves(draft_curve, verify_curve, 20, 80, graph_limit)
    draft_ms, verify_ms = tables
    np.testing.assert_allclose(
        draft_ms, np.maximum(cost_table_reference(draft_curve, 20, graph_limit), 0.0), rtol=1e-12
    )
    np.testing.assert_allclose(
        verify_ms, np.maximum(cost_table_reference(verify_curve, 80, graph_limit), 1e-6), rtol=1e-12
    )
    assert isinstance(tables, tuple) and len(tables) == 2  # vLLM unpacks it as a pair
    again = pickle.loads(pickle.dumps(tables))
    assert again.native == tables.native and np.array_equal(again[1], verify_ms)


def brute_force_admitted(conf: np.ndarray, capacity: np.ndarray, budget: int) -> np.ndarray:
    survival = np.cumprod(conf.astype(np.float64), axis=1)
    slots = [(-survival[r, k], k, r) for r in range(conf.shape[0]) for k in range(int(capacity[r]))]
    admitted = np.zeros(conf.shape[0], dtype=np.int64)
    for _, _, r in sorted(slots)[:budget]:
        admitted[r] += 1
    return admitted


@pytest.mark.parametrize("seed", range(5))
def test_assignment_is_the_global_top_budget_in_place(seed: int) -> None:
    rng = np.random.default_rng(seed)
    slots, k, rows = 12, 5, 7
    conf = torch.from_numpy(rng.uniform(0.05, 1.0, size=(slots, k)).astype(np.float32))
    conf[3, 1:3] = 1.0  # ties along a request: shallower first
    idx = torch.from_numpy(rng.permutation(slots)[:rows].astype(np.int32))
    capacity = rng.integers(0, k + 1, size=rows).astype(np.int32)
    for budget in (0, 1, int(capacity.sum()) // 2, int(capacity.sum()), int(capacity.sum()) + 3):
        expected = brute_force_admitted(conf.numpy()[idx.numpy()], capacity, budget)
        capacities = torch.from_numpy(capacity.copy())
        assign_draft_token_budget(conf, idx, capacities, budget, k)
        assert capacities.dtype == torch.int32
        assert capacities.tolist() == expected.tolist()
        # The device path (pure torch, no host read-back) gives the same counts.
        device_counts = av_vllm.budget._assign_on_device(
            conf[idx.long()], torch.from_numpy(capacity.copy()), budget
        )
        assert device_counts.tolist() == expected.tolist()


def test_assignment_rejects_bad_input() -> None:
    conf = torch.rand(4, 3)
    with pytest.raises(ValueError, match="draft_budget"):
        assign_draft_token_budget(conf, ivec([0]), ivec([1]), -1, 3)
    with pytest.raises(ValueError, match="capacities"):
        assign_draft_token_budget(conf, ivec([0]), ivec([4]), 1, 3)
    with pytest.raises(ValueError, match="idx_mapping"):
        assign_draft_token_budget(conf, ivec([5]), ivec([1]), 1, 3)
    with pytest.raises(ValueError, match="confidence_probs"):
        assign_draft_token_budget(conf, ivec([0]), ivec([1]), 1, 4)


def budget_reference(
    scheduled_tokens: np.ndarray,
    scheduled_drafts: np.ndarray,
    stale: np.ndarray,
    sampling: int,
    draft_ms: np.ndarray,
    verify_ms: np.ndarray,
    cap: int,
) -> int:
    """The budget of docs/design.md ("The planner and its cost tables") by brute force:
    evaluate E(b) / C(b) for every b, first maximum."""
    survival = np.cumprod(stale.astype(np.float64), axis=1)
    scores = sorted(
        (survival[r, k] for r in range(len(scheduled_drafts)) for k in range(scheduled_drafts[r])),
        reverse=True,
    )
    t = int((scheduled_tokens - scheduled_drafts).sum())
    best, best_value = 0, -math.inf
    for b in range(min(cap, len(scores)) + 1):
        value = (sampling + sum(scores[:b])) / (draft_ms[len(scheduled_drafts)] + verify_ms[t + b])
        if value > best_value:
            best, best_value = b, value
    return best


@pytest.mark.parametrize("seed", range(6))
def test_batch_budget_matches_the_brute_force_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    max_reqs, k = 16, 4
    tables = build_cost_tables_from_curves(
        [(1, 0.4), (8, 0.9), (16, 1.5)], [(1, 2.0), (16, 2.4), (64, 4.0), (128, 9.0)], 16, 128, 16
    )
    req_ids = [f"req-{i}" for i in range(int(rng.integers(1, 10)))]
    slot_of = {req: int(s) for req, s in zip(req_ids, rng.permutation(max_reqs), strict=False)}
    drafts = {req: [7] * int(rng.integers(0, k + 1)) for req in req_ids}
    tokens = {req: len(drafts[req]) + int(rng.integers(1, 3)) for req in req_ids}
    stale = rng.uniform(0.2, 1.0, size=(max_reqs, k)).astype(np.float32)
    computed = rng.integers(0, 50, size=max_reqs)
    prefill = computed + rng.integers(-3, 4, size=max_reqs)
    plan = batch_draft_budget(
        tokens,
        drafts,
        req_id_to_index=slot_of,
        stale_confidences=stale,
        num_computed_tokens=computed,
        prefill_len=prefill,
        cost_tables=tables,
        max_total_logits=64,
        num_bonus_tokens=1,
    )
    slots = np.array([slot_of[r] for r in req_ids])
    sched_tokens = np.array([tokens[r] for r in req_ids])
    sched_drafts = np.array([len(drafts[r]) for r in req_ids])
    sampling = int(np.sum(computed[slots] + sched_tokens - sched_drafts >= prefill[slots]))
    cap = max(0, 64 - len(req_ids))
    expected = budget_reference(
        sched_tokens, sched_drafts, stale[slots], sampling, tables[0], tables[1], cap
    )
    assert isinstance(plan, BatchDraftBudget)
    assert plan.draft_budget == expected
    assert plan.num_tokens == int((sched_tokens - sched_drafts).sum()) + expected
    assert plan.num_drafts_per_req == {r: len(drafts[r]) for r in req_ids}
    assert plan.num_non_draft_tokens_per_req == {r: tokens[r] - len(drafts[r]) for r in req_ids}
    # A plain (draft_ms, verify_ms) pair, as another builder would hand over, gives the same.
    again = batch_draft_budget(
        tokens,
        drafts,
        req_id_to_index=slot_of,
        stale_confidences=stale,
        num_computed_tokens=computed,
        prefill_len=prefill,
        cost_tables=(np.array(tables[0]), np.array(tables[1])),
        max_total_logits=64,
        num_bonus_tokens=1,
    )
    assert again == plan


def test_batch_budget_without_drafts_is_zero() -> None:
    plan = batch_draft_budget(
        {"a": 5, "b": 1},
        {},
        req_id_to_index={"a": 0, "b": 1},
        stale_confidences=np.ones((2, 3), np.float32),
        num_computed_tokens=np.zeros(2, np.int64),
        prefill_len=np.zeros(2, np.int64),
        cost_tables=build_cost_tables_from_curves([(1, 1.0)], [(1, 1.0), (8, 2.0)], 2, 8),
        max_total_logits=64,
        num_bonus_tokens=1,
    )
    assert plan == BatchDraftBudget(6, 0, {"a": 0, "b": 0}, {"a": 5, "b": 1})
    with pytest.raises(ValueError, match="num_tokens_per_req"):
        batch_draft_budget(
            {"a": 1},
            {"a": [1, 2]},
            req_id_to_index={"a": 0},
            stale_confidences=np.ones((1, 3), np.float32),
            num_computed_tokens=np.zeros(1, np.int64),
            prefill_len=np.zeros(1, np.int64),
            cost_tables=build_cost_tables_from_curves([(1, 1.0)], [(1, 1.0), (8, 2.0)], 2, 8),
            max_total_logits=64,
            num_bonus_tokens=1,
        )


# --- the plugin, against fake vLLM module trees -----------------------------------------------


def _fake_function(name: str, signature: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(f"def {name}{signature}:\n    return None\n", namespace)  # noqa: S102 - test fixture
    return namespace[name]


def build_fake_vllm(
    version: str = "0.33.0", overrides: dict[str, str] | None = None
) -> dict[str, types.ModuleType]:
    """Modules named like vLLM 0.33.0's, with its signatures (or `overrides`) and constants, plus
    a speculator module that bound the estimator class with `from ... import`."""
    overrides = overrides or {}
    signature = {
        dotted: overrides.get(dotted, text)
        for (_, dotted), text in vllm_plugin.EXPECTED_SIGNATURES.items()
    }
    estimator_class = type(
        "OnlineAcceptanceEstimator",
        (),
        {
            "REFIT_INTERVAL": 100,
            "DAMPING_OBSERVATIONS": 50.0,
            "L2": 1e-3,
            **{
                method: _fake_function(method, signature[f"OnlineAcceptanceEstimator.{method}"])
                for method in ("__init__", "step", "predict")
            },
        },
    )
    manager = type(
        "AdaptiveVerificationManager",
        (),
        {
            "get_num_tokens": _fake_function(
                "get_num_tokens", signature["AdaptiveVerificationManager.get_num_tokens"]
            )
        },
    )
    names = [
        "vllm",
        "vllm.version",
        "vllm.v1",
        "vllm.v1.worker",
        "vllm.v1.worker.gpu",
        "vllm.v1.worker.gpu.spec_decode",
        vllm_plugin.ESTIMATOR_MODULE,
        vllm_plugin.BUDGET_MODULE,
        "vllm.v1.worker.gpu.spec_decode.speculator",
    ]
    modules = {name: types.ModuleType(name) for name in names}
    vars(modules["vllm.version"]).update(__version__=version)
    vars(modules[vllm_plugin.ESTIMATOR_MODULE]).update(
        OnlineAcceptanceEstimator=estimator_class,
        _MAX_LOG_ODDS=40.0,
        _INIT_SLOPE=0.5,
        _INIT_BIAS=-0.2,
    )
    assign = _fake_function("_assign_draft_token_budget", signature["_assign_draft_token_budget"])
    vars(modules[vllm_plugin.BUDGET_MODULE]).update(
        _assign_draft_token_budget=assign,
        _assign_draft_token_budget_compiled=lambda *args: assign(*args),
        build_cost_tables_from_curves=_fake_function(
            "build_cost_tables_from_curves", signature["build_cost_tables_from_curves"]
        ),
        AdaptiveVerificationManager=manager,
    )
    vars(modules["vllm.v1.worker.gpu.spec_decode.speculator"]).update(
        OnlineAcceptanceEstimator=estimator_class
    )
    return modules


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, types.ModuleType]]:
    modules = build_fake_vllm()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("AV_CORE_VLLM", "1")
    monkeypatch.delenv("AV_CORE_VLLM_ANY_VERSION", raising=False)
    yield modules
    vllm_plugin.uninstall()


def originals(modules: dict[str, types.ModuleType]) -> dict[str, Any]:
    estimator = modules[vllm_plugin.ESTIMATOR_MODULE]
    budget = modules[vllm_plugin.BUDGET_MODULE]
    return {
        "class": estimator.OnlineAcceptanceEstimator,
        "speculator": modules[
            "vllm.v1.worker.gpu.spec_decode.speculator"
        ].OnlineAcceptanceEstimator,
        "tables": budget.build_cost_tables_from_curves,
        "assign": budget._assign_draft_token_budget,
        "compiled": budget._assign_draft_token_budget_compiled,
        "get_num_tokens": budget.AdaptiveVerificationManager.__dict__["get_num_tokens"],
    }


def test_plugin_does_nothing_unless_enabled(
    fake_vllm: dict[str, types.ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = originals(fake_vllm)
    monkeypatch.delenv("AV_CORE_VLLM")
    vllm_plugin.register()
    assert originals(fake_vllm) == before and vllm_plugin.installed() == []


def test_plugin_replaces_and_logs_everything_and_uninstalls(
    fake_vllm: dict[str, types.ModuleType], caplog: pytest.LogCaptureFixture
) -> None:
    before = originals(fake_vllm)
    with caplog.at_level(logging.INFO, logger="vllm.av_core"):
        vllm_plugin.register()
    after = originals(fake_vllm)
    assert after["class"] is OnlineAcceptanceEstimator
    assert after["speculator"] is OnlineAcceptanceEstimator  # the `from ... import` binding too
    assert after["tables"] is build_cost_tables_from_curves
    assert after["assign"] is assign_draft_token_budget
    assert after["compiled"] is assign_draft_token_budget
    assert after["get_num_tokens"] is vllm_plugin._get_num_tokens
    logged = [record.getMessage() for record in caplog.records]
    for entry in (
        f"{vllm_plugin.ESTIMATOR_MODULE}.OnlineAcceptanceEstimator",
        "vllm.v1.worker.gpu.spec_decode.speculator.OnlineAcceptanceEstimator",
        f"{vllm_plugin.BUDGET_MODULE}.build_cost_tables_from_curves",
        f"{vllm_plugin.BUDGET_MODULE}._assign_draft_token_budget ",
        f"{vllm_plugin.BUDGET_MODULE}._assign_draft_token_budget_compiled",
        f"{vllm_plugin.BUDGET_MODULE}.AdaptiveVerificationManager.get_num_tokens",
    ):
        assert any(entry in message for message in logged), entry
    assert len(vllm_plugin.installed()) == 6
    vllm_plugin.register()  # loading twice (vLLM may) changes nothing
    assert len(vllm_plugin.installed()) == 6
    vllm_plugin.uninstall()
    assert originals(fake_vllm) == before


@pytest.mark.parametrize(
    ("dotted", "signature"),
    [
        ("OnlineAcceptanceEstimator.step", "(self, idx_mapping, num_sampled, num_rejected, extra)"),
        ("OnlineAcceptanceEstimator.predict", "(self, logits, idx_mapping, draft_step, probs, t)"),
        ("OnlineAcceptanceEstimator.__init__", "(self, max_num_reqs, num_steps, device)"),
        (
            "build_cost_tables_from_curves",
            "(draft_curve, verify_curve, max_num_reqs, max_batch_tokens, cudagraph_limit=1)",
        ),
        ("AdaptiveVerificationManager.get_num_tokens", "(self, num_tokens_per_req)"),
    ],
)
def test_plugin_refuses_a_changed_interface_and_patches_nothing(
    monkeypatch: pytest.MonkeyPatch, dotted: str, signature: str
) -> None:
    modules = build_fake_vllm(overrides={dotted: signature})
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("AV_CORE_VLLM", "1")
    before = originals(modules)
    with pytest.raises(vllm_plugin.VllmCompatibilityError, match="nothing was patched") as error:
        vllm_plugin.register()
    assert dotted in str(error.value)
    assert originals(modules) == before and vllm_plugin.installed() == []


def test_plugin_refuses_a_changed_constant_or_a_missing_helper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    modules = build_fake_vllm()
    vars(modules[vllm_plugin.ESTIMATOR_MODULE])["OnlineAcceptanceEstimator"].L2 = 1e-2
    del vars(modules[vllm_plugin.BUDGET_MODULE])["_assign_draft_token_budget_compiled"]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(vllm_plugin.VllmCompatibilityError) as error:
        vllm_plugin.install()
    assert "L2" in str(error.value) and "_compiled" in str(error.value)
    assert vllm_plugin.installed() == []


def test_plugin_version_check_and_its_override(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A newer vLLM installs when every interface check passes (before, any version but the
    checked releases was refused, so av_core stopped installing the day vLLM shipped); an
    older one only with the override."""
    modules = build_fake_vllm(version="0.34.0")
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("AV_CORE_VLLM", "1")
    try:
        with caplog.at_level(logging.INFO, logger="vllm.av_core"):
            vllm_plugin.register()
        assert len(vllm_plugin.installed()) == 6
        assert any("0.34.0 is not a release" in r.getMessage() for r in caplog.records)
    finally:
        vllm_plugin.uninstall()
    vars(modules["vllm.version"]).update(__version__="0.31.2")
    with pytest.raises(vllm_plugin.VllmCompatibilityError, match="0.31.2 is older"):
        vllm_plugin.register()
    assert vllm_plugin.installed() == []
    monkeypatch.setenv("AV_CORE_VLLM_ANY_VERSION", "1")
    try:
        vllm_plugin.register()
        assert len(vllm_plugin.installed()) == 6
    finally:
        vllm_plugin.uninstall()


def test_replacement_get_num_tokens_stashes_the_batch_budget_like_vllm() -> None:
    k = 3
    tables = build_cost_tables_from_curves([(1, 0.5), (8, 1.0)], [(1, 2.0), (32, 3.0)], 8, 32)
    stale = np.random.default_rng(0).uniform(0.3, 1.0, size=(8, k)).astype(np.float32)
    manager = types.SimpleNamespace(
        cost_tables=tables,
        req_states=types.SimpleNamespace(
            req_id_to_index={"x": 5, "y": 2},
            num_computed_tokens_np=np.full(8, 10),
            prefill_len=types.SimpleNamespace(np=np.full(8, 5)),
        ),
        _stale_confidences=[
            types.SimpleNamespace(np=np.ones((8, k))),
            types.SimpleNamespace(np=stale),
        ],
        _stale_idx=1,
        _max_total_logits=64,
        num_bonus_tokens=1,
        _batch_budget=None,
    )
    tokens, drafts = {"x": 4, "y": 3}, {"x": [1, 2, 3], "y": [4, 5]}
    num_tokens = vllm_plugin._get_num_tokens(manager, tokens, drafts)
    plan = batch_draft_budget(
        tokens,
        drafts,
        req_id_to_index={"x": 5, "y": 2},
        stale_confidences=stale,
        num_computed_tokens=np.full(8, 10),
        prefill_len=np.full(8, 5),
        cost_tables=tables,
        max_total_logits=64,
        num_bonus_tokens=1,
    )
    assert num_tokens == plan.num_tokens == 2 + plan.draft_budget
    assert manager._batch_budget == ({"x": 3, "y": 2}, {"x": 1, "y": 1}, plan.draft_budget)


def test_drop_in_signatures_follow_the_plugin_table() -> None:
    ours = {
        "OnlineAcceptanceEstimator.__init__": OnlineAcceptanceEstimator.__init__,
        "OnlineAcceptanceEstimator.step": OnlineAcceptanceEstimator.step,
        "OnlineAcceptanceEstimator.predict": OnlineAcceptanceEstimator.predict,
        "build_cost_tables_from_curves": build_cost_tables_from_curves,
        "_assign_draft_token_budget": assign_draft_token_budget,
        "AdaptiveVerificationManager.get_num_tokens": vllm_plugin._get_num_tokens,
    }
    for (_, dotted), expected in vllm_plugin.EXPECTED_SIGNATURES.items():
        text = vllm_plugin.signature_text(ours[dotted])
        assert text == expected or text.startswith(expected[:-1] + ", *, "), (dotted, text)


def test_signature_text_spells_every_kind() -> None:
    def sample(a, /, b, c=1, *args, d, e="x", **kw):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN002, ANN003
        return None

    def keyword_only(a, *, b=None):  # type: ignore[no-untyped-def]  # noqa: ANN001
        return None

    assert vllm_plugin.signature_text(sample) == "(a, /, b, c=1, *args, d, e='x', **kw)"
    assert vllm_plugin.signature_text(keyword_only) == "(a, *, b=None)"
    assert inspect.signature(sample)  # the helper reads what inspect reads


def test_entry_point_is_declared_and_resolves() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    value = config["project"]["entry-points"]["vllm.general_plugins"]["av_core"]
    module_name, _, attribute = value.partition(":")
    module = __import__(module_name, fromlist=[attribute])
    assert getattr(module, attribute) is vllm_plugin.register
