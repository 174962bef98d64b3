"""The GPU self-check: :func:`gpu_selfcheck` runs :class:`OnlineAcceptanceEstimator` on CUDA over a
synthetic serving trace and compares it with the same trace on the host, checks that the loop
never blocks on the device, that a CUDA graph captured around ``predict`` sees later refits, and
that metrics recording reads nothing back (``benches/gpu_check.py`` runs it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from av_core.vllm import metrics as vllm_metrics
from av_core.vllm.checks import _check_positive_int
from av_core.vllm.constants import REFIT_INTERVAL
from av_core.vllm.estimator import OnlineAcceptanceEstimator


def _synthetic_steps(
    steps: int, max_num_reqs: int, k: int, vocab: int, seed: int
) -> Iterator[dict[str, torch.Tensor]]:
    """A deterministic serving trace, made on the host. Each step grades the previous step's
    drafts (``verdict_*``: the target accepts draft ``k`` with probability ``q_max ** 0.7`` of
    the distribution it was drafted from, a law the estimator has to learn) and brings a new
    batch of live request slots with cudagraph-style padding rows (``idx_mapping``) and K draft
    logits per row. The verdicts never read the estimator's predictions, so two estimators fed
    the same trace see the same labels."""
    gen = torch.Generator().manual_seed(seed)
    temperature = torch.where(
        torch.rand(max_num_reqs, generator=gen) < 0.3,
        torch.zeros(max_num_reqs),
        0.5 + torch.rand(max_num_reqs, generator=gen),
    )
    previous_slots = torch.zeros(0, dtype=torch.int32)
    previous_q = torch.zeros(0, k, dtype=torch.float64)
    for _ in range(steps):
        rows = previous_slots.shape[0]
        accept = torch.rand(rows, k, generator=gen, dtype=torch.float64) < previous_q**0.7
        scheduled = torch.randint(0, k + 1, (rows,), generator=gen)
        first_miss = torch.where(~accept, torch.arange(k), k).amin(dim=1)
        accepted = torch.minimum(first_miss, scheduled)
        live = int(torch.randint(1, max_num_reqs // 2 + 1, (1,), generator=gen))
        pad = int(torch.randint(0, 4, (1,), generator=gen))
        slots = torch.randperm(max_num_reqs, generator=gen)[:live].to(torch.int32)
        sharp = torch.rand(live + pad, k, 1, generator=gen) * 8.0
        logits = torch.randn(live + pad, k, vocab, generator=gen) * sharp
        yield {
            "verdict_idx_mapping": previous_slots,
            "verdict_num_sampled": (accepted + 1).to(torch.int32),
            "verdict_num_rejected": (scheduled > accepted).to(torch.int32),
            "idx_mapping": torch.cat([slots, torch.full((pad,), -1, dtype=torch.int32)]),
            "logits": logits,
            "temperature": temperature,
        }
        t = temperature[slots.long()].double()
        t = torch.where(t > 0, t, torch.ones_like(t))
        previous_q = torch.softmax(logits[:live].double() / t[:, None, None], dim=-1).amax(-1)
        previous_slots = slots


def _run_trace(
    est: OnlineAcceptanceEstimator,
    trace: Iterator[dict[str, torch.Tensor]],
    device: torch.device,
    timings: dict[str, list[float]] | None = None,
    confidence: torch.Tensor | None = None,
) -> torch.Tensor:
    """Drive ``est`` as vLLM's speculator does: each step grades the last drafts, then K draft
    steps score the new ones. Host time of each call is recorded in ``timings``."""
    k, m = est.num_speculative_steps, est.max_num_reqs
    if confidence is None:
        confidence = torch.zeros(m + 4, k, dtype=torch.float32, device=device)
    positions = torch.arange(k, device=device).unbind()  # 0-d steps, made without a copy
    for batch in trace:
        on = {name: value.to(device, non_blocking=True) for name, value in batch.items()}
        started = time.perf_counter()
        est.step(on["verdict_idx_mapping"], on["verdict_num_sampled"], on["verdict_num_rejected"])
        stepped = time.perf_counter()
        for position in range(k):
            est.predict(
                on["logits"][:, position],
                on["idx_mapping"],
                positions[position],
                confidence,
                on["temperature"],
            )
        predicted = time.perf_counter()
        if timings is not None:
            timings["step"].append(stepped - started)
            timings["predict"].append((predicted - stepped) / k)
    est.flush()
    return confidence


def gpu_selfcheck(steps: int = 2000) -> dict[str, Any]:
    """Run :class:`OnlineAcceptanceEstimator` on CUDA for ``steps`` steps of a synthetic serving
    trace and compare it with the same trace on the host (forced into the same staged schedule,
    so both refit at the same steps). Returns a JSON-able report: host time per ``step`` and per
    ``predict`` call on CUDA (µs; what the serving loop pays), the largest differences of
    features, predictions, confidences and coefficients between the two paths, whether the CUDA
    loop ran clean under ``torch.cuda.set_sync_debug_mode("error")`` (no blocking read-back), and
    whether a CUDA graph captured around ``predict`` sees the coefficients of a later refit.
    ``ok`` is the conjunction of the checks.
    """
    steps = _check_positive_int(steps, "steps")
    if not torch.cuda.is_available():
        raise RuntimeError("gpu_selfcheck needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    report = _compare_with_host(device, steps)
    report["graph_capture"] = _graph_capture_check(device, 1024)
    report["metrics"] = _metrics_sync_check(device, min(steps, 300))
    report["ok"] = bool(
        report["ok"]
        and report["graph_capture"].get("ok", False)
        and report["metrics"].get("ok", True)  # skipped (no prometheus_client) is not a failure
    )
    return report


def _metrics_sync_check(device: torch.device, steps: int) -> dict[str, Any]:
    """The staged estimator with metrics recording (av_core.vllm.metrics) under
    ``torch.cuda.set_sync_debug_mode("error")``, folded while it runs: metrics must not read the
    device. Returns ``{"ok": ..., "labeled_drafts": ...}``, or ``{"skipped": why}``."""
    try:
        metrics = vllm_metrics.ProcessMetrics(rank=0, port_offset=0)
    except ImportError as error:
        return {"skipped": str(error)}
    m, k, vocab = 32, 4, 1024
    cuda = device.type == "cuda"
    try:
        est = OnlineAcceptanceEstimator(m, k, device, staged=True)
        est.REFIT_INTERVAL = 25
        est._recorder = metrics.recorder(est, k)
        batches = [
            {name: value.to(device) for name, value in batch.items()}
            for batch in _synthetic_steps(steps, m, k, vocab, 99)
        ]
        confidence = torch.zeros(m + 4, k, dtype=torch.float32, device=device)
        if cuda:
            torch.cuda.synchronize()
        previous = torch.cuda.get_sync_debug_mode() if cuda else 0
        sync_error: str | None = None
        try:
            if cuda:
                torch.cuda.set_sync_debug_mode("error")
            for start in range(0, steps, 50):  # folds interleaved with the serving loop
                _run_trace(est, iter(batches[start : start + 50]), device, None, confidence)
                metrics.fold()
        except RuntimeError as failure:
            sync_error = f"{type(failure).__name__}: {failure}"
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(previous)
        # Labeled drafts: moments' n under vLLM's update, histogram counts under map.
        stats: Mapping[str, Any] = est.round_stats()
        drafts = sum(stats["n"] if "n" in stats else stats["count"])
        return {
            "ok": sync_error is None and est.num_refits == steps // 25,
            "no_blocking_sync": sync_error is None,
            **({} if sync_error is None else {"sync_error": sync_error}),
            "refits": est.num_refits,
            "open_round_drafts": int(drafts),
        }
    finally:
        metrics.close()


def _compare_with_host(
    device: torch.device,
    steps: int,
    *,
    max_num_reqs: int = 32,
    num_speculative_steps: int = 4,
    vocab: int = 1024,
    refit_interval: int = REFIT_INTERVAL,
) -> dict[str, Any]:
    """The body of :func:`gpu_selfcheck` for any device (a host ``device`` runs the staged path
    against the host path: a dry run of the harness)."""
    m, k, seed = max_num_reqs, num_speculative_steps, 1234
    cuda = device.type == "cuda"
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if cuda else str(device),
        "steps": steps,
        "max_num_reqs": m,
        "K": k,
        "vocab": vocab,
    }

    def run(
        checked: bool,
    ) -> tuple[OnlineAcceptanceEstimator, torch.Tensor, dict[str, list[float]]]:
        est = OnlineAcceptanceEstimator(m, k, device, staged=True)
        est.REFIT_INTERVAL = refit_interval
        timings: dict[str, list[float]] = {"step": [], "predict": []}
        trace = _synthetic_steps(steps, m, k, vocab, seed)
        if not cuda:
            return est, _run_trace(est, trace, device, timings), timings
        # Outside the checked region: the whole trace on the device (so the loop copies
        # nothing in) and the output buffer.
        batches = [{name: value.to(device) for name, value in batch.items()} for batch in trace]
        confidence = torch.zeros(m + 4, k, dtype=torch.float32, device=device)
        torch.cuda.synchronize()
        previous_mode = torch.cuda.get_sync_debug_mode()
        try:
            if checked:
                torch.cuda.set_sync_debug_mode("error")
            conf = _run_trace(est, iter(batches), device, timings, confidence)
        finally:
            torch.cuda.set_sync_debug_mode(previous_mode)
        torch.cuda.synchronize()
        return est, conf, timings

    if cuda:  # compile the kernels outside the timed, sync-checked loop
        warm = OnlineAcceptanceEstimator(m, k, device)
        _run_trace(warm, _synthetic_steps(3, m, k, vocab, 7), device)
        torch.cuda.synchronize()
    sync_error = None
    try:
        est, conf, timings = run(checked=True)
    except RuntimeError as error:  # a synchronising call under "error" mode
        sync_error = f"{type(error).__name__}: {error}"
        est, conf, timings = run(checked=False)
    host_est = OnlineAcceptanceEstimator(m, k, torch.device("cpu"), staged=True)
    host_est.REFIT_INTERVAL = refit_interval
    host_conf = _run_trace(host_est, _synthetic_steps(steps, m, k, vocab, seed), host_est.device)

    def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.detach().cpu().double() - b.detach().cpu().double()).abs().max())

    for name, values in timings.items():
        micros = np.asarray(values[1:] or values) * 1e6
        report[f"{name}_host_us"] = {
            "mean": float(micros.mean()),
            "p50": float(np.percentile(micros, 50)),
            "p99": float(np.percentile(micros, 99)),
            "max": float(micros.max()),
        }
    diffs = {
        "features": max_diff(est.features, host_est.features),
        "predictions": max_diff(est.predictions, host_est.predictions),
        "confidence_probs": max_diff(conf[:m], host_conf[:m]),
        "slope": max_diff(est.slope, host_est.slope),
        "intercepts": max_diff(est.intercepts, host_est.intercepts),
    }
    tolerance = {
        "features": 1e-3,
        "predictions": 1e-4,
        "confidence_probs": 1e-4,
        "slope": 1e-3,
        "intercepts": 1e-3,
    }
    report["max_abs_diff_vs_cpu"] = diffs
    report["tolerance"] = tolerance
    report["refits"] = {"device": est.num_refits, "cpu": host_est.num_refits}
    report["coefficients"] = {
        "slope": float(est.slope.cpu()[0]),
        "intercepts": est.intercepts.cpu().tolist(),
    }
    report["no_blocking_sync"] = sync_error is None
    if sync_error is not None:
        report["sync_error"] = sync_error
    report["ok"] = bool(
        sync_error is None
        and est.num_refits == host_est.num_refits == steps // refit_interval
        and all(diffs[name] <= bound for name, bound in tolerance.items())
    )
    return report


def _graph_capture_check(device: torch.device, vocab: int) -> dict[str, Any]:
    """Capture ``predict`` in a CUDA graph, refit, replay: the replay must use the new
    coefficients (they are updated in place) and equal an eager call."""
    try:
        m, k = 8, 2
        est = OnlineAcceptanceEstimator(m, k, device)
        est.REFIT_INTERVAL = 1
        gen = torch.Generator(device=device).manual_seed(0)
        logits = torch.randn(m, vocab, device=device, generator=gen) * 3
        idx = torch.arange(m, dtype=torch.int32, device=device)
        idx[-1] = -1
        step = torch.tensor(0, device=device)
        temperature = torch.ones(m, device=device)
        conf = torch.zeros(m, k, device=device)
        est.predict(logits, idx, step, conf, temperature)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            est.predict(logits, idx, step, conf, temperature)
        graph.replay()
        torch.cuda.synchronize()
        before = conf.clone()
        intercepts_before = est.intercepts.clone()
        # Every live request accepts its first draft (num_sampled 2, nothing rejected) for a
        # few steps: intercept 0 moves up, refitting at every step.
        live = idx[:-1]
        accepted = torch.full((m - 1,), 2, dtype=torch.int32, device=device)
        for _ in range(3):
            est.step(live, accepted, torch.zeros_like(accepted))
        est.flush()
        graph.replay()
        torch.cuda.synchronize()
        eager = torch.zeros_like(conf)
        est.predict(logits, idx, step, eager, temperature)
        torch.cuda.synchronize()
        refit = est.num_refits == 3 and not torch.equal(est.intercepts, intercepts_before)
        replay_moved = not torch.equal(conf, before)
        same = bool(torch.equal(conf, eager))
        return {
            "ok": refit and replay_moved and same,
            "refits_moved_intercepts": refit,
            "replay_sees_new_coefficients": replay_moved,
            "replay_equals_eager": same,
        }
    except Exception as error:  # noqa: BLE001 - reported, not raised: the rest still counts
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
