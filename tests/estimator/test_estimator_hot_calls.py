"""The estimator's hot calls through the bindings: `predict` and `observe` release the GIL for
large batches (small ones keep it, as the planner's calls do), and `predict` returns a fresh
array every call."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
from child_env import child_env

from av_core import AcceptanceEstimator

K = 8


@pytest.mark.parametrize("method", ["predict", "observe"])
def test_large_batches_release_the_gil(
    method: str, gil_ticks: Callable[[Callable[[], object], int, bool], int]
) -> None:
    """A batch past the threshold (16,384 × 8 features) lets another thread run. (That small
    batches keep the GIL is not observable this way: a release of a few microseconds ends
    before a waiting thread is scheduled.)"""
    rows = 16384
    rng = np.random.default_rng(0)
    features = rng.normal(1.0, 2.0, size=(rows, K)).astype(np.float32)
    admitted = rng.integers(0, K + 1, size=rows)
    accepted = np.minimum(rng.integers(0, K + 1, size=rows), admitted)
    est = AcceptanceEstimator(K, refit_interval=None)
    if method == "predict":
        during = gil_ticks(lambda: est.predict(features), 200, True)
    else:
        during = gil_ticks(lambda: est.observe(features, admitted, accepted), 200, True)
    assert during > 0


def test_predict_returns_a_fresh_array_of_its_own() -> None:
    """Each call's probabilities are a new C-contiguous, writeable float32 array sharing no
    memory with another result, equal to the logistic of the published coefficients computed
    here."""
    rng = np.random.default_rng(3)
    est = AcceptanceEstimator(K)
    features = rng.normal(0.5, 3.0, size=(37, K))
    first = est.predict(features)
    second = est.predict(features)
    for p in (first, second):
        assert p.dtype == np.float32 and p.shape == (37, K)
        assert p.flags.c_contiguous and p.flags.writeable
    assert first is not second and not np.shares_memory(first, second)
    first[:] = -1.0  # the caller's to write: the next result does not see it
    third = est.predict(features)
    np.testing.assert_array_equal(third, second)
    logits = est.slope * features + est.intercepts[None, :]
    expected = (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    np.testing.assert_allclose(third, expected, rtol=1e-6, atol=1e-7)
    empty = est.predict(np.zeros((0, K), np.float32))
    assert empty.shape == (0, K) and empty.dtype == np.float32


@pytest.mark.parametrize("culprit", ["features", "num_accepted", "num_admitted"])
def test_a_refused_observe_leaves_no_trace_in_the_next(culprit: str) -> None:
    """A step refused on its last row (every earlier row already binned) changes nothing, and
    the steps after it give the bytes of an estimator that never saw it: whatever the refused
    step left behind is not added to a later one. Counts as int32 and int64 alike."""
    rng = np.random.default_rng(7)
    rows = 64
    steps = []
    for _ in range(3):
        features = rng.normal(1.5, 2.0, size=(rows, K)).astype(np.float32)
        admitted = rng.integers(0, K + 1, size=rows).astype(np.int32)
        accepted = np.minimum(rng.integers(0, K + 1, size=rows), admitted)
        steps.append((features, admitted, accepted))
    bad_features, bad_admitted, bad_accepted = (a.copy() for a in steps[0])
    if culprit == "features":
        bad_features[-1, -1] = np.nan
    elif culprit == "num_accepted":
        bad_accepted[-1] = bad_admitted[-1] + 1
    else:
        bad_admitted[-1] = -1
    refused = AcceptanceEstimator(K, refit_interval=None)
    reference = AcceptanceEstimator(K, refit_interval=None)
    before = refused.to_bytes()
    with pytest.raises(ValueError, match=culprit):
        refused.observe(bad_features, bad_admitted, bad_accepted)
    assert refused.to_bytes() == before
    for est in (refused, reference):
        for features, admitted, accepted in steps:
            est.observe(features, admitted, accepted)
    assert refused.to_bytes() == reference.to_bytes()
    wide = AcceptanceEstimator(K, refit_interval=None)
    for features, admitted, accepted in steps:
        wide.observe(features, admitted.astype(np.int64), accepted.astype(np.int64))
    assert wide.to_bytes() == reference.to_bytes()
    assert sum(reference.round_counts()) == sum(
        int(np.where(ac < ad, ac + 1, ac).sum()) for _, ad, ac in steps
    )


#: A child's workload: steps of the map estimator, sparse and dense (few and many labeled
#: drafts), f32 and f64 features, refused steps among them; prints a digest of every output.
_LEVEL_WORKLOAD = """
import hashlib, numpy as np
from av_core import AcceptanceEstimator
rng = np.random.default_rng(5)
digest = hashlib.sha256()
for update in ("map", "vllm"):
    est = AcceptanceEstimator(8, update=update, refit_interval=4)
    for step in range(24):
        rows = (1, 7, 64, 300)[step % 4]
        most = (0, 1, 8)[step % 3]
        x = rng.normal(1.0, 8.0, size=(rows, 8))
        x = x.astype(np.float32) if step % 2 else x
        admitted = rng.integers(0, most + 1, size=rows)
        accepted = np.minimum(rng.integers(0, 9, size=rows), admitted)
        p = est.predict(x)
        digest.update(p.tobytes())
        if step % 5 == 4:
            x[-1, -1] = np.inf
        try:
            digest.update(bytes([est.observe(x, admitted, accepted, p)]))
        except ValueError as error:
            digest.update(str(error).encode())
    digest.update(est.to_bytes())
print(digest.hexdigest())
"""


def test_every_simd_level_gives_the_same_bits() -> None:
    """Predictions, observe's outcomes and errors and the estimator's bytes are the same
    whichever vector unit runs them (``AV_CORE_SIMD`` caps it; a level this CPU lacks runs the
    widest it has), and the same as this process's (no cap)."""
    digests = {}
    for level in ("baseline", "avx2", "avx512", ""):
        env = child_env(drop=("AV_CORE_SIMD",), AV_CORE_SIMD=level)
        run = subprocess.run(
            [sys.executable, "-c", _LEVEL_WORKLOAD],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        digests[level] = run.stdout.strip()
    assert len(set(digests.values())) == 1, digests
    assert len(digests["baseline"]) == len(hashlib.sha256().hexdigest())
