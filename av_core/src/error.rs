//! The one error type of the core.
//!
//! Every error has a [`ErrorKind`] (what went wrong, for the bindings to map), names the
//! argument that was wrong and says what was wrong with it. Each binding maps the kind once:
//! Python raises `ValueError`/`TypeError` (a subclass per kind: `av_core.StateError` and
//! friends), the C ABI returns the status code of the kind with the message. Nothing reads the
//! message to decide anything. A call that returns an error has changed no state.

use std::fmt;

/// What went wrong: the binding maps the kind, never the message.
///
/// Every kind but [`ErrorKind::Type`] is a wrong *value* in the broad sense (Python raises a
/// `ValueError` subclass for each, C returns `AVC_ERR_VALUE`).
///
/// # Example
///
/// ```rust
/// use av_core::cost_tables::CostTables;
/// use av_core::planner::VerificationPlanner;
/// use av_core::ErrorKind;
///
/// let err = VerificationPlanner::from_bytes(b"not a planner").unwrap_err();
/// assert_eq!((err.kind, err.argument), (ErrorKind::State, "data"));
/// assert!(!err.kind.is_type());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Right type, wrong value: out of range, non-finite, wrong shape, inconsistent lengths.
    Value,
    /// An unsupported type (for example an array dtype the entry point does not accept).
    Type,
    /// Saved state (bytes or text) that is corrupt, truncated, of another kind, of a format
    /// version this build does not read, or that decodes to a state no planner or estimator
    /// could hold.
    State,
    /// The call prices drafting by depth and the cost tables have no draft-depth table.
    MissingDepthTable,
    /// The cost tables' draft-depth table does not cover exactly the positions planned.
    DepthTableMismatch,
    /// An input held a bad value that was gone when read again: another thread wrote the buffer
    /// during the call. Nothing was done.
    BufferChanged,
    /// There was no memory for a copy the call needs (a size the caller asked for).
    OutOfMemory,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::Value,
        ErrorKind::Type,
        ErrorKind::State,
        ErrorKind::MissingDepthTable,
        ErrorKind::DepthTableMismatch,
        ErrorKind::BufferChanged,
        ErrorKind::OutOfMemory,
    ];

    /// Whether this is a wrong type (`TypeError`) rather than a wrong value (`ValueError`).
    pub const fn is_type(self) -> bool {
        matches!(self, ErrorKind::Type)
    }

    /// Whether the error concerns the cost tables' draft-depth table (missing or covering
    /// other positions): the bindings name their own cost-tables argument.
    pub const fn is_depth_table(self) -> bool {
        matches!(
            self,
            ErrorKind::MissingDepthTable | ErrorKind::DepthTableMismatch
        )
    }

    /// A short name, for messages and tests (`"value"`, `"state"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::Value => "value",
            ErrorKind::Type => "type",
            ErrorKind::State => "state",
            ErrorKind::MissingDepthTable => "missing depth table",
            ErrorKind::DepthTableMismatch => "depth table mismatch",
            ErrorKind::BufferChanged => "buffer changed",
            ErrorKind::OutOfMemory => "out of memory",
        }
    }
}

/// A rejected argument: what kind of error, which argument, and why.
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
    /// What went wrong (the bindings map it to an exception class or status code).
    pub kind: ErrorKind,
    /// The name of the offending argument as the public API spells it.
    pub argument: &'static str,
    /// What was wrong, including the offending value or shape.
    pub message: String,
}

impl Error {
    /// An error of `kind` for `argument`.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::{Error, ErrorKind};
    ///
    /// let err = Error::new(ErrorKind::State, "data", "checksum mismatch");
    /// assert_eq!(err.to_string(), "data: checksum mismatch");
    /// ```
    pub fn new(kind: ErrorKind, argument: &'static str, message: impl Into<String>) -> Self {
        Error {
            kind,
            argument,
            message: message.into(),
        }
    }

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
        Error::new(ErrorKind::Value, argument, message)
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
        Error::new(ErrorKind::Type, argument, message)
    }

    /// A state error (corrupt, truncated, foreign or future-version saved state) for
    /// `argument`.
    pub fn state(argument: &'static str, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::State, argument, message)
    }

    /// The error of an input that failed a check while used but passed it when read again:
    /// another thread wrote the buffer during the call.
    pub fn buffer_changed(argument: &'static str) -> Self {
        Error::new(
            ErrorKind::BufferChanged,
            argument,
            "changed while the call read it (another thread wrote the buffer); nothing was done",
        )
    }

    /// No memory for a copy of `argument`.
    pub fn out_of_memory(argument: &'static str, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::OutOfMemory, argument, message)
    }

    /// This error, as found while decoding saved state: its kind becomes
    /// [`ErrorKind::State`], its argument `argument` (the saved data), and its message is
    /// `context` then this error (`"the saved cost tables are invalid: verify_ms: [0] = 0 ..."`).
    pub(crate) fn in_saved(self, argument: &'static str, context: &str) -> Self {
        Error::state(argument, format!("{context}: {self}"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_distinct_name_and_only_type_is_a_type_error() {
        let names: std::collections::HashSet<_> = ErrorKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), ErrorKind::ALL.len());
        for kind in ErrorKind::ALL {
            assert_eq!(kind.is_type(), kind == ErrorKind::Type, "{kind:?}");
        }
    }

    #[test]
    fn constructors_set_the_kind() {
        assert_eq!(Error::state("data", "x").kind, ErrorKind::State);
        assert_eq!(Error::buffer_changed("c").kind, ErrorKind::BufferChanged);
        assert_eq!(Error::out_of_memory("c", "x").kind, ErrorKind::OutOfMemory);
        let saved = Error::value("verify_ms", "[0] = 0")
            .in_saved("data", "the saved cost tables are invalid");
        assert_eq!((saved.kind, saved.argument), (ErrorKind::State, "data"));
        assert_eq!(
            saved.message,
            "the saved cost tables are invalid: verify_ms: [0] = 0"
        );
    }
}
