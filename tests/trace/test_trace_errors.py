"""Trace readers and builders at their boundaries (issue #17, items 6 and 7).

Properties, not examples:

- every value handed to ``DraftTrace``/``trace_from_rows`` is checked as given, before any cast:
  it is stored exactly, or refused with a ``ValueError``/``TypeError`` that names the column and
  quotes the value the caller passed (never a wrapped one);
- whatever bytes a trace file holds, ``read_trace`` returns a valid trace or raises a
  ``ValueError`` that names the file: no ``UnicodeDecodeError``, ``EOFError``, ``gzip`` or ``csv``
  error, ``OverflowError`` or pyarrow exception escapes;
- a rejected call changes nothing (the builders are pure; ``append_trace`` leaves the file).
"""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from av_core.tools.collect import read_prompts
from av_core.tools.evaluate import MAX_ROUND_ENTRIES, DraftRounds
from av_core.tools.simulate import MeasuredCost
from av_core.tools.trace import (
    UNLABELED,
    DraftTrace,
    append_trace,
    read_trace,
    trace_from_rows,
    write_trace,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FUNCTION_SCOPED = [HealthCheck.function_scoped_fixture]

#: numpy integer dtypes and the range each can hold.
INTEGER_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def base_columns(n: int = 2) -> dict[str, object]:
    return {
        "request_id": np.zeros(n, dtype=np.int64),
        "step": np.zeros(n, dtype=np.int64),
        "position": np.arange(n, dtype=np.int64),
        "workload": np.array(["w"] * n),
        "logit_q_max": np.linspace(-1.0, 1.0, n),
        "admitted": np.ones(n, dtype=bool),
        "label": np.full(n, UNLABELED, dtype=np.int8),
    }


@st.composite
def integer_columns(draw: st.DrawFn) -> tuple[object, list[int]]:
    """A column of integers as the caller might pass it: a numpy array of any integer dtype, or
    a Python list/tuple of ints of any size. Returns (column, the Python values it holds)."""
    kind = draw(st.sampled_from(["numpy", "list", "tuple"]))
    n = 2
    if kind == "numpy":
        dtype = draw(st.sampled_from(INTEGER_DTYPES))
        info = np.iinfo(dtype)
        values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n))
        return np.array(values, dtype=dtype), values
    values = draw(
        st.lists(
            st.integers(-(2**70), 2**70) | st.sampled_from([-1, 0, 1, 255, 256, 257, 2**63]),
            min_size=n,
            max_size=n,
        )
    )
    return (values if kind == "list" else tuple(values)), values


def quoted(value: int, message: str) -> bool:
    """Whether ``message`` quotes ``value`` exactly (as a whole number, not inside another)."""
    return re.search(rf"(?<![\d-]){re.escape(str(value))}(?!\d)", message) is not None


@settings(max_examples=300, deadline=None)
@given(column=integer_columns())
def test_labels_are_checked_before_the_int8_cast(column: tuple[object, list[int]]) -> None:
    labels, values = column
    columns = base_columns() | {"label": labels}
    if all(v in (-1, 0, 1) for v in values):
        assume(not (values[0] in (0, -1) and values[1] != -1))  # the label-order rule
        trace = DraftTrace(**columns)  # type: ignore[arg-type]
        assert trace.label.dtype == np.int8
        assert trace.label.tolist() == values
        return
    with pytest.raises(ValueError) as error:
        DraftTrace(**columns)  # type: ignore[arg-type]
    bad = [v for v in values if v not in (-1, 0, 1)]
    message = str(error.value)
    assert "'label'" in message and any(quoted(v, message) for v in bad), message


@settings(max_examples=300, deadline=None)
@given(column=integer_columns(), name=st.sampled_from(["request_id", "step", "position"]))
def test_integer_ids_are_stored_exactly_or_refused_with_the_value_passed(
    column: tuple[object, list[int]], name: str
) -> None:
    ids, values = column
    if name == "position":
        assume(values[0] != values[1])  # positions must differ within a step
    columns = base_columns() | {name: ids}
    if all(0 <= v <= INT64_MAX for v in values):
        trace = DraftTrace(**columns)  # type: ignore[arg-type]
        assert getattr(trace, name).dtype == np.int64
        assert getattr(trace, name).tolist() == values
        return
    with pytest.raises(ValueError) as error:
        DraftTrace(**columns)  # type: ignore[arg-type]
    bad = [v for v in values if not 0 <= v <= INT64_MAX]
    message = str(error.value)
    assert repr(name) in message and any(quoted(v, message) for v in bad), message


@pytest.mark.parametrize(
    ("name", "value", "error", "match"),
    [
        ("label", np.array([1, 257]), ValueError, r"row 2, column 'label'.* 257"),
        ("label", np.array([1, 256]), ValueError, r"column 'label'.* 256"),
        ("label", [1, 255], ValueError, r"column 'label'.* 255"),
        ("label", [1.0, 0.0], TypeError, r"column 'label'.*integer"),
        ("request_id", np.array([2**63, 0], dtype=np.uint64), ValueError, str(2**63)),
        ("request_id", [2**64, 0], ValueError, str(2**64)),
        ("request_id", [1.5, 0], TypeError, r"column 'request_id'.*1\.5"),
        ("request_id", [True, False], TypeError, "request_id"),
        ("step", ["0", "1"], TypeError, "step"),
        ("logit_q_max", [10**400, 0.0], ValueError, "logit_q_max.*too large"),
        ("logit_q_max", [[1.0], [1.0, 2.0]], TypeError, "logit_q_max"),
        ("logit_q_max", [[1.0], [2.0]], ValueError, "logit_q_max.*1-D"),
        ("logit_q_max", ["a", "b"], TypeError, "logit_q_max"),
        ("admitted", [2, 1], ValueError, r"admitted.*2"),
        ("admitted", np.array([2**64 - 1, 1], dtype=np.uint64), ValueError, "admitted"),
        ("workload", np.array([b"\xff", b"a"]), TypeError, "workload.*bytes"),
        ("temperature", [10**400, 1.0], ValueError, "temperature"),
    ],
)
def test_constructor_refuses_with_the_column_named(
    name: str, value: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        DraftTrace(**(base_columns() | {name: value}))  # type: ignore[arg-type]


def test_trace_from_rows_checks_every_cell_as_given() -> None:
    def rows(**change: object) -> list[dict[str, object]]:
        base: dict[str, object] = {
            "request_id": 0,
            "step": 0,
            "workload": "w",
            "logit_q_max": 0.5,
            "admitted": True,
            "label": None,
        }
        return [base | {"position": 0}, base | {"position": 1} | change]

    assert trace_from_rows(rows(request_id=INT64_MAX)).request_id[1] == INT64_MAX
    for change, error, match in [
        ({"request_id": 2**63}, ValueError, str(2**63)),
        ({"request_id": 2**70}, ValueError, str(2**70)),
        ({"request_id": 0.5}, TypeError, "request_id"),
        ({"label": 257}, ValueError, "257"),
        ({"label": 2.0}, TypeError, "label"),
        ({"admitted": 2}, ValueError, "admitted"),
        ({"logit_q_max": "x"}, TypeError, "logit_q_max"),
        ({"logit_q_max": 10**400}, ValueError, "logit_q_max"),
        ({"nonsense": 1}, ValueError, "columns"),
    ]:
        with pytest.raises(error, match=match):
            trace_from_rows(rows(**change))
    with pytest.raises(TypeError, match="rows"):
        trace_from_rows(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="row 1"):
        trace_from_rows([[("request_id", 0)]])  # type: ignore[list-item]


def small_trace(n: int = 3) -> DraftTrace:
    return trace_from_rows(
        {
            "request_id": 0,
            "step": 0,
            "position": k,
            "workload": "prose",
            "logit_q_max": 1.5 - k,
            "admitted": True,
            "label": [1, 0, None][k % 3] if k < 3 else None,
            "prompt_id": "p/1",
        }
        for k in range(n)
    )


def test_select_and_concatenate_refuse_bad_arguments_by_name() -> None:
    trace = small_trace()
    assert trace.select([2, 0]).position.tolist() == [2, 0]
    assert trace.select(np.array([-1], dtype=np.int8)).position.tolist() == [2]
    assert len(trace.select(np.zeros(0, dtype=bool)[:0].astype(np.int64))) == 0
    for mask, error in [
        ([5], ValueError),
        ([-4], ValueError),
        (np.array([2**64 - 1], dtype=np.uint64), ValueError),
        ([True, False], ValueError),  # a bool mask of the wrong length
        ([0.5], TypeError),
        ([[0]], ValueError),
        (["a"], TypeError),
    ]:
        with pytest.raises(error, match="mask"):
            trace.select(mask)
    with pytest.raises(TypeError, match=r"traces\[1\]"):
        DraftTrace.concatenate([trace, "trace"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="traces"):
        DraftTrace.concatenate(trace)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trace"):
        write_trace("not a trace", "x.csv")  # type: ignore[arg-type]


# --- readers: any bytes give a trace or a ValueError naming the file ---------------------------


def written(tmp_path: Path, suffix: str, name: str = "t") -> Path:
    path = tmp_path / f"{name}{suffix}"
    write_trace(small_trace(), path)
    return path


def assert_read_is_clean(path: Path) -> None:
    """read_trace either succeeds or raises ValueError naming the file; nothing else."""
    try:
        trace = read_trace(path)
    except ValueError as error:
        assert str(path) in str(error), str(error)
    else:
        assert isinstance(trace, DraftTrace)


@st.composite
def corruptions(draw: st.DrawFn, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "replace", "garbage"]))
    if kind == "garbage":
        return draw(st.binary(max_size=200))
    if not data:
        return data
    at = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
    if kind == "truncate":
        return data[:at]
    if kind == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at + 8 :]


@settings(max_examples=400, deadline=None, suppress_health_check=FUNCTION_SCOPED)
@given(data=st.data(), suffix=st.sampled_from([".csv", ".csv.gz", ".parquet"]))
def test_any_corruption_reads_as_a_trace_or_a_value_error_naming_the_file(
    tmp_path: Path, data: st.DataObject, suffix: str
) -> None:
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    path = written(tmp_path, suffix)
    original = path.read_bytes()
    path.write_bytes(data.draw(corruptions(original)))
    assert_read_is_clean(path)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("utf.csv", b"request_id,step\n0,\xff\n", r"line 2: not UTF-8"),
        ("trunc.csv.gz", gzip.compress(b"request_id,step\n" * 200)[:-30], "ends early"),
        ("bad.csv.gz", b"definitely not gzip", "not a gzip file"),
        ("big.csv", None, r"row 1 \(line 2\), column 'request_id': must fit in int64"),
        ("field.csv", None, "malformed CSV"),
        ("bad.parquet", b"PAR1 but not parquet", "not a readable Parquet trace"),
    ],
)
def test_decoding_failures_name_the_file(
    tmp_path: Path, name: str, content: bytes | None, match: str
) -> None:
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    header = "request_id,step,position,workload,logit_q_max,admitted,label\n"
    if name == "big.csv":
        content = (header + f"{2**64},0,0,w,1.0,1,1\n").encode()
    if name == "field.csv":
        content = (header + '0,0,0,"' + "x" * 200_000 + '",1.0,1,1\n').encode()
    assert content is not None
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as error:
        read_trace(path)
    assert str(path) in str(error.value)


def test_parquet_ids_beyond_int64_name_the_row(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    columns = {k: v.tolist() for k, v in small_trace(2).to_dict().items()}
    columns["label"] = [None, None]
    table = pa.table(columns).set_column(
        0, "request_id", pa.array([0, 2**64 - 1], type=pa.uint64())
    )
    path = tmp_path / "u64.parquet"
    pq.write_table(table, path)
    with pytest.raises(ValueError, match=rf"row 2, column 'request_id'.*{2**64 - 1}"):
        read_trace(path)


def test_a_byte_order_mark_and_upper_case_suffixes_read(tmp_path: Path) -> None:
    path = written(tmp_path, ".csv")
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert len(read_trace(bom)) == 3
    upper = tmp_path / "T.CSV.GZ"
    upper.write_bytes(gzip.compress(path.read_bytes()))
    assert len(read_trace(upper)) == 3


def test_what_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "dir.csv"
    directory.mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        read_trace(directory)
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo.csv"
        os.mkfifo(fifo)
        with pytest.raises(ValueError, match="not a regular file"):
            read_trace(fifo)  # would block forever if it were opened
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "missing.csv")
    with pytest.raises(TypeError, match="path"):
        read_trace(3)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None, suppress_health_check=FUNCTION_SCOPED)
@given(data=st.data(), suffix=st.sampled_from([".csv", ".csv.gz"]))
def test_append_to_a_damaged_file_raises_and_leaves_it(
    tmp_path: Path, data: st.DataObject, suffix: str
) -> None:
    path = written(tmp_path, suffix, name="append")
    damaged = data.draw(corruptions(path.read_bytes()))
    path.write_bytes(damaged)
    try:
        append_trace(small_trace(), path)
    except ValueError as error:
        assert str(path) in str(error)
        assert path.read_bytes() == damaged
    # A successful append is one of the damaged files a reader then judges (no other error).
    assert_read_is_clean(path)


# --- other readers and the trace regrouping ----------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=FUNCTION_SCOPED)
@given(content=st.binary(max_size=120) | st.sampled_from([b"[]", b"1", b'{"verify": [[1]]}']))
def test_cost_and_prompt_files_fail_with_value_errors_naming_the_file(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "input.json"
    path.write_bytes(content)
    for read in (MeasuredCost.load, read_prompts):
        try:
            read(path)
        except ValueError as error:
            assert str(path) in str(error)


def test_cost_files_with_odd_values_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    for text in (
        '{"verify": [[1, 2], [3]]}',
        '{"verify": [[1, "a"]]}',
        '{"verify": [[1, 1e999]]}',
        '{"verify": [[1, 2]], "draft": 5}',
        '{"verify": [[1, ' + "9" * 400 + "]]}",
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match="'verify'|'draft'"):
            MeasuredCost.load(path)


def test_a_stray_deep_position_is_refused_before_the_rounds_are_laid_out() -> None:
    columns = base_columns(2) | {"position": np.array([0, MAX_ROUND_ENTRIES])}
    with pytest.raises(ValueError, match="MAX_ROUND_ENTRIES"):
        DraftRounds.from_trace(DraftTrace(**columns))  # type: ignore[arg-type]
