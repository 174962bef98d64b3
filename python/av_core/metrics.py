"""Stable alias of :mod:`av_core.tools.metrics` (the calibration scores moved among the offline
tools; this path keeps users' imports working)."""

from av_core.tools.metrics import *  # noqa: F403
from av_core.tools.metrics import BinStrategy as BinStrategy
from av_core.tools.metrics import FloatArray as FloatArray
from av_core.tools.metrics import __all__ as __all__
