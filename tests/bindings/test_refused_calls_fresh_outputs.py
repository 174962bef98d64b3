"""Results computed straight into new numpy arrays, and the arguments' direct paths.

``predict``'s probabilities and the planner's per-request arrays are made by the bindings before
the core runs and filled by it (``computed_into`` in ``rust/src/convert.rs``); the core refuses
some inputs only after that (a slot out of range, a count above K, a budget cap). A refused call
must raise the error naming the argument, return no array and change no state, whichever
spelling the arguments came in (numpy's own descriptors take a direct path, other spellings the
general conversion); a result must be an array of its own that later calls never write.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from av_core import AcceptanceEstimator, CostTables, VerificationPlanner, choose_draft_depth

K = 4
SLOTS = 8


def planner() -> VerificationPlanner:
    tables = CostTables(np.linspace(0.5, 1.5, 40), 5 + 0.01 * np.arange(400))
    out = VerificationPlanner(
        tables.with_draft_depth("autoregressive", max_depth=K), K, num_slots=SLOTS
    )
    for slot in range(SLOTS):
        out.add_request(slot)
    rng = np.random.default_rng(3)
    out.plan(
        np.arange(SLOTS),
        rng.uniform(0.2, 1, (SLOTS, K)),
        np.full(SLOTS, K),
        num_non_draft_tokens=SLOTS,
        num_sampling_requests=SLOTS,
    )
    return out


def spellings(values: list[int]) -> dict[str, object]:
    a = np.array(values, dtype=np.int64)
    return {
        "int64": a,
        "int32": a.astype(np.int32),
        "int16": a.astype(np.int16),
        "big-endian": a.astype(">i8"),
        "descriptor copy": a.view(a.dtype.newbyteorder("=")),
        "strided": np.repeat(a, 2)[::2],
        "list": values,
    }


# (slots, scheduled_drafts, the argument the error must name, a piece of its message)
REFUSED = [
    ([0, 1, SLOTS], [K, K, K], "slots", str(SLOTS)),
    ([0, -1, 2], [K, K, K], "slots", "-1"),
    ([0, 3, 3], [K, K, K], "slots", "3"),
    ([0, 1, 2], [K, K + 1, K], "scheduled_drafts", str(K + 1)),
    ([0, 1, 2], [K, -1, K], "scheduled_drafts", "-1"),
]


@pytest.mark.parametrize("refused", REFUSED, ids=lambda r: f"{r[2]}={r[0]}/{r[1]}")
@pytest.mark.parametrize("which", ["slots", "scheduled_drafts"])
def test_a_refused_plan_returns_nothing_and_changes_nothing(refused: tuple, which: str) -> None:
    slots, counts, argument, shown = refused
    conf = np.random.default_rng(1).uniform(0, 1, (3, K))
    for name, spelled in spellings(slots if which == "slots" else counts).items():
        p = planner()
        before = p.to_bytes()
        remembered = [p.previous_confidences(s).copy() for s in range(SLOTS)]
        args = (spelled, counts) if which == "slots" else (slots, spelled)
        with pytest.raises(ValueError) as error:
            p.plan(args[0], conf, args[1], num_non_draft_tokens=3, num_sampling_requests=3)
        assert argument in str(error.value) and shown in str(error.value), (name, error.value)
        with pytest.raises(ValueError) as depth_error:
            p.choose_draft_depth(args[0], args[1], num_non_draft_tokens=3, num_sampling_requests=3)
        assert argument.replace("scheduled_drafts", "max_depths") in str(depth_error.value) or (
            argument in str(depth_error.value)
        ), (name, depth_error.value)
        assert p.to_bytes() == before, name
        for s in range(SLOTS):
            np.testing.assert_array_equal(p.previous_confidences(s), remembered[s])
        # The next call decides as a fresh copy of the state does.
        fresh = VerificationPlanner.from_bytes(before)
        ok = ([0, 1, 2], [K, K, K])
        a = p.plan(*ok[:1], conf, ok[1], num_non_draft_tokens=3, num_sampling_requests=3)
        b = fresh.plan(*ok[:1], conf, ok[1], num_non_draft_tokens=3, num_sampling_requests=3)
        assert a.admitted.tobytes() == b.admitted.tobytes() and a.budget == b.budget
        assert p.to_bytes() == fresh.to_bytes()


def test_results_are_arrays_of_their_own() -> None:
    """Each result: the documented dtype and shape, C-contiguous, aligned, writeable, owning
    its memory; writing it changes no later result; zero rows give empty arrays."""
    est = AcceptanceEstimator(K)
    x = np.random.default_rng(2).normal(0, 3, (37, K))
    first = est.predict(x)
    second = est.predict(x)
    p = planner()
    plan = p.plan(
        np.arange(3),
        x[:3].clip(0, 1),
        np.full(3, K),
        num_non_draft_tokens=3,
        num_sampling_requests=3,
    )
    depth = p.choose_draft_depth(
        np.arange(5), np.full(5, K), num_non_draft_tokens=5, num_sampling_requests=5
    )
    for result, dtype, shape in (
        (first, np.float32, (37, K)),
        (second, np.float32, (37, K)),
        (plan.admitted, np.int32, (3,)),
        (depth.depths, np.int32, (5,)),
    ):
        assert result.dtype == dtype and result.shape == shape
        assert result.flags.c_contiguous and result.flags.aligned and result.flags.writeable
        assert result.flags.owndata and result.base is None
    assert not np.shares_memory(first, second)
    keep = second.copy()
    first[:] = -1.0
    np.testing.assert_array_equal(est.predict(x), keep)
    np.testing.assert_array_equal(second, keep)
    empty = est.predict(np.zeros((0, K)))
    assert empty.shape == (0, K) and empty.dtype == np.float32
    tables = CostTables(np.linspace(0.5, 1.5, 4), 5 + 0.01 * np.arange(40)).with_draft_depth(
        "parallel", max_depth=K
    )
    none = choose_draft_depth(
        np.zeros((0, K)),
        np.zeros(0, np.int64),
        num_non_draft_tokens=0,
        num_sampling_requests=0,
        cost_tables=tables,
    )
    assert none.depths.shape == (0,) and none.depths.dtype == np.int32 and none.max_depth == 0


def test_a_refused_predict_returns_nothing_and_changes_nothing() -> None:
    """Bad features of every spelling: the same error naming ``features``; the estimator's bytes
    and its next prediction unchanged."""
    est = AcceptanceEstimator(K)
    before = est.to_bytes()
    good = np.random.default_rng(4).normal(0, 2, (5, K))
    want = est.predict(good)
    for bad in (
        np.ones((5, K + 1)),
        np.ones(K),
        np.ones((1, 5, K)),
        np.ones((5, K), complex),
        np.array([["a"] * K]),
        np.ones((5, K), np.int64),
        np.ones((5, K), bool),
    ):
        for spelled in (
            bad,
            np.asfortranarray(bad),
            bad.astype(bad.dtype.newbyteorder(">")) if bad.dtype.kind in "fci" else bad,
        ):
            with pytest.raises((ValueError, TypeError)) as error:
                est.predict(spelled)
            assert "features" in str(error.value), error.value
    assert est.to_bytes() == before
    np.testing.assert_array_equal(est.predict(good), want)


def test_int32_counts_read_once_under_a_racing_writer() -> None:
    """int32 arguments are widened straight from numpy's buffer (no copy first): a thread that
    rewrites the buffer during large calls can change what a call reads, never make a checked
    value pass unchecked: every call either plans with counts in 0..=K or refuses them."""
    rows = 4096
    tables = CostTables(np.linspace(0.5, 1.5, rows + 1), 5 + 0.001 * np.arange(rows * (K + 1) + 1))
    conf = np.random.default_rng(5).uniform(0, 1, (rows, K))
    counts = np.full(rows, K, dtype=np.int32)
    stop = threading.Event()

    def writer() -> None:
        flip = np.int32(K + 7)
        while not stop.is_set():
            counts[::97] = flip
            counts[::97] = K

    from av_core import plan_verification

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        outcomes = set()
        for _ in range(60):
            try:
                plan = plan_verification(
                    conf,
                    counts,
                    num_non_draft_tokens=rows,
                    num_sampling_requests=rows,
                    cost_tables=tables,
                )
            except ValueError as error:
                assert "scheduled_drafts" in str(error), error
                outcomes.add("refused")
                continue
            assert plan.admitted.min() >= 0 and plan.admitted.max() <= K
            assert plan.admitted.sum() == plan.budget
            outcomes.add("planned")
    finally:
        stop.set()
        thread.join()
    assert outcomes
