"""A trace regrouped into drafting rounds (:class:`DraftRounds`: one row per request and step, K
columns), the layout the evaluation and the simulator replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from av_core._native import InvalidTypeError, InvalidValueError
from av_core.tools.trace import UNLABELED, DraftTrace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


#: The most ``rounds x K`` entries :meth:`DraftRounds.from_trace` lays out (2 GiB of int64).
MAX_ROUND_ENTRIES = 1 << 28


@dataclass(frozen=True)
class DraftRounds:
    """A trace regrouped into drafting rounds: one row per (request, step), K columns.

    Rounds are in decode order: the order in which each ``(request_id, step)`` first appears in
    the trace (the collector writes in decode order). ``num_accepted`` is the number of leading
    label-1 positions, i.e. the tokens accepted under the verification recorded in the trace
    (full verification for a collected trace). ``num_verified`` is ``num_accepted`` plus one when
    the round ends with a rejection: the admitted count that reproduces exactly the trace's labels.
    Padding (rounds with fewer than K positions) has feature 0, label -1 and row index -1.
    """

    request_id: IntArray
    step: IntArray
    workload: npt.NDArray[np.str_]
    prompt_id: npt.NDArray[np.str_]
    rows: IntArray
    num_drafted: IntArray
    labels: npt.NDArray[np.int8]
    num_accepted: IntArray
    num_verified: IntArray
    fully_verified: bool

    @property
    def num_rounds(self) -> int:
        return int(self.request_id.shape[0])

    @property
    def num_positions(self) -> int:
        return int(self.rows.shape[1])

    def column(self, values: FloatArray, fill: float = 0.0) -> FloatArray:
        """A per-row trace column laid out as [rounds, K] (``fill`` for padding and NaN)."""
        out = np.full(self.rows.shape, fill, dtype=np.float64)
        present = self.rows >= 0
        out[present] = values[self.rows[present]]
        out[~np.isfinite(out)] = fill
        return out

    @staticmethod
    def from_trace(trace: DraftTrace) -> DraftRounds:
        """Regroups ``trace``; the ``[rounds, K]`` layout is checked against
        :data:`MAX_ROUND_ENTRIES` before it is allocated (K is the deepest position + 1, so one
        stray position could otherwise ask for terabytes)."""
        if not isinstance(trace, DraftTrace):
            raise InvalidTypeError(f"trace must be a DraftTrace, got {type(trace).__name__}")
        if len(trace) == 0:
            raise InvalidValueError("trace must not be empty")
        num_positions = trace.num_positions
        keys = np.stack([trace.request_id, trace.step], axis=1)
        unique, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        if unique.shape[0] * num_positions > MAX_ROUND_ENTRIES:
            raise InvalidValueError(
                f"trace: {unique.shape[0]} rounds x {num_positions} positions (the deepest "
                f"position + 1) exceed MAX_ROUND_ENTRIES = {MAX_ROUND_ENTRIES}"
            )
        inverse = inverse.reshape(-1)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.shape[0])
        round_of_row = rank[inverse]
        rows = np.full((order.shape[0], num_positions), -1, dtype=np.int64)
        rows[round_of_row, trace.position] = np.arange(len(trace))
        labels = np.full(rows.shape, UNLABELED, dtype=np.int8)
        present = rows >= 0
        labels[present] = trace.label[rows[present]]
        num_accepted = np.cumprod(labels == 1, axis=1).sum(axis=1).astype(np.int64)
        ends_rejected = np.zeros(rows.shape[0], dtype=bool)
        inside = num_accepted < num_positions
        ends_rejected[inside] = labels[inside, num_accepted[inside]] == 0
        first_rows = first[order]
        drafted = present.sum(axis=1).astype(np.int64)
        admitted = np.zeros(rows.shape, dtype=bool)
        admitted[present] = trace.admitted[rows[present]]
        # Full verification: every drafted position up to the first rejection was admitted.
        fully = bool(np.all(admitted.sum(axis=1) >= np.minimum(num_accepted + 1, drafted)))
        prompt = trace.prompt_id if trace.prompt_id is not None else trace.workload
        return DraftRounds(
            request_id=unique[order, 0].astype(np.int64),
            step=unique[order, 1].astype(np.int64),
            workload=trace.workload[first_rows],
            prompt_id=prompt[first_rows],
            rows=rows,
            num_drafted=drafted,
            labels=labels,
            num_accepted=num_accepted,
            num_verified=num_accepted + ends_rejected.astype(np.int64),
            fully_verified=fully,
        )
