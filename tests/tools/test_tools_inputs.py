"""The offline tools' array inputs and trace files at their boundaries (issue #17, items 1, 2, 7
and 10, for ``av_core.metrics`` and ``av_core.trace``).

- A torch tensor in any form torch hands out (requiring grad, lazily negated, the real part of
  a conjugated tensor, bfloat16, transposed) is read as the values it stands for: before, numpy's
  conversion raised ``RuntimeError`` out of ``roc_auc``, ``log_loss``, ``DraftTrace`` and
  ``DraftTrace.select`` (neither ValueError nor TypeError), and bfloat16 was a ValueError.
- Times are not numbers: numpy counts ``timedelta64`` among its signed integers, so a duration
  passed as scores or as trace ids was used as its tick count.
- A column is checked on a private copy and the copy is stored: before, the caller's array was
  checked and then cast, so a value written in between (another thread; here an array subclass
  that changes under the cast) was stored unchecked, e.g. a label 256 cast to int8 as 0.
- ``None`` in a text column was stored as the text ``"None"``.
- ``write_trace`` to a FIFO blocked forever (opening it to write waits for a reader).
- A CSV cell is a number only as a trace writer spells it: ``int``/``float`` also read ``1_0``
  as 10 and other scripts' digits (``"\\u0661"`` as 1).
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from av_core.tools.metrics import (  # noqa: E402
    CalibrationReport,
    expected_calibration_error,
    log_loss,
    reliability_curve,
    roc_auc,
)
from av_core.tools.trace import DraftTrace, read_trace, trace_from_rows, write_trace  # noqa: E402

Y = np.array([0, 1, 1, 0, 1, 0, 0, 1])
P = np.array([0.125, 0.875, 0.375, 0.3125, 0.75, 0.5, 0.0625, 0.625])  # exact in bfloat16


def tensor_forms(values: np.ndarray) -> dict[str, torch.Tensor]:
    """Torch tensors that all stand for ``values`` (1-D)."""
    base = torch.from_numpy(values.copy())
    out = {
        "plain": base.clone(),
        "negated view": (-base)._neg_view(),
        "strided": torch.stack([base, base * 0], 1)[:, 0],
        "transposed row": base[None].t().contiguous().t()[0],
    }
    if values.dtype.kind == "f":  # forms only floating tensors take
        out["requires grad"] = base.clone().requires_grad_()
        out["imag of conj"] = torch.complex(base, -base).conj().imag
        out["bfloat16"] = base.to(torch.bfloat16)
        out["float16 negated"] = (-base.half())._neg_view()
    for name, tensor in out.items():
        widened = tensor.detach().resolve_neg().resolve_conj().double()
        assert torch.equal(widened, base.double()), name
    return out


def test_every_torch_form_gives_the_numpy_answer_in_the_scores() -> None:
    want = {
        "auc": roc_auc(Y, P),
        "log_loss": log_loss(Y, P),
        "ece": expected_calibration_error(Y, P, 4),
        "curve": reliability_curve(Y, P, 3).counts.tolist(),
        "report": CalibrationReport.from_predictions(Y, P, np.arange(8) % 3).to_text(),
    }
    for name, p in tensor_forms(P).items():
        for label_name, y in tensor_forms(Y).items():
            where = (name, label_name)
            assert roc_auc(y, p) == want["auc"], where
            assert log_loss(y, p) == want["log_loss"], where
            assert expected_calibration_error(y, p, 4) == want["ece"], where
            assert reliability_curve(y, p, 3).counts.tolist() == want["curve"], where
        positions = torch.from_numpy(np.arange(8) % 3).clone().requires_grad_(False)
        got = CalibrationReport.from_predictions(Y, p, (-positions)._neg_view()).to_text()
        assert got == want["report"], name


def test_a_tensor_numpy_cannot_hold_is_a_type_error_naming_the_argument() -> None:
    with pytest.raises(TypeError, match="y_score"):
        roc_auc(Y, torch.from_numpy(P).to(torch.complex64).conj())
    with pytest.raises(TypeError, match="y_prob"):
        log_loss(Y, torch.tensor([0.5] * 8, dtype=torch.complex128))


@pytest.mark.parametrize("dtype", ["timedelta64[s]", "datetime64[s]", "timedelta64[ns]"])
def test_times_are_not_scores_nor_trace_numbers(dtype: str) -> None:
    times = np.arange(8).astype(dtype)
    with pytest.raises(TypeError, match="y_score"):
        roc_auc(Y, times)
    with pytest.raises(TypeError, match="y_prob"):
        log_loss(Y, times)
    with pytest.raises(TypeError, match="y_true"):
        log_loss(np.array([0, 1]).astype(dtype), [0.5, 0.5])
    with pytest.raises(TypeError, match="positions"):
        CalibrationReport.from_predictions(Y, P, times)
    for column in ("request_id", "logit_q_max", "admitted", "label"):
        with pytest.raises(TypeError, match=column):
            DraftTrace(**{**trace_columns(8), column: np.zeros(8).astype(dtype)})
    with pytest.raises(TypeError, match="mask"):
        DraftTrace(**trace_columns(8)).select(np.arange(2).astype(dtype))


def trace_columns(n: int) -> dict[str, Any]:
    return {
        "request_id": np.arange(n),
        "step": np.zeros(n, np.int64),
        "position": np.zeros(n, np.int64),
        "workload": np.array(["w"] * n),
        "logit_q_max": np.arange(n) * 0.5 - 2.0,  # exact in bfloat16
        "admitted": np.ones(n, bool),
        "label": np.arange(n) % 2,
    }


def test_trace_columns_from_any_torch_form_are_the_values_they_stand_for() -> None:
    columns = trace_columns(8)
    want = DraftTrace(**columns)
    for name in ("request_id", "logit_q_max", "label"):
        for form, tensor in tensor_forms(np.asarray(columns[name])).items():
            trace = DraftTrace(**{**columns, name: tensor})
            got = getattr(trace, name)
            assert got.dtype == getattr(want, name).dtype, (name, form)
            assert np.array_equal(got, getattr(want, name)), (name, form)
    for form, index in tensor_forms(np.array([5, 0, 3])).items():
        assert np.array_equal(want.select(index).request_id, [5, 0, 3]), form


class _ChangesWhenCast(np.ndarray):
    """An array whose values change between a check and a cast (another thread's write)."""

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        self[...] = 256  # int8 would wrap it to 0
        return super().astype(*args, **kwargs)


def test_what_a_column_is_checked_on_is_what_the_trace_stores() -> None:
    labels = np.ones(8, np.int16).view(_ChangesWhenCast)
    trace = DraftTrace(**{**trace_columns(8), "label": labels})
    assert trace.label.tolist() == [1] * 8
    assert trace.label.dtype == np.int8


def test_a_text_column_refuses_none() -> None:
    row = {
        "request_id": 0,
        "step": 0,
        "position": 0,
        "workload": None,
        "logit_q_max": 1.0,
        "admitted": 1,
        "label": 1,
    }
    with pytest.raises(TypeError, match="row 1, column 'workload'"):
        trace_from_rows([row])
    with pytest.raises(TypeError, match="workload"):
        DraftTrace(**{**trace_columns(2), "workload": [None, "w"]})


def test_write_trace_refuses_a_fifo_without_waiting(tmp_path: Path) -> None:
    trace = DraftTrace(**trace_columns(4))
    for name in ("pipe.csv", "pipe.csv.gz", "pipe.parquet"):
        path = tmp_path / name
        os.mkfifo(path)
        outcome: dict[str, Any] = {}

        def write(path: Path = path, outcome: dict[str, Any] = outcome) -> None:
            try:
                write_trace(trace, path)
                outcome["result"] = "written"
            except Exception as error:  # noqa: BLE001 - reported to the test
                outcome["result"] = error

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        thread.join(10)
        if thread.is_alive():  # the code under test is blocked opening the FIFO: free it
            with open(path, "rb"):
                pass
            thread.join(10)
            pytest.fail(f"write_trace blocked on a FIFO ({name})")
        assert isinstance(outcome["result"], ValueError), outcome
        assert "not a regular file" in str(outcome["result"]) and name in str(outcome["result"])
    directory = tmp_path / "dir.csv"
    directory.mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        write_trace(trace, directory)
    written = tmp_path / "ok.csv"
    write_trace(trace, written)
    write_trace(trace, written)  # over a regular file: fine
    assert np.array_equal(read_trace(written).label, trace.label)


HEADER = "request_id,step,position,workload,logit_q_max,admitted,label,temperature\n"


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("1_0,0,0,w,1.5,1,1,1.0", "request_id"),
        ("\u0661,0,0,w,1.5,1,1,1.0", "request_id"),
        ("0,\uff11,0,w,1.5,1,1,1.0", "step"),  # a full-width digit
        ("0,0,0,w,1_0.5,1,1,1.0", "logit_q_max"),
        ("0,0,0,w,\u0661.5,1,1,1.0", "logit_q_max"),
        ("0,0,0,w,1.5,1,1,0_1.0", "temperature"),
    ],
)
def test_a_csv_number_is_spelled_as_a_trace_writer_spells_it(
    tmp_path: Path, row: str, column: str
) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + row + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"row 1 \(line 2\), column '{column}'"):
        read_trace(path)


def test_plain_numbers_still_read(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "+7, 0 ,0,w,-1.5e-3,1,1,inf\n", encoding="utf-8")
    trace = read_trace(path)
    assert trace.request_id.tolist() == [7] and trace.logit_q_max.tolist() == [-1.5e-3]
    assert trace.temperature is not None and math.isinf(trace.temperature[0])
