# Stub of the compiled module av_core._native; tests/bindings/test_stubs.py checks it with
# mypy.stubtest.
#
# What every entry point promises at its boundary (tests/bindings/test_boundaries_native.py):
# - Arrays: any layout (Fortran order, transposed, negative or zero strides, non-contiguous
#   slices, misaligned buffers, lists, CPU torch tensors and their .t() views) gives exactly the
#   answer of its C-contiguous copy; each argument is read once, so another thread writing it
#   during the call can make the call fail (ValueError), never let an unchecked value into a
#   result or the state. An empty list is accepted wherever an empty array is.
# - Integers: a bool is not an int (TypeError); a value outside the argument's range is a
#   ValueError naming the argument and the value, never OverflowError. Floats likewise (an int
#   beyond float range is a ValueError).
# - Errors: every ValueError and TypeError the module raises for an argument is an
#   InvalidValueError / InvalidTypeError (or a subclass), so also an av_core Error.
# - save() is atomic for any number of concurrent savers (threads or processes), killed at any
#   moment: the path holds the old file or one complete new one. load() refuses anything but a
#   regular file (a FIFO, a directory, a device) and anything longer than a saved state can be.
# - from_state_dict / from_bytes / load refuse statistics no sequence of observations can
#   produce (counts beyond 2**56, negative weight sums, |b| beyond sqrt(a c), a count of steps
#   at or past refit_interval, a memory that is not positive semi-definite, ...).
# - After any number of threads observing at once, num_refits and steps_since_refit are those of
#   a serial run of the same calls.
import os
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal, final, overload

import numpy as np
import numpy.typing as npt

from av_core.state_types import (
    EstimatorConfigFields,
    EstimatorOptions,
    EstimatorStateDict,
    HistogramDict,
    MapEstimatorStateDict,
    MapRefitReport,
    RefitReport,
    RoundStatsDict,
)

__all__ = [
    "__version__",
    "DEFAULT_EXPLORATION",
    "DRAFT_COST_FLOOR_MS",
    "ESTIMATOR_DEFAULTS",
    "MAX_LOG_ODDS",
    "VERIFY_COST_FLOOR_MS",
    "VLLM_ESTIMATOR",
    "AcceptanceEstimator",
    "BufferChangedError",
    "CostTables",
    "DepthPlan",
    "DepthTableError",
    "Error",
    "EstimatorConfig",
    "InvalidTypeError",
    "InvalidValueError",
    "OutOfMemoryError",
    "StateError",
    "VerificationPlan",
    "VerificationPlanner",
    "assign_draft_budget",
    "check_environment",
    "choose_draft_budget",
    "choose_draft_depth",
    "draft_log_odds_bf16",
    "draft_log_odds_f32",
    "plan_verification",
    "write_atomically",
]

__version__: str

# --- the core's constants, owned by av_core (av_core/src); every Python user imports them here ---

MAX_LOG_ODDS: Final[float]
"""The log-odds clamp: features are clamped to ``[-MAX_LOG_ODDS, MAX_LOG_ODDS]`` (40.0, vLLM's
``_MAX_LOG_ODDS``; the estimator's default ``max_log_odds``)."""
ESTIMATOR_DEFAULTS: Final[EstimatorOptions]
"""The keyword defaults of :class:`AcceptanceEstimator` (``EstimatorConfig::new``), read-only:
``refit_interval=100, damping=50.0, l2=0.001, init_slope=0.5, init_intercept=-0.2,
max_log_odds=40.0, max_step=4.0, max_slope=10.0, max_intercept=15.0, memory=0.8,
drift_z=3.09, update="map"`` (the map update's own settings are the constructor's defaults)."""
VLLM_ESTIMATOR: Final[EstimatorOptions]
"""vLLM 0.33.0's estimator as keyword options (``EstimatorConfig::vllm``), read-only: the
defaults with vLLM's memoryless (``memory=0.0``) and unbounded (``max_step``, ``max_slope``,
``max_intercept`` = inf) update: ``update="vllm"``, so ``AcceptanceEstimator(k,
**VLLM_ESTIMATOR)`` refits as vLLM does."""
DRAFT_COST_FLOOR_MS: Final[float]
"""Floor of every draft-table entry of :class:`CostTables`, in ms (0.0)."""
VERIFY_COST_FLOOR_MS: Final[float]
"""Floor of every verify-table entry of :class:`CostTables`, in ms (1e-6, vLLM's): keeps the
planner's cost denominator positive."""
DEFAULT_EXPLORATION: Final[float]
"""The default ``exploration`` of :class:`VerificationPlanner` (0.01)."""

class Error(Exception):
    """The root of every exception av_core defines: a bad argument (InvalidValueError, a
    ValueError; InvalidTypeError, a TypeError), saved state it cannot read (StateError),
    missing depth tables (DepthTableError), a buffer changed during a call
    (BufferChangedError), no memory for a copy (OutOfMemoryError), a bad environment value
    (SettingError) and an engine av_core cannot patch. `except av_core.Error` catches them
    all."""

class InvalidValueError(Error, ValueError):
    """An argument of the right type with a wrong value (out of range, non-finite, a wrong
    shape, inconsistent lengths), named in the message. An av_core.Error and a ValueError."""

class InvalidTypeError(Error, TypeError):
    """An argument of a type the call does not take (an array dtype, a str for a number),
    named in the message. An av_core.Error and a TypeError."""

class StateError(InvalidValueError):
    """Saved state (bytes, a file or JSON text) that is corrupt, truncated, of another kind, of a
    format version this build does not read, or that decodes to a state no planner or estimator
    could hold. An InvalidValueError (so an av_core.Error and a ValueError)."""

class DepthTableError(InvalidValueError):
    """The call prices drafting by depth and the cost tables have no draft-depth table, or one
    that does not cover the positions planned. An InvalidValueError (so an av_core.Error and a
    ValueError)."""

class BufferChangedError(InvalidValueError):
    """An input held a bad value that was gone when read again: another thread wrote the buffer
    during the call, which did nothing. An InvalidValueError (so an av_core.Error and a
    ValueError)."""

class OutOfMemoryError(InvalidValueError):
    """There was no memory for a copy the call needs (an array far larger than memory, such as
    a huge numpy.broadcast_to view). An InvalidValueError (so an av_core.Error and a
    ValueError), naming the argument."""

class _ConfigFields:
    """The configuration fields an estimator and its frozen config both show (one list in the
    core, ``CONFIG_FIELDS``; not a class at runtime)."""

    @property
    def refit_interval(self) -> int | None:
        """Observe calls per round (None: manual, a refit only when ``refit()`` is called)."""
    @property
    def damping(self) -> float:
        """Damping D, in observations."""
    @property
    def l2(self) -> float:
        """Ridge λ."""
    @property
    def init_slope(self) -> float:
        """Cold-start slope."""
    @property
    def init_intercept(self) -> float:
        """Cold-start intercept (every position)."""
    @property
    def max_log_odds(self) -> float:
        """Feature clamp."""
    @property
    def max_step(self) -> float:
        """Largest change of a coefficient in one refit."""
    @property
    def max_slope(self) -> float:
        """Largest slope."""
    @property
    def max_intercept(self) -> float:
        """Largest absolute intercept."""
    @property
    def memory(self) -> float:
        """Discount γ per round of the memory of past rounds (0: none; with ``update="vllm"``,
        vLLM's memoryless refit)."""
    @property
    def drift_z(self) -> float:
        """Drift test threshold (standard deviations); inf disables the test."""
    @property
    def update(self) -> str:
        """How the estimator refits: ``"map"`` (the default) or ``"vllm"``."""
    @property
    def bins(self) -> int:
        """map: bins per position of the feature histograms."""
    @property
    def prior_slope_sd(self) -> float:
        """map: the prior sd of the slope."""
    @property
    def prior_level_sd(self) -> float:
        """map: the prior sd of the intercepts' level."""
    @property
    def prior_trend_sd(self) -> float:
        """map: the prior sd of the intercepts' trend in depth."""
    @property
    def prior_spread_sd(self) -> float:
        """map: the prior sd of each intercept around the trend."""

@final
class EstimatorConfig(_ConfigFields):
    """An estimator's configuration (:attr:`AcceptanceEstimator.config`), frozen: every field of
    the core's ``EstimatorConfig`` as an attribute and by key (``config.l2``, ``config["l2"]``),
    in the constructor's order (``keys()``), so ``AcceptanceEstimator(**est.config)`` builds a
    cold estimator with the same configuration and ``dict(config)`` is a plain dict. Equal when
    every field is, and hashed by the fields; pickles, and copies are the object itself."""
    def __getitem__(self, key: str, /) -> int | float | str | None:
        """The field named ``key`` (KeyError if there is none)."""
    def __contains__(self, key: str, /) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[str]: ...
    def __eq__(self, value: object, /) -> bool: ...
    def keys(self) -> tuple[str, ...]:
        """The field names, in the constructor's order."""
    def to_dict(self) -> EstimatorConfigFields:
        """The fields as a new dict."""
    @classmethod
    def from_dict(
        cls, fields: Mapping[str, int | float | str | None] | EstimatorConfig
    ) -> EstimatorConfig:
        """The configuration ``fields`` describes, as :meth:`to_dict` writes it:
        ``num_positions`` is required, a field left out takes the constructor's default, and a
        key that names no field, a value of the wrong type or out of range raises (ValueError /
        TypeError naming the field), as ``AcceptanceEstimator(**fields)`` would. Any Mapping is
        read (an ``EstimatorConfig`` gives itself); a key that is not a ``str`` is a
        TypeError."""
    def __hash__(self) -> int: ...
    def __copy__(self) -> EstimatorConfig: ...
    def __deepcopy__(self, memo: Any, /) -> EstimatorConfig: ...
    def __reduce__(self) -> tuple[Any, tuple[EstimatorConfigFields]]: ...
    @property
    def num_positions(self) -> int:
        """Number of draft positions K."""

@final
class AcceptanceEstimator(_ConfigFields):
    """Online acceptance estimator: p = sigmoid(slope * x + intercept[k]) on x = logit(q_max),
    refitted from the target's verdicts: by default (``update="map"``) a MAP fit of per-position
    histograms after the 1st, 2nd, 4th, ... observe of every round of ``refit_interval`` observes
    and at its end; ``update="vllm"``: vLLM's damped Newton step once per round."""
    def __new__(
        cls,
        num_positions: int,
        *,
        refit_interval: int | None = 100,
        damping: float = 50.0,
        l2: float = 0.001,
        init_slope: float = 0.5,
        init_intercept: float = -0.2,
        max_log_odds: float = 40.0,
        max_step: float = 4.0,
        max_slope: float = 10.0,
        max_intercept: float = 15.0,
        memory: float = 0.8,
        drift_z: float = 3.09,
        update: Literal["map", "vllm"] | str = "map",
        bins: int = 64,
        prior_slope_sd: float = 0.15,
        prior_level_sd: float = 1.0,
        prior_trend_sd: float = 0.2,
        prior_spread_sd: float = 0.1,
    ) -> AcceptanceEstimator:
        """K = ``num_positions`` draft positions (1 to 64); every keyword's default is the
        core's (``ESTIMATOR_DEFAULTS``). ``refit_interval``: observe calls per round
        (``None``: manual, the estimator refits only when :meth:`refit` is called, observes
        only count their steps); ``damping``: a round with D observations moves a coefficient
        half a full Newton step; ``l2``: ridge; ``init_slope``, ``init_intercept``: cold start;
        ``max_log_odds``: feature clamp; ``max_step``, ``max_slope``, ``max_intercept``: refit
        bounds (inf: none); ``memory``: discount per round of past rounds (0: none; with
        ``update="vllm"``, vLLM's memoryless update); ``drift_z``: drift test threshold, in
        standard deviations (inf: never).

        ``update="map"`` (the default) is av_core's refit (docs/estimator.md): per-position
        histograms of the feature (``bins`` per position), the MAP fit iterated to convergence
        under a prior centred on the cold start (``prior_*_sd``), fits after 1, 2, 4, ...
        observes of every round and at its end; calibrated from its first refit and after a
        workload switch; observes as fast as vLLM's update, refits slower (they iterate).
        ``update="vllm"`` is vLLM 0.33.0's damped Newton step once per round, bit for bit
        (``damping`` applies to it only; states saved before the map update load as it)."""
    def predict(self, features: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Acceptance probabilities, float32 [R, K], for features [R, K] (float32 or float64)."""
    def observe(
        self,
        features: npt.ArrayLike,
        num_admitted: npt.ArrayLike,
        num_accepted: npt.ArrayLike,
        predictions: npt.ArrayLike | None = None,
        *,
        count_step: bool = True,
    ) -> bool:
        """Folds one decode step of verdicts into the round; True when it refitted (vllm: it
        completed a round; map: also after the round's 1st, 2nd, 4th, ... observe). With
        ``count_step=False`` the verdicts join the round without counting a step (no refit
        runs), for callers that run their own schedule with :meth:`refit`."""
    def set_regularization(self, *, l2: float, damping: float) -> None:
        """Changes the ridge ``l2`` and the damping of every later refit, as if the estimator
        had been built with them (bit for bit the estimator ``from_state_dict`` rebuilds with
        the two fields changed). Atomic: a refit running concurrently uses the old pair or the
        new one. A negative or non-finite value raises ValueError naming it; nothing changes."""
    @overload
    def refit(self, *, report: Literal[False] = False, end_round: bool = True) -> None:
        """Ends the round now: refits on whatever it holds and clears it. With ``report=True``,
        returns the round's statistics (as in ``state_dict()["round_stats"]``), the Newton step
        taken from them (``slope_step``, ``intercept_steps``, before the step and range bounds)
        and the round's drift statistic (``drift_statistic``: about chi-square with K + 1
        degrees of freedom while the coefficients it was collected under fit).
        ``end_round=False`` (map only) fits the memory plus the open round without ending it,
        as the schedule does after the 1st, 2nd, 4th, ... observe of a round."""
    @overload
    def refit(
        self, *, report: Literal[True], end_round: bool = True
    ) -> MapRefitReport | RefitReport: ...
    @property
    def slope(self) -> float:
        """Shared slope."""
    @property
    def intercepts(self) -> npt.NDArray[np.float64]:
        """Per-position intercepts, float64 [K] (a copy)."""
    @property
    def num_positions(self) -> int:
        """Number of draft positions K."""
    @property
    def num_refits(self) -> int:
        """Refits so far."""
    @property
    def steps_since_refit(self) -> int:
        """Observe calls since the open round began, i.e. since the last refit that ended a
        round (the map update's fits within a round do not reset it)."""
    @property
    def config(self) -> EstimatorConfig:
        """The configuration, frozen (each field is also an attribute here:
        ``est.l2 == est.config.l2``)."""
    def to_bytes(self) -> bytes:
        """The state as versioned, checksummed bytes (see ``from_bytes``): ``state_dict()`` in
        binary, of a length that depends on the configuration only."""
    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> AcceptanceEstimator:
        """Rebuilds an estimator from ``to_bytes()`` of this release or an earlier one (bytes or
        any bytes-like object); corrupt, truncated, padded or future-version data raises
        ValueError."""
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes ``to_bytes()`` to ``path`` atomically: a temporary file in the same directory,
        flushed to disk, then renamed over ``path``, so a crash leaves the old file intact."""
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AcceptanceEstimator:
        """Loads an estimator written by ``save``. A corrupt, truncated or future-version file
        raises ValueError naming the path."""
    def round_counts(self) -> npt.NDArray[np.int64]:
        """Labeled observations per position in the open round, int64 [K]."""
    def add_round_stats(
        self, round_stats: RoundStatsDict | HistogramDict | Mapping[str, Any]
    ) -> None:
        """Adds another round's statistics (as in ``state_dict()["round_stats"]``: vllm's IRLS
        moments or map's histograms, the estimator's own kind) to the open round, exactly;
        refused, adding nothing, on a key its kind does not hold (the other kind's statistics
        included), other fraction bits, bins or number of positions, or statistics no sequence
        of observations can produce (a negative ``a``/``c``, more accepted than labeled, a count
        past the bound)."""
    def state_dict(self) -> MapEstimatorStateDict | EstimatorStateDict:
        """Everything (config, coefficients, round statistics, counters) as plain Python values;
        ``from_state_dict`` restores it bit-exactly. Statistics are exact fixed-point integers
        in units of 2**-fraction_bits. A map estimator's (the default; format version 2) holds
        every configuration field, histograms (``count``, ``accepted``, ``x_sum``, ``bins``) in
        ``round_stats`` and ``memory_state``, and the round's ``reference`` and
        ``fitted_labels`` (:class:`~av_core.state_types.MapEstimatorStateDict`); a vllm
        estimator at the default map settings has format version 1, IRLS moments and a
        quadratic memory (:class:`~av_core.state_types.EstimatorStateDict`)."""
    @classmethod
    def from_state_dict(
        cls,
        state: MapEstimatorStateDict | EstimatorStateDict | dict[str, Any],
        *,
        update: Literal["map", "vllm"] | str | None = None,
    ) -> AcceptanceEstimator:
        """Rebuilds an estimator from ``state_dict()``, validating every field and refusing a
        key no field holds, anywhere, by its path (format version 1, before the map update,
        restores as a vllm estimator, bit for bit). With ``update``,
        moves the estimator to that update: configuration and coefficients kept, open round and
        memory started over (the state is validated whole first: a corrupt one is refused
        whatever the update)."""
    def __reduce__(self) -> tuple[Any, tuple[MapEstimatorStateDict | EstimatorStateDict]]: ...

# --- the verification planner (rust/src/planner.rs) ---

@final
class CostTables:
    """Step-cost tables in milliseconds: ``draft_ms[r]`` for ``r`` requests, ``verify_ms[t]`` for
    ``t`` target tokens."""
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
    ) -> CostTables:
        """A copy with a draft-cost-by-depth table: explicit ms per depth ``0..=K``, or the shape
        of a drafter kind (``"autoregressive"``: proportional to depth; ``"parallel"``: one
        pass) with ``max_depth``."""
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
    ) -> CostTables:
        """Tables from profiled (size, ms) points with vLLM 0.33.0's semantics.
        ``draft_depth_curve`` adds a draft-cost-by-depth table from profiled (depth, ms) points
        over depths ``0..=max_draft_depth`` (default: the deepest profiled depth)."""
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
    ) -> CostTables:
        """Tables from raw repeated (size, ms) timings: the median per size, then ``from_curves``.
        ``draft_depth_samples``: raw repeated (depth, ms) timings of the drafter, reduced to the
        median per depth like the others."""
    @property
    def draft_depth_ms(self) -> npt.NDArray[np.float64] | None:
        """Drafter cost by depth, float64 [K + 1] (a copy), or None without a depth table."""
    @property
    def max_draft_depth(self) -> int | None:
        """Deepest depth the depth table covers (K), or None."""
    def draft_cost_ms(self, num_requests: int, depth: int) -> float:
        """Drafting cost of ``num_requests`` requests drafting ``depth`` positions each:
        draft_ms[R] * draft_depth_ms[depth] / draft_depth_ms[K] (draft_ms[R] without a depth
        table; 0 for no requests or depth 0)."""
    def step_draft_cost_ms(self, depths: npt.ArrayLike) -> float:
        """Drafting cost of a step whose requests draft ``depths[r]`` positions each (pass j runs
        over the requests drafting at least j positions)."""
    @property
    def draft_ms(self) -> npt.NDArray[np.float64]:
        """Drafter cost by number of requests, float64 [max_num_reqs + 1] (a copy)."""
    @property
    def verify_ms(self) -> npt.NDArray[np.float64]:
        """Target cost by number of tokens, float64 [max_batch_tokens + 1] (a copy)."""
    @property
    def max_num_reqs(self) -> int:
        """Largest request count the draft table covers."""
    @property
    def max_batch_tokens(self) -> int:
        """Largest token count the verify table covers."""
    def to_json(self) -> str:
        """``{"draft_ms": [...], "verify_ms": [...]}`` (plus ``"draft_depth_ms"``), round-tripping
        bit-exactly."""
    @classmethod
    def from_json(cls, text: str) -> CostTables:
        """Tables from ``to_json()`` output; text that is not that format raises StateError (a
        ValueError) naming json."""
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
    """One step's plan: the budget, admitted drafts per request, the tokens it is expected to emit,
    and its predicted cost."""
    @property
    def budget(self) -> int:
        """Total drafts to verify (the admitted counts sum to it)."""
    @property
    def admitted(self) -> npt.NDArray[np.int32]:
        """Admitted drafts per request, int32 [R]."""
    @property
    def expected_accepted_tokens(self) -> float:
        """s + the survivals of the admitted slots (current confidences)."""
    @property
    def predicted_cost_ms(self) -> float:
        """draft_ms[R] + verify_ms[T + budget]."""
    def __iter__(self) -> Any: ...

@final
class VerificationPlanner:
    """Plans every decode step, remembering each request slot's confidences of the previous step so
    the budget can be sized from them (budget_source="previous", the default)."""
    def __new__(
        cls,
        cost_tables: CostTables,
        num_positions: int,
        *,
        num_slots: int | None = None,
        budget_source: Literal["previous", "current"] | str = "previous",
        exploration: float = 0.01,
        exploration_seed: int = 0,
    ) -> VerificationPlanner: ...
    @property
    def exploration(self) -> float:
        """Probability that a request verifies its whole draft block in a step (exploration
        floor)."""
    def add_request(self, slot: int) -> None:
        """A new request took ``slot``: its remembered confidences restart at 1.0."""
    def plan(
        self,
        slots: npt.ArrayLike,
        confidences: npt.ArrayLike,
        scheduled_drafts: npt.ArrayLike,
        *,
        num_non_draft_tokens: int,
        num_sampling_requests: int,
        max_draft_budget: int | None = None,
    ) -> VerificationPlan:
        """Plans one step for the requests in ``slots`` and remembers this step's confidences of
        the positions each request drafted (``scheduled_drafts``); the rest keep their earlier
        values."""
    def choose_draft_depth(
        self,
        slots: npt.ArrayLike,
        max_depths: npt.ArrayLike,
        *,
        num_non_draft_tokens: int,
        num_sampling_requests: int,
        max_draft_budget: int | None = None,
        mode: Literal["batch", "per_request"] | str = "batch",
    ) -> DepthPlan:
        """How many positions each request in ``slots`` should draft at the coming step, from the
        confidences remembered for its slot. Requests the next ``plan`` explores draft as deep
        as the batch does, and their whole ``max_depths[r]`` in an exploration step (probability
        ``exploration``). Changes no state. The cost tables need a draft-depth table."""
    def remember(
        self, slots: npt.ArrayLike, confidences: npt.ArrayLike, scheduled_drafts: npt.ArrayLike
    ) -> None:
        """Remembers this step's confidences of the positions each request drafted
        (``scheduled_drafts``), as ``plan`` does, without planning (verification planned
        elsewhere)."""
    def previous_confidences(self, slot: int) -> npt.NDArray[np.float64]:
        """The confidences remembered for ``slot``, float64 [K] (what the next budget reads)."""
    @property
    def exploration_seed(self) -> int:
        """The seed of the exploration draws."""
    def set_exploration(self, exploration: float, *, exploration_seed: int = 0) -> None:
        """Sets the exploration floor: probability ``exploration`` in [0, 1] (0 turns it off),
        draws from ``exploration_seed``. The step count is kept. A rejected call changes
        nothing."""
    def count_step(self) -> None:
        """Counts one step without planning it (verification planned elsewhere): advances the
        step count that the exploration draws read, as ``plan`` does. Call it once per step,
        after ``choose_draft_depth``."""
    def coming_explorers(self, slots: npt.ArrayLike) -> tuple[bool, npt.NDArray[np.bool_]]:
        """The exploration draws of the coming step (the one the next ``choose_draft_depth``
        decides and the next ``plan`` or ``count_step`` counts): ``(exploration_step,
        explorers)``, where ``explorers[r]`` says whether request ``slots[r]`` explores and
        ``exploration_step`` whether explorers draft their whole block. Changes no state."""
    def to_bytes(self) -> bytes:
        """The planner's state (tables, settings, step count, remembered confidences) as versioned,
        checksummed bytes; ``from_bytes`` restores it."""
    @classmethod
    def from_bytes(cls, data: bytes) -> VerificationPlanner:
        """Rebuilds a planner from ``to_bytes()`` (of this release or an earlier one); corrupt,
        truncated or future-version data raises StateError (a ValueError)."""
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes ``to_bytes()`` to ``path`` atomically (temporary file, fsync, rename): a crash
        leaves the old file intact."""
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> VerificationPlanner:
        """Loads a planner written by ``save``; a corrupt, truncated or future-version file raises
        StateError (a ValueError) naming the path."""
    def copy(self) -> VerificationPlanner:
        """An independent planner with the same tables, settings and remembered confidences."""
    def __copy__(self) -> VerificationPlanner: ...
    def __deepcopy__(self, memo: Any, /) -> VerificationPlanner: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...
    @property
    def cost_tables(self) -> CostTables:
        """The cost tables the planner prices steps with."""
    @property
    def num_slots(self) -> int:
        """Number of request slots."""
    @property
    def num_positions(self) -> int:
        """Draft positions per request, K."""
    @property
    def budget_source(self) -> str:
        """ "previous" or "current"."""

@final
class DepthPlan:
    """How deep to draft this step: depths per request and what the decision anticipates."""
    @property
    def depths(self) -> npt.NDArray[np.int32]:
        """Positions to draft per request, int32 [R] (all 0: run the step without the drafter)."""
    @property
    def max_depth(self) -> int:
        """The deepest depth drafted by any request."""
    @property
    def drafts(self) -> int:
        """Total positions to draft."""
    @property
    def budget(self) -> int:
        """The verification budget the decision anticipates."""
    @property
    def expected_accepted_tokens(self) -> float:
        """s + the anticipated budget's survivals."""
    @property
    def predicted_cost_ms(self) -> float:
        """Drafting cost of the depths plus verify_ms[T + budget]."""

def write_atomically(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Writes ``data`` to ``path`` atomically: a temporary file in the same directory, flushed
    to disk, then renamed over ``path``, so a reader or a crash sees the old file or the whole
    new one. The writer of every ``save``."""

def check_environment() -> None:
    """Checks the environment variables the core reads (``AV_CORE_SIMD``: ``baseline``,
    ``avx2``, ``avx512`` or unset, any case); ValueError naming the variable and its value
    otherwise (the core then runs its baseline kernels). ``import av_core`` warns, the CLI exits
    2 and the vLLM plugin refuses to install on such a value."""

def choose_draft_depth(
    confidences: npt.ArrayLike,
    max_depths: npt.ArrayLike,
    *,
    num_non_draft_tokens: int,
    num_sampling_requests: int,
    cost_tables: CostTables,
    max_draft_budget: int | None = None,
    mode: Literal["batch", "per_request"] | str = "batch",
) -> DepthPlan:
    """How many positions each request should draft, decided before drafting from confidences fixed
    before it (the previous step's): mode "batch" (one depth, capped per request) or
    "per_request". The cost tables need a draft-depth table."""

def choose_draft_budget(
    confidences: npt.ArrayLike,
    scheduled_drafts: npt.ArrayLike,
    *,
    num_non_draft_tokens: int,
    num_sampling_requests: int,
    cost_tables: CostTables,
    max_draft_budget: int | None = None,
) -> int:
    """The draft budget: the first b maximising (s + sum of the top-b survivals) / (draft_ms[R] +
    verify_ms[T + b])."""

def assign_draft_budget(
    confidences: npt.ArrayLike, scheduled_drafts: npt.ArrayLike, budget: int
) -> npt.NDArray[np.int32]:
    """Admitted drafts per request, int32 [R]: the ``budget`` highest survivals, a prefix of each
    request."""

def plan_verification(
    confidences: npt.ArrayLike,
    scheduled_drafts: npt.ArrayLike,
    *,
    num_non_draft_tokens: int,
    num_sampling_requests: int,
    cost_tables: CostTables,
    max_draft_budget: int | None = None,
    budget_confidences: npt.ArrayLike | None = None,
) -> VerificationPlan:
    """Budget and assignment in one call; the budget is sized from ``budget_confidences`` when
    given (the previous step's), else from ``confidences``."""

def draft_log_odds_bf16(
    logits: npt.NDArray[np.int16],
    inv_temperature: npt.NDArray[np.float32],
    max_log_odds: float,
    row_valid: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.float32]:
    """``draft_log_odds_f32`` for bfloat16 logits given as their bit patterns: a C-contiguous int16
    ``[N, V]`` array (``tensor.view(torch.int16).numpy()``, no copy). Gives exactly the feature
    of the logits widened to float32."""

def draft_log_odds_f32(
    logits: npt.NDArray[np.float32],
    inv_temperature: npt.NDArray[np.float32],
    max_log_odds: float,
    row_valid: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.float32]:
    """``logit(q_max)`` of each row of float32 ``[N, V]`` logits, as float32 ``[N]``.

    ``inv_temperature`` is float32 ``[N]`` (``1 / T``; 1 for greedy rows; NaN gives a NaN row);
    ``row_valid``, optional bool ``[N]``, marks the rows to compute (the others give 0); both in
    any layout. The logits are read in place and must be C-contiguous and aligned (ValueError
    otherwise)."""
