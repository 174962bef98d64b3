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
/// Checks the environment variables the core reads (`AV_CORE_SIMD`: baseline, avx2, avx512 or
/// unset); ValueError naming the variable and its value otherwise (the core then runs its
/// baseline kernels).
#[pyfunction]
fn check_environment() -> PyResult<()> {
    av_core::check_environment().map_err(convert::to_py_err)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(check_environment, m)?)?;
    error::register(m)?;
    estimator::register(m)?;
    planner::register(m)?;
    features::register(m)?;
    files::register(m)?;
    Ok(())
}
