"""vLLM's constants that the drop-ins mirror, so that their results agree with vLLM's."""

from __future__ import annotations

from av_core import _settings as settings
from av_core._native import VLLM_ESTIMATOR

#: The newest vLLM release whose interfaces this module mirrors (every release the plugin
#: accepts: ``av_core.vllm.plugin.SUPPORTED_VLLM_VERSIONS``).
VLLM_VERSION = "0.33.0"

# vLLM 0.33.0's constants (acceptance_estimator.py), mirrored so results agree, under vLLM's
# names. The core owns them (``EstimatorConfig::vllm``, exported as
# ``av_core._native.VLLM_ESTIMATOR``). The cold start is the median fit across five model pairs
# there; the damping n / (n + 50) replaces a hard minimum-sample gate; the ridge keeps the Newton
# system positive definite.
MAX_LOG_ODDS = VLLM_ESTIMATOR["max_log_odds"]
INIT_SLOPE = VLLM_ESTIMATOR["init_slope"]
INIT_INTERCEPT = VLLM_ESTIMATOR["init_intercept"]
REFIT_INTERVAL = VLLM_ESTIMATOR["refit_interval"]
DAMPING_OBSERVATIONS = VLLM_ESTIMATOR["damping"]
L2 = VLLM_ESTIMATOR["l2"]

#: ``AV_CORE_VLLM_EXACT=1``: refit with vLLM's unbounded update (no step or range limits), the
#: default of the ``exact`` keyword (docs/vllm.md, "Deviations from vLLM").
ENV_EXACT = settings.VLLM_EXACT.name
#: ``AV_CORE_VLLM_ESTIMATOR=map``: refit with av_core's own update (docs/estimator.md) instead of
#: vLLM's, the default of the ``update`` keyword (docs/vllm.md, "av_core's update").
ENV_ESTIMATOR = settings.VLLM_ESTIMATOR.name
