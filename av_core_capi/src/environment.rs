//! The environment variables the core reads, checked.

use crate::status::{guard, AvcStatus};

/// Checks the environment variables the core reads: AV_CORE_SIMD (the widest vector level the
/// kernels may use: "baseline", "avx2", "avx512" in any case, or unset). Any other value is
/// AVC_ERR_VALUE, and avc_last_error() names the variable and the value; the kernels then run
/// on the baseline. Call it once at start-up to fail on a typo instead of running other kernels
/// (and other last bits) than the fleet was pinned to.
#[unsafe(no_mangle)]
pub extern "C" fn avc_check_environment() -> AvcStatus {
    guard(
        "avc_check_environment",
        || Ok(av_core::check_environment()?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::AVC_OK;

    #[test]
    fn the_status_is_the_cores_verdict() {
        // The wrapper maps the core's check (its cases: av_core's simd tests; the values the C
        // caller sets: examples/c/error_paths.c) without deciding anything itself.
        let status = avc_check_environment();
        assert_eq!(status == AVC_OK, av_core::check_environment().is_ok());
        if status != AVC_OK {
            // SAFETY: avc_last_error returns a valid NUL-terminated string, never NULL.
            let text = unsafe { std::ffi::CStr::from_ptr(crate::status::avc_last_error()) };
            assert!(text
                .to_string_lossy()
                .starts_with("avc_check_environment: AV_CORE_SIMD"));
        }
    }
}
