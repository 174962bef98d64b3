//! Error mapping: the core's [`ErrorKind`] to a Python exception, in one place.
//!
//! | kind | Python |
//! |---|---|
//! | `Value` | `ValueError` |
//! | `Type` | `TypeError` |
//! | `State` | `av_core.StateError` (a `ValueError`) |
//! | `MissingDepthTable`, `DepthTableMismatch` | `av_core.DepthTableError` (a `ValueError`) |
//! | `BufferChanged` | `av_core.BufferChangedError` (a `ValueError`) |
//! | `OutOfMemory` | `av_core.OutOfMemoryError` (a `ValueError`) |
//!
//! The message is the core's `argument: message`; nothing here reads it.

use av_core::{Error, ErrorKind};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    av_core._native,
    StateError,
    PyValueError,
    "Saved state (bytes, a file or JSON text) that is corrupt, truncated, of another kind, of a \
     format version this build does not read, or that decodes to a state no planner or \
     estimator could hold. A ValueError."
);
pyo3::create_exception!(
    av_core._native,
    DepthTableError,
    PyValueError,
    "The call prices drafting by depth and the cost tables have no draft-depth table, or one \
     that does not cover the positions planned. A ValueError."
);
pyo3::create_exception!(
    av_core._native,
    BufferChangedError,
    PyValueError,
    "An input held a bad value that was gone when read again: another thread wrote the buffer \
     during the call, which did nothing. A ValueError."
);
pyo3::create_exception!(
    av_core._native,
    OutOfMemoryError,
    PyValueError,
    "There was no memory for a copy the call needs (an array far larger than memory, such as a \
     huge numpy.broadcast_to view). A ValueError, naming the argument."
);

/// Adds the exception classes to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("StateError", py.get_type::<StateError>())?;
    m.add("DepthTableError", py.get_type::<DepthTableError>())?;
    m.add("BufferChangedError", py.get_type::<BufferChangedError>())?;
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    Ok(())
}

/// The exception of `kind` with `message` (the module docs' table).
pub fn py_err(kind: ErrorKind, message: String) -> PyErr {
    match kind {
        ErrorKind::Value => PyValueError::new_err(message),
        ErrorKind::Type => PyTypeError::new_err(message),
        ErrorKind::State => StateError::new_err(message),
        ErrorKind::MissingDepthTable | ErrorKind::DepthTableMismatch => {
            DepthTableError::new_err(message)
        }
        ErrorKind::BufferChanged => BufferChangedError::new_err(message),
        ErrorKind::OutOfMemory => OutOfMemoryError::new_err(message),
    }
}

/// A core error as its exception, with the core's message (which names the argument).
pub fn to_py_err(error: Error) -> PyErr {
    py_err(error.kind, error.to_string())
}

/// A core error met while loading `path`: its exception, naming the path.
pub fn loading(error: Error, path: &std::path::Path) -> PyErr {
    py_err(error.kind, format!("path: {}: {error}", path.display()))
}

/// `ValueError("{argument}: {message}")`.
pub fn value_error(argument: &str, message: impl std::fmt::Display) -> PyErr {
    py_err(ErrorKind::Value, format!("{argument}: {message}"))
}

/// `TypeError("{argument}: {message}")`.
pub fn type_error(argument: &str, message: impl std::fmt::Display) -> PyErr {
    py_err(ErrorKind::Type, format!("{argument}: {message}"))
}

/// `OutOfMemoryError("{argument}: {message}")`: no memory for a copy of `argument`.
pub fn out_of_memory(argument: &str, message: impl std::fmt::Display) -> PyErr {
    py_err(ErrorKind::OutOfMemory, format!("{argument}: {message}"))
}
