//! PyO3 bindings of `av_core`, built by maturin into `av_core._native`.
//!
//! Conversion and error mapping only: every computation is a call into the core crate, made
//! with the GIL released.

use pyo3::prelude::*;

mod convert;
mod cost_tables;
mod error;
mod estimator;
mod features;
mod files;
mod persist;
mod planner;
mod tree;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    error::register(m)?;
    estimator::register(m)?;
    planner::register(m)?;
    features::register(m)?;
    Ok(())
}
