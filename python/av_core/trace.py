"""Labeled draft traces: one row per drafted position, with the drafter's features and the verdict.

A trace is what the estimator is evaluated on offline. Each row is one draft position ``k`` of one
decode step of one request, carrying the drafter features (``logit_q_max`` always, the lossy
extras when known), whether the position was admitted to verification, and its label under the
speculative-decoding rule: 1 accepted, 0 the first rejection, missing after the first rejection or
when never verified. The schema is documented in ``docs/trace-format.md`` and in :data:`COLUMNS`.

CSV (optionally gzip-compressed, ``.csv.gz``) is always readable and writable; Parquet needs
pyarrow (``pip install av_core[parquet]``). Every reader validates the whole file and rejects a
malformed one with a ``ValueError`` that names the file, the 1-based data row and the column.
"""

from __future__ import annotations

import csv
import gzip
import importlib
import io
import math
import numbers
import stat
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from os import PathLike
from pathlib import Path
from typing import IO, Any, Literal, cast

import numpy as np
import numpy.typing as npt

ColumnKind = Literal["int", "float", "str", "bool", "label"]

#: In memory, ``label == UNLABELED`` marks a position with no verdict (CSV: empty; Parquet: null).
UNLABELED = -1


@dataclass(frozen=True)
class Column:
    """One column of the trace schema."""

    name: str
    kind: ColumnKind
    required: bool
    description: str


COLUMNS: tuple[Column, ...] = (
    Column("request_id", "int", True, "request index, >= 0"),
    Column("step", "int", True, "decode step within the request, 0-based"),
    Column("position", "int", True, "draft position k within the step, 0-based"),
    Column("workload", "str", True, "prompt source; evaluation fits each workload separately"),
    Column("logit_q_max", "float", True, "log q_max - log(1 - q_max) of the drafter's q"),
    Column("admitted", "bool", True, "1 if the position was sent to verification, else 0"),
    Column("label", "label", True, "1 accepted, 0 first rejection, empty if unlabeled"),
    Column("prompt_id", "str", False, "identifier of the prompt, e.g. HumanEval/17"),
    Column("temperature", "float", False, "sampling temperature of drafter and target"),
    Column("top_p", "float", False, "nucleus threshold of drafter and target"),
    Column("logit_q_sampled", "float", False, "log-odds of the drafted token (lossy)"),
    Column("top2_margin", "float", False, "log q_(1) - log q_(2) (lossy)"),
    Column("entropy", "float", False, "entropy of q in nats (lossy)"),
    Column("head_score", "float", False, "a confidence head's score, if the drafter has one"),
    Column("acceptance_probability", "float", False, "min(1, p/q) of the drafted token"),
)
_BY_NAME = {column.name: column for column in COLUMNS}
REQUIRED_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.required)

#: The trace shipped with the package, collected with ``av-core collect`` (see ``docs/collect.md``).
SHIPPED_TRACE = "qwen2.5-coder-1.5b_0.5b_k4_t1.csv.gz"
#: Every trace shipped in ``av_core/data`` (provenance in ``docs/collect.md``): the main one
#: (temperature 1.0, the first 36 default prompts) and a second one at temperature 0.6 on the
#: next 36 prompts.
SHIPPED_TRACES = (SHIPPED_TRACE, "qwen2.5-coder-1.5b_0.5b_k4_t0.6.csv.gz")

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
StrArray = npt.NDArray[np.str_]


@dataclass(frozen=True, eq=False)
class DraftTrace:
    """A labeled draft trace held column-wise in numpy arrays (all of one length).

    ``label`` is int8: 1 accepted, 0 the first rejected position, :data:`UNLABELED` (-1) otherwise.
    Optional float columns are ``None`` when absent and NaN where a row has no value.
    Construction validates every invariant of the schema (see ``docs/trace-format.md``), so a
    ``DraftTrace`` in hand is always well formed.
    """

    request_id: IntArray
    step: IntArray
    position: IntArray
    workload: StrArray
    logit_q_max: FloatArray
    admitted: BoolArray
    label: npt.NDArray[np.int8]
    prompt_id: StrArray | None = None
    temperature: FloatArray | None = None
    top_p: FloatArray | None = None
    logit_q_sampled: FloatArray | None = None
    top2_margin: FloatArray | None = None
    entropy: FloatArray | None = None
    head_score: FloatArray | None = None
    acceptance_probability: FloatArray | None = None

    def __post_init__(self) -> None:
        length: int | None = None
        for column in COLUMNS:
            value = getattr(self, column.name)
            if value is None:
                if column.required:
                    raise ValueError(f"column {column.name!r} is required, got None")
                continue
            array = _as_array(column, value)
            if array.ndim != 1:
                raise ValueError(f"column {column.name!r} must be 1-D, got shape {array.shape}")
            array = _coerce(column, array)
            if length is None:
                length = array.shape[0]
            elif array.shape[0] != length:
                raise ValueError(
                    f"column {column.name!r} has {array.shape[0]} rows, expected {length}"
                )
            object.__setattr__(self, column.name, array)
        _check_values(self)

    def __len__(self) -> int:
        return int(self.request_id.shape[0])

    @property
    def columns(self) -> tuple[str, ...]:
        """Names of the columns present, in schema order."""
        return tuple(c.name for c in COLUMNS if getattr(self, c.name) is not None)

    @property
    def labeled(self) -> BoolArray:
        """Mask of the rows that carry a label (0 or 1)."""
        return np.asarray(self.label != UNLABELED)

    @property
    def num_positions(self) -> int:
        """K: one more than the deepest draft position in the trace (0 for an empty trace)."""
        return int(self.position.max()) + 1 if len(self) else 0

    def select(self, mask: npt.ArrayLike) -> DraftTrace:
        """Rows where ``mask`` is true (a boolean mask of ``len(self)`` entries) or the rows at
        ``mask`` (integer indices in ``[-len(self), len(self))``)."""
        try:
            index = np.asarray(mask)
        except (ValueError, TypeError, OverflowError) as error:
            raise ValueError(f"mask must be a 1-D array: {error}") from None
        if index.ndim != 1:
            raise ValueError(f"mask must be 1-D, got shape {index.shape}")
        if index.dtype == np.bool_:
            if index.shape[0] != len(self):
                raise ValueError(f"mask has {index.shape[0]} entries, the trace {len(self)} rows")
        elif index.size == 0:
            index = index.astype(np.int64)
        elif not np.issubdtype(index.dtype, np.integer):
            raise TypeError(f"mask must be a boolean mask or integer indices, got {index.dtype}")
        else:
            # Compared as given: a cast to int64 first would wrap a uint64 index.
            low, high = index.min(), index.max()
            too_low = not np.issubdtype(index.dtype, np.unsignedinteger) and low < -len(self)
            if too_low or high >= len(self):
                bad = low if too_low else high
                raise ValueError(
                    f"mask indices must lie in [{-len(self)}, {len(self)}), got {int(bad)}"
                )
        return DraftTrace(**{name: getattr(self, name)[index] for name in self.columns})

    def to_dict(self) -> dict[str, npt.NDArray[Any]]:
        """Present columns by name."""
        return {name: getattr(self, name) for name in self.columns}

    @staticmethod
    def concatenate(traces: Sequence[DraftTrace]) -> DraftTrace:
        """Rows of every trace in order; all must have the same columns."""
        if isinstance(traces, DraftTrace) or not isinstance(traces, Sequence):
            raise TypeError(f"traces must be a sequence of DraftTrace, got {type(traces).__name__}")
        if not traces:
            raise ValueError("traces must not be empty, got []")
        for index, trace in enumerate(traces):
            if not isinstance(trace, DraftTrace):
                raise TypeError(f"traces[{index}] must be a DraftTrace, got {type(trace).__name__}")
        names = traces[0].columns
        for index, trace in enumerate(traces):
            if trace.columns != names:
                raise ValueError(
                    f"traces[{index}] has columns {trace.columns}, expected {names} like traces[0]"
                )
        return DraftTrace(
            **{name: np.concatenate([getattr(t, name) for t in traces]) for name in names}
        )


#: Inclusive bounds of an integer column before it is stored: int64 for ids, -1..1 for labels.
_INT_RANGE: dict[str, tuple[int, int]] = {"int": (-(2**63), 2**63 - 1), "label": (UNLABELED, 1)}


def _range_error(row: int, column: Column, value: int) -> ValueError:
    if column.kind == "label":
        return _fail(row, column.name, f"must be 1, 0 or unlabeled ({UNLABELED}), got {value}")
    return _fail(row, column.name, f"must fit in int64, got {value}")


def _as_array(column: Column, value: object) -> npt.NDArray[Any]:
    """``value`` as an array, nothing cast yet. A list or tuple goes through an object array so
    that every element is checked as given (numpy would turn ``[1, 2**63]`` into float64)."""
    try:
        if isinstance(value, np.ndarray):
            return value
        if isinstance(value, list | tuple):
            return np.asarray(value, dtype=object)
        return np.asarray(value)
    except (ValueError, TypeError, OverflowError) as error:
        raise ValueError(f"column {column.name!r} must be a 1-D array: {error}") from None


def _shown(value: object, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters (a malformed cell can be megabytes long)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _coerce(column: Column, array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A 1-D column in the schema's dtype, every value checked *before* it is cast (a cast that
    wraps or truncates would hide the value the caller passed)."""
    if array.dtype == object:
        return _from_objects(column, array.tolist())
    name, kind = column.name, column.kind
    if kind in ("int", "label"):
        if array.size and not np.issubdtype(array.dtype, np.integer):
            expected = "integers (-1 unlabeled)" if kind == "label" else "integers"
            raise TypeError(f"column {name!r} must hold {expected}, got dtype {array.dtype}")
        low, high = _INT_RANGE[kind]
        if np.issubdtype(array.dtype, np.unsignedinteger):
            bad = np.flatnonzero(array > high)
        else:
            bad = np.flatnonzero((array < low) | (array > high))
        if bad.size:
            raise _range_error(int(bad[0]), column, int(array[bad[0]]))
        return array.astype(np.int8 if kind == "label" else np.int64)
    if kind == "bool":
        if array.size and not (
            np.issubdtype(array.dtype, np.bool_) or np.issubdtype(array.dtype, np.integer)
        ):
            raise TypeError(f"column {name!r} must hold booleans, got dtype {array.dtype}")
        if array.size and np.issubdtype(array.dtype, np.integer):
            bad = np.flatnonzero((array != 0) & (array != 1))
            if bad.size:
                raise ValueError(
                    f"row {bad[0] + 1}, column {name!r}: expected 0 or 1, "
                    f"got {array[bad[0]].item()!r}"
                )
        return array.astype(np.bool_)
    if kind == "float":
        if array.size and not (
            np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
        ):
            raise TypeError(f"column {name!r} must hold numbers, got dtype {array.dtype}")
        return array.astype(np.float64)
    if array.dtype.kind == "S":
        raise TypeError(f"column {name!r} must hold str, got bytes (dtype {array.dtype})")
    return array.astype(np.str_)


def _from_objects(column: Column, items: list[Any]) -> npt.NDArray[Any]:
    """A column given as Python objects, checked element by element, then built in the schema's
    dtype."""
    name, kind = column.name, column.kind
    if kind == "str":
        for row, item in enumerate(items):
            if isinstance(item, bytes | bytearray):
                raise TypeError(f"row {row + 1}, column {name!r}: expected a str, got bytes")
        return np.asarray([str(item) for item in items], dtype=np.str_).reshape(len(items))
    if kind == "float":
        floats: list[float] = []
        for row, item in enumerate(items):
            if isinstance(item, bool | np.bool_) or not isinstance(item, numbers.Real):
                raise TypeError(
                    f"row {row + 1}, column {name!r}: expected a number, got {_shown(item)}"
                )
            try:
                floats.append(float(item))
            except OverflowError:
                raise _fail(row, name, f"{_shown(item)} is too large for float64") from None
        return np.asarray(floats, dtype=np.float64).reshape(len(items))
    if kind == "bool":
        flags: list[bool] = []
        for row, item in enumerate(items):
            if isinstance(item, bool | np.bool_):
                flags.append(bool(item))
            elif not isinstance(item, numbers.Integral):
                raise TypeError(
                    f"row {row + 1}, column {name!r}: expected a boolean, got {_shown(item)}"
                )
            elif item in (0, 1):
                flags.append(bool(item))
            else:
                raise _fail(row, name, f"expected 0 or 1, got {_shown(item)}")
        return np.asarray(flags, dtype=np.bool_).reshape(len(items))
    low, high = _INT_RANGE[kind]
    values: list[int] = []
    for row, item in enumerate(items):
        if isinstance(item, bool | np.bool_) or not isinstance(item, numbers.Integral):
            raise TypeError(
                f"row {row + 1}, column {name!r}: expected an integer, got {_shown(item)}"
            )
        number = int(item)
        if not low <= number <= high:
            raise _range_error(row, column, number)
        values.append(number)
    return np.asarray(values, dtype=np.int8 if kind == "label" else np.int64).reshape(len(items))


def _fail(row: int, name: str, message: str) -> ValueError:
    return ValueError(f"row {row + 1}, column {name!r}: {message}")


def _check_values(trace: DraftTrace) -> None:
    """Schema invariants, each reported with the first offending (1-based) row."""
    for name in ("request_id", "step", "position"):
        values: IntArray = getattr(trace, name)
        bad = np.flatnonzero(values < 0)
        if bad.size:
            raise _fail(int(bad[0]), name, f"must be >= 0, got {values[bad[0]]}")
    bad = np.flatnonzero(~np.isfinite(trace.logit_q_max))
    if bad.size:
        raise _fail(int(bad[0]), "logit_q_max", f"must be finite, got {trace.logit_q_max[bad[0]]}")
    bad = np.flatnonzero(np.char.str_len(trace.workload) == 0) if len(trace) else bad[:0]
    if bad.size:
        raise _fail(int(bad[0]), "workload", "must not be empty")
    bad = np.flatnonzero((trace.label != UNLABELED) & ~trace.admitted)
    if bad.size:
        raise _fail(
            int(bad[0]),
            "label",
            f"a position not admitted cannot be labeled, got {trace.label[bad[0]]}",
        )
    for name in ("temperature", "top_p", "acceptance_probability"):
        column: FloatArray | None = getattr(trace, name)
        if column is None:
            continue
        low, high = (0.0, math.inf) if name == "temperature" else (0.0, 1.0)
        bad = np.flatnonzero(~np.isnan(column) & ~((column >= low) & (column <= high)))
        if bad.size:
            raise _fail(int(bad[0]), name, f"must lie in [{low}, {high}], got {column[bad[0]]}")
    for name in ("logit_q_sampled", "top2_margin", "entropy", "head_score"):
        column = getattr(trace, name)
        if column is not None:
            bad = np.flatnonzero(np.isinf(column))
            if bad.size:
                raise _fail(int(bad[0]), name, f"must be finite or missing, got {column[bad[0]]}")
    _check_label_order(trace)


def _check_label_order(trace: DraftTrace) -> None:
    """Within one (request, step): positions unique, and nothing labeled after a 0 or a gap.

    Verification stops at the first rejection, so labels along a step read 1…1 [0] then unlabeled.
    """
    if len(trace) < 2:
        return
    order = np.lexsort((trace.position, trace.step, trace.request_id))
    same = (np.diff(trace.request_id[order]) == 0) & (np.diff(trace.step[order]) == 0)
    positions = trace.position[order]
    labels = trace.label[order]
    duplicate = np.flatnonzero(same & (np.diff(positions) == 0))
    if duplicate.size:
        row = int(order[duplicate[0] + 1])
        raise _fail(
            row,
            "position",
            f"position {positions[duplicate[0] + 1]} repeats within request "
            f"{trace.request_id[row]}, step {trace.step[row]}",
        )
    after_stop = same & (labels[:-1] != 1) & (labels[1:] != UNLABELED)
    bad = np.flatnonzero(after_stop)
    if bad.size:
        row = int(order[bad[0] + 1])
        raise _fail(
            row,
            "label",
            f"got {trace.label[row]} after an unlabeled or rejected position in request "
            f"{trace.request_id[row]}, step {trace.step[row]}; labels read 1..1 [0] then empty",
        )


# ---------------------------------------------------------------------------------------------
# Files

#: What a damaged or foreign file raises while it is decoded; each becomes a ValueError that names
#: the file (OSError, such as a missing file, passes through as is: it names the file already).
_DECODE_ERRORS: tuple[type[BaseException], ...] = (
    UnicodeDecodeError,
    EOFError,
    gzip.BadGzipFile,
    zlib.error,
    csv.Error,
    OverflowError,
)


def _undecodable_line(path: Path) -> str:
    """Where a file stops being UTF-8: text is decoded in blocks, so the error itself does not
    know its line; the raw lines are scanned again (only on this error path)."""
    opener: Any = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as raw:
            for number, data in enumerate(raw, start=1):
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError as error:
                    return f"line {number}: not UTF-8 text ({error.reason} at byte {error.start})"
    except (OSError, EOFError, zlib.error):
        pass
    return "not UTF-8 text"


def _decode_problem(error: BaseException) -> str:
    if isinstance(error, gzip.BadGzipFile):
        return f"not a gzip file ({error})"
    if isinstance(error, EOFError):
        return "the gzip stream ends early (truncated file)"
    if isinstance(error, zlib.error):
        return f"the gzip stream is corrupt ({error})"
    if isinstance(error, csv.Error):
        return f"malformed CSV ({error})"
    return f"{type(error).__name__}: {error}"


def _open_text(path: Path, mode: Literal["r", "w", "a"]) -> IO[str]:
    # Reading accepts a byte-order mark (spreadsheet exports write one); writing never adds one.
    encoding = "utf-8-sig" if mode == "r" else "utf-8"
    if path.name.lower().endswith(".gz"):
        return cast(IO[str], gzip.open(path, mode + "t", encoding=encoding, newline=""))
    return open(path, mode, encoding=encoding, newline="")


def _check_regular_file(path: Path) -> None:
    """A trace is read from a regular file only: a FIFO or a device would block or never end."""
    if not stat.S_ISREG(path.stat().st_mode):  # a missing file raises FileNotFoundError
        raise ValueError(f"{path}: not a regular file (a directory, FIFO or device is not a trace)")


def _format_cell(kind: ColumnKind, value: Any) -> str:
    if kind == "label":
        return "" if int(value) == UNLABELED else str(int(value))
    if kind == "bool":
        return "1" if value else "0"
    if kind == "float":
        number = float(value)
        return "" if math.isnan(number) else repr(number)
    if kind == "int":
        return str(int(value))
    return str(value)


def _write_csv_rows(trace: DraftTrace, handle: IO[str], header: bool) -> None:
    names = trace.columns
    kinds = [_BY_NAME[name].kind for name in names]
    writer = csv.writer(handle, lineterminator="\n")
    if header:
        writer.writerow(names)
    data = [getattr(trace, name).tolist() for name in names]
    for row in zip(*data, strict=True):
        writer.writerow([_format_cell(kind, value) for kind, value in zip(kinds, row, strict=True)])


_INT64_MIN, _INT64_MAX = _INT_RANGE["int"]


def _parse_cell(kind: ColumnKind, required: bool, text: str) -> Any:
    text = text.strip()
    if kind == "str":
        return text
    if text == "":
        if kind == "label":
            return UNLABELED
        if kind == "float" and not required:
            return math.nan
        raise ValueError("is empty")
    if kind == "int":
        try:
            number = int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {_shown(text)}") from None
        if not _INT64_MIN <= number <= _INT64_MAX:
            raise ValueError(f"must fit in int64, got {_shown(text)}")
        return number
    if kind == "label":
        if text not in ("0", "1"):
            raise ValueError(f"expected 1, 0 or empty, got {_shown(text)}")
        return int(text)
    if kind == "bool":
        lowered = text.lower()
        if lowered in ("1", "true"):
            return True
        if lowered in ("0", "false"):
            return False
        raise ValueError(f"expected 0 or 1, got {_shown(text)}")
    try:
        number_ = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {_shown(text)}") from None
    if math.isnan(number_) and required:
        raise ValueError(f"expected a number, got {_shown(text)}")
    return number_


def _header_columns(header: Sequence[str], where: str) -> list[Column]:
    columns: list[Column] = []
    for name in header:
        if name not in _BY_NAME:
            raise ValueError(f"{where}: column {_shown(name)} is not part of the trace schema")
        columns.append(_BY_NAME[name])
    duplicated = sorted({name for name in header if list(header).count(name) > 1})
    if duplicated:
        raise ValueError(f"{where}: column {duplicated[0]!r} appears more than once")
    missing = [name for name in REQUIRED_COLUMNS if name not in header]
    if missing:
        raise ValueError(f"{where}: required column {missing[0]!r} is missing")
    return columns


_DTYPES: dict[ColumnKind, Any] = {
    "int": np.int64,
    "float": np.float64,
    "bool": np.bool_,
    "label": np.int8,
    "str": np.str_,
}


def _from_columns(where: str, values: Mapping[str, list[Any]]) -> DraftTrace:
    """A trace from parsed cells (already of their column's Python type and range)."""
    arrays: dict[str, npt.NDArray[Any]] = {}
    for name, cells in values.items():
        dtype = _DTYPES[_BY_NAME[name].kind]
        arrays[name] = np.asarray(cells, dtype=dtype) if cells else np.zeros(0, dtype=dtype)
    try:
        return DraftTrace(**arrays)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _read_csv(path: Path) -> DraftTrace:
    where = str(path)
    line = 0  # the last line read whole, for decoding errors
    try:
        with _open_text(path, "r") as handle:
            reader = csv.reader(handle)
            try:
                header = next(reader)
            except StopIteration:
                raise ValueError(f"{where}: empty file, expected a header row") from None
            line = reader.line_num
            columns = _header_columns([name.strip() for name in header], where)
            values: dict[str, list[Any]] = {c.name: [] for c in columns}
            for row_index, row in enumerate(reader):
                line = reader.line_num
                if not row:
                    continue
                if len(row) != len(columns):
                    raise ValueError(
                        f"{where}: row {row_index + 1} (line {line}): expected "
                        f"{len(columns)} fields, got {len(row)}"
                    )
                for column, text in zip(columns, row, strict=True):
                    try:
                        values[column.name].append(_parse_cell(column.kind, column.required, text))
                    except ValueError as error:
                        raise ValueError(
                            f"{where}: row {row_index + 1} (line {line}), "
                            f"column {column.name!r}: {error}"
                        ) from None
    except UnicodeDecodeError:
        raise ValueError(f"{where}: {_undecodable_line(path)}") from None
    except _DECODE_ERRORS as error:
        raise ValueError(f"{where}: line {line + 1}: {_decode_problem(error)}") from None
    return _from_columns(where, values)


def _require_pyarrow() -> Any:
    try:
        pyarrow = importlib.import_module("pyarrow")
        importlib.import_module("pyarrow.parquet")
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "reading or writing Parquet traces needs pyarrow: pip install 'av_core[parquet]'"
        ) from error
    return pyarrow


def _parquet_failure(where: str, error: Exception) -> Exception:
    """What pyarrow raised while decoding, as a ValueError naming the file. A damaged file shows
    up as an ArrowException, a plain OSError without an errno ("Couldn't deserialize thrift"),
    or a Python decoding error (a column name that is not UTF-8); an OSError with an errno is the
    file system's and is returned as is, and so is anything that is not a decoding failure."""
    decoding = (UnicodeDecodeError, EOFError, OverflowError, ValueError, TypeError, KeyError)
    if isinstance(error, OSError) and error.errno is not None:
        return error
    if isinstance(error, (OSError, *decoding)) or type(error).__module__.startswith("pyarrow"):
        return ValueError(
            f"{where}: not a readable Parquet trace ({type(error).__name__}: {error})"
        )
    return error


def _read_parquet(path: Path) -> DraftTrace:
    pa = _require_pyarrow()
    where = str(path)
    try:
        table = pa.parquet.read_table(path)
        names = [str(name) for name in table.column_names]
    except Exception as error:  # noqa: BLE001 - sorted out by _parquet_failure
        raise _parquet_failure(where, error) from None
    columns = _header_columns(names, where)
    try:
        cells_by_name = {column.name: table.column(column.name).to_pylist() for column in columns}
    except Exception as error:  # noqa: BLE001 - sorted out by _parquet_failure
        raise _parquet_failure(where, error) from None
    values: dict[str, list[Any]] = {}
    for column in columns:
        parsed: list[Any] = []
        for row_index, cell in enumerate(cells_by_name[column.name]):
            try:
                parsed.append(_parse_parquet_cell(column, cell))
            except ValueError as error:
                raise ValueError(
                    f"{where}: row {row_index + 1}, column {column.name!r}: {error}"
                ) from None
        values[column.name] = parsed
    return _from_columns(where, values)


def _parse_parquet_cell(column: Column, cell: Any) -> Any:
    if cell is None:
        if column.kind == "label":
            return UNLABELED
        if column.kind == "float" and not column.required:
            return math.nan
        raise ValueError("is null")
    kind = column.kind
    if kind == "str":
        if not isinstance(cell, str):
            raise ValueError(f"expected a string, got {_shown(cell)}")
        return cell
    if kind == "float":
        if isinstance(cell, bool) or not isinstance(cell, int | float):
            raise ValueError(f"expected a number, got {_shown(cell)}")
        if column.required and math.isnan(cell):
            raise ValueError(f"expected a number, got {_shown(cell)}")
        return float(cell)
    if kind == "bool":
        if isinstance(cell, bool) or (isinstance(cell, int) and cell in (0, 1)):
            return bool(cell)
        raise ValueError(f"expected a boolean, got {_shown(cell)}")
    if isinstance(cell, bool) or not isinstance(cell, int):
        raise ValueError(f"expected an integer, got {_shown(cell)}")
    if kind == "label" and cell not in (0, 1):
        raise ValueError(f"expected 1, 0 or null, got {_shown(cell)}")
    if not _INT64_MIN <= cell <= _INT64_MAX:
        raise ValueError(f"must fit in int64, got {cell}")
    return cell


def _write_parquet(trace: DraftTrace, path: Path) -> None:
    pa = _require_pyarrow()
    arrays = {}
    for name in trace.columns:
        values = getattr(trace, name)
        kind = _BY_NAME[name].kind
        if kind == "label":
            arrays[name] = pa.array(values, type=pa.int8(), mask=values == UNLABELED)
        elif kind == "float":
            arrays[name] = pa.array(values, type=pa.float64(), mask=np.isnan(values))
        elif kind == "str":
            arrays[name] = pa.array(values.tolist(), type=pa.string())
        elif kind == "bool":
            arrays[name] = pa.array(values, type=pa.bool_())
        else:
            arrays[name] = pa.array(values, type=pa.int64())
    pa.parquet.write_table(pa.table(arrays), path)


def _trace_path(path: object) -> Path:
    if not isinstance(path, str | PathLike):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    return Path(path)


def _format_of(path: Path) -> Literal["csv", "parquet"]:
    name = path.name.lower()
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    raise ValueError(f"path must end in .csv, .csv.gz or .parquet, got {str(path)!r}")


def _check_trace(trace: object) -> DraftTrace:
    if not isinstance(trace, DraftTrace):
        raise TypeError(f"trace must be a DraftTrace, got {type(trace).__name__}")
    return trace


def read_trace(path: str | Path) -> DraftTrace:
    """Reads and validates a trace from ``.csv``, ``.csv.gz`` or ``.parquet``.

    Raises ``ValueError`` naming the file, the 1-based data row and the column of the first
    problem: an unknown or missing column, an unparsable or empty required cell, or a broken
    invariant (for example a label after the first rejection of a step); naming the file and
    the line for a file that does not decode (not UTF-8, a damaged or truncated gzip stream,
    malformed CSV quoting, a damaged Parquet file) or that is not a regular file. A file that
    cannot be opened raises the ``OSError`` (``FileNotFoundError``, ``PermissionError``) as is.
    """
    path = _trace_path(path)
    kind = _format_of(path)
    _check_regular_file(path)
    if kind == "parquet":
        return _read_parquet(path)
    return _read_csv(path)


def write_trace(trace: DraftTrace, path: str | Path) -> None:
    """Writes ``trace`` to ``.csv``, ``.csv.gz`` (lossless float repr) or ``.parquet``."""
    trace = _check_trace(trace)
    path = _trace_path(path)
    if _format_of(path) == "parquet":
        _write_parquet(trace, path)
        return
    with _open_text(path, "w") as handle:
        _write_csv_rows(trace, handle, header=True)


def append_trace(trace: DraftTrace, path: str | Path) -> None:
    """Appends rows to a CSV trace (writing the header if the file is new or empty).

    The rows are formatted first and written with a single call, so an interrupted collection
    leaves whole prompts behind. The columns must match the existing header. A ``.csv.gz`` file
    grows by one gzip member per call, which every gzip reader concatenates.
    """
    trace = _check_trace(trace)
    path = _trace_path(path)
    if _format_of(path) != "csv":
        raise ValueError(f"path must be a .csv or .csv.gz file to append to, got {str(path)!r}")
    exists = path.exists()
    if exists:
        _check_regular_file(path)
    exists = exists and path.stat().st_size > 0
    if exists:
        try:
            with _open_text(path, "r") as handle:
                header = next(csv.reader(handle), [])
        except UnicodeDecodeError:
            raise ValueError(f"{path}: {_undecodable_line(path)}") from None
        except _DECODE_ERRORS as error:
            raise ValueError(f"{path}: line 1: {_decode_problem(error)}") from None
        if tuple(name.strip() for name in header) != trace.columns:
            raise ValueError(
                f"{path}: existing columns {tuple(header)} differ from the trace's {trace.columns}"
            )
    buffer = io.StringIO()
    _write_csv_rows(trace, buffer, header=not exists)
    with _open_text(path, "a") as handle:
        handle.write(buffer.getvalue())
        handle.flush()


def load_shipped_trace(name: str = SHIPPED_TRACE) -> DraftTrace:
    """A real trace shipped in ``av_core/data`` (one of :data:`SHIPPED_TRACES`; provenance in
    ``docs/collect.md``)."""
    if name not in SHIPPED_TRACES:
        raise ValueError(f"name: {name!r} is not a shipped trace ({', '.join(SHIPPED_TRACES)})")
    resource = resources.files("av_core").joinpath("data", name)
    with resources.as_file(resource) as path:
        return read_trace(path)


def trace_from_rows(rows: Iterable[Mapping[str, Any]]) -> DraftTrace:
    """Builds a trace from row mappings (column name → value; label ``None`` is unlabeled).

    Every value is checked as given, before any cast: an id that does not fit int64, a label
    other than 1, 0 or None, a float where an integer belongs raise ``ValueError`` or
    ``TypeError`` naming the row and the column.
    """
    if isinstance(rows, Mapping) or not isinstance(rows, Iterable):
        raise TypeError(f"rows must be an iterable of mappings, got {type(rows).__name__}")
    materialized = list(rows)
    if not materialized:
        raise ValueError("rows must not be empty, got no rows")
    for index, row in enumerate(materialized):
        if not isinstance(row, Mapping):
            raise TypeError(f"row {index + 1}: expected a mapping, got {type(row).__name__}")
    names = [c.name for c in COLUMNS if c.name in materialized[0]]
    unknown = sorted((key for key in materialized[0] if key not in _BY_NAME), key=repr)
    if unknown:
        raise ValueError(f"row 1: column {_shown(unknown[0])} is not part of the trace schema")
    values: dict[str, list[Any]] = {name: [] for name in names}
    for index, row in enumerate(materialized):
        if len(row) != len(names) or any(name not in row for name in names):
            raise ValueError(
                f"row {index + 1}: columns {sorted(map(str, row))} differ from row 1's {names}"
            )
        for name in names:
            value = row[name]
            if name == "label" and value is None:
                value = UNLABELED
            elif _BY_NAME[name].kind == "float" and value is None:
                value = math.nan
            values[name].append(value)
    arrays = {name: _from_objects(_BY_NAME[name], cells) for name, cells in values.items()}
    return DraftTrace(**arrays)


__all__ = [
    "COLUMNS",
    "REQUIRED_COLUMNS",
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
