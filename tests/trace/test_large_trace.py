"""The large shipped trace (``av-core collect --engine llama.cpp``) is the collection
docs/collect.md describes: full verification in blocks of K drafts, labels that only a
real speculative-sampling run can give, over 20,000 of them, on prompts the other shipped
traces do not use, with the documented figures (computed with tests/support/reference.py,
not av_core's metrics)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import av_core
from av_core.tools.trace import LARGE_TRACE, SHIPPED_TRACES, load_shipped_trace

from reference import rank_auc

K = 4
MAX_NEW_TOKENS = 160
#: docs/collect.md, "The large trace": workload -> (prompts, rows, labeled, acceptance, AUC).
DOCUMENTED = {
    "humaneval": (128, 15783, 14934, 0.966, 0.948),
    "prose": (37, 7390, 5221, 0.776, 0.752),
    "all": (165, 23173, 20155, 0.917, 0.910),
}
DOCUMENTED_STEPS = 5823


def test_it_is_blocks_of_k_labeled_up_to_the_first_rejection() -> None:
    trace = load_shipped_trace(LARGE_TRACE)
    order = np.lexsort((trace.position, trace.step, trace.request_id))
    keys = np.stack([trace.request_id[order], trace.step[order]], axis=1)
    starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)])
    positions = trace.position[order]
    labels = np.where(trace.labeled, trace.label, -1)[order]
    short = 0
    for begin, end in zip(starts, np.r_[starts[1:], len(order)], strict=True):
        # K drafts a step (fewer only when the request needs fewer tokens), numbered from 0.
        assert 1 <= end - begin <= K
        short += end - begin < K
        assert (positions[begin:end] == np.arange(end - begin)).all()
        # Accepted drafts, then the first rejection, then nothing verified after it.
        block = labels[begin:end]
        first = int(np.argmax(block != 1)) if (block != 1).any() else len(block)
        assert (block[:first] == 1).all()
        if first < len(block):
            assert block[first] == 0
            assert (block[first + 1 :] == -1).all()
    # Short steps only end a request: at most one per prompt.
    assert short <= len(np.unique(trace.request_id))
    assert int(trace.labeled.sum()) >= 20_000
    assert np.isin(trace.label[trace.labeled], (0, 1)).all()
    assert trace.admitted.all()
    assert trace.temperature is not None and (trace.temperature == 1.0).all()
    # No request emits more than its new tokens plus one step's worth.
    for request in np.unique(trace.request_id):
        mine = trace.request_id == request
        steps = len(np.unique(trace.step[mine]))
        assert int((trace.label[mine & trace.labeled] == 1).sum()) + steps <= MAX_NEW_TOKENS + K


def test_its_prompts_are_not_the_other_traces_prompts() -> None:
    large = load_shipped_trace(LARGE_TRACE)
    assert large.prompt_id is not None
    mine = set(large.prompt_id.tolist())
    for name in SHIPPED_TRACES:
        if name != LARGE_TRACE:
            other = load_shipped_trace(name)
            assert other.prompt_id is not None
            assert mine.isdisjoint(other.prompt_id.tolist()), name


def test_it_has_the_documented_figures() -> None:
    trace = load_shipped_trace(LARGE_TRACE)
    labeled = trace.labeled
    for workload, documented in DOCUMENTED.items():
        mine = np.ones(len(trace), bool) if workload == "all" else trace.workload == workload
        lab = mine & labeled
        y = (trace.label[lab] == 1).astype(int)
        got = (
            len(np.unique(trace.request_id[mine])),
            int(mine.sum()),
            int(lab.sum()),
            round(float(y.mean()), 3),
            round(rank_auc(trace.logit_q_max[lab].astype(float), y), 3),
        )
        assert got == documented, workload
    steps = len({(r, s) for r, s in zip(trace.request_id, trace.step, strict=True)})
    assert steps == DOCUMENTED_STEPS


def test_the_shipped_data_stays_small() -> None:
    data = Path(av_core.__file__).parent / "data"
    assert sum(f.stat().st_size for f in data.iterdir()) <= 3_000_000
