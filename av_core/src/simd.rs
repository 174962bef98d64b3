//! Which vector unit the hot loops run on: run-time CPU detection for x86-64.
//!
//! The wheel is built for the baseline x86-64 target (SSE2, 2 × f64 or 4 × f32 per vector).
//! Six kernels are also compiled with `#[target_feature]` for AVX2 (+FMA; four of them for
//! AVX-512 too) and called through [`level`], which checks the CPU once with
//! `is_x86_feature_detected!`: the feature kernel ([`crate::features`]), `predict`'s logistic
//! (`estimator/logistic.rs`), the `map` refit's score and Hessian (`estimator/map.rs`), the
//! `map` observe's binning pass and its labeled-rows loop (`Binning::locate_all`,
//! `StepHistogram::locate_rows`, `estimator/histogram.rs`) and the checks of `predict`'s and
//! `observe`'s inputs (`estimator/observe.rs`, yes-or-no answers).
//! Every variant runs the same source with explicit lanes, and Rust never contracts `a * b + c` into an
//! FMA on its own. The `map` terms and the binning fuse nothing, so all their variants give
//! the same bits; the logistic's AVX2 and AVX-512 variants fuse, and keep the baseline's
//! float32 bits by checking every lane's rounding (`rounds_alike`); the feature
//! kernel asks for fused multiply-adds in its AVX2 and AVX-512 variants, so those two give the
//! same bits and the SSE2 baseline the bits of the separately rounded source (a build whose
//! target has FMA instructions, such as aarch64 or `-C target-feature=+fma`, fuses in its
//! baseline too); tests compare them bit for bit. So a CPU feature can differ in its last bits
//! between an AVX2 host and an SSE2-only one; `AV_CORE_SIMD=baseline` pins a mixed x86-64 fleet
//! to one result. The statistics kernel of `observe` under vLLM's update stays on the baseline
//! build: with the wider vectors it runs slower on the development machine (5.9 µs against
//! 5.3 µs at R = 256, K = 8). Neither does the `map` binning pass go past AVX2: its 512-bit
//! multiplies lower the core's clock for the code after it (the refit that follows a round's
//! last observe), by more than the wider vectors gain.
//!
//! `AV_CORE_SIMD=baseline|avx2|avx512` caps the level (for benchmarks, bisecting and pinning a
//! fleet's bits; any case, surrounding spaces ignored, empty or unset for no cap). Any other
//! value is refused by [`crate::check_environment`], which the bindings call when they load;
//! a caller that never checks runs on the baseline, the one result every x86-64 host shares.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable that caps the level.
pub const CAP_VARIABLE: &str = "AV_CORE_SIMD";

/// The cap `text` names: `None` (no cap) for an empty text, else a level; an error naming
/// [`CAP_VARIABLE`] and the value for anything else.
pub fn parse_cap(text: &str) -> Result<Option<Level>> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "baseline" => Ok(Some(Level::Baseline)),
        "avx2" => Ok(Some(Level::Avx2)),
        "avx512" => Ok(Some(Level::Avx512)),
        _ => Err(not_a_level(text)),
    }
}

fn not_a_level(text: impl std::fmt::Debug) -> Error {
    Error::value(
        CAP_VARIABLE,
        format!("{text:?} is not a level: expected baseline, avx2, avx512 or unset"),
    )
}

/// The cap [`CAP_VARIABLE`] sets in this process's environment.
pub fn env_cap() -> Result<Option<Level>> {
    match std::env::var(CAP_VARIABLE) {
        Ok(text) => parse_cap(&text),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(text)) => Err(not_a_level(text)),
    }
}

/// Defines a kernel's AVX2 and AVX-512 variants (`pub(super)`, `unsafe` to call: the caller
/// checks [`level`] first): the same signature and body, compiled once with `avx2` and once
/// with `avx512f`, `avx512bw`, `avx512vl` (and `avx2`). Generic parameters go in brackets.
///
/// ```ignore
/// wide_variants! {
///     fn sum_avx2 / sum_avx512 [T: Copy + Into<f64>] (xs: &[T]) -> f64 { sum_baseline(xs) }
/// }
/// ```
macro_rules! wide_variants {
    ($(fn $avx2:ident / $avx512:ident [$($generics:tt)*] ($($arg:ident: $ty:ty),* $(,)?)
        -> $ret:ty $body:block)*) => {$(
        #[target_feature(enable = "avx2")]
        pub(super) fn $avx2<$($generics)*>($($arg: $ty),*) -> $ret $body

        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
        pub(super) fn $avx512<$($generics)*>($($arg: $ty),*) -> $ret $body
    )*};
    // Kernels that return nothing.
    ($(fn $avx2:ident / $avx512:ident [$($generics:tt)*] ($($arg:ident: $ty:ty),* $(,)?)
        $body:block)*) => {$(
        #[target_feature(enable = "avx2")]
        pub(super) fn $avx2<$($generics)*>($($arg: $ty),*) $body

        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
        pub(super) fn $avx512<$($generics)*>($($arg: $ty),*) $body
    )*};
}
pub(crate) use wide_variants;

/// Runs the widest variant of a kernel that `level` allows: `avx512` at [`Level::Avx512`],
/// `avx2` at [`Level::Avx2`], `baseline` otherwise and off x86-64. `level` must be one this CPU
/// runs: [`level`] and [`available`] give only those.
///
/// ```ignore
/// simd::dispatch!(level,
///     avx512: x86::sum_avx512(xs), avx2: x86::sum_avx2(xs), baseline: sum_baseline(xs))
/// ```
macro_rules! dispatch {
    ($level:expr, avx512: $avx512:expr, avx2: $avx2:expr, baseline: $baseline:expr $(,)?) => {
        match $level {
            // SAFETY: a variant requires only the CPU features it is compiled with (`Avx512`:
            // `avx512f`, `avx512bw`, `avx512vl`, `avx2` and, for some, `fma`; `Avx2`: `avx2`
            // and, for some, `fma`), and a level from `simd::level` or `simd::available` is one
            // whose features `is_x86_feature_detected!` confirmed on this CPU.
            #[cfg(target_arch = "x86_64")]
            $crate::simd::Level::Avx512 => unsafe { $avx512 },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            $crate::simd::Level::Avx2 => unsafe { $avx2 },
            _ => $baseline,
        }
    };
}
pub(crate) use dispatch;

/// A vector-unit level, narrowest first.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub enum Level {
    /// The build target's own vectors (SSE2 on x86-64; everything off x86-64).
    Baseline,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512 F, BW and VL (with AVX2 and FMA).
    Avx512,
}

/// 0: not probed yet; otherwise `Level as u8 + 1`.
static LEVEL: AtomicU8 = AtomicU8::new(0);

/// The widest level this CPU runs, capped by `AV_CORE_SIMD` (probed once, then cached).
pub fn level() -> Level {
    match LEVEL.load(Ordering::Relaxed) {
        1 => Level::Baseline,
        2 => Level::Avx2,
        3 => Level::Avx512,
        _ => {
            let widest = available().last().copied().unwrap_or(Level::Baseline);
            // An unreadable cap pins the baseline: the bits every host shares.
            let cap = env_cap().unwrap_or(Some(Level::Baseline));
            let level = cap.map_or(widest, |cap| widest.min(cap));
            LEVEL.store(level as u8 + 1, Ordering::Relaxed);
            level
        }
    }
}

/// Every level this CPU runs, narrowest first (always starts with [`Level::Baseline`]).
pub fn available() -> Vec<Level> {
    let mut levels = vec![Level::Baseline];
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            levels.push(Level::Avx2);
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
            {
                levels.push(Level::Avx512);
            }
        }
    }
    levels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_reads_every_documented_level_and_refuses_the_rest() {
        assert_eq!(parse_cap("").unwrap(), None);
        assert_eq!(parse_cap("  ").unwrap(), None);
        assert_eq!(parse_cap("baseline").unwrap(), Some(Level::Baseline));
        assert_eq!(parse_cap(" Baseline\n").unwrap(), Some(Level::Baseline));
        assert_eq!(parse_cap("AVX2").unwrap(), Some(Level::Avx2));
        assert_eq!(parse_cap("avx512").unwrap(), Some(Level::Avx512));
        for bad in ["sse2", "avx", "avx-2", "0", "none", "baseline,avx2"] {
            let err = parse_cap(bad).unwrap_err();
            assert_eq!(err.argument, CAP_VARIABLE);
            assert!(err.message.contains(&format!("{bad:?}")), "{err}");
        }
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn level_example() {
        use crate::simd::{available, level};

        assert!(available().contains(&level()));
    }
}
