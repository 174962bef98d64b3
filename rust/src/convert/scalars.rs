//! Scalar arguments: [`Int`], [`Float`], [`Flag`] and [`Text`] take whatever the caller
//! passed and refuse it by name when the function body asks for the value (see the parent
//! module's docs); [`byte_string`] copies a bytes-like argument.

use std::borrow::Cow;

use pyo3::exceptions::{PyException, PyOverflowError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyFloat, PyInt, PyString};

use super::type_name;
use crate::error::{type_error, value_error};

/// The longest rendering of a rejected value kept in a message.
const MAX_VALUE_CHARS: usize = 80;

/// `repr(obj)` for a message, shortened past [`MAX_VALUE_CHARS`].
pub fn short_repr(obj: &Bound<'_, PyAny>) -> String {
    let text = obj
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".to_owned());
    if text.chars().count() <= MAX_VALUE_CHARS {
        return text;
    }
    let head: String = text.chars().take(MAX_VALUE_CHARS).collect();
    format!("{head}... ({} characters)", text.chars().count())
}

/// An integer argument as the caller passed it; [`Int::to_usize`] and friends check it with the
/// argument's name.
#[derive(Clone, Debug)]
pub struct Int(IntValue);

#[derive(Clone, Debug)]
enum IntValue {
    /// An int (or an object with `__index__`, such as a numpy integer) that fits in `i128`.
    Value(i128),
    /// An int too large in magnitude for `i128`, as its (shortened) repr.
    Huge(String),
    /// A bool, which is not accepted as an int.
    Bool(bool),
    /// Not an integer at all: its type and repr.
    Other(String, String),
}

impl Int {
    /// A default value.
    pub const fn new(value: i128) -> Self {
        Int(IntValue::Value(value))
    }

    /// The value within `min..=max`, or an error naming `argument` (`TypeError` for a bool or a
    /// non-integer, `ValueError` with the value for one out of range).
    pub fn in_range(&self, argument: &str, min: i128, max: i128) -> PyResult<i128> {
        match &self.0 {
            IntValue::Value(v) if (min..=max).contains(v) => Ok(*v),
            _ => Err(self.refused(argument, min, max)),
        }
    }

    /// The error for a value [`Int::in_range`] does not accept (kept out of line: the accepted
    /// value is the path every call takes).
    #[cold]
    #[inline(never)]
    fn refused(&self, argument: &str, min: i128, max: i128) -> PyErr {
        let range = || format!("must be an integer in {min}..={max}");
        match &self.0 {
            IntValue::Value(v) => value_error(argument, format!("{}, got {v}", range())),
            IntValue::Huge(text) => value_error(argument, format!("{}, got {text}", range())),
            IntValue::Bool(b) => type_error(
                argument,
                format!(
                    "must be an integer, got bool ({})",
                    if *b { "True" } else { "False" }
                ),
            ),
            IntValue::Other(kind, text) => {
                type_error(argument, format!("must be an integer, got {kind} ({text})"))
            }
        }
    }

    /// The value as a non-negative `usize`.
    pub fn to_usize(&self, argument: &str) -> PyResult<usize> {
        // `usize` is at most 64 bits on every supported platform, so the cast is exact.
        self.in_range(argument, 0, usize::MAX as i128)
            .map(|v| v as usize)
    }

    /// The value as a `u64`.
    pub fn to_u64(&self, argument: &str) -> PyResult<u64> {
        self.in_range(argument, 0, i128::from(u64::MAX))
            .map(|v| v as u64)
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Int {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let obj: &Bound<'py, PyAny> = &obj;
        if let Ok(flag) = obj.cast::<PyBool>() {
            return Ok(Int(IntValue::Bool(flag.is_true())));
        }
        match obj.extract::<i64>() {
            Ok(v) => return Ok(Int(IntValue::Value(i128::from(v)))),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {}
            Err(e) if e.is_instance_of::<PyException>(obj.py()) => {
                return Ok(Int(IntValue::Other(type_name(obj), short_repr(obj))));
            }
            Err(e) => return Err(e),
        }
        // Beyond i64: a 128-bit value, or something only its repr can show.
        Ok(match obj.extract::<i128>() {
            Ok(v) => Int(IntValue::Value(v)),
            Err(_) => Int(IntValue::Huge(short_repr(obj))),
        })
    }
}

/// A float argument as the caller passed it; [`Float::value`] checks it with the argument's
/// name.
#[derive(Clone, Debug)]
pub struct Float(FloatValue);

#[derive(Clone, Debug)]
enum FloatValue {
    Value(f64),
    /// An int too large for a float, as its repr.
    Huge(String),
    Bool(bool),
    Other(String, String),
}

impl Float {
    /// A default value.
    pub const fn new(value: f64) -> Self {
        Float(FloatValue::Value(value))
    }

    /// The value, or an error naming `argument` (`TypeError` for a bool or a non-number,
    /// `ValueError` for an int beyond float range). The value's own range is the core's to
    /// check.
    pub fn value(&self, argument: &str) -> PyResult<f64> {
        match &self.0 {
            FloatValue::Value(v) => Ok(*v),
            FloatValue::Huge(text) => Err(value_error(
                argument,
                format!("{text} is too large for a float"),
            )),
            FloatValue::Bool(b) => Err(type_error(
                argument,
                format!(
                    "must be a number, got bool ({})",
                    if *b { "True" } else { "False" }
                ),
            )),
            FloatValue::Other(kind, text) => Err(type_error(
                argument,
                format!("must be a number, got {kind} ({text})"),
            )),
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Float {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let obj: &Bound<'py, PyAny> = &obj;
        if let Ok(float) = obj.cast::<PyFloat>() {
            return Ok(Float(FloatValue::Value(float.value())));
        }
        if let Ok(flag) = obj.cast::<PyBool>() {
            return Ok(Float(FloatValue::Bool(flag.is_true())));
        }
        // A numpy bool is a bool too, not the 0.0 or 1.0 its `__float__` gives (PyO3's `bool`
        // takes Python's and numpy's bools only).
        if obj.cast::<PyInt>().is_err() {
            if let Ok(flag) = obj.extract::<bool>() {
                return Ok(Float(FloatValue::Bool(flag)));
            }
        }
        match obj.extract::<f64>() {
            Ok(v) => Ok(Float(FloatValue::Value(v))),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
                Ok(Float(FloatValue::Huge(short_repr(obj))))
            }
            Err(e) if e.is_instance_of::<PyException>(obj.py()) => {
                Ok(Float(FloatValue::Other(type_name(obj), short_repr(obj))))
            }
            Err(e) => Err(e),
        }
    }
}

/// An argument as the caller passed it: its value, or (when it was not of the expected type)
/// its type and repr, kept for the error that names the argument.
#[derive(Clone, Debug)]
enum Given<T> {
    Value(T),
    Other(String, String),
}

impl<T> Given<T> {
    fn other(obj: &Bound<'_, PyAny>) -> Self {
        Given::Other(type_name(obj), short_repr(obj))
    }

    /// The value, or a `TypeError` naming `argument`, what it must be and what was passed.
    fn checked(&self, argument: &str, expected: &str) -> PyResult<&T> {
        match self {
            Given::Value(v) => Ok(v),
            Given::Other(kind, text) => Err(type_error(
                argument,
                format!("must be {expected}, got {kind} ({text})"),
            )),
        }
    }
}

/// A boolean argument as the caller passed it; [`Flag::value`] checks it with the argument's
/// name (Python's and numpy's bools are bools; anything else, an int included, a `TypeError`).
#[derive(Clone, Debug)]
pub struct Flag(Given<bool>);

impl Flag {
    /// A default value.
    pub const fn new(value: bool) -> Self {
        Flag(Given::Value(value))
    }

    /// The value, or a `TypeError` naming `argument` and what was passed.
    pub fn value(&self, argument: &str) -> PyResult<bool> {
        self.0.checked(argument, "a bool").copied()
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Flag {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let obj: &Bound<'py, PyAny> = &obj;
        Ok(Flag(match obj.extract::<bool>() {
            Ok(flag) => Given::Value(flag),
            Err(_) => Given::other(obj),
        }))
    }
}

/// The bytes of a bytes-like argument (`bytes`, `bytearray`, a `memoryview` or any other buffer
/// of bytes, such as a uint8 numpy array), copied; anything else is a `TypeError` naming
/// `argument`.
pub fn byte_string(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Vec<u8>> {
    if let Ok(bytes) = obj.cast::<PyBytes>() {
        return Ok(bytes.as_bytes().to_vec());
    }
    if let Ok(bytes) = obj.cast::<PyByteArray>() {
        return Ok(bytes.to_vec());
    }
    match pyo3::buffer::PyBuffer::<u8>::get(obj) {
        Ok(buffer) => buffer.to_vec(obj.py()),
        Err(_) => Err(type_error(
            argument,
            format!(
                "expected bytes (or a bytearray, memoryview or other buffer of bytes), got {} ({})",
                type_name(obj),
                short_repr(obj)
            ),
        )),
    }
}

/// A string argument as the caller passed it; [`Text::value`] checks it with the argument's
/// name (a `str` subclass is a string; anything else a `TypeError`).
#[derive(Clone, Debug)]
pub struct Text(Given<Cow<'static, str>>);

impl Text {
    /// A default value (borrowed: a default costs no allocation per call).
    pub const fn new(value: &'static str) -> Self {
        Text(Given::Value(Cow::Borrowed(value)))
    }

    /// The string, or a `TypeError` naming `argument` and what was passed.
    pub fn value(&self, argument: &str) -> PyResult<&str> {
        self.0.checked(argument, "a string").map(|text| &**text)
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Text {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let obj: &Bound<'py, PyAny> = &obj;
        Ok(Text(match obj.cast::<PyString>() {
            // Lone surrogates (no UTF-8) shown replaced: no valid name has them.
            Ok(text) => Given::Value(Cow::Owned(text.to_string_lossy().into_owned())),
            Err(_) => Given::other(obj),
        }))
    }
}
