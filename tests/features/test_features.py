"""The torch feature layer against independent float64 references."""

from __future__ import annotations

import inspect
import itertools
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

torch = pytest.importorskip("torch")

from av_core import _native, features  # noqa: E402
from av_core.features import (  # noqa: E402
    MAX_LOG_ODDS,
    FeatureExtractor,
    PartialStats,
    as_numpy,
    combine_partials,
    draft_log_odds,
    entropy,
    partial_stats,
    q_max,
    sampled_gumbel,
    sampled_log_odds,
    to_host,
    top2_margin,
)

ROOT = Path(__file__).resolve().parents[2]
HAS_CUDA = torch.cuda.is_available()
TOLERANCE = 1e-4  # the bound, for |x| <= 30 and float32 inputs
ACCURATE_RANGE = 30.0


# --- float64 references, independent of the code under test ---------------------------------


def scaled_rows(z: np.ndarray, temperature: object) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    if temperature is None:
        t = np.ones(z.shape[0])
    else:
        t = np.broadcast_to(np.asarray(temperature, dtype=np.float64), (z.shape[0],)).copy()
    t[t <= 0] = 1.0
    return z / t[:, None]


def ref_log_odds(
    z: np.ndarray,
    temperature: object = None,
    top_k: np.ndarray | None = None,
    top_p: np.ndarray | None = None,
    clamp: float = MAX_LOG_ODDS,
) -> np.ndarray:
    """logit of the largest probability of softmax(z / T), after vLLM's top-k then top-p,
    by sorting the float64 distribution and summing every kept entry but the first."""
    y = scaled_rows(z, temperature)
    out = np.empty(y.shape[0])
    for r, row in enumerate(y):
        m = row.max()
        if not np.isfinite(m) or np.isnan(row).any():
            out[r] = np.nan
            continue
        q = np.sort(np.exp(row - m))  # ascending
        if top_k is not None and 0 < top_k[r] < len(q):
            q = q[len(q) - top_k[r] :]
        if top_p is not None and top_p[r] < 1.0:
            probs = q / q.sum()
            drop = np.cumsum(probs) <= 1.0 - top_p[r]
            drop[-1] = False
            q = q[~drop]
        complement = q[:-1].sum()
        out[r] = np.clip(-np.log(complement) if complement > 0 else np.inf, -clamp, clamp)
    return out


def ref_top_p_margin(z: np.ndarray, temperature: object, top_k: np.ndarray, top_p: np.ndarray):
    """Smallest distance between a cumulative mass and the top-p threshold, over all rows."""
    y = scaled_rows(z, temperature)
    margin = np.inf
    for r, row in enumerate(y):
        q = np.sort(np.exp(row - row.max()))
        if 0 < top_k[r] < len(q):
            q = q[len(q) - top_k[r] :]
        if top_p[r] < 1.0:
            cum = np.cumsum(q / q.sum())
            margin = min(margin, np.abs(cum - (1.0 - top_p[r])).min())
    return margin


def ref_sampled(z: np.ndarray, tokens: np.ndarray, temperature: object = None):
    """(log q_t - log(1 - q_t), -log(-log q_t)) of each row's token, in float64."""
    y = scaled_rows(z, temperature)
    odds, gumbel = np.empty(len(y)), np.empty(len(y))
    for r, row in enumerate(y):
        t = tokens[r]
        others = np.delete(row, t)
        m = row.max()
        rest = np.exp(others - m).sum()
        odds[r] = (row[t] - m) - np.log(rest)
        neg_log_q = (
            np.log1p(rest) if row[t] == m else np.log(np.exp(row[t] - m) + rest) - (row[t] - m)
        )
        gumbel[r] = -np.log(neg_log_q)
    return np.clip(odds, -40, 40), np.clip(gumbel, -40, 40)


def naive_log_odds(logits: torch.Tensor) -> torch.Tensor:
    """The float32 `log(total - 1)` formula the issue forbids, for comparison."""
    z = logits.float()
    total = torch.exp(z - z.amax(dim=1, keepdim=True)).sum(dim=1)
    return (-torch.log((total - 1.0).clamp(min=0.0))).clamp(-40.0, 40.0)


def check_against_reference(got: torch.Tensor, want: np.ndarray, context: str = "") -> None:
    got_np = got.detach().cpu().double().numpy()
    assert got_np.shape == want.shape
    assert np.array_equal(np.isnan(got_np), np.isnan(want)), context
    finite = ~np.isnan(want)
    err = np.abs(got_np[finite] - want[finite])
    inside = np.abs(want[finite]) <= ACCURATE_RANGE
    assert err[inside].max(initial=0.0) <= TOLERANCE, (context, err[inside].max(initial=0.0))
    # Beyond |x| = 30 only the clamp and relative accuracy are asked for.
    assert (err[~inside] <= 1e-3 * np.abs(want[finite][~inside])).all(), context


# --- adversarial rows ------------------------------------------------------------------------


def near_one_rows(vocab: int, complements: list[float]) -> np.ndarray:
    """One row per target complement mass 1 - q_max: a maximum and vocab - 1 equal entries."""
    rng = np.random.default_rng(1)
    rows = []
    for c in complements:
        gap = math.log((vocab - 1) / c)
        row = np.full(vocab, 5.0 - gap)
        row[rng.integers(vocab)] = 5.0
        rows.append(row)
    return np.array(rows, dtype=np.float32)


def adversarial_rows(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 logits and per-row temperatures covering the cases the issue lists."""
    rng = np.random.default_rng(7)
    rows, temps = [], []

    def add(row: np.ndarray, t: float = 1.0) -> None:
        rows.append(np.asarray(row, dtype=np.float32))
        temps.append(t)

    for row in near_one_rows(vocab, [0.3, 1e-3, 1e-6, 1e-9, 1e-12, 5e-13, 1e-20, 1e-30]):
        add(row)
    runner_up = np.full(vocab, -np.inf)
    runner_up[3], runner_up[vocab - 1] = 2.0, 2.0 - 25.0
    add(runner_up)
    for n_ties in (2, 3):
        row = rng.normal(0.0, 1.0, vocab) - 20.0
        row[rng.choice(vocab, n_ties, replace=False)] = 4.0
        add(row)
    tie_far = np.full(vocab, -50.0)
    tie_far[0], tie_far[vocab - 1] = 1.5, 1.5
    add(tie_far)
    half_masked = rng.normal(0.0, 3.0, vocab)
    half_masked[rng.random(vocab) < 0.5] = -np.inf
    add(half_masked)
    single = np.full(vocab, -np.inf)
    single[vocab // 2] = -3.0
    add(single)
    for t in (1e6, 1e30, 40.0):
        add(rng.normal(0.0, 3.0, vocab), t)
    for t, spread in ((1e-3, 0.02), (1e-6, 3e-5), (0.05, 1.0)):
        add(5.0 + rng.normal(0.0, spread, vocab), t)
    for t in (0.0, -1.0):
        add(rng.normal(0.0, 4.0, vocab) * 3.0, t)
    add(rng.normal(0.0, 2.0, vocab) + 60.0, 0.7)
    add(rng.normal(0.0, 2.0, vocab) - 200.0, 1.0)
    spike_in_tail = rng.normal(0.0, 1.0, vocab)
    spike_in_tail[-1] = 14.0
    add(spike_in_tail)
    return np.stack(rows), np.array(temps)


@pytest.mark.parametrize("vocab", [1000, 4099, 6144])
def test_adversarial_rows_match_float64(vocab: int) -> None:
    z, temps = adversarial_rows(vocab)
    got = draft_log_odds(torch.from_numpy(z), torch.from_numpy(temps))
    want = ref_log_odds(z, temps)
    check_against_reference(got, want, f"vocab={vocab}")
    assert got.dtype == torch.float32
    assert got[13].item() == MAX_LOG_ODDS  # the single finite entry


@pytest.mark.parametrize("shift", [0.0, 84.0, -84.0, 300.0])
def test_scalar_and_per_row_temperature_agree_far_from_zero(shift: float) -> None:
    z = near_one_rows(5000, [0.5, 1e-4, 1e-8, 1e-12]) + np.float32(shift)
    logits = torch.from_numpy(z)
    want = ref_log_odds(z, 0.6)
    check_against_reference(draft_log_odds(logits, 0.6), want, f"scalar, shift {shift}")
    per_row = draft_log_odds(logits, torch.full((4,), 0.6))
    check_against_reference(per_row, want, f"per row, shift {shift}")


def test_log_total_minus_one_fails_the_same_bound() -> None:
    z = near_one_rows(3000, [1e-2, 1e-4, 1e-6, 1e-9, 1e-12])
    want = ref_log_odds(z)
    ours = draft_log_odds(torch.from_numpy(z)).double().numpy()
    naive = naive_log_odds(torch.from_numpy(z)).double().numpy()
    assert np.abs(ours - want).max() <= TOLERANCE
    assert np.abs(naive - want).max() > 100 * TOLERANCE


def test_two_equal_maxima_give_the_log_odds_of_one_of_them() -> None:
    z = torch.full((3, 50), -math.inf)
    z[0, [4, 30]] = 2.0  # only the tie: q = (1/2, 1/2)
    z[1, [0, 49]] = 7.0
    z[1, 10] = 7.0 - math.log(2.0)  # q = (2/5, 2/5, 1/5)
    z[2, [0, 1, 2]] = 0.0
    got = draft_log_odds(z)
    expected = torch.tensor([0.0, math.log(0.4 / 0.6), math.log((1 / 3) / (2 / 3))])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_compute_in_float32(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(3)
    z = rng.normal(0.0, 3.0, (6, 3000)).astype(np.float32)
    z[0, 5] = 30.0
    z[1, [9, 700]] = 12.0
    low = torch.from_numpy(z).to(dtype)
    got = draft_log_odds(low, 0.8)
    check_against_reference(got, ref_log_odds(low.float().numpy(), 0.8), str(dtype))


@settings(max_examples=60, deadline=None)
@given(
    z=arrays(
        np.float32,
        st.tuples(st.integers(1, 4), st.integers(1, 80)),
        elements=st.one_of(
            st.floats(-30, 30, width=32), st.sampled_from([-np.inf, 0.0, 2.0, -7.5])
        ),
    ),
    temperature=st.sampled_from([None, 0.0, 0.3, 1.0, 2.5]),
)
def test_random_rows_match_float64(z: np.ndarray, temperature: float | None) -> None:
    got = draft_log_odds(torch.from_numpy(z), temperature)
    check_against_reference(got, ref_log_odds(z, temperature))


def test_non_finite_rows_give_nan_and_padded_rows_zero() -> None:
    z = torch.randn(5, 100)
    z[0] = -math.inf
    z[1, 3] = math.nan
    z[2, 7] = math.inf
    valid = torch.tensor([True, True, True, True, False])
    z[4] = math.nan  # padding: never read
    got = draft_log_odds(z, row_valid=valid)
    assert torch.isnan(got[:3]).all()
    assert torch.isfinite(got[3])
    assert got[4].item() == 0.0
    nan_temp = draft_log_odds(z[3:4], torch.tensor([math.nan]))
    assert torch.isnan(nan_temp).all()


def test_row_valid_skips_rows_without_changing_the_others() -> None:
    z = torch.randn(9, 5000) * 2.0
    valid = torch.tensor([True, False, True, True, False, False, True, True, False])
    full = draft_log_odds(z)
    masked = draft_log_odds(z, row_valid=valid)
    torch.testing.assert_close(masked[valid], full[valid], atol=1e-6, rtol=0)
    assert (masked[~valid] == 0.0).all()
    assert (draft_log_odds(z, row_valid=torch.zeros(9, dtype=torch.bool)) == 0.0).all()


def test_result_does_not_depend_on_the_row_block_size(monkeypatch: pytest.MonkeyPatch) -> None:
    z = torch.randn(11, 9000) * 3.0
    temps = torch.linspace(0.2, 2.0, 11)
    whole = draft_log_odds(z, temps)
    monkeypatch.setattr(features.stats, "_CPU_BLOCK_BYTES", 9000 * 4 * 3)  # 3 rows per block
    torch.testing.assert_close(draft_log_odds(z, temps), whole, atol=1e-6, rtol=0)


def test_non_contiguous_logits() -> None:
    z = torch.randn(3000, 5).t()  # last-dimension stride 5
    torch.testing.assert_close(draft_log_odds(z), draft_log_odds(z.contiguous()))


# --- the fused CPU kernel (float32, C-contiguous) ----------------------------------------------


def native(z: np.ndarray, temps: object = None, clamp: float = MAX_LOG_ODDS) -> np.ndarray:
    """The Rust kernel called directly, with the temperature conventions of draft_log_odds."""
    t = np.ones(z.shape[0]) if temps is None else np.broadcast_to(temps, (z.shape[0],)).copy()
    t = np.where(np.asarray(t) <= 0.0, 1.0, t).astype(np.float64)
    inverse = np.clip(1.0 / t, np.finfo(np.float32).tiny, np.finfo(np.float32).max)
    return _native.draft_log_odds_f32(z, inverse.astype(np.float32), clamp)


@pytest.mark.parametrize("vocab", [1, 17, 2047, 2048, 2049, 4099, 6144, 20000])
def test_native_kernel_matches_float64_on_adversarial_rows(vocab: int) -> None:
    if vocab < 64:
        z = np.random.default_rng(vocab).normal(0.0, 3.0, (4, vocab)).astype(np.float32)
        temps = np.array([1.0, 0.3, 0.0, 5.0])
    else:
        z, temps = adversarial_rows(vocab)
    got = native(np.ascontiguousarray(z), temps)
    assert got.dtype == np.float32 and got.shape == (z.shape[0],)
    check_against_reference(torch.from_numpy(got), ref_log_odds(z, temps), f"vocab={vocab}")


@pytest.mark.parametrize("vocab", [6000, 129280])
def test_native_kernel_near_one_rows_and_ties_across_blocks(vocab: int) -> None:
    z = near_one_rows(vocab, [0.3, 1e-3, 1e-9, 1e-15, 1e-30])
    ties = np.full((3, vocab), -9.0, dtype=np.float32)
    ties[0, [0, vocab - 1]] = 3.0  # first and last block
    ties[1, [5, 2048 + 5, 2 * 2048 + 5]] = 3.0  # one per block, three blocks
    ties[2, [vocab - 2, vocab - 1]] = 3.0  # both in the tail
    z = np.concatenate([z, ties])
    check_against_reference(torch.from_numpy(native(z)), ref_log_odds(z), f"vocab={vocab}")


def test_native_kernel_threads_agree_with_one_row_at_a_time() -> None:
    rng = np.random.default_rng(11)
    z = (rng.normal(0.0, 2.5, (37, 40000)) + rng.normal(0.0, 4.0, (37, 1))).astype(np.float32)
    z[np.arange(37), rng.integers(0, 40000, 37)] += np.linspace(0.0, 30.0, 37, dtype=np.float32)
    temps = rng.uniform(0.2, 2.0, 37)
    whole = native(z, temps)  # 1.5M elements: split across threads
    rows = np.concatenate([native(z[r : r + 1], temps[r : r + 1]) for r in range(37)])
    np.testing.assert_array_equal(whole, rows)
    check_against_reference(torch.from_numpy(whole), ref_log_odds(z, temps))


@settings(max_examples=80, deadline=None)
@given(
    z=arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.integers(1, 5000)),
        elements=st.one_of(
            st.floats(-60, 60, width=32), st.sampled_from([-np.inf, 0.0, 2.0, -7.5, 60.0])
        ),
    ),
    temperature=st.sampled_from([None, 0.0, 0.05, 0.3, 1.0, 2.5, 1e4]),
)
def test_native_kernel_random_rows_match_float64(z: np.ndarray, temperature: float | None) -> None:
    check_against_reference(torch.from_numpy(native(z, temperature)), ref_log_odds(z, temperature))


def test_native_kernel_non_finite_rows_padding_and_clamp() -> None:
    z = np.random.default_rng(5).normal(0.0, 1.0, (7, 3000)).astype(np.float32)
    z[0] = -np.inf
    z[1, 2999] = np.nan
    z[2, 1500] = np.inf
    z[3] = -np.inf
    z[3, 2100] = np.nan  # a NaN after a block of -inf only
    z[4] = -np.inf
    z[4, 17] = 2.0  # a single finite entry
    z[6] = np.nan  # padding: never read
    inverse = np.ones(7, dtype=np.float32)
    inverse[5] = np.nan
    valid = np.array([True] * 6 + [False])
    got = _native.draft_log_odds_f32(z, inverse, 40.0, valid)
    assert np.isnan(got[[0, 1, 2, 3, 5]]).all()
    assert got[4] == 40.0 and got[6] == 0.0
    assert _native.draft_log_odds_f32(z[4:5], inverse[4:5], 7.5)[0] == 7.5


def test_draft_log_odds_routes_cpu_float32_to_the_native_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    for name in ("draft_log_odds_f32", "draft_log_odds_bf16"):
        kernel = getattr(_native, name)

        def spy(*args: object, _kernel: Any = kernel, _name: str = name) -> np.ndarray:
            calls.append(_name)
            return _kernel(*args)

        monkeypatch.setattr(features.native._native, name, spy)
    z = torch.randn(6, 3000) * 3.0
    temps = torch.tensor([0.0, 0.5, 1.0, math.inf, 2.0, 1e-30], dtype=torch.float64)
    valid = torch.tensor([True, True, True, True, False, True])
    got = draft_log_odds(z, temps, row_valid=valid)
    assert calls == ["draft_log_odds_f32"]
    # Strided: the kernel too, on contiguous copies of blocks of rows, so that every layout gives
    # the bits of its contiguous copy (tests/features/test_feature_layouts_exact.py).
    draft_log_odds(z.t().contiguous().t(), temps)
    assert calls == ["draft_log_odds_f32"] * 2
    draft_log_odds(z.to(torch.float16), temps)  # float16: the torch path
    assert calls == ["draft_log_odds_f32"] * 2
    draft_log_odds(z.to(torch.bfloat16), temps)  # bfloat16: its own kernel entry
    assert calls == ["draft_log_odds_f32"] * 2 + ["draft_log_odds_bf16"]
    monkeypatch.setattr(features.native, "_NATIVE_CPU", False)
    torch_path = draft_log_odds(z, temps, row_valid=valid)
    assert torch.isnan(got[3]) and torch.isnan(torch_path[3])  # T = inf
    keep = torch.tensor([True, True, True, False, True, True])
    torch.testing.assert_close(got[keep], torch_path[keep], atol=2e-5, rtol=0)


def test_bfloat16_kernel_equals_the_float32_kernel_on_the_widened_logits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bfloat16 is the high half of float32, so the kernel widens exactly: the bfloat16 call must
    give the float32 call's bits on the same values, and stay within the torch path's tolerance."""
    generator = torch.Generator().manual_seed(5)
    z = torch.randn(9, 5000, generator=generator) * 4.0
    z[0, 123] += 40.0  # q_max near 1: the complement far below float32's epsilon
    z[1, 10] = z[1, 4097] = 30.0  # a tie across blocks
    z[2] = -math.inf
    z[2, 4500] = 1.0  # a single finite entry
    z[3, 77] = math.nan
    z[4, 78] = math.inf
    z[5] = 0.0  # a flat row
    low = z.to(torch.bfloat16)
    temps = torch.tensor([1.0, 0.7, 1.0, 1.0, 1.0, 2.0, 0.0, 1e-20, 3.0])
    valid = torch.tensor([True] * 8 + [False])
    got = draft_log_odds(low, temps, row_valid=valid)
    want = draft_log_odds(low.float(), temps, row_valid=valid)
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.view(torch.int32).numpy(), want.view(torch.int32).numpy())
    assert got[2] == 40.0 and torch.isnan(got[3:5]).all() and got[8] == 0.0
    monkeypatch.setattr(features.native, "_NATIVE_CPU", False)
    torch_path = draft_log_odds(low, temps, row_valid=valid)
    keep = torch.isfinite(torch_path)
    torch.testing.assert_close(got[keep], torch_path[keep], atol=2e-5, rtol=0)


def test_native_kernel_rejects_bad_arguments() -> None:
    z = np.zeros((2, 5), dtype=np.float32)
    ones = np.ones(2, dtype=np.float32)
    with pytest.raises(TypeError, match="logits"):
        _native.draft_log_odds_f32(z.astype(np.float64), ones, 40.0)
    with pytest.raises(TypeError, match="logits: expected dtype int16"):
        _native.draft_log_odds_bf16(z, ones, 40.0)
    with pytest.raises(ValueError, match="inv_temperature"):
        _native.draft_log_odds_bf16(z.view(np.int16), np.ones(3, dtype=np.float32), 40.0)
    with pytest.raises(TypeError, match="logits"):
        _native.draft_log_odds_f32([[0.0]], ones, 40.0)
    with pytest.raises(ValueError, match="logits"):
        _native.draft_log_odds_f32(z[0], ones, 40.0)
    with pytest.raises(ValueError, match="logits"):
        _native.draft_log_odds_f32(np.zeros((5, 2), dtype=np.float32).T, ones, 40.0)
    with pytest.raises(ValueError, match="logits"):
        _native.draft_log_odds_f32(np.zeros((2, 0), dtype=np.float32), ones, 40.0)
    with pytest.raises(ValueError, match="inv_temperature"):
        _native.draft_log_odds_f32(z, np.ones(3, dtype=np.float32), 40.0)
    with pytest.raises(ValueError, match="inv_temperature"):
        _native.draft_log_odds_f32(z, np.array([1.0, 0.0], dtype=np.float32), 40.0)
    with pytest.raises(TypeError, match="inv_temperature"):
        _native.draft_log_odds_f32(z, np.ones(2), 40.0)
    with pytest.raises(ValueError, match="max_log_odds"):
        _native.draft_log_odds_f32(z, ones, math.inf)
    with pytest.raises(ValueError, match="row_valid"):
        _native.draft_log_odds_f32(z, ones, 40.0, np.ones(3, dtype=bool))
    with pytest.raises(TypeError, match="row_valid"):
        _native.draft_log_odds_f32(z, ones, 40.0, np.ones(2, dtype=np.int8))


# --- the feature never reads the sampled token ------------------------------------------------


def test_feature_is_identical_whatever_token_is_drawn() -> None:
    assert not {"tokens", "token", "sampled"} & set(inspect.signature(draft_log_odds).parameters)
    z = torch.randn(8, 2000) * 2.0
    before = z.clone()
    reference = draft_log_odds(z, 0.9)
    extractor = FeatureExtractor(8, 1)
    drawn = []
    for seed in range(4):
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.multinomial(torch.softmax(z / 0.9, dim=1), 1, generator=generator)
        drawn.append(tokens.squeeze(1))
        x = extractor.write(z, torch.arange(8), 0, 0.9)
        assert torch.equal(x, reference)
        assert torch.equal(extractor.features[:, 0], reference)
    assert torch.equal(z, before)
    # The control: a feature that does read the token changes with it.
    assert any(
        not torch.equal(sampled_log_odds(z, drawn[0], 0.9), sampled_log_odds(z, t, 0.9))
        for t in drawn[1:]
    )


# --- vocabulary-parallel drafters ----------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_sharded_combine_equals_unsharded(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 4))
    vocab = data.draw(st.integers(1, 300))
    z = data.draw(
        arrays(
            np.float32,
            (n, vocab),
            elements=st.one_of(
                st.floats(-30, 30, width=32), st.sampled_from([-np.inf, 0.0, 3.0, 30.0])
            ),
        )
    )
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(vocab - 1, 1)), max_size=6))))
    cuts = [c for c in cuts if 0 < c < vocab]
    temperature = data.draw(st.sampled_from([None, 0.0, 0.4, 1.0, 3.0]))
    logits = torch.from_numpy(z)
    bounds = [0, *cuts, vocab]
    parts = [partial_stats(logits[:, a:b], temperature) for a, b in itertools.pairwise(bounds)]
    combined = combine_partials(parts)
    whole = draft_log_odds(logits, temperature)
    torch.testing.assert_close(combined, whole, atol=5e-5, rtol=0, equal_nan=True)
    check_against_reference(combined, ref_log_odds(z, temperature))


def test_partial_stats_fields() -> None:
    z = torch.tensor([[1.0, 3.0, 3.0, -math.inf], [0.0, 0.0, 0.0, 0.0]])
    stats = partial_stats(z, 0.5, row_valid=torch.tensor([True, True]))
    torch.testing.assert_close(stats.max, torch.tensor([6.0, 0.0]))
    assert stats.argmax.tolist() == [1, 0]
    torch.testing.assert_close(
        stats.complement, torch.tensor([1.0 + math.exp(-4.0), 3.0]), atol=1e-6, rtol=0
    )
    padded = partial_stats(z, row_valid=torch.tensor([False, True]))
    assert padded.max[0].item() == -math.inf and padded.complement[0].item() == 0.0


def test_combine_with_a_shard_that_holds_nothing() -> None:
    z = torch.randn(4, 60)
    empty = partial_stats(torch.full((4, 10), -math.inf))
    parts = [partial_stats(z[:, :25]), empty, partial_stats(z[:, 25:])]
    torch.testing.assert_close(combine_partials(parts), draft_log_odds(z), atol=1e-5, rtol=0)
    valid = torch.tensor([True, False, True, True])
    assert combine_partials(parts, row_valid=valid)[1].item() == 0.0


# --- top-k / top-p ---------------------------------------------------------------------------


def test_top_k_top_p_match_the_truncated_distribution() -> None:
    rng = np.random.default_rng(11)
    vocab, n = 700, 12
    z = (rng.normal(0.0, 2.5, (n, vocab)) + rng.normal(0, 4, (n, 1))).astype(np.float32)
    z[3, [5, 6]] = z[3].max() + 2.0  # a tie at the maximum survives truncation
    temps = rng.choice([0.0, 0.5, 1.0, 1.7], n)
    top_k = np.array([1, 2, 5, 40, 0, -1, vocab, 3, 50, 700, 10, 100])
    top_p = np.array([0.9, 1.0, 0.5, 0.8, 0.95, 0.3, 0.99, 1.0, 0.6, 0.75, 0.2, 0.85])
    assert ref_top_p_margin(z, temps, top_k, top_p) > 1e-6
    logits = torch.from_numpy(z)
    t = torch.from_numpy(temps)
    got = draft_log_odds(logits, t, top_k=torch.from_numpy(top_k), top_p=torch.from_numpy(top_p))
    check_against_reference(got, ref_log_odds(z, temps, top_k=top_k, top_p=top_p))
    only_k = draft_log_odds(logits, t, top_k=torch.from_numpy(top_k))
    check_against_reference(only_k, ref_log_odds(z, temps, top_k=top_k))
    only_p = draft_log_odds(logits, t, top_p=torch.from_numpy(top_p))
    check_against_reference(only_p, ref_log_odds(z, temps, top_p=top_p))
    scalar = draft_log_odds(logits, t, top_k=5, top_p=0.9)
    check_against_reference(
        scalar, ref_log_odds(z, temps, top_k=np.full(n, 5), top_p=np.full(n, 0.9))
    )
    assert got[0].item() == MAX_LOG_ODDS  # top-k 1 leaves one token


def test_truncation_off_by_default_and_when_disabled() -> None:
    z = torch.randn(5, 300) * 2
    plain = draft_log_odds(z)
    torch.testing.assert_close(draft_log_odds(z, top_k=0, top_p=1.0), plain)
    torch.testing.assert_close(draft_log_odds(z, top_k=torch.full((5,), 300)), plain)
    assert not torch.equal(draft_log_odds(z, top_k=3), plain)


def test_truncated_rows_respect_row_valid() -> None:
    z = torch.randn(4, 200)
    valid = torch.tensor([True, False, True, False])
    got = draft_log_odds(z, top_k=torch.tensor([3, 3, 0, 0]), row_valid=valid)
    assert got[1].item() == 0.0 and got[3].item() == 0.0
    want = ref_log_odds(z.numpy(), top_k=np.array([3, 3, 0, 0]))
    check_against_reference(got[valid], want[valid.numpy()])


# --- offline-only features -----------------------------------------------------------------


def test_sampled_features_match_float64() -> None:
    rng = np.random.default_rng(5)
    z = rng.normal(0.0, 3.0, (7, 5000)).astype(np.float32)
    z[0, 17] = 40.0  # q_t -> 1 for the drawn maximum
    z[1, [3, 4]] = 20.0  # drawn token tied with another maximum
    z[2, 99] = -math.inf  # drawn token impossible
    tokens = np.array([17, 3, 99, 4500, 0, 2048, 4999])
    tokens[4] = int(np.argmax(z[4]))
    odds, gumbel = ref_sampled(z, tokens, 0.8)
    logits, t = torch.from_numpy(z), torch.from_numpy(tokens)
    got_odds = sampled_log_odds(logits, t, 0.8).double().numpy()
    got_gumbel = sampled_gumbel(logits, t, 0.8).double().numpy()
    assert np.abs(got_odds - odds).max() <= TOLERANCE
    assert np.abs(got_gumbel - gumbel).max() <= TOLERANCE


def test_q_max_entropy_and_margin_match_float64() -> None:
    rng = np.random.default_rng(9)
    z = rng.normal(0.0, 2.0, (5, 4500)).astype(np.float32)
    z[1, 8] = 60.0
    z[2, [0, 1]] = 9.0
    y = scaled_rows(z, 0.7)
    p = np.exp(y - y.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    logits = torch.from_numpy(z)
    np.testing.assert_allclose(q_max(logits, 0.7).numpy(), p.max(axis=1), rtol=1e-5)
    assert q_max(logits, 0.7)[1].item() == 1.0  # the saturation the log-odds avoids
    logp = np.log(np.where(p > 0, p, 1.0))
    np.testing.assert_allclose(entropy(logits, 0.7).numpy(), -(p * logp).sum(axis=1), atol=1e-4)
    top2 = np.sort(y, axis=1)[:, -2:]
    np.testing.assert_allclose(
        top2_margin(logits, 0.7).numpy(), top2[:, 1] - top2[:, 0], rtol=1e-5, atol=1e-5
    )
    assert top2_margin(torch.tensor([[1.0, -math.inf]]))[0].item() == math.inf


# --- hand-over --------------------------------------------------------------------------------


def test_to_host_passes_cpu_tensors_through_without_copying() -> None:
    x = torch.randn(6, 4)
    view = to_host(x)
    assert isinstance(view, np.ndarray) and view.dtype == np.float32
    assert np.shares_memory(view, x.numpy())
    x[0, 0] = 123.0
    assert view[0, 0] == 123.0


def test_as_numpy_conversions_and_errors() -> None:
    a = np.arange(5.0)
    assert as_numpy(a, "x") is a
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert np.shares_memory(as_numpy(t, "x"), t.numpy())
    assert np.shares_memory(as_numpy(t.t(), "x"), t.numpy())  # strided views stay views
    grad = torch.ones(3, requires_grad=True)
    np.testing.assert_array_equal(as_numpy(grad, "x"), np.ones(3, dtype=np.float32))
    with pytest.raises(TypeError, match="features_arg"):
        as_numpy([1.0, 2.0], "features_arg")
    with pytest.raises(TypeError, match="bf"):
        as_numpy(torch.ones(2, dtype=torch.bfloat16), "bf")


# --- FeatureExtractor ---------------------------------------------------------------------------


def test_extractor_writes_slots_and_skips_padding() -> None:
    extractor = FeatureExtractor(6, 3)
    z = torch.randn(4, 800) * 2
    idx = torch.tensor([4, -1, 0, 2])
    extractor.features.fill_(7.0)
    x = extractor.write(z, idx, 1, 0.5)
    want = draft_log_odds(z, 0.5)
    assert x[1].item() == 0.0
    for row, slot in enumerate(idx.tolist()):
        if slot >= 0:
            assert extractor.features[slot, 1].item() == want[row].item()
    untouched = torch.ones(6, 3, dtype=torch.bool)
    untouched[[4, 0, 2], 1] = False
    assert (extractor.features[untouched] == 7.0).all()
    gathered = extractor.gather(torch.tensor([2, -1, 4]))
    assert gathered[1].eq(0).all()
    assert torch.equal(gathered[0], extractor.features[2])
    host = extractor.to_host(torch.tensor([2, 4]))
    np.testing.assert_array_equal(host, extractor.features[[2, 4]].numpy())


def test_extractor_per_row_steps_and_per_slot_sampling_parameters() -> None:
    extractor = FeatureExtractor(4, 3)
    z = torch.randn(6, 500) * 3
    idx = torch.tensor([0, 0, 0, 3, 3, 3])
    steps = torch.tensor([0, 1, 2, 0, 1, 2])
    slot_temperature = torch.tensor([0.5, 9.0, 9.0, 0.0])
    slot_top_k = torch.tensor([5, 0, 0, 0])
    extractor.write(z, idx, steps, slot_temperature, top_k=slot_top_k)
    want = ref_log_odds(
        z.numpy(), np.array([0.5] * 3 + [0.0] * 3), top_k=np.array([5] * 3 + [0] * 3)
    )
    np.testing.assert_allclose(
        extractor.features[[0, 3]].reshape(-1).numpy(), want, atol=TOLERANCE, rtol=0
    )


def test_extractor_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_num_reqs"):
        FeatureExtractor(0, 3)
    with pytest.raises(TypeError, match="num_speculative_steps"):
        FeatureExtractor(4, 2.0)  # type: ignore[arg-type]
    extractor = FeatureExtractor(4, 2)
    z = torch.randn(2, 10)
    with pytest.raises(ValueError, match="idx_mapping.*4"):
        extractor.write(z, torch.tensor([0, 4]), 0)
    with pytest.raises(ValueError, match="idx_mapping.*shape"):
        extractor.write(z, torch.tensor([0]), 0)
    with pytest.raises(TypeError, match="idx_mapping"):
        extractor.write(z, torch.tensor([0.0, 1.0]), 0)
    with pytest.raises(ValueError, match="draft_step.*2"):
        extractor.write(z, torch.tensor([0, 1]), 2)
    with pytest.raises(ValueError, match="draft_step"):
        extractor.write(z, torch.tensor([0, 1]), torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="temperature.*4"):
        extractor.write(z, torch.tensor([0, 1]), 0, torch.ones(2))


# --- argument checks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"logits": np.zeros((2, 3))}, TypeError, "logits.*ndarray"),
        ({"logits": torch.zeros(2, 3, dtype=torch.float64)}, TypeError, "logits.*float64"),
        ({"logits": torch.zeros(3)}, ValueError, r"logits.*\(3,\)"),
        ({"logits": torch.zeros(2, 0)}, ValueError, "logits"),
        ({"temperature": math.nan}, ValueError, "temperature.*nan"),
        ({"temperature": math.inf}, ValueError, "temperature.*inf"),
        ({"temperature": torch.ones(3)}, ValueError, r"temperature.*\(3,\)"),
        ({"temperature": "hot"}, TypeError, "temperature.*str"),
        ({"temperature": torch.ones(2, dtype=torch.bool)}, TypeError, "temperature.*bool"),
        ({"top_k": -2}, ValueError, "top_k.*-2"),
        ({"top_k": 2.5}, TypeError, "top_k"),
        ({"top_k": torch.ones(2)}, TypeError, "top_k.*float"),
        ({"top_p": 0.0}, ValueError, "top_p.*0.0"),
        ({"top_p": 1.5}, ValueError, "top_p.*1.5"),
        ({"top_p": torch.ones(5)}, ValueError, r"top_p.*\(5,\)"),
        ({"max_log_odds": 0.0}, ValueError, "max_log_odds.*0.0"),
        ({"max_log_odds": math.inf}, ValueError, "max_log_odds.*inf"),
        ({"max_log_odds": "big"}, TypeError, "max_log_odds.*str"),
        ({"row_valid": torch.ones(2)}, TypeError, "row_valid.*float"),
        ({"row_valid": torch.ones(3, dtype=torch.bool)}, ValueError, r"row_valid.*\(3,\)"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict, error: type, match: str) -> None:
    call = {"logits": torch.zeros(2, 3), **kwargs}
    with pytest.raises(error, match=match):
        draft_log_odds(**call)


def test_other_entry_points_check_their_arguments() -> None:
    z = torch.zeros(2, 5)
    with pytest.raises(ValueError, match="tokens.*5"):
        sampled_log_odds(z, torch.tensor([0, 5]))
    with pytest.raises(TypeError, match="tokens.*float"):
        sampled_gumbel(z, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="tokens.*shape"):
        sampled_gumbel(z, torch.tensor([0]))
    with pytest.raises(TypeError, match="logits_shard"):
        partial_stats(np.zeros((2, 5)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="partials.*0"):
        combine_partials([])
    with pytest.raises(TypeError, match="partials"):
        combine_partials(partial_stats(z))  # type: ignore[arg-type]
    good = partial_stats(z)
    bad = PartialStats(torch.zeros(3), torch.zeros(3, dtype=torch.int64), torch.zeros(3))
    with pytest.raises(ValueError, match=r"partials\[1\].max"):
        combine_partials([good, bad])
    with pytest.raises(TypeError, match="features"):
        to_host(np.zeros(3))  # type: ignore[arg-type]


def test_numpy_scalars_are_numbers() -> None:
    z = torch.randn(3, 50)
    torch.testing.assert_close(draft_log_odds(z, np.float32(0.5)), draft_log_odds(z, 0.5))
    torch.testing.assert_close(draft_log_odds(z, top_k=np.int64(3)), draft_log_odds(z, top_k=3))
    extractor = FeatureExtractor(np.int64(4), np.int32(2))
    extractor.write(z, torch.tensor([0, 1, 2]), np.int64(1))
    assert extractor.features.shape == (4, 2)


def test_empty_batch() -> None:
    assert draft_log_odds(torch.zeros(0, 7)).shape == (0,)
    assert partial_stats(torch.zeros(0, 7)).max.shape == (0,)


# --- packaging -------------------------------------------------------------------------------


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter against the installed package."""
    environment = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=240,
    )


def test_import_av_core_does_not_import_torch_and_features_names_the_extra() -> None:
    result = run_python(
        """
        import sys
        import av_core
        assert "torch" not in sys.modules, "import av_core imported torch"
        sys.modules["torch"] = None  # as if torch were not installed
        try:
            import av_core.features
        except ImportError as error:
            print(error)
        else:
            raise SystemExit("av_core.features imported without torch")
        """
    )
    assert result.returncode == 0, result.stderr
    assert 'pip install "av_core[torch]"' in result.stdout


@pytest.mark.skipif(features.triton_kernels.triton is None, reason="triton is not installed")
def test_triton_kernel_in_the_interpreter_matches_the_torch_path() -> None:
    """The CUDA kernel's arithmetic, run on the CPU by Triton's interpreter."""
    result = run_python(
        """
        import json, math
        import numpy as np
        import torch
        from av_core import features as F

        rng = np.random.default_rng(2)
        z = rng.normal(0.0, 3.0, (9, 5000)).astype(np.float32)
        z[0, :] = -20.0; z[0, 4321] = 5.0           # complement ~ 1e-7
        z[1, [10, 3000]] = 40.0                      # tie across chunks
        z[2, :] = -math.inf; z[2, 77] = 1.0         # single finite entry
        z[3, :] = -math.inf                          # no finite entry
        z[4, 1024:2048] = -math.inf                  # a chunk with nothing
        z[5, 4999] = 25.0                            # maximum in the last tile
        logits = torch.from_numpy(z)
        temps = torch.tensor([1.0, 0.0, 0.5, 1.0, 2.0, 0.3, 1e-3, 5.0, 1.0], dtype=torch.float64)
        valid = torch.tensor([True] * 8 + [False])
        temp = F.checks._check_temperature(temps, 9, logits.device)
        feature, stats = F.triton_kernels._stats_triton(logits, temp, valid, 40.0)
        want = F.draft_log_odds(logits, temps, row_valid=valid)
        torch_stats = F.partial_stats(logits, temps, row_valid=valid)
        half, _ = F.triton_kernels._stats_triton(logits.to(torch.bfloat16), temp, valid, 40.0)
        want_half = F.draft_log_odds(logits.to(torch.bfloat16), temps, row_valid=valid)
        scalar, _ = F.triton_kernels._stats_triton(logits, 0.7, None, 40.0)
        want_scalar = F.draft_log_odds(logits, 0.7)
        odd = torch.tensor([1.0, math.inf, math.nan, -2.0] * 2 + [1.0], dtype=torch.float16)
        odd_got, _ = F.triton_kernels._stats_triton(logits, odd, None, 40.0)
        odd_want = F.draft_log_odds(logits, odd)
        print(json.dumps({
            "feature": feature.tolist(), "want": want.tolist(),
            "max": stats.max.tolist(), "want_max": torch_stats.max.tolist(),
            "arg": stats.argmax.tolist(), "want_arg": torch_stats.argmax.tolist(),
            "half": half.tolist(), "want_half": want_half.tolist(),
            "scalar": scalar.tolist(), "want_scalar": want_scalar.tolist(),
            "odd": odd_got.tolist(), "want_odd": odd_want.tolist(),
        }))
        """,
        TRITON_INTERPRET="1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    keys = ("feature", "half", "max", "scalar", "odd")
    for got_key, want_key in ((key, "want" if key == "feature" else f"want_{key}") for key in keys):
        got, want = np.array(out[got_key]), np.array(out[want_key])
        assert np.array_equal(np.isnan(got), np.isnan(want)), got_key
        ok = ~np.isnan(want)
        np.testing.assert_allclose(got[ok], want[ok], atol=2e-5, rtol=1e-6, err_msg=got_key)
    assert out["arg"][:3] == out["want_arg"][:3] and out["arg"][4:8] == out["want_arg"][4:8]
    assert out["feature"][8] == 0.0 and out["feature"][2] == MAX_LOG_ODDS


def test_a_failing_kernel_warns_once_and_the_torch_path_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Triton kernel that fails to build must not take a server down: one RuntimeWarning at
    the caller's call site, the torch path's answer, and the kernel not tried again."""
    kernels = features.triton_kernels
    z = torch.randn(5, 300, generator=torch.Generator().manual_seed(9)).to(torch.float16)
    want_x, want_parts = draft_log_odds(z, 0.7), partial_stats(z, 0.7)
    tries: list[int] = []

    def broken(*args: object) -> None:
        tries.append(1)
        raise RuntimeError("no kernel for this GPU")

    monkeypatch.setattr(kernels, "_triton_failed", False)
    monkeypatch.setattr(kernels, "_stats_triton", broken)
    monkeypatch.setattr(kernels, "_use_triton", lambda logits: not kernels._triton_failed)
    with pytest.warns(RuntimeWarning, match="Triton kernel unavailable") as caught:
        got_parts = partial_stats(z, 0.7)
    assert caught[0].filename == __file__  # the caller's line, not av_core's
    assert kernels._triton_failed and tries == [1]
    for got, want in zip(got_parts, want_parts, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(draft_log_odds(z, 0.7), want_x, atol=0, rtol=0)
    assert tries == [1]  # disabled: not tried again


# --- CUDA ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_matches_float64(dtype: torch.dtype) -> None:
    z, temps = adversarial_rows(129280)
    logits = torch.from_numpy(z).to("cuda", dtype)
    got = draft_log_odds(logits, torch.from_numpy(temps).cuda())
    assert got.device.type == "cuda"
    assert not features.triton_kernels._triton_failed or features.triton_kernels.triton is None
    check_against_reference(got, ref_log_odds(logits.float().cpu().numpy(), temps), str(dtype))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_torch_fallback_matches_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    z = torch.randn(37, 50000, device="cuda") * 3
    valid = torch.rand(37, device="cuda") > 0.3
    kernel = draft_log_odds(z, 0.7, row_valid=valid)
    monkeypatch.setattr(features.triton_kernels, "triton", None)
    fallback = draft_log_odds(z, 0.7, row_valid=valid)
    torch.testing.assert_close(kernel, fallback, atol=2e-5, rtol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_sharded_combine_and_extractor_and_hand_over() -> None:
    z = torch.randn(64, 32000, device="cuda") * 2
    parts = [partial_stats(z[:, a : a + 8000], 0.8) for a in range(0, 32000, 8000)]
    torch.testing.assert_close(combine_partials(parts), draft_log_odds(z, 0.8), atol=5e-5, rtol=0)
    extractor = FeatureExtractor(128, 4, "cuda")
    idx = torch.arange(64, device="cuda") * 2
    idx[5] = -1
    extractor.write(z, idx, 3, 0.8)
    host = extractor.to_host(idx)
    want = draft_log_odds(z, 0.8).cpu().numpy()
    live = (idx >= 0).cpu().numpy()
    np.testing.assert_array_equal(host[live, 3], want[live])
    buffer = torch.empty(100, 4, pin_memory=True)
    view = to_host(extractor.features[:64], out=buffer)
    assert np.shares_memory(view, buffer.numpy())
    np.testing.assert_array_equal(as_numpy(extractor.features, "x"), extractor.features.cpu())


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_peak_memory_is_one_block() -> None:
    z = torch.randn(448, 129280, device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    draft_log_odds(z)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= features.stats._DEVICE_BLOCK_BYTES + (16 << 20), extra
