//! Python values to and from the core's neutral value tree ([`av_core::persist::tree`]), one
//! function each way: `None`, `bool`, `int`, `float`, `str`, `list`, `dict`. The formats
//! (`state_dict`, round statistics, refit reports) are the core's; nothing here knows a key.

use av_core::persist::tree::{Map, Value};
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::convert::{short_repr, type_name};

/// Deeper than any format nests (a `state_dict` is three levels): a self-containing list stops
/// here instead of recursing forever.
const MAX_DEPTH: usize = 16;

/// `obj` as a tree. Numbers and sequences of other types convert as the bindings' scalar and
/// list arguments do (a numpy integer is an int, a numpy array a list); a dict's entries with
/// keys other than strings are left out (no format reads them); anything else is a
/// [`Value::Other`], which a reader refuses naming its type.
pub fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    from_py_at(obj, 0)
}

fn other(obj: &Bound<'_, PyAny>) -> Value {
    Value::Other {
        type_name: type_name(obj),
        text: short_repr(obj),
    }
}

fn from_py_at(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::None);
    }
    if let Ok(flag) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(flag.is_true()));
    }
    if let Ok(float) = obj.cast::<PyFloat>() {
        return Ok(Value::Float(float.value()));
    }
    if obj.cast::<PyInt>().is_ok() {
        return integer(obj).map(|v| v.unwrap_or_else(|| other(obj)));
    }
    if let Ok(text) = obj.cast::<PyString>() {
        return Ok(text
            .to_str()
            .map_or_else(|_| other(obj), |s| Value::Str(s.into())));
    }
    if depth >= MAX_DEPTH {
        return Ok(other(obj));
    }
    if let Ok(dict) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (key, value) in dict.iter() {
            if let Ok(key) = key.cast::<PyString>() {
                map.insert(key.to_str()?, from_py_at(&value, depth + 1)?);
            }
        }
        return Ok(Value::Map(map));
    }
    if let Ok(list) = obj.cast::<PyList>() {
        return list
            .iter()
            .map(|item| from_py_at(&item, depth + 1))
            .collect::<PyResult<_>>()
            .map(Value::List);
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return tuple
            .iter()
            .map(|item| from_py_at(&item, depth + 1))
            .collect::<PyResult<_>>()
            .map(Value::List);
    }
    // Another type: an integer (`__index__`: numpy integers), a sequence (numpy arrays), a
    // number (`__float__`: numpy float32), in that order; or none of them.
    if let Some(value) = integer(obj)? {
        return Ok(value);
    }
    if let Some(items) = sequence(obj, depth)? {
        return Ok(Value::List(items));
    }
    match obj.extract::<f64>() {
        Ok(v) => Ok(Value::Float(v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(other(obj)),
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => Ok(other(obj)),
        Err(e) => Err(e),
    }
}

/// `obj` as an integer if it is one (`None` if it has no `__index__`).
fn integer(obj: &Bound<'_, PyAny>) -> PyResult<Option<Value>> {
    // The common case first: i64's conversion is far cheaper than i128's.
    if let Ok(v) = obj.extract::<i64>() {
        return Ok(Some(Value::Int(v.into())));
    }
    match obj.extract::<i128>() {
        Ok(v) => Ok(Some(Value::Int(v))),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(Some(Value::BigInt {
            text: short_repr(obj),
            float: obj.extract::<f64>().ok().filter(|v| v.is_finite()),
        })),
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The items of `obj` if it converts to a list as a list argument does (PyO3's sequence
/// extraction: numpy arrays and other sequences, not a str).
fn sequence(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Option<Vec<Value>>> {
    let Ok(items) = obj.extract::<Vec<Bound<'_, PyAny>>>() else {
        return Ok(None);
    };
    items
        .iter()
        .map(|item| from_py_at(item, depth + 1))
        .collect::<PyResult<_>>()
        .map(Some)
}

/// `value` as a Python object (a map is a `dict` with the tree's key order).
pub fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::None => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        // Most ints of a state fit i64, whose conversion is far cheaper than i128's.
        Value::Int(v) => match i64::try_from(*v) {
            Ok(small) => small.into_pyobject(py)?.into_any(),
            Err(_) => v.into_pyobject(py)?.into_any(),
        },
        Value::BigInt { text, .. } => py.get_type::<PyInt>().call1((text.as_str(),))?.into_any(),
        Value::Float(v) => PyFloat::new(py, *v).into_any(),
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::List(items) => {
            let items = items
                .iter()
                .map(|item| to_py(py, item))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Map(map) => map_to_py(py, map)?.into_any(),
        Value::Other { type_name, text } => {
            return Err(PyTypeError::new_err(format!(
                "a {type_name} ({text}) has no Python value in a tree"
            )))
        }
    })
}

/// `map` as a Python `dict`, keys in order.
pub fn map_to_py<'py>(py: Python<'py>, map: &Map) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (key, value) in map.iter() {
        d.set_item(key, to_py(py, value)?)?;
    }
    Ok(d)
}
