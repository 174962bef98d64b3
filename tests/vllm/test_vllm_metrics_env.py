"""The metrics' environment can never stop the server (av_core.vllm.metrics, issue #21).

Metrics start inside the first drop-in estimator's constructor, that is inside vLLM's
``load_model``: whatever the environment holds, the constructor must return and serving must go
on (metrics then off, or partly off, with a warning saying why). Each case below raised out of
the constructor, or killed the fold thread, before:

- ``AV_CORE_METRICS_PORT`` plus the worker's offset beyond 65535: ``OverflowError``;
- an ``AV_CORE_METRICS_HOST`` that cannot be encoded: ``UnicodeError``;
- a huge ``AV_CORE_METRICS_WINDOW``: ``MemoryError`` (the window is allocated up front);
- a huge ``AV_CORE_METRICS_INTERVAL``: the fold thread died (``OverflowError`` in its wait), so
  nothing was ever exported; a tiny one made it spin;
- ``PROMETHEUS_MULTIPROC_DIR`` naming no directory: every fold failed, a traceback a second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("prometheus_client")

from av_core.vllm import OnlineAcceptanceEstimator  # noqa: E402
from av_core.vllm import metrics as vllm_metrics  # noqa: E402

CPU = torch.device("cpu")
LOGGER = "vllm.av_core"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    vllm_metrics.reset()
    for name in (
        "AV_CORE_METRICS",
        "AV_CORE_METRICS_PORT",
        "AV_CORE_METRICS_HOST",
        "AV_CORE_METRICS_WINDOW",
        "AV_CORE_METRICS_INTERVAL",
        "PROMETHEUS_MULTIPROC_DIR",
        "LOCAL_RANK",
        "RANK",
    ):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    vllm_metrics.reset()


def serve_one_step(est: OnlineAcceptanceEstimator) -> None:
    idx = torch.arange(4, dtype=torch.int32)
    conf = torch.zeros(4, est.num_speculative_steps)
    est.predict(torch.randn(4, 16), idx, torch.tensor(0), conf, torch.ones(est.max_num_reqs))
    est.step(idx, torch.full((4,), 2, dtype=torch.int32), torch.ones(4, dtype=torch.int32))


@pytest.mark.parametrize(
    ("port", "rank"),
    [("70000", None), ("65535", "3"), ("99999999999999999999999", None), ("-5", None)],
)
def test_a_port_beyond_tcp_is_a_warning_not_a_crash(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, port: str, rank: str | None
) -> None:
    clean_env.setenv("AV_CORE_METRICS_PORT", port)
    clean_env.setenv("AV_CORE_METRICS_INTERVAL", "3600")
    if rank is not None:
        clean_env.setenv("RANK", rank)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        est = OnlineAcceptanceEstimator(8, 4, CPU)
    assert "not a TCP port" in caplog.text and port in caplog.text
    metrics = vllm_metrics.current()
    assert metrics is not None and metrics.exporter.server is None
    assert est._recorder is not None  # still recorded (for PROMETHEUS_MULTIPROC_DIR)
    serve_one_step(est)


def test_a_host_that_cannot_be_encoded_is_a_warning_not_a_crash(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("AV_CORE_METRICS_PORT", "9")
    clean_env.setenv("AV_CORE_METRICS_INTERVAL", "3600")
    clean_env.setenv("AV_CORE_METRICS_HOST", "a" * 300)  # an IDNA label is at most 63
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        est = OnlineAcceptanceEstimator(8, 4, CPU)
    assert "metrics server not started" in caplog.text
    serve_one_step(est)


@pytest.mark.parametrize("window", [str(10**12), str(10**30), str(vllm_metrics.MAX_WINDOW + 1)])
def test_a_huge_window_is_refused_before_anything_is_allocated(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, window: str
) -> None:
    clean_env.setenv("AV_CORE_METRICS_PORT", "0")  # port 0: no server (not a TCP port)
    clean_env.setenv("AV_CORE_METRICS_INTERVAL", "3600")
    clean_env.setenv("AV_CORE_METRICS_WINDOW", window)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        OnlineAcceptanceEstimator(8, 4, CPU)
    metrics = vllm_metrics.current()
    assert metrics is not None and metrics.window == vllm_metrics.DEFAULT_WINDOW
    assert "AV_CORE_METRICS_WINDOW" in caplog.text and window in caplog.text


def test_the_largest_window_is_accepted(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AV_CORE_METRICS_PORT", "0")
    clean_env.setenv("AV_CORE_METRICS_INTERVAL", "3600")
    clean_env.setenv("AV_CORE_METRICS_WINDOW", str(vllm_metrics.MAX_WINDOW))
    OnlineAcceptanceEstimator(8, 4, CPU)
    metrics = vllm_metrics.current()
    assert metrics is not None and metrics.window == vllm_metrics.MAX_WINDOW


@pytest.mark.parametrize(
    ("interval", "used"),
    [
        ("1e300", vllm_metrics.MAX_INTERVAL_S),
        ("1e-300", vllm_metrics.MIN_INTERVAL_S),
        ("0.5", 0.5),
    ],
)
def test_the_fold_interval_is_kept_where_the_fold_thread_lives(
    clean_env: pytest.MonkeyPatch, interval: str, used: float
) -> None:
    clean_env.setenv("AV_CORE_METRICS_PORT", "0")
    clean_env.setenv("AV_CORE_METRICS_INTERVAL", interval)
    OnlineAcceptanceEstimator(8, 4, CPU)
    metrics = vllm_metrics.current()
    assert metrics is not None and metrics.interval == used
    time.sleep(0.1)
    assert metrics._thread.is_alive()


def test_a_multiprocess_dir_that_is_no_directory_turns_metrics_off_with_a_warning(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: object
) -> None:
    clean_env.setenv("PROMETHEUS_MULTIPROC_DIR", f"{tmp_path}/absent")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        est = OnlineAcceptanceEstimator(8, 4, CPU)
    assert "is not a directory" in caplog.text
    assert est._recorder is None and vllm_metrics.current() is None
    serve_one_step(est)


def test_a_fold_that_keeps_failing_warns_once(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("AV_CORE_METRICS_PORT", "0")
    clean_env.setenv("AV_CORE_METRICS_INTERVAL", str(vllm_metrics.MIN_INTERVAL_S))
    calls = threading.Semaphore(0)

    def broken(self: vllm_metrics.ProcessMetrics) -> None:
        calls.release()
        raise RuntimeError("a broken fold")

    clean_env.setattr(vllm_metrics.ProcessMetrics, "fold", broken)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        OnlineAcceptanceEstimator(8, 4, CPU)
        for _ in range(5):
            assert calls.acquire(timeout=10)
    failed = [r for r in caplog.records if "metrics fold failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
