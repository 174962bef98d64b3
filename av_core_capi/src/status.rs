//! Status codes, the thread-local error message, and the guard every entry point runs under.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Status code returned by every fallible avc_* function. AVC_OK is 0; on any other code,
/// avc_last_error() describes the failure and the call changed no handle.
pub type AvcStatus = i32;

/// Success.
pub const AVC_OK: AvcStatus = 0;
/// An argument has the wrong value: out of range, not finite (NaN or infinite), a length or
/// shape that does not match the other arguments, a corrupt saved state.
pub const AVC_ERR_VALUE: AvcStatus = 1;
/// An argument has an unsupported type (reserved; the C entry points take fixed types).
pub const AVC_ERR_TYPE: AvcStatus = 2;
/// A required pointer is NULL, or an array pointer is NULL while its length is not 0.
pub const AVC_ERR_NULL: AvcStatus = 3;
/// The output buffer is too small; the required size was written to the length output.
pub const AVC_ERR_BUFFER_TOO_SMALL: AvcStatus = 4;
/// The handle is not a live handle of the expected kind: already freed (detected by
/// avc_*_free always, by other calls on a best-effort basis) or not made by this library.
pub const AVC_ERR_INVALID_HANDLE: AvcStatus = 5;
/// An internal error (a Rust panic) was caught at the boundary. Please report it; the handle
/// involved should be freed and not used again.
pub const AVC_ERR_PANIC: AvcStatus = 6;

/// Version of the binary interface: bumped on any incompatible change of a signature, a
/// struct layout or a status code. Compare with avc_abi_version() at startup.
pub const AVC_ABI_VERSION: u32 = 1;

/// A failed call's status and message (without the function name, added by [`guard`]).
#[derive(Debug)]
pub struct FfiError {
    /// The status code the call returns.
    pub status: AvcStatus,
    /// Names the bad argument and says what was wrong with it.
    pub message: String,
}

impl FfiError {
    /// A NULL pointer where `argument` is required.
    pub fn null(argument: &str) -> Self {
        FfiError {
            status: AVC_ERR_NULL,
            message: format!("{argument}: must not be NULL"),
        }
    }

    /// A value error on `argument`.
    pub fn value(argument: &str, message: impl std::fmt::Display) -> Self {
        FfiError {
            status: AVC_ERR_VALUE,
            message: format!("{argument}: {message}"),
        }
    }
}

/// The status code of a core error's kind (never of its message): `AVC_ERR_TYPE` for a wrong
/// type, `AVC_ERR_VALUE` for every kind of wrong value (a bad argument, corrupt saved state, a
/// missing or mismatched draft-depth table, a buffer that changed during the call, no memory
/// for a copy).
pub fn status_of(kind: av_core::ErrorKind) -> AvcStatus {
    use av_core::ErrorKind;
    match kind {
        ErrorKind::Type => AVC_ERR_TYPE,
        ErrorKind::Value
        | ErrorKind::State
        | ErrorKind::MissingDepthTable
        | ErrorKind::DepthTableMismatch
        | ErrorKind::BufferChanged
        | ErrorKind::OutOfMemory => AVC_ERR_VALUE,
    }
}

impl From<av_core::Error> for FfiError {
    fn from(error: av_core::Error) -> Self {
        FfiError {
            status: status_of(error.kind),
            message: error.to_string(),
        }
    }
}

/// What an entry point's body returns.
pub type FfiResult<T = ()> = Result<T, FfiError>;

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_last_error(function: &str, message: &str) {
    // Interior NUL bytes cannot occur in our messages, but a C string must not contain them.
    let text = format!("{function}: {message}").replace('\0', "\\0");
    let text = CString::new(text).unwrap_or_default();
    // `try_with`: during thread teardown the slot may be gone; then the message is dropped.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = Some(text));
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "non-string panic payload"
    }
}

/// Runs an entry point's body: converts its error, or a panic, to a status code and records
/// the message for [`avc_last_error`]. `function` is the C name of the entry point.
///
/// `AssertUnwindSafe` is justified because after a panic nothing the body touched is used
/// unchecked: output buffers are written only after the core call returned, handles are
/// internally synchronized (their locks ignore poisoning because the state they guard is
/// written only after a call succeeded), and the caller is told to discard the handle.
pub fn guard(function: &'static str, body: impl FnOnce() -> FfiResult) -> AvcStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => AVC_OK,
        Ok(Err(error)) => {
            set_last_error(function, &error.message);
            error.status
        }
        Err(payload) => {
            let message = format!(
                "internal error (Rust panic: {}); please report it",
                panic_message(payload.as_ref())
            );
            set_last_error(function, &message);
            AVC_ERR_PANIC
        }
    }
}

/// The message of the most recent failed avc_* call on the calling thread, or "" if none
/// has failed yet. It names the function and the bad argument, for example
/// "avc_estimator_observe: num_accepted: must be non-negative, got -1 at row 0".
///
/// Successful calls leave it unchanged (like errno): read it right after a call that did not
/// return AVC_OK. The pointer is owned by the library and stays valid until the next failing
/// call on the same thread; copy the text to keep it longer. Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn avc_last_error() -> *const c_char {
    let current = catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| slot.borrow().as_ref().map(|text| text.as_ptr()))
            .ok()
            .flatten()
    });
    match current {
        Ok(Some(pointer)) => pointer,
        _ => c"".as_ptr(),
    }
}

/// The name of a status code as a static string ("AVC_OK", "AVC_ERR_NULL", ...), or
/// "AVC_UNKNOWN_STATUS" for a value that is not one. Never NULL; never free it.
#[unsafe(no_mangle)]
pub extern "C" fn avc_status_name(status: AvcStatus) -> *const c_char {
    let name = match status {
        AVC_OK => c"AVC_OK",
        AVC_ERR_VALUE => c"AVC_ERR_VALUE",
        AVC_ERR_TYPE => c"AVC_ERR_TYPE",
        AVC_ERR_NULL => c"AVC_ERR_NULL",
        AVC_ERR_BUFFER_TOO_SMALL => c"AVC_ERR_BUFFER_TOO_SMALL",
        AVC_ERR_INVALID_HANDLE => c"AVC_ERR_INVALID_HANDLE",
        AVC_ERR_PANIC => c"AVC_ERR_PANIC",
        _ => c"AVC_UNKNOWN_STATUS",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last_error() -> String {
        // SAFETY: avc_last_error returns a valid NUL-terminated string that lives until the
        // next failing call on this thread, and none happens while we copy it.
        unsafe { CStr::from_ptr(avc_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let status = guard("avc_test", || panic!("boom at {}", 42));
        assert_eq!(status, AVC_ERR_PANIC);
        let message = last_error();
        assert!(message.starts_with("avc_test: internal error"), "{message}");
        assert!(message.contains("boom at 42"), "{message}");
    }

    #[test]
    fn errors_are_per_thread_and_survive_successes() {
        assert_eq!(
            guard("avc_first", || Err(FfiError::null("features"))),
            AVC_ERR_NULL
        );
        assert_eq!(guard("avc_second", || Ok(())), AVC_OK);
        assert_eq!(last_error(), "avc_first: features: must not be NULL");
        std::thread::spawn(|| assert_eq!(last_error(), ""))
            .join()
            .unwrap();
    }

    #[test]
    fn core_errors_keep_their_kind_and_argument() {
        let status = guard("avc_x", || {
            Err(av_core::Error::type_error("dtype", "float16 is not supported").into())
        });
        assert_eq!(status, AVC_ERR_TYPE);
        assert_eq!(last_error(), "avc_x: dtype: float16 is not supported");
    }

    #[test]
    fn every_kind_has_a_status_and_only_wrong_types_are_type_errors() {
        for kind in av_core::ErrorKind::ALL {
            let expected = if kind.is_type() {
                AVC_ERR_TYPE
            } else {
                AVC_ERR_VALUE
            };
            assert_eq!(status_of(kind), expected, "{kind:?}");
        }
    }

    #[test]
    fn every_status_has_a_name() {
        for status in AVC_OK..=AVC_ERR_PANIC {
            // SAFETY: avc_status_name returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(avc_status_name(status)) };
            assert_ne!(name.to_str().unwrap(), "AVC_UNKNOWN_STATUS", "{status}");
        }
    }
}
