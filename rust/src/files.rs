//! Files for `save`/`load`: the bytes come from the core; this module only moves them to and
//! from disk, atomically.

use std::io::Write;
use std::path::Path;

use pyo3::exceptions::PyOSError;
use pyo3::PyResult;

/// Writes `bytes` to `path` through a temporary sibling file, `fsync`, and `rename`, so a crash
/// leaves either the old file or the new one, never a torn one.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> PyResult<()> {
    write_through_temporary(path, bytes)
        .map_err(|e| PyOSError::new_err(format!("path: cannot write {}: {e}", path.display())))
}

/// Reads `path` whole.
pub fn read_file(path: &Path) -> PyResult<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| PyOSError::new_err(format!("path: cannot read {}: {e}", path.display())))
}

fn write_through_temporary(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path names no file"))?;
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(name);
    temporary_name.push(format!(".tmp{}", std::process::id()));
    let temporary = directory.join(temporary_name);
    let result = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)?;
        // Make the rename itself durable where the platform allows syncing a directory.
        if let Ok(dir) = std::fs::File::open(directory) {
            let _ = dir.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}
