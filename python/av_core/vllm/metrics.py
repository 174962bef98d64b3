"""Prometheus metrics of av_core inside a serving engine (``pip install "av_core[metrics]"``).

On when ``AV_CORE_METRICS_PORT`` or ``PROMETHEUS_MULTIPROC_DIR`` is set (``AV_CORE_METRICS=0``
turns both off); then the first :class:`av_core.vllm.OnlineAcceptanceEstimator` a process
constructs starts them, so they work with or without the vLLM plugin:

- ``AV_CORE_METRICS_PORT=P``: an HTTP server on ``AV_CORE_METRICS_HOST`` (default ``127.0.0.1``)
  port ``P + offset`` serves ``/metrics`` (``offset``: the estimator's CUDA device index, else
  ``LOCAL_RANK``, else the rank; one port per worker process on a node).
- ``PROMETHEUS_MULTIPROC_DIR``: the values go to prometheus_client's multiprocess files there,
  so vLLM's own ``/metrics`` (which collects that directory in multiprocess mode) shows them.

Every metric is named ``av_core_*`` and labeled ``rank`` (the ``torch.distributed`` rank, else
``RANK``, else 0), and ``position`` (the draft position) where it applies; the list and what to
do when one goes bad are in ``docs/operations.md``.

**Cost.** Nothing when off: the drop-ins hold ``None`` and test it. When on, the serving thread
only appends references to host arrays it already has (the verdicts it folds into the
estimator anyway), the budget, the depth and a few ``perf_counter`` readings to a queue, with no
lock; a daemon thread drains the queue into the Prometheus values every
``AV_CORE_METRICS_INTERVAL`` seconds (default 1). Nothing reads the device.
``benches/bench_vllm_metrics.py`` measures the cost per step.
"""

from __future__ import annotations

import atexit
import bisect
import functools
import logging
import math
import os
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from av_core import _settings as settings

from .metrics_env import (
    _ECE_BINS,
    BUDGET_BUCKETS,
    COST_BUCKETS_MS,
    DEFAULT_INTERVAL_S,
    DEFAULT_WINDOW,
    ENV_ENABLE,
    ENV_HOST,
    ENV_INTERVAL,
    ENV_MULTIPROC,
    ENV_PORT,
    ENV_WINDOW,
    HOST_BUCKETS_S,
    MAX_INTERVAL_S,
    MAX_WINDOW,
    METRIC_NAMES,
    MIN_INTERVAL_S,
    _port,
    _rank,
    enabled,
)

__all__ = [
    "BUDGET",
    "BUDGET_BUCKETS",
    "CALLS",
    "COST_BUCKETS_MS",
    "DEFAULT_INTERVAL_S",
    "DEPTH",
    "DEFAULT_WINDOW",
    "ENV_ENABLE",
    "ENV_HOST",
    "ENV_INTERVAL",
    "ENV_MULTIPROC",
    "ENV_PORT",
    "ENV_WINDOW",
    "HOST_BUCKETS_S",
    "MAX_INTERVAL_S",
    "MAX_WINDOW",
    "METRIC_NAMES",
    "MIN_INTERVAL_S",
    "PREDICT",
    "STEP",
    "EstimatorRecorder",
    "ProcessMetrics",
    "current",
    "enabled",
    "process_metrics",
    "recorder_for",
    "reset",
]

logger = logging.getLogger("vllm.av_core")


class _LocalHistogram:
    """Bucket counts kept in Python lists between folds (``le`` semantics, +Inf last)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = [float(b) for b in bounds]
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def drain_into(self, child: Any) -> None:
        """Adds the counts to a prometheus_client histogram child and clears them."""
        if not any(self.counts):
            return
        buckets, total = getattr(child, "_buckets", None), getattr(child, "_sum", None)
        if buckets is not None and total is not None and len(buckets) == len(self.counts):
            for value, count in zip(buckets, self.counts, strict=True):
                if count:
                    value.inc(count)
            total.inc(self.total)
        else:  # pragma: no cover - a prometheus_client without the bucket values
            edges = [*self.bounds, math.inf]
            for bound, count in zip(edges, self.counts, strict=True):
                for _ in range(count):
                    child.observe(bound if math.isfinite(bound) else self.bounds[-1] * 2)
        self.counts = [0] * len(self.counts)
        self.total = 0.0


def _columns(round_stats: dict[str, Any]) -> tuple[npt.NDArray[np.int64], list[int]]:
    """Labeled drafts and the residual sums ``g1`` per position of a round. The map update's
    round (histograms) holds no residuals: zeros, and the predicted sums come from the queued
    verdicts instead (``EstimatorRecorder.event_predicted``)."""
    if "count" in round_stats:
        counts = np.asarray(round_stats["count"], dtype=np.int64)
        n = counts.reshape(-1, int(round_stats["bins"])).sum(axis=1)
        return n, [0] * n.shape[0]
    return np.asarray(round_stats["n"], dtype=np.int64), [int(v) for v in round_stats["g1"]]


@dataclass
class EstimatorRecorder:
    """What the fold keeps for one estimator.

    Labeled drafts and the sum of their predictions come from the estimator's own exact round
    statistics: ``n_k`` counts the labeled drafts and ``g1_k = sum(y - p)``, so ``sum(p) =
    accepted_k - g1_k``. The serving thread therefore only queues references to the host arrays
    it folded anyway (made fresh each step); the fold thread takes every step's accepted counts
    (for ``accepted_k``) and the last ``window`` labeled drafts' predictions (rolling log-loss and
    ECE) from them.
    """

    owner: ProcessMetrics
    num_positions: int
    source: Any  # weakref to the estimator
    drift_statistic: float = math.nan
    # Rounds this estimator closed (its own share, before any pooling), and what the open round
    # held when this record started (a restored state's round is not ours to count).
    closed_n: npt.NDArray[np.int64] = field(init=False)
    closed_g1: list[int] = field(init=False)
    baseline_n: npt.NDArray[np.int64] = field(init=False)
    baseline_g1: list[int] = field(init=False)
    hits: npt.NDArray[np.int64] = field(init=False)
    pushed_labeled: npt.NDArray[np.int64] = field(init=False)
    pushed_hits: npt.NDArray[np.int64] = field(init=False)
    pushed_predicted: npt.NDArray[np.float64] = field(init=False)
    pushed_refits: int = 0
    pushed_dropped: int = 0
    #: Σ p of the labeled drafts this record was handed, per position, summed on the fold thread:
    #: the expected accepted drafts under the map update, whose round keeps no residuals.
    event_predicted: npt.NDArray[np.float64] = field(init=False)

    def __post_init__(self) -> None:
        k = self.num_positions
        for name in ("closed_n", "baseline_n", "hits", "pushed_labeled", "pushed_hits"):
            setattr(self, name, np.zeros(k, np.int64))
        self.pushed_predicted = np.zeros(k, np.float64)
        self.event_predicted = np.zeros(k, np.float64)
        self.closed_g1, self.baseline_g1 = [0] * k, [0] * k

    # -- the serving thread: queue and return --------------------------------------------------

    def verdicts(
        self,
        predictions: npt.NDArray[Any],
        num_accepted: npt.NDArray[Any],
        num_admitted: npt.NDArray[Any],
    ) -> None:
        """One step's rows as the estimator observed them: draft-time predictions ``[R, K]``
        and the counts the labels come from (``k < accepted``: 1; ``k == accepted < admitted``:
        0; else unlabeled). The arrays must not be changed afterwards."""
        self.owner.events.append((_VERDICTS, self, predictions, num_accepted, num_admitted))

    def state_lock(self) -> threading.Lock:
        """Held by the estimator while its round changes hands (pooling, refit, restore), so
        that the fold never reads a round half-closed or holding other ranks' share."""
        return self.owner.state_lock

    def round_closed(self, round_stats: dict[str, Any], report: dict[str, Any] | None) -> None:
        """The estimator refitted on this round (``round_stats``: its own share, read before
        any pooling; ``report``: the native ``refit(report=True)``). Call under
        :meth:`state_lock`, after the refit."""
        n, g1 = _columns(round_stats)
        self.closed_n += n - self.baseline_n
        rows = zip(self.closed_g1, g1, self.baseline_g1, strict=True)
        self.closed_g1 = [c + v - b for c, v, b in rows]
        self.baseline_n = np.zeros(self.num_positions, np.int64)
        self.baseline_g1 = [0] * self.num_positions
        if report is not None:
            self.drift_statistic = float(report.get("drift_statistic", math.nan))

    def restored(self, round_stats: dict[str, Any]) -> None:
        """The estimator's state was replaced: its open round is not this record's (call under
        :meth:`state_lock`)."""
        self.baseline_n, self.baseline_g1 = _columns(round_stats)

    def host_time(self, call: int, seconds: float) -> None:
        """``call``: one of :data:`CALLS`' indices (``STEP``, ``PREDICT``, ...)."""
        self.owner.step_seconds[call] += seconds


# Kinds of queued events (the first entry of each tuple).
_VERDICTS, _END_STEP, _BUDGET, _DEPTH = range(4)
#: The calls host time is kept for, in the order of ``ProcessMetrics.step_seconds``.
CALLS = ("step", "predict", "budget", "depth")
STEP, PREDICT, BUDGET, DEPTH = range(len(CALLS))


class _Exporter:
    """The prometheus_client objects (one set per process) and the HTTP server."""

    def __init__(self) -> None:
        try:
            import prometheus_client as prom
        except ImportError as error:
            raise ImportError(
                "av_core metrics need prometheus_client, an optional dependency: "
                'pip install "av_core[metrics]"'
            ) from error
        self.registry = prom.CollectorRegistry(auto_describe=True)
        counter = functools.partial(prom.Counter, registry=self.registry)
        gauge = functools.partial(
            prom.Gauge, registry=self.registry, multiprocess_mode="mostrecent"
        )
        histogram = functools.partial(prom.Histogram, registry=self.registry)
        rank, pos = ["rank"], ["rank", "position"]
        self.labeled = counter(
            "av_core_labeled_drafts", "Drafts the target gave a verdict on.", pos
        )
        self.accepted = counter("av_core_accepted_drafts", "Drafts the target accepted.", pos)
        self.predicted = counter(
            "av_core_predicted_accepted_drafts",
            "Sum of the draft-time acceptance predictions of the labeled drafts (expected "
            "accepted drafts).",
            pos,
        )
        self.log_loss = gauge(
            "av_core_log_loss",
            "Prequential log-loss (nats) of the draft-time predictions over the window.",
            rank,
        )
        self.ece = gauge(
            "av_core_expected_calibration_error",
            f"Expected calibration error ({_ECE_BINS} equal bins) over the window.",
            rank,
        )
        self.window = gauge(
            "av_core_window_drafts",
            "Labeled drafts in the log-loss/ECE window.",
            rank,
        )
        self.slope = gauge("av_core_slope", "The estimator's slope.", rank)
        self.intercept = gauge("av_core_intercept", "The estimator's intercepts.", pos)
        self.refits = counter("av_core_refits", "Refits run.", rank)
        self.drift = gauge(
            "av_core_drift_statistic",
            "Drift statistic of the last refit's round: about chi-square with K + 1 degrees "
            "of freedom while the coefficients fit.",
            rank,
        )
        self.dropped = counter(
            "av_core_dropped_rows",
            "Verdict rows dropped for a non-finite feature or prediction.",
            rank,
        )
        self.budget = histogram(
            "av_core_draft_budget",
            "Draft tokens admitted for verification per step.",
            rank,
            buckets=BUDGET_BUCKETS,
        )
        self.depth = histogram(
            "av_core_drafting_depth",
            "Drafting depth (num_speculative_tokens) chosen per step.",
            rank,
            buckets=tuple(range(17)),
        )
        self.cost = histogram(
            "av_core_predicted_step_cost_ms",
            "The planner's predicted cost of the step it chose, milliseconds, by decision "
            "(budget: the verification budget; depth: the drafting depth).",
            ["rank", "decision"],
            buckets=COST_BUCKETS_MS,
        )
        self.step_host = histogram(
            "av_core_step_host_seconds",
            "Host time av_core spent per decode step (estimator, budget, depth).",
            rank,
            buckets=HOST_BUCKETS_S,
        )
        self.host = counter(
            "av_core_host_seconds",
            "Host time av_core spent, by call.",
            ["rank", "call"],
        )
        self.server: Any = None
        self.port: int | None = None

    def serve(self, port: int, host: str) -> None:
        import prometheus_client as prom

        try:
            started = prom.start_http_server(port, addr=host, registry=self.registry)
        # OSError: a taken port or an unknown host; UnicodeError (a ValueError): a host name
        # that cannot be encoded; OverflowError: a port the socket refuses.
        except (OSError, ValueError, OverflowError) as error:
            logger.warning(
                "av_core: metrics server not started on %s:%d (%s); metrics still go to %s "
                "if it is set",
                host,
                port,
                error,
                ENV_MULTIPROC,
            )
            return
        self.server = started[0] if isinstance(started, tuple) else None
        self.port = port
        logger.info("av_core: metrics on http://%s:%d/metrics", host, port)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class ProcessMetrics:
    """This process's metrics: a queue the serving thread appends to (``deque.append`` is
    atomic, so no lock on that path), and a daemon thread that every ``interval`` seconds drains
    it into the Prometheus values (:meth:`fold`; also at exit, and callable directly)."""

    def __init__(self, rank: int, port_offset: int) -> None:
        self.rank = rank
        self.label = str(rank)
        self.window = int(settings.METRICS_WINDOW.get())
        self.interval = settings.METRICS_INTERVAL.get()
        self.exporter = _Exporter()
        self.events: deque[tuple[Any, ...]] = deque()
        self.state_lock = threading.Lock()
        self.recorders: list[EstimatorRecorder] = []
        self.budget = _LocalHistogram(BUDGET_BUCKETS)
        self.depth = _LocalHistogram(range(17))
        self.cost = {name: _LocalHistogram(COST_BUCKETS_MS) for name in ("budget", "depth")}
        self.step_host = _LocalHistogram(HOST_BUCKETS_S)
        self.host_by_call = dict.fromkeys(CALLS, 0.0)
        # The current step's host time by call: written by the serving thread only, handed to
        # the queue whole at the start of the next step.
        self.step_seconds = [0.0] * len(CALLS)
        self._accepted: dict[int, list[npt.NDArray[Any]]] = {}
        self._recent: dict[int, deque[tuple[npt.NDArray[Any], ...]]] = {}
        self._recent_rows: dict[int, int] = {}
        self._ring_p = np.zeros(self.window, dtype=np.float64)
        self._ring_y = np.zeros(self.window, dtype=np.bool_)
        self._ring_next = 0
        self._ring_fill = 0
        self._fold_lock = threading.Lock()
        self._stop = threading.Event()
        port = _port(port_offset)
        if port is not None:
            self.exporter.serve(port, settings.METRICS_HOST.get() or "127.0.0.1")
        self._thread = threading.Thread(target=self._run, name="av_core-metrics", daemon=True)
        self._thread.start()

    # -- the serving thread ------------------------------------------------------------------

    def recorder(self, estimator: Any, num_positions: int) -> EstimatorRecorder:
        recorder = EstimatorRecorder(self, num_positions, weakref.ref(estimator))
        with self._fold_lock:
            self.recorders.append(recorder)
        return recorder

    def host_time(self, call: int, seconds: float) -> None:
        """Adds host time to the current step (``call``: an index of :data:`CALLS`). On the
        serving thread, the one that steps the estimator."""
        self.step_seconds[call] += seconds

    def end_step(self) -> None:
        """At the start of each estimator step: the time recorded since the last one was one
        step's."""
        seconds = self.step_seconds
        if any(seconds):
            self.events.append((_END_STEP, tuple(seconds)))
            self.step_seconds = [0.0] * len(CALLS)

    def budget_chosen(self, budget: int, predicted_cost_ms: float | None) -> None:
        self.events.append((_BUDGET, budget, predicted_cost_ms))

    def depth_chosen(self, depth: int, predicted_cost_ms: float | None = None) -> None:
        self.events.append((_DEPTH, depth, predicted_cost_ms))

    # -- the fold ----------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stop.wait(self.interval):
            try:
                self.fold()
            except Exception:  # noqa: BLE001 - metrics must never take the server down
                # Once with the traceback; a fold that keeps failing must not flood the log.
                failures += 1
                if failures == 1:
                    logger.warning("av_core: metrics fold failed", exc_info=True)
                else:
                    logger.debug("av_core: metrics fold failed again", exc_info=True)

    def fold(self) -> None:
        """Drains the queue into the Prometheus values."""
        with self._fold_lock:
            self._drain()
            e, label = self.exporter, self.label
            for recorder in list(self.recorders):
                self._fold_recorder(recorder)
            self.budget.drain_into(e.budget.labels(label))
            self.depth.drain_into(e.depth.labels(label))
            for decision, histogram in self.cost.items():
                histogram.drain_into(e.cost.labels(label, decision))
            self.step_host.drain_into(e.step_host.labels(label))
            for call, seconds in self.host_by_call.items():
                if seconds:
                    e.host.labels(label, call).inc(seconds)
            self.host_by_call = dict.fromkeys(self.host_by_call, 0.0)
            if self._ring_fill:
                # The scores are the offline tools' (one owner, pure numpy), imported on the
                # fold's thread the first time there is a window to score, so that importing
                # av_core.vllm imports no tool.
                from av_core.tools.metrics import expected_calibration_error, log_loss

                p, y = self._window()
                e.log_loss.labels(label).set(log_loss(y, p))
                e.ece.labels(label).set(expected_calibration_error(y, p, _ECE_BINS))
            e.window.labels(label).set(self._ring_fill)

    def _drain(self) -> None:
        events, window = self.events, self.window
        while events:
            event = events.popleft()
            kind = event[0]
            if kind == _VERDICTS:
                key = id(event[1])
                self._accepted.setdefault(key, []).append(event[3])
                p = np.asarray(event[2], dtype=np.float64)
                accepted, admitted = event[3], event[4]
                k = event[1].num_positions
                length = np.minimum(accepted.astype(np.int64) + 1, admitted.astype(np.int64))
                labeled = np.arange(k)[None, :] < length[:, None]
                event[1].event_predicted += np.where(labeled, p, 0.0).sum(axis=0)
                recent = self._recent.setdefault(key, deque())
                recent.append(event[2:])
                # Every row observed has a label: the last `window` rows hold the window.
                rows = self._recent_rows.get(key, 0) + event[3].shape[0]
                while rows - recent[0][1].shape[0] >= window:
                    rows -= recent.popleft()[1].shape[0]
                self._recent_rows[key] = rows
            elif kind == _END_STEP:
                for call, seconds in zip(CALLS, event[1], strict=True):
                    self.host_by_call[call] += seconds
                self.step_host.observe(sum(event[1]))
            elif kind == _BUDGET or kind == _DEPTH:
                (self.budget if kind == _BUDGET else self.depth).observe(event[1])
                if event[2] is not None:
                    self.cost["budget" if kind == _BUDGET else "depth"].observe(event[2])

    def _fold_recorder(self, recorder: EstimatorRecorder) -> None:
        e, label, k, key = self.exporter, self.label, recorder.num_positions, id(recorder)
        estimator = recorder.source()
        if estimator is None:
            self.recorders.remove(recorder)
            for table in (self._accepted, self._recent, self._recent_rows):
                table.pop(key, None)
            return
        log = self._accepted.pop(key, [])
        if log:
            accepted = np.minimum(np.concatenate(log).astype(np.int64), k)
            # Rows accepting position k: accepted_r > k.
            recorder.hits += np.cumsum(np.bincount(accepted, minlength=k + 1)[::-1])[::-1][1:]
        # After the drain: a refit queued later has not moved its round into closed_* yet, so
        # the counts can only lag (and catch up at the next fold), never double count.
        with self.state_lock:
            stats = estimator.round_stats()
            n, g1 = _columns(stats)
            labeled = recorder.closed_n + n - recorder.baseline_n
            rows = zip(recorder.closed_g1, g1, recorder.baseline_g1, strict=True)
            residual = [c + v - b for c, v, b in rows]
        if "g1" in stats:
            scale = float(2 ** int(stats["fraction_bits"]))
            predicted = recorder.hits - np.asarray(residual, dtype=np.float64) / scale
        else:  # the map update: Σ p from the verdicts themselves
            predicted = recorder.event_predicted.copy()
        labeled = np.maximum(labeled, recorder.pushed_labeled)
        predicted = np.maximum(predicted, recorder.pushed_predicted)
        for index in range(k):
            where = str(index)
            e.labeled.labels(label, where).inc(int(labeled[index] - recorder.pushed_labeled[index]))
            new_hits = int(recorder.hits[index] - recorder.pushed_hits[index])
            e.accepted.labels(label, where).inc(new_hits)
            grown = float(predicted[index] - recorder.pushed_predicted[index])
            e.predicted.labels(label, where).inc(grown)
        recorder.pushed_labeled, recorder.pushed_predicted = labeled, predicted
        recorder.pushed_hits = recorder.hits.copy()
        recent = self._recent.pop(key, None)
        self._recent_rows.pop(key, None)
        if recent:
            self._remember_recent(list(recent), k)
        slope, intercepts = estimator.host_coefficients  # host values: no device read
        e.slope.labels(label).set(float(slope))
        for index, value in enumerate(intercepts.tolist()):
            e.intercept.labels(label, str(index)).set(value)
        refits, dropped = int(estimator.num_refits), int(estimator.num_dropped_rows)
        # inc(0) makes the series exist (at 0) from the first fold on.
        e.refits.labels(label).inc(max(0, refits - recorder.pushed_refits))
        e.dropped.labels(label).inc(max(0, dropped - recorder.pushed_dropped))
        recorder.pushed_refits = max(refits, recorder.pushed_refits)
        recorder.pushed_dropped = max(dropped, recorder.pushed_dropped)
        if not math.isnan(recorder.drift_statistic):
            e.drift.labels(label).set(recorder.drift_statistic)

    def _remember_recent(self, recent: list[tuple[npt.NDArray[Any], ...]], k: int) -> None:
        """Moves the recent steps' labeled drafts into the window (step, row, position order)."""
        p = np.concatenate([entry[0] for entry in recent])
        accepted = np.concatenate([entry[1] for entry in recent]).astype(np.int64)
        admitted = np.concatenate([entry[2] for entry in recent]).astype(np.int64)
        # Row r labels its first L_r positions: the accepted ones and the first rejection.
        length = np.minimum(accepted + 1, admitted)
        # Only the last `window` labeled drafts can stay in the window.
        from_end = np.cumsum(length[::-1])
        start = max(length.shape[0] - int(np.searchsorted(from_end, self.window)) - 1, 0)
        position = np.arange(k)
        mask = position < length[start:, None]
        ones = position < accepted[start:, None]
        self._remember(p[start:][mask].astype(np.float64), ones[mask])

    def _remember(self, p: npt.NDArray[np.float64], y: npt.NDArray[np.bool_]) -> None:
        """Appends labeled drafts to the ring of the last ``window``."""
        n, size = p.shape[0], self.window
        if n >= size:
            self._ring_p[:], self._ring_y[:] = p[-size:], y[-size:]
            self._ring_next, self._ring_fill = 0, size
            return
        start = self._ring_next
        first = min(n, size - start)
        self._ring_p[start : start + first] = p[:first]
        self._ring_y[start : start + first] = y[:first]
        self._ring_p[: n - first] = p[first:]
        self._ring_y[: n - first] = y[first:]
        self._ring_next = (start + n) % size
        self._ring_fill = min(size, self._ring_fill + n)

    def _window(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        if self._ring_fill < self.window:
            return self._ring_p[: self._ring_fill], self._ring_y[: self._ring_fill]
        order = np.roll(np.arange(self.window), -self._ring_next)
        return self._ring_p[order], self._ring_y[order]

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.exporter.close()


_process: ProcessMetrics | None = None
_process_lock = threading.Lock()


def current() -> ProcessMetrics | None:
    """This process's metrics if an estimator has started them, else ``None`` (one global read:
    what the budget and depth helpers test on every call)."""
    return _process


def process_metrics(device_index: int | None = None) -> ProcessMetrics | None:
    """This process's metrics, started on first use when :func:`enabled`; ``None`` when off.
    ``device_index`` (the caller's CUDA device) chooses the server's port offset."""
    global _process
    if _process is not None:
        return _process
    if not enabled():
        return None
    with _process_lock:
        if _process is None:
            directory = settings.PROMETHEUS_MULTIPROC_DIR.get()
            if directory is not None and not os.path.isdir(directory):
                # prometheus_client would fail on every value written (its files go there).
                logger.warning(
                    "av_core: %s=%r is not a directory; av_core metrics are off",
                    ENV_MULTIPROC,
                    directory,
                )
                return None
            rank = _rank()
            offset = device_index
            if offset is None:
                local: int | None = settings.LOCAL_RANK.get()
                offset = rank if local is None else local
            _process = ProcessMetrics(rank, offset)
            atexit.register(_fold_at_exit)
    return _process


def _fold_at_exit() -> None:
    if _process is not None:
        try:
            _process.fold()
        except Exception:  # noqa: BLE001 - exiting: a failed last fold must not raise
            logger.debug("av_core: final metrics fold failed", exc_info=True)


def reset() -> None:
    """Stops the server and forgets this process's metrics (the next use starts afresh, with
    the environment as it is then). For tests and for engines that restart in-process."""
    global _process
    with _process_lock:
        if _process is not None:
            _process.close()
        _process = None


def recorder_for(estimator: Any) -> EstimatorRecorder | None:
    """The recorder of a drop-in estimator (``device``, ``num_speculative_steps``), or None when
    metrics are off (or cannot start: the reason is logged)."""
    if not enabled():
        return None
    device = estimator.device
    try:
        metrics = process_metrics(device.index if device.type == "cuda" else None)
    except ImportError as error:
        logger.warning("av_core: metrics are off: %s", error)
        return None
    if metrics is None:
        return None
    return metrics.recorder(estimator, estimator.num_speculative_steps)
