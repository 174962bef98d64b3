"""What a simulated step costs: the gpu-like cost model (a documented stand-in), measured cost files
from ``av-core profile``, and the draft and verify cost tables both give the planner.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from av_core import CostTables
from av_core._native import VERIFY_COST_FLOOR_MS, InvalidTypeError, InvalidValueError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
DrafterKind = Literal["autoregressive", "parallel"]
PassTokens = Literal["requests", "drafts"]

#: The largest time (ms) a cost model takes, a forward pass of about 11.6 days, or per token: far
#: past any real pass, and low enough that a simulated run's sums of step times cannot overflow
#: to inf (at 1e308 ms they did, and the run failed dividing by it).
MAX_COST_MS = 1e9


@dataclass(frozen=True)
class GpuLikeCost:
    """A documented stand-in for a GPU serving an 8B target with a small drafter.

    ``ms(t) = base_ms + max(0, t - knee) * per_token_ms``: flat while a forward pass is
    memory-bound (reading the weights dominates, so more tokens are free), linear once it is
    compute-bound. Defaults resemble an H100-class GPU and an 8B target in bf16: about 6 ms per
    decode step up to ~256 tokens, then 16 GFLOP per token at ~500 TFLOP/s ≈ 0.03 ms per token.
    The drafter (a one-layer head or a sub-1B model) costs 0.6 ms per pass, with a slope a tenth
    of the target's past the same knee.
    """

    verify_base_ms: float = 6.0
    verify_knee: int = 256
    verify_per_token_ms: float = 0.03
    draft_base_ms: float = 0.6
    draft_knee: int = 256
    draft_per_token_ms: float = 0.003

    def __post_init__(self) -> None:
        for name, low_open in (
            ("verify_base_ms", True),
            ("verify_knee", False),
            ("verify_per_token_ms", False),
            ("draft_base_ms", False),
            ("draft_knee", False),
            ("draft_per_token_ms", False),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidTypeError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0 or (low_open and value == 0):
                bound = "> 0" if low_open else ">= 0"
                raise InvalidValueError(f"{name} must be finite and {bound}, got {value!r}")
            if name.endswith("_ms") and value > MAX_COST_MS:
                raise InvalidValueError(f"{name} must be at most {MAX_COST_MS:g} ms, got {value!r}")

    def verify_ms(self, tokens: npt.ArrayLike) -> FloatArray:
        t = np.asarray(tokens, dtype=np.float64)
        return np.asarray(
            self.verify_base_ms + np.maximum(0.0, t - self.verify_knee) * self.verify_per_token_ms
        )

    def draft_pass_ms(self, tokens: npt.ArrayLike) -> FloatArray:
        t = np.asarray(tokens, dtype=np.float64)
        return np.asarray(
            self.draft_base_ms + np.maximum(0.0, t - self.draft_knee) * self.draft_per_token_ms
        )

    def describe(self) -> str:
        return (
            f"gpu-like: verify {self.verify_base_ms} ms flat to {self.verify_knee} tokens, then "
            f"+{self.verify_per_token_ms} ms/token; draft pass {self.draft_base_ms} ms flat to "
            f"{self.draft_knee} tokens, then +{self.draft_per_token_ms} ms/token"
        )


@dataclass(frozen=True)
class MeasuredCost:
    """Forward-pass times measured by ``av-core profile``: ``(tokens, ms)`` points.

    Between points the cost is interpolated linearly, past the last point extended along the last
    segment, below the first point held flat (never below the first measurement). Without a
    drafter curve drafting is free (stated in the output). A ``draft_depth`` profile in the file
    is not read here (see :func:`cost_tables_for`).
    """

    verify_points: FloatArray
    draft_points: FloatArray | None
    source: str

    @staticmethod
    def load(path: str | Path) -> MeasuredCost:
        """Reads a cost file; ``ValueError`` naming the file and the key for any problem
        (unreadable text, invalid JSON, a missing or malformed ``verify`` list, non-finite or
        negative times, a verify time of 0); a file that cannot be opened raises its
        ``OSError``."""
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidValueError(
                f"{path}: not a cost file (not UTF-8 text at byte {error.start})"
            ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise InvalidValueError(
                f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
            ) from None
        except RecursionError:
            raise InvalidValueError(f"{path}: not valid JSON (nested too deeply)") from None
        if not isinstance(data, dict):
            raise InvalidValueError(
                f"{path}: a cost file is a JSON object with a 'verify' list of [tokens, ms] "
                f"points, got a JSON {type(data).__name__}"
            )
        if "verify" not in data:
            raise InvalidValueError(
                f"{path}: a cost file needs a 'verify' list of [tokens, ms] points"
            )

        def points(name: str) -> FloatArray:
            value = data[name]
            if not isinstance(value, list) or not all(
                isinstance(point, list)
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in point)
                for point in value
            ):
                raise InvalidValueError(
                    f"{path}: {name!r} must be a list of [tokens, ms] pairs of numbers"
                )
            try:
                array = np.asarray(value, dtype=np.float64)
            except (ValueError, OverflowError):
                raise InvalidValueError(
                    f"{path}: {name!r} must be a list of [tokens, ms] pairs of numbers"
                ) from None
            if array.ndim != 2 or array.shape[1] != 2 or array.shape[0] < 1:
                raise InvalidValueError(f"{path}: {name!r} must be a list of [tokens, ms] pairs")
            if not np.all(np.isfinite(array)) or np.any(array[:, 1] < 0):
                raise InvalidValueError(f"{path}: {name!r} must hold finite, non-negative times")
            if np.any(array[:, 1] > MAX_COST_MS):
                raise InvalidValueError(
                    f"{path}: {name!r} must hold times of at most {MAX_COST_MS:g} ms, got "
                    f"{float(array[:, 1].max())!r}"
                )
            if np.any(array[:, 0] < 0):
                raise InvalidValueError(f"{path}: {name!r} must hold non-negative token counts")
            order = np.argsort(array[:, 0], kind="stable")
            return np.asarray(array[order])

        verify = points("verify")
        if np.any(verify[:, 1] <= 0):
            raise InvalidValueError(
                f"{path}: 'verify' times must be > 0 ms (a forward pass takes time)"
            )
        draft = points("draft") if data.get("draft") else None
        return MeasuredCost(verify, draft, str(path))

    @staticmethod
    def _curve(points: FloatArray, tokens: npt.ArrayLike) -> FloatArray:
        t = np.asarray(tokens, dtype=np.float64)
        x, y = points[:, 0], np.maximum.accumulate(points[:, 1])
        if x.shape[0] == 1:
            return np.full(t.shape, y[0])
        inside = np.interp(t, x, y)
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2]) if x[-1] > x[-2] else 0.0
        return np.asarray(np.where(t > x[-1], y[-1] + (t - x[-1]) * slope, inside))

    def verify_ms(self, tokens: npt.ArrayLike) -> FloatArray:
        return self._curve(self.verify_points, tokens)

    def draft_pass_ms(self, tokens: npt.ArrayLike) -> FloatArray:
        if self.draft_points is None:
            return np.zeros(np.shape(tokens))
        return self._curve(self.draft_points, tokens)

    def describe(self) -> str:
        drafter = "measured drafter" if self.draft_points is not None else "drafting free"
        return f"measured: {self.source} ({self.verify_points.shape[0]} verify points, {drafter})"


CostModel = GpuLikeCost | MeasuredCost


def draft_cost_ms(
    cost: CostModel,
    drafter: DrafterKind,
    num_requests: int,
    num_drafts: int,
    parallel_pass_tokens: PassTokens = "requests",
) -> float:
    """Drafting ``num_drafts`` positions for each of ``num_requests`` requests.

    Autoregressive (draft models, EAGLE, MTP): one pass per position, each over R tokens, so k
    drafts cost k passes. Parallel (block drafters): one pass per step whatever k, charged at R
    tokens (``parallel_pass_tokens="requests"``, the default) or at the R·k query tokens the
    block actually carries (``"drafts"``: deeper blocks cost more once the drafter is
    compute-bound). No drafts, no pass.
    """
    if num_drafts <= 0 or num_requests <= 0:
        return 0.0
    if drafter == "autoregressive":
        return float(num_drafts * cost.draft_pass_ms(num_requests))
    if parallel_pass_tokens == "drafts":
        return float(cost.draft_pass_ms(num_requests * num_drafts))
    return float(cost.draft_pass_ms(num_requests))


def step_draft_cost_ms(
    cost: CostModel,
    drafter: DrafterKind,
    depths: npt.ArrayLike,
    parallel_pass_tokens: PassTokens = "requests",
) -> float:
    """Drafting ``depths[r]`` positions for each request, when depths differ (depth control).

    Autoregressive: pass ``j`` runs over the requests drafting at least ``j`` positions
    (requests that stop leave the drafter's batch). Parallel: one pass over the requests that
    draft at all (or over their drafted tokens, ``"drafts"``). With equal depths this is
    :func:`draft_cost_ms`.
    """
    d = np.asarray(depths, dtype=np.int64)
    deepest = int(d.max(initial=0))
    if deepest == 0:
        return 0.0
    if drafter == "autoregressive":
        rows = np.array([(d >= j).sum() for j in range(1, deepest + 1)])
        return float(cost.draft_pass_ms(rows).sum())
    if parallel_pass_tokens == "drafts":
        return float(cost.draft_pass_ms(int(d.sum())))
    return float(cost.draft_pass_ms(int((d > 0).sum())))


def cost_tables_for(
    cost: CostModel,
    drafter: DrafterKind,
    num_positions: int,
    max_requests: int,
    parallel_pass_tokens: PassTokens = "requests",
    depth_table: bool = False,
) -> CostTables:
    """The planner's tables: ``draft_ms[R]`` = drafting all K positions, ``verify_ms[t]``, and
    with ``depth_table`` the draft-cost-by-depth shape of the drafting this simulator charges:
    one pass per position for an autoregressive drafter, one pass at any depth for a parallel
    one (priced at the largest batch when the pass is charged by drafted tokens). A cost file's
    ``draft_depth`` profile is for serving tables (``CostTables.from_curves``); the simulator
    charges passes, so its planner prices passes too."""
    draft = np.array(
        [
            draft_cost_ms(cost, drafter, r, num_positions, parallel_pass_tokens)
            for r in range(max_requests + 1)
        ]
    )
    verify = cost.verify_ms(np.arange(max_requests * (num_positions + 1) + 1))
    tables = CostTables(draft, np.maximum(verify, VERIFY_COST_FLOOR_MS))
    if not depth_table:
        return tables
    if drafter == "parallel" and parallel_pass_tokens == "drafts":
        by_depth = [
            draft_cost_ms(cost, drafter, max_requests, d, parallel_pass_tokens)
            for d in range(num_positions + 1)
        ]
        return tables.with_draft_depth(np.maximum.accumulate(by_depth))
    return tables.with_draft_depth(drafter, max_depth=num_positions)
