"""The cost-aware policy for SGLang's adaptive speculative decoding (its ``AdaptiveSpecPolicy``
interface, ``sglang/srt/speculative/adaptive_runtime_state.py``), and what it reads: SGLang's
candidate steps and av_core cost tables.

:class:`CostAwarePolicy` satisfies the same interface and chooses, among SGLang's candidate steps,
the one with the most expected tokens per millisecond:

- **Acceptance** from av_core's :class:`~av_core.AcceptanceEstimator`, fed every verify's accepted
  draft counts (the ``steps`` drafts of each request admitted, ``accepted`` of them accepted).
  With no drafter logits the feature is a constant 0, so the fit is one intercept per position
  (``p_j = σ(β_j)``). :meth:`CostAwarePolicy.record_draft_features` lets a hook that has the
  drafter's ``logit(q_max)`` hand it over (``drafter_features=True``): the full model is then fit,
  and the survivals are averaged over the recently drafted rows.
- **Cost** from av_core :class:`~av_core.CostTables` (``CostTables.from_curves`` on SGLang-style
  profiled ``(size, ms)`` curves, or an ``av-core profile`` file via :func:`load_cost_tables`),
  with a draft-cost-by-depth table: ``C(s) = draft(B, s) + verify[B·(s + 1)]`` (SGLang verifies
  every drafted token, ``s + 1`` per request with ``topk = 1``; a batch beyond the tables is
  priced along their last segment and counted in ``counters.beyond_tables``), and
  ``E(s) = B·(1 + S_1 + … + S_s)`` with ``S_j = p_1⋯p_j``. It picks the first ``s`` maximising
  ``E/C``; 0 (no speculation) when drafting does not pay. (av_core's batch depth rule,
  ``choose_draft_depth``, in the form SGLang runs: no verification budget below ``B·s``, only the
  candidate steps that have runtime states.)
- **Hysteresis**: it keeps the step it runs unless another candidate's ``E/C`` is more than
  ``hysteresis`` (relative, default 2%) above it, so it does not flap between runtime states.
- **Probes**: at ``s`` steps positions past ``s`` get no verdicts (at 0, none at all). Once every
  ``probe_interval`` batches (default 100) run below the largest candidate, it runs one batch at
  the next larger candidate and refits on its verdicts, so it never stays locked at 0 and comes
  back when acceptance and load allow (a bounded exploration, like the planner's floor).
- **Deterministic**: the choice depends only on the sequence of calls (the estimator's
  statistics are fixed-point; probes are counted, not drawn), so every tensor-parallel rank that
  sees the same verdicts makes the same choice without a collective, as SGLang's adaptive mode
  requires.
- **What ran, not what was chosen**: SGLang main reports every runtime state it activates
  (``on_state_activated``) and may pass the steps a verified batch ran (``num_steps``); under
  DP attention (sgl-project/sglang#35898) a batch runs the minimum of the ranks' choices. The
  verdicts are learnt with the steps that ran (positions never drafted are not rejections), and a
  probe the minimum cancelled is retried at the next decision until it runs, so ranks that all
  sit at 0 still probe together.

:class:`ProfilingCostAwarePolicy` takes ``C(s)`` from SGLang main's start-up profiling
(``AdaptiveProfilingPolicy``: whole decode steps timed on SGLang's own runtime states).

It is lossless: the step count is chosen before drafting, from past verdicts only.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from av_core._native import (
    ESTIMATOR_DEFAULTS,
    AcceptanceEstimator,
    CostTables,
    InvalidTypeError,
    InvalidValueError,
)


@dataclass
class _Launch:
    """A decode batch the policy chose steps for and whose verify has not come back yet."""

    batch_size: int
    steps: int
    probe: bool
    features: npt.NDArray[np.float32] | None = None
    #: The steps the batch ran, once known: SGLang main's ``on_state_activated`` (the state the
    #: controller activated for it) or ``num_steps``; they differ from ``steps`` where the
    #: controller runs something else (under DP attention, the minimum over ranks).
    ran: int | None = None


@dataclass
class _Counters:
    """What the policy did (for logs and tests)."""

    decisions: int = 0
    probes: int = 0
    switches: int = 0
    observed: int = 0
    unmatched: int = 0
    inconsistent: int = 0
    without_features: int = 0
    beyond_tables: int = 0  # decisions for a batch the cost tables do not cover (extrapolated)
    overridden: int = 0  # batches that ran other steps than the policy chose (e.g. DP minimum)
    unpriced: int = 0  # decisions with no cost for any candidate (no tables, no profile yet)
    by_step: dict[int, int] = field(default_factory=dict)


def _steps_list(value: object, name: str) -> list[int]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidTypeError(f"{name} must be a sequence of ints, got {value!r}")
    steps = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | np.integer):
            raise InvalidTypeError(f"{name} must hold ints, got {item!r}")
        if item < 0:
            raise InvalidValueError(f"{name} must hold steps >= 0, got {item}")
        steps.append(int(item))
    if not steps:
        raise InvalidValueError(f"{name} must not be empty")
    return sorted(set(steps))


class CostAwarePolicy:
    """SGLang's ``AdaptiveSpecPolicy``, choosing steps by expected tokens per ms (module doc).

    ``cost_tables``: av_core :class:`~av_core.CostTables` covering the batch sizes served; without
    a draft-depth table, ``drafter`` (``"autoregressive"``: one drafter pass per step, EAGLE's
    shape; or ``"parallel"``) supplies one. ``candidate_steps``: SGLang's candidate steps, either
    one list for every batch size or SGLang's tiers, ``{batch-size key: steps}`` (a batch goes to
    the largest key not above its size, after padding to a captured CUDA-graph size as SGLang
    does); the union sizes SGLang's runtime states and ``K`` = its maximum. ``initial_steps``:
    the step SGLang starts on (``--speculative-num-steps``). ``hysteresis``: relative margin a
    better candidate must clear to replace the running one. ``probe_interval``: batches below the
    largest candidate between probes (``None``: never probe; it can then lock itself at 0).
    ``draft_extend_at_zero``: charge one drafter pass at 0 steps (SGLang runs the drafter's
    extend at 0 steps unless ``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND`` is set).
    ``drafter_features``: learn from :meth:`record_draft_features` rows (batches without them
    are not observed). ``estimator``: an :class:`~av_core.AcceptanceEstimator` with ``K``
    positions (default: a new one with ``refit_interval`` and ``memory``).
    """

    #: Whether the policy needs cost tables (the profiling policy can price from SGLang's own).
    _needs_tables = True

    def __init__(
        self,
        cost_tables: CostTables | None,
        candidate_steps: Sequence[int] | Mapping[int, Sequence[int]],
        *,
        initial_steps: int | None = None,
        drafter: Literal["autoregressive", "parallel"] = "autoregressive",
        hysteresis: float = 0.02,
        probe_interval: int | None = 100,
        draft_extend_at_zero: bool = False,
        drafter_features: bool = False,
        estimator: AcceptanceEstimator | None = None,
        refit_interval: int = ESTIMATOR_DEFAULTS["refit_interval"],
        memory: float | None = None,
        feature_rows: int = 256,
    ) -> None:
        if cost_tables is None and self._needs_tables:
            raise InvalidTypeError(
                "cost_tables must be av_core.CostTables (only ProfilingCostAwarePolicy, which "
                "prices steps from SGLang's own profiling, runs without), got None"
            )
        if cost_tables is not None and not isinstance(cost_tables, CostTables):
            raise InvalidTypeError(
                f"cost_tables must be av_core.CostTables, got {type(cost_tables)!r}"
            )
        if isinstance(candidate_steps, Mapping):
            if not candidate_steps:
                raise InvalidValueError("candidate_steps must not be empty")
            tiers: dict[int, list[int]] = {}
            for key, steps in candidate_steps.items():
                if isinstance(key, bool) or not isinstance(key, int | np.integer) or key < 0:
                    raise InvalidValueError(
                        f"candidate_steps keys must be batch sizes >= 0, got {key!r}"
                    )
                tiers[int(key)] = _steps_list(steps, f"candidate_steps[{key}]")
        else:
            tiers = {1: _steps_list(candidate_steps, "candidate_steps")}
        union = sorted({s for steps in tiers.values() for s in steps})
        if union[-1] < 1:
            raise InvalidValueError(f"candidate_steps must include a step >= 1, got {union}")
        k = union[-1]
        if drafter not in ("autoregressive", "parallel"):
            raise InvalidValueError(
                f"drafter must be 'autoregressive' or 'parallel', got {drafter!r}"
            )
        if cost_tables is None:
            pass
        elif cost_tables.max_draft_depth is None:
            cost_tables = cost_tables.with_draft_depth(drafter, max_depth=k)
        elif cost_tables.max_draft_depth != k:
            raise InvalidValueError(
                f"cost_tables: the draft-depth table covers {cost_tables.max_draft_depth} "
                f"positions, the candidate steps {k}"
            )
        if not (isinstance(hysteresis, float | int) and math.isfinite(hysteresis)) or (
            hysteresis < 0
        ):
            raise InvalidValueError(f"hysteresis must be a finite number >= 0, got {hysteresis!r}")
        if probe_interval is not None and (
            isinstance(probe_interval, bool)
            or not isinstance(probe_interval, int)
            or probe_interval < 1
        ):
            raise InvalidValueError(
                f"probe_interval must be an int >= 1 or None, got {probe_interval!r}"
            )
        if initial_steps is not None and (
            isinstance(initial_steps, bool) or not isinstance(initial_steps, int)
        ):
            raise InvalidTypeError(f"initial_steps must be an int or None, got {initial_steps!r}")
        if isinstance(feature_rows, bool) or not isinstance(feature_rows, int) or feature_rows < 1:
            raise InvalidValueError(f"feature_rows must be an int >= 1, got {feature_rows!r}")
        if estimator is None:
            estimator = (
                AcceptanceEstimator(k, refit_interval=refit_interval)
                if memory is None
                else AcceptanceEstimator(k, refit_interval=refit_interval, memory=memory)
            )
        elif not isinstance(estimator, AcceptanceEstimator):
            raise InvalidTypeError(
                f"estimator must be av_core.AcceptanceEstimator, got {estimator!r}"
            )
        elif estimator.num_positions != k:
            raise InvalidValueError(
                f"estimator has {estimator.num_positions} positions, the candidate steps {k}"
            )
        self._tables = cost_tables
        self._tiers = tiers
        self._keys = sorted(tiers)
        self._union = union
        self._k = k
        self._hysteresis = float(hysteresis)
        self._probe_interval = probe_interval
        self._draft_extend_at_zero = bool(draft_extend_at_zero)
        self._drafter_features = bool(drafter_features)
        self._estimator = estimator
        self._graph_bs: list[int] | None = None
        self._current: dict[int, int | None] = {
            key: initial_steps if initial_steps in steps else None for key, steps in tiers.items()
        }
        self._since_probe = 0
        self._probe_due = False
        self._active: int | None = None
        self._pending: deque[_Launch] = deque(maxlen=8)
        self._feature_rows: deque[npt.NDArray[np.float32]] = deque(maxlen=feature_rows)
        self._survival_key: tuple[int, int] | None = None
        self._survival = np.ones(k, dtype=np.float64)
        self._rows_version = 0
        self.counters = _Counters()

    # --- SGLang's AdaptiveSpecPolicy ----------------------------------------------------------

    @property
    def candidate_steps(self) -> list[int]:
        """Every step the policy may choose (the union over tiers), ascending."""
        return list(self._union)

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        """The batch sizes SGLang captured CUDA graphs for (``None``: graphs disabled)."""
        self._graph_bs = sorted(int(b) for b in cuda_graph_bs) if cuda_graph_bs else None

    def get_steps_for_batch(self, batch_size: int) -> int:
        """The steps for the decode batch about to run (one decision per call)."""
        batch = _batch_size(batch_size)
        key = self._route(batch)
        allowed = self._tiers[key]
        if self._pending:
            self._settle(self._pending[-1])
        if batch == 0:
            current = self._current[key]
            return current if current is not None else allowed[0]
        rates = self._rates(batch, allowed)
        if self._beyond(batch, allowed):
            self.counters.beyond_tables += 1
        current = self._current[key]
        if not rates:  # nothing to price with yet: stay where SGLang started
            self.counters.unpriced += 1
            best = current if current is not None else allowed[len(allowed) // 2]
        else:
            best = max(rates, key=lambda s: (rates[s], -s))
        choice = best
        if (
            current is not None
            and current in rates
            and best in rates
            and rates[best] <= rates[current] * (1.0 + self._hysteresis)
        ):
            choice = current
        if current is not None and choice != current:
            self.counters.switches += 1
        self._current[key] = choice
        run, probe = choice, False
        higher = [s for s in allowed if s > choice]
        if self._probe_interval is not None and higher:
            self._since_probe += 1
            if self._probe_due or self._since_probe > self._probe_interval:
                run, probe = higher[0], True
                self._since_probe = 0
                self._probe_due = False
                self.counters.probes += 1
        self.counters.decisions += 1
        self.counters.by_step[run] = self.counters.by_step.get(run, 0) + 1
        self._pending.append(_Launch(batch, run, probe))
        return run

    def on_verify_complete(
        self,
        num_correct_drafts_per_req: list[int],
        batch_size: int,
        num_steps: int | None = None,
    ) -> int | None:
        """Learns from a verify's accepted draft counts; ``num_steps`` (SGLang main) is the
        steps that batch ran, else they are the state activated for it (``on_state_activated``)
        or, with neither, the steps chosen. Returns ``None``: the next
        ``get_steps_for_batch`` decides (switching here would change the steps of a batch
        already in flight under overlap scheduling)."""
        batch = _batch_size(batch_size)
        if num_steps is not None:
            num_steps = _steps_value(num_steps, "num_steps")
        counts = np.asarray(list(num_correct_drafts_per_req), dtype=np.int64).reshape(-1)
        launch = None
        while self._pending:
            candidate = self._pending.popleft()
            if candidate.batch_size == batch:
                launch = candidate
                break
        if launch is None or counts.shape[0] != batch:
            self.counters.unmatched += 1
            return None
        self._settle(launch)
        steps = launch.ran if num_steps is None else num_steps
        assert steps is not None
        if steps == 0 or batch == 0:
            return None
        if np.any(counts < 0) or np.any(counts > steps):
            self.counters.inconsistent += 1
            return None
        if self._drafter_features:
            if launch.features is None:
                self.counters.without_features += 1
                return None
            features = launch.features
        else:
            features = np.zeros((batch, self._k), dtype=np.float32)
        admitted = np.full(batch, steps, dtype=np.int32)
        self._estimator.observe(features, admitted, counts.astype(np.int32))
        if launch.probe and steps >= launch.steps:
            self._estimator.refit()
        self.counters.observed += 1
        return None

    def on_state_activated(self, steps: int) -> None:
        """SGLang main's controller reports every runtime state it activates (its
        ``_activate``: at start-up, while profiling, and for a batch whose steps differ from the
        running state's). The batch launched last runs the state active when the next decision
        is asked for, which is how a step count the controller overrides (under DP attention,
        the minimum over ranks) reaches the verdicts' bookkeeping."""
        self._active = _steps_value(steps, "steps")

    def _settle(self, launch: _Launch) -> None:
        """Fixes the steps ``launch`` ran (module doc); a probe that did not run is retried at
        the next decision (under DP attention it runs once every rank probes)."""
        if launch.ran is not None:
            return
        launch.ran = launch.steps if self._active is None else self._active
        if launch.ran != launch.steps:
            self.counters.overridden += 1
            if launch.probe and launch.ran < launch.steps:
                self._probe_due = True

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        """The captured batch sizes whose tier may run ``step`` (``None``: graphs disabled)."""
        if self._graph_bs is None:
            return None
        return [b for b in self._graph_bs if step in self._tiers[self._tier_key(b)]]

    # --- av_core additions --------------------------------------------------------------------

    def record_draft_features(self, features: npt.ArrayLike) -> None:
        """The drafter's ``logit(q_max)`` of the batch just drafted, ``[batch, steps]`` (or wider;
        needs ``drafter_features=True``). Call it after drafting and before that batch's
        ``on_verify_complete``; it changes no choice already made."""
        if not self._drafter_features:
            raise InvalidValueError(
                "record_draft_features needs CostAwarePolicy(drafter_features=True)"
            )
        if not self._pending:
            raise InvalidValueError("record_draft_features: no batch is waiting for its verify")
        launch = self._pending[-1]
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[0] != launch.batch_size or x.shape[1] < launch.steps:
            raise InvalidValueError(
                f"features must be [{launch.batch_size}, >= {launch.steps}] for the batch just "
                f"drafted, got shape {x.shape}"
            )
        if not np.all(np.isfinite(x[:, : launch.steps])):
            raise InvalidValueError("features must be finite")
        row = np.full((launch.batch_size, self._k), np.nan, dtype=np.float32)
        row[:, : launch.steps] = x[:, : launch.steps]
        self._feature_rows.extend(row)
        self._rows_version += 1
        filled = row.copy()
        filled[np.isnan(filled)] = 0.0
        launch.features = filled

    @property
    def estimator(self) -> AcceptanceEstimator:
        return self._estimator

    @property
    def cost_tables(self) -> CostTables | None:
        return self._tables

    @property
    def num_positions(self) -> int:
        """``K``: the largest candidate step."""
        return self._k

    def survivals(self) -> npt.NDArray[np.float64]:
        """``S_j`` for ``j = 1..K``: the expected probability that the first ``j`` drafts are
        all accepted, from the estimator as it stands."""
        key = (self._estimator.num_refits, self._rows_version)
        if key != self._survival_key:
            self._survival = self._compute_survivals()
            self._survival_key = key
        return self._survival.copy()

    def expected_rates(self, batch_size: int) -> dict[int, float]:
        """``E(s)/C(s)`` (tokens per ms) of each candidate step of ``batch_size``'s tier;
        changes no state."""
        batch = _batch_size(batch_size)
        if batch == 0:
            raise InvalidValueError("batch_size must be >= 1 to price steps")
        return self._rates(batch, self._tiers[self._route(batch)])

    # --- internals ----------------------------------------------------------------------------

    def _compute_survivals(self) -> npt.NDArray[np.float64]:
        k = self._k
        if not self._drafter_features or not self._feature_rows:
            p = self._estimator.predict(np.zeros((1, k), dtype=np.float32))[0]
            return np.cumprod(p.astype(np.float64))
        rows = np.stack(list(self._feature_rows))
        mean = np.zeros(k, dtype=np.float32)
        seen = ~np.isnan(rows)
        for j in range(k):
            if seen[:, j].any():
                mean[j] = rows[seen[:, j], j].mean()
            elif j > 0:
                mean[j] = mean[j - 1]
        rows = np.where(seen, rows, mean[None, :]).astype(np.float32)
        p = self._estimator.predict(rows).astype(np.float64)
        return np.asarray(np.cumprod(p, axis=1).mean(axis=0))

    def _draft_ms(self, batch: int, depth: int) -> float:
        """Drafting ``depth`` steps for ``batch`` requests; past the tables' last batch size
        extended along their last segment (never below the last entry)."""
        if depth <= 0:
            return 0.0
        tables = self._tables
        assert tables is not None
        last = tables.max_num_reqs
        if batch <= last:
            return float(tables.draft_cost_ms(batch, depth))
        end = float(tables.draft_cost_ms(last, depth))
        before = float(tables.draft_cost_ms(last - 1, depth)) if last > 1 else 0.0
        return end + (batch - last) * max(end - before, 0.0)

    def _verify_ms(self, tokens: int) -> float:
        """Verifying ``tokens`` tokens; past the table's end extended along its last segment
        (a batch larger than the tables cover must not look free to speculate on)."""
        assert self._tables is not None
        verify = self._tables.verify_ms
        last = int(verify.shape[0]) - 1
        if tokens <= last:
            return float(verify[tokens])
        slope = max(float(verify[last] - verify[last - 1]), 0.0) if last > 0 else 0.0
        return float(verify[last]) + (tokens - last) * slope

    def _rates(self, batch: int, allowed: Sequence[int]) -> dict[int, float]:
        """``E(s)/C(s)`` of each candidate that has a cost."""
        survival = self.survivals()
        return {
            s: batch * (1.0 + float(survival[:s].sum())) / ms
            for s, ms in self._step_costs(batch, allowed).items()
        }

    def _step_costs(self, batch: int, allowed: Sequence[int]) -> dict[int, float]:
        """``C(s)`` in ms of each candidate: drafting and verifying from the cost tables."""
        if self._tables is None:
            return {}
        costs = {}
        for s in allowed:
            draft = self._draft_ms(batch, s)
            if s == 0 and self._draft_extend_at_zero:
                draft = self._draft_ms(batch, 1)
            costs[s] = draft + self._verify_ms(batch * (s + 1))
        return costs

    def _beyond(self, batch: int, allowed: Sequence[int]) -> bool:
        """Whether pricing ``batch`` extrapolates past what the costs cover."""
        tables = self._tables
        return tables is not None and (
            batch > tables.max_num_reqs or batch * (allowed[-1] + 1) >= tables.verify_ms.shape[0]
        )

    def _tier_key(self, batch: int) -> int:
        key = self._keys[0]
        for candidate in self._keys:
            if candidate <= batch:
                key = candidate
        return key

    def _padded(self, batch: int) -> int:
        """The CUDA-graph batch size SGLang pads ``batch`` to (itself past the largest)."""
        if self._graph_bs is not None:
            larger = [b for b in self._graph_bs if b >= batch]
            if larger:
                return larger[0]
        return batch

    def _route(self, batch: int) -> int:
        return self._tier_key(self._padded(batch))


def _steps_value(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidTypeError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise InvalidValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def _batch_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidTypeError(f"batch_size must be an int, got {value!r}")
    if value < 0:
        raise InvalidValueError(f"batch_size must be >= 0, got {value}")
    return int(value)


# --------------------------------------------------------------------------------------------
# configuration: candidate steps and cost tables


def config_candidate_steps(
    cfg_path: str | os.PathLike[str] | None, default: Mapping[str, Any]
) -> dict[int, list[int]]:
    """SGLang's adaptive config (the JSON at ``cfg_path``, or ``default`` — SGLang's
    ``DEFAULT_ADAPTIVE_CONFIG``) → ``{batch-size key: candidate steps}``. Keys that are not
    integers are settings, not tiers (as in SGLang); tuning keys of the EMA are ignored."""
    config = json.loads(Path(cfg_path).read_text()) if cfg_path is not None else default
    if not isinstance(config, Mapping):
        raise InvalidValueError(f"adaptive config {cfg_path}: expected a JSON object")
    tiers = {}
    for key, entry in config.items():
        if not str(key).isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, Mapping) else None
        tiers[int(key)] = _steps_list(steps, f"adaptive config {key!r} candidate_steps")
    if not tiers:
        raise InvalidValueError(f"adaptive config {cfg_path}: no batch-size tier (integer key)")
    return tiers


def load_cost_tables(
    path: str | os.PathLike[str],
    num_positions: int,
    *,
    drafter: Literal["autoregressive", "parallel"] = "autoregressive",
    max_batch: int = 1024,
) -> CostTables:
    """Cost tables from a file: ``CostTables.to_json`` output (``draft_ms``/``verify_ms``), or an
    ``av-core profile`` cost file (``verify``/``draft``/``draft_depth`` ``[size, ms]`` points, built
    with ``CostTables.from_curves`` for ``max_batch`` requests and ``max_batch·(K + 1)`` tokens;
    no ``draft`` curve: drafting free). Without a depth table, ``drafter`` gives the shape."""
    text = Path(path).read_text()
    data = json.loads(text)
    if not isinstance(data, Mapping):
        raise InvalidValueError(f"{path}: expected a JSON object")
    if "draft_ms" in data:
        tables = CostTables.from_json(text)
    elif "verify" in data:
        draft = data.get("draft") or [[1, 0.0]]
        depth = data.get("draft_depth") or None
        tables = CostTables.from_curves(
            draft,
            data["verify"],
            max_num_reqs=max_batch,
            max_batch_tokens=max_batch * (num_positions + 1),
            draft_depth_curve=depth,
            max_draft_depth=num_positions if depth else None,
        )
    else:
        raise InvalidValueError(
            f"{path}: neither a CostTables JSON nor an av-core profile cost file"
        )
    if tables.max_draft_depth is None:
        tables = tables.with_draft_depth(drafter, max_depth=num_positions)
    return tables
