"""Python threads observing one map estimator at once, with refused steps among their calls:
the batches are large enough that each call releases the GIL, so the callers bin their steps
at the same time (one in the scratch the estimator keeps, the others in their own). The
refused calls name their culprit and leave nothing behind: the bytes equal those of a serial
run of the accepted steps alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from av_core import AcceptanceEstimator

K = 8
#: Rows of a batch: 65,536 features, the size from which a call releases the GIL.
ROWS = 8192
THREADS = 4

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]
#: One call: its arrays and the argument its error names (None: accepted).
Call = tuple[Arrays, str | None]


def step(rng: np.random.Generator, most: int, dtype: type) -> Arrays:
    """One step whose requests admit at most `most` drafts (0 and 1: few labeled, the sparse
    path; K: many)."""
    features: np.ndarray = rng.normal(0.5, 6.0, size=(ROWS, K)).astype(dtype)
    admitted = rng.integers(0, most + 1, size=ROWS)
    accepted = np.minimum(rng.integers(0, K + 1, size=ROWS), admitted)
    return features, admitted, accepted


def refused(good: Arrays, kind: int) -> Call:
    """A copy of `good` made bad on its last row (after every other row was binned), or in a
    slot no draft labels."""
    features, admitted, accepted = (a.copy() for a in good)
    if kind == 0:
        features[-1, -1] = np.nan
        return (features, admitted, accepted), "features"
    if kind == 1:
        # The last request labels nothing: its features are read, not binned.
        admitted[-1] = accepted[-1] = 0
        features[-1, 0] = np.inf
        return (features, admitted, accepted), "features"
    if kind == 2:
        accepted[-1] = admitted[-1] + 1
        return (features, admitted, accepted), "num_accepted"
    admitted[-1] = K + 1
    return (features, admitted, accepted), "num_admitted"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_threads_with_refused_steps_give_the_serial_bytes_of_the_accepted_ones(
    dtype: type,
) -> None:
    rng = np.random.default_rng(17)
    plans: list[list[Call]] = []
    for t in range(THREADS):
        calls: list[Call] = []
        for i in range(4):
            good = step(rng, (0, 1, K, 2)[(t + i) % 4], dtype)
            calls.append((good, None))
            calls.append(refused(good, (t + i) % 4))
        plans.append(calls)
    shared = AcceptanceEstimator(K, refit_interval=None)
    errors: list[str] = []
    failures: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def run(calls: list[Call]) -> None:
        try:
            start.wait()
            for arrays, culprit in calls:
                if culprit is None:
                    shared.observe(*arrays)
                    continue
                with pytest.raises(ValueError, match=culprit) as error:
                    shared.observe(*arrays)
                errors.append(str(error.value))
        except BaseException as failure:  # reported below, from the main thread
            failures.append(failure)

    threads = [threading.Thread(target=run, args=(calls,)) for calls in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert len(errors) == THREADS * 4
    serial = AcceptanceEstimator(K, refit_interval=None)
    for calls in plans:
        for arrays, culprit in calls:
            if culprit is None:
                serial.observe(*arrays)
    assert shared.to_bytes() == serial.to_bytes()
    labeled = sum(
        int(np.where(ac < ad, ac + 1, ac).sum())
        for calls in plans
        for (_, ad, ac), culprit in calls
        if culprit is None
    )
    assert sum(shared.round_counts()) == labeled
