"""Costs from SGLang's own start-up profiling: :class:`ProfilingCostAwarePolicy`, the
:class:`~av_core.sglang.policy.CostAwarePolicy` that SGLang main's ``AdaptiveController.
run_profiling`` measures decode steps for (its optional ``AdaptiveProfilingPolicy``), and the
plan it asks for (:class:`ProfilePlan`, :class:`ProfilePoint`, with the field names of SGLang's
``SpecProfilePlan`` and ``SpecProfilePoint``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from av_core._native import CostTables, InvalidTypeError, InvalidValueError
from av_core.sglang.policy import CostAwarePolicy, _batch_size, _steps_list, _steps_value


@dataclass(frozen=True)
class ProfilePoint:
    """One measurement the profiling policy asks SGLang's controller for (SGLang main's
    ``SpecProfilePoint``: the field names the controller reads)."""

    steps: int
    batch_size: int


@dataclass(frozen=True)
class ProfilePlan:
    """The measurements, as SGLang main's ``SpecProfilePlan``."""

    points: tuple[Any, ...]
    seq_len: int
    n_warmup: int
    n_measure: int


class ProfilingCostAwarePolicy(CostAwarePolicy):
    """:class:`CostAwarePolicy` that prices steps from SGLang's own start-up profiling (SGLang
    main's optional ``AdaptiveProfilingPolicy``: the controller's ``run_profiling`` activates
    each runtime state, times whole decode steps of each batch size on it and hands the
    milliseconds to :meth:`record_profile`, broadcast from tensor-parallel rank 0).

    A measured step is what SGLang runs: drafting, verification and the draft-extend pass of
    that runtime state and CUDA graph, so ``C(s)`` at a profiled batch size needs no model. A
    batch is priced at the CUDA-graph size it pads to (linear between profiled sizes, along the
    last segment past the largest, counted in ``counters.beyond_tables``). A tier whose
    candidates are not all profiled is priced from ``cost_tables`` when given (one cost source
    per decision), else only its profiled candidates are.

    ``profile_batch_sizes`` (default: every captured CUDA-graph size), ``max_profile_batch_size``,
    ``profile_warmup``, ``profile_measure`` and ``profile_seq_len`` shape the plan as SGLang's
    throughput-aware policy's ``profile_run_*`` settings do; ``plan_type``/``point_type``:
    SGLang's own ``SpecProfilePlan``/``SpecProfilePoint`` (default: :class:`ProfilePlan`,
    :class:`ProfilePoint`). Other keywords are :class:`CostAwarePolicy`'s."""

    _needs_tables = False

    def __init__(
        self,
        cost_tables: CostTables | None,
        candidate_steps: Sequence[int] | Mapping[int, Sequence[int]],
        *,
        profile_batch_sizes: Sequence[int] | None = None,
        max_profile_batch_size: int | None = None,
        profile_warmup: int = 5,
        profile_measure: int = 10,
        profile_seq_len: int = 128,
        plan_type: Callable[..., Any] = ProfilePlan,
        point_type: Callable[..., Any] = ProfilePoint,
        **options: Any,
    ) -> None:
        if profile_batch_sizes is not None:
            profile_batch_sizes = _steps_list(profile_batch_sizes, "profile_batch_sizes")
            if profile_batch_sizes[0] < 1:
                raise InvalidValueError(
                    f"profile_batch_sizes must hold sizes >= 1, got {profile_batch_sizes}"
                )
        for name, value, low in (
            ("max_profile_batch_size", max_profile_batch_size, 1),
            ("profile_warmup", profile_warmup, 0),
            ("profile_measure", profile_measure, 1),
            ("profile_seq_len", profile_seq_len, 1),
        ):
            if value is None and name == "max_profile_batch_size":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not callable(plan_type) or not callable(point_type):
            raise InvalidTypeError(
                "plan_type and point_type must be callables (SGLang's dataclasses)"
            )
        super().__init__(cost_tables, candidate_steps, **options)
        self._profile_sizes = profile_batch_sizes
        self._max_profile_batch = max_profile_batch_size
        self._profile_warmup = profile_warmup
        self._profile_measure = profile_measure
        self._profile_seq_len = profile_seq_len
        self._plan_type = plan_type
        self._point_type = point_type
        self._profile: dict[int, dict[int, float]] = {}

    # --- SGLang main's AdaptiveProfilingPolicy ------------------------------------------------

    def profile_plan(self, worker: Any, *, max_running_requests: int) -> Any:
        """The ``(steps, batch size)`` points to time: each candidate step at each captured
        CUDA-graph size whose tier may run it (up to ``max_running_requests``), with a synthetic
        context of ``profile_seq_len`` tokens clamped to the model's context length."""
        limit = _steps_value(max_running_requests, "max_running_requests")
        pool = list(self._graph_bs or [])
        if self._profile_sizes is not None:
            pool = [b for b in pool if b in self._profile_sizes]
        if self._max_profile_batch is not None:
            pool = [b for b in pool if b <= self._max_profile_batch]
        pool = [b for b in pool if 1 <= b <= limit]
        points = tuple(
            self._point_type(steps=s, batch_size=b)
            for s in self._union
            for b in pool
            if s in self._tiers[self._tier_key(b)]
        )
        if not points and self._tables is None:
            raise InvalidValueError(
                "av_core's SGLang policy has no cost tables and nothing to profile (no captured "
                "CUDA-graph batch size within max_running_requests and the profile settings): "
                "give it cost tables (AV_CORE_SGLANG_COSTS)"
            )
        seq_len = self._profile_seq_len
        context = getattr(getattr(worker, "model_config", None), "context_len", None)
        if isinstance(context, int) and not isinstance(context, bool):
            headroom = (self._profile_warmup + self._profile_measure) * (self._k + 1) + 16
            seq_len = max(1, min(seq_len, context - headroom))
        return self._plan_type(
            points=points,
            seq_len=seq_len,
            n_warmup=self._profile_warmup,
            n_measure=self._profile_measure,
        )

    def record_profile(self, batch_size: int, steps: int, avg_ms: float) -> None:
        """One measured decode step: ``avg_ms`` for ``batch_size`` requests at ``steps``."""
        batch = _batch_size(batch_size)
        step = _steps_value(steps, "steps")
        if batch < 1 or step not in self._union:
            raise InvalidValueError(
                f"record_profile: batch_size must be >= 1 and steps a candidate step "
                f"{self._union}, got batch_size={batch}, steps={step}"
            )
        if isinstance(avg_ms, bool) or not isinstance(avg_ms, int | float | np.number):
            raise InvalidTypeError(f"avg_ms must be a number, got {avg_ms!r}")
        if not (math.isfinite(float(avg_ms)) and float(avg_ms) > 0.0):
            raise InvalidValueError(f"avg_ms must be finite and > 0, got {avg_ms!r}")
        self._profile.setdefault(step, {})[batch] = float(avg_ms)

    def profile_summary(self) -> str:
        """What was measured, for SGLang's start-up log."""
        if not self._profile:
            return "av_core: nothing profiled (cost tables only)"
        parts = []
        for step in sorted(self._profile):
            points = self._profile[step]
            shown = ", ".join(f"{b}: {points[b]:.3f}" for b in sorted(points))
            parts.append(f"steps {step}: {{{shown}}} ms")
        return "av_core cost-aware policy, measured decode steps: " + "; ".join(parts)

    @property
    def profile(self) -> dict[int, dict[int, float]]:
        """``{steps: {batch size: ms}}`` as recorded."""
        return {step: dict(points) for step, points in self._profile.items()}

    # --- pricing ------------------------------------------------------------------------------

    def _step_costs(self, batch: int, allowed: Sequence[int]) -> dict[int, float]:
        measured = [s for s in allowed if s in self._profile]
        if self._tables is not None and len(measured) < len(allowed):
            return super()._step_costs(batch, allowed)
        padded = self._padded(batch)
        return {s: self._measured_ms(self._profile[s], padded) for s in measured}

    def _beyond(self, batch: int, allowed: Sequence[int]) -> bool:
        measured = [s for s in allowed if s in self._profile]
        if self._tables is not None and len(measured) < len(allowed):
            return super()._beyond(batch, allowed)
        padded = self._padded(batch)
        return any(padded > max(self._profile[s]) for s in measured)

    @staticmethod
    def _measured_ms(points: Mapping[int, float], batch: int) -> float:
        """Linear in the batch size between measured sizes; flat below the smallest; along the
        last segment (never falling) past the largest."""
        sizes = sorted(points)
        ms = [points[b] for b in sizes]
        if batch <= sizes[0]:
            return ms[0]
        if batch > sizes[-1]:
            slope = 0.0
            if len(sizes) > 1:
                slope = max((ms[-1] - ms[-2]) / (sizes[-1] - sizes[-2]), 0.0)
            return ms[-1] + (batch - sizes[-1]) * slope
        return float(np.interp(batch, sizes, ms))
