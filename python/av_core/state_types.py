"""The shapes of the dicts the native module returns: :meth:`AcceptanceEstimator.state_dict`
and its parts, the report of ``refit(report=True)``, and the estimator's keyword options (the
core's defaults ``av_core._native.ESTIMATOR_DEFAULTS`` and vLLM preset
``av_core._native.VLLM_ESTIMATOR``, both read-only mappings at run time).

For annotations only: at run time these are plain ``dict`` objects (the mappings excepted), which
``from_state_dict`` and ``add_round_stats`` validate field by field, refusing a key no field
holds. The shapes are the core's serde declaration of the state (``av_core/src/estimator``);
statistics are exact fixed-point integers in units of ``2**-fraction_bits``.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = [
    "EstimatorConfigDict",
    "EstimatorConfigFields",
    "EstimatorOptions",
    "EstimatorStateDict",
    "HistogramDict",
    "HistogramMemoryDict",
    "MapEstimatorStateDict",
    "MapRefitReport",
    "MemoryStateDict",
    "ReferenceDict",
    "RefitReport",
    "RoundStatsDict",
]


class _Settings(TypedDict):
    """The options every configuration states, the refit interval aside."""

    damping: float
    l2: float
    init_slope: float
    init_intercept: float
    max_log_odds: float
    max_step: float
    max_slope: float
    max_intercept: float
    memory: float
    drift_z: float


class EstimatorOptions(_Settings):
    """The keyword options of :class:`~av_core.AcceptanceEstimator` (all but ``num_positions``),
    as the core defines them (``EstimatorConfig`` in ``av_core/src/estimator/config.rs``): what
    ``ESTIMATOR_DEFAULTS`` and ``VLLM_ESTIMATOR`` hold (a refit interval of 100; ``update``
    ``"map"`` in the defaults, ``"vllm"`` in vLLM's preset)."""

    refit_interval: int
    update: str


class EstimatorConfigDict(_Settings):
    """``state_dict()["config"]``: the options and the number of draft positions K
    (``refit_interval`` None: manual refits, only when ``refit()`` is called)."""

    num_positions: int
    refit_interval: int | None


class EstimatorConfigFields(EstimatorConfigDict):
    """Every field of an estimator's configuration (``AcceptanceEstimator.config.to_dict()``,
    and ``state_dict()["config"]`` of format version 2): the options, K and the update's
    settings."""

    update: str
    bins: int
    prior_slope_sd: float
    prior_level_sd: float
    prior_trend_sd: float
    prior_spread_sd: float


class RoundStatsDict(TypedDict):
    """``state_dict()["round_stats"]``: the open round's sufficient statistics, one entry per
    position in each list, with weights ``w = p (1 - p)`` and residuals ``r = y - p``: ``a`` =
    Σ w x², ``b`` = Σ w x, ``c`` = Σ w, ``g0`` = Σ r x, ``g1`` = Σ r, ``n``: labeled
    observations."""

    fraction_bits: int
    a: list[int]
    b: list[int]
    c: list[int]
    g0: list[int]
    g1: list[int]
    n: list[int]


class HistogramDict(TypedDict):
    """``state_dict()["round_stats"]`` under ``update="map"``: the open round's per-position
    histograms of the feature, ``bins`` per position, position-major (entry ``k * bins + j``):
    ``count`` labeled drafts, ``accepted`` of them accepted (plain integers), ``x_sum``
    Σ (x + max_log_odds) of the clamped features, in units of ``2**-fraction_bits``."""

    fraction_bits: int
    bins: int
    count: list[int]
    accepted: list[int]
    x_sum: list[int]


class _RefitStep(TypedDict):
    """What a refit report adds to the round's statistics."""

    slope_step: float
    intercept_steps: list[float]
    drift_statistic: float
    #: Newton iterations of the map fit (0 under vllm, and when nothing new arrived).
    iterations: int
    #: Whether the refit ended the round (``refit(end_round=...)``).
    end_round: bool


class RefitReport(RoundStatsDict, _RefitStep):
    """``refit(report=True)`` under ``update="vllm"``: the round's statistics, the Newton step
    taken from them (before the step and range bounds) and the round's drift statistic (about
    chi-square with K + 1 degrees of freedom while the coefficients it was collected under
    fit)."""


class MapRefitReport(HistogramDict, _RefitStep):
    """``refit(report=True)`` under ``update="map"``: the round's histograms and the fit's step,
    drift statistic, iterations and whether it ended the round, as in :class:`RefitReport`."""


class MemoryStateDict(TypedDict):
    """``state_dict()["memory_state"]``: the discounted quadratic model of past rounds (``a``,
    ``b``, ``c``: its slope-slope, slope-intercept and intercept entries; ``rhs``: its right-hand
    side, slope first, K + 1 entries; ``total``, ``counts``: discounted observation counts;
    ``resets``: rounds whose drift test dropped it)."""

    a: float
    b: list[float]
    c: list[float]
    rhs: list[float]
    total: float
    counts: list[float]
    resets: int


class EstimatorStateDict(TypedDict):
    """:meth:`AcceptanceEstimator.state_dict` under ``update="vllm"``: everything
    ``from_state_dict`` restores bit-exactly (``format``: ``"av_core.AcceptanceEstimator"``,
    ``format_version``: 1 at the map settings' defaults, else 2 with every configuration
    field)."""

    format: str
    format_version: int
    config: EstimatorConfigDict
    slope: float
    intercepts: list[float]
    round_stats: RoundStatsDict
    steps_since_refit: int
    num_refits: int
    memory_state: MemoryStateDict


class ReferenceDict(TypedDict):
    """``state_dict()["reference"]`` under ``update="map"``: the coefficients of the last
    round's end, which every fit inside the next round starts from and is bounded around."""

    slope: float
    intercepts: list[float]


class HistogramMemoryDict(TypedDict):
    """``state_dict()["memory_state"]`` under ``update="map"``: past rounds' histograms, each
    discounted by γ per round (``count``, ``accepted``, ``x_sum`` as floats, Σ x in feature
    units); ``resets``: rounds whose drift test dropped them."""

    count: list[float]
    accepted: list[float]
    x_sum: list[float]
    resets: int


class MapEstimatorStateDict(TypedDict):
    """:meth:`AcceptanceEstimator.state_dict` under ``update="map"`` (the default): format
    version 2, every configuration field, the open round's histograms, the reference
    coefficients, the labels fitted in this round and the histogram memory."""

    format: str
    format_version: int
    config: EstimatorConfigFields
    slope: float
    intercepts: list[float]
    round_stats: HistogramDict
    steps_since_refit: int
    num_refits: int
    reference: ReferenceDict
    fitted_labels: int
    memory_state: HistogramMemoryDict
