"""Stable alias of :mod:`av_core.tools.trace` (the draft-trace format moved among the offline
tools; this path keeps users' imports working)."""

from av_core.tools.trace import *  # noqa: F403
from av_core.tools.trace import BoolArray as BoolArray
from av_core.tools.trace import ColumnKind as ColumnKind
from av_core.tools.trace import FloatArray as FloatArray
from av_core.tools.trace import IntArray as IntArray
from av_core.tools.trace import StrArray as StrArray
from av_core.tools.trace import __all__ as __all__
