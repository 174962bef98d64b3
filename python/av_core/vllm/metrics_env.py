"""The metrics' settings: the environment variables that turn them on and shape them, their
defaults and bounds, and the rank and port a worker reports under. An environment value can
never stop the server: a bad one is a warning and the default.
"""

from __future__ import annotations

import logging
import math
import os

logger = logging.getLogger("vllm.av_core")

ENV_ENABLE = "AV_CORE_METRICS"
ENV_PORT = "AV_CORE_METRICS_PORT"
ENV_HOST = "AV_CORE_METRICS_HOST"
ENV_WINDOW = "AV_CORE_METRICS_WINDOW"
ENV_INTERVAL = "AV_CORE_METRICS_INTERVAL"
ENV_MULTIPROC = "PROMETHEUS_MULTIPROC_DIR"

#: Labeled drafts the rolling log-loss and ECE are computed over.
DEFAULT_WINDOW = 10_000
#: The largest ``AV_CORE_METRICS_WINDOW``: the window is allocated up front (9 bytes a draft),
#: so a size typed by mistake must not take the server's memory.
MAX_WINDOW = 1_000_000
#: Seconds between folds of the recorded values into the Prometheus values.
DEFAULT_INTERVAL_S = 1.0
#: ``AV_CORE_METRICS_INTERVAL`` is kept within these bounds (seconds): below, the fold thread
#: would spin; above, the thread's wait cannot be represented (and nothing would be exported).
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.01, 86_400.0
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


def _env_number(
    name: str, default: float, *, integer: bool, low: float, high: float, clamp: bool = False
) -> float:
    """A positive number from the environment within ``[low, high]``: outside, a warning and
    the default (or, with ``clamp``, the nearest bound); never an exception."""
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
    if low <= value <= high:
        return value
    used = (low if value < low else high) if clamp else default
    logger.warning("av_core: %s=%r must lie in [%s, %s]; using %s", name, text, low, high, used)
    return used


def _port(text: str, offset: int) -> int | None:
    """The server's port, ``AV_CORE_METRICS_PORT + offset``; None (with a warning) when that
    is not a TCP port."""
    try:
        base = int(text)
    except ValueError:
        logger.warning("av_core: %s=%r is not a port number; no metrics server", ENV_PORT, text)
        return None
    port = base + offset
    if not 0 < port <= 65535:
        logger.warning(
            "av_core: %s=%r plus this worker's offset %d is %d, not a TCP port (1..65535); no "
            "metrics server",
            ENV_PORT,
            text,
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
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0
