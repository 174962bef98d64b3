//! Version queries.

use std::ffi::c_char;

use crate::raw::out_value;
use crate::status::{guard, AvcStatus, AVC_ABI_VERSION};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const VERSION_C: &std::ffi::CStr = {
    match std::ffi::CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(text) => text,
        Err(_) => panic!("the package version contains a NUL byte"),
    }
};

fn component(index: usize) -> u32 {
    VERSION
        .split(['.', '-', '+'])
        .nth(index)
        .and_then(|part| part.parse().ok())
        .unwrap_or(0)
}

/// The library's semantic version as three numbers (the av_core crate version).
///
/// major_out, minor_out and patch_out are required.
///
/// # Safety
///
/// Each pointer must be NULL (an error) or point to a writable uint32_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_version(
    major_out: *mut u32,
    minor_out: *mut u32,
    patch_out: *mut u32,
) -> AvcStatus {
    guard("avc_version", || {
        // SAFETY: the caller's contract above is `out_value`'s, for each pointer.
        let (major, minor, patch) = unsafe {
            (
                out_value(major_out, "major_out")?,
                out_value(minor_out, "minor_out")?,
                out_value(patch_out, "patch_out")?,
            )
        };
        major.write(component(0));
        minor.write(component(1));
        patch.write(component(2));
        Ok(())
    })
}

/// The library's version as a static string, for example "0.1.0". Never NULL; never free it.
#[unsafe(no_mangle)]
pub extern "C" fn avc_version_string() -> *const c_char {
    VERSION_C.as_ptr()
}

/// The binary interface version this library implements (AVC_ABI_VERSION of the header it
/// was built with). A program compiled against a header whose AVC_ABI_VERSION differs must
/// not use the library.
#[unsafe(no_mangle)]
pub extern "C" fn avc_abi_version() -> u32 {
    AVC_ABI_VERSION
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_components_match_the_string() {
        let (mut major, mut minor, mut patch) = (9, 9, 9);
        // SAFETY: three live, writable u32 locals.
        let status = unsafe { avc_version(&mut major, &mut minor, &mut patch) };
        assert_eq!(status, crate::status::AVC_OK);
        assert_eq!(format!("{major}.{minor}.{patch}"), VERSION);
        // SAFETY: static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(avc_version_string()) };
        assert_eq!(text.to_str().unwrap(), VERSION);
    }
}
