# Stub of the compiled module av_core._native; tests/test_stubs.py checks it with mypy.stubtest.
#
# What every entry point promises at its boundary (tests/test_boundaries_native.py):
# - Arrays: any layout (Fortran order, transposed, negative or zero strides, non-contiguous
#   slices, misaligned buffers, lists, CPU torch tensors and their .t() views) gives exactly the
#   answer of its C-contiguous copy; each argument is read once, so another thread writing it
#   during the call can make the call fail (ValueError), never let an unchecked value into a
#   result or the state. An empty list is accepted wherever an empty array is.
# - Integers: a bool is not an int (TypeError); a value outside the argument's range is a
#   ValueError naming the argument and the value, never OverflowError. Floats likewise (an int
#   beyond float range is a ValueError).
# - save() is atomic for any number of concurrent savers (threads or processes), killed at any
#   moment: the path holds the old file or one complete new one. load() refuses anything but a
#   regular file (a FIFO, a directory, a device) and anything longer than a saved state can be.
# - from_state_dict / from_bytes / load refuse statistics no sequence of observations can
#   produce (counts beyond 2**56, negative weight sums, |b| beyond sqrt(a c), a count of steps
#   at or past refit_interval, a memory that is not positive semi-definite, ...).
# - After any number of threads observing at once, num_refits and steps_since_refit are those of
#   a serial run of the same calls.
import os
from typing import Any, Literal, final, overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "__version__",
    "AcceptanceEstimator",
    "BufferChangedError",
    "CostTables",
    "DepthPlan",
    "DepthTableError",
    "OutOfMemoryError",
    "StateError",
    "VerificationPlan",
    "VerificationPlanner",
    "assign_draft_budget",
    "choose_draft_budget",
    "choose_draft_depth",
    "draft_log_odds_bf16",
    "draft_log_odds_f32",
    "plan_verification",
]

__version__: str

class StateError(ValueError):
    """Saved state (bytes, a file or JSON text) that is corrupt, truncated, of another kind, of a
    format version this build does not read, or that decodes to a state no planner or estimator
    could hold. A ValueError."""

class DepthTableError(ValueError):
    """The call prices drafting by depth and the cost tables have no draft-depth table, or one
    that does not cover the positions planned. A ValueError."""

class BufferChangedError(ValueError):
    """An input held a bad value that was gone when read again: another thread wrote the buffer
    during the call, which did nothing. A ValueError."""

class OutOfMemoryError(ValueError):
    """There was no memory for a copy the call needs (an array far larger than memory, such as
    a huge numpy.broadcast_to view). A ValueError, naming the argument."""

@final
class AcceptanceEstimator:
    def __new__(
        cls,
        num_positions: int,
        *,
        refit_interval: int = ...,
        damping: float = ...,
        l2: float = ...,
        init_slope: float = ...,
        init_intercept: float = ...,
        max_log_odds: float = ...,
        max_step: float = ...,
        max_slope: float = ...,
        max_intercept: float = ...,
        memory: float = ...,
        drift_z: float = ...,
        update: Literal["map", "vllm"] | str = "vllm",
        bins: int = ...,
        prior_slope_sd: float = ...,
        prior_level_sd: float = ...,
        prior_trend_sd: float = ...,
        prior_spread_sd: float = ...,
    ) -> AcceptanceEstimator:
        """``update="vllm"`` (the default) is vLLM 0.33.0's damped Newton step once per
        round, bit for bit (``damping`` applies to it only). ``update="map"`` opts into
        av_core's refit (docs/estimator.md): per-position histograms of the feature (``bins``
        per position), the MAP fit iterated to convergence under a prior centred on the cold
        start (``prior_*_sd``), fits after 1, 2, 4, ... observes of every round and at its end;
        better log-loss, slower observes and refits."""
    def predict(self, features: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
    def observe(
        self,
        features: npt.ArrayLike,
        num_admitted: npt.ArrayLike,
        num_accepted: npt.ArrayLike,
        predictions: npt.ArrayLike | None = None,
        *,
        count_step: bool = True,
    ) -> bool:
        """Folds one decode step of verdicts into the round; True when it refitted. With
        ``count_step=False`` the verdicts join the round without counting a step (no refit
        runs), for callers that run their own schedule with :meth:`refit`."""
    @overload
    def refit(self, *, report: Literal[False] = False, end_round: bool = True) -> None:
        """Ends the round now and refits (``end_round=False``, map only: fits the memory plus
        the open round without ending it, as the schedule does after the 1st, 2nd, 4th, ...
        observe of a round)."""
    @overload
    def refit(self, *, report: Literal[True], end_round: bool = True) -> dict[str, Any]: ...
    @property
    def slope(self) -> float: ...
    @property
    def intercepts(self) -> npt.NDArray[np.float64]: ...
    @property
    def num_positions(self) -> int: ...
    @property
    def num_refits(self) -> int: ...
    @property
    def steps_since_refit(self) -> int: ...
    @property
    def refit_interval(self) -> int: ...
    @property
    def damping(self) -> float: ...
    @property
    def l2(self) -> float: ...
    @property
    def max_log_odds(self) -> float: ...
    @property
    def max_step(self) -> float: ...
    @property
    def max_slope(self) -> float: ...
    @property
    def max_intercept(self) -> float: ...
    @property
    def memory(self) -> float: ...
    @property
    def drift_z(self) -> float: ...
    @property
    def update(self) -> str:
        """How the estimator refits: ``"map"`` or ``"vllm"``."""
    @property
    def bins(self) -> int: ...
    @property
    def prior_slope_sd(self) -> float: ...
    @property
    def prior_level_sd(self) -> float: ...
    @property
    def prior_trend_sd(self) -> float: ...
    @property
    def prior_spread_sd(self) -> float: ...
    def to_bytes(self) -> bytes: ...
    @classmethod
    def from_bytes(cls, data: bytes) -> AcceptanceEstimator: ...
    def save(self, path: str | os.PathLike[str]) -> None: ...
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AcceptanceEstimator: ...
    def round_counts(self) -> npt.NDArray[np.int64]: ...
    def add_round_stats(self, round_stats: dict[str, Any]) -> None:
        """Adds another round's statistics (as in ``state_dict()["round_stats"]``: vllm's IRLS
        moments or map's histograms, the estimator's own kind) to the open round, exactly;
        refused, adding nothing, on other fraction bits, bins or number of positions, or
        statistics no sequence of observations can produce (a negative ``a``/``c``, more
        accepted than labeled, a count past the bound)."""
    def state_dict(self) -> dict[str, Any]: ...
    @classmethod
    def from_state_dict(
        cls, state: dict[str, Any], *, update: Literal["map", "vllm"] | str | None = None
    ) -> AcceptanceEstimator:
        """Restores ``state_dict()`` (format version 1, before the map update, restores as a
        vllm estimator, bit for bit). With ``update``, moves the estimator to that update:
        configuration and coefficients kept, open round and memory started over."""
    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]: ...

# --- the verification planner (rust/src/planner.rs) ---

@final
class CostTables:
    def __new__(
        cls,
        draft_ms: npt.ArrayLike,
        verify_ms: npt.ArrayLike,
        *,
        draft_depth_ms: npt.ArrayLike | None = None,
    ) -> CostTables: ...
    def with_draft_depth(
        self,
        draft_depth_ms: npt.ArrayLike | Literal["autoregressive", "parallel"] | str,
        *,
        max_depth: int | None = None,
    ) -> CostTables: ...
    @classmethod
    def from_curves(
        cls,
        draft_curve: npt.ArrayLike,
        verify_curve: npt.ArrayLike,
        *,
        max_num_reqs: int,
        max_batch_tokens: int,
        cudagraph_limit: int = 0,
        draft_depth_curve: npt.ArrayLike | None = None,
        max_draft_depth: int | None = None,
    ) -> CostTables: ...
    @classmethod
    def from_samples(
        cls,
        draft_samples: npt.ArrayLike,
        verify_samples: npt.ArrayLike,
        *,
        max_num_reqs: int,
        max_batch_tokens: int,
        cudagraph_limit: int = 0,
        draft_depth_samples: npt.ArrayLike | None = None,
        max_draft_depth: int | None = None,
    ) -> CostTables: ...
    @property
    def draft_depth_ms(self) -> npt.NDArray[np.float64] | None: ...
    @property
    def max_draft_depth(self) -> int | None: ...
    def draft_cost_ms(self, num_requests: int, depth: int) -> float: ...
    def step_draft_cost_ms(self, depths: npt.ArrayLike) -> float: ...
    @property
    def draft_ms(self) -> npt.NDArray[np.float64]: ...
    @property
    def verify_ms(self) -> npt.NDArray[np.float64]: ...
    @property
    def max_num_reqs(self) -> int: ...
    @property
    def max_batch_tokens(self) -> int: ...
    def to_json(self) -> str: ...
    @classmethod
    def from_json(cls, text: str) -> CostTables: ...
    def to_bytes(self) -> bytes:
        """The tables as versioned, checksummed bytes (bit-exact); ``from_bytes`` restores them."""
    @classmethod
    def from_bytes(cls, data: bytes) -> CostTables:
        """Tables from ``to_bytes()``; corrupt, truncated or future-version data raises
        StateError."""
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes ``to_bytes()`` to ``path`` atomically: a crash leaves the old file intact."""
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostTables:
        """Tables written by ``save``; a corrupt, truncated or future-version file raises
        StateError naming the path."""
    def __copy__(self) -> CostTables: ...
    def __deepcopy__(self, memo: Any, /) -> CostTables: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...

@final
class VerificationPlan:
    @property
    def budget(self) -> int: ...
    @property
    def admitted(self) -> npt.NDArray[np.int32]: ...
    @property
    def expected_accepted_tokens(self) -> float: ...
    @property
    def predicted_cost_ms(self) -> float: ...
    def __iter__(self) -> Any: ...

@final
class VerificationPlanner:
    def __new__(
        cls,
        cost_tables: CostTables,
        num_positions: int,
        *,
        num_slots: int | None = None,
        budget_source: Literal["previous", "current"] | str = "previous",
        exploration: float = ...,
        exploration_seed: int = 0,
    ) -> VerificationPlanner: ...
    @property
    def exploration(self) -> float: ...
    def add_request(self, slot: int) -> None: ...
    def plan(
        self,
        slots: npt.ArrayLike,
        confidences: npt.ArrayLike,
        scheduled_drafts: npt.ArrayLike,
        *,
        num_non_draft_tokens: int,
        num_sampling_requests: int,
        max_draft_budget: int | None = None,
    ) -> VerificationPlan: ...
    def choose_draft_depth(
        self,
        slots: npt.ArrayLike,
        max_depths: npt.ArrayLike,
        *,
        num_non_draft_tokens: int,
        num_sampling_requests: int,
        max_draft_budget: int | None = None,
        mode: Literal["batch", "per_request"] | str = "batch",
    ) -> DepthPlan: ...
    def remember(
        self, slots: npt.ArrayLike, confidences: npt.ArrayLike, scheduled_drafts: npt.ArrayLike
    ) -> None: ...
    def previous_confidences(self, slot: int) -> npt.NDArray[np.float64]: ...
    def to_bytes(self) -> bytes: ...
    @classmethod
    def from_bytes(cls, data: bytes) -> VerificationPlanner: ...
    def save(self, path: str | os.PathLike[str]) -> None: ...
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> VerificationPlanner: ...
    def copy(self) -> VerificationPlanner: ...
    def __copy__(self) -> VerificationPlanner: ...
    def __deepcopy__(self, memo: Any, /) -> VerificationPlanner: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...
    @property
    def cost_tables(self) -> CostTables: ...
    @property
    def num_slots(self) -> int: ...
    @property
    def num_positions(self) -> int: ...
    @property
    def budget_source(self) -> str: ...

@final
class DepthPlan:
    @property
    def depths(self) -> npt.NDArray[np.int32]: ...
    @property
    def max_depth(self) -> int: ...
    @property
    def drafts(self) -> int: ...
    @property
    def budget(self) -> int: ...
    @property
    def expected_accepted_tokens(self) -> float: ...
    @property
    def predicted_cost_ms(self) -> float: ...

def choose_draft_depth(
    confidences: npt.ArrayLike,
    max_depths: npt.ArrayLike,
    *,
    num_non_draft_tokens: int,
    num_sampling_requests: int,
    cost_tables: CostTables,
    max_draft_budget: int | None = None,
    mode: Literal["batch", "per_request"] | str = "batch",
) -> DepthPlan: ...
def choose_draft_budget(
    confidences: npt.ArrayLike,
    scheduled_drafts: npt.ArrayLike,
    *,
    num_non_draft_tokens: int,
    num_sampling_requests: int,
    cost_tables: CostTables,
    max_draft_budget: int | None = None,
) -> int: ...
def assign_draft_budget(
    confidences: npt.ArrayLike, scheduled_drafts: npt.ArrayLike, budget: int
) -> npt.NDArray[np.int32]: ...
def plan_verification(
    confidences: npt.ArrayLike,
    scheduled_drafts: npt.ArrayLike,
    *,
    num_non_draft_tokens: int,
    num_sampling_requests: int,
    cost_tables: CostTables,
    max_draft_budget: int | None = None,
    budget_confidences: npt.ArrayLike | None = None,
) -> VerificationPlan: ...
def draft_log_odds_bf16(
    logits: npt.NDArray[np.int16],
    inv_temperature: npt.NDArray[np.float32],
    max_log_odds: float,
    row_valid: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.float32]: ...
def draft_log_odds_f32(
    logits: npt.NDArray[np.float32],
    inv_temperature: npt.NDArray[np.float32],
    max_log_odds: float,
    row_valid: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.float32]: ...
