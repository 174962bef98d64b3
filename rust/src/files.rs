//! Files for `save`/`load`: the bytes come from the core; this module only moves them to and
//! from disk.
//!
//! Saving is atomic for any number of concurrent savers, threads or processes: each call
//! writes its own temporary sibling (a name no other call can pick: process id, thread,
//! a per-process counter and a random part, created with `O_EXCL`), flushes it to disk, renames
//! it over the target and flushes the directory. A rename replaces the target in one step, so
//! a reader, or a crash at any moment, sees either the old file or one complete new file; a
//! killed saver leaves at most its own temporary file behind.
//!
//! Loading opens without blocking (a FIFO or a device is refused instead of hanging the call),
//! accepts only a regular file, and reads at most the largest state the core can decode.

use std::collections::hash_map::RandomState;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::{PyErr, PyResult};

/// Writes `data` (bytes or any bytes-like object) to `path` atomically: a temporary file in the
/// same directory, flushed to disk, then renamed over `path`, so a reader or a crash sees the
/// old file or the whole new one. The writer of every `save`.
#[pyfunction]
fn write_atomically(py: Python<'_>, path: PathBuf, data: &Bound<'_, PyAny>) -> PyResult<()> {
    let bytes = crate::convert::byte_string(data, "data")?;
    py.detach(|| atomic_write(&path, &bytes))
}

/// Registers [`write_atomically`].
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(write_atomically, m)?)
}

/// Writes `bytes` to `path` atomically (module docs).
pub fn atomic_write(path: &Path, bytes: &[u8]) -> PyResult<()> {
    write_through_temporary(path, bytes)
        .map_err(|e| io_error(e, format!("path: cannot write {}", path.display())))
}

/// An I/O error as the matching Python exception (FileNotFoundError, PermissionError, ... or
/// OSError; a path the platform cannot even represent, such as one holding a NUL byte, is a
/// ValueError), with `context` (which names the path) before the system's message.
fn io_error(error: std::io::Error, context: String) -> PyErr {
    use pyo3::exceptions::{PyFileExistsError, PyFileNotFoundError, PyPermissionError};
    use std::io::ErrorKind;
    let message = format!("{context}: {error}");
    match error.kind() {
        ErrorKind::NotFound => PyFileNotFoundError::new_err(message),
        ErrorKind::PermissionDenied => PyPermissionError::new_err(message),
        ErrorKind::AlreadyExists => PyFileExistsError::new_err(message),
        ErrorKind::InvalidInput => crate::error::py_err(av_core::ErrorKind::Value, message),
        _ => PyOSError::new_err(message),
    }
}

/// Reads the regular file at `path`, refusing anything longer than `limit` bytes.
pub fn read_file(path: &Path, limit: u64) -> PyResult<Vec<u8>> {
    let not_regular = |what: &str| {
        crate::error::py_err(
            av_core::ErrorKind::Value,
            format!("path: {} is {what}, not a regular file", path.display()),
        )
    };
    let os_error = |e: std::io::Error| io_error(e, format!("path: cannot read {}", path.display()));
    let mut file = open_for_reading(path).map_err(os_error)?;
    let metadata = file.metadata().map_err(os_error)?;
    if metadata.is_dir() {
        return Err(not_regular("a directory"));
    }
    if !metadata.is_file() {
        return Err(not_regular("a special file (FIFO, socket or device)"));
    }
    let too_long = |length: u64| {
        crate::error::py_err(
            av_core::ErrorKind::Value,
            format!(
                "path: {} has {length} bytes, more than any saved state ({limit})",
                path.display()
            ),
        )
    };
    if metadata.len() > limit {
        return Err(too_long(metadata.len()));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    // The file may grow after the check: never read more than one byte past the limit.
    (&mut file)
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(os_error)?;
    if bytes.len() as u64 > limit {
        return Err(too_long(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Opens `path` read-only without waiting for a writer (a FIFO would block `open` forever).
fn open_for_reading(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK: affects only FIFOs and devices, which are refused right after.
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// Per-process counter of temporary names.
static SAVES: AtomicU64 = AtomicU64::new(0);

/// A temporary name no other save can pick: `.<name>.tmp-<pid>-<thread>-<counter>-<random>`.
fn temporary_name(name: &std::ffi::OsStr) -> std::ffi::OsString {
    let count = SAVES.fetch_add(1, Ordering::Relaxed);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(count);
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    let mut temporary = std::ffi::OsString::from(".");
    temporary.push(name);
    temporary.push(format!(
        ".tmp-{}-{thread}-{count}-{:016x}",
        std::process::id(),
        hasher.finish()
    ));
    temporary
}

fn write_through_temporary(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path names no file"))?;
    // O_EXCL: if a name ever collided, this save would fail rather than share a file.
    let (temporary, mut file) = create_temporary(directory, name)?;
    let result = (|| {
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, path)?;
        // Make the rename itself durable where the platform allows syncing a directory.
        if let Ok(dir) = File::open(directory) {
            let _ = dir.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

/// Creates a fresh temporary sibling, retrying a few names if one exists already.
fn create_temporary(directory: &Path, name: &std::ffi::OsStr) -> std::io::Result<(PathBuf, File)> {
    let mut attempts = 0;
    loop {
        let temporary = directory.join(temporary_name(name));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temporary)
        {
            Ok(file) => return Ok((temporary, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempts < 8 => {
                attempts += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
