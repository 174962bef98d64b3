"""The Prometheus side of :mod:`av_core.vllm.metrics`: the metric families (one set per
process, in their own registry), their buckets, and the HTTP server that serves them."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("vllm.av_core")

#: prometheus_client's multiprocess directory: set, the values go to its files there.
ENV_MULTIPROC = "PROMETHEUS_MULTIPROC_DIR"
#: Upper bounds of the draft-budget histogram (drafts admitted per step).
BUDGET_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: Upper bounds of the predicted-step-cost histogram, milliseconds.
COST_BUCKETS_MS = (1, 2, 5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500, 1000)
#: Upper bounds of the host-time-per-step histogram, seconds.
HOST_BUCKETS_S = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2)
#: Equal-width bins of the rolling ECE (av_core.tools.metrics' default).
ECE_BINS = 15


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
            f"Expected calibration error ({ECE_BINS} equal bins) over the window.",
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
            "The planner's predicted cost of the step it chose, milliseconds, by decision "
            "(budget: the verification budget; depth: the drafting depth).",
            ["rank", "decision"],
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
