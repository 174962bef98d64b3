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

**Cost.** Nothing when off: the drop-ins hold ``None`` and test it. When on, the serving loop
only appends the host arrays it already has (the verdicts folded into the estimator, the
budget, the depth, a few ``perf_counter`` readings) to a list; every ``AV_CORE_METRICS_INTERVAL``
seconds (default 1) the step that notices folds the list into the Prometheus values in one
vectorised pass. Nothing reads the device: the verdicts are the host copies the estimator
folds anyway. ``benches/bench_vllm_metrics.py`` measures the cost per step.
"""

from __future__ import annotations

import atexit
import bisect
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from av_core.metrics import expected_calibration_error, log_loss

__all__ = [
    "BUDGET_BUCKETS",
    "COST_BUCKETS_MS",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_WINDOW",
    "ENV_ENABLE",
    "ENV_HOST",
    "ENV_INTERVAL",
    "ENV_MULTIPROC",
    "ENV_PORT",
    "ENV_WINDOW",
    "HOST_BUCKETS_S",
    "METRIC_NAMES",
    "EstimatorRecorder",
    "ProcessMetrics",
    "enabled",
    "process_metrics",
    "reset",
]

logger = logging.getLogger("vllm.av_core")

ENV_ENABLE = "AV_CORE_METRICS"
ENV_PORT = "AV_CORE_METRICS_PORT"
ENV_HOST = "AV_CORE_METRICS_HOST"
ENV_WINDOW = "AV_CORE_METRICS_WINDOW"
ENV_INTERVAL = "AV_CORE_METRICS_INTERVAL"
ENV_MULTIPROC = "PROMETHEUS_MULTIPROC_DIR"

#: Labeled drafts the rolling log-loss and ECE are computed over.
DEFAULT_WINDOW = 10_000
#: Seconds between folds of the recorded values into the Prometheus values.
DEFAULT_INTERVAL_S = 1.0
#: Upper bounds of the draft-budget histogram (drafts admitted per step).
BUDGET_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: Upper bounds of the predicted-step-cost histogram, milliseconds.
COST_BUCKETS_MS = (1, 2, 5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500, 1000)
#: Upper bounds of the host-time-per-step histogram, seconds.
HOST_BUCKETS_S = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2)
#: Equal-width bins of the rolling ECE (av_core.metrics' default).
_ECE_BINS = 15

#: Every metric this module exports (as the exposition names them, counters with ``_total``).
METRIC_NAMES = (
    "av_core_labeled_drafts_total",
    "av_core_accepted_drafts_total",
    "av_core_predicted_accepted_drafts_total",
    "av_core_log_loss",
    "av_core_expected_calibration_error",
    "av_core_window_drafts",
    "av_core_slope",
    "av_core_intercept",
    "av_core_refits_total",
    "av_core_drift_statistic",
    "av_core_dropped_rows_total",
    "av_core_draft_budget",
    "av_core_drafting_depth",
    "av_core_predicted_step_cost_ms",
    "av_core_step_host_seconds",
    "av_core_host_seconds_total",
)


def _env_true(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    return value not in ("0", "false", "no", "off")


def enabled() -> bool:
    """Whether metrics are on in this process (see the module doc)."""
    if not _env_true(ENV_ENABLE, True):
        return False
    return bool(os.environ.get(ENV_PORT, "").strip() or os.environ.get(ENV_MULTIPROC, "").strip())


def _env_number(name: str, default: float, *, integer: bool) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        logger.warning("av_core: %s=%r is not a number; using %s", name, text, default)
        return default
    if not value > 0 or not math.isfinite(value):
        logger.warning("av_core: %s=%r must be positive; using %s", name, text, default)
        return default
    return value


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:  # pragma: no cover - torch is there whenever the drop-ins are
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


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


@dataclass
class EstimatorRecorder:
    """The per-step record of one estimator: the verdict arrays it folded, kept by reference
    until the next fold (the estimator makes them fresh each step)."""

    owner: ProcessMetrics
    num_positions: int
    source: Any  # weakref to the estimator
    pending: list[tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]] = field(
        default_factory=list
    )
    drift_statistic: float = math.nan
    pushed_refits: int = 0
    pushed_dropped: int = 0

    def verdicts(
        self,
        predictions: npt.NDArray[Any],
        num_accepted: npt.NDArray[Any],
        num_admitted: npt.NDArray[Any],
    ) -> None:
        """One step's labeled rows: draft-time predictions ``[R, K]`` and the counts the labels
        come from (``k < accepted``: 1; ``k == accepted < admitted``: 0; else unlabeled)."""
        self.pending.append((predictions, num_accepted, num_admitted))
        self.owner.tick()

    def refitted(self, report: dict[str, Any] | None) -> None:
        """A refit ran; ``report`` is the native ``refit(report=True)`` output."""
        if report is not None:
            self.drift_statistic = float(report.get("drift_statistic", math.nan))

    def host_time(self, call: str, seconds: float) -> None:
        self.owner.host_time(call, seconds)


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
        r = self.registry
        rank, pos = ["rank"], ["rank", "position"]
        latest: dict[str, Any] = {"multiprocess_mode": "mostrecent"}
        self.labeled = prom.Counter(
            "av_core_labeled_drafts", "Drafts the target gave a verdict on.", pos, registry=r
        )
        self.accepted = prom.Counter(
            "av_core_accepted_drafts", "Drafts the target accepted.", pos, registry=r
        )
        self.predicted = prom.Counter(
            "av_core_predicted_accepted_drafts",
            "Sum of the draft-time acceptance predictions of the labeled drafts (expected "
            "accepted drafts).",
            pos,
            registry=r,
        )
        self.log_loss = prom.Gauge(
            "av_core_log_loss",
            "Prequential log-loss (nats) of the draft-time predictions over the window.",
            rank,
            registry=r,
            **latest,
        )
        self.ece = prom.Gauge(
            "av_core_expected_calibration_error",
            f"Expected calibration error ({_ECE_BINS} equal bins) over the window.",
            rank,
            registry=r,
            **latest,
        )
        self.window = prom.Gauge(
            "av_core_window_drafts",
            "Labeled drafts in the log-loss/ECE window.",
            rank,
            registry=r,
            **latest,
        )
        self.slope = prom.Gauge(
            "av_core_slope", "The estimator's slope.", rank, registry=r, **latest
        )
        self.intercept = prom.Gauge(
            "av_core_intercept", "The estimator's intercepts.", pos, registry=r, **latest
        )
        self.refits = prom.Counter("av_core_refits", "Refits run.", rank, registry=r)
        self.drift = prom.Gauge(
            "av_core_drift_statistic",
            "Drift statistic of the last refit's round: about chi-square with K + 1 degrees "
            "of freedom while the coefficients fit.",
            rank,
            registry=r,
            **latest,
        )
        self.dropped = prom.Counter(
            "av_core_dropped_rows",
            "Verdict rows dropped for a non-finite feature or prediction.",
            rank,
            registry=r,
        )
        self.budget = prom.Histogram(
            "av_core_draft_budget",
            "Draft tokens admitted for verification per step.",
            rank,
            buckets=BUDGET_BUCKETS,
            registry=r,
        )
        self.depth = prom.Histogram(
            "av_core_drafting_depth",
            "Drafting depth (num_speculative_tokens) chosen per step.",
            rank,
            buckets=tuple(range(17)),
            registry=r,
        )
        self.cost = prom.Histogram(
            "av_core_predicted_step_cost_ms",
            "The planner's predicted cost of the step it chose, milliseconds.",
            rank,
            buckets=COST_BUCKETS_MS,
            registry=r,
        )
        self.step_host = prom.Histogram(
            "av_core_step_host_seconds",
            "Host time av_core spent per decode step (estimator, budget, depth).",
            rank,
            buckets=HOST_BUCKETS_S,
            registry=r,
        )
        self.host = prom.Counter(
            "av_core_host_seconds",
            "Host time av_core spent, by call.",
            ["rank", "call"],
            registry=r,
        )
        self.server: Any = None
        self.port: int | None = None

    def serve(self, port: int, host: str) -> None:
        import prometheus_client as prom

        try:
            started = prom.start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
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
    """This process's metrics: the recorders of its estimators, the step-level histograms, and
    the fold into the Prometheus values."""

    def __init__(self, rank: int, port_offset: int) -> None:
        self.rank = rank
        self.label = str(rank)
        self.window = int(_env_number(ENV_WINDOW, DEFAULT_WINDOW, integer=True))
        self.interval = _env_number(ENV_INTERVAL, DEFAULT_INTERVAL_S, integer=False)
        self.exporter = _Exporter()
        self.recorders: list[EstimatorRecorder] = []
        self.budget = _LocalHistogram(BUDGET_BUCKETS)
        self.depth = _LocalHistogram(range(17))
        self.cost = _LocalHistogram(COST_BUCKETS_MS)
        self.step_host = _LocalHistogram(HOST_BUCKETS_S)
        self.host_by_call: dict[str, float] = {}
        self._step_seconds = 0.0
        self._ring_p = np.zeros(self.window, dtype=np.float64)
        self._ring_y = np.zeros(self.window, dtype=np.bool_)
        self._ring_next = 0
        self._ring_fill = 0
        self._last_fold = time.monotonic()
        self._lock = threading.Lock()
        port = os.environ.get(ENV_PORT, "").strip()
        if port:
            try:
                base = int(port)
            except ValueError:
                logger.warning("av_core: %s=%r is not a port number; no server", ENV_PORT, port)
            else:
                host = os.environ.get(ENV_HOST, "").strip() or "127.0.0.1"
                self.exporter.serve(base + port_offset, host)

    # -- recording (the serving loop) -------------------------------------------------------

    def recorder(self, estimator: Any, num_positions: int) -> EstimatorRecorder:
        recorder = EstimatorRecorder(self, num_positions, weakref.ref(estimator))
        self.recorders.append(recorder)
        return recorder

    def host_time(self, call: str, seconds: float) -> None:
        self.host_by_call[call] = self.host_by_call.get(call, 0.0) + seconds
        self._step_seconds += seconds

    def end_step(self) -> None:
        """Called at the start of each estimator step: the time of the step before is done."""
        if self._step_seconds:
            self.step_host.observe(self._step_seconds)
            self._step_seconds = 0.0

    def budget_chosen(self, budget: int, predicted_cost_ms: float | None) -> None:
        self.budget.observe(budget)
        if predicted_cost_ms is not None:
            self.cost.observe(predicted_cost_ms)
        self.tick()

    def depth_chosen(self, depth: int, predicted_cost_ms: float | None = None) -> None:
        self.depth.observe(depth)
        if predicted_cost_ms is not None:
            self.cost.observe(predicted_cost_ms)
        self.tick()

    def tick(self) -> None:
        if time.monotonic() - self._last_fold >= self.interval:
            self.fold()

    # -- the fold --------------------------------------------------------------------------

    def fold(self) -> None:
        """Folds everything recorded into the Prometheus values (also at exit, and for tests)."""
        with self._lock:
            self._last_fold = time.monotonic()
            e, label = self.exporter, self.label
            self.end_step()
            for recorder in list(self.recorders):
                self._fold_recorder(recorder)
            self.budget.drain_into(e.budget.labels(label))
            self.depth.drain_into(e.depth.labels(label))
            self.cost.drain_into(e.cost.labels(label))
            self.step_host.drain_into(e.step_host.labels(label))
            for call, seconds in self.host_by_call.items():
                if seconds:
                    e.host.labels(label, call).inc(seconds)
            self.host_by_call = dict.fromkeys(self.host_by_call, 0.0)
            if self._ring_fill:
                p, y = self._window()
                e.log_loss.labels(label).set(log_loss(y, p))
                e.ece.labels(label).set(expected_calibration_error(y, p, _ECE_BINS))
            e.window.labels(label).set(self._ring_fill)

    def _fold_recorder(self, recorder: EstimatorRecorder) -> None:
        e, label, k = self.exporter, self.label, recorder.num_positions
        pending, recorder.pending = recorder.pending, []
        if pending:
            p = np.concatenate([entry[0] for entry in pending]).astype(np.float64, copy=False)
            accepted = np.concatenate([entry[1] for entry in pending]).astype(np.int64)
            admitted = np.concatenate([entry[2] for entry in pending]).astype(np.int64)
            position = np.arange(k)
            labeled = (position <= accepted[:, None]) & (position < admitted[:, None])
            label_1 = position < accepted[:, None]
            counts = labeled.sum(axis=0)
            hits = (label_1 & labeled).sum(axis=0)
            predicted = np.where(labeled, p, 0.0).sum(axis=0)
            for index in range(k):
                if counts[index]:
                    where = str(index)
                    e.labeled.labels(label, where).inc(int(counts[index]))
                    e.accepted.labels(label, where).inc(int(hits[index]))
                    e.predicted.labels(label, where).inc(float(predicted[index]))
            self._remember(p[labeled], label_1[labeled])
        estimator = recorder.source()
        if estimator is None:
            self.recorders.remove(recorder)
            return
        slope, intercepts = estimator.host_coefficients  # host values: no device read
        e.slope.labels(label).set(float(slope))
        for index, value in enumerate(intercepts.tolist()):
            e.intercept.labels(label, str(index)).set(value)
        refits, dropped = int(estimator.num_refits), int(estimator.num_dropped_rows)
        if refits > recorder.pushed_refits:
            e.refits.labels(label).inc(refits - recorder.pushed_refits)
        if dropped > recorder.pushed_dropped:
            e.dropped.labels(label).inc(dropped - recorder.pushed_dropped)
        recorder.pushed_refits, recorder.pushed_dropped = refits, dropped
        if not math.isnan(recorder.drift_statistic):
            e.drift.labels(label).set(recorder.drift_statistic)

    def _remember(self, p: npt.NDArray[np.float64], y: npt.NDArray[np.bool_]) -> None:
        """Appends labeled drafts to the ring of the last ``window`` (in step, row, position
        order)."""
        n, size = p.shape[0], self.window
        if n >= size:
            self._ring_p[:], self._ring_y[:] = p[-size:], y[-size:]
            self._ring_next, self._ring_fill = 0, size
            return
        start = self._ring_next
        first = min(n, size - start)
        self._ring_p[start : start + first], self._ring_y[start : start + first] = (
            p[:first],
            y[:first],
        )
        self._ring_p[: n - first], self._ring_y[: n - first] = p[first:], y[first:]
        self._ring_next = (start + n) % size
        self._ring_fill = min(size, self._ring_fill + n)

    def _window(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        if self._ring_fill < self.window:
            return self._ring_p[: self._ring_fill], self._ring_y[: self._ring_fill]
        order = np.roll(np.arange(self.window), -self._ring_next)
        return self._ring_p[order], self._ring_y[order]

    def close(self) -> None:
        self.exporter.close()


_process: ProcessMetrics | None = None
_process_lock = threading.Lock()


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
            rank = _rank()
            offset = device_index
            if offset is None:
                try:
                    offset = int(os.environ["LOCAL_RANK"])
                except (KeyError, ValueError):
                    offset = rank
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
