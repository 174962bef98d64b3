"""The metrics' settings: the environment variables that turn them on and shape them (declared
with their defaults and bounds in :mod:`av_core._settings`), and the rank and port a worker
reports under. Metrics start inside a running server, so they read the variables leniently
(docs/settings.md): a bad value is a warning and the default, never an exception.
"""

from __future__ import annotations

import logging

from av_core import _settings as settings

logger = logging.getLogger("vllm.av_core")

ENV_ENABLE = settings.METRICS.name
ENV_PORT = settings.METRICS_PORT.name
ENV_HOST = settings.METRICS_HOST.name
ENV_WINDOW = settings.METRICS_WINDOW.name
ENV_INTERVAL = settings.METRICS_INTERVAL.name
ENV_MULTIPROC = settings.PROMETHEUS_MULTIPROC_DIR.name

#: Labeled drafts the rolling log-loss and ECE are computed over.
DEFAULT_WINDOW = settings.METRICS_DEFAULT_WINDOW
#: The largest ``AV_CORE_METRICS_WINDOW``: the window is allocated up front (9 bytes a draft),
#: so a size typed by mistake must not take the server's memory.
MAX_WINDOW = settings.METRICS_MAX_WINDOW
#: Seconds between folds of the recorded values into the Prometheus values.
DEFAULT_INTERVAL_S = settings.METRICS_DEFAULT_INTERVAL_S
#: ``AV_CORE_METRICS_INTERVAL`` is kept within these bounds (seconds): below, the fold thread
#: would spin; above, the thread's wait cannot be represented (and nothing would be exported).
MIN_INTERVAL_S, MAX_INTERVAL_S = (
    settings.METRICS_MIN_INTERVAL_S,
    settings.METRICS_MAX_INTERVAL_S,
)
#: Upper bounds of the draft-budget histogram (drafts admitted per step).
BUDGET_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: Upper bounds of the predicted-step-cost histogram, milliseconds.
COST_BUCKETS_MS = (1, 2, 5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500, 1000)
#: Upper bounds of the host-time-per-step histogram, seconds.
HOST_BUCKETS_S = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2)
#: Equal-width bins of the rolling ECE (av_core.tools.metrics' default).
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


def enabled() -> bool:
    """Whether metrics are on in this process (see the module doc)."""
    if not settings.METRICS.get():
        return False
    return settings.METRICS_PORT.is_set() or settings.PROMETHEUS_MULTIPROC_DIR.is_set()


def _port(offset: int) -> int | None:
    """The server's port, ``AV_CORE_METRICS_PORT + offset``; None when the variable is unset or
    not a port (a warning), or the sum is not a TCP port (a warning)."""
    base: int | None = settings.METRICS_PORT.get()
    if base is None:
        return None
    port = base + offset
    if not 0 < port <= 65535:
        logger.warning(
            "av_core: %s=%r plus this worker's offset %d is %d, not a TCP port (1..65535); no "
            "metrics server",
            ENV_PORT,
            settings.METRICS_PORT.text(),
            offset,
            port,
        )
        return None
    return port


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:  # pragma: no cover - torch is there whenever the drop-ins are
        pass
    rank: int | None = settings.RANK.get()
    return 0 if rank is None else rank
