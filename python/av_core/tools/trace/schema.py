"""The trace in memory: its columns (:data:`COLUMNS`), :class:`DraftTrace` with the checks every
trace passes (values in range, labels in the speculative-decoding order), and
:func:`trace_from_rows`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from av_core._native import InvalidTypeError, InvalidValueError
from av_core.tools.metrics import _host_array

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
    Column("top10_confidence", "float", False, "top candidate's share of the 10 largest logits"),
)
_BY_NAME = {column.name: column for column in COLUMNS}
REQUIRED_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.required)

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
    top10_confidence: FloatArray | None = None

    def __post_init__(self) -> None:
        length: int | None = None
        for column in COLUMNS:
            value = getattr(self, column.name)
            if value is None:
                if column.required:
                    raise InvalidValueError(f"column {column.name!r} is required, got None")
                continue
            array = _as_array(column, value)
            if array.ndim != 1:
                raise InvalidValueError(
                    f"column {column.name!r} must be 1-D, got shape {array.shape}"
                )
            array = _coerce(column, array)
            if length is None:
                length = array.shape[0]
            elif array.shape[0] != length:
                raise InvalidValueError(
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
        index = _host_array(mask, "mask")
        if index.ndim != 1:
            raise InvalidValueError(f"mask must be 1-D, got shape {index.shape}")
        if index.dtype == np.bool_:
            if index.shape[0] != len(self):
                raise InvalidValueError(
                    f"mask has {index.shape[0]} entries, the trace {len(self)} rows"
                )
        elif index.size == 0:
            index = index.astype(np.int64)
        elif index.dtype.kind in "mM" or not np.issubdtype(index.dtype, np.integer):
            raise InvalidTypeError(
                f"mask must be a boolean mask or integer indices, got {index.dtype}"
            )
        else:
            # Compared as given: a cast to int64 first would wrap a uint64 index.
            low, high = index.min(), index.max()
            too_low = not np.issubdtype(index.dtype, np.unsignedinteger) and low < -len(self)
            if too_low or high >= len(self):
                bad = low if too_low else high
                raise InvalidValueError(
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
            raise InvalidTypeError(
                f"traces must be a sequence of DraftTrace, got {type(traces).__name__}"
            )
        if not traces:
            raise InvalidValueError("traces must not be empty, got []")
        for index, trace in enumerate(traces):
            if not isinstance(trace, DraftTrace):
                raise InvalidTypeError(
                    f"traces[{index}] must be a DraftTrace, got {type(trace).__name__}"
                )
        names = traces[0].columns
        for index, trace in enumerate(traces):
            if trace.columns != names:
                raise InvalidValueError(
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
    """``value`` as a private array, nothing cast yet: what is checked is then what is stored,
    whatever another thread writes into the caller's array meanwhile. A list or tuple goes
    through an object array so that every element is checked as given (numpy would turn
    ``[1, 2**63]`` into float64); a torch tensor in any form becomes the values it stands for."""
    if isinstance(value, list | tuple):
        try:
            return np.asarray(value, dtype=object)
        except (ValueError, TypeError, OverflowError) as error:
            raise InvalidValueError(
                f"column {column.name!r} must be a 1-D array: {error}"
            ) from None
    return _host_array(value, f"column {column.name!r}")


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
    if array.dtype.kind in "mM":  # numpy counts timedelta64 among its integers
        raise InvalidTypeError(f"column {name!r} must not hold times, got dtype {array.dtype}")
    if kind in ("int", "label"):
        if array.size and not np.issubdtype(array.dtype, np.integer):
            expected = "integers (-1 unlabeled)" if kind == "label" else "integers"
            raise InvalidTypeError(f"column {name!r} must hold {expected}, got dtype {array.dtype}")
        low, high = _INT_RANGE[kind]
        if np.issubdtype(array.dtype, np.unsignedinteger):
            bad = np.flatnonzero(array > high)
        else:
            bad = np.flatnonzero((array < low) | (array > high))
        if bad.size:
            raise _range_error(int(bad[0]), column, int(array[bad[0]]))
        return array.astype(np.int8 if kind == "label" else np.int64, copy=False)
    if kind == "bool":
        if array.size and not (
            np.issubdtype(array.dtype, np.bool_) or np.issubdtype(array.dtype, np.integer)
        ):
            raise InvalidTypeError(f"column {name!r} must hold booleans, got dtype {array.dtype}")
        if array.size and np.issubdtype(array.dtype, np.integer):
            bad = np.flatnonzero((array != 0) & (array != 1))
            if bad.size:
                raise InvalidValueError(
                    f"row {bad[0] + 1}, column {name!r}: expected 0 or 1, "
                    f"got {array[bad[0]].item()!r}"
                )
        return array.astype(np.bool_, copy=False)
    if kind == "float":
        if array.size and not (
            np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
        ):
            raise InvalidTypeError(f"column {name!r} must hold numbers, got dtype {array.dtype}")
        return array.astype(np.float64, copy=False)
    if array.dtype.kind == "S":
        raise InvalidTypeError(f"column {name!r} must hold str, got bytes (dtype {array.dtype})")
    return array.astype(np.str_, copy=False)


def _from_objects(column: Column, items: list[Any]) -> npt.NDArray[Any]:
    """A column given as Python objects, checked element by element, then built in the schema's
    dtype."""
    name, kind = column.name, column.kind
    if kind == "str":
        for row, item in enumerate(items):
            if isinstance(item, bytes | bytearray):
                raise InvalidTypeError(f"row {row + 1}, column {name!r}: expected a str, got bytes")
            if item is None:  # str(None) would store the text "None"
                raise InvalidTypeError(f"row {row + 1}, column {name!r}: expected a str, got None")
        return np.asarray([str(item) for item in items], dtype=np.str_).reshape(len(items))
    if kind == "float":
        floats: list[float] = []
        for row, item in enumerate(items):
            if isinstance(item, bool | np.bool_) or not isinstance(item, numbers.Real):
                raise InvalidTypeError(
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
                raise InvalidTypeError(
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
            raise InvalidTypeError(
                f"row {row + 1}, column {name!r}: expected an integer, got {_shown(item)}"
            )
        number = int(item)
        if not low <= number <= high:
            raise _range_error(row, column, number)
        values.append(number)
    return np.asarray(values, dtype=np.int8 if kind == "label" else np.int64).reshape(len(items))


def _fail(row: int, name: str, message: str) -> InvalidValueError:
    return InvalidValueError(f"row {row + 1}, column {name!r}: {message}")


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
    for name in ("temperature", "top_p", "acceptance_probability", "top10_confidence"):
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
    row = _second_of_first_pair(order, same & (np.diff(positions) == 0))
    if row is not None:
        raise _fail(
            row,
            "position",
            f"position {trace.position[row]} repeats within request "
            f"{trace.request_id[row]}, step {trace.step[row]}",
        )
    row = _second_of_first_pair(order, same & (labels[:-1] != 1) & (labels[1:] != UNLABELED))
    if row is not None:
        raise _fail(
            row,
            "label",
            f"got {trace.label[row]} after an unlabeled or rejected position in request "
            f"{trace.request_id[row]}, step {trace.step[row]}; labels read 1..1 [0] then empty",
        )


def _second_of_first_pair(order: npt.NDArray[np.intp], broken: npt.NDArray[np.bool_]) -> int | None:
    """The trace row of the later entry of the first neighbouring pair (in ``order``) that is
    ``broken``; ``None`` if none is."""
    hits = np.flatnonzero(broken)
    return int(order[hits[0] + 1]) if hits.size else None


def trace_from_rows(rows: Iterable[Mapping[str, Any]]) -> DraftTrace:
    """Builds a trace from row mappings (column name → value; label ``None`` is unlabeled).

    Every value is checked as given, before any cast: an id that does not fit int64, a label
    other than 1, 0 or None, a float where an integer belongs raise ``ValueError`` or
    ``TypeError`` naming the row and the column.
    """
    if isinstance(rows, Mapping) or not isinstance(rows, Iterable):
        raise InvalidTypeError(f"rows must be an iterable of mappings, got {type(rows).__name__}")
    materialized = list(rows)
    if not materialized:
        raise InvalidValueError("rows must not be empty, got no rows")
    for index, row in enumerate(materialized):
        if not isinstance(row, Mapping):
            raise InvalidTypeError(f"row {index + 1}: expected a mapping, got {type(row).__name__}")
    names = [c.name for c in COLUMNS if c.name in materialized[0]]
    unknown = sorted((key for key in materialized[0] if key not in _BY_NAME), key=repr)
    if unknown:
        raise InvalidValueError(
            f"row 1: column {_shown(unknown[0])} is not part of the trace schema"
        )
    values: dict[str, list[Any]] = {name: [] for name in names}
    for index, row in enumerate(materialized):
        if len(row) != len(names) or any(name not in row for name in names):
            raise InvalidValueError(
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
