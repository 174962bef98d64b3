"""The policies the loop compares, all through one interface (:class:`Policy`): no speculation,
fixed K, llama.cpp's draft policy (``n_max``, ``n_min``, ``p_min`` and greedy drafting, as
``common/speculative.cpp`` applies them), vLLM's adaptive verification (av_core with vLLM's
update and budget, fixed depth) and av_core's AV+D (default estimator, budget and
drafting-depth choice). The same objects drive the loop
(:class:`~av_core.llama_cpp.engine.SpeculativeEngine`) and its replay on a trace
(:func:`~av_core.tools.simulate.simulate_run`).

What a policy sees decides whether it is lossless. ``depths`` runs before the drafter (it reads
remembered confidences and counts); ``stop`` reads llama.cpp's confidence of the position about to
be drafted, a function of the drafter's logits; ``drafted`` reads counts; ``admit`` reads the
features of the drafter's distributions and the counts. No hook receives a drafted or sampled
token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from av_core import AcceptanceEstimator, CostTables, VerificationPlanner
from av_core._native import VLLM_ESTIMATOR, InvalidValueError

if TYPE_CHECKING:
    from av_core.llama_cpp.profile import OnlineCosts

IntArray = npt.NDArray[np.int64]

#: llama.cpp's draft sampler keeps the 10 most likely tokens (``common/speculative.cpp``,
#: draft-simple: ``params.top_k = 10``, samplers ``{TOP_K}``, then ``dist``); its first candidate
#: is the draft, and that candidate's probability, a softmax over those 10 unscaled logits, is
#: what it compares with ``p_min``.
LLAMA_CPP_DRAFT_TOP_K = 10
#: ``common_params_speculative_draft`` defaults in the llama.cpp that llama-cpp-python 0.3.36
#: vendors (``common/common.h``).
LLAMA_CPP_N_MAX = 3
LLAMA_CPP_N_MIN = 0
LLAMA_CPP_P_MIN = 0.0


def llama_cpp_confidence(logits: npt.ArrayLike) -> float:
    """The probability llama.cpp's draft policy compares with ``p_min``: the most likely token's
    share of a softmax over the drafter's ``LLAMA_CPP_DRAFT_TOP_K`` largest raw logits."""
    z, k = np.asarray(logits), LLAMA_CPP_DRAFT_TOP_K
    top = (np.partition(z, -k)[-k:] if z.size > k else z).astype(np.float64)  # exact selection
    return float(1.0 / np.exp(top - top.max()).sum())


class Policy:
    """No speculation. Subclasses override what differs; every hook has this neutral default."""

    name = "no-spec"
    num_positions = 0
    #: Whether drafts are the drafter's most likely token (llama.cpp's drafting; the loop then
    #: asks :meth:`stop` with :func:`llama_cpp_confidence`) instead of a sample from its q.
    greedy = False

    def add_request(self, slot: int) -> None:
        """A new request took ``slot``."""

    def depths(self, slots: IntArray, max_depths: IntArray) -> IntArray:
        """How many positions each request may draft this step (before the drafter runs)."""
        return np.minimum(max_depths, self.num_positions).astype(np.int64)

    def stop(self, confidence: float) -> bool:
        """Whether a request stops before the position whose llama.cpp confidence this is."""
        return False

    def drafted(self, counts: IntArray) -> IntArray:
        """The drafts kept after drafting (llama.cpp drops a draft shorter than ``n_min``)."""
        return counts

    def admit(
        self, slots: IntArray, features: npt.NDArray[np.float32], drafted: IntArray
    ) -> IntArray:
        """How many leading drafts of each request the target verifies."""
        return drafted

    def observe(self, admitted: IntArray, accepted: IntArray) -> None:
        """The target's verdicts: ``accepted[i]`` leading drafts of ``admitted[i]``."""

    def measured(self, step: Any) -> None:
        """The step's :class:`~av_core.llama_cpp.engine.StepRecord`, timings included."""


class FixedK(Policy):
    """Draft and verify ``k`` positions every step (k = 0 is no speculation)."""

    def __init__(self, k: int) -> None:
        self.num_positions = int(k)
        self.name = "no-spec" if k == 0 else f"K={k}"


class LlamaCppPolicy(FixedK):
    """llama.cpp's draft-simple policy: draft the drafter's most likely token, up to ``n_max``
    positions, stop before a position whose confidence (:func:`llama_cpp_confidence`) is below
    ``p_min`` (strictly), drop the whole draft when it is shorter than ``n_min``, and verify
    every draft. Greedy drafts are deterministic given the context, so every one of these
    decisions is too, and exact verification of them is lossless (``n_min`` included)."""

    greedy = True

    def __init__(
        self,
        n_max: int = LLAMA_CPP_N_MAX,
        n_min: int = LLAMA_CPP_N_MIN,
        p_min: float = LLAMA_CPP_P_MIN,
    ) -> None:
        if n_max < 1 or n_min < 0 or not 0.0 <= p_min <= 1.0:
            raise InvalidValueError(
                f"llama.cpp policy needs n_max >= 1, n_min >= 0 and p_min in [0, 1], got "
                f"n_max={n_max}, n_min={n_min}, p_min={p_min}"
            )
        super().__init__(n_max)
        self.n_min, self.p_min = int(n_min), float(p_min)
        self.name = f"llama.cpp(n_max={n_max},p_min={p_min:g})"

    def stop(self, confidence: float) -> bool:
        return confidence < self.p_min

    def drafted(self, counts: IntArray) -> IntArray:
        return np.where(counts < self.n_min, 0, counts)


class AdaptivePolicy(FixedK):
    """Adaptive verification: the estimator predicts each draft's acceptance from its feature,
    the planner admits each request's prefix, the estimator observes the verdicts. With
    ``depth`` the planner also chooses the drafting depth before the drafter runs (AV+D);
    ``vllm``: vLLM's update, memory and no exploration floor."""

    def __init__(
        self,
        tables: CostTables,
        num_positions: int,
        *,
        num_slots: int,
        depth: bool,
        vllm: bool = False,
        exploration_seed: int = 0,
        online: OnlineCosts | None = None,
    ) -> None:
        super().__init__(num_positions)
        self.online, self.depth = online, depth
        self.estimator = (
            AcceptanceEstimator(num_positions, **VLLM_ESTIMATOR)
            if vllm
            else AcceptanceEstimator(num_positions)
        )
        self.planner = VerificationPlanner(
            self._with_depth(tables),
            num_positions,
            num_slots=num_slots,
            exploration=0.0 if vllm else 0.01,
            exploration_seed=exploration_seed,
        )
        self.name = "vLLM-AV" if vllm else ("AV+D" if depth else "AV")
        self._step: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None

    def _with_depth(self, tables: CostTables) -> CostTables:
        if self.depth and tables.max_draft_depth is None:
            return tables.with_draft_depth("autoregressive", max_depth=self.num_positions)
        return tables

    def add_request(self, slot: int) -> None:
        self.planner.add_request(slot)

    def depths(self, slots: IntArray, max_depths: IntArray) -> IntArray:
        capped = super().depths(slots, max_depths)
        if not self.depth:
            return capped
        n = len(slots)
        plan = self.planner.choose_draft_depth(
            slots, capped, num_non_draft_tokens=n, num_sampling_requests=n
        )
        return np.asarray(plan.depths, dtype=np.int64)

    def admit(
        self, slots: IntArray, features: npt.NDArray[np.float32], drafted: IntArray
    ) -> IntArray:
        predictions = self.estimator.predict(features)
        n = len(slots)
        plan = self.planner.plan(
            slots, predictions, drafted, num_non_draft_tokens=n, num_sampling_requests=n
        )
        self._step = (features, predictions)
        return np.asarray(plan.admitted, dtype=np.int64)

    def observe(self, admitted: IntArray, accepted: IntArray) -> None:
        if self._step is not None:
            features, predictions = self._step
            self.estimator.observe(features, admitted, accepted, predictions)
            self._step = None

    def measured(self, step: Any) -> None:
        tables = self.online.record(step) if self.online is not None else None
        if tables is not None:
            self.set_tables(tables)

    def set_tables(self, tables: CostTables) -> None:
        """Plans with ``tables`` from now on; every slot's remembered confidences carry over (the
        planner is rebuilt: its step count, which only the exploration draws read, restarts)."""
        old = self.planner
        slots = np.arange(old.num_slots)
        remembered = np.stack([old.previous_confidences(int(s)) for s in slots])
        self.planner = VerificationPlanner(
            self._with_depth(tables),
            self.num_positions,
            num_slots=old.num_slots,
            exploration=old.exploration,
            exploration_seed=old.exploration_seed,
        )
        self.planner.remember(slots, remembered, np.full(slots.shape[0], self.num_positions))


@dataclass(frozen=True)
class PolicySpec:
    """A policy by name, built per run (each run starts from a cold estimator).

    Names: ``no-spec``, ``K=<k>``, ``llama.cpp`` (defaults), ``llama.cpp-p<p_min>`` (e.g.
    ``llama.cpp-p0.75``), ``vLLM-AV``, ``AV``, ``AV+D``."""

    name: str

    def check(self, num_positions: int) -> Policy:
        """``ValueError`` for a name :meth:`build` would refuse (before any model is loaded);
        else the policy, built on placeholder tables (for its depth and drafting)."""
        return self.build(CostTables(np.zeros(2), np.ones(num_positions + 2)), num_positions, 1)

    def build(
        self,
        tables: CostTables | None,
        num_positions: int,
        num_slots: int,
        *,
        online: OnlineCosts | None = None,
    ) -> Policy:
        """The policy; ``online``: adaptive policies re-measure their cost tables with it."""
        name = self.name
        if name == "no-spec":
            return FixedK(0)
        if name.startswith("K="):
            return FixedK(int(_parse(name, name[2:], int)))
        if name == "llama.cpp":
            return LlamaCppPolicy()
        if name.startswith("llama.cpp-p"):
            return LlamaCppPolicy(p_min=_parse(name, name[len("llama.cpp-p") :], float))
        if name in ("vLLM-AV", "AV+D", "AV"):
            if tables is None:
                raise InvalidValueError(f"policy {name!r} needs cost tables (av-core profile)")
            return AdaptivePolicy(
                tables,
                num_positions,
                num_slots=num_slots,
                depth=name == "AV+D",
                vllm=name == "vLLM-AV",
                online=online,
            )
        raise InvalidValueError(
            f"policy: unknown policy {name!r} (no-spec, K=<k>, llama.cpp, llama.cpp-p<p_min>, "
            "vLLM-AV, AV, AV+D)"
        )


def _parse(name: str, text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise InvalidValueError(f"policy: cannot read {name!r}") from None
    if value < 0 or (kind is int and value > 64):
        raise InvalidValueError(f"policy: {name!r} is out of range")
    return value


DEFAULT_POLICIES = (
    "no-spec",
    "K=1",
    "K=2",
    "K=4",
    "llama.cpp",
    "llama.cpp-p0.75",
    "vLLM-AV",
    "AV+D",
)

__all__ = [
    "DEFAULT_POLICIES",
    "LLAMA_CPP_DRAFT_TOP_K",
    "LLAMA_CPP_N_MAX",
    "LLAMA_CPP_N_MIN",
    "LLAMA_CPP_P_MIN",
    "AdaptivePolicy",
    "FixedK",
    "LlamaCppPolicy",
    "Policy",
    "PolicySpec",
    "llama_cpp_confidence",
]
