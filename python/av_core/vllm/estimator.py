"""vLLM's online acceptance estimator on av_core's Rust core (the drop-in for
``vllm.v1.worker.gpu.spec_decode.acceptance_estimator.OnlineAcceptanceEstimator``).

Same constructor, ``step`` and ``predict`` as vLLM's; the feature and the predictions are computed
on the logits' device, the statistics and the Newton refit run in av_core's Rust estimator on the
host. Its fixed-point statistics are order-independent, so every tensor-parallel rank fits
bit-identical coefficients from the same verdicts, with no collective.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from av_core._checks import _check_int
from av_core._native import AcceptanceEstimator, InvalidTypeError, InvalidValueError
from av_core.features import MAX_FEATURE_ENTRIES, draft_log_odds
from av_core.features.checks import _check_device
from av_core.state_types import HistogramDict, RoundStatsDict
from av_core.vllm import metrics as vllm_metrics
from av_core.vllm.checks import (
    _check_confidences,
    _check_int_tensor,
    _check_output,
    _check_positive_int,
    _check_range_on_host,
    _check_setting,
    _check_tensor,
    _check_vector,
)
from av_core.vllm.constants import (
    DAMPING_OBSERVATIONS,
    INIT_INTERCEPT,
    INIT_SLOPE,
    L2,
    MAX_LOG_ODDS,
    REFIT_INTERVAL,
)
from av_core.vllm.staging import (
    _STAGING_DEPTH,
    _DoneEvent,
    _Event,
    _HostBuffers,
    _Staged,
    _sync_allowed,
)
from av_core.vllm.update import choose_update, native_options, refit_due

logger = logging.getLogger("vllm.av_core")


class OnlineAcceptanceEstimator:
    """vLLM 0.33.0's online acceptance estimator, on av_core's Rust core.

    Same interface and tensor layouts as ``vllm.v1.worker.gpu.spec_decode.acceptance_estimator.
    OnlineAcceptanceEstimator``: ``features`` and ``predictions`` are ``[max_num_reqs, K]``
    float32 tensors keyed by request-state index, ``slope`` (``[1]``) and ``intercepts``
    (``[K]``) float32 tensors on ``device``, and ``REFIT_INTERVAL``, ``DAMPING_OBSERVATIONS``
    and ``L2`` are read from the instance (set them on one to change it).

    It refits with vLLM's update (one damped Newton step per round, no memory) unless told
    otherwise: ``update="map"`` (or ``AV_CORE_VLLM_ESTIMATOR=map``) opts into av_core's own update
    (docs/estimator.md), which is calibrated from its first refits and after a workload switch:
    per-position histograms, the MAP fit iterated to convergence, fits after the 1st, 2nd, 4th,
    ... step of every round (with ``process_group``, only at the pooled round ends), memory
    across rounds.

    Per decode step, driven by vLLM's ``DraftModelSpeculator``:

    1. :meth:`step` grades the drafts stored at draft time: for row ``r`` with slot
       ``s = idx_mapping[r]``, ``A = max(num_sampled - 1, 0)`` drafts were accepted (the last
       sampled token is the bonus) out of ``admitted = A + num_rejected``; position ``k`` gets
       label 1 if ``k < A``, 0 if ``k == A < admitted``, none otherwise. Every
       ``REFIT_INTERVAL`` steps one damped Newton step refits ``p = sigmoid(slope * x + b_k)``.
    2. :meth:`predict` turns one draft step's logits into ``x = logit(q_max)`` of the
       distribution the drafter sampled from and ``p``, written to ``features[s, k]``,
       ``predictions[s, k]`` and ``confidence_probs[batch_idx, k]``.

    Where vLLM accumulates float32 statistics on the device with atomics (and so had to reconcile
    ranks), the statistics here are exact fixed-point sums in the Rust core: the same verdicts
    give the same bits on every rank, whatever the order they arrive in.

    **No blocking sync on CUDA.** :meth:`predict` runs entirely on the device (graph-capturable),
    reading the coefficients from ``slope``/``intercepts``, which a refit updates in place.
    :meth:`step` only issues non-blocking copies of the slots and the step's counts into pinned
    host buffers and records an event; the copies are folded into the Rust accumulator by a later
    :meth:`step` once their event has completed. Hence a **one-step lag**: the refit due after
    step ``n`` (with the verdicts of steps ``..n``, exactly vLLM's round) runs at the start of
    step ``n + 1`` on every rank alike, after waiting for step ``n``'s copy if it is still in
    flight (issued a whole step earlier, so it has normally landed), and its coefficients serve
    the draft steps after step ``n + 1`` instead of after step ``n``. Host (CPU) tensors fold
    synchronously, with no lag.
    """

    REFIT_INTERVAL: int = REFIT_INTERVAL
    DAMPING_OBSERVATIONS: float = DAMPING_OBSERVATIONS
    L2: float = L2

    def __init__(
        self,
        max_num_reqs: int,
        num_speculative_steps: int,
        device: torch.device,
        *,
        staged: bool | None = None,
        process_group: Any = None,
        exact: bool | None = None,
        update: str | None = None,
    ) -> None:
        """vLLM's constructor, plus keyword-only extras (every call vLLM makes means the same):

        - ``staged`` chooses the asynchronous hand-over of :meth:`step` (default: on for CUDA,
          off for host tensors; other accelerators copy synchronously).
        - ``process_group``: a ``torch.distributed`` group (e.g. the data-parallel ranks' CPU
          group) over which every refit first sums the round's statistics
          (:func:`av_core.distributed.pool_round`), so every rank refits on the pooled round and
          holds the same coefficients. Every rank of the group must call :meth:`step` the same
          number of times (a rank without requests steps with empty tensors and contributes
          zeros). ``None``: each rank learns from its own verdicts.
        - ``exact``: vLLM's unbounded refit instead of av_core's bounded one (no cap on one
          refit's step, on the slope or on the intercepts); default ``AV_CORE_VLLM_EXACT``.
        - ``update``: ``"vllm"`` (vLLM's update, the default) or ``"map"`` (av_core's own,
          with its memory and bounds; not with ``exact``); default ``AV_CORE_VLLM_ESTIMATOR``.
        """
        self.max_num_reqs = _check_positive_int(max_num_reqs, "max_num_reqs")
        self.num_speculative_steps = _check_positive_int(
            num_speculative_steps, "num_speculative_steps"
        )
        # Checked before anything is allocated (features and predictions per slot, and as many
        # host copies as the staging ring holds): the bound of av_core.features.
        if (self.max_num_reqs + 1) * self.num_speculative_steps > MAX_FEATURE_ENTRIES:
            raise InvalidValueError(
                f"max_num_reqs x num_speculative_steps must stay within {MAX_FEATURE_ENTRIES} "
                f"slots (av_core.features.MAX_FEATURE_ENTRIES), got {self.max_num_reqs} x "
                f"{self.num_speculative_steps}"
            )
        if staged is not None and not isinstance(staged, bool):
            raise InvalidTypeError(f"staged must be a bool or None, got {type(staged).__name__}")
        self.device = _check_device(device)
        self.update, self.exact = choose_update(update, exact)
        self.process_group = process_group
        self._staged = self.device.type == "cuda" if staged is None else staged
        self._pin = self.device.type == "cuda"
        self._steps_since_refit = 0
        self._refits = 0
        self._refit_pending: str | None = None
        self.num_dropped_rows = 0
        self._refit_listeners: list[Callable[[OnlineAcceptanceEstimator], None]] = []
        m, k = self.max_num_reqs, self.num_speculative_steps

        self._native = AcceptanceEstimator(
            k,
            # Manual: the native estimator never refits on its own; the schedule runs here, from
            # the instance's REFIT_INTERVAL, which a live instance can change as in vLLM.
            refit_interval=None,
            damping=float(self.DAMPING_OBSERVATIONS),
            l2=float(self.L2),
            init_slope=INIT_SLOPE,
            init_intercept=INIT_INTERCEPT,
            max_log_odds=MAX_LOG_ODDS,
            **native_options(self.update, self.exact),
        )
        try:
            self.slope = torch.full((1,), INIT_SLOPE, dtype=torch.float32, device=self.device)
            self.intercepts = torch.full(
                (k,), INIT_INTERCEPT, dtype=torch.float32, device=self.device
            )
            # Features (plane 0) and draft-time predictions (plane 1) by request slot, plus a
            # spare row for padded rows (request index -1), so no write needs a host-side mask.
            self._slots = torch.zeros(2, m + 1, k, dtype=torch.float32, device=self.device)
        except (RuntimeError, AssertionError) as error:  # an absent or exhausted device
            raise InvalidValueError(
                f"device: cannot hold the estimator on {self.device} ({error})"
            ) from None
        self.features = self._slots[0, :m]
        self.predictions = self._slots[1, :m]

        self._coefficients_host = torch.empty(1 + k, dtype=torch.float32, pin_memory=self._pin)
        self._upload_event: _Event | None = None
        self._free: list[_HostBuffers] = []
        self._pending: deque[_Staged] = deque()
        if self._staged:
            self._free = [
                _HostBuffers(torch.empty(2, m + 1, k, dtype=torch.float32, pin_memory=self._pin))
                for _ in range(_STAGING_DEPTH)
            ]
        # Metrics (av_core.vllm.metrics): None unless AV_CORE_METRICS_PORT or
        # PROMETHEUS_MULTIPROC_DIR is set, and then only host arrays are recorded.
        self._recorder: Any = vllm_metrics.recorder_for(self)

    # ----------------------------------------------------------------------------------------
    # vLLM's interface

    def step(
        self,
        idx_mapping: torch.Tensor,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
        *,
        skip_rows: torch.Tensor | None = None,
    ) -> None:
        """Fold the target's verdict on the last drafts into the statistics; refit on schedule.

        Args:
            idx_mapping: ``[R]`` request-state index per request (``-1``: no request).
            num_sampled: ``[>= R]`` tokens the target emitted: accepted drafts plus the bonus
                (entries past ``R`` are ignored, as vLLM's kernel ignores them).
            num_rejected: ``[>= R]`` admitted drafts that were rejected.
            skip_rows: optional bool ``[R]``; True rows are not learned from. Pass it for requests
                whose target-side sampling the drafter does not mirror (allowed-token lists,
                penalties, bad words): their rejections say nothing about the drafter's
                confidence and would bias the coefficients every request shares.

        Must run before the next :meth:`predict` overwrites the slots it grades (as in vLLM).
        Everything is checked before anything changes: a call that raises leaves the statistics
        and the refit schedule as they were (host tensors; on a device, out-of-range entries are
        not read back and count as no request).
        """
        recorder = self._recorder
        if recorder is None:
            self._step(idx_mapping, num_sampled, num_rejected, skip_rows)
            return
        recorder.owner.end_step()
        started = time.perf_counter()
        try:
            self._step(idx_mapping, num_sampled, num_rejected, skip_rows)
        finally:
            recorder.host_time(vllm_metrics.STEP, time.perf_counter() - started)

    def _step(
        self,
        idx_mapping: torch.Tensor,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
        skip_rows: torch.Tensor | None,
    ) -> None:
        _check_setting(self.REFIT_INTERVAL, "REFIT_INTERVAL", integer=True)
        _check_setting(self.DAMPING_OBSERVATIONS, "DAMPING_OBSERVATIONS")
        _check_setting(self.L2, "L2")
        idx_mapping = _check_int_tensor(idx_mapping, "idx_mapping")
        if idx_mapping.dim() != 1:
            raise InvalidValueError(
                f"idx_mapping must be 1-D, got shape {tuple(idx_mapping.shape)}"
            )
        rows = idx_mapping.shape[0]
        if rows > self.max_num_reqs:
            raise InvalidValueError(
                f"idx_mapping must have at most max_num_reqs = {self.max_num_reqs} rows, got {rows}"
            )
        num_sampled = _check_vector(num_sampled, "num_sampled", rows, longer_ok=True)
        num_rejected = _check_vector(num_rejected, "num_rejected", rows, longer_ok=True)
        if skip_rows is not None:
            skip_rows = _check_vector(skip_rows, "skip_rows", rows, integer=False, longer_ok=True)
            if skip_rows.dtype != torch.bool:
                raise InvalidTypeError(
                    f"skip_rows must have dtype torch.bool, got {skip_rows.dtype}"
                )
        _check_range_on_host(idx_mapping, "idx_mapping", -1, self.max_num_reqs)
        _check_range_on_host(num_sampled, "num_sampled", 0, self.num_speculative_steps + 2)
        _check_range_on_host(num_rejected, "num_rejected", 0, self.num_speculative_steps + 1)

        if not self._staged:
            if rows:
                host = self._slots.detach().cpu().numpy()
                self._fold(
                    host[0, : self.max_num_reqs],
                    host[1, : self.max_num_reqs],
                    idx_mapping.cpu().numpy(),
                    num_sampled.cpu().numpy(),
                    num_rejected.cpu().numpy(),
                    None if skip_rows is None else skip_rows.cpu().numpy(),
                )
            due = self._advance()
            if due is not None:
                self._refit(end_round=due == "end")
            return

        pending = self._refit_pending
        self._drain(wait=pending is not None)
        if pending is not None:
            self._refit_pending = None
            self._refit(end_round=pending == "end")
        if rows:
            self._stage(idx_mapping, num_sampled, num_rejected, skip_rows)
        self._refit_pending = self._advance()

    def predict(
        self,
        logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        draft_step: torch.Tensor,
        confidence_probs: torch.Tensor,
        temperature: torch.Tensor,
    ) -> None:
        """Score one draft step: ``x = logit(q_max)`` and ``p = sigmoid(slope * x + b_step)``.

        Args:
            logits: ``[N, V]`` pre-temperature drafter logits (float32, bfloat16 or float16).
            idx_mapping: ``[N]`` request-state index per row; ``-1`` marks a padded row, which
                writes nothing anywhere. (Like ``draft_step``, a longer buffer is read up to
                ``N``, as vLLM's kernels read it.)
            draft_step: a 0-d step shared by every row (one row per request, ``batch_idx = t``),
                or ``[N]`` steps, one per row, for a drafter that samples the whole block in one
                pass (``batch_idx = t // K``).
            confidence_probs: ``[B, >= K]`` float output, written at ``[batch_idx, step]``.
            temperature: ``[max_num_reqs]`` by request slot; ``<= 0`` is greedy and leaves the
                logits unscaled, as vLLM's sampler does.

        Writes ``features[slot, step] = x``, ``predictions[slot, step] = p`` and
        ``confidence_probs[batch_idx, step] = p``. The feature reads the drafter's distribution,
        never the drawn token, so trimming by it keeps rejection sampling lossless. On a device
        nothing is read back to the host, so the call can be captured in a CUDA graph; there an
        out-of-range request index or batch row counts as padding and a step is clamped to
        ``[0, K)`` (checking them would synchronise); host tensors raise ValueError instead.
        """
        recorder = self._recorder
        if recorder is None:
            self._predict(logits, idx_mapping, draft_step, confidence_probs, temperature)
            return
        started = time.perf_counter()
        try:
            self._predict(logits, idx_mapping, draft_step, confidence_probs, temperature)
        finally:
            recorder.host_time(vllm_metrics.PREDICT, time.perf_counter() - started)

    def _predict(
        self,
        logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        draft_step: torch.Tensor,
        confidence_probs: torch.Tensor,
        temperature: torch.Tensor,
    ) -> None:
        logits = _check_tensor(logits, "logits")
        if logits.dim() != 2:
            raise InvalidValueError(
                f"logits must have shape [N, V], got shape {tuple(logits.shape)}"
            )
        n = logits.shape[0]
        k, m = self.num_speculative_steps, self.max_num_reqs
        idx_mapping = _check_vector(idx_mapping, "idx_mapping", n, longer_ok=True)
        if isinstance(draft_step, int | np.integer) and not isinstance(draft_step, bool):
            if not 0 <= draft_step < k:
                raise InvalidValueError(f"draft_step must lie in [0, {k}), got {draft_step}")
            draft_step = torch.tensor(int(draft_step), device=self.device)
        draft_step = _check_int_tensor(draft_step, "draft_step")
        per_row = draft_step.dim() > 0
        if per_row and (draft_step.dim() != 1 or draft_step.shape[0] < n):
            raise InvalidValueError(
                f"draft_step must be 0-d or have shape [>= {n}], got shape "
                f"{tuple(draft_step.shape)}"
            )
        if per_row:
            draft_step = draft_step[:n]
        if not isinstance(confidence_probs, torch.Tensor):
            raise InvalidTypeError(
                f"confidence_probs must be a torch.Tensor, got {type(confidence_probs).__name__}"
            )
        confidence_probs = _check_output(confidence_probs, "confidence_probs")
        confidence_probs = _check_confidences(confidence_probs, "B", k)
        temperature = _check_tensor(temperature, "temperature")
        if temperature.dim() != 1 or temperature.shape[0] < m:
            raise InvalidValueError(
                f"temperature must have shape [{m}] (one per request slot), got shape "
                f"{tuple(temperature.shape)}"
            )
        for name, tensor in (
            ("logits", logits),
            ("idx_mapping", idx_mapping),
            ("draft_step", draft_step),
            ("confidence_probs", confidence_probs),
            ("temperature", temperature),
        ):
            if tensor.device != self.device and not (
                tensor.device.type == self.device.type == "cuda" and self.device.index is None
            ):
                raise InvalidValueError(f"{name} must be on {self.device}, got {tensor.device}")
        _check_range_on_host(idx_mapping, "idx_mapping", -1, m)
        _check_range_on_host(draft_step, "draft_step", 0, k)
        rows = confidence_probs.shape[0]
        if idx_mapping.device.type == "cpu" and n:
            live = torch.nonzero(idx_mapping >= 0).squeeze(1)
            last = int(live.max()) if live.numel() else -1
            if per_row:
                last //= k
            if last >= rows:
                raise InvalidValueError(
                    f"confidence_probs must have a row for batch index {last}, got shape "
                    f"{tuple(confidence_probs.shape)}"
                )
        if n == 0:
            return

        # Inference mode, as vLLM runs it: the in-place writes are then allowed whether the
        # buffers were made inside inference mode (inference tensors) or outside it.
        with torch.inference_mode():
            idx = idx_mapping.to(torch.int64)
            valid = (idx >= 0) & (idx < m)
            slot = torch.where(valid, idx, m)
            rows_ids = torch.arange(n, device=self.device)
            if per_row:
                step = draft_step.to(torch.int64)
                batch = torch.div(rows_ids, k, rounding_mode="floor")
            else:
                step = draft_step.to(torch.int64).expand(n)
                batch = rows_ids
            step = step.clamp(0, k - 1)
            temp = temperature[torch.where(valid, idx, 0)]
            # A padded row's logits may be anything; on a device it is computed (selecting rows
            # would synchronise) and lands in the spare slot, on the host it is not computed.
            x = draft_log_odds(
                logits,
                temp,
                max_log_odds=MAX_LOG_ODDS,
                row_valid=valid if logits.device.type == "cpu" else None,
            )
            p = torch.sigmoid(self.slope * x + self.intercepts[step])
            self._slots[0].index_put_((slot, step), x)
            self._slots[1].index_put_((slot, step), p)
            # confidence_probs belongs to the caller and has no spare row: write through a copy
            # that has one, so padded rows leave it untouched without a host-side mask.
            target = torch.where(valid & (batch < rows), batch, rows)
            scratch = torch.empty(
                rows + 1,
                confidence_probs.shape[1],
                dtype=confidence_probs.dtype,
                device=confidence_probs.device,
            )
            scratch[:rows].copy_(confidence_probs)
            scratch.index_put_((target, step), p.to(confidence_probs.dtype))
            confidence_probs.copy_(scratch[:rows])

    # ----------------------------------------------------------------------------------------
    # Extras

    @property
    def num_refits(self) -> int:
        """Refits run so far."""
        return self._refits

    @property
    def steps_since_refit(self) -> int:
        """Steps counted towards the next refit."""
        return self._steps_since_refit

    @property
    def host_coefficients(self) -> tuple[float, npt.NDArray[np.float64]]:
        """``(slope, intercepts)`` as the host holds them (float64; reading them never touches
        the device). ``slope``/``intercepts`` are their float32 copies on ``device``."""
        return self._native.slope, self._native.intercepts

    def round_stats(self) -> RoundStatsDict | HistogramDict:
        """The open round's exact statistics as folded so far (``state_dict()["round_stats"]``
        of the native estimator: IRLS moments under vLLM's update, histograms under map; staged
        verdicts still in flight are not in it)."""
        return self._native.state_dict()["round_stats"]

    def on_refit(self, callback: Callable[[OnlineAcceptanceEstimator], None]) -> None:
        """Calls ``callback(self)`` after every refit (on the thread that runs :meth:`step`);
        warm restarts (:mod:`av_core.vllm.state`) save through it. A callback that raises is
        logged and dropped, never propagated into serving."""
        self._refit_listeners.append(callback)

    @property
    def staged(self) -> bool:
        """Whether :meth:`step` hands its verdicts over asynchronously (see the class doc)."""
        return self._staged

    def flush(self) -> None:
        """Fold every staged verdict now (waiting for copies in flight) and run a refit that is
        due. A no-op for host tensors. For shutdown, checkpoints and tests, not per step."""
        self._drain(wait=True)
        pending = self._refit_pending
        if pending is not None:
            self._refit_pending = None
            self._refit(end_round=pending == "end")

    def state_dict(self, *, flush: bool = True) -> dict[str, Any]:
        """Coefficients, this round's statistics and the schedule, after :meth:`flush`
        (``flush=False``: as folded so far, without waiting for verdicts in flight or running a
        refit that is due; what periodic checkpoints take on the serving thread)."""
        if flush:
            self.flush()
        return {
            "format": "av_core.vllm.OnlineAcceptanceEstimator",
            "estimator": self._native.state_dict(),
            "steps_since_refit": self._steps_since_refit,
            "refits": self._refits,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (pending verdicts are folded first)."""
        if not isinstance(state, Mapping) or state.get("format") != (
            "av_core.vllm.OnlineAcceptanceEstimator"
        ):
            raise InvalidValueError("state must come from OnlineAcceptanceEstimator.state_dict()")
        for key in ("estimator", "steps_since_refit", "refits"):
            if key not in state:
                raise InvalidValueError(
                    f"state has no {key!r} entry; it must come from state_dict()"
                )
        if not isinstance(state["estimator"], Mapping):
            raise InvalidValueError(
                f"state['estimator'] must be a mapping, got {type(state['estimator']).__name__}"
            )
        saved = dict(state["estimator"])
        if isinstance(saved.get("config"), Mapping):
            # Manual refits, as built here (a saved interval of 1 << 40 is the same estimator).
            saved["config"] = {**saved["config"], "refit_interval": None}
        # A state saved under the other update keeps its coefficients and starts a new round.
        native = AcceptanceEstimator.from_state_dict(saved, update=self.update)
        if native.num_positions != self.num_speculative_steps:
            raise InvalidValueError(
                f"state has {native.num_positions} positions, the estimator "
                f"{self.num_speculative_steps}"
            )
        # Python or numpy ints, as the native state accepts (a bool is a TypeError).
        steps = _check_int(state["steps_since_refit"], "state['steps_since_refit']", 0)
        refits = _check_int(state["refits"], "state['refits']", 0)
        self.flush()
        recorder = self._recorder
        with contextlib.nullcontext() if recorder is None else recorder.state_lock():
            self._native = native
            if recorder is not None:
                recorder.restored(native.state_dict()["round_stats"])
        self._steps_since_refit, self._refits = steps, refits
        self._upload()

    # ----------------------------------------------------------------------------------------
    # Internals

    def _advance(self) -> str | None:
        """Count one step; the refit due: ``"end"`` of a round (vLLM's schedule, every
        ``REFIT_INTERVAL`` steps), ``"within"`` (update ``"map"`` without a process group: after
        the 1st, 2nd, 4th, ... step of a round), or None."""
        self._steps_since_refit += 1
        pooled = self.process_group is not None
        due = refit_due(self._steps_since_refit, self.REFIT_INTERVAL, self.update, pooled)
        if due == "end":
            self._steps_since_refit = 0
        return due

    def _fold(
        self,
        features: npt.NDArray[np.float32],
        predictions: npt.NDArray[np.float32],
        idx_mapping: npt.NDArray[Any],
        num_sampled: npt.NDArray[Any],
        num_rejected: npt.NDArray[Any],
        skip_rows: npt.NDArray[np.bool_] | None,
    ) -> None:
        """Label the slots' stored drafts and add them to the round's statistics (host)."""
        k, m = self.num_speculative_steps, self.max_num_reqs
        idx = idx_mapping.astype(np.int64, copy=False)
        accepted = np.maximum(num_sampled.astype(np.int64) - 1, 0)
        admitted = np.minimum(accepted + np.maximum(num_rejected.astype(np.int64), 0), k)
        accepted = np.minimum(accepted, admitted)
        keep = (idx >= 0) & (idx < m) & (admitted > 0)
        if skip_rows is not None:
            keep &= ~skip_rows
        if not keep.any():
            return
        slots = idx[keep]
        x, p = features[slots], predictions[slots]
        accepted, admitted = accepted[keep], admitted[keep]
        try:
            self._native.observe(x, admitted, accepted, p, count_step=False)
            if self._recorder is not None:
                self._recorder.verdicts(p, accepted, admitted)
        except ValueError:
            # The core refuses non-finite features (a drafter row with no distribution) and
            # changes nothing; that must not stop serving. Drop the rows where such a value
            # would be learned from, neutralise it where it would not, and observe the rest.
            finite_x = np.isfinite(x)
            sane_p = (p >= 0.0) & (p <= 1.0)
            position = np.arange(k)
            labelled = (position <= accepted[:, None]) & (position < admitted[:, None])
            bad = ((~finite_x | ~sane_p) & labelled).any(axis=1)
            self.num_dropped_rows += int(bad.sum())
            accepted[bad] = 0
            admitted[bad] = 0
            sane = np.where(sane_p, p, np.float32(0.5))
            self._native.observe(
                np.where(finite_x, x, np.float32(0.0)), admitted, accepted, sane, count_step=False
            )
            if self._recorder is not None:
                self._recorder.verdicts(sane, accepted, admitted)

    def _new_event(self) -> _Event:
        if self.device.type == "cuda":
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(self.device))
            return event
        return _DoneEvent()

    def _stage(
        self,
        idx_mapping: torch.Tensor,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
        skip_rows: torch.Tensor | None,
    ) -> None:
        """Start the copies of the slots and this step's counts to host; no wait."""
        if not self._free:
            self._drain(wait=True, limit=1)
        buffers = self._free.pop()
        rows, m = idx_mapping.shape[0], self.max_num_reqs
        with torch.inference_mode():
            buffers.slots.copy_(self._slots, non_blocking=True)
            for name, tensor in (
                ("idx_mapping", idx_mapping),
                ("num_sampled", num_sampled),
                ("num_rejected", num_rejected),
                ("skip_rows", skip_rows),
            ):
                if tensor is not None:
                    host = buffers.vector(name, tensor, m, self._pin)
                    host[:rows].copy_(tensor, non_blocking=True)
        self._pending.append(_Staged(buffers, rows, skip_rows is not None, self._new_event()))

    def _drain(self, *, wait: bool, limit: int | None = None) -> None:
        """Fold staged steps in order while their copies have landed (or waiting for them)."""
        folded = 0
        while self._pending and (limit is None or folded < limit):
            entry = self._pending[0]
            if not entry.event.query():
                if not wait:
                    return
                with _sync_allowed():
                    entry.event.synchronize()
            self._pending.popleft()
            slots, vectors, rows = entry.buffers.slots.numpy(), entry.buffers.vectors, entry.rows
            m = self.max_num_reqs
            self._fold(
                slots[0, :m],
                slots[1, :m],
                vectors["idx_mapping"][:rows].numpy(),
                vectors["num_sampled"][:rows].numpy(),
                vectors["num_rejected"][:rows].numpy(),
                vectors["skip_rows"][:rows].numpy() if entry.has_skip else None,
            )
            self._free.append(entry.buffers)
            folded += 1

    def _refit(self, *, end_round: bool = True) -> None:
        """One damped Newton step on the round's statistics (then cleared), with the instance's
        L2 and DAMPING_OBSERVATIONS, on the round pooled over ``process_group`` if one is set;
        the new coefficients go to the device in place. (Update ``"map"``: the round's end, or
        with ``end_round=False`` a fit within it.)"""
        recorder = self._recorder
        # With metrics on, their fold must not read the round while it changes hands.
        with contextlib.nullcontext() if recorder is None else recorder.state_lock():
            native = self._native
            l2, damping = float(self.L2), float(self.DAMPING_OBSERVATIONS)
            if native.l2 != l2 or native.damping != damping:
                native.set_regularization(l2=l2, damping=damping)
            if not end_round:
                native.refit(end_round=False)
            else:
                own = None if recorder is None else native.state_dict()["round_stats"]
                if self.process_group is not None:
                    from av_core.distributed import pool_round

                    pool_round(native, self.process_group)
                if recorder is None:
                    native.refit()
                else:
                    recorder.round_closed(own, native.refit(report=True))
        self._refits += 1
        self._upload()
        for callback in list(self._refit_listeners):
            try:
                callback(self)
            except Exception:  # noqa: BLE001 - a listener must never stop serving
                logger.warning(
                    "av_core: refit listener %r failed; dropped", callback, exc_info=True
                )
                self._refit_listeners.remove(callback)

    def _upload(self) -> None:
        """Copy the native coefficients into ``slope``/``intercepts`` in place: a captured graph
        keeps reading the same storage and sees the new values."""
        if self._upload_event is not None and not self._upload_event.query():
            with _sync_allowed():
                self._upload_event.synchronize()
        host = self._coefficients_host
        with torch.inference_mode():
            host[0] = self._native.slope
            host[1:] = torch.from_numpy(self._native.intercepts)
            self.slope.copy_(host[:1], non_blocking=True)
            self.intercepts.copy_(host[1:], non_blocking=True)
        self._upload_event = self._new_event()
