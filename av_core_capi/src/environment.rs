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
    fn the_environment_of_the_tests_is_accepted() {
        // The test runner sets no AV_CORE_SIMD, or a documented level (CI's benchmarks).
        let documented = ["", "baseline", "avx2", "avx512"];
        let set = std::env::var("AV_CORE_SIMD").unwrap_or_default();
        if documented.contains(&set.trim().to_ascii_lowercase().as_str()) {
            assert_eq!(avc_check_environment(), AVC_OK);
        } else {
            assert_ne!(avc_check_environment(), AVC_OK);
        }
    }
}
