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
    Walk {
        argument,
        path: String::new(),
        depth: 0,
    }
    .value(obj)
}

fn other(obj: &Bound<'_, PyAny>) -> Value {
    Value::Other {
        type_name: type_name(obj),
        text: short_repr(obj),
    }
}

/// A conversion under way: the argument, the path to the value at hand (`["config"][0]`), and
/// how deep it is.
struct Walk<'a> {
    argument: &'a str,
    path: String,
    depth: usize,
}

impl Walk<'_> {
    /// The argument and the path so far, as the core's messages write them (`state: ["config"]`).
    fn at(&self) -> String {
        match self.path.is_empty() {
            true => self.argument.to_owned(),
            false => format!("{}: {}", self.argument, self.path),
        }
    }

    fn value(&mut self, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
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
        if self.depth >= MAX_DEPTH {
            return Ok(other(obj));
        }
        if let Ok(dict) = obj.cast::<PyDict>() {
            return self.entries(dict.iter());
        }
        if let Ok(list) = obj.cast::<PyList>() {
            return self.items(list.iter());
        }
        if let Ok(tuple) = obj.cast::<PyTuple>() {
            return self.items(tuple.iter());
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
            let pairs: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)> = mapping.items()?.extract()?;
            return self.entries(pairs.into_iter());
        }
        // Another type: an integer (`__index__`: numpy integers), a sequence (PyO3's sequence
        // extraction, as a list argument: numpy arrays), a number (`__float__`: numpy float32),
        // in that order; or none of them.
        if let Some(value) = integer(obj)? {
            return Ok(value);
        }
        if let Ok(items) = obj.extract::<Vec<Bound<'_, PyAny>>>() {
            return self.items(items.into_iter());
        }
        match obj.extract::<f64>() {
            Ok(v) => Ok(Value::Float(v)),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(other(obj)),
            Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => Ok(other(obj)),
            Err(e) => Err(e),
        }
    }

    /// The value of `obj`, at `step` below the path so far.
    fn below(&mut self, step: String, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
        let len = self.path.len();
        self.path.push_str(&step);
        self.depth += 1;
        let value = self.value(obj);
        self.depth -= 1;
        self.path.truncate(len);
        value
    }

    /// A dict's entries as a map; every key must be a `str` of valid UTF-8 (module docs).
    fn entries<'py>(
        &mut self,
        pairs: impl Iterator<Item = (Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    ) -> PyResult<Value> {
        let mut dict: Vec<(String, Value)> = Vec::new();
        for (key, value) in pairs {
            let Ok(text) = key.cast::<PyString>() else {
                let (key, kind) = (short_repr(&key), type_name(&key));
                let message = format!("key {key} ({kind}) is not a str (no field has that name)");
                return Err(type_error(&self.at(), message));
            };
            let Ok(name) = text.to_str() else {
                let message = format!("key {} is not valid UTF-8", short_repr(&key));
                return Err(value_error(&self.at(), message));
            };
            let value = self.below(format!("[{name:?}]"), &value)?;
            // A key appears once in a tree, as in the mapping it comes from.
            match dict.iter_mut().find(|(k, _)| k == name) {
                Some(entry) => entry.1 = value,
                None => dict.push((name.to_owned(), value)),
            }
        }
        Ok(Value::Dict(dict))
    }

    /// A sequence's items as a list.
    fn items<'py>(&mut self, items: impl Iterator<Item = Bound<'py, PyAny>>) -> PyResult<Value> {
        let items = items.enumerate();
        let items = items.map(|(i, item)| self.below(format!("[{i}]"), &item));
        items.collect::<PyResult<_>>().map(Value::List)
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
            let items = items.iter().map(|item| to_py(py, item));
            PyList::new(py, items.collect::<PyResult<Vec<_>>>()?)?.into_any()
        }
        Value::Dict(entries) => {
            let d = PyDict::new(py);
            for (key, value) in entries {
                d.set_item(key, to_py(py, value)?)?;
            }
            d.into_any()
        }
        Value::Other { type_name, text } => {
            return Err(crate::error::py_err(
                av_core::ErrorKind::Type,
                format!("a {type_name} ({text}) has no Python value in a tree"),
            ))
        }
    })
}

/// A tree that is a dict as a Python `dict` (another tree is a `TypeError`).
pub fn tree_to_dict<'py>(py: Python<'py>, tree: &Value) -> PyResult<Bound<'py, PyDict>> {
    Ok(to_py(py, tree)?.cast_into::<PyDict>()?)
}
