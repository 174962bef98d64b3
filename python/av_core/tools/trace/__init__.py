"""Labeled draft traces: one row per drafted position, with the drafter's features and the verdict.

A trace is what the estimator is evaluated on offline. Each row is one draft position ``k`` of one
decode step of one request, carrying the drafter features (``logit_q_max`` always, the lossy
extras when known), whether the position was admitted to verification, and its label under the
speculative-decoding rule: 1 accepted, 0 the first rejection, missing after the first rejection or
when never verified. The schema is documented in ``docs/trace-format.md`` and in :data:`COLUMNS`.

CSV (optionally gzip-compressed, ``.csv.gz``) is always readable and writable; Parquet needs
pyarrow (``pip install av_core[parquet]``). Every reader validates the whole file and rejects a
malformed one with a ``ValueError`` that names the file, the 1-based data row and the column.

:mod:`~av_core.tools.trace.schema` holds the trace in memory and its checks,
:mod:`~av_core.tools.trace.files` the file formats and the shipped traces. ``av_core.trace`` is a
stable alias of this package.
"""

from av_core.tools.trace.files import (
    LARGE_TRACE,
    SHIPPED_TRACE,
    SHIPPED_TRACES,
    append_trace,
    load_shipped_trace,
    read_trace,
    write_trace,
)
from av_core.tools.trace.schema import (
    COLUMNS,
    REQUIRED_COLUMNS,
    UNLABELED,
    Column,
    DraftTrace,
    trace_from_rows,
)

# Public type aliases, importable here too (outside __all__).
from av_core.tools.trace.schema import BoolArray as BoolArray
from av_core.tools.trace.schema import ColumnKind as ColumnKind
from av_core.tools.trace.schema import FloatArray as FloatArray
from av_core.tools.trace.schema import IntArray as IntArray
from av_core.tools.trace.schema import StrArray as StrArray

__all__ = [
    "COLUMNS",
    "REQUIRED_COLUMNS",
    "LARGE_TRACE",
    "SHIPPED_TRACE",
    "SHIPPED_TRACES",
    "UNLABELED",
    "Column",
    "DraftTrace",
    "append_trace",
    "load_shipped_trace",
    "read_trace",
    "trace_from_rows",
    "write_trace",
]
