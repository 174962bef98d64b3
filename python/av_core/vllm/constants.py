"""vLLM's constants that the drop-ins mirror, so that their results agree with vLLM's."""

from __future__ import annotations

#: The newest vLLM release whose interfaces this module mirrors (every release the plugin
#: accepts: ``av_core.vllm.plugin.SUPPORTED_VLLM_VERSIONS``).
VLLM_VERSION = "0.33.0"

# vLLM 0.33.0's constants (acceptance_estimator.py), mirrored so results agree. The cold start is
# the median fit across five model pairs there; the damping n / (n + 50) replaces a hard
# minimum-sample gate; the ridge keeps the Newton system positive definite.
MAX_LOG_ODDS = 40.0
INIT_SLOPE = 0.5
INIT_INTERCEPT = -0.2
REFIT_INTERVAL = 100
DAMPING_OBSERVATIONS = 50.0
L2 = 1e-3

#: ``AV_CORE_VLLM_EXACT=1``: refit with vLLM's unbounded update (no step or range limits), the
#: default of the ``exact`` keyword (docs/vllm.md, "Deviations from vLLM").
ENV_EXACT = "AV_CORE_VLLM_EXACT"
#: ``AV_CORE_VLLM_ESTIMATOR=map``: refit with av_core's own update (docs/estimator.md) instead of
#: vLLM's, the default of the ``update`` keyword (docs/vllm.md, "av_core's update").
ENV_ESTIMATOR = "AV_CORE_VLLM_ESTIMATOR"
