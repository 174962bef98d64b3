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

pub mod accumulator;
pub mod batch;
pub mod cholesky;
pub mod coefficients;
pub mod cost_tables;
pub mod error;
pub mod estimator;
pub mod fixed_point;
pub mod labels;
pub mod matrix;
pub mod memory;
pub mod planner;
pub mod refit;
pub mod snapshot;
mod sync;

pub use error::{Error, ErrorKind, Result};
pub use estimator::{AcceptanceEstimator, EstimatorConfig, EstimatorState};
pub use matrix::MatrixView;
