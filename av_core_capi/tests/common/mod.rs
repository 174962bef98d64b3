//! Helpers shared by the C ABI's Rust test files.

use std::ffi::CStr;

use av_core_capi::status::{avc_last_error, AvcStatus};

/// This thread's last error message, copied.
pub fn last_error() -> String {
    // SAFETY: avc_last_error returns a NUL-terminated string valid until the next failing call
    // on this thread; it is copied at once.
    unsafe { CStr::from_ptr(avc_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts a rejected call's status and that its message starts with `prefix`.
#[track_caller]
#[allow(dead_code)] // each test file compiles this module on its own; not all of them use it
pub fn rejected(status: AvcStatus, expected: AvcStatus, prefix: &str) {
    let message = last_error();
    assert_eq!(status, expected, "{message}");
    assert!(
        message.starts_with(prefix),
        "message {message:?} does not start with {prefix:?}"
    );
}
