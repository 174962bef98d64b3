//! A neutral value tree: what a structured state (`state_dict`, a round's statistics, a refit
//! report) is made of, independent of any binding. The core defines each format as a tree
//! ([`crate::persist::state_dict`]); a binding only converts trees to its own values and back
//! (Python: `None`, `bool`, `int`, `float`, `str`, `list`, `dict`), one small function each
//! way, and never decides a key, a version or a check.
//!
//! Reading a tree goes through [`Fields`], which names the argument and the path of every bad
//! value (`state: ["config"]["l2"] must be a number, got str ("x")`): a missing key, a wrong
//! type ([`ErrorKind::Type`], for a bool where a number belongs too) or
//! an out-of-range integer ([`ErrorKind::Value`]).
//!
//! # Example
//!
//! ```rust
//! use av_core::persist::tree::{Fields, Map, Value};
//!
//! let mut config = Map::new();
//! config.insert("num_positions", 3u64);
//! config.insert("l2", 1e-3);
//! let mut state = Map::new();
//! state.insert("config", config);
//! let state = Value::Map(state);
//!
//! let fields = Fields::root(&state, "state", "expected a dict")?;
//! let config = fields.map("config")?;
//! assert_eq!(config.int::<usize>("num_positions", (0, 64))?, 3);
//! assert_eq!(config.float("l2")?, 1e-3);
//! let err = config.float("damping").unwrap_err();
//! assert_eq!(err.to_string(), "state: [\"config\"][\"damping\"] is missing");
//! # Ok::<(), av_core::Error>(())
//! ```

use crate::error::{Error, ErrorKind, Result};

/// One value of a tree.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// No value (Python `None`).
    None,
    /// A boolean (never accepted where a number belongs).
    Bool(bool),
    /// An integer.
    Int(i128),
    /// An integer beyond `i128`: its text, and its nearest float if that is finite.
    BigInt {
        /// The integer as text (possibly shortened).
        text: String,
        /// Its nearest `f64`, if finite.
        float: Option<f64>,
    },
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A list.
    List(Vec<Value>),
    /// A map with ordered string keys.
    Map(Map),
    /// A value of a type the tree has no place for: its type's name and a short text of it
    /// (what a reader reports when it meets one).
    Other {
        /// The binding's name of its type (`"object"`, `"set"`, ...).
        type_name: String,
        /// A short text of the value.
        text: String,
    },
}

impl Value {
    /// The name of its type in messages (Python's names: `int`, `float`, `str`, `list`, ...).
    pub fn type_name(&self) -> &str {
        match self {
            Value::None => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt { .. } => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::List(_) => "list",
            Value::Map(_) => "dict",
            Value::Other { type_name, .. } => type_name,
        }
    }

    /// `type (text)` of a scalar (`bool (True)`, `float (2.5)`), the type alone otherwise.
    fn describe(&self) -> String {
        match self {
            Value::None => "None".into(),
            Value::Bool(b) => format!("bool ({})", if *b { "True" } else { "False" }),
            Value::Int(v) => format!("int ({v})"),
            Value::BigInt { text, .. } => format!("int ({text})"),
            Value::Float(v) => format!("float ({})", float_text(*v)),
            Value::Str(s) => format!("str ({s:?})"),
            Value::List(_) | Value::Map(_) => self.type_name().into(),
            Value::Other { type_name, text } => format!("{type_name} ({text})"),
        }
    }
}

/// A float as Python prints it (`2.0`, `inf`, `nan`, `1e-05`).
fn float_text(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else if v == v.trunc() && v.abs() < 1e16 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// A map with string keys in insertion order (a Python `dict`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Map {
    entries: Vec<(String, Value)>,
}

impl Map {
    /// An empty map.
    pub fn new() -> Self {
        Map::default()
    }

    /// Sets `key` to `value`: in place if the key is there, appended otherwise.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        let (key, value) = (key.into(), value.into());
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((key, value)),
        }
    }

    /// The value of `key`, if any.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The entries in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The keys in order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl IntoIterator for Map {
    type Item = (String, Value);
    type IntoIter = std::vec::IntoIter<(String, Value)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl FromIterator<(String, Value)> for Map {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        let mut map = Map::new();
        for (k, v) in iter {
            map.insert(k, v);
        }
        map
    }
}

macro_rules! int_values {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::Int(i128::from(v))
            }
        }
    )*};
}
int_values!(u8, u32, u64, i32, i64, i128);

impl From<usize> for Value {
    fn from(v: usize) -> Value {
        // `usize` is at most 64 bits on every supported platform: exact.
        Value::Int(v as i128)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.into())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Str(v)
    }
}

impl From<Map> for Value {
    fn from(v: Map) -> Value {
        Value::Map(v)
    }
}

impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(v: Vec<T>) -> Value {
        Value::List(v.into_iter().map(Into::into).collect())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::None, Into::into)
    }
}

/// The full range of `u64`, for [`Fields::int`].
pub const U64: (i128, i128) = (0, u64::MAX as i128);
/// The full range of `i128`, for [`Fields::int`].
pub const I128: (i128, i128) = (i128::MIN, i128::MAX);

/// A map of a tree being read: every error names `argument` and the path from its root.
#[derive(Clone, Copy, Debug)]
pub struct Fields<'a> {
    map: &'a Map,
    argument: &'static str,
    path: Path<'a>,
}

/// Where a value sits below the argument: a linked list of keys, printed `["a"]["b"]`.
#[derive(Clone, Copy, Debug)]
struct Path<'a> {
    key: Option<&'a str>,
    parent: Option<&'a Path<'a>>,
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(parent) = self.parent {
            write!(f, "{parent}")?;
        }
        match self.key {
            Some(key) => write!(f, "[{key:?}]"),
            None => Ok(()),
        }
    }
}

/// The integer `value` in `min..=max` as a `T`, or the error for `at` (a bool or a non-integer
/// is a type error, a value out of range a value error).
fn int_in<T: TryFrom<i128>>(
    value: &Value,
    argument: &'static str,
    at: &dyn std::fmt::Display,
    (min, max): (i128, i128),
) -> Result<T> {
    let range = || format!("{at} must be an integer in {min}..={max}");
    let v = match value {
        Value::Int(v) if (min..=max).contains(v) => *v,
        Value::Int(v) => return Err(Error::value(argument, format!("{}, got {v}", range()))),
        Value::BigInt { text, .. } => {
            return Err(Error::value(argument, format!("{}, got {text}", range())))
        }
        other => {
            return Err(Error::type_error(
                argument,
                format!("{at} must be an integer, got {}", other.describe()),
            ))
        }
    };
    T::try_from(v).map_err(|_| Error::value(argument, format!("{at}: {v} is out of range")))
}

/// The number `value` (an int converts as Python's `float()` does), or the error for `at`.
fn float_of(value: &Value, argument: &'static str, at: &dyn std::fmt::Display) -> Result<f64> {
    match value {
        Value::Float(v) => Ok(*v),
        // Round to nearest, ties to even: Python's float(int).
        Value::Int(v) => Ok(*v as f64),
        Value::BigInt { float: Some(v), .. } => Ok(*v),
        Value::BigInt { text, float: None } => Err(Error::value(
            argument,
            format!("{at}: {text} is too large for a float"),
        )),
        other => Err(Error::type_error(
            argument,
            format!("{at} must be a number, got {}", other.describe()),
        )),
    }
}

/// A path with an index appended (`["n"][3]`).
struct Indexed<'a>(&'a Path<'a>, usize);

impl std::fmt::Display for Indexed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

impl<'a> Fields<'a> {
    /// The root `value`, which must be a map; otherwise a type error for `argument` saying
    /// `expected` (and what it got).
    pub fn root(value: &'a Value, argument: &'static str, expected: &str) -> Result<Fields<'a>> {
        match value {
            Value::Map(map) => Ok(Fields {
                map,
                argument,
                path: Path {
                    key: None,
                    parent: None,
                },
            }),
            other => Err(Error::type_error(
                argument,
                format!("{expected}, got {}", other.type_name()),
            )),
        }
    }

    /// The argument errors name.
    pub fn argument(&self) -> &'static str {
        self.argument
    }

    /// The underlying map.
    pub fn as_map(&self) -> &'a Map {
        self.map
    }

    /// An error of `kind` about the value at `key` (`message` follows its path).
    pub fn error(&self, kind: ErrorKind, key: &str, message: impl std::fmt::Display) -> Error {
        let at = Path {
            key: Some(key),
            parent: Some(&self.path),
        };
        Error::new(kind, self.argument, format!("{at} {message}"))
    }

    fn at(&'a self, key: &'a str) -> Path<'a> {
        Path {
            key: Some(key),
            parent: Some(&self.path),
        }
    }

    /// The value of `key`; a value error if it is missing.
    pub fn get(&self, key: &str) -> Result<&'a Value> {
        self.map.get(key).ok_or_else(|| {
            Error::value(
                self.argument,
                format!(
                    "{} is missing",
                    Path {
                        key: Some(key),
                        parent: Some(&self.path)
                    }
                ),
            )
        })
    }

    /// The map at `key`.
    pub fn map(&'a self, key: &'a str) -> Result<Fields<'a>> {
        match self.get(key)? {
            Value::Map(map) => Ok(Fields {
                map,
                argument: self.argument,
                path: Path {
                    key: Some(key),
                    parent: Some(&self.path),
                },
            }),
            other => Err(Error::type_error(
                self.argument,
                format!("{} must be a dict, got {}", self.at(key), other.type_name()),
            )),
        }
    }

    /// The string at `key`.
    pub fn string(&self, key: &str) -> Result<&'a str> {
        match self.get(key)? {
            Value::Str(s) => Ok(s),
            other => Err(Error::type_error(
                self.argument,
                format!(
                    "{} must be a string, got {}",
                    self.at(key),
                    other.describe()
                ),
            )),
        }
    }

    /// The integer at `key`, in `min..=max`, as a `T`.
    pub fn int<T: TryFrom<i128>>(&self, key: &str, range: (i128, i128)) -> Result<T> {
        int_in(self.get(key)?, self.argument, &self.at(key), range)
    }

    /// The integer at `key` as [`Fields::int`], or `None` where the value is `None`.
    pub fn optional_int<T: TryFrom<i128>>(
        &self,
        key: &str,
        range: (i128, i128),
    ) -> Result<Option<T>> {
        match self.get(key)? {
            Value::None => Ok(None),
            value => int_in(value, self.argument, &self.at(key), range).map(Some),
        }
    }

    /// The number at `key`.
    pub fn float(&self, key: &str) -> Result<f64> {
        float_of(self.get(key)?, self.argument, &self.at(key))
    }

    fn list(&self, key: &str) -> Result<&'a [Value]> {
        match self.get(key)? {
            Value::List(items) => Ok(items),
            other => Err(Error::type_error(
                self.argument,
                format!("{} must be a list, got {}", self.at(key), other.describe()),
            )),
        }
    }

    /// The list of integers at `key`, each in `min..=max`.
    pub fn ints<T: TryFrom<i128>>(&self, key: &str, range: (i128, i128)) -> Result<Vec<T>> {
        let at = self.at(key);
        self.list(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| int_in(v, self.argument, &Indexed(&at, i), range))
            .collect()
    }

    /// The list of numbers at `key`.
    pub fn floats(&self, key: &str) -> Result<Vec<f64>> {
        let at = self.at(key);
        self.list(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| float_of(v, self.argument, &Indexed(&at, i)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(entries: Vec<(&str, Value)>) -> Value {
        Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    #[test]
    fn insert_keeps_the_first_position_of_a_key() {
        let mut m = Map::new();
        m.insert("b", 1u64);
        m.insert("a", 2u64);
        m.insert("b", 3u64);
        assert_eq!(m.keys().collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(m.get("b"), Some(&Value::Int(3)));
    }

    #[test]
    fn readers_name_the_argument_and_the_path() {
        let inner = tree(vec![
            ("flag", Value::Bool(true)),
            ("x", Value::Str("s".into())),
            ("n", vec![Value::Int(1), Value::Int(-1)].into()),
            (
                "big",
                Value::BigInt {
                    text: "10**40".into(),
                    float: Some(1e40),
                },
            ),
            (
                "huge",
                Value::BigInt {
                    text: "10**400".into(),
                    float: None,
                },
            ),
            ("none", Value::None),
        ]);
        let root = tree(vec![("config", inner)]);
        let f = Fields::root(&root, "state", "expected a dict").unwrap();
        let c = f.map("config").unwrap();
        let err = c.int::<u64>("flag", U64).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Type);
        assert_eq!(
            err.to_string(),
            "state: [\"config\"][\"flag\"] must be an integer, got bool (True)"
        );
        let err = c.float("flag").unwrap_err();
        assert_eq!(err.kind, ErrorKind::Type);
        let err = c.ints::<u64>("n", U64).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Value);
        assert_eq!(
            err.to_string(),
            "state: [\"config\"][\"n\"][1] must be an integer in 0..=18446744073709551615, got -1"
        );
        assert_eq!(c.ints::<i64>("n", I128).unwrap(), [1, -1]);
        assert_eq!(c.floats("n").unwrap(), [1.0, -1.0]);
        assert_eq!(c.float("big").unwrap(), 1e40);
        assert_eq!(c.float("huge").unwrap_err().kind, ErrorKind::Value);
        assert_eq!(c.int::<u64>("big", U64).unwrap_err().kind, ErrorKind::Value);
        assert_eq!(c.optional_int::<u64>("none", U64).unwrap(), None);
        assert_eq!(c.string("x").unwrap(), "s");
        assert_eq!(c.string("n").unwrap_err().kind, ErrorKind::Type);
        assert_eq!(
            c.get("absent").unwrap_err().to_string(),
            "state: [\"config\"][\"absent\"] is missing"
        );
        assert_eq!(f.map("absent").unwrap_err().kind, ErrorKind::Value);
        let err = Fields::root(&Value::List(vec![]), "state", "expected a dict").unwrap_err();
        assert_eq!(
            (err.kind, err.to_string()),
            (ErrorKind::Type, "state: expected a dict, got list".into())
        );
        // An int out of the target type's range (not of the given range) is a value error.
        let root = tree(vec![("v", Value::Int(300))]);
        let f = Fields::root(&root, "state", "x").unwrap();
        assert_eq!(f.int::<u8>("v", U64).unwrap_err().kind, ErrorKind::Value);
    }

    #[test]
    fn floats_print_as_python_does() {
        assert_eq!(float_text(2.0), "2.0");
        assert_eq!(float_text(-0.5), "-0.5");
        assert_eq!(float_text(f64::INFINITY), "inf");
        assert_eq!(float_text(f64::NAN), "nan");
    }
}
