"""Cost tables: vLLM 0.33.0's construction from profiled curves, samples, JSON, errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from av_core import CostTables
from av_core.testing import cost_curves

FloatArray = np.ndarray


def reference_table(
    curve: list[tuple[float, float]], limit: int, cudagraph_limit: int
) -> FloatArray:
    """The documented recipe in float64 numpy, written from docs/design.md's description ("The
    planner and its cost tables": running maximum, step up to the capture limit, interpolation
    above it among points above it, extrapolation along the last segment)."""
    xs = np.array([p[0] for p in curve], dtype=np.float64)
    ys = np.maximum.accumulate(np.array([p[1] for p in curve], dtype=np.float64))
    sizes = np.arange(limit + 1)
    out = ys[np.minimum(np.searchsorted(xs, sizes, side="left"), len(xs) - 1)]
    if cudagraph_limit:
        above = xs > cudagraph_limit
        smooth = sizes > cudagraph_limit
        if above.any() and smooth.any():
            out[smooth] = np.interp(sizes[smooth], xs[above], ys[above])
    if len(xs) > 1:
        past = sizes > xs[-1]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out[past] = ys[-1] + slope * (sizes[past] - xs[-1])
    return out


@settings(max_examples=150, deadline=None)
@given(
    curves=cost_curves(max_size=96),
    max_num_reqs=st.integers(0, 120),
    max_tokens=st.integers(0, 160),
)
def test_tables_match_the_numpy_recipe_exactly(
    curves: tuple[list[tuple[int, float]], list[tuple[int, float]], int],
    max_num_reqs: int,
    max_tokens: int,
) -> None:
    draft, verify, limit = curves
    tables = CostTables.from_curves(
        draft, verify, max_num_reqs=max_num_reqs, max_batch_tokens=max_tokens, cudagraph_limit=limit
    )
    expected_draft = np.maximum(reference_table(draft, max_num_reqs, limit), 0.0)
    expected_verify = np.maximum(reference_table(verify, max_tokens, limit), 1e-6)
    np.testing.assert_array_equal(tables.draft_ms, expected_draft)
    np.testing.assert_array_equal(tables.verify_ms, expected_verify)
    assert tables.max_num_reqs == max_num_reqs
    assert tables.max_batch_tokens == max_tokens


@settings(max_examples=100, deadline=None)
@given(curves=cost_curves(max_size=64))
def test_profiled_points_reproduced_and_monotone(
    curves: tuple[list[tuple[int, float]], list[tuple[int, float]], int],
) -> None:
    _, verify, limit = curves
    tables = CostTables.from_curves(
        [(1, 0.0)], verify, max_num_reqs=1, max_batch_tokens=64, cudagraph_limit=limit
    )
    table = tables.verify_ms
    running = -np.inf
    for size, ms in verify:
        running = max(running, ms)
        assert table[size] == max(running, 1e-6)
    assert np.all(np.diff(table) >= -1e-12 * np.maximum(table[1:], 1.0))


def test_step_below_the_limit_linear_above_and_extrapolated() -> None:
    verify = [(2, 1.0), (4, 2.0), (8, 4.0), (16, 6.0)]
    tables = CostTables.from_curves(
        verify, verify, max_num_reqs=1, max_batch_tokens=20, cudagraph_limit=4
    )
    v = tables.verify_ms
    # Up to the limit: padded to the next profiled size.
    np.testing.assert_array_equal(v[:5], [1.0, 1.0, 1.0, 2.0, 2.0])
    # Above it: only points above the limit are blended; before the first of them, its value.
    np.testing.assert_array_equal(v[5:9], [4.0, 4.0, 4.0, 4.0])
    assert v[12] == 5.0
    # Past the last point: the last segment extended (slope 2/8 per token).
    assert v[20] == 7.0
    # No capture limit: steps all the way, then extrapolation.
    plain = CostTables.from_curves(verify, verify, max_num_reqs=1, max_batch_tokens=20)
    np.testing.assert_array_equal(plain.verify_ms[5:9], [4.0, 4.0, 4.0, 4.0])
    assert plain.verify_ms[12] == 6.0


def test_floors_and_running_maximum() -> None:
    tables = CostTables.from_curves(
        [(1, -3.0), (2, -5.0)], [(1, 0.0), (3, 0.0)], max_num_reqs=3, max_batch_tokens=3
    )
    np.testing.assert_array_equal(tables.draft_ms, [0.0] * 4)
    np.testing.assert_array_equal(tables.verify_ms, [1e-6] * 4)
    bumpy = [(1, 5.0), (2, 3.0), (3, 4.0), (4, 7.0)]
    t = CostTables.from_curves(bumpy, bumpy, max_num_reqs=4, max_batch_tokens=4)
    np.testing.assert_array_equal(t.verify_ms, [5.0, 5.0, 5.0, 5.0, 7.0])


def test_from_samples_takes_the_median_per_size() -> None:
    rng = np.random.default_rng(0)
    samples = [(size, float(ms)) for size in (1, 8, 64) for ms in rng.gamma(4.0, size, 5)]
    rng.shuffle(samples)
    tables = CostTables.from_samples(samples, samples, max_num_reqs=64, max_batch_tokens=64)
    medians = [
        (size, float(np.median([ms for s, ms in samples if s == size]))) for size in (1, 8, 64)
    ]
    expected = CostTables.from_curves(medians, medians, max_num_reqs=64, max_batch_tokens=64)
    assert tables == expected
    even = CostTables.from_samples(
        [(4, 1.0), (4, 2.0)], [(4, 1.0)], max_num_reqs=4, max_batch_tokens=4
    )
    assert even.draft_ms[4] == 1.5
    # An [n, 2] array works as well as a list of pairs.
    as_array = CostTables.from_samples(
        np.array(samples), samples, max_num_reqs=64, max_batch_tokens=64
    )
    assert as_array == tables


def test_explicit_tables_json_and_pickle_round_trip() -> None:
    tables = CostTables([0.0, 0.125, 1e-300], [1e-6, 0.3, 12345.678, 1e22])
    np.testing.assert_array_equal(tables.draft_ms, [0.0, 0.125, 1e-300])
    assert CostTables.from_json(tables.to_json()) == tables
    assert pickle.loads(pickle.dumps(tables)) == tables
    assert tables != CostTables([0.0], [1.0])
    assert tables != "not tables"
    assert "max_batch_tokens=3" in repr(tables)
    # Python's own JSON output parses too.
    import json

    text = json.dumps({"verify_ms": [1, 2.5], "draft_ms": [0]})
    np.testing.assert_array_equal(CostTables.from_json(text).verify_ms, [1.0, 2.5])


@pytest.mark.parametrize(
    ("curve", "message"),
    [
        ([], "empty"),
        ([(1, float("nan"))], "finite"),
        ([(1, float("inf"))], "finite"),
        ([(float("nan"), 1.0)], "finite"),
        ([(-1, 1.0)], ">= 0"),
        ([(2, 1.0), (2, 3.0)], "strictly increasing"),
        ([(4, 1.0), (2, 3.0)], "strictly increasing"),
        ([(1, 2, 3)], "[n, 2]"),
    ],
)
def test_bad_curves_name_the_argument(curve: list[tuple[float, ...]], message: str) -> None:
    good = [(1, 1.0)]
    with pytest.raises(
        ValueError, match=r"^verify_curve: .*" + message.replace("[", r"\[").replace("]", r"\]")
    ):
        CostTables.from_curves(good, curve, max_num_reqs=4, max_batch_tokens=4)
    with pytest.raises(ValueError, match=r"^draft_curve: "):
        CostTables.from_curves(curve, good, max_num_reqs=4, max_batch_tokens=4)


def test_bad_sizes_and_tables_name_the_argument() -> None:
    good = [(1, 1.0)]
    with pytest.raises(ValueError, match="^max_batch_tokens: "):
        CostTables.from_curves(good, good, max_num_reqs=4, max_batch_tokens=-1)
    with pytest.raises(ValueError, match="^max_num_reqs: "):
        CostTables.from_curves(good, good, max_num_reqs=-1, max_batch_tokens=4)
    with pytest.raises(ValueError, match="^cudagraph_limit: "):
        CostTables.from_curves(good, good, max_num_reqs=1, max_batch_tokens=4, cudagraph_limit=-2)
    with pytest.raises(ValueError, match="^max_batch_tokens: .*too large"):
        CostTables.from_curves(good, good, max_num_reqs=1, max_batch_tokens=1 << 30)
    with pytest.raises(ValueError, match="^draft_samples: "):
        CostTables.from_samples([], good, max_num_reqs=1, max_batch_tokens=1)
    with pytest.raises(ValueError, match="^verify_ms: "):
        CostTables([0.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="^verify_ms: "):
        CostTables([0.0], [])
    with pytest.raises(ValueError, match="^draft_ms: "):
        CostTables([-1.0], [1.0])
    with pytest.raises(ValueError, match="^draft_ms: "):
        CostTables([float("nan")], [1.0])
    with pytest.raises(ValueError, match="^json: "):
        CostTables.from_json('{"draft_ms": [0]}')
    with pytest.raises(TypeError, match="^draft_curve: "):
        CostTables.from_curves([("a", "b")], good, max_num_reqs=1, max_batch_tokens=1)


@pytest.mark.parametrize("dtype", [complex, bool, object])
def test_curves_of_non_real_dtypes_are_refused(dtype: type) -> None:
    curve = np.array([[1, 2], [3, 4]], dtype=dtype)
    with pytest.raises(TypeError, match="draft_curve"):
        CostTables.from_curves(curve, [[1, 1.0]], max_num_reqs=2, max_batch_tokens=4)
