"""Trace files: CSV (optionally gzip-compressed) and Parquet read, written and appended, each
reader validating the whole file and naming the file, the 1-based data row and the column of
anything malformed; and the traces shipped in ``av_core/data``.
"""

from __future__ import annotations

import csv
import gzip
import importlib
import io
import math
import stat
import zlib
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from os import PathLike
from pathlib import Path
from typing import IO, Any, Literal, TypeVar, cast

import numpy as np
import numpy.typing as npt

from av_core._native import InvalidTypeError, InvalidValueError
from av_core.tools.trace.schema import (
    _BY_NAME,
    _INT_RANGE,
    REQUIRED_COLUMNS,
    UNLABELED,
    Column,
    ColumnKind,
    DraftTrace,
    _shown,
)

#: The trace shipped with the package, collected with ``av-core collect`` (see ``docs/collect.md``).
SHIPPED_TRACE = "qwen2.5-coder-1.5b_0.5b_k4_t1.csv.gz"
#: The large trace, collected through llama.cpp (``av-core collect --engine llama.cpp``) from the
#: quantized models as deployed: over 20,000 labeled drafts, for evaluations whose statistics
#: need more labels than the first two hold (``docs/collect.md``).
LARGE_TRACE = "qwen2.5-coder-1.5b_0.5b_k4_large.csv.gz"
#: Every trace shipped in ``av_core/data`` (provenance in ``docs/collect.md``): the main one
#: (temperature 1.0, the first 36 default prompts), a second one at temperature 0.6 on the
#: next 36 prompts, and the large one on every later default prompt.
SHIPPED_TRACES = (SHIPPED_TRACE, "qwen2.5-coder-1.5b_0.5b_k4_t0.6.csv.gz", LARGE_TRACE)


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
        raise InvalidValueError(
            f"{path}: not a regular file (a directory, FIFO or device is not a trace)"
        )


def _check_writable_path(path: Path) -> None:
    """A trace is written to a new or a regular file only: opening a FIFO to write waits for a
    reader forever, and a device or a directory is no trace."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise InvalidValueError(
            f"{path}: not a regular file (a directory, FIFO or device is not a trace)"
        )


def _plain_number(text: str) -> bool:
    """Whether ``text`` spells a number the way a trace writes one: ASCII, no digit separators.
    Python's ``int``/``float`` also read ``1_000`` and other scripts' digits (``"١٢"`` is 12),
    which no trace writer produces: such a cell is malformed, not a number."""
    return text.isascii() and "_" not in text


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
_Number = TypeVar("_Number", int, float)


def _parse_cell(kind: ColumnKind, required: bool, text: str) -> Any:
    text = text.strip()
    if kind == "str":
        return text
    if text == "":
        if kind == "label":
            return UNLABELED
        if kind == "float" and not required:
            return math.nan
        raise InvalidValueError("is empty")
    if kind == "int":
        number = _parse_plain(text, int, "an integer")
        if not _INT64_MIN <= number <= _INT64_MAX:
            raise InvalidValueError(f"must fit in int64, got {_shown(text)}")
        return number
    if kind == "label":
        if text not in ("0", "1"):
            raise InvalidValueError(f"expected 1, 0 or empty, got {_shown(text)}")
        return int(text)
    if kind == "bool":
        lowered = text.lower()
        if lowered in ("1", "true"):
            return True
        if lowered in ("0", "false"):
            return False
        raise InvalidValueError(f"expected 0 or 1, got {_shown(text)}")
    real = _parse_plain(text, float, "a number")
    if math.isnan(real) and required:
        raise InvalidValueError(f"expected a number, got {_shown(text)}")
    return real


def _parse_plain(text: str, parse: Callable[[str], _Number], expected: str) -> _Number:
    """``parse(text)`` of a plain decimal number (:func:`_plain_number`), else a ValueError
    saying what was ``expected``."""
    try:
        if not _plain_number(text):
            raise InvalidValueError(text)
        return parse(text)
    except ValueError:
        raise InvalidValueError(f"expected {expected}, got {_shown(text)}") from None


def _header_columns(header: Sequence[str], where: str) -> list[Column]:
    columns: list[Column] = []
    for name in header:
        if name not in _BY_NAME:
            raise InvalidValueError(
                f"{where}: column {_shown(name)} is not part of the trace schema"
            )
        columns.append(_BY_NAME[name])
    duplicated = sorted({name for name in header if list(header).count(name) > 1})
    if duplicated:
        raise InvalidValueError(f"{where}: column {duplicated[0]!r} appears more than once")
    missing = [name for name in REQUIRED_COLUMNS if name not in header]
    if missing:
        raise InvalidValueError(f"{where}: required column {missing[0]!r} is missing")
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
        raise InvalidValueError(f"{where}: {error}") from None


def _read_csv(path: Path) -> DraftTrace:
    where = str(path)
    line = 0  # the last line read whole, for decoding errors
    try:
        with _open_text(path, "r") as handle:
            reader = csv.reader(handle)
            try:
                header = next(reader)
            except StopIteration:
                raise InvalidValueError(f"{where}: empty file, expected a header row") from None
            line = reader.line_num
            columns = _header_columns([name.strip() for name in header], where)
            values: dict[str, list[Any]] = {c.name: [] for c in columns}
            for row_index, row in enumerate(reader):
                line = reader.line_num
                if not row:
                    continue
                if len(row) != len(columns):
                    raise InvalidValueError(
                        f"{where}: row {row_index + 1} (line {line}): expected "
                        f"{len(columns)} fields, got {len(row)}"
                    )
                for column, text in zip(columns, row, strict=True):
                    try:
                        values[column.name].append(_parse_cell(column.kind, column.required, text))
                    except ValueError as error:
                        raise InvalidValueError(
                            f"{where}: row {row_index + 1} (line {line}), "
                            f"column {column.name!r}: {error}"
                        ) from None
    except UnicodeDecodeError:
        raise InvalidValueError(f"{where}: {_undecodable_line(path)}") from None
    except _DECODE_ERRORS as error:
        raise InvalidValueError(f"{where}: line {line + 1}: {_decode_problem(error)}") from None
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
        return InvalidValueError(
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
                raise InvalidValueError(
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
        raise InvalidValueError("is null")
    kind = column.kind
    if kind == "str":
        if not isinstance(cell, str):
            raise InvalidValueError(f"expected a string, got {_shown(cell)}")
        return cell
    if kind == "float":
        if isinstance(cell, bool) or not isinstance(cell, int | float):
            raise InvalidValueError(f"expected a number, got {_shown(cell)}")
        if column.required and math.isnan(cell):
            raise InvalidValueError(f"expected a number, got {_shown(cell)}")
        return float(cell)
    if kind == "bool":
        if isinstance(cell, bool) or (isinstance(cell, int) and cell in (0, 1)):
            return bool(cell)
        raise InvalidValueError(f"expected a boolean, got {_shown(cell)}")
    if isinstance(cell, bool) or not isinstance(cell, int):
        raise InvalidValueError(f"expected an integer, got {_shown(cell)}")
    if kind == "label" and cell not in (0, 1):
        raise InvalidValueError(f"expected 1, 0 or null, got {_shown(cell)}")
    if not _INT64_MIN <= cell <= _INT64_MAX:
        raise InvalidValueError(f"must fit in int64, got {cell}")
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
        raise InvalidTypeError(f"path must be a str or a path, got {type(path).__name__}")
    return Path(path)


def _format_of(path: Path) -> Literal["csv", "parquet"]:
    name = path.name.lower()
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    raise InvalidValueError(f"path must end in .csv, .csv.gz or .parquet, got {str(path)!r}")


def _check_trace(trace: object) -> DraftTrace:
    if not isinstance(trace, DraftTrace):
        raise InvalidTypeError(f"trace must be a DraftTrace, got {type(trace).__name__}")
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
    """Writes ``trace`` to ``.csv``, ``.csv.gz`` (lossless float repr) or ``.parquet``: a new
    file or over a regular one (anything else, such as a FIFO, is a ``ValueError``)."""
    trace = _check_trace(trace)
    path = _trace_path(path)
    kind = _format_of(path)
    _check_writable_path(path)
    if kind == "parquet":
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
        raise InvalidValueError(
            f"path must be a .csv or .csv.gz file to append to, got {str(path)!r}"
        )
    exists = path.exists()
    if exists:
        _check_regular_file(path)
    exists = exists and path.stat().st_size > 0
    if exists:
        try:
            with _open_text(path, "r") as handle:
                header = next(csv.reader(handle), [])
        except UnicodeDecodeError:
            raise InvalidValueError(f"{path}: {_undecodable_line(path)}") from None
        except _DECODE_ERRORS as error:
            raise InvalidValueError(f"{path}: line 1: {_decode_problem(error)}") from None
        if tuple(name.strip() for name in header) != trace.columns:
            raise InvalidValueError(
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
        raise InvalidValueError(
            f"name: {name!r} is not a shipped trace ({', '.join(SHIPPED_TRACES)})"
        )
    resource = resources.files("av_core").joinpath("data", name)
    with resources.as_file(resource) as path:
        return read_trace(path)
