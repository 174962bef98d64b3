//! Persistence of every stateful type, derived from the core's [`Persistent`]: `to_bytes` and
//! `from_bytes`, `save` and `load` (the files: [`crate::files`]), and pickling (`__reduce__`
//! through `from_bytes`). Each class's methods are one-line calls of these.

use std::path::Path;

use av_core::persist::Persistent;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::error::{loading, to_py_err};
use crate::files::{atomic_write, read_file};

/// `value`'s state as Python bytes.
pub fn to_bytes<'py, T: Persistent>(py: Python<'py>, value: &T) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &value.encode())
}

/// A value from bytes written by [`to_bytes`] (of this release or an earlier one).
pub fn from_bytes<T: Persistent>(data: &[u8]) -> PyResult<T> {
    T::decode(data).map_err(to_py_err)
}

/// Writes `value`'s state to `path` atomically (temporary file, fsync, rename), without the
/// GIL: a crash leaves the old file intact.
pub fn save<T: Persistent>(py: Python<'_>, value: &T, path: &Path) -> PyResult<()> {
    save_encoded(py, &value.encode(), path)
}

/// [`save`] of a state already encoded (by a value behind a lock, released before the write).
pub fn save_encoded(py: Python<'_>, bytes: &[u8], path: &Path) -> PyResult<()> {
    py.detach(|| atomic_write(path, bytes))
}

/// A value from a file written by [`save`]; a corrupt, truncated or future-version file raises
/// the error of its kind (a `StateError`) naming the path.
pub fn load<T: Persistent>(py: Python<'_>, path: &Path) -> PyResult<T> {
    let bytes = py.detach(|| read_file(path, T::MAX_ENCODED_LEN as u64))?;
    T::decode(&bytes).map_err(|e| loading(e, path))
}

/// What `__reduce__` returns for an object whose state is `bytes`: its class's `from_bytes`
/// and the bytes.
pub fn reduce<'py>(
    object: &Bound<'py, PyAny>,
    bytes: Vec<u8>,
) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
    let constructor = object.get_type().getattr("from_bytes")?;
    Ok((constructor, (PyBytes::new(object.py(), &bytes),)))
}
