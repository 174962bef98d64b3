//! The fused CPU kernel of the drafter feature, `av_core.features`'s float32 and bfloat16 fast
//! path.

use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;

use crate::convert::{row_major, to_py_err, type_error, type_name, value_error, Float};

/// Registers the feature functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(draft_log_odds_f32, m)?)?;
    m.add_function(wrap_pyfunction!(draft_log_odds_bf16, m)?)?;
    Ok(())
}

fn array<'py>(obj: &Bound<'py, PyAny>, argument: &str) -> PyResult<Bound<'py, PyUntypedArray>> {
    obj.cast::<PyUntypedArray>().cloned().map_err(|_| {
        type_error(
            argument,
            format!("expected a numpy array, got {}", type_name(obj)),
        )
    })
}

/// `logit(q_max)` of each row of float32 `[N, V]` logits, as float32 `[N]`.
///
/// `inv_temperature` is float32 `[N]` (`1 / T`; 1 for greedy rows; NaN gives a NaN row);
/// `row_valid`, optional bool `[N]`, marks the rows to compute (the others give 0); both in any
/// layout. The logits are read in place and must be C-contiguous and aligned (ValueError
/// otherwise).
#[pyfunction]
#[pyo3(signature = (logits, inv_temperature, max_log_odds, row_valid=None))]
fn draft_log_odds_f32<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    inv_temperature: &Bound<'py, PyAny>,
    max_log_odds: Float,
    row_valid: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    log_odds::<f32>(
        py,
        logits,
        "float32",
        inv_temperature,
        max_log_odds.value("max_log_odds")?,
        row_valid,
    )
}

/// [`draft_log_odds_f32`] for bfloat16 logits given as their bit patterns: a C-contiguous int16
/// `[N, V]` array (`tensor.view(torch.int16).numpy()`, no copy). Gives exactly the feature of the logits
/// widened to float32.
#[pyfunction]
#[pyo3(signature = (logits, inv_temperature, max_log_odds, row_valid=None))]
fn draft_log_odds_bf16<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    inv_temperature: &Bound<'py, PyAny>,
    max_log_odds: Float,
    row_valid: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    log_odds::<i16>(
        py,
        logits,
        "int16 (bfloat16 bit patterns)",
        inv_temperature,
        max_log_odds.value("max_log_odds")?,
        row_valid,
    )
}

/// Both entry points: argument checks and conversion, then the core kernel without the GIL.
///
/// The per-row arguments (`inv_temperature`, `row_valid`, `N` values each) are copied, so what
/// is checked is what is used. The logits are too big to copy on the hot path: they are read
/// in place, and a buffer that another thread rewrites during the call can only change what
/// the affected rows come out as, never the shape or the range of the result (each row's
/// feature is NaN or within `±max_log_odds`; see `av_core::features`).
fn log_odds<'py, E>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    dtype_name: &str,
    inv_temperature: &Bound<'py, PyAny>,
    max_log_odds: f64,
    row_valid: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray1<f32>>>
where
    E: numpy::Element + av_core::features::LogitElement,
{
    let logits_any = array(logits, "logits")?;
    if logits_any.ndim() != 2 {
        return Err(value_error(
            "logits",
            format!(
                "expected a 2-D array [N, V], got shape {:?}",
                logits_any.shape()
            ),
        ));
    }
    let (rows, vocab) = (logits_any.shape()[0], logits_any.shape()[1]);
    let logits = logits_any
        .cast::<PyArray2<E>>()
        .map_err(|_| type_error("logits", format!("expected dtype {dtype_name}")))?;
    let temps = array(inv_temperature, "inv_temperature")?
        .cast::<PyArray1<f32>>()
        .map_err(|_| type_error("inv_temperature", "expected a 1-D float32 array"))
        .and_then(|a| row_major(a, "inv_temperature"))?;
    let valid = match row_valid {
        None => None,
        Some(obj) => Some(
            array(obj, "row_valid")?
                .cast::<PyArray1<bool>>()
                .map_err(|_| type_error("row_valid", "expected a 1-D bool array"))
                .and_then(|a| row_major(a, "row_valid"))?,
        ),
    };
    // The logits are read in place, never copied (they are the big argument: `[N, V]` with V
    // the vocabulary): another layout is refused rather than silently copied or misread.
    let readonly = logits.try_readonly()?;
    let logits_slice: &[E] = match readonly.as_slice() {
        Ok(slice) if logits_any.is_c_contiguous() => slice,
        _ => {
            return Err(value_error(
                "logits",
                "must be C-contiguous and aligned (numpy.ascontiguousarray gives such a copy)",
            ))
        }
    };
    let mut out = vec![0.0f32; rows];
    py.detach(|| {
        av_core::features::draft_log_odds_rows(
            logits_slice,
            rows,
            vocab,
            &temps,
            max_log_odds as f32,
            valid.as_deref(),
            &mut out,
        )
    })
    .map_err(to_py_err)?;
    Ok(out.into_pyarray(py))
}
