"""The public Python-level API at its boundaries (issue #17, items 3, 7, 8, 11, 12 and "bad
input changes no state"), as properties drawn by hypothesis.

For every input the caller can build (layouts: C, Fortran/transposed, strided, negative-stride
numpy, expanded rows, torch's lazily negated and conjugated views; dtypes float16, bfloat16,
float32, float64, integers, bool; huge integers; NaN and infinities) a public function either

- gives the answer of the canonical (C-contiguous, plain) copy of the same values, checked
  against an independent float64 or exact-integer reference where one exists, or
- raises ``ValueError``/``TypeError`` naming the argument,

and a stateful object that refuses a call is left exactly as it was.

Scope: the pure-Python layer (``features``, ``FeatureExtractor``, ``planner_torch``, ``metrics``,
the vLLM drop-ins, ``DraftDepthHook``, ``testing``, ``simulate``); the trace readers and
``DraftTrace`` are in ``tests/trace/test_trace_errors.py``. What a Python function hands to the Rust
module is passed C-contiguous (or through a path that does not depend on the binding's layout
handling), so nothing here depends on the bindings' own layout fix.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from av_core import CostTables, assign_draft_budget, features  # noqa: E402
from av_core.features import (  # noqa: E402
    MAX_FEATURE_ENTRIES,
    FeatureExtractor,
    combine_partials,
    draft_log_odds,
    entropy,
    partial_stats,
    q_max,
    sampled_log_odds,
    to_host,
    top2_margin,
)
from av_core.planner_torch import assign_draft_budget_torch, survivals_torch  # noqa: E402
from av_core.testing import MAX_LAW_ENTRIES, SpecTables, emitted_distribution  # noqa: E402
from av_core.tools.metrics import (  # noqa: E402
    MAX_BINS,
    CalibrationReport,
    expected_calibration_error,
    log_loss,
    reliability_curve,
    roc_auc,
)
from av_core.tools.simulate import round_streams  # noqa: E402
from av_core.vllm import (  # noqa: E402
    OnlineAcceptanceEstimator,
    assign_draft_token_budget,
    batch_draft_budget,
    build_cost_tables_from_curves,
)
from av_core.vllm.depth import DraftDepthHook  # noqa: E402

CPU = torch.device("cpu")
LOGIT_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
HUGE_INTS = [2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 2**64 + 1, 10**30, -(2**63) - 1]
#: Exceptions a public function may raise for bad input; anything else is a bug.
CLEAN = (ValueError, TypeError)


def clean_or_none(call: Callable[[], Any], *names: str) -> Exception | None:
    """Run ``call``: None on success, the exception if it is a ValueError/TypeError naming one
    of ``names``; anything else fails the test."""
    try:
        call()
    except CLEAN as error:
        if names:
            assert any(name in str(error) for name in names), (names, str(error))
        return error
    return None


# --------------------------------------------------------------------------------------------
# Layouts of a torch tensor holding given values


def layouts_2d(values: torch.Tensor) -> dict[str, torch.Tensor]:
    """Tensors that all stand for ``values`` ([N, V]) but lie differently in memory."""
    n, v = values.shape
    wide = torch.zeros(n, 3 * v + 1, dtype=values.dtype)
    wide[:, 1 : 3 * v + 1 : 3] = values
    tall = torch.zeros(2 * n, v, dtype=values.dtype)
    tall[::2] = values
    out = {
        "contiguous": values.contiguous(),
        "transposed": values.t().contiguous().t(),
        "column-strided": wide[:, 1 : 3 * v + 1 : 3],
        "row-strided": tall[::2],
        "negated view": (-values)._neg_view(),
        "negated transposed": (-values.t().contiguous())._neg_view().t(),
        "negated strided": (-wide)._neg_view()[:, 1 : 3 * v + 1 : 3],
    }
    if values.dtype == torch.float32:
        # The imaginary part of a conjugated complex tensor is a real tensor with the negative
        # bit set: another way a caller ends up holding one.
        out["imag of conj"] = torch.complex(torch.zeros_like(values), -values).conj().imag
    for name, tensor in out.items():
        assert torch.equal(tensor.resolve_neg().float(), values.float()), name
    return out


def layouts_1d(values: torch.Tensor) -> dict[str, torch.Tensor]:
    """1-D tensors that all stand for ``values``."""
    n = values.shape[0]
    spaced = torch.zeros(2 * n + 1, dtype=values.dtype)
    spaced[1::2] = values
    out = {"contiguous": values.contiguous(), "strided": spaced[1::2]}
    if values.dtype not in (torch.bool, torch.uint8):
        out["negated view"] = (-values)._neg_view()
    if n and bool((values == values[0]).all()):
        out["expanded"] = values[:1].expand(n)
    for name, tensor in out.items():
        assert torch.equal(tensor.resolve_neg(), values), name
    return out


@st.composite
def logits(draw: st.DrawFn, max_rows: int = 5, max_vocab: int = 64) -> torch.Tensor:
    n = draw(st.integers(1, max_rows))
    v = draw(st.integers(1, max_vocab))
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from([0.5, 3.0, 12.0]))
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=generator, dtype=torch.float64) * scale
    if draw(st.booleans()):  # a confident row: q_max near 1
        z[0, draw(st.integers(0, v - 1))] += draw(st.sampled_from([10.0, 25.0]))
    if v > 1 and draw(st.booleans()):  # a tie at the maximum
        z[-1, :2] = z[-1].max() + 1.0
    dtype = draw(st.sampled_from(LOGIT_DTYPES))
    return z.to(dtype)


def reference_log_odds(z: torch.Tensor, temperature: np.ndarray, clamp: float = 40.0) -> np.ndarray:
    """float64 ``-log(sum over all but one occurrence of the max of exp((z - m) / T))``."""
    rows = z.double().numpy()
    out = np.empty(rows.shape[0])
    for r, row in enumerate(rows):
        t = temperature[r] if temperature[r] > 0 else 1.0
        e = np.sort(np.exp((row - row.max()) / t))
        complement = e[:-1].sum()
        out[r] = np.clip(-np.log(complement) if complement > 0 else np.inf, -clamp, clamp)
    return out


def assert_close(got: torch.Tensor, want: torch.Tensor, context: str, atol: float = 5e-5) -> None:
    torch.testing.assert_close(
        got.double(), want.double(), atol=atol, rtol=1e-4, equal_nan=True, msg=context
    )


@settings(max_examples=60, deadline=None)
@given(z=logits(), data=st.data())
def test_every_layout_of_the_logits_gives_the_canonical_features(
    z: torch.Tensor, data: st.DataObject
) -> None:
    """Item 8 and the layout class: a float16 tensor with torch's negative bit lost its sign in
    the dtype-converting copy (features off by up to 1.3); every view must give the features
    of the plain contiguous tensor of the same values, on every path."""
    n, v = z.shape
    temps = torch.tensor(
        data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=n, max_size=n))
    )
    tokens = torch.tensor(data.draw(st.lists(st.integers(0, v - 1), min_size=n, max_size=n)))
    valid = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    canonical = z.contiguous()
    want_x = torch.from_numpy(reference_log_odds(canonical, temps.numpy())).float()
    calls: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "draft_log_odds": lambda x: draft_log_odds(x, temps),
        "row_valid": lambda x: draft_log_odds(x, temps, row_valid=valid),
        "top_k": lambda x: draft_log_odds(x, temps, top_k=2),
        "top_p": lambda x: draft_log_odds(x, temps, top_p=0.9),
        "q_max": lambda x: q_max(x, temps),
        "entropy": lambda x: entropy(x, temps),
        "top2_margin": lambda x: top2_margin(x, temps),
        "sampled_log_odds": lambda x: sampled_log_odds(x, tokens, temps),
        "partials": lambda x: combine_partials(
            [partial_stats(x[:, : v // 2], temps), partial_stats(x[:, v // 2 :], temps)]
            if v > 1
            else [partial_stats(x, temps)]
        ),
    }
    for native in (True, False):
        features.native._NATIVE_CPU = native
        try:
            wanted = {name: call(canonical) for name, call in calls.items()}
            # An independent float64 reference for the feature itself.
            assert_close(wanted["draft_log_odds"], want_x, f"reference native={native}", 1e-4)
            for layout, tensor in layouts_2d(z).items():
                for name, call in calls.items():
                    assert_close(call(tensor), wanted[name], f"{name} on {layout}")
        finally:
            features.native._NATIVE_CPU = True


@settings(max_examples=60, deadline=None)
@given(z=logits(max_rows=4, max_vocab=20), data=st.data())
def test_per_row_arguments_in_any_layout_give_the_canonical_features(
    z: torch.Tensor, data: st.DataObject
) -> None:
    n = z.shape[0]
    temps = torch.tensor(
        data.draw(st.lists(st.sampled_from([0.25, 0.5, 1.0, 3.0]), min_size=n, max_size=n)),
        dtype=data.draw(st.sampled_from([torch.float16, torch.float32, torch.float64])),
    )
    top_p = torch.tensor(
        data.draw(st.lists(st.sampled_from([0.3, 0.8, 1.0]), min_size=n, max_size=n))
    )
    top_k = torch.tensor(data.draw(st.lists(st.integers(-1, 5), min_size=n, max_size=n)))
    valid = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    want = draft_log_odds(z, temps, top_k=top_k, top_p=top_p, row_valid=valid)
    for name_t, t in layouts_1d(temps).items():
        for name_p, p in layouts_1d(top_p).items():
            for name_k, k in layouts_1d(top_k).items():
                got = draft_log_odds(z, t, top_k=k, top_p=p, row_valid=valid)
                assert_close(got, want, f"temperature {name_t}, top_p {name_p}, top_k {name_k}")
    spaced = torch.zeros(2 * n, dtype=torch.bool)
    spaced[::2] = valid
    assert_close(
        draft_log_odds(z, temps, top_k=top_k, top_p=top_p, row_valid=spaced[::2]),
        want,
        "strided row_valid",
    )


@settings(max_examples=200, deadline=None)
@given(
    value=st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(2**70), 2**70)
    | st.sampled_from(
        [10**400, 3.5e38, 3.4028234663852886e38, 1.1754943508222875e-38, 1e-39, 1e-50]
    ),
)
def test_max_log_odds_is_checked_the_same_on_every_dtype_and_path(value: float) -> None:
    """float16 raised RuntimeError or returned zeros where float32 raised ValueError."""
    z = torch.randn(3, 40, generator=torch.Generator().manual_seed(3)) * 4
    outcomes = []
    for dtype in LOGIT_DTYPES:
        for native in (True, False):
            features.native._NATIVE_CPU = native
            try:
                error = clean_or_none(
                    lambda dtype=dtype: draft_log_odds(z.to(dtype), max_log_odds=value),
                    "max_log_odds",
                )
            finally:
                features.native._NATIVE_CPU = True
            outcomes.append(type(error))
    assert len(set(outcomes)) == 1, (value, outcomes)
    # Python compares ints and floats exactly (no overflow), NaN compares False.
    in_range = 1.1754943508222875e-38 <= value <= 3.4028234663852886e38
    if in_range:
        x = draft_log_odds(z, max_log_odds=value)
        assert float(x.abs().max()) <= float(np.float32(value))
    for call in (
        lambda: FeatureExtractor(2, 2, max_log_odds=value),
        lambda: combine_partials([partial_stats(z)], max_log_odds=value),
        lambda: sampled_log_odds(z, torch.zeros(3, dtype=torch.int64), max_log_odds=value),
    ):
        assert (clean_or_none(call, "max_log_odds") is None) == in_range


BAD_TOP_P = [0.0, -0.5, math.nan, -math.inf]


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 5),
    data=st.data(),
    bad=st.sampled_from(BAD_TOP_P),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.float64]),
)
def test_per_row_top_p_and_top_k_are_checked_like_the_scalars_on_rows_in_use(
    n: int, data: st.DataObject, bad: float, dtype: torch.dtype
) -> None:
    z = torch.randn(n, 30, generator=torch.Generator().manual_seed(n))
    row = data.draw(st.integers(0, n - 1))
    top_p = torch.full((n,), 0.9, dtype=dtype)
    top_p[row] = bad
    with pytest.raises(ValueError, match=rf"top_p\[{row}\]"):
        draft_log_odds(z, top_p=top_p)
    with pytest.raises(ValueError, match="top_p"):
        draft_log_odds(z, top_p=bad)  # the scalar, for comparison
    top_k = torch.full((n,), 3)
    top_k[row] = data.draw(st.integers(-(2**62), -2))
    with pytest.raises(ValueError, match=rf"top_k\[{row}\]"):
        draft_log_odds(z, top_k=top_k)
    # A padded row's entry is never used, so it is not refused; the others are unchanged.
    valid = torch.ones(n, dtype=torch.bool)
    valid[row] = False
    fine_p, fine_k = top_p.clone(), top_k.clone()
    fine_p[row], fine_k[row] = 0.9, 3
    got = draft_log_odds(z, top_k=top_k, top_p=top_p, row_valid=valid)
    want = draft_log_odds(z, top_k=fine_k, top_p=fine_p, row_valid=valid)
    assert torch.equal(got, want)


@settings(max_examples=100, deadline=None)
@given(
    value=st.sampled_from(HUGE_INTS + [-2, 10**400]),
    name=st.sampled_from(["top_k", "top_p", "temperature"]),
)
def test_huge_scalars_are_refused_or_mean_what_they_say(value: int, name: str) -> None:
    z = torch.randn(2, 10, generator=torch.Generator().manual_seed(0))
    error = clean_or_none(lambda: draft_log_odds(z, **{name: value}), name)
    if name == "top_k" and value > 0:
        # Any k beyond the vocabulary is no top-k: the plain feature, not an overflow.
        assert error is None
        assert torch.equal(draft_log_odds(z, top_k=value), draft_log_odds(z))
    elif name == "temperature" and value < 2**1024:
        assert error is None  # a finite (huge) temperature is legal
    else:
        assert error is not None


# --------------------------------------------------------------------------------------------
# FeatureExtractor: sizes, layouts, and no state change on a refused write


@settings(max_examples=100, deadline=None)
@given(
    reqs=st.integers(-3, 2**40) | st.sampled_from(HUGE_INTS),
    steps=st.integers(-3, 2**40) | st.sampled_from(HUGE_INTS),
)
def test_feature_extractor_sizes_are_checked_before_allocation(reqs: int, steps: int) -> None:
    """FeatureExtractor(10**6, 10**6) asked for 4 TB."""
    fits = reqs >= 1 and steps >= 1 and (reqs + 1) * steps <= MAX_FEATURE_ENTRIES
    assume(not fits or (reqs + 1) * steps <= 1 << 16)  # keep the accepted ones small to build
    error = clean_or_none(
        lambda: FeatureExtractor(reqs, steps), "max_num_reqs", "num_speculative_steps"
    )
    assert (error is None) == fits
    vllm_error = clean_or_none(
        lambda: OnlineAcceptanceEstimator(reqs, steps, CPU),
        "max_num_reqs",
        "num_speculative_steps",
        "num_positions",
    )
    if not fits:
        assert vllm_error is not None


def test_feature_extractor_refuses_odd_constructor_arguments() -> None:
    for kwargs, name in [
        ({"max_num_reqs": True}, "max_num_reqs"),
        ({"max_num_reqs": 2.0}, "max_num_reqs"),
        ({"device": "no-such-device"}, "device"),
        ({"device": 3}, "device"),
    ]:
        call = {"max_num_reqs": 2, "num_speculative_steps": 2} | kwargs
        assert clean_or_none(lambda: FeatureExtractor(**call), name) is not None  # noqa: B023


def bad_writes(n: int, k: int, m: int) -> list[tuple[dict[str, Any], str]]:
    """Calls of FeatureExtractor.write that must be refused, and the argument they name."""
    z = torch.randn(n, 12)
    idx = torch.arange(n) % m
    good = {"logits": z, "idx_mapping": idx, "draft_step": 0}
    top_p = torch.full((m,), 0.9)
    top_p[int(idx[0])] = math.nan
    top_k = torch.full((m,), 3)
    top_k[int(idx[0])] = -5
    return [
        (good | {"logits": z.double()}, "logits"),
        (good | {"logits": z[0]}, "logits"),
        (good | {"idx_mapping": idx.float()}, "idx_mapping"),
        (good | {"idx_mapping": torch.full((n,), m)}, "idx_mapping"),
        (good | {"idx_mapping": torch.full((n,), -2)}, "idx_mapping"),
        (good | {"idx_mapping": idx[:-1]}, "idx_mapping"),
        (good | {"draft_step": k}, "draft_step"),
        (good | {"draft_step": -1}, "draft_step"),
        (good | {"draft_step": 2**64}, "draft_step"),
        (good | {"draft_step": True}, "draft_step"),
        (good | {"draft_step": torch.full((n,), k)}, "draft_step"),
        (good | {"draft_step": torch.zeros(n)}, "draft_step"),
        (good | {"temperature": math.nan}, "temperature"),
        (good | {"temperature": torch.ones(m + 1)}, "temperature"),
        (good | {"top_p": top_p}, "top_p"),
        (good | {"top_k": top_k}, "top_k"),
        (good | {"top_p": 1.5}, "top_p"),
        (good | {"top_k": torch.ones(m)}, "top_k"),
    ]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 4), k=st.integers(1, 4), data=st.data())
def test_a_refused_write_changes_no_slot(n: int, k: int, data: st.DataObject) -> None:
    m = n + 1
    extractor = FeatureExtractor(m, k)
    extractor.write(torch.randn(n, 12), torch.arange(n), 0)
    before = extractor.features.clone()
    call, name = data.draw(st.sampled_from(bad_writes(n, k, m)))
    error = clean_or_none(lambda: extractor.write(**call), name)
    assert error is not None, call
    assert torch.equal(extractor.features, before)


@settings(max_examples=40, deadline=None)
@given(z=logits(max_rows=4, max_vocab=30), k=st.integers(1, 3))
def test_writes_of_any_layout_store_the_canonical_features(z: torch.Tensor, k: int) -> None:
    n = z.shape[0]
    idx = torch.arange(n - 1, -1, -1)
    expected = FeatureExtractor(n, k)
    expected.write(z.contiguous(), idx, k - 1, torch.full((n,), 0.7))
    for layout, tensor in layouts_2d(z).items():
        for name_i, mapping in layouts_1d(idx).items():
            got = FeatureExtractor(n, k)
            got.write(tensor, mapping, torch.full((n,), k - 1), torch.full((n,), 0.7))
            assert_close(got.features, expected.features, f"{layout}, idx {name_i}")


def test_to_host_reads_negated_views_as_their_values() -> None:
    values = torch.randn(3, 4)
    assert np.array_equal(to_host((-values)._neg_view()), values.numpy())
    with pytest.raises(ValueError, match="out"):
        features.host._check_host_buffer((-torch.zeros(3, 4))._neg_view(), values)


# --------------------------------------------------------------------------------------------
# planner_torch: the Rust path's checks on host tensors, and any layout


@st.composite
def assignments(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    r = draw(st.integers(1, 5))
    k = draw(st.integers(1, 5))
    conf = (
        np.asarray(
            draw(st.lists(st.integers(0, 8), min_size=r * k, max_size=r * k)), dtype=np.float64
        ).reshape(r, k)
        / 8
    )
    sched = np.asarray(draw(st.lists(st.integers(0, k), min_size=r, max_size=r)), dtype=np.int64)
    budget = draw(st.integers(0, r * k + 2) | st.sampled_from(HUGE_INTS[:7]))
    return conf, sched, budget


@settings(max_examples=150, deadline=None)
@given(
    case=assignments(),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
)
def test_torch_assignment_of_any_layout_matches_the_rust_assignment(
    case: tuple[np.ndarray, np.ndarray, int], dtype: torch.dtype
) -> None:
    conf, sched, budget = case
    # The grid j/8 is exact in every float dtype: the Rust answer on float64 is the reference.
    want = assign_draft_budget(conf, sched, min(budget, conf.size)).tolist()
    c = torch.from_numpy(conf).to(dtype)
    for layout, tensor in layouts_2d(c).items():
        for name_s, s in layouts_1d(torch.from_numpy(sched)).items():
            got = assign_draft_budget_torch(tensor, s, budget)
            assert got.tolist() == want, (layout, name_s)
    survival = survivals_torch(layouts_2d(c)["negated view"])
    assert torch.equal(survival, survivals_torch(c))


@settings(max_examples=150, deadline=None)
@given(case=assignments(), data=st.data())
def test_torch_assignment_refuses_on_the_host_what_the_rust_assignment_refuses(
    case: tuple[np.ndarray, np.ndarray, int], data: st.DataObject
) -> None:
    """NaN or negative confidences and scheduled > K were accepted."""
    conf, sched, budget = case
    r, k = conf.shape
    which = data.draw(st.sampled_from(["confidence", "scheduled", "budget"]))
    conf, sched = conf.copy(), sched.copy()
    budget_arg: int | torch.Tensor = min(budget, 2**62)
    if which == "confidence":
        conf[data.draw(st.integers(0, r - 1)), data.draw(st.integers(0, k - 1))] = data.draw(
            st.sampled_from([math.nan, -0.25, 1.5, math.inf, -math.inf])
        )
        name = "confidences"
    elif which == "scheduled":
        sched[data.draw(st.integers(0, r - 1))] = data.draw(st.sampled_from([-1, k + 1, 2**40]))
        name = "scheduled_drafts"
    else:
        budget_arg = data.draw(
            st.sampled_from([-1, torch.tensor(-3), 2.5, True, torch.tensor([1])])
        )
        name = "budget"
    native = clean_or_none(
        lambda: assign_draft_budget(conf, sched, budget_arg if isinstance(budget_arg, int) else 0),
        name,
    )
    torch_error = clean_or_none(
        lambda: assign_draft_budget_torch(
            torch.from_numpy(conf), torch.from_numpy(sched), budget_arg
        ),
        name,
    )
    assert torch_error is not None
    if which != "budget":
        assert native is not None and type(native) is type(torch_error)


# --------------------------------------------------------------------------------------------
# Metrics: exact ranking of integers, any layout and dtype, sizes, clean errors


def exact_auc(labels: list[int], scores: list[Any]) -> Fraction:
    """P(score+ > score-) + P(score+ = score-)/2 by counting pairs, in exact arithmetic."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    neg = [s for s, y in zip(scores, labels, strict=True) if y == 0]
    wins = sum(
        Fraction(1) if a > b else Fraction(1, 2) if a == b else Fraction(0)
        for a in pos
        for b in neg
    )
    return wins / (len(pos) * len(neg))


@st.composite
def integer_scores(draw: st.DrawFn) -> tuple[list[int], Any, list[int]]:
    """(labels, scores as passed, the integers they hold): numpy arrays of every integer dtype,
    bool, or Python lists of integers of any size, clustered around 2**53 and 2**63 so that
    float64 would merge neighbours."""
    n = draw(st.integers(2, 12))
    labels = draw(
        st.lists(st.integers(0, 1), min_size=n, max_size=n).filter(lambda y: 0 < sum(y) < len(y))
    )
    kind = draw(st.sampled_from(["int64", "uint64", "int8", "uint32", "bool", "list"]))
    if kind == "bool":
        values = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return labels, np.array(values), [int(v) for v in values]
    if kind == "list":
        center = draw(st.sampled_from([0, 2**53, 2**63, 2**64, -(2**63), 2**80]))
        values = draw(st.lists(st.integers(center - 3, center + 3), min_size=n, max_size=n))
        return labels, values, values
    info = np.iinfo(kind)
    center = draw(
        st.sampled_from([int(info.min) + 3, 0, 2**53 if info.max > 2**53 else 5, int(info.max) - 3])
    )
    center = min(max(center, int(info.min) + 3), int(info.max) - 3)
    values = draw(st.lists(st.integers(center - 3, center + 3), min_size=n, max_size=n))
    return labels, np.array(values, dtype=kind), values


@settings(max_examples=300, deadline=None)
@given(case=integer_scores())
def test_roc_auc_ranks_integer_scores_exactly(case: tuple[list[int], Any, list[int]]) -> None:
    """2**53 and 2**53 + 1 tied through float64."""
    labels, scores, values = case
    got = roc_auc(labels, scores)
    assert got == float(exact_auc(labels, values))


def numpy_layouts(values: np.ndarray) -> dict[str, np.ndarray]:
    spaced = np.zeros(2 * values.shape[0] + 1, dtype=values.dtype)
    spaced[1::2] = values
    backwards = np.ascontiguousarray(values[::-1])
    return {
        "contiguous": values,
        "strided": spaced[1::2],
        "negative stride": backwards[::-1],
        "column of a Fortran matrix": np.asfortranarray(np.stack([values, values], axis=1))[:, 1],
        "read-only": np.frombuffer(values.tobytes(), dtype=values.dtype),
    }


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(2, 40),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([np.float16, np.float32, np.float64]),
    n_bins=st.integers(1, 20),
    strategy=st.sampled_from(["uniform", "quantile"]),
)
def test_metrics_of_any_layout_equal_the_contiguous_answer(
    n: int, seed: int, dtype: type, n_bins: int, strategy: str
) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    labels[:2] = [0, 1]
    probs = rng.random(n).astype(dtype)
    positions = rng.integers(0, 3, n)
    want = (
        roc_auc(labels, probs),
        log_loss(labels, probs),
        expected_calibration_error(labels, probs, n_bins, strategy),  # type: ignore[arg-type]
        CalibrationReport.from_predictions(labels, probs, positions, n_bins, strategy).to_text(),  # type: ignore[arg-type]
    )
    # Independent reference for the ranking: counting pairs of the float64 values exactly.
    assert want[0] == pytest.approx(
        float(exact_auc(labels.tolist(), probs.astype(np.float64).tolist())), abs=1e-12
    )
    layouts = [
        (name, y, p, k)
        for name, y in numpy_layouts(labels).items()
        for p in [probs]
        for k in [positions]
    ]
    layouts += [(name, labels, p, positions) for name, p in numpy_layouts(probs).items()]
    layouts += [(name, labels, probs, k) for name, k in numpy_layouts(positions).items()]
    for name, y, p, k in layouts:
        got = (
            roc_auc(y, p),
            log_loss(y, p),
            expected_calibration_error(y, p, n_bins, strategy),  # type: ignore[arg-type]
            CalibrationReport.from_predictions(y, p, k, n_bins, strategy).to_text(),  # type: ignore[arg-type]
        )
        assert got == want, name


JUNK = [
    None,
    "abc",
    b"\xff",
    3,
    [],
    [[0, 1], [1]],
    [[0.5, 0.5]],
    np.array([1 + 2j, 0j]),
    np.array(["a", "b"]),
    np.array([object(), object()]),
    [math.nan, 0.5],
    [math.inf, 0.5],
    [2**70, 0],
    [10**400, 0],
    {"a": 1},
]


GOOD_TRUE, GOOD_SCORE = [0, 1], [0.2, 0.7]


@settings(max_examples=200, deadline=None)
@given(
    y_true=st.sampled_from([*JUNK, GOOD_TRUE]),
    y_score=st.sampled_from([*JUNK, GOOD_SCORE]),
    n_bins=st.sampled_from([15, 0, -1, MAX_BINS, MAX_BINS + 1, 10**12, 2**64, 1.5, True, "15"]),
    eps=st.sampled_from([1e-15, 0.0, 0.5, math.nan, "x", 10**400]),
)
def test_metrics_raise_only_value_or_type_errors(
    y_true: Any, y_score: Any, n_bins: Any, eps: Any
) -> None:
    """expected_calibration_error(n_bins=10**12) allocated 8 TB; junk raised anything."""
    clean_or_none(lambda: roc_auc(y_true, y_score), "y_true", "y_score", "roc_auc")
    clean_or_none(lambda: log_loss(y_true, y_score, eps), "y_true", "y_prob", "eps")
    ece = clean_or_none(
        lambda: expected_calibration_error(y_true, y_score, n_bins), "y_true", "y_prob", "n_bins"
    )
    clean_or_none(lambda: reliability_curve(y_true, y_score, n_bins), "y_true", "y_prob", "n_bins")
    clean_or_none(
        lambda: CalibrationReport.from_predictions(y_true, y_score, [0, 1], n_bins),
        "y_true",
        "y_prob",
        "positions",
        "n_bins",
    )
    valid_bins = (
        isinstance(n_bins, int) and not isinstance(n_bins, bool) and 1 <= n_bins <= MAX_BINS
    )
    if y_true is GOOD_TRUE and y_score is GOOD_SCORE:
        assert (ece is None) == valid_bins


def test_calibration_report_bounds_its_work_before_computing() -> None:
    n = 4096
    labels = np.arange(n) % 2
    with pytest.raises(ValueError, match="positions.*n_bins"):
        CalibrationReport.from_predictions(labels, np.full(n, 0.5), np.arange(n), n_bins=MAX_BINS)
    report = CalibrationReport.from_predictions(labels, np.full(n, 0.5), np.arange(n) % 7)
    assert sorted(report.per_position) == list(range(7))
    assert [report.per_position[k].count for k in range(7)] == [
        len(range(k, n, 7)) for k in range(7)
    ]


# --------------------------------------------------------------------------------------------
# The vLLM drop-ins and the depth hook: refused calls change nothing


def estimator_state(est: OnlineAcceptanceEstimator) -> tuple[Any, ...]:
    native = est._native.state_dict()
    return (
        repr(native),
        est.steps_since_refit,
        est.num_refits,
        est._slots.clone(),
        est.slope.clone(),
        est.intercepts.clone(),
    )


def same_state(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(a, b, strict=True)
    )


M, K = 4, 3


def bad_estimator_calls(est: OnlineAcceptanceEstimator) -> list[tuple[Callable[[], Any], str]]:
    z = torch.randn(2, 20)
    idx = torch.tensor([0, 1])
    conf = torch.zeros(2, K)
    temp = torch.ones(M)
    sampled, rejected = torch.tensor([2, 1]), torch.tensor([0, 1])
    return [
        (lambda: est.step(idx.float(), sampled, rejected), "idx_mapping"),
        (lambda: est.step(torch.tensor([0, M]), sampled, rejected), "idx_mapping"),
        (lambda: est.step(idx, torch.tensor([K + 2, 1]), rejected), "num_sampled"),
        (lambda: est.step(idx, sampled, torch.tensor([-1, 0])), "num_rejected"),
        (lambda: est.step(idx, sampled, rejected, skip_rows=torch.tensor([1, 0])), "skip_rows"),
        (
            lambda: est.step(
                torch.arange(M + 1),
                torch.ones(M + 1, dtype=torch.int64),
                torch.zeros(M + 1, dtype=torch.int64),
            ),
            "idx_mapping",
        ),
        (lambda: est.predict(z.double(), idx, torch.tensor(0), conf, temp), "logits"),
        (lambda: est.predict(z, idx, K, conf, temp), "draft_step"),
        (lambda: est.predict(z, idx, 2**64, conf, temp), "draft_step"),
        (lambda: est.predict(z, idx, torch.tensor([0, K]), conf, temp), "draft_step"),
        (lambda: est.predict(z, torch.tensor([0, M]), torch.tensor(0), conf, temp), "idx_mapping"),
        (lambda: est.predict(z, idx, torch.tensor(0), conf[:1], temp), "confidence_probs"),
        (lambda: est.predict(z, idx, torch.tensor(0), conf.long(), temp), "confidence_probs"),
        (
            lambda: est.predict(z, idx, torch.tensor(0), (-conf)._neg_view(), temp),
            "confidence_probs",
        ),
        (lambda: est.predict(z, idx, torch.tensor(0), conf, temp[:1]), "temperature"),
        (lambda: est.predict(z, idx, torch.tensor(0), conf, temp.bool()), "temperature"),
        (
            lambda: est.load_state_dict({"format": "av_core.vllm.OnlineAcceptanceEstimator"}),
            "state",
        ),
        (lambda: est.load_state_dict({"format": "x"}), "state"),
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), warm=st.integers(0, 3))
def test_a_refused_estimator_call_changes_nothing(data: st.DataObject, warm: int) -> None:
    est = OnlineAcceptanceEstimator(M, K, CPU)
    est.REFIT_INTERVAL = 2
    conf = torch.zeros(2, K)
    for _ in range(warm):
        est.predict(torch.randn(2, 20), torch.tensor([0, 1]), torch.tensor(0), conf, torch.ones(M))
        est.step(torch.tensor([0, 1]), torch.tensor([2, 1]), torch.tensor([0, 1]))
    calls = bad_estimator_calls(est)
    index = data.draw(st.integers(0, len(calls) - 1))
    call, name = calls[index]
    before = estimator_state(est)
    error = clean_or_none(call, name)
    assert error is not None, index
    assert same_state(estimator_state(est), before), index


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REFIT_INTERVAL", 0),
        ("REFIT_INTERVAL", 2.5),
        ("L2", -1.0),
        ("DAMPING_OBSERVATIONS", math.nan),
        ("L2", "x"),
    ],
)
def test_a_bad_setting_is_refused_before_the_schedule_moves(name: str, value: Any) -> None:
    est = OnlineAcceptanceEstimator(M, K, CPU)
    setattr(est, name, value)
    before = estimator_state(est)
    assert (
        clean_or_none(
            lambda: est.step(torch.tensor([0]), torch.tensor([2]), torch.tensor([0])), name
        )
        is not None
    )
    assert same_state(estimator_state(est), before)


def test_predict_reads_negated_float16_logits_as_their_values() -> None:
    z = (torch.randn(2, 50, generator=torch.Generator().manual_seed(1)) * 3).half()
    outputs = []
    for logits_in in (z, (-z)._neg_view()):
        est = OnlineAcceptanceEstimator(M, K, CPU)
        conf = torch.zeros(2, K)
        est.predict(logits_in, torch.tensor([0, 1]), torch.tensor(0), conf, torch.ones(M))
        outputs.append((est.features.clone(), conf))
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1])


def test_assign_draft_token_budget_refuses_without_touching_capacities() -> None:
    probs = torch.full((3, K), 0.5)
    idx = torch.tensor([0, 2])
    for call, name in [
        (lambda c: assign_draft_token_budget(probs, idx, c, -1, K), "draft_budget"),
        (lambda c: assign_draft_token_budget(probs, idx, c, True, K), "draft_budget"),
        (lambda c: assign_draft_token_budget(probs, torch.tensor([0, 3]), c, 2, K), "idx_mapping"),
        (lambda c: assign_draft_token_budget(probs.long(), idx, c, 2, K), "confidence_probs"),
        (lambda c: assign_draft_token_budget(probs, idx, c, 2, K + 1), "confidence_probs"),
    ]:
        capacities = torch.tensor([K, K])
        assert clean_or_none(lambda: call(capacities), name) is not None  # noqa: B023
        assert capacities.tolist() == [K, K]
    # A budget beyond every slot admits every slot (no overflow), bfloat16 confidences read.
    capacities = torch.tensor([K, 1])
    assign_draft_token_budget(probs.bfloat16(), idx, capacities, 2**70, K)
    assert capacities.tolist() == [K, 1]
    with pytest.raises(ValueError, match="capacities"):
        assign_draft_token_budget(probs, idx, (-torch.tensor([K, K]))._neg_view(), 2, K)


def budget_inputs() -> dict[str, Any]:
    tables = build_cost_tables_from_curves([(1, 0.5), (8, 1.0)], [(1, 5.0), (64, 8.0)], 8, 64)
    return {
        "num_tokens_per_req": {"a": 3, "b": 2},
        "draft_tokens": {"a": [1, 2], "b": [3]},
        "req_id_to_index": {"a": 0, "b": 3},
        "stale_confidences": np.full((4, K), 0.5),
        "num_computed_tokens": np.array([10, 0, 0, 10]),
        "prefill_len": np.array([5, 0, 0, 5]),
        "cost_tables": tables,
        "max_total_logits": 64,
        "num_bonus_tokens": 1,
    }


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"num_tokens_per_req": {"a": 2**64, "b": 2}}, "num_tokens_per_req"),
        ({"num_tokens_per_req": {"a": 1, "b": 2}}, "num_tokens_per_req"),
        ({"num_tokens_per_req": {"a": "3", "b": 2}}, "num_tokens_per_req"),
        ({"num_tokens_per_req": [3, 2]}, "num_tokens_per_req"),
        ({"draft_tokens": {"a": 5, "b": [3]}}, "draft_tokens"),
        ({"req_id_to_index": {"a": 0}}, "req_id_to_index"),
        ({"req_id_to_index": {"a": 0, "b": 4}}, "req_id_to_index"),
        ({"req_id_to_index": {"a": 0, "b": -1}}, "req_id_to_index"),
        ({"req_id_to_index": {"a": 0, "b": 1.0}}, "req_id_to_index"),
        ({"num_computed_tokens": np.array([10, 0])}, "num_computed_tokens"),
        ({"prefill_len": np.array([5.0, 0, 0, 5])}, "prefill_len"),
        ({"stale_confidences": np.full(4, 0.5)}, "stale_confidences"),
        ({"max_total_logits": -1}, "max_total_logits"),
        ({"num_bonus_tokens": 1.5}, "num_bonus_tokens"),
    ],
)
def test_batch_draft_budget_names_what_is_wrong(change: dict[str, Any], name: str) -> None:
    assert batch_draft_budget(**budget_inputs()).num_tokens >= 2
    assert clean_or_none(lambda: batch_draft_budget(**(budget_inputs() | change)), name) is not None


def test_huge_token_counts_do_not_wrap() -> None:
    plan = batch_draft_budget(
        **(
            budget_inputs()
            | {"num_computed_tokens": np.array([2**62, 0, 0, 2**62], dtype=np.int64)}
        )
    )
    assert plan.num_non_draft_tokens_per_req == {"a": 1, "b": 1}
    for curve in ([(1, "a")], [(1,)], "curve", [(1, 10**400)]):
        assert (
            clean_or_none(
                lambda curve=curve: build_cost_tables_from_curves(curve, [(1, 1.0)], 4, 8),
                "draft_curve",
            )
            is not None
        )  # noqa: B023


def depth_tables() -> CostTables:
    verify = 6.0 + np.arange(8 * (K + 1) + 1) * 0.25
    draft = np.r_[0.0, np.full(8, K * 0.5)]
    return CostTables(draft, verify).with_draft_depth("autoregressive", max_depth=K)


def hook_state(hook: DraftDepthHook) -> tuple[Any, ...]:
    return (
        tuple(tuple(hook.remembered(s).tolist()) for s in range(hook.max_num_reqs)),
        repr([(e[0].tolist(), e[1].tolist(), e[2]) for e in hook._proposals]),
        None if hook.last_depths is None else hook.last_depths.tolist(),
        hook._planner.to_bytes(),  # the exploration policy and its step count included
        hook.exploration,
    )


def bad_hook_calls(hook: DraftDepthHook) -> list[tuple[Callable[[], Any], str]]:
    slots = np.array([1, 2])
    conf = np.full((2, K), 0.5)
    return [
        (lambda: hook.record(np.array([1.7, 2.2]), conf, K), "idx_mapping"),
        (lambda: hook.record(np.array([2**64 - 1, 1], dtype=np.uint64), conf, K), "idx_mapping"),
        (lambda: hook.record(slots, np.full((2, K), "a"), K), "confidences"),
        (lambda: hook.record(slots, conf, np.array([K + 1, 0])), "num_drafted"),
        (lambda: hook.record(slots, conf, 1.5), "num_drafted"),
        (lambda: hook.proposed(slots, np.array([K + 1, 0])), "depths"),
        (lambda: hook.proposed(slots, np.array([0.5, 0.5])), "depths"),
        (lambda: hook.proposed(slots, np.array([1, 1, 1])), "depths"),
        (
            lambda: hook.choose(
                slots,
                num_non_draft_tokens=2,
                num_sampling_requests=2,
                max_depths=np.array([2**64, 1], dtype=object),
            ),
            "max_depths",
        ),
        (
            lambda: hook.choose(
                slots,
                num_non_draft_tokens=2,
                num_sampling_requests=2,
                max_depths=np.array([1.5, 1]),
            ),
            "max_depths",
        ),
        (
            lambda: hook.choose(
                slots,
                num_non_draft_tokens=2,
                num_sampling_requests=2,
                max_depths=np.array([K + 1, 1]),
            ),
            "max_depths",
        ),
        (
            lambda: hook.num_speculative_tokens(
                slots, limit=True, num_non_draft_tokens=2, num_sampling_requests=2
            ),
            "limit",
        ),
        (lambda: hook.add_request(True), "slot"),
        (lambda: hook.add_request(8), "slot"),
        (lambda: hook.mask(np.zeros(3)), "draft_tokens"),
        (lambda: hook.mask([[0, 0]]), "draft_tokens"),
    ]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_refused_depth_hook_call_changes_nothing(data: st.DataObject) -> None:
    hook = DraftDepthHook(depth_tables(), 8, K, exploration=0.5, seed=1)
    hook.record(np.array([1, 2]), np.full((2, K), 0.25), 2)
    hook.choose(np.array([1, 2]), num_non_draft_tokens=2, num_sampling_requests=2)
    hook.proposed(np.array([1, 2]))
    calls = bad_hook_calls(hook)
    index = data.draw(st.integers(0, len(calls) - 1))
    call, name = calls[index]
    before = hook_state(hook)
    assert clean_or_none(call, name) is not None, index
    assert hook_state(hook) == before, index


def test_depth_hook_reads_tensors_in_any_form() -> None:
    conf = torch.full((2, K), 0.25)
    for form in (conf, (-conf)._neg_view(), conf.bfloat16(), conf.t().contiguous().t()):
        hook = DraftDepthHook(depth_tables(), 8, K, exploration=0.0)
        hook.record(torch.tensor([1, 2]), form, torch.tensor(K))
        assert hook.remembered(1).tolist() == [0.25] * K
    for kwargs, name in [
        ({"max_num_reqs": True}, "max_num_reqs"),
        ({"seed": -1}, "seed"),
        ({"exploration": "x"}, "exploration"),
        ({"exploration": math.nan}, "exploration"),
    ]:
        call = {
            "cost_tables": depth_tables(),
            "max_num_reqs": 8,
            "num_speculative_steps": K,
        } | kwargs
        assert clean_or_none(lambda: DraftDepthHook(**call), name) is not None  # noqa: B023


# --------------------------------------------------------------------------------------------
# testing and simulate: sizes refused before enumeration or allocation


@settings(max_examples=60, deadline=None)
@given(
    v=st.integers(1, 10**6) | st.sampled_from([2**64, True, 2.0]),
    k=st.integers(1, 50) | st.sampled_from([0, -1, 2**64]),
    r=st.integers(1, 4),
)
@example(v=1, k=30, r=1)  # one token, but 31 prefix lengths: still counted
@example(v=1, k=2**64, r=1)
def test_exact_law_sizes_are_checked_before_enumeration(v: Any, k: Any, r: int) -> None:
    ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (v, k))
    # The size by logarithms: the power itself can be astronomically large.
    log_size = (k + 1) * r * math.log2(max(v, 2)) if ints and v >= 1 and k >= 1 else math.inf
    fits = ints and v >= 1 and k >= 1 and log_size <= math.log2(MAX_LAW_ENTRIES)
    assume(not fits or log_size <= 12)  # the accepted ones stay quick to build
    error = clean_or_none(
        lambda: SpecTables.from_functions(
            vocab_size=v,
            num_positions=k,
            num_requests=r,
            target=lambda _r, _p: [1.0] * v,
            drafter=lambda _r, _p: [1.0] * v,
        ),
        "vocab_size",
        "num_positions",
        "num_requests",
    )
    assert (error is None) == fits


def test_tables_from_bad_functions_and_oversized_laws_are_refused() -> None:
    for weights in ([0.0, 0.0], [math.nan, 1.0], [-1.0, 2.0], ["a", "b"], [[1.0], [1.0]]):
        with pytest.raises(ValueError, match="weights"):
            SpecTables.from_functions(
                vocab_size=2,
                num_positions=1,
                num_requests=1,
                target=lambda _r, _p: weights,  # noqa: B023
                drafter=lambda _r, _p: [1.0, 1.0],
            )
    small = SpecTables.from_functions(
        vocab_size=2,
        num_positions=1,
        num_requests=1,
        target=lambda _r, _p: [1.0, 1.0],
        drafter=lambda _r, _p: [1.0, 1.0],
    )
    huge = SpecTables(small.vocab_size, 40, small.target, small.drafter)
    with pytest.raises(ValueError, match="MAX_LAW_ENTRIES"):
        emitted_distribution(lambda outcome: [0], huge)


def test_simulated_streams_are_sized_before_allocation() -> None:
    from av_core.tools.evaluate import DraftRounds
    from av_core.tools.trace import trace_from_rows

    trace = trace_from_rows(
        {
            "request_id": 0,
            "step": s,
            "position": 0,
            "workload": "w",
            "logit_q_max": 0.0,
            "admitted": True,
            "label": 1,
        }
        for s in range(3)
    )
    rounds = DraftRounds.from_trace(trace)
    assert round_streams(rounds, 2, 5, 0).rounds.shape == (5, 2)
    for args, name in [
        ((2, 10**12, 0), "steps"),
        ((10**12, 2, 0), "requests"),
        ((True, 2, 0), "num_requests"),
        ((2, 0, 0), "num_steps"),
    ]:
        assert clean_or_none(lambda: round_streams(rounds, *args), name) is not None  # noqa: B023


# --------------------------------------------------------------------------------------------
# Concurrent mutation: what was checked is what is used


@contextmanager
def flipping(
    tensor: torch.Tensor, index: tuple[int, ...], good: float, bad: float
) -> Iterator[None]:
    """Another thread writes ``bad`` and ``good`` in turn into ``tensor[index]`` (ending on
    ``good``), with the interpreter switching threads as often as it can."""
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            tensor[index] = bad
            tensor[index] = good

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)


def race(call: Callable[[], Any], check: Callable[[Any], None], seconds: float = 1.5) -> int:
    """Calls ``call`` for ``seconds``: each either raises ValueError or passes ``check``."""
    successes = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            result = call()
        except ValueError:
            continue
        check(result)
        successes += 1
    return successes


def test_an_index_written_by_another_thread_is_refused_or_used_as_checked() -> None:
    """Checked on the host, then read again to index: a writer in between let IndexError out of
    FeatureExtractor.write and assign_draft_token_budget (and could place a write anywhere)."""
    m, k = 4, 3
    z = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    idx = torch.tensor([0, 1, 2, 3])
    reference = FeatureExtractor(m, k)
    reference.write(z, idx, 0)
    extractor = FeatureExtractor(m, k)
    probs = torch.rand(5, k, generator=torch.Generator().manual_seed(1))
    expected = torch.tensor([k] * 4)
    assign_draft_token_budget(probs, idx, expected, 5, k)

    def write() -> torch.Tensor:
        extractor.write(z, idx, 0)
        return extractor.features.clone()

    def assign() -> torch.Tensor:
        capacities = torch.tensor([k] * 4)
        assign_draft_token_budget(probs, idx, capacities, 5, k)
        return capacities

    with flipping(idx, (1,), 1, 10**9):
        race(write, lambda got: torch.testing.assert_close(got, reference.features))
        race(assign, lambda got: torch.testing.assert_close(got, expected))


def test_confidences_written_by_another_thread_are_refused_or_used_as_checked() -> None:
    conf = torch.full((3, 4), 0.5, dtype=torch.float64)
    sched = torch.tensor([4, 4, 4])
    expected = assign_draft_budget_torch(conf, sched, 6).tolist()
    with flipping(conf, (1, 2), 0.5, math.nan):
        race(
            lambda: assign_draft_budget_torch(conf, sched, 6).tolist(),
            lambda got: got == expected or pytest.fail(str(got)),
        )
    top_p = torch.full((3,), 0.5, dtype=torch.float64)
    z = torch.randn(3, 30, generator=torch.Generator().manual_seed(2))
    want = draft_log_odds(z, top_p=top_p)
    with flipping(top_p, (1,), 0.5, math.nan):
        race(
            lambda: draft_log_odds(z, top_p=top_p),
            lambda got: torch.testing.assert_close(got, want),
        )
