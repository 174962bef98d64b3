"""Drop-in replacements for vLLM's adaptive-verification pieces (0.32.x, 0.33.0), backed by av_core.

vLLM ships adaptive verification in ``vllm/v1/worker/gpu/spec_decode/``: an online acceptance
estimator (``acceptance_estimator.OnlineAcceptanceEstimator``) and the budget logic
(``adaptive_verification.build_cost_tables_from_curves``, ``_assign_draft_token_budget`` and
``AdaptiveVerificationManager.get_num_tokens``). This module mirrors their signatures, tensor
layouts and meaning, so :mod:`av_core.vllm_plugin` can swap them in without a fork:

- :class:`OnlineAcceptanceEstimator`: same constructor, ``step`` and ``predict``; the feature and
  the predictions are computed on the logits' device, the statistics and the Newton refit run in
  av_core's Rust estimator on the host. Its fixed-point statistics are order-independent, so every
  tensor-parallel rank fits bit-identical coefficients from the same verdicts, with no collective.
- :func:`build_cost_tables_from_curves`, :func:`assign_draft_token_budget` and
  :func:`batch_draft_budget` (the arithmetic of ``get_num_tokens``), on av_core's Rust planner.

torch is required (``pip install "av_core[torch]"``); vLLM is not: nothing here imports it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

try:
    import torch
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError(
        'av_core.vllm needs PyTorch, an optional dependency: pip install "av_core[torch]"'
    ) from error

from av_core import vllm_metrics
from av_core._native import AcceptanceEstimator
from av_core.features import (
    MAX_FEATURE_ENTRIES,
    _check_device,
    _check_integer_tensor,
    _dense,
    _snapshot,
    draft_log_odds,
)

__all__ = [
    "DAMPING_OBSERVATIONS",
    "ENV_EXACT",
    "INIT_INTERCEPT",
    "INIT_SLOPE",
    "L2",
    "MAX_LOG_ODDS",
    "REFIT_INTERVAL",
    "VLLM_VERSION",
    "BatchDraftBudget",
    "CostTablePair",
    "OnlineAcceptanceEstimator",
    "assign_draft_token_budget",
    "batch_draft_budget",
    "build_cost_tables_from_curves",
    "gpu_selfcheck",
]

#: The newest vLLM release whose interfaces this module mirrors (every release the plugin
#: accepts: ``av_core.vllm_plugin.SUPPORTED_VLLM_VERSIONS``).
VLLM_VERSION = "0.33.0"

# vLLM 0.33.0's constants (acceptance_estimator.py), mirrored so results agree. The cold start is
# the median fit across five model pairs there; the damping n / (n + 50) replaces a hard
# minimum-sample gate; the ridge keeps the Newton system positive definite.
MAX_LOG_ODDS = 40.0
INIT_SLOPE = 0.5
INIT_INTERCEPT = -0.2
REFIT_INTERVAL = 100
DAMPING_OBSERVATIONS = 50.0
L2 = 1e-3

#: ``AV_CORE_VLLM_EXACT=1``: refit with vLLM's unbounded update (no step or range limits), the
#: default of the ``exact`` keyword (docs/vllm.md, "Deviations from vLLM").
ENV_EXACT = "AV_CORE_VLLM_EXACT"
#: ``AV_CORE_VLLM_ESTIMATOR=map``: refit with av_core's own update (docs/estimator.md) instead of
#: vLLM's, the default of the ``update`` keyword (docs/vllm.md, "av_core's update").
ENV_ESTIMATOR = "AV_CORE_VLLM_ESTIMATOR"

logger = logging.getLogger("vllm.av_core")

# The native estimator never refits on its own: the schedule runs here, from the instance's
# REFIT_INTERVAL, so that it can be changed on a live instance as in vLLM.
_NATIVE_NEVER_REFITS = 1 << 40
# Steps whose verdicts may be in flight to the host at once (CUDA). A full ring waits for the
# oldest copy, which was issued this many steps earlier and has long landed in practice.
_STAGING_DEPTH = 4


# --------------------------------------------------------------------------------------------
# Argument checks


def _check_tensor(value: object, name: str) -> torch.Tensor:
    """A dense tensor argument, read as the values it stands for (a lazily negated view is
    resolved: the host copies below read memory)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return _dense(value, name)


def _check_int_tensor(value: object, name: str) -> torch.Tensor:
    """An integer tensor argument; a host one as a private copy, so that the entries checked
    are the entries used even if another thread writes the caller's tensor meanwhile."""
    return _snapshot(_check_integer_tensor(value, name))


def _check_output(value: torch.Tensor, name: str) -> torch.Tensor:
    """A tensor written in place: resolving a lazy view would write to a copy, so refuse it."""
    if value.is_neg() or value.is_conj() or value.layout != torch.strided:
        raise ValueError(f"{name} is written in place: pass a plain tensor, not a negated view")
    return value


def _check_vector(
    value: object, name: str, length: int, *, integer: bool = True, longer_ok: bool = False
) -> torch.Tensor:
    """A 1-D tensor of ``length`` entries; with ``longer_ok``, its first ``length`` entries of a
    longer one (vLLM's kernels read per-request buffers that may be padded past the batch)."""
    tensor = _check_int_tensor(value, name) if integer else _check_tensor(value, name)
    size = tensor.shape[0] if tensor.dim() == 1 else -1
    if size == length or (longer_ok and size > length):
        return tensor[:length]
    wanted = f">= {length}" if longer_ok else f"{length}"
    raise ValueError(f"{name} must have shape [{wanted}], got shape {tuple(tensor.shape)}")


def _check_positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _check_setting(value: object, name: str, *, integer: bool = False) -> None:
    """An instance setting (vLLM lets a caller change them on a live instance): checked before a
    step changes anything, so a bad one is refused without advancing the schedule."""
    if integer:
        _check_positive_int(value, name)
        return
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        number = float("inf")
    if not (np.isfinite(number) and number >= 0.0):
        raise ValueError(f"{name} must be finite and non-negative, got {value!r}")


def _check_range_on_host(tensor: torch.Tensor, name: str, low: int, high: int) -> None:
    """Entries in [low, high), checked only for host tensors: on a device it would synchronise."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return
    smallest, largest = int(tensor.min()), int(tensor.max())
    if smallest < low or largest >= high:
        bad = smallest if smallest < low else largest
        raise ValueError(f"{name} entries must lie in [{low}, {high}), got {bad}")


def _sync_allowed() -> contextlib.AbstractContextManager[Any]:
    """vLLM's ``gpu_sync_allowed()`` when running inside vLLM, so the rare deliberate wait on a
    staged copy is not reported by ``VLLM_GPU_SYNC_CHECK``; a no-op elsewhere."""
    if "vllm" in sys.modules:
        try:
            from vllm.utils.gpu_sync_debug import gpu_sync_allowed  # type: ignore[import-not-found]
        except Exception:  # noqa: BLE001 - any vLLM without the helper simply does not check
            return contextlib.nullcontext()
        return gpu_sync_allowed()  # type: ignore[no-any-return]
    return contextlib.nullcontext()


# --------------------------------------------------------------------------------------------
# Staging of graded drafts to the host


class _Event(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class _DoneEvent:
    """The event of a copy that was synchronous (host tensors): always complete."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


@dataclass
class _HostBuffers:
    """One ring entry: a host copy of every slot's features and predictions, and the step's
    per-row request index and counts. Pinned on CUDA so the copies are asynchronous DMAs."""

    slots: torch.Tensor  # [2, max_num_reqs + 1, K] float32: features, predictions
    vectors: dict[str, torch.Tensor] = field(default_factory=dict)

    def vector(self, name: str, like: torch.Tensor, capacity: int, pin: bool) -> torch.Tensor:
        held = self.vectors.get(name)
        if held is None or held.dtype != like.dtype:
            held = torch.empty(capacity, dtype=like.dtype, pin_memory=pin)
            self.vectors[name] = held
        return held


@dataclass
class _Staged:
    buffers: _HostBuffers
    rows: int
    has_skip: bool
    event: _Event


# --------------------------------------------------------------------------------------------
# The estimator


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
            raise ValueError(
                f"max_num_reqs x num_speculative_steps must stay within {MAX_FEATURE_ENTRIES} "
                f"slots (av_core.features.MAX_FEATURE_ENTRIES), got {self.max_num_reqs} x "
                f"{self.num_speculative_steps}"
            )
        if staged is not None and not isinstance(staged, bool):
            raise TypeError(f"staged must be a bool or None, got {type(staged).__name__}")
        self.device = _check_device(device)
        if exact is None:
            exact = os.environ.get(ENV_EXACT, "").strip().lower() in ("1", "true", "yes")
        self.exact = bool(exact)
        if update is None:
            update = os.environ.get(ENV_ESTIMATOR, "").strip().lower() or "vllm"
        if update not in ("vllm", "map"):
            raise ValueError(
                f"update must be 'vllm' or 'map' (or set {ENV_ESTIMATOR}), got {update!r}"
            )
        if update == "map" and self.exact:
            raise ValueError(
                f"exact (vLLM's unbounded refit) applies to update='vllm' only; {ENV_EXACT} or "
                "exact=True cannot be combined with update='map'"
            )
        self.update = update
        self.process_group = process_group
        self._staged = self.device.type == "cuda" if staged is None else staged
        self._pin = self.device.type == "cuda"
        self._steps_since_refit = 0
        self._refits = 0
        self._refit_pending: str | None = None
        self.num_dropped_rows = 0
        self._refit_listeners: list[Callable[[OnlineAcceptanceEstimator], None]] = []
        m, k = self.max_num_reqs, self.num_speculative_steps

        unbounded: dict[str, Any] = {
            "max_step": math.inf,
            "max_slope": math.inf,
            "max_intercept": math.inf,
        }
        # vLLM's memoryless update, whatever av_core's defaults; or av_core's own, whole.
        own: dict[str, Any] = {"memory": 0.0} if update == "vllm" else {}
        self._native = AcceptanceEstimator(
            k,
            refit_interval=_NATIVE_NEVER_REFITS,
            damping=float(self.DAMPING_OBSERVATIONS),
            l2=float(self.L2),
            init_slope=INIT_SLOPE,
            init_intercept=INIT_INTERCEPT,
            max_log_odds=MAX_LOG_ODDS,
            update=update,
            **own,
            **(unbounded if self.exact else {}),
        )
        try:
            self.slope = torch.full((1,), INIT_SLOPE, dtype=torch.float32, device=self.device)
            self.intercepts = torch.full(
                (k,), INIT_INTERCEPT, dtype=torch.float32, device=self.device
            )
            # Features (plane 0) and draft-time predictions (plane 1) by request slot, plus one
            # spare row that padded rows (request index -1) write to, so no write needs a mask
            # on the host.
            self._slots = torch.zeros(2, m + 1, k, dtype=torch.float32, device=self.device)
        except (RuntimeError, AssertionError) as error:  # an absent or exhausted device
            raise ValueError(
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
        # Metrics (av_core.vllm_metrics): None unless AV_CORE_METRICS_PORT or
        # PROMETHEUS_MULTIPROC_DIR is set, and then only host arrays are recorded.
        self._recorder: Any = _metrics_recorder(self)

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
            raise ValueError(f"idx_mapping must be 1-D, got shape {tuple(idx_mapping.shape)}")
        rows = idx_mapping.shape[0]
        if rows > self.max_num_reqs:
            raise ValueError(
                f"idx_mapping must have at most max_num_reqs = {self.max_num_reqs} rows, got {rows}"
            )
        num_sampled = _check_vector(num_sampled, "num_sampled", rows, longer_ok=True)
        num_rejected = _check_vector(num_rejected, "num_rejected", rows, longer_ok=True)
        if skip_rows is not None:
            skip_rows = _check_vector(skip_rows, "skip_rows", rows, integer=False, longer_ok=True)
            if skip_rows.dtype != torch.bool:
                raise TypeError(f"skip_rows must have dtype torch.bool, got {skip_rows.dtype}")
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
            raise ValueError(f"logits must have shape [N, V], got shape {tuple(logits.shape)}")
        n = logits.shape[0]
        k, m = self.num_speculative_steps, self.max_num_reqs
        idx_mapping = _check_vector(idx_mapping, "idx_mapping", n, longer_ok=True)
        if isinstance(draft_step, int | np.integer) and not isinstance(draft_step, bool):
            if not 0 <= draft_step < k:
                raise ValueError(f"draft_step must lie in [0, {k}), got {draft_step}")
            draft_step = torch.tensor(int(draft_step), device=self.device)
        draft_step = _check_int_tensor(draft_step, "draft_step")
        per_row = draft_step.dim() > 0
        if per_row and (draft_step.dim() != 1 or draft_step.shape[0] < n):
            raise ValueError(
                f"draft_step must be 0-d or have shape [>= {n}], got shape "
                f"{tuple(draft_step.shape)}"
            )
        if per_row:
            draft_step = draft_step[:n]
        if not isinstance(confidence_probs, torch.Tensor):
            raise TypeError(
                f"confidence_probs must be a torch.Tensor, got {type(confidence_probs).__name__}"
            )
        confidence_probs = _check_output(confidence_probs, "confidence_probs")
        if confidence_probs.dim() != 2 or confidence_probs.shape[1] < k:
            raise ValueError(
                f"confidence_probs must have shape [B, >= {k}], got shape "
                f"{tuple(confidence_probs.shape)}"
            )
        if not confidence_probs.dtype.is_floating_point:
            raise TypeError(
                f"confidence_probs must be a float tensor, got dtype {confidence_probs.dtype}"
            )
        temperature = _check_tensor(temperature, "temperature")
        if temperature.dim() != 1 or temperature.shape[0] < m:
            raise ValueError(
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
                raise ValueError(f"{name} must be on {self.device}, got {tensor.device}")
        _check_range_on_host(idx_mapping, "idx_mapping", -1, m)
        _check_range_on_host(draft_step, "draft_step", 0, k)
        rows = confidence_probs.shape[0]
        if idx_mapping.device.type == "cpu" and n:
            live = torch.nonzero(idx_mapping >= 0).squeeze(1)
            last = int(live.max()) if live.numel() else -1
            if per_row:
                last //= k
            if last >= rows:
                raise ValueError(
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

    def round_stats(self) -> dict[str, Any]:
        """The open round's exact statistics as folded so far (``state_dict()["round_stats"]``
        of the native estimator; staged verdicts still in flight are not in it)."""
        return self._native.state_dict()["round_stats"]  # type: ignore[no-any-return]

    def on_refit(self, callback: Callable[[OnlineAcceptanceEstimator], None]) -> None:
        """Calls ``callback(self)`` after every refit (on the thread that runs :meth:`step`);
        warm restarts (:mod:`av_core.vllm_state`) save through it. A callback that raises is
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
            raise ValueError("state must come from OnlineAcceptanceEstimator.state_dict()")
        for key in ("estimator", "steps_since_refit", "refits"):
            if key not in state:
                raise ValueError(f"state has no {key!r} entry; it must come from state_dict()")
        if not isinstance(state["estimator"], Mapping):
            raise ValueError(
                f"state['estimator'] must be a mapping, got {type(state['estimator']).__name__}"
            )
        # A state saved under the other update keeps its coefficients and starts a new round.
        native = AcceptanceEstimator.from_state_dict(dict(state["estimator"]), update=self.update)
        if native.num_positions != self.num_speculative_steps:
            raise ValueError(
                f"state has {native.num_positions} positions, the estimator "
                f"{self.num_speculative_steps}"
            )
        steps, refits = state["steps_since_refit"], state["refits"]
        for name, value in (("steps_since_refit", steps), ("refits", refits)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"state[{name!r}] must be an int >= 0, got {value!r}")
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
        steps = self._steps_since_refit
        if steps >= self.REFIT_INTERVAL:
            self._steps_since_refit = 0
            return "end"
        if self.update == "map" and self.process_group is None and steps & (steps - 1) == 0:
            return "within"
        return None

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
                state = native.state_dict()
                state["config"] = {**state["config"], "l2": l2, "damping": damping}
                native = self._native = AcceptanceEstimator.from_state_dict(state)
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


def _metrics_recorder(estimator: OnlineAcceptanceEstimator) -> Any:
    """The estimator's metrics recorder, or None when metrics are off (or cannot start)."""
    if not vllm_metrics.enabled():
        return None
    device = estimator.device
    try:
        metrics = vllm_metrics.process_metrics(device.index if device.type == "cuda" else None)
    except ImportError as error:
        logger.warning("av_core: metrics are off: %s", error)
        return None
    if metrics is None:
        return None
    return metrics.recorder(estimator, estimator.num_speculative_steps)


# --------------------------------------------------------------------------------------------
# Budget helpers


def _planner(*names: str) -> tuple[Any, ...]:
    """The Rust planner's entry points, from the compiled module (an older build lacks them)."""
    from av_core import _native

    missing = [name for name in names if not hasattr(_native, name)]
    if missing:
        raise ImportError(
            f"this build of av_core lacks the planner ({', '.join(missing)}); rebuild av_core"
        )
    return tuple(getattr(_native, name) for name in names)


class CostTablePair(tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]):
    """``(draft_ms, verify_ms)`` as vLLM holds its cost tables, carrying the native
    ``av_core.CostTables`` they came from so the budget does not rebuild it every step."""

    native: Any

    def __new__(
        cls, draft_ms: npt.NDArray[np.float64], verify_ms: npt.NDArray[np.float64], native: Any
    ) -> CostTablePair:
        pair = super().__new__(cls, (draft_ms, verify_ms))
        pair.native = native
        return pair

    def __getnewargs__(self) -> tuple[Any, ...]:
        return (self[0], self[1], self.native)


def build_cost_tables_from_curves(
    draft_curve: list[tuple[int, float]],
    verify_curve: list[tuple[int, float]],
    max_num_reqs: int,
    max_batch_tokens: int,
    cudagraph_limit: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's ``build_cost_tables_from_curves``: dense ``(draft_ms, verify_ms)`` tables.

    Costs take their running maximum; up to ``cudagraph_limit`` a size is charged at the next
    profiled size (captured graphs pad to it, so cost is a step function); above it costs are
    interpolated between profiled points above the limit (crossing it loses the graphs, a real
    jump); past the last point the last segment is extended. Draft entries are floored at 0,
    verify entries at 1e-6. Computed by ``av_core.CostTables.from_curves``.
    """
    (cost_tables,) = _planner("CostTables")
    native = cost_tables.from_curves(
        _curve_points(draft_curve, "draft_curve"),
        _curve_points(verify_curve, "verify_curve"),
        max_num_reqs=max_num_reqs,
        max_batch_tokens=max_batch_tokens,
        cudagraph_limit=cudagraph_limit,
    )
    draft_ms = np.asarray(native.draft_ms, dtype=np.float64)
    verify_ms = np.asarray(native.verify_ms, dtype=np.float64)
    return CostTablePair(draft_ms, verify_ms, native)


def _curve_points(curve: object, name: str) -> list[tuple[float, float]]:
    """``[(size, ms), ...]`` as float pairs; ranges are the core's to check."""
    if isinstance(curve, str | bytes) or not isinstance(curve, Sequence):
        raise TypeError(f"{name} must be a list of (size, ms) pairs, got {type(curve).__name__}")
    points: list[tuple[float, float]] = []
    for index, point in enumerate(curve):
        if isinstance(point, str | bytes) or not isinstance(point, Sequence) or len(point) != 2:
            raise TypeError(f"{name}[{index}] must be a (size, ms) pair, got {point!r}")
        pair: list[float] = []
        for value in point:
            if isinstance(value, bool) or not isinstance(
                value, int | float | np.integer | np.floating
            ):
                raise TypeError(f"{name}[{index}] must hold numbers, got {point!r}")
            try:
                pair.append(float(value))
            except OverflowError:
                raise ValueError(
                    f"{name}[{index}] must hold finite numbers, got {point!r}"
                ) from None
        points.append((pair[0], pair[1]))
    return points


def _native_cost_tables(cost_tables: Any) -> Any:
    native = getattr(cost_tables, "native", None)
    if native is not None:
        return native
    (cost_tables_type,) = _planner("CostTables")
    if isinstance(cost_tables, cost_tables_type):
        return cost_tables
    if isinstance(cost_tables, tuple) and len(cost_tables) == 2:
        tables = []
        for name, table in zip(("draft_ms", "verify_ms"), cost_tables, strict=True):
            try:
                tables.append(np.ascontiguousarray(table, dtype=np.float64))
            except (ValueError, TypeError, OverflowError) as error:
                raise ValueError(
                    f"cost_tables: {name} must be a 1-D array of numbers ({error})"
                ) from None
        return cost_tables_type(tables[0], tables[1])
    raise TypeError(
        "cost_tables must be av_core.CostTables or a (draft_ms, verify_ms) pair, got "
        f"{type(cost_tables).__name__}"
    )


def assign_draft_token_budget(
    confidence_probs: torch.Tensor,
    idx_mapping: torch.Tensor,
    capacities: torch.Tensor,
    draft_budget: int,
    num_steps: int,
) -> None:
    """vLLM's ``_assign_draft_token_budget``: admit the ``draft_budget`` best draft slots.

    Slot ``(r, k)`` scores its survival ``prod_{j <= k} confidence_probs[idx_mapping[r], j]``,
    the probability that the target accepts it; slots with ``k >= capacities[r]`` are not
    eligible. The highest scores win, ties to the shallower position and then the lower row, so
    the winners are a prefix of each request. ``capacities`` enters holding each request's
    scheduled drafts and leaves holding its admitted count, in place; the counts sum to
    ``min(draft_budget, capacities.sum())``.

    Host tensors go through av_core's Rust planner; device tensors through its torch assignment,
    which reads nothing back to the host.
    """
    confidence_probs = _check_tensor(confidence_probs, "confidence_probs")
    num_steps = _check_positive_int(num_steps, "num_steps")
    if confidence_probs.dim() != 2 or confidence_probs.shape[1] < num_steps:
        raise ValueError(
            f"confidence_probs must have shape [S, >= {num_steps}], got shape "
            f"{tuple(confidence_probs.shape)}"
        )
    if not confidence_probs.dtype.is_floating_point:
        raise TypeError(
            f"confidence_probs must be a float tensor, got dtype {confidence_probs.dtype}"
        )
    idx_mapping = _check_int_tensor(idx_mapping, "idx_mapping")
    if idx_mapping.dim() != 1:
        raise ValueError(f"idx_mapping must be 1-D, got shape {tuple(idx_mapping.shape)}")
    if isinstance(capacities, torch.Tensor):
        _check_output(capacities, "capacities")
    output = capacities
    # A private copy on the host (checked, then used); the result goes into the caller's tensor.
    capacities = _check_vector(capacities, "capacities", idx_mapping.shape[0])
    if isinstance(draft_budget, bool) or not isinstance(draft_budget, int | np.integer):
        raise TypeError(f"draft_budget must be an int, got {type(draft_budget).__name__}")
    if draft_budget < 0:
        raise ValueError(f"draft_budget must be >= 0, got {draft_budget}")
    _check_range_on_host(idx_mapping, "idx_mapping", 0, confidence_probs.shape[0])
    _check_range_on_host(capacities, "capacities", 0, num_steps + 1)
    # A budget beyond every slot admits every slot: capped, it fits any integer type.
    budget = min(int(draft_budget), idx_mapping.shape[0] * num_steps)
    with torch.inference_mode():
        confidences = confidence_probs[idx_mapping.to(torch.int64), :num_steps]
        if capacities.device.type == "cpu" and confidences.device.type == "cpu":
            (assign,) = _planner("assign_draft_budget")
            admitted = assign(
                # float64 holds every float dtype exactly (numpy has no bfloat16).
                np.ascontiguousarray(confidences.to(torch.float64).numpy()),
                capacities.numpy().astype(np.int64),
                budget,
            )
            output.copy_(torch.from_numpy(np.asarray(admitted)))
            return
        admitted_t = _assign_on_device(confidences, capacities, budget)
        output.copy_(admitted_t)


def _assign_on_device(
    confidences: torch.Tensor, capacities: torch.Tensor, budget: int
) -> torch.Tensor:
    """The assignment in torch ops that read nothing back to the host (graph-safe), with the
    Rust planner's rule and counts (:func:`av_core.planner_torch.assign_draft_budget_torch`)."""
    from av_core.planner_torch import assign_draft_budget_torch

    return assign_draft_budget_torch(confidences, capacities, budget).to(capacities.dtype)


_INT64_MAX = 2**63 - 1


def _check_count(value: object, name: str) -> int:
    """A non-negative int of any size (token counts), as a Python int."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def _draft_count(draft_tokens: Mapping[str, Sequence[int]], req_id: str) -> int:
    tokens = draft_tokens.get(req_id, ())
    try:
        return len(tokens)
    except TypeError:
        raise TypeError(
            f"draft_tokens[{req_id!r}] must be a sequence of tokens, got {type(tokens).__name__}"
        ) from None


def _slot_of(req_id_to_index: Mapping[str, int], req_id: str, num_slots: int) -> int:
    if req_id not in req_id_to_index:
        raise ValueError(f"req_id_to_index has no slot for request {req_id!r}")
    slot = req_id_to_index[req_id]
    name = f"req_id_to_index[{req_id!r}]"
    if isinstance(slot, bool) or not isinstance(slot, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(slot).__name__}")
    if not 0 <= slot < num_slots:
        raise ValueError(
            f"{name} must lie in [0, {num_slots}) (stale_confidences rows), got {slot}"
        )
    return int(slot)


def _per_slot(value: object, name: str) -> npt.NDArray[Any]:
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as error:
        raise ValueError(f"{name} must be a 1-D integer array: {error}") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one per slot), got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    return array


class BatchDraftBudget(NamedTuple):
    """What vLLM's ``get_num_tokens`` computes for one step.

    ``num_tokens`` is the step's token count after trimming (what it returns);
    ``(num_drafts_per_req, num_non_draft_tokens_per_req, draft_budget)`` is what it stashes in
    ``AdaptiveVerificationManager._batch_budget`` for the compaction that follows.
    """

    num_tokens: int
    draft_budget: int
    num_drafts_per_req: dict[str, int]
    num_non_draft_tokens_per_req: dict[str, int]


def batch_draft_budget(
    num_tokens_per_req: Mapping[str, int],
    draft_tokens: Mapping[str, Sequence[int]],
    *,
    req_id_to_index: Mapping[str, int],
    stale_confidences: npt.NDArray[Any],
    num_computed_tokens: npt.NDArray[Any],
    prefill_len: npt.NDArray[Any],
    cost_tables: Any,
    max_total_logits: int,
    num_bonus_tokens: int,
) -> BatchDraftBudget:
    """The draft budget of one step, from the inputs of vLLM's ``get_num_tokens``.

    With ``R`` requests, ``T`` scheduled non-draft tokens, ``s`` requests that sample a token
    whatever the budget (computed + non-draft tokens reach the prefill length), and the
    survivals of every scheduled draft slot from the *previous* step's confidences (so the
    budget never reads this step's drafts: lossless for autoregressive drafters), sorted
    descending: ``E(b) = s + sum_{j <= b} score_j``, ``C(b) = draft_ms[R] + verify_ms[T + b]``,
    and the budget is the first ``b`` maximising ``E(b) / C(b)``, up to
    ``min(scheduled drafts, max_total_logits - R * num_bonus_tokens)`` (the sampler verifies the
    logits in one chunk). Computed by ``av_core.choose_draft_budget``.

    Args:
        num_tokens_per_req: scheduled tokens per request id, in batch order.
        draft_tokens: scheduled draft tokens per request id (absent: none).
        req_id_to_index: request id to request-state slot.
        stale_confidences: ``[max_num_reqs, K]`` confidences by slot from the previous step.
        num_computed_tokens, prefill_len: per slot.
        cost_tables: what :func:`build_cost_tables_from_curves` returned, a
            ``(draft_ms, verify_ms)`` pair, or an ``av_core.CostTables``.
        max_total_logits, num_bonus_tokens: the sampler's logits cap and bonus tokens per request.
    """
    metrics = vllm_metrics.current()
    if metrics is None:
        return _batch_draft_budget(
            num_tokens_per_req,
            draft_tokens,
            req_id_to_index,
            stale_confidences,
            num_computed_tokens,
            prefill_len,
            cost_tables,
            max_total_logits,
            num_bonus_tokens,
        )
    started = time.perf_counter()
    plan = _batch_draft_budget(
        num_tokens_per_req,
        draft_tokens,
        req_id_to_index,
        stale_confidences,
        num_computed_tokens,
        prefill_len,
        cost_tables,
        max_total_logits,
        num_bonus_tokens,
    )
    cost = _predicted_cost_ms(cost_tables, len(num_tokens_per_req), plan.num_tokens)
    metrics.host_time(vllm_metrics.BUDGET, time.perf_counter() - started)
    metrics.budget_chosen(plan.draft_budget, cost)
    return plan


def _predicted_cost_ms(cost_tables: Any, num_reqs: int, num_tokens: int) -> float | None:
    """``draft_ms[R] + verify_ms[T + b]``: the planner's cost of the step it chose (metrics)."""
    if isinstance(cost_tables, tuple) and len(cost_tables) == 2:
        draft_ms, verify_ms = cost_tables
    else:
        native = _native_cost_tables(cost_tables)
        draft_ms, verify_ms = native.draft_ms, native.verify_ms
    if num_reqs >= len(draft_ms) or num_tokens >= len(verify_ms):
        return None
    return float(draft_ms[num_reqs]) + float(verify_ms[num_tokens])


def _batch_draft_budget(
    num_tokens_per_req: Mapping[str, int],
    draft_tokens: Mapping[str, Sequence[int]],
    req_id_to_index: Mapping[str, int],
    stale_confidences: npt.NDArray[Any],
    num_computed_tokens: npt.NDArray[Any],
    prefill_len: npt.NDArray[Any],
    cost_tables: Any,
    max_total_logits: int,
    num_bonus_tokens: int,
) -> BatchDraftBudget:
    if not isinstance(num_tokens_per_req, Mapping):
        raise TypeError(
            f"num_tokens_per_req must be a mapping, got {type(num_tokens_per_req).__name__}"
        )
    for name, mapping in (("draft_tokens", draft_tokens), ("req_id_to_index", req_id_to_index)):
        if not isinstance(mapping, Mapping):
            raise TypeError(f"{name} must be a mapping, got {type(mapping).__name__}")
    max_total_logits = _check_count(max_total_logits, "max_total_logits")
    num_bonus_tokens = _check_count(num_bonus_tokens, "num_bonus_tokens")
    req_ids = list(num_tokens_per_req)
    num_reqs = len(req_ids)
    tokens_list = [
        _check_count(num_tokens_per_req[req_id], f"num_tokens_per_req[{req_id!r}]")
        for req_id in req_ids
    ]
    drafts_list = [_draft_count(draft_tokens, req_id) for req_id in req_ids]
    for req_id, tokens, drafts in zip(req_ids, tokens_list, drafts_list, strict=True):
        if tokens < drafts:
            raise ValueError(
                f"num_tokens_per_req[{req_id!r}] = {tokens} is less than its {drafts} draft tokens"
            )
    if sum(tokens_list) > _INT64_MAX:
        raise ValueError(
            f"num_tokens_per_req: {sum(tokens_list)} tokens in all exceed int64 (2**63 - 1)"
        )
    non_draft_list = [t - d for t, d in zip(tokens_list, drafts_list, strict=True)]
    num_drafts_per_req = dict(zip(req_ids, drafts_list, strict=True))
    num_non_draft_per_req = dict(zip(req_ids, non_draft_list, strict=True))
    # Python integers: a sum of int64 entries could wrap.
    total_non_draft = sum(non_draft_list)
    total_drafts = sum(drafts_list)
    max_draft_budget = min(total_drafts, max(0, max_total_logits - num_reqs * num_bonus_tokens))
    if max_draft_budget == 0:
        budget = 0
    else:
        stale = np.asarray(stale_confidences)
        if stale.ndim != 2:
            raise ValueError(
                f"stale_confidences must have shape [max_num_reqs, K], got shape {stale.shape}"
            )
        computed = _per_slot(num_computed_tokens, "num_computed_tokens")
        prefill = _per_slot(prefill_len, "prefill_len")
        slots = np.asarray(
            [_slot_of(req_id_to_index, req_id, stale.shape[0]) for req_id in req_ids],
            dtype=np.int64,
        )
        for name, array in (("num_computed_tokens", computed), ("prefill_len", prefill)):
            if slots.size and array.shape[0] <= int(slots.max()):
                raise ValueError(
                    f"{name} has {array.shape[0]} entries, slot {int(slots.max())} is used"
                )
        # Compared as Python integers: computed + non-draft tokens can exceed int64.
        num_sampling = sum(
            int(computed[slot]) + non_draft >= int(prefill[slot])
            for slot, non_draft in zip(slots.tolist(), non_draft_list, strict=True)
        )
        (choose,) = _planner("choose_draft_budget")
        budget = int(
            choose(
                np.ascontiguousarray(stale[slots]),
                np.asarray(drafts_list, dtype=np.int64),
                num_non_draft_tokens=total_non_draft,
                num_sampling_requests=num_sampling,
                cost_tables=_native_cost_tables(cost_tables),
                max_draft_budget=max_draft_budget,
            )
        )
    return BatchDraftBudget(
        total_non_draft + budget, budget, num_drafts_per_req, num_non_draft_per_req
    )


# --------------------------------------------------------------------------------------------
# GPU self-check


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
    """The staged estimator with metrics recording (av_core.vllm_metrics) under
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
        return {
            "ok": sync_error is None and est.num_refits == steps // 25,
            "no_blocking_sync": sync_error is None,
            **({} if sync_error is None else {"sync_error": sync_error}),
            "refits": est.num_refits,
            "open_round_drafts": int(sum(est.round_stats()["n"])),
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
