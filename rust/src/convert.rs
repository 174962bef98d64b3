//! Argument conversion and error mapping: Python objects in, core views out.
//!
//! Arrays are read in place when they are C-contiguous numpy arrays of a supported dtype; other
//! array-likes (CPU torch tensors, lists, strided views) go through `numpy.asarray` and a
//! contiguous copy only when one is unavoidable. Every failure names the argument.

use av_core::{Error, ErrorKind, MatrixView};
use numpy::{
    Element, PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1,
    PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// Maps a core error to `ValueError`/`TypeError` with the core's message (which names the
/// argument).
pub fn to_py_err(error: Error) -> PyErr {
    match error.kind {
        ErrorKind::Value => PyValueError::new_err(error.to_string()),
        ErrorKind::Type => PyTypeError::new_err(error.to_string()),
    }
}

/// `ValueError("{argument}: {message}")`.
pub fn value_error(argument: &str, message: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{argument}: {message}"))
}

/// `TypeError("{argument}: {message}")`.
pub fn type_error(argument: &str, message: impl std::fmt::Display) -> PyErr {
    PyTypeError::new_err(format!("{argument}: {message}"))
}

fn numpy_asarray<'py>(py: Python<'py>) -> PyResult<&'py Bound<'py, PyAny>> {
    static ASARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    ASARRAY
        .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py.import("numpy")?.getattr("asarray")?.unbind())
        })
        .map(|f| f.bind(py))
}

/// The object as a numpy array: itself if it is one, else `numpy.asarray(obj)` (zero-copy for
/// CPU torch tensors and anything else exposing the array interface).
pub fn as_ndarray<'py>(
    obj: &Bound<'py, PyAny>,
    argument: &str,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return Ok(array.clone());
    }
    let converted = match numpy_asarray(obj.py())?.call1((obj,)) {
        Ok(array) => array,
        // A tensor on an accelerator: stage it through av_core.features.to_host (a pinned
        // buffer, one non-blocking copy and one event wait) instead of failing.
        Err(_) if is_device_tensor(obj) => obj
            .py()
            .import("av_core.features")?
            .getattr("to_host")?
            .call1((obj,))
            .map_err(|e| type_error(argument, format!("cannot stage the tensor to host: {e}")))?,
        Err(e) => {
            return Err(type_error(
                argument,
                format!(
                    "expected a numpy array or a tensor, got {} ({e})",
                    type_name(obj)
                ),
            ))
        }
    };
    Ok(converted.cast_into::<PyUntypedArray>()?)
}

/// Whether `obj` looks like a torch tensor on a device other than the CPU.
fn is_device_tensor(obj: &Bound<'_, PyAny>) -> bool {
    obj.getattr("is_cuda")
        .and_then(|flag| flag.is_truthy())
        .unwrap_or(false)
}

/// The type name of `obj`, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

fn dtype_name(array: &Bound<'_, PyUntypedArray>) -> String {
    array.dtype().to_string()
}

/// Array data borrowed from numpy when contiguous, copied into row-major order otherwise.
pub struct Data<'py, T: Element, D: numpy::ndarray::Dimension> {
    borrowed: Option<numpy::PyReadonlyArray<'py, T, D>>,
    owned: Vec<T>,
}

impl<'py, T: Element + Copy, D: numpy::ndarray::Dimension> Data<'py, T, D> {
    fn from_array(array: &Bound<'py, numpy::PyArray<T, D>>) -> PyResult<Self> {
        let readonly = array.try_readonly()?;
        if readonly.as_slice().is_ok() {
            Ok(Data {
                borrowed: Some(readonly),
                owned: Vec::new(),
            })
        } else {
            let owned = readonly.as_array().iter().copied().collect();
            Ok(Data {
                borrowed: None,
                owned,
            })
        }
    }

    /// The elements in row-major order.
    pub fn slice(&self) -> &[T] {
        match &self.borrowed {
            Some(array) => array.as_slice().expect("checked contiguous"),
            None => &self.owned,
        }
    }
}

/// A `[rows, cols]` float matrix in one of the supported dtypes.
pub enum FloatMatrix<'py> {
    /// float32 data.
    F32(Data<'py, f32, numpy::Ix2>, usize, usize),
    /// float64 data.
    F64(Data<'py, f64, numpy::Ix2>, usize, usize),
}

impl FloatMatrix<'_> {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        match self {
            FloatMatrix::F32(_, r, _) | FloatMatrix::F64(_, r, _) => *r,
        }
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        match self {
            FloatMatrix::F32(_, _, c) | FloatMatrix::F64(_, _, c) => *c,
        }
    }
}

/// A view of one of the dtypes; `Copy`, so it moves into a GIL-free closure.
#[derive(Clone, Copy)]
pub enum FloatView<'a> {
    /// float32 data.
    F32(MatrixView<'a, f32>),
    /// float64 data.
    F64(MatrixView<'a, f64>),
}

impl<'py> FloatMatrix<'py> {
    /// A core view of the data (`argument` names it in errors).
    pub fn view(&self, argument: &'static str) -> PyResult<FloatView<'_>> {
        Ok(match self {
            FloatMatrix::F32(d, r, c) => {
                FloatView::F32(MatrixView::new(argument, d.slice(), *r, *c).map_err(to_py_err)?)
            }
            FloatMatrix::F64(d, r, c) => {
                FloatView::F64(MatrixView::new(argument, d.slice(), *r, *c).map_err(to_py_err)?)
            }
        })
    }
}

/// Extracts a 2-D float32/float64 matrix.
pub fn float_matrix<'py>(obj: &Bound<'py, PyAny>, argument: &str) -> PyResult<FloatMatrix<'py>> {
    let array = as_ndarray(obj, argument)?;
    if array.ndim() != 2 {
        return Err(value_error(
            argument,
            format!("expected a 2-D array [R, K], got shape {:?}", array.shape()),
        ));
    }
    let (rows, cols) = (array.shape()[0], array.shape()[1]);
    if let Ok(a) = array.cast::<PyArray2<f32>>() {
        return Ok(FloatMatrix::F32(Data::from_array(a)?, rows, cols));
    }
    if let Ok(a) = array.cast::<PyArray2<f64>>() {
        return Ok(FloatMatrix::F64(Data::from_array(a)?, rows, cols));
    }
    Err(type_error(
        argument,
        format!(
            "unsupported dtype {}; expected float32 or float64",
            dtype_name(&array)
        ),
    ))
}

/// Extracts a 1-D float64 vector (any float or integer dtype is converted).
pub fn float_vector(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Vec<f64>> {
    let array = as_ndarray(obj, argument)?;
    if array.ndim() != 1 {
        return Err(value_error(
            argument,
            format!("expected a 1-D array, got shape {:?}", array.shape()),
        ));
    }
    if let Ok(a) = array.cast::<PyArray1<f64>>() {
        return Ok(a.try_readonly()?.as_array().to_vec());
    }
    if let Ok(a) = array.cast::<PyArray1<f32>>() {
        return Ok(a
            .try_readonly()?
            .as_array()
            .iter()
            .map(|&v| f64::from(v))
            .collect());
    }
    if is_integer(&array) {
        let converted = array.call_method1("astype", ("float64",))?;
        let a = converted.cast::<PyArray1<f64>>()?;
        return Ok(a.try_readonly()?.as_array().to_vec());
    }
    Err(type_error(
        argument,
        format!(
            "unsupported dtype {}; expected a float array",
            dtype_name(&array)
        ),
    ))
}

fn is_integer(array: &Bound<'_, PyUntypedArray>) -> bool {
    matches!(array.dtype().kind(), b'i' | b'u')
}

/// Extracts a 1-D integer vector as `i64` (int32 and int64 are read directly; other integer
/// dtypes are converted; floats and bools are refused).
pub fn int_vector(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Vec<i64>> {
    let array = as_ndarray(obj, argument)?;
    if array.ndim() != 1 {
        return Err(value_error(
            argument,
            format!("expected a 1-D array [R], got shape {:?}", array.shape()),
        ));
    }
    if let Ok(a) = array.cast::<PyArray1<i64>>() {
        let a: PyReadonlyArray1<i64> = a.try_readonly()?;
        return Ok(match a.as_slice() {
            Ok(s) => s.to_vec(),
            Err(_) => a.as_array().to_vec(),
        });
    }
    if let Ok(a) = array.cast::<PyArray1<i32>>() {
        let a: PyReadonlyArray1<i32> = a.try_readonly()?;
        // A contiguous slice widens in a vectorized loop; ndarray's strided iterator does not.
        return Ok(match a.as_slice() {
            Ok(s) => s.iter().map(|&v| i64::from(v)).collect(),
            Err(_) => a.as_array().iter().map(|&v| i64::from(v)).collect(),
        });
    }
    if is_integer(&array) {
        // Unsigned 64-bit values above i64::MAX would wrap; they are far beyond any K anyway,
        // so clamp them to a value validation rejects.
        if array.dtype().kind() == b'u' && array.dtype().itemsize() == 8 {
            let a = array.call_method1("astype", ("float64",))?;
            let a = a.cast::<PyArray1<f64>>()?;
            return Ok(a
                .try_readonly()?
                .as_array()
                .iter()
                .map(|&v| v.min(i64::MAX as f64) as i64)
                .collect());
        }
        let converted = array.call_method1("astype", ("int64",))?;
        let a = converted.cast::<PyArray1<i64>>()?;
        return Ok(a.try_readonly()?.as_array().to_vec());
    }
    Err(type_error(
        argument,
        format!(
            "unsupported dtype {}; expected an integer array",
            dtype_name(&array)
        ),
    ))
}
