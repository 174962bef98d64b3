//! Python values to and from the core's neutral value tree ([`av_core::persist::tree`]), one
//! function each way: `None`, `bool`, `int`, `float`, `str`, `list`, `dict`. The formats
//! (`state_dict`, round statistics, refit reports) are the core's; nothing here knows a key.

use av_core::persist::tree::Value;
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMapping, PyString, PyTuple,
};

use crate::convert::{short_repr, type_error, type_name, value_error};

/// Deeper than any format nests (a `state_dict` is three levels): a self-containing list stops
/// here instead of recursing forever.
const MAX_DEPTH: usize = 16;

/// `obj` as a tree. Numbers and sequences of other types convert as the bindings' scalar and
/// list arguments do (a numpy integer is an int, a numpy bool a bool, a numpy array a list; a
/// `bytes` is not a list); any `Mapping` reads as a dict. A dict key that is not a `str` is a
/// `TypeError` and one that is not valid UTF-8 a `ValueError`, both naming `argument` and the
/// key's path, since no format could read it (dropping it would silently lose what the caller
/// meant). Anything else is a [`Value::Other`], which a reader refuses naming its type.
pub fn from_py(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Value> {
    from_py_at(obj, argument, &mut String::new(), 0)
}

fn other(obj: &Bound<'_, PyAny>) -> Value {
    Value::Other {
        type_name: type_name(obj),
        text: short_repr(obj),
    }
}

/// `argument` and the path so far, as the core's messages write them (`state: ["config"]`).
fn at(argument: &str, path: &str) -> String {
    if path.is_empty() {
        argument.to_owned()
    } else {
        format!("{argument}: {path}")
    }
}

fn from_py_at(
    obj: &Bound<'_, PyAny>,
    argument: &str,
    path: &mut String,
    depth: usize,
) -> PyResult<Value> {
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
        return entries(dict.iter(), argument, path, depth);
    }
    if let Ok(list) = obj.cast::<PyList>() {
        return items(list.iter(), argument, path, depth).map(Value::List);
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return items(tuple.iter(), argument, path, depth).map(Value::List);
    }
    // A numpy bool is a bool (PyO3's `bool` takes `bool` and numpy's bools only), not the
    // number its `__float__` gives.
    if let Ok(flag) = obj.extract::<bool>() {
        return Ok(Value::Bool(flag));
    }
    if obj.is_instance_of::<PyBytes>() || obj.is_instance_of::<PyByteArray>() {
        return Ok(other(obj));
    }
    // Any other Mapping (a mappingproxy, a collections.abc.Mapping) reads as the dict of its
    // items.
    if let Ok(mapping) = obj.cast::<PyMapping>() {
        let pairs = mapping.items()?;
        let pairs = pairs
            .iter()
            .map(|pair| pair.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>())
            .collect::<PyResult<Vec<_>>>()?;
        return entries(pairs.into_iter(), argument, path, depth);
    }
    // Another type: an integer (`__index__`: numpy integers), a sequence (numpy arrays), a
    // number (`__float__`: numpy float32), in that order; or none of them.
    if let Some(value) = integer(obj)? {
        return Ok(value);
    }
    if let Some(items) = sequence(obj, argument, path, depth)? {
        return Ok(Value::List(items));
    }
    match obj.extract::<f64>() {
        Ok(v) => Ok(Value::Float(v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(other(obj)),
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => Ok(other(obj)),
        Err(e) => Err(e),
    }
}

/// A dict's entries as a map; every key must be a `str` of valid UTF-8 (module docs).
fn entries<'py>(
    pairs: impl Iterator<Item = (Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    argument: &str,
    path: &mut String,
    depth: usize,
) -> PyResult<Value> {
    let mut dict: Vec<(String, Value)> = Vec::new();
    for (key, value) in pairs {
        let Ok(text) = key.cast::<PyString>() else {
            return Err(type_error(
                &at(argument, path),
                format!(
                    "key {} ({}) is not a str (no field has that name)",
                    short_repr(&key),
                    type_name(&key)
                ),
            ));
        };
        let Ok(name) = text.to_str() else {
            return Err(value_error(
                &at(argument, path),
                format!("key {} is not valid UTF-8", short_repr(&key)),
            ));
        };
        let len = path.len();
        path.push_str(&format!("[{name:?}]"));
        let value = from_py_at(&value, argument, path, depth + 1);
        path.truncate(len);
        // A key appears once in a tree, as in the mapping it comes from.
        let value = value?;
        match dict.iter_mut().find(|(k, _)| k == name) {
            Some(entry) => entry.1 = value,
            None => dict.push((name.to_owned(), value)),
        }
    }
    Ok(Value::Dict(dict))
}

/// A sequence's items as a list.
fn items<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    argument: &str,
    path: &mut String,
    depth: usize,
) -> PyResult<Vec<Value>> {
    items
        .enumerate()
        .map(|(i, item)| {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            let value = from_py_at(&item, argument, path, depth + 1);
            path.truncate(len);
            value
        })
        .collect()
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
fn sequence(
    obj: &Bound<'_, PyAny>,
    argument: &str,
    path: &mut String,
    depth: usize,
) -> PyResult<Option<Vec<Value>>> {
    let Ok(list) = obj.extract::<Vec<Bound<'_, PyAny>>>() else {
        return Ok(None);
    };
    items(list.into_iter(), argument, path, depth).map(Some)
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
        Value::Dict(entries) => dict_to_py(py, entries)?.into_any(),
        Value::Other { type_name, text } => {
            return Err(crate::error::py_err(
                av_core::ErrorKind::Type,
                format!("a {type_name} ({text}) has no Python value in a tree"),
            ))
        }
    })
}

/// A tree's dict entries as a Python `dict`, keys in order.
pub fn dict_to_py<'py>(
    py: Python<'py>,
    entries: &[(String, Value)],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (key, value) in entries {
        d.set_item(key, to_py(py, value)?)?;
    }
    Ok(d)
}

/// A tree that is a dict as a Python `dict` (another tree is a `TypeError`).
pub fn tree_to_dict<'py>(py: Python<'py>, tree: &Value) -> PyResult<Bound<'py, PyDict>> {
    match tree {
        Value::Dict(entries) => dict_to_py(py, entries),
        other => Err(PyTypeError::new_err(format!(
            "expected a dict, got {}",
            other.type_name()
        ))),
    }
}
