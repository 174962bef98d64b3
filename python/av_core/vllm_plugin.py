"""Stable alias of :mod:`av_core.vllm.plugin`, the vLLM plugin (kept for users' configs and
imports: ``av_core.vllm_plugin:register``, ``av_core.vllm_plugin.uninstall()``)."""

from av_core.vllm.plugin import *  # noqa: F403
from av_core.vllm.plugin import DEPTH_READS as DEPTH_READS
from av_core.vllm.plugin import __all__ as __all__
