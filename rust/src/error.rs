//! Error mapping: the core's [`ErrorKind`] to a Python exception, in one place, under one root.
//!
//! Every exception class av_core defines derives from `av_core.Error`, and each is still the
//! builtin it always was, so that `except ValueError` and `except av_core.Error` both catch it:
//!
//! | kind | Python | bases |
//! |---|---|---|
//! | `Value` | `av_core.InvalidValueError` | `Error`, `ValueError` |
//! | `Type` | `av_core.InvalidTypeError` | `Error`, `TypeError` |
//! | `State` | `av_core.StateError` | `InvalidValueError` |
//! | `MissingDepthTable`, `DepthTableMismatch` | `av_core.DepthTableError` | `InvalidValueError` |
//! | `BufferChanged` | `av_core.BufferChangedError` | `InvalidValueError` |
//! | `OutOfMemory` | `av_core.OutOfMemoryError` | `InvalidValueError` |
//!
//! `Error` itself derives from `Exception` only. The classes with two bases are made when the
//! module is initialised, by calling `type(name, bases, namespace)` (an exception class can
//! have several bases in Python; `create_exception!` takes one), and kept for the life of the
//! process. The message is the core's `argument: message`; nothing here reads it.

use av_core::{Error as CoreError, ErrorKind};
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

pyo3::create_exception!(
    av_core._native,
    Error,
    PyException,
    "The root of every exception av_core defines: a bad argument (InvalidValueError, a \
     ValueError; InvalidTypeError, a TypeError), saved state it cannot read (StateError), \
     missing depth tables (DepthTableError), a buffer changed during a call \
     (BufferChangedError), no memory for a copy (OutOfMemoryError), a bad environment value \
     (SettingError) and an engine av_core cannot patch. `except av_core.Error` catches them all."
);

/// One exception class with two or more bases, made once.
struct Class {
    name: &'static str,
    doc: &'static str,
    cell: PyOnceLock<Py<PyType>>,
}

impl Class {
    const fn new(name: &'static str, doc: &'static str) -> Self {
        Self {
            name,
            doc,
            cell: PyOnceLock::new(),
        }
    }

    /// The class, made on first use as `type(name, bases, {"__doc__": doc, "__module__":
    /// "av_core._native"})`.
    fn get<'py>(
        &self,
        py: Python<'py>,
        bases: impl FnOnce(Python<'py>) -> PyResult<Bound<'py, PyTuple>>,
    ) -> PyResult<Bound<'py, PyType>> {
        let class = self.cell.get_or_try_init(py, || -> PyResult<Py<PyType>> {
            let namespace = PyDict::new(py);
            namespace.set_item("__doc__", self.doc)?;
            namespace.set_item("__module__", "av_core._native")?;
            let made = py
                .get_type::<PyType>()
                .call1((self.name, bases(py)?, namespace))?;
            Ok(made.cast_into::<PyType>()?.unbind())
        })?;
        Ok(class.bind(py).clone())
    }
}

static INVALID_VALUE: Class = Class::new(
    "InvalidValueError",
    "An argument of the right type with a wrong value (out of range, non-finite, a wrong shape, \
     inconsistent lengths), named in the message. An av_core.Error and a ValueError.",
);
static INVALID_TYPE: Class = Class::new(
    "InvalidTypeError",
    "An argument of a type the call does not take (an array dtype, a str for a number), named \
     in the message. An av_core.Error and a TypeError.",
);
static STATE: Class = Class::new(
    "StateError",
    "Saved state (bytes, a file or JSON text) that is corrupt, truncated, of another kind, of a \
     format version this build does not read, or that decodes to a state no planner or \
     estimator could hold. An InvalidValueError (so an av_core.Error and a ValueError).",
);
static DEPTH_TABLE: Class = Class::new(
    "DepthTableError",
    "The call prices drafting by depth and the cost tables have no draft-depth table, or one \
     that does not cover the positions planned. An InvalidValueError (so an av_core.Error and \
     a ValueError).",
);
static BUFFER_CHANGED: Class = Class::new(
    "BufferChangedError",
    "An input held a bad value that was gone when read again: another thread wrote the buffer \
     during the call, which did nothing. An InvalidValueError (so an av_core.Error and a \
     ValueError).",
);
static OUT_OF_MEMORY: Class = Class::new(
    "OutOfMemoryError",
    "There was no memory for a copy the call needs (an array far larger than memory, such as a \
     huge numpy.broadcast_to view). An InvalidValueError (so an av_core.Error and a \
     ValueError), naming the argument.",
);

fn invalid_value(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    INVALID_VALUE.get(py, |py| {
        PyTuple::new(py, [py.get_type::<Error>(), py.get_type::<PyValueError>()])
    })
}

fn invalid_type(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    INVALID_TYPE.get(py, |py| {
        PyTuple::new(py, [py.get_type::<Error>(), py.get_type::<PyTypeError>()])
    })
}

/// A subclass of `InvalidValueError`.
fn value_subclass<'py>(py: Python<'py>, class: &Class) -> PyResult<Bound<'py, PyType>> {
    class.get(py, |py| PyTuple::new(py, [invalid_value(py)?]))
}

/// The class raised for `kind` (the module docs' table).
fn class_of(py: Python<'_>, kind: ErrorKind) -> PyResult<Bound<'_, PyType>> {
    match kind {
        ErrorKind::Value => invalid_value(py),
        ErrorKind::Type => invalid_type(py),
        ErrorKind::State => value_subclass(py, &STATE),
        ErrorKind::MissingDepthTable | ErrorKind::DepthTableMismatch => {
            value_subclass(py, &DEPTH_TABLE)
        }
        ErrorKind::BufferChanged => value_subclass(py, &BUFFER_CHANGED),
        ErrorKind::OutOfMemory => value_subclass(py, &OUT_OF_MEMORY),
    }
}

/// Adds the exception classes to the native module (making them, the first time).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("InvalidValueError", invalid_value(py)?)?;
    m.add("InvalidTypeError", invalid_type(py)?)?;
    for (name, kind) in [
        ("StateError", ErrorKind::State),
        ("DepthTableError", ErrorKind::MissingDepthTable),
        ("BufferChangedError", ErrorKind::BufferChanged),
        ("OutOfMemoryError", ErrorKind::OutOfMemory),
    ] {
        m.add(name, class_of(py, kind)?)?;
    }
    Ok(())
}

/// The exception of `kind` with `message` (the module docs' table). Should making the class
/// itself fail (it cannot once the module is initialised), that failure is raised instead.
pub fn py_err(kind: ErrorKind, message: String) -> PyErr {
    Python::attach(|py| match class_of(py, kind) {
        Ok(class) => PyErr::from_type(class, message),
        Err(error) => error,
    })
}

/// A core error as its exception, with the core's message (which names the argument).
pub fn to_py_err(error: CoreError) -> PyErr {
    py_err(error.kind, error.to_string())
}

/// A core error met while loading `path`: its exception, naming the path.
pub fn loading(error: CoreError, path: &std::path::Path) -> PyErr {
    py_err(error.kind, format!("path: {}: {error}", path.display()))
}

/// `InvalidValueError("{argument}: {message}")`.
pub fn value_error(argument: &str, message: impl std::fmt::Display) -> PyErr {
    py_err(ErrorKind::Value, format!("{argument}: {message}"))
}

/// `InvalidTypeError("{argument}: {message}")`.
pub fn type_error(argument: &str, message: impl std::fmt::Display) -> PyErr {
    py_err(ErrorKind::Type, format!("{argument}: {message}"))
}

/// `OutOfMemoryError("{argument}: {message}")`: no memory for a copy of `argument`.
pub fn out_of_memory(argument: &str, message: impl std::fmt::Display) -> PyErr {
    py_err(ErrorKind::OutOfMemory, format!("{argument}: {message}"))
}
