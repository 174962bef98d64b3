//! The one error type of the core.
//!
//! Every error names the argument that was wrong and says what was wrong with it, so the
//! bindings can surface it unchanged (`ValueError`/`TypeError` in Python, a status code plus
//! message in C). A call that returns an error has changed no state.

use std::fmt;

/// What kind of mistake the caller made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Right type, wrong value: out of range, non-finite, wrong shape, inconsistent lengths.
    Value,
    /// An unsupported type (for example an array dtype the entry point does not accept).
    Type,
}

/// A rejected argument: which one, and why.
///
/// `Display` prints `argument: message`, the text the bindings raise unchanged.
///
/// # Example
///
/// ```rust
/// use av_core::{AcceptanceEstimator, EstimatorConfig, ErrorKind};
///
/// let err = AcceptanceEstimator::new(EstimatorConfig::new(0)).unwrap_err();
/// assert_eq!(err.kind, ErrorKind::Value);
/// assert_eq!(err.argument, "num_positions");
/// assert_eq!(err.to_string(), "num_positions: must be between 1 and 64, got 0");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// Value or type error.
    pub kind: ErrorKind,
    /// The name of the offending argument as the public API spells it.
    pub argument: &'static str,
    /// What was wrong, including the offending value or shape.
    pub message: String,
}

impl Error {
    /// A value error for `argument`.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{Error, ErrorKind};
    ///
    /// let err = Error::value("damping", format!("must be non-negative, got {}", -1.0));
    /// assert_eq!(err.kind, ErrorKind::Value);
    /// assert_eq!(err.to_string(), "damping: must be non-negative, got -1");
    /// ```
    pub fn value(argument: &'static str, message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::Value,
            argument,
            message: message.into(),
        }
    }

    /// A type error for `argument`.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{Error, ErrorKind};
    ///
    /// let err = Error::type_error("features", "dtype int8 is not supported");
    /// assert_eq!(err.kind, ErrorKind::Type);
    /// assert_eq!(err.argument, "features");
    /// ```
    pub fn type_error(argument: &'static str, message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::Type,
            argument,
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.argument, self.message)
    }
}

impl std::error::Error for Error {}

/// Result alias used throughout the core.
pub type Result<T> = std::result::Result<T, Error>;

/// Fails with a value error unless `value` is finite.
pub(crate) fn ensure_finite(argument: &'static str, value: f64) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(Error::value(
            argument,
            format!("must be finite, got {value}"),
        ))
    }
}
