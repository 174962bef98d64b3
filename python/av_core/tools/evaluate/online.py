"""The prequential replay of the online estimator (:func:`replay_online`): predict with the current
coefficients, then observe the step's verdicts, refit on schedule; every draft scored at draft
time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from av_core import AcceptanceEstimator, _native
from av_core._native import InvalidTypeError, InvalidValueError
from av_core.tools.evaluate.rounds import DraftRounds, FloatArray, IntArray

#: Default refit interval of the replay, in observe calls. The shipped trace was collected one
#: request at a time, so one observe holds one drafting round (K drafts, about 3 labels); serving
#: observes a whole batch per step. 25 rounds (about 75 labels per refit window) keeps the window
#: a few times the damping constant (50 observations), as vLLM's 100 serving steps of many
#: requests do.
DEFAULT_REFIT_INTERVAL = 25

#: Features are clamped to ±40, the estimator's own ``max_log_odds`` (the core's clamp).
MAX_FEATURE = _native.MAX_LOG_ODDS


@dataclass(frozen=True)
class Trajectory:
    """Coefficients after each refit: ``rounds[i]`` rounds had been observed at refit ``i``."""

    rounds: IntArray
    slope: FloatArray
    intercepts: FloatArray  # [refits, K]


@dataclass(frozen=True)
class Replay:
    """Draft-time predictions of an online replay, laid out as [rounds, K]."""

    predictions: FloatArray
    trajectory: Trajectory
    final_slope: float
    final_intercepts: FloatArray


def replay_online(
    rounds: DraftRounds,
    features: FloatArray,
    *,
    refit_interval: int = DEFAULT_REFIT_INTERVAL,
    batch_rounds: int = 1,
    memory: float | None = None,
    update: str | None = None,
) -> Replay:
    """Replays the online estimator prequentially over ``rounds`` with feature matrix [rounds, K].

    ``batch_rounds`` consecutive rounds form one decode step (one predict, one observe): every
    round of a step is predicted before any of its labels is observed, as in serving. The
    estimator refits itself every ``refit_interval`` observes; the prediction stored for a draft
    is the one made before its own step was observed, so its label never influences its score.
    ``memory`` is the estimator's memory across rounds (``None``: av_core's default; 0: vLLM's
    memoryless update); ``update`` how it refits (``None``: the estimator's default, ``"map"``,
    av_core's update, docs/estimator.md; ``"vllm"``: vLLM's damped Newton step).
    """
    if isinstance(batch_rounds, bool) or not isinstance(batch_rounds, int | np.integer):
        raise InvalidTypeError(f"batch_rounds must be an int, got {type(batch_rounds).__name__}")
    if batch_rounds < 1:
        raise InvalidValueError(f"batch_rounds must be >= 1, got {batch_rounds}")
    if features.shape != rounds.rows.shape:
        raise InvalidValueError(
            f"features must have shape {rounds.rows.shape}, got {features.shape}"
        )
    options: dict[str, Any] = {"refit_interval": refit_interval}
    if memory is not None:
        options["memory"] = memory
    if update is not None:
        options["update"] = update
    estimator = AcceptanceEstimator(rounds.num_positions, **options)
    x = np.ascontiguousarray(np.clip(features, -MAX_FEATURE, MAX_FEATURE), dtype=np.float32)
    predictions = np.empty(x.shape, dtype=np.float64)
    refit_rounds: list[int] = []
    slopes: list[float] = []
    intercepts: list[FloatArray] = []
    verified = rounds.num_verified.astype(np.int32)
    accepted = rounds.num_accepted.astype(np.int32)
    for start in range(0, rounds.num_rounds, batch_rounds):
        stop = min(start + batch_rounds, rounds.num_rounds)
        step_x = x[start:stop]
        p = estimator.predict(step_x)
        predictions[start:stop] = p
        if estimator.observe(step_x, verified[start:stop], accepted[start:stop], p):
            refit_rounds.append(stop)
            slopes.append(estimator.slope)
            intercepts.append(estimator.intercepts.copy())
    trajectory = Trajectory(
        rounds=np.asarray(refit_rounds, dtype=np.int64),
        slope=np.asarray(slopes, dtype=np.float64),
        intercepts=(
            np.asarray(intercepts, dtype=np.float64)
            if intercepts
            else np.zeros((0, rounds.num_positions))
        ),
    )
    return Replay(predictions, trajectory, estimator.slope, estimator.intercepts.copy())
