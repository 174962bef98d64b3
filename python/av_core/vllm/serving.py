"""What the vLLM plugin attaches to each estimator vLLM builds: warm restarts and pooled
statistics across data-parallel ranks (``AV_CORE_STATE_DIR``, ``AV_CORE_SHARE_STATS=dp``).

vLLM builds its estimator in ``DraftModelSpeculator.load_model`` (every speculator's
``load_model`` calls it through ``super()``), on every worker. With either variable set,
:mod:`av_core.vllm.plugin` wraps that method; after it ran, :func:`attach` gives the av_core
estimator it built:

- ``AV_CORE_STATE_DIR``: a :class:`av_core.vllm.state.WarmStart` keyed by the target model,
  the draft model, the method, K and the rank (``dp<data-parallel index>-rank<torch rank>``):
  the last saved state is loaded, then saved every ``AV_CORE_STATE_SAVE_EVERY`` refits and at
  exit.
- ``AV_CORE_SHARE_STATS=dp``: the CPU (gloo) group of vLLM's data-parallel group as its
  ``process_group``, so every refit sums the round over the data-parallel ranks first and every
  rank holds the same coefficients. vLLM runs the data-parallel ranks of a mixture-of-experts
  model in lockstep: each engine step every rank runs one forward, a real batch or, with no
  requests, a dummy batch (``Worker.execute_dummy_batch``). A real step grades its drafts in
  ``sample_tokens`` (``observe_verification``, the estimator's ``step``) between
  ``execute_model`` and ``propose``; so that an idle rank reaches every refit too, the plugin
  wraps ``execute_dummy_batch`` and, inside it, steps the estimator with no verdicts at the
  start of the dummy ``propose``: at the same point of the step's sequence of data-parallel
  collectives (the batch sync in ``execute_model`` before it, the drafter's after it). An idle
  rank contributes zeros. The ranks of a dense model are independent engines in vLLM (a
  data-parallel group of one): there is nothing to pool, and a warning says so. With warm
  restarts as well, rank 0 of the group hands its restored coefficients to the others at
  start-up (and the restored open rounds are dropped), so the ranks start equal.

The assumptions about vLLM's control flow are checked against each supported release's source by
``tests/vllm/test_vllm_contract.py``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from av_core import _settings as settings

__all__ = [
    "ENV_SHARE",
    "PARALLEL_STATE_MODULE",
    "SERVING_SIGNATURES",
    "SPECULATOR_MODULE",
    "WORKER_MODULE",
    "attach",
    "share_mode",
    "state_key",
    "wanted",
]

logger = logging.getLogger("vllm.av_core")

ENV_SHARE = settings.SHARE_STATS.name
SPECULATOR_MODULE = "vllm.v1.worker.gpu.spec_decode.speculator"
WORKER_MODULE = "vllm.v1.worker.gpu_worker"
PARALLEL_STATE_MODULE = "vllm.distributed.parallel_state"

#: The methods the plugin wraps for these features, with their signatures in every supported
#: release (checked before patching, and against the released source by the contract test). The
#: wrappers pass every argument through, so a new optional parameter is accepted.
SERVING_SIGNATURES: dict[tuple[str, str], str] = {
    (SPECULATOR_MODULE, "DraftModelSpeculator.load_model"): "(self, target_model)",
    (WORKER_MODULE, "Worker.execute_dummy_batch"): "(self)",
}


def share_mode() -> str:
    """``dp`` or ``off`` from ``AV_CORE_SHARE_STATS`` (checked by the plugin before it
    patches)."""
    return settings.SHARE_STATS.get()


def wanted() -> bool:
    """Whether either feature is asked for."""
    return settings.STATE_DIR.is_set() or share_mode() != "off"


def modules_needed() -> list[str]:
    names = [SPECULATOR_MODULE]
    if share_mode() != "off":
        names += [WORKER_MODULE, PARALLEL_STATE_MODULE]
    return names


def problems(modules: Mapping[str, ModuleType], signature_problems: Any) -> list[str]:
    """What differs from the interfaces these features rely on."""
    found: list[str] = []
    expected = {key: text for key, text in SERVING_SIGNATURES.items() if key[0] in modules}
    found += signature_problems(modules, expected)
    if PARALLEL_STATE_MODULE in modules and not callable(
        getattr(modules[PARALLEL_STATE_MODULE], "get_dp_group", None)
    ):
        found.append(f"{PARALLEL_STATE_MODULE}.get_dp_group: not found")
    return found


class _DummyBatch(threading.local):
    """Set while ``Worker.execute_dummy_batch`` runs on this thread."""

    active = False


_dummy = _DummyBatch()


def wrap_load_model(original: Callable[..., Any]) -> Callable[..., Any]:
    """``DraftModelSpeculator.load_model``, then :func:`attach` on the estimator it built."""

    def load_model(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        from av_core.vllm import OnlineAcceptanceEstimator

        estimator = getattr(self, "acceptance_estimator", None)
        if isinstance(estimator, OnlineAcceptanceEstimator):
            attach(self, estimator)

    load_model.__wrapped__ = original  # type: ignore[attr-defined]
    return load_model


def wrap_execute_dummy_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Worker.execute_dummy_batch`` with the dummy-batch flag set (see the module doc)."""

    def execute_dummy_batch(self: Any, *args: Any, **kwargs: Any) -> None:
        _dummy.active = True
        try:
            original(self, *args, **kwargs)
        finally:
            _dummy.active = False

    execute_dummy_batch.__wrapped__ = original  # type: ignore[attr-defined]
    return execute_dummy_batch


def state_key(speculator: Any) -> Any:
    """The :class:`~av_core.vllm.state.StateKey` of a vLLM speculator's estimator."""
    from av_core.vllm.state import StateKey

    config = speculator.vllm_config
    draft = getattr(speculator, "draft_model_config", None)
    draft_model = getattr(draft, "model", None) or getattr(
        speculator.speculative_config, "model", ""
    )
    dp_index = getattr(config.parallel_config, "data_parallel_index", 0)
    return StateKey(
        target_model=str(config.model_config.model),
        draft_model=str(draft_model),
        method=str(speculator.method),
        num_speculative_steps=int(speculator.num_speculative_steps),
        rank=f"dp{dp_index}-rank{_torch_rank()}",
    )


def _torch_rank() -> int:
    import torch.distributed as dist

    return int(dist.get_rank()) if dist.is_available() and dist.is_initialized() else 0


def _dp_group() -> Any:
    import importlib

    group = importlib.import_module(PARALLEL_STATE_MODULE).get_dp_group()
    return group if int(getattr(group, "world_size", 1)) > 1 else None


def attach(speculator: Any, estimator: Any) -> None:
    """Warm restarts and data-parallel pooling for one estimator (the module doc)."""
    from av_core.vllm.state import ENV_STATE_DIR, WarmStart

    group = None
    if share_mode() == "dp":
        group = _dp_group()
        if group is None:
            logger.warning(
                "av_core: %s=dp, but this engine's data-parallel group has one rank (vLLM runs "
                "the data-parallel ranks of a non-MoE model as independent engines): each rank "
                "learns alone",
                ENV_SHARE,
            )
        else:
            estimator.process_group = group.cpu_group
            _step_in_dummy_batches(speculator, estimator)
            logger.info(
                "av_core: refits pool the round over vLLM's data-parallel group (%d ranks)",
                group.world_size,
            )
    directory = settings.STATE_DIR.get()
    if directory is None:
        return
    try:
        key = state_key(speculator)
    except (AttributeError, TypeError, ValueError) as error:
        logger.warning("av_core: %s is set but the state key is unknown (%s)", ENV_STATE_DIR, error)
        return
    warm = WarmStart(directory, key)
    warm.load(estimator)
    if group is not None:
        _start_equal(estimator, group)
    warm.save_from_now_on(estimator)


def _step_in_dummy_batches(speculator: Any, estimator: Any) -> None:
    """Wraps this speculator's ``propose`` (on the instance): inside a dummy batch, the
    estimator steps with no verdicts first, as a real step's ``sample_tokens`` does."""
    import torch

    original = speculator.propose
    empty = torch.zeros(0, dtype=torch.int32)

    def propose(*args: Any, **kwargs: Any) -> Any:
        if _dummy.active and kwargs.get("dummy_run"):
            estimator.step(empty, empty, empty)
        return original(*args, **kwargs)

    propose.__wrapped__ = original  # type: ignore[attr-defined]
    speculator.propose = propose


def _start_equal(estimator: Any, group: Any) -> None:
    """Every rank takes the group's first rank's coefficients and schedule, with an empty open
    round (each rank's restored round would otherwise be pooled again)."""
    import torch.distributed as dist

    from av_core.distributed import round_columns

    state = estimator.state_dict()
    rounds = state["estimator"]["round_stats"]
    for name in round_columns(rounds):  # vLLM's moments, or the map update's histograms
        rounds[name] = [0] * len(rounds[name])
    if "fitted_labels" in state["estimator"]:  # map: the labels fitted within the open round
        state["estimator"]["fitted_labels"] = 0
    state["steps_since_refit"] = 0
    state["estimator"]["steps_since_refit"] = 0
    box = [state]
    dist.broadcast_object_list(box, src=int(group.ranks[0]), group=group.cpu_group)
    estimator.load_state_dict(box[0])
