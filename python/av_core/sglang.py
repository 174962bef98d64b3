"""SGLang 0.5.23: a cost-aware policy for its adaptive speculative decoding, backed by av_core.

SGLang's adaptive mode (``--speculative-adaptive``, EAGLE/EAGLE3, ``topk = 1``) switches the
drafting depth (``speculative_num_steps``) between pre-built runtime states through a small policy
interface, ``AdaptiveSpecPolicy`` (``sglang/srt/speculative/adaptive_runtime_state.py``), driven by
its ``AdaptiveController``: ``get_steps_for_batch(batch_size)`` before each decode batch,
``on_verify_complete(num_correct_drafts_per_req, batch_size)`` after its verify. Its built-in
policy (``AdaptiveSpeculativeParams``) follows an EMA of the accepted length through hand-written
per-batch-size candidate steps and is not cost-aware.

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
  every drafted token, ``s + 1`` per request with ``topk = 1``), and
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

It is lossless: the step count is chosen before drafting, from past verdicts only.

**Installing.** With ``AV_CORE_SGLANG=1`` the ``sglang.srt.plugins`` entry point
(:func:`register`, which SGLang calls in every scheduler process before building its workers)
runs :func:`install`: it checks SGLang's version and every signature and call site the policy
relies on (:func:`check_interface`) and, on any difference, raises
:class:`SglangCompatibilityError` listing them and patches nothing (SGLang logs the error and
keeps its own policy). Compatible, it rebinds ``AdaptiveSpeculativeParams`` in
``eagle_worker_v2`` (the only name ``EAGLEWorkerV2.__init__`` constructs its policy through) to a
factory that builds a :class:`CostAwarePolicy` with the candidate steps of SGLang's own adaptive
config (per batch-size tier, so the same runtime states and CUDA graphs are built) and the cost
tables of ``AV_CORE_SGLANG_COSTS`` (a ``CostTables.to_json`` file or an ``av-core profile`` cost
file). ``docs/sglang.md`` has the details. Nothing here imports SGLang except the installer.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import logging
import math
import os
import sys
import textwrap
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from av_core._native import AcceptanceEstimator, CostTables
from av_core.vllm_plugin import signature_text

__all__ = [
    "CONTROLLER_SIGNATURES",
    "ENV_ANY_VERSION",
    "ENV_COSTS",
    "ENV_DRAFTER",
    "ENV_ENABLE",
    "ENV_MAX_BATCH",
    "PARAMS_MODULE",
    "POLICY_METHODS",
    "POLICY_PROPERTIES",
    "RUNTIME_STATE_MODULE",
    "SUPPORTED_SGLANG_VERSIONS",
    "WORKER_MODULE",
    "CostAwarePolicy",
    "SglangCompatibilityError",
    "check_interface",
    "config_candidate_steps",
    "construction_sites",
    "install",
    "installed",
    "load_cost_tables",
    "policy_calls",
    "register",
    "uninstall",
]

logger = logging.getLogger("sglang.av_core")

ENV_ENABLE = "AV_CORE_SGLANG"
ENV_COSTS = "AV_CORE_SGLANG_COSTS"
ENV_DRAFTER = "AV_CORE_SGLANG_DRAFTER"
ENV_MAX_BATCH = "AV_CORE_SGLANG_MAX_BATCH"
ENV_ANY_VERSION = "AV_CORE_SGLANG_ANY_VERSION"
#: SGLang's own switch: at 0 steps it still runs the drafter's extend pass unless this is set.
ENV_SKIP_ZERO_STEP_EXTEND = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
SUPPORTED_SGLANG_VERSIONS = ("0.5.23",)
RUNTIME_STATE_MODULE = "sglang.srt.speculative.adaptive_runtime_state"
PARAMS_MODULE = "sglang.srt.speculative.adaptive_spec_params"
WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"

#: ``AdaptiveSpecPolicy``'s methods, as :func:`~av_core.vllm_plugin.signature_text` writes them;
#: :class:`CostAwarePolicy` has the same.
POLICY_METHODS: dict[str, str] = {
    "set_cuda_graph_bs": "(self, cuda_graph_bs)",
    "get_steps_for_batch": "(self, batch_size)",
    "on_verify_complete": "(self, num_correct_drafts_per_req, batch_size)",
    "cuda_graph_bs_for_step": "(self, step)",
}
POLICY_PROPERTIES = ("candidate_steps",)

#: The SGLang definitions the policy and the installer rely on: (module, dotted) → signature.
CONTROLLER_SIGNATURES: dict[tuple[str, str], str] = {
    (RUNTIME_STATE_MODULE, "AdaptiveController.__init__"): "(self, worker, policy)",
    (RUNTIME_STATE_MODULE, "AdaptiveController.init_states"): "(self, cuda_graph_bs=None)",
    (RUNTIME_STATE_MODULE, "AdaptiveController.activate_step_by_batch"): "(self, batch_size)",
    (RUNTIME_STATE_MODULE, "AdaptiveController.on_verify_complete"): (
        "(self, num_correct_drafts_per_req, batch_size)"
    ),
    (PARAMS_MODULE, "AdaptiveSpeculativeParams.__init__"): "(self, initial_steps, cfg_path=None)",
    (WORKER_MODULE, "EAGLEWorkerV2.on_verify_complete_cpu"): (
        "(self, num_correct_drafts_per_req, batch_size=0)"
    ),
    (WORKER_MODULE, "EAGLEWorkerV2.activate_step_by_batch"): "(self, batch_size)",
}


class SglangCompatibilityError(RuntimeError):
    """SGLang's interfaces differ from those the policy relies on; nothing was patched."""


# --------------------------------------------------------------------------------------------
# the policy


@dataclass
class _Launch:
    """A decode batch the policy chose steps for and whose verify has not come back yet."""

    batch_size: int
    steps: int
    probe: bool
    features: npt.NDArray[np.float32] | None = None


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
    by_step: dict[int, int] = field(default_factory=dict)


def _steps_list(value: object, name: str) -> list[int]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {value!r}")
    steps = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | np.integer):
            raise TypeError(f"{name} must hold ints, got {item!r}")
        if item < 0:
            raise ValueError(f"{name} must hold steps >= 0, got {item}")
        steps.append(int(item))
    if not steps:
        raise ValueError(f"{name} must not be empty")
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

    def __init__(
        self,
        cost_tables: CostTables,
        candidate_steps: Sequence[int] | Mapping[int, Sequence[int]],
        *,
        initial_steps: int | None = None,
        drafter: Literal["autoregressive", "parallel"] = "autoregressive",
        hysteresis: float = 0.02,
        probe_interval: int | None = 100,
        draft_extend_at_zero: bool = False,
        drafter_features: bool = False,
        estimator: AcceptanceEstimator | None = None,
        refit_interval: int = 100,
        memory: float | None = None,
        feature_rows: int = 256,
    ) -> None:
        if not isinstance(cost_tables, CostTables):
            raise TypeError(f"cost_tables must be av_core.CostTables, got {type(cost_tables)!r}")
        if isinstance(candidate_steps, Mapping):
            if not candidate_steps:
                raise ValueError("candidate_steps must not be empty")
            tiers: dict[int, list[int]] = {}
            for key, steps in candidate_steps.items():
                if isinstance(key, bool) or not isinstance(key, int | np.integer) or key < 0:
                    raise ValueError(f"candidate_steps keys must be batch sizes >= 0, got {key!r}")
                tiers[int(key)] = _steps_list(steps, f"candidate_steps[{key}]")
        else:
            tiers = {1: _steps_list(candidate_steps, "candidate_steps")}
        union = sorted({s for steps in tiers.values() for s in steps})
        if union[-1] < 1:
            raise ValueError(f"candidate_steps must include a step >= 1, got {union}")
        k = union[-1]
        if drafter not in ("autoregressive", "parallel"):
            raise ValueError(f"drafter must be 'autoregressive' or 'parallel', got {drafter!r}")
        if cost_tables.max_draft_depth is None:
            cost_tables = cost_tables.with_draft_depth(drafter, max_depth=k)
        elif cost_tables.max_draft_depth != k:
            raise ValueError(
                f"cost_tables: the draft-depth table covers {cost_tables.max_draft_depth} "
                f"positions, the candidate steps {k}"
            )
        if not (isinstance(hysteresis, float | int) and math.isfinite(hysteresis)) or (
            hysteresis < 0
        ):
            raise ValueError(f"hysteresis must be a finite number >= 0, got {hysteresis!r}")
        if probe_interval is not None and (
            isinstance(probe_interval, bool)
            or not isinstance(probe_interval, int)
            or probe_interval < 1
        ):
            raise ValueError(f"probe_interval must be an int >= 1 or None, got {probe_interval!r}")
        if initial_steps is not None and (
            isinstance(initial_steps, bool) or not isinstance(initial_steps, int)
        ):
            raise TypeError(f"initial_steps must be an int or None, got {initial_steps!r}")
        if isinstance(feature_rows, bool) or not isinstance(feature_rows, int) or feature_rows < 1:
            raise ValueError(f"feature_rows must be an int >= 1, got {feature_rows!r}")
        if estimator is None:
            estimator = (
                AcceptanceEstimator(k, refit_interval=refit_interval)
                if memory is None
                else AcceptanceEstimator(k, refit_interval=refit_interval, memory=memory)
            )
        elif not isinstance(estimator, AcceptanceEstimator):
            raise TypeError(f"estimator must be av_core.AcceptanceEstimator, got {estimator!r}")
        elif estimator.num_positions != k:
            raise ValueError(
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
        if batch == 0:
            current = self._current[key]
            return current if current is not None else allowed[0]
        rates = self._rates(batch, allowed)
        best = max(allowed, key=lambda s: (rates[s], -s))
        current = self._current[key]
        choice = best
        if current is not None and rates[best] <= rates[current] * (1.0 + self._hysteresis):
            choice = current
        if current is not None and choice != current:
            self.counters.switches += 1
        self._current[key] = choice
        run, probe = choice, False
        higher = [s for s in allowed if s > choice]
        if self._probe_interval is not None and higher:
            self._since_probe += 1
            if self._since_probe > self._probe_interval:
                run, probe = higher[0], True
                self._since_probe = 0
                self.counters.probes += 1
        self.counters.decisions += 1
        self.counters.by_step[run] = self.counters.by_step.get(run, 0) + 1
        self._pending.append(_Launch(batch, run, probe))
        return run

    def on_verify_complete(
        self, num_correct_drafts_per_req: list[int], batch_size: int
    ) -> int | None:
        """Learns from a verify's accepted draft counts. Returns ``None``: the next
        ``get_steps_for_batch`` decides (switching here would change the steps of a batch
        already in flight under overlap scheduling)."""
        batch = _batch_size(batch_size)
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
        if launch.steps == 0 or batch == 0:
            return None
        if np.any(counts < 0) or np.any(counts > launch.steps):
            self.counters.inconsistent += 1
            return None
        if self._drafter_features:
            if launch.features is None:
                self.counters.without_features += 1
                return None
            features = launch.features
        else:
            features = np.zeros((batch, self._k), dtype=np.float32)
        admitted = np.full(batch, launch.steps, dtype=np.int32)
        self._estimator.observe(features, admitted, counts.astype(np.int32))
        if launch.probe:
            self._estimator.refit()
        self.counters.observed += 1
        return None

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
            raise ValueError("record_draft_features needs CostAwarePolicy(drafter_features=True)")
        if not self._pending:
            raise ValueError("record_draft_features: no batch is waiting for its verify")
        launch = self._pending[-1]
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[0] != launch.batch_size or x.shape[1] < launch.steps:
            raise ValueError(
                f"features must be [{launch.batch_size}, >= {launch.steps}] for the batch just "
                f"drafted, got shape {x.shape}"
            )
        if not np.all(np.isfinite(x[:, : launch.steps])):
            raise ValueError("features must be finite")
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
    def cost_tables(self) -> CostTables:
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
            raise ValueError("batch_size must be >= 1 to price steps")
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

    def _rates(self, batch: int, allowed: Sequence[int]) -> dict[int, float]:
        survival = self.survivals()
        tables = self._tables
        requests = min(batch, tables.max_num_reqs)
        verify = tables.verify_ms
        rates = {}
        for s in allowed:
            tokens = batch * (1.0 + float(survival[:s].sum()))
            draft = tables.draft_cost_ms(requests, s) if s > 0 else 0.0
            if s == 0 and self._draft_extend_at_zero:
                draft = tables.draft_cost_ms(requests, 1)
            ms = draft + float(verify[min(batch * (s + 1), verify.shape[0] - 1)])
            rates[s] = tokens / ms
        return rates

    def _tier_key(self, batch: int) -> int:
        key = self._keys[0]
        for candidate in self._keys:
            if candidate <= batch:
                key = candidate
        return key

    def _route(self, batch: int) -> int:
        padded = batch
        if self._graph_bs is not None:
            larger = [b for b in self._graph_bs if b >= batch]
            if larger:
                padded = larger[0]
        return self._tier_key(padded)


def _batch_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"batch_size must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"batch_size must be >= 0, got {value}")
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
        raise ValueError(f"adaptive config {cfg_path}: expected a JSON object")
    tiers = {}
    for key, entry in config.items():
        if not str(key).isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, Mapping) else None
        tiers[int(key)] = _steps_list(steps, f"adaptive config {key!r} candidate_steps")
    if not tiers:
        raise ValueError(f"adaptive config {cfg_path}: no batch-size tier (integer key)")
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
        raise ValueError(f"{path}: expected a JSON object")
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
        raise ValueError(f"{path}: neither a CostTables JSON nor an av-core profile cost file")
    if tables.max_draft_depth is None:
        tables = tables.with_draft_depth(drafter, max_depth=num_positions)
    return tables


# --------------------------------------------------------------------------------------------
# the installer


@dataclass(frozen=True)
class _Replacement:
    owner: ModuleType
    attribute: str
    original: Any
    replacement: Any


_installed: list[_Replacement] = []


def _resolve(module: ModuleType, dotted: str) -> Any:
    value: Any = module
    for part in dotted.split("."):
        value = inspect.getattr_static(value, part)
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    return value


def _sglang_version() -> str:
    version = getattr(sys.modules.get("sglang"), "__version__", None)
    if version is None:
        version = getattr(importlib.import_module("sglang.version"), "__version__", None)
    return str(version)


def construction_sites(source: str) -> list[ast.Call]:
    """``AdaptiveController(self, AdaptiveSpeculativeParams(initial_steps=..., cfg_path=...))``
    calls in ``source`` (the inner call of each)."""
    found = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "AdaptiveController"
            and len(node.args) == 2
            and not node.keywords
        ):
            continue
        inner = node.args[1]
        if (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Name)
            and inner.func.id == "AdaptiveSpeculativeParams"
            and not inner.args
            and sorted(k.arg or "" for k in inner.keywords) == ["cfg_path", "initial_steps"]
        ):
            found.append(inner)
    return found


def policy_calls(source: str) -> dict[str, int]:
    """How often ``source`` (SGLang's ``AdaptiveController``) touches each member of its policy
    (``self.params.<name>``)."""
    counts: dict[str, int] = {}
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "params"
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"
        ):
            counts[node.attr] = counts.get(node.attr, 0) + 1
    return counts


def check_interface(modules: Mapping[str, ModuleType], version: str | None) -> list[str]:
    """Every difference between the live SGLang modules and what the policy and the installer
    rely on (empty when compatible). ``version=None`` skips the version check."""
    problems: list[str] = []
    if version is not None and version not in SUPPORTED_SGLANG_VERSIONS:
        problems.append(
            f"SGLang version {version} is not one av_core's policy was written against "
            f"({', '.join(SUPPORTED_SGLANG_VERSIONS)}); set {ENV_ANY_VERSION}=1 to try it "
            "anyway (the interface checks still apply)"
        )
    missing = [name for name in (RUNTIME_STATE_MODULE, PARAMS_MODULE, WORKER_MODULE)]
    missing = [name for name in missing if name not in modules]
    if missing:
        return [*problems, *(f"{name}: not imported" for name in missing)]
    runtime, params, worker = (
        modules[RUNTIME_STATE_MODULE],
        modules[PARAMS_MODULE],
        modules[WORKER_MODULE],
    )
    protocol = getattr(runtime, "AdaptiveSpecPolicy", None)
    if protocol is None:
        problems.append(f"{RUNTIME_STATE_MODULE}.AdaptiveSpecPolicy: not found")
    else:
        members = {name for name in vars(protocol) if not name.startswith("_")}
        expected = set(POLICY_METHODS) | set(POLICY_PROPERTIES)
        if members != expected:
            problems.append(
                f"{RUNTIME_STATE_MODULE}.AdaptiveSpecPolicy has members {sorted(members)}, "
                f"expected {sorted(expected)}"
            )
        for name, text in POLICY_METHODS.items():
            where = f"{RUNTIME_STATE_MODULE}.AdaptiveSpecPolicy.{name}"
            try:
                found = signature_text(_resolve(runtime, f"AdaptiveSpecPolicy.{name}"))
            except (AttributeError, TypeError, ValueError) as error:
                problems.append(f"{where}: not found or not inspectable ({error})")
                continue
            if found != text:
                problems.append(f"{where}{found} differs from the expected {text}")
        for name in POLICY_PROPERTIES:
            if not isinstance(inspect.getattr_static(protocol, name, None), property):
                problems.append(f"{RUNTIME_STATE_MODULE}.AdaptiveSpecPolicy.{name}: not a property")
    for (module_name, dotted), text in CONTROLLER_SIGNATURES.items():
        where = f"{module_name}.{dotted}"
        try:
            found = signature_text(_resolve(modules[module_name], dotted))
        except (AttributeError, TypeError, ValueError) as error:
            problems.append(f"{where}: not found or not inspectable ({error})")
            continue
        if found != text:
            problems.append(f"{where}{found} differs from the expected {text}")
    for name, text in POLICY_METHODS.items():  # av_core's side of the protocol
        found = signature_text(getattr(CostAwarePolicy, name))
        if found != text:
            problems.append(f"av_core.sglang.CostAwarePolicy.{name}{found} is not {text}")
    controller = getattr(runtime, "AdaptiveController", None)
    try:
        calls = policy_calls(inspect.getsource(controller))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError) as error:
        problems.append(f"{RUNTIME_STATE_MODULE}.AdaptiveController: source not readable ({error})")
    else:
        unknown = sorted(set(calls) - set(POLICY_METHODS) - set(POLICY_PROPERTIES))
        if unknown:
            problems.append(
                f"{RUNTIME_STATE_MODULE}.AdaptiveController uses policy members av_core's "
                f"policy does not implement: {unknown}"
            )
        for name in ("get_steps_for_batch", "on_verify_complete"):
            if name not in calls:
                problems.append(
                    f"{RUNTIME_STATE_MODULE}.AdaptiveController no longer calls the policy's {name}"
                )
    if not isinstance(getattr(params, "DEFAULT_ADAPTIVE_CONFIG", None), Mapping):
        problems.append(f"{PARAMS_MODULE}.DEFAULT_ADAPTIVE_CONFIG: not found")
    bound = getattr(worker, "AdaptiveSpeculativeParams", None)
    original = getattr(params, "AdaptiveSpeculativeParams", None)
    if bound is None or bound is not original:
        problems.append(
            f"{WORKER_MODULE}.AdaptiveSpeculativeParams is not "
            f"{PARAMS_MODULE}.AdaptiveSpeculativeParams"
        )
    try:
        init = _resolve(worker, "EAGLEWorkerV2.__init__")
        sites = construction_sites(inspect.getsource(init))
    except (AttributeError, OSError, TypeError, SyntaxError) as error:
        problems.append(f"{WORKER_MODULE}.EAGLEWorkerV2.__init__: source not readable ({error})")
    else:
        if len(sites) != 1:
            problems.append(
                f"{WORKER_MODULE}.EAGLEWorkerV2.__init__: expected one AdaptiveController(self, "
                f"AdaptiveSpeculativeParams(initial_steps=..., cfg_path=...)), found {len(sites)}"
            )
    return problems


def _drafter_kind() -> Literal["autoregressive", "parallel"]:
    value = os.environ.get(ENV_DRAFTER, "autoregressive").strip().lower()
    if value == "autoregressive":
        return "autoregressive"
    if value == "parallel":
        return "parallel"
    raise ValueError(f"{ENV_DRAFTER}={value!r}: expected autoregressive or parallel")


def _max_batch() -> int:
    value = os.environ.get(ENV_MAX_BATCH, "1024")
    try:
        batch = int(value)
    except ValueError:
        batch = 0
    if batch < 1:
        raise ValueError(f"{ENV_MAX_BATCH}={value!r}: expected an integer >= 1")
    return batch


def _policy_factory(
    cost_tables: CostTables | None,
    default_config: Mapping[str, Any],
    options: Mapping[str, Any],
) -> Callable[..., CostAwarePolicy]:
    drafter = _drafter_kind()
    max_batch = _max_batch()
    skip_extend = os.environ.get(ENV_SKIP_ZERO_STEP_EXTEND, "").strip().lower() in (
        "1",
        "true",
        "yes",
    )
    costs_path = os.environ.get(ENV_COSTS)

    def AdaptiveSpeculativeParams(  # noqa: N802 - stands in for SGLang's class
        initial_steps: int, cfg_path: str | None = None
    ) -> CostAwarePolicy:
        tiers = config_candidate_steps(cfg_path, default_config)
        k = max(s for steps in tiers.values() for s in steps)
        tables = cost_tables
        if tables is None:
            assert costs_path is not None
            tables = load_cost_tables(costs_path, k, drafter=drafter, max_batch=max_batch)
        settings: dict[str, Any] = {
            "drafter": drafter,
            "draft_extend_at_zero": not skip_extend,
            **options,
        }
        policy = CostAwarePolicy(tables, tiers, initial_steps=initial_steps, **settings)
        logger.info(
            "av_core: SGLang's adaptive speculation runs av_core's cost-aware policy "
            "(candidate steps %s, K = %d)",
            tiers,
            k,
        )
        return policy

    return AdaptiveSpeculativeParams


def install(cost_tables: CostTables | None = None, **options: Any) -> list[str]:
    """Checks SGLang and makes ``EAGLEWorkerV2`` build a :class:`CostAwarePolicy` where it builds
    ``AdaptiveSpeculativeParams`` (module doc). ``cost_tables`` (else the file named by
    ``AV_CORE_SGLANG_COSTS``) and ``options`` (keywords of :class:`CostAwarePolicy`) configure
    the policy. Returns what was replaced; idempotent. Raises :class:`SglangCompatibilityError`
    (every difference) or :class:`ValueError` (no cost tables) and patches nothing."""
    if _installed:
        return [f"{WORKER_MODULE}.{entry.attribute}" for entry in _installed]
    if cost_tables is not None and not isinstance(cost_tables, CostTables):
        raise TypeError(f"cost_tables must be av_core.CostTables, got {type(cost_tables)!r}")
    accepted = set(inspect.signature(CostAwarePolicy).parameters) - {
        "cost_tables",
        "candidate_steps",
        "initial_steps",
    }
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(
            f"install: {unknown} are not CostAwarePolicy options ({sorted(accepted)}); "
            "nothing was patched"
        )
    if cost_tables is None and not os.environ.get(ENV_COSTS):
        raise ValueError(
            f"av_core's SGLang policy needs cost tables: pass install(cost_tables=...) or set "
            f"{ENV_COSTS} to a CostTables JSON or an av-core profile file; nothing was patched"
        )
    _drafter_kind()
    _max_batch()
    any_version = os.environ.get(ENV_ANY_VERSION, "").strip().lower() in {"1", "true", "yes"}
    version = _sglang_version()
    modules = {
        name: importlib.import_module(name)
        for name in (RUNTIME_STATE_MODULE, PARAMS_MODULE, WORKER_MODULE)
    }
    problems = check_interface(modules, None if any_version else version)
    if problems:
        raise SglangCompatibilityError(
            f"av_core's SGLang policy ({ENV_ENABLE}=1) cannot run on this SGLang ({version}); "
            "nothing was patched. Differences:\n  - " + "\n  - ".join(problems)
        )
    worker, attribute = modules[WORKER_MODULE], "AdaptiveSpeculativeParams"
    original = getattr(worker, attribute)
    factory = _policy_factory(
        cost_tables, modules[PARAMS_MODULE].DEFAULT_ADAPTIVE_CONFIG, dict(options)
    )
    setattr(worker, attribute, factory)
    _installed.append(_Replacement(worker, attribute, original, factory))
    logger.info(
        "av_core: %s.AdaptiveSpeculativeParams -> av_core.sglang.CostAwarePolicy (SGLang %s)",
        WORKER_MODULE,
        version,
    )
    return [f"{WORKER_MODULE}.AdaptiveSpeculativeParams"]


def uninstall() -> None:
    """Undo :func:`install`."""
    while _installed:
        entry = _installed.pop()
        setattr(entry.owner, entry.attribute, entry.original)
        logger.info("av_core: restored %s.%s", WORKER_MODULE, entry.attribute)


def installed() -> list[str]:
    """The replacements in effect."""
    return [f"{WORKER_MODULE}.{entry.attribute}" for entry in _installed]


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: :func:`install` when ``AV_CORE_SGLANG=1``."""
    if os.environ.get(ENV_ENABLE, "").strip().lower() not in {"1", "true", "yes"}:
        logger.debug("av_core: %s is not set, SGLang keeps its own adaptive policy", ENV_ENABLE)
        return
    install()
