//! Helpers shared by the C ABI's Rust test files.

use std::ffi::CStr;

use av_core_capi::status::avc_last_error;

/// This thread's last error message, copied.
pub fn last_error() -> String {
    // SAFETY: avc_last_error returns a NUL-terminated string valid until the next failing call
    // on this thread; it is copied at once.
    unsafe { CStr::from_ptr(avc_last_error()) }
        .to_string_lossy()
        .into_owned()
}
