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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
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
            array = _coerce(column, value)
            if array.ndim != 1:
                raise ValueError(f"column {column.name!r} must be 1-D, got shape {array.shape}")
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
        """Rows where ``mask`` is true (a boolean mask or integer indices)."""
        index = np.asarray(mask)
        return DraftTrace(**{name: getattr(self, name)[index] for name in self.columns})

    def to_dict(self) -> dict[str, npt.NDArray[Any]]:
        """Present columns by name."""
        return {name: getattr(self, name) for name in self.columns}

    @staticmethod
    def concatenate(traces: Sequence[DraftTrace]) -> DraftTrace:
        """Rows of every trace in order; all must have the same columns."""
        if not traces:
            raise ValueError("traces must not be empty, got []")
        names = traces[0].columns
        for index, trace in enumerate(traces):
            if trace.columns != names:
                raise ValueError(
                    f"traces[{index}] has columns {trace.columns}, expected {names} like traces[0]"
                )
        return DraftTrace(
            **{name: np.concatenate([getattr(t, name) for t in traces]) for name in names}
        )


def _coerce(column: Column, value: npt.ArrayLike) -> npt.NDArray[Any]:
    if column.kind == "int":
        array = np.asarray(value)
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"column {column.name!r} must hold integers, got dtype {array.dtype}")
        return array.astype(np.int64)
    if column.kind == "label":
        array = np.asarray(value)
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"column 'label' must hold integers (-1 unlabeled), got {array.dtype}")
        return array.astype(np.int8)
    if column.kind == "bool":
        array = np.asarray(value)
        if array.size and not (
            np.issubdtype(array.dtype, np.bool_) or np.issubdtype(array.dtype, np.integer)
        ):
            raise TypeError(f"column {column.name!r} must hold booleans, got dtype {array.dtype}")
        if array.size and np.issubdtype(array.dtype, np.integer):
            bad = np.flatnonzero((array != 0) & (array != 1))
            if bad.size:
                raise ValueError(
                    f"row {bad[0] + 1}, column {column.name!r}: expected 0 or 1, "
                    f"got {array[bad[0]].item()!r}"
                )
        return array.astype(np.bool_)
    if column.kind == "float":
        array = np.asarray(value)
        if array.size and not (
            np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
        ):
            raise TypeError(f"column {column.name!r} must hold numbers, got dtype {array.dtype}")
        return array.astype(np.float64)
    return np.asarray(value).astype(np.str_)


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
    bad = np.flatnonzero((trace.label < -1) | (trace.label > 1))
    if bad.size:
        raise _fail(int(bad[0]), "label", f"must be 1, 0 or unlabeled, got {trace.label[bad[0]]}")
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


def _open_text(path: Path, mode: Literal["r", "w", "a"]) -> IO[str]:
    if path.name.endswith(".gz"):
        return cast(IO[str], gzip.open(path, mode + "t", encoding="utf-8", newline=""))
    return open(path, mode, encoding="utf-8", newline="")


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
            return int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if kind == "label":
        if text not in ("0", "1"):
            raise ValueError(f"expected 1, 0 or empty, got {text!r}")
        return int(text)
    if kind == "bool":
        lowered = text.lower()
        if lowered in ("1", "true"):
            return True
        if lowered in ("0", "false"):
            return False
        raise ValueError(f"expected 0 or 1, got {text!r}")
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if math.isnan(number) and required:
        raise ValueError(f"expected a number, got {text!r}")
    return number


def _header_columns(header: Sequence[str], where: str) -> list[Column]:
    columns: list[Column] = []
    for name in header:
        if name not in _BY_NAME:
            raise ValueError(f"{where}: column {name!r} is not part of the trace schema")
        columns.append(_BY_NAME[name])
    duplicated = sorted({name for name in header if list(header).count(name) > 1})
    if duplicated:
        raise ValueError(f"{where}: column {duplicated[0]!r} appears more than once")
    missing = [name for name in REQUIRED_COLUMNS if name not in header]
    if missing:
        raise ValueError(f"{where}: required column {missing[0]!r} is missing")
    return columns


def _from_columns(where: str, values: Mapping[str, list[Any]]) -> DraftTrace:
    arrays: dict[str, npt.NDArray[Any]] = {}
    for name, cells in values.items():
        kind = _BY_NAME[name].kind
        dtype: Any = {
            "int": np.int64,
            "float": np.float64,
            "bool": np.bool_,
            "label": np.int8,
            "str": np.str_,
        }[kind]
        arrays[name] = np.asarray(cells, dtype=dtype) if cells else np.zeros(0, dtype=dtype)
    try:
        return DraftTrace(**arrays)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _read_csv(path: Path) -> DraftTrace:
    where = str(path)
    with _open_text(path, "r") as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise ValueError(f"{where}: empty file, expected a header row") from None
        columns = _header_columns([name.strip() for name in header], where)
        values: dict[str, list[Any]] = {c.name: [] for c in columns}
        for row_index, row in enumerate(reader):
            if not row:
                continue
            if len(row) != len(columns):
                raise ValueError(
                    f"{where}: row {row_index + 1} (line {reader.line_num}): expected "
                    f"{len(columns)} fields, got {len(row)}"
                )
            for column, text in zip(columns, row, strict=True):
                try:
                    values[column.name].append(_parse_cell(column.kind, column.required, text))
                except ValueError as error:
                    raise ValueError(
                        f"{where}: row {row_index + 1} (line {reader.line_num}), "
                        f"column {column.name!r}: {error}"
                    ) from None
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


def _read_parquet(path: Path) -> DraftTrace:
    pa = _require_pyarrow()
    where = str(path)
    table = pa.parquet.read_table(path)
    columns = _header_columns(table.column_names, where)
    values: dict[str, list[Any]] = {}
    for column in columns:
        cells = table.column(column.name).to_pylist()
        parsed: list[Any] = []
        for row_index, cell in enumerate(cells):
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
            raise ValueError(f"expected a string, got {cell!r}")
        return cell
    if kind == "float":
        if isinstance(cell, bool) or not isinstance(cell, int | float):
            raise ValueError(f"expected a number, got {cell!r}")
        if column.required and math.isnan(cell):
            raise ValueError(f"expected a number, got {cell!r}")
        return float(cell)
    if kind == "bool":
        if isinstance(cell, bool) or (isinstance(cell, int) and cell in (0, 1)):
            return bool(cell)
        raise ValueError(f"expected a boolean, got {cell!r}")
    if isinstance(cell, bool) or not isinstance(cell, int):
        raise ValueError(f"expected an integer, got {cell!r}")
    if kind == "label" and cell not in (0, 1):
        raise ValueError(f"expected 1, 0 or null, got {cell!r}")
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


def _format_of(path: Path) -> Literal["csv", "parquet"]:
    name = path.name.lower()
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    raise ValueError(f"path must end in .csv, .csv.gz or .parquet, got {str(path)!r}")


def read_trace(path: str | Path) -> DraftTrace:
    """Reads and validates a trace from ``.csv``, ``.csv.gz`` or ``.parquet``.

    Raises ``ValueError`` naming the file, the 1-based data row and the column of the first
    problem: an unknown or missing column, an unparsable or empty required cell, or a broken
    invariant (for example a label after the first rejection of a step).
    """
    path = Path(path)
    if _format_of(path) == "parquet":
        return _read_parquet(path)
    return _read_csv(path)


def write_trace(trace: DraftTrace, path: str | Path) -> None:
    """Writes ``trace`` to ``.csv``, ``.csv.gz`` (lossless float repr) or ``.parquet``."""
    path = Path(path)
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
    path = Path(path)
    if _format_of(path) != "csv":
        raise ValueError(f"path must be a .csv or .csv.gz file to append to, got {str(path)!r}")
    exists = path.exists() and path.stat().st_size > 0
    if exists:
        with _open_text(path, "r") as handle:
            header = next(csv.reader(handle), [])
        if tuple(header) != trace.columns:
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
    """Builds a trace from row mappings (column name → value; label ``None`` is unlabeled)."""
    materialized = list(rows)
    if not materialized:
        raise ValueError("rows must not be empty, got no rows")
    names = [c.name for c in COLUMNS if c.name in materialized[0]]
    unknown = sorted(set(materialized[0]) - set(_BY_NAME))
    if unknown:
        raise ValueError(f"row 1: column {unknown[0]!r} is not part of the trace schema")
    values: dict[str, list[Any]] = {name: [] for name in names}
    for index, row in enumerate(materialized):
        if set(row) != set(names):
            raise ValueError(f"row {index + 1}: columns {sorted(row)} differ from row 1's")
        for name in names:
            value = row[name]
            if name == "label" and value is None:
                value = UNLABELED
            elif _BY_NAME[name].kind == "float" and value is None:
                value = math.nan
            values[name].append(value)
    return _from_columns("rows", values)


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
