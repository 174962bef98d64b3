//! # av_core
//!
//! Adaptive verification for speculative decoding with any drafter. Each decode step a serving
//! engine asks two questions, and this crate answers both fast enough for a scheduler's
//! critical path:
//!
//! 1. *How likely is each drafted token to be accepted?* — [`AcceptanceEstimator`], an online
//!    logistic fit `p = σ(ω·x + β_k)` on the drafter's `x = logit(q_max)`, recalibrated from the
//!    target's own verdicts.
//! 2. *Which drafts are worth verifying?* — the planner, which weighs expected accepted tokens
//!    against measured step costs.
//!
//! The crate is pure Rust: no Python, no I/O. The PyO3 bindings (`rust/`) and the C ABI only
//! convert arguments and map [`Error`]s.
//!
//! # Concurrency
//!
//! The long-lived types are `Send + Sync` (checked at compile time below), so they can sit in
//! an `Arc` shared by a serving engine's threads:
//!
//! * [`AcceptanceEstimator`] — every method takes `&self`; any number of threads may
//!   `predict`, `observe`, `refit` and read state at once.
//! * [`cost_tables::CostTables`] — immutable once built; share freely.
//! * [`planner::VerificationPlanner`] — `plan` and `add_request` take `&mut self`: one
//!   scheduler thread owns it, or it sits behind a `Mutex`.
//!
//! # Example
//!
//! ```rust
//! use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};
//!
//! // Two draft positions; the drafter's log-odds for one request.
//! let estimator = AcceptanceEstimator::new(EstimatorConfig::new(2))?;
//! let features = [1.5f32, -0.5];
//! let mut accept = [0.0f32; 2];
//! estimator.predict(MatrixView::new("features", &features, 1, 2)?, &mut accept)?;
//! assert!(accept[0] > accept[1]); // a more confident draft is likelier to be accepted
//! # Ok::<(), av_core::Error>(())
//! ```

#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod cost_tables;
pub mod error;
pub mod estimator;
pub mod features;
mod matrix;
pub mod persist;
pub mod planner;
mod simd;
mod sync;
#[cfg(test)]
mod test_rng;

pub use error::{Error, ErrorKind, Result};
pub use estimator::{
    AcceptanceEstimator, EstimatorConfig, EstimatorState, MapState, RefitReport, Update,
    UpdateReport, UpdateState, VllmState,
};
pub use matrix::MatrixView;

/// Checks the environment variables the core reads: `AV_CORE_SIMD` (the widest vector level
/// its kernels may use: `baseline`, `avx2`, `avx512`, or unset). A value it does not take is an
/// error naming the variable and the value; the bindings call this when they load, so a typo
/// fails at start-up instead of silently changing which kernels (and which last bits) run.
///
/// # Example
///
/// ```rust
/// // Unset or one of the documented levels in this test's environment.
/// assert!(av_core::check_environment().is_ok() || std::env::var("AV_CORE_SIMD").is_ok());
/// ```
pub fn check_environment() -> Result<()> {
    simd::env_cap().map(|_| ())
}

// The types that docs/design.md ("Determinism and concurrency") shares across threads must
// stay `Send + Sync`; this fails to compile if a field ever breaks that (a `Cell`, an `Rc`, a raw pointer).
const _: () = {
    fn assert_send_sync<T: Send + Sync>() {}
    #[allow(dead_code)]
    fn check() {
        assert_send_sync::<AcceptanceEstimator>();
        assert_send_sync::<EstimatorState>();
        assert_send_sync::<estimator::internals::SharedCoefficients>();
        assert_send_sync::<estimator::internals::Accumulator>();
        assert_send_sync::<cost_tables::CostTables>();
        assert_send_sync::<planner::VerificationPlanner>();
        assert_send_sync::<Error>();
    }
};
