"""Which update the vLLM drop-in refits with, and when a refit is due.

vLLM's update (the drop-in's default): one damped Newton step at the end of every round of
``REFIT_INTERVAL`` steps, no memory across rounds, av_core's step and range bounds unless
``exact``. av_core's ``"map"`` update (opt-in here, ``AcceptanceEstimator``'s default;
docs/estimator.md): the MAP fit on per-position histograms iterated to convergence, with memory,
and fits after the 1st, 2nd, 4th, ... step of every round as well as at its end.
"""

from __future__ import annotations

import logging
from typing import Any

from av_core import _settings as settings
from av_core._native import ESTIMATOR_DEFAULTS, VLLM_ESTIMATOR, InvalidValueError
from av_core.vllm.constants import ENV_ESTIMATOR, ENV_EXACT

logger = logging.getLogger("vllm.av_core")

#: The updates the drop-in accepts.
UPDATES = ("vllm", "map")


def choose_update(
    update: str | None, exact: bool | None, *, strict: bool = False
) -> tuple[str, bool]:
    """``(update, exact)`` from the keywords, unset ones from ``AV_CORE_VLLM_ESTIMATOR`` and
    ``AV_CORE_VLLM_EXACT``. ``ValueError`` for an unknown ``update`` or ``exact`` with
    ``"map"`` given as keywords. The variables follow av_core's settings policy
    (docs/settings.md): with ``strict`` (the plugin, before it patches) a value they do not
    take, or ``exact`` with ``map`` both from the environment, is a ``SettingError``; without (a
    drop-in being built) it is a warning: the default, and ``exact`` dropped under ``map``."""
    exact_from_env, update_from_env = exact is None, update is None
    if exact is None:
        exact = settings.VLLM_EXACT.require() if strict else settings.VLLM_EXACT.get()
    if update is None:
        update = settings.VLLM_ESTIMATOR.require() if strict else settings.VLLM_ESTIMATOR.get()
    if update not in UPDATES:
        raise InvalidValueError(
            f"update must be 'vllm' or 'map' (or set {ENV_ESTIMATOR}), got {update!r}"
        )
    if update == "map" and exact:
        message = (
            f"exact (vLLM's unbounded refit) applies to update='vllm' only; {ENV_EXACT} or "
            "exact=True cannot be combined with update='map' (or set by "
            f"{ENV_ESTIMATOR}={settings.VLLM_ESTIMATOR.text() or ''!r})"
        )
        if not (exact_from_env and update_from_env):
            raise InvalidValueError(message)
        if strict:
            raise settings.SettingError(message)
        logger.warning("av_core: %s; the estimators refit with map", message)
        exact = False
    return update, bool(exact)


def native_options(update: str, exact: bool) -> dict[str, Any]:
    """The native estimator's options that make it refit with ``update``: the core's vLLM preset
    (``VLLM_ESTIMATOR``: vLLM's memoryless update whatever av_core's defaults), its unbounded
    refit only with ``exact``, else the core's default bounds; or av_core's own update, whole."""
    if update != "vllm":
        return {"update": update}
    bounds = VLLM_ESTIMATOR if exact else ESTIMATOR_DEFAULTS
    return {
        "update": update,
        "memory": VLLM_ESTIMATOR["memory"],
        "drift_z": VLLM_ESTIMATOR["drift_z"],
        **{name: bounds[name] for name in ("max_step", "max_slope", "max_intercept")},
    }


def refit_due(steps: int, interval: int, update: str, pooled: bool) -> str | None:
    """The refit due after the ``steps``-th step of a round: ``"end"`` (the round is complete,
    vLLM's schedule), ``"within"`` (update ``"map"`` without pooling: after the 1st, 2nd, 4th,
    ... step), or None."""
    if steps >= interval:
        return "end"
    if update == "map" and not pooled and steps & (steps - 1) == 0:
        return "within"
    return None
