//! The value tree every structured state is made of (`state_dict`, a round's statistics, a
//! refit report), and the serde data format over it: the core's types declare their fields once
//! (serde derives), [`to_value`] writes them as a tree and [`from_value`] reads them back,
//! refusing a key no field holds. A binding converts trees to its own values
//! and back (Python: `None`, `bool`, `int`, `float`, `str`, `list`, `dict`), one small function
//! each way, and never decides a key, a version or a check.
//!
//! Reading names the argument and the path of every bad value (`state: ["config"]["l2"] must
//! be a number, got str ("x")`): a missing key or one no field holds, an integer out of range
//! ([`ErrorKind::Value`], or the kind the caller reads with), a value of the wrong type
//! ([`ErrorKind::Type`], a bool where a number belongs included).
//!
//! # Example
//!
//! ```rust
//! use av_core::persist::tree::{from_value, to_value, Value};
//! use av_core::{EstimatorConfig, ErrorKind};
//!
//! let config = EstimatorConfig::new(3);
//! let tree = to_value(&config);
//! let Value::Dict(fields) = &tree else { unreachable!() };
//! assert_eq!(fields[3], ("l2".to_string(), Value::Float(1e-3)));
//! assert_eq!(from_value::<EstimatorConfig>(&tree, "config", ErrorKind::Value)?, config);
//! let mut extra = fields.clone();
//! extra.push(("l3".into(), Value::Float(1.0)));
//! let err = from_value::<EstimatorConfig>(&Value::Dict(extra), "config", ErrorKind::Value);
//! assert!(err.unwrap_err().to_string().starts_with("config: [\"l3\"] is not a field"));
//! # Ok::<(), av_core::Error>(())
//! ```

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, DeserializeOwned, IntoDeserializer, Unexpected, Visitor};
use serde::ser::{self, Impossible, Serialize};
use serde_path_to_error::Segment::{Enum, Map, Seq, Unknown};

use crate::error::{Error, ErrorKind, Result};

/// One value of a tree.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// No value (Python `None`).
    None,
    /// A boolean (never read where a number belongs).
    Bool(bool),
    /// An integer.
    Int(i128),
    /// An integer beyond `i128` (from a binding): its text, and its nearest float if finite.
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
    /// A dict: its entries, keys in order (a key appears once).
    Dict(Vec<(String, Value)>),
    /// A value of a type the tree has no place for (from a binding): its type's name and a short
    /// text of it, which a reader names when it meets one.
    Other {
        /// The binding's name of its type (`"object"`, `"set"`, ...).
        type_name: String,
        /// A short text of the value.
        text: String,
    },
}

impl Value {
    /// The name of its type in messages (Python's: `int`, `float`, `str`, `list`, `dict`, ...).
    pub fn type_name(&self) -> &str {
        match self {
            Value::None => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt { .. } => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Other { type_name, .. } => type_name,
        }
    }

    /// The value of `key` if this is a dict that holds it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// `value` as Python prints it in a message (`bool (True)`, `float (2.5)`, `str ("x")`, `list`).
fn describe(value: Unexpected<'_>) -> String {
    match value {
        Unexpected::Bool(b) => format!("bool ({})", if b { "True" } else { "False" }),
        Unexpected::Signed(v) => format!("int ({v})"),
        Unexpected::Unsigned(v) => format!("int ({v})"),
        Unexpected::Float(v) if v.is_nan() => "float (nan)".into(),
        Unexpected::Float(v) if v.is_infinite() => {
            format!("float ({}inf)", if v < 0.0 { "-" } else { "" })
        }
        Unexpected::Float(v) if v == v.trunc() && v.abs() < 1e16 => format!("float ({v:.1})"),
        Unexpected::Float(v) => format!("float ({v})"),
        Unexpected::Str(s) => format!("str ({s:?})"),
        Unexpected::Unit | Unexpected::Option => "None".into(),
        Unexpected::Seq => "list".into(),
        // serde's "map" is a dict.
        other => other.to_string().replace("map", "dict"),
    }
}

// ---------------------------------------------------------------------------------------------
// Writing: a `Serialize` value as a tree.

/// `value` as a tree: a struct is a dict of its fields in declaration order, a sequence a list,
/// an `Option` its value or `None`, a unit enum variant its (renamed) name. A value serde
/// cannot write as a tree (none of the core's types: a map, a variant with fields) becomes a
/// [`Value::Other`] naming why, which every reader refuses.
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Value {
    value.serialize(Writer).unwrap_or_else(|e| Value::Other {
        type_name: "error".into(),
        text: e.1,
    })
}

/// The serializer of [`to_value`].
struct Writer;

type Written = std::result::Result<Value, TreeError>;
type Collecting = std::result::Result<Collect, TreeError>;
type NoTree = std::result::Result<Impossible<Value, TreeError>, TreeError>;

/// A list or a struct's dict being written.
#[derive(Default)]
struct Collect {
    items: Vec<Value>,
    entries: Vec<(String, Value)>,
}

/// The forms a tree has no place for (a map, a variant with fields).
fn no_tree(what: &str) -> NoTree {
    Err(ser::Error::custom(format!("{what} has no tree")))
}

/// Methods of [`Writer`], each a one-line body.
macro_rules! writes {
    ($($method:ident($($arg:ident: $type:ty),*) -> $out:ty = $value:expr;)*) => {$(
        fn $method(self, $($arg: $type),*) -> $out {
            $value
        }
    )*};
}

impl ser::Serializer for Writer {
    type Ok = Value;
    type Error = TreeError;
    type SerializeSeq = Collect;
    type SerializeTuple = Collect;
    type SerializeTupleStruct = Collect;
    type SerializeTupleVariant = Impossible<Value, TreeError>;
    type SerializeMap = Impossible<Value, TreeError>;
    type SerializeStruct = Collect;
    type SerializeStructVariant = Impossible<Value, TreeError>;

    writes! {
        serialize_bool(v: bool) -> Written = Ok(Value::Bool(v));
        serialize_i8(v: i8) -> Written = Ok(Value::Int(v.into()));
        serialize_i16(v: i16) -> Written = Ok(Value::Int(v.into()));
        serialize_i32(v: i32) -> Written = Ok(Value::Int(v.into()));
        serialize_i64(v: i64) -> Written = Ok(Value::Int(v.into()));
        serialize_i128(v: i128) -> Written = Ok(Value::Int(v));
        serialize_u8(v: u8) -> Written = Ok(Value::Int(v.into()));
        serialize_u16(v: u16) -> Written = Ok(Value::Int(v.into()));
        serialize_u32(v: u32) -> Written = Ok(Value::Int(v.into()));
        serialize_u64(v: u64) -> Written = Ok(Value::Int(v.into()));
        serialize_f32(v: f32) -> Written = Ok(Value::Float(v.into()));
        serialize_f64(v: f64) -> Written = Ok(Value::Float(v));
        serialize_char(v: char) -> Written = Ok(Value::Str(v.into()));
        serialize_str(v: &str) -> Written = Ok(Value::Str(v.into()));
        serialize_bytes(v: &[u8]) -> Written =
            Ok(Value::List(v.iter().map(|&b| Value::Int(b.into())).collect()));
        serialize_none() -> Written = Ok(Value::None);
        serialize_unit() -> Written = Ok(Value::None);
        serialize_unit_struct(_n: &'static str) -> Written = Ok(Value::None);
        serialize_unit_variant(_n: &'static str, _i: u32, v: &'static str) -> Written =
            Ok(Value::Str(v.into()));
        serialize_seq(_l: Option<usize>) -> Collecting = Ok(Collect::default());
        serialize_tuple(_l: usize) -> Collecting = Ok(Collect::default());
        serialize_tuple_struct(_n: &'static str, _l: usize) -> Collecting = Ok(Collect::default());
        serialize_struct(_n: &'static str, _l: usize) -> Collecting = Ok(Collect::default());
        serialize_map(_l: Option<usize>) -> NoTree = no_tree("a map");
        serialize_tuple_variant(n: &'static str, _i: u32, _v: &'static str, _l: usize) -> NoTree =
            no_tree(&format!("{n}: a tuple variant"));
        serialize_struct_variant(n: &'static str, _i: u32, _v: &'static str, _l: usize) -> NoTree =
            no_tree(&format!("{n}: a struct variant"));
    }

    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Written {
        v.serialize(self)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, v: &T) -> Written {
        v.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        v: &T,
    ) -> Written {
        Ok(Value::Dict(vec![(variant.into(), v.serialize(self)?)]))
    }
}

/// The sequence forms share one body: an item appended.
macro_rules! write_items {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for Collect {
            type Ok = Value;
            type Error = TreeError;

            fn $method<T: Serialize + ?Sized>(&mut self, v: &T) -> std::result::Result<(), TreeError> {
                self.items.push(v.serialize(Writer)?);
                Ok(())
            }

            fn end(self) -> Written {
                Ok(Value::List(self.items))
            }
        }
    )*};
}
write_items!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field
);

impl ser::SerializeStruct for Collect {
    type Ok = Value;
    type Error = TreeError;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> std::result::Result<(), TreeError> {
        self.entries.push((key.into(), v.serialize(Writer)?));
        Ok(())
    }

    fn end(self) -> Written {
        Ok(Value::Dict(self.entries))
    }
}

// ---------------------------------------------------------------------------------------------
// Reading: a `Deserialize` value from a tree, every bad value named by its path.

/// `T` from `tree`, as [`to_value`] writes it: a struct's dict holds each of its fields (unless
/// serde gives the field a default) and nothing else, a number may be an int or a float (an int
/// converts as Python's `float()` does; a bool is no number), an integer is in its type's
/// range. A wrong type is an [`ErrorKind::Type`] error, anything else of `kind`; the error
/// names `argument` and the path of the bad value.
pub fn from_value<T: DeserializeOwned>(
    tree: &Value,
    argument: &'static str,
    kind: ErrorKind,
) -> Result<T> {
    from_value_at(tree, &[], argument, kind)
}

/// [`from_value`] of the value that sits at `path` in what `argument` names (its errors name the
/// whole path). The path inside `tree` is [`serde_path_to_error`]'s, tracked only when a read
/// fails: the tree is read again to find it.
pub fn from_value_at<T: DeserializeOwned>(
    tree: &Value,
    path: &[&str],
    argument: &'static str,
    kind: ErrorKind,
) -> Result<T> {
    let read = T::deserialize(At(tree));
    read.or_else(|_| serde_path_to_error::deserialize(At(tree)))
        .map_err(|e| {
            let mut at: String = path.iter().map(|key| format!("[{key:?}]")).collect();
            for segment in e.path() {
                match segment {
                    Seq { index } => at += &format!("[{index}]"),
                    Map { key } => at += &format!("[{key:?}]"),
                    Enum { .. } | Unknown => {}
                }
            }
            let TreeError(wrong_type, message) = e.into_inner();
            let gap = if at.is_empty() || message.starts_with('[') {
                ""
            } else {
                " "
            };
            let kind = if wrong_type { ErrorKind::Type } else { kind };
            Error::new(kind, argument, format!("{at}{gap}{message}"))
        })
}

/// A bad value (read), or a value with no tree (written): whether it is of the wrong type, and
/// what is wrong after its path (`must be a number, got str ("x")`, or `["x"] is missing` from
/// the struct that lacks the field).
#[derive(Debug)]
struct TreeError(bool, String);

impl std::fmt::Display for TreeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1)
    }
}

impl std::error::Error for TreeError {}

impl ser::Error for TreeError {
    fn custom<T: std::fmt::Display>(message: T) -> Self {
        TreeError(false, message.to_string())
    }
}

/// What `expected` (serde's words for what a visitor takes) is in a message, and with `range`
/// the range of an integer type.
fn expectation(expected: &dyn de::Expected, range: bool) -> String {
    let int = |min: i128, max: u128| match range {
        true => format!("an integer in {min}..={max}"),
        false => "an integer".into(),
    };
    match expected.to_string().as_str() {
        "f32" | "f64" => "a number".into(),
        "u8" => int(0, u8::MAX.into()),
        "u16" => int(0, u16::MAX.into()),
        "u32" => int(0, u32::MAX.into()),
        "u64" | "usize" => int(0, u64::MAX.into()),
        "i64" => int(i64::MIN.into(), i64::MAX as u128),
        "i128" => int(i128::MIN, i128::MAX as u128),
        "a boolean" => "a bool".into(),
        "a string" | "a borrowed string" | "a character" => "a string".into(),
        "a sequence" => "a list".into(),
        other => other.into(),
    }
}

impl de::Error for TreeError {
    fn custom<T: std::fmt::Display>(message: T) -> Self {
        TreeError(false, message.to_string())
    }

    fn invalid_type(got: Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        if let Unexpected::Other(text) = got {
            if text.starts_with("integer `") {
                // An integer beyond what the type's visitor takes: out of its range.
                return Self::invalid_value(got, expected);
            }
        }
        let what = expectation(expected, false);
        TreeError(true, format!("must be {what}, got {}", describe(got)))
    }

    fn invalid_value(got: Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        let got = match got {
            Unexpected::Signed(v) => v.to_string(),
            Unexpected::Unsigned(v) => v.to_string(),
            // serde's text of a wide integer: "integer `N` as i128".
            Unexpected::Other(text) => text
                .trim_start_matches("integer `")
                .split('`')
                .take(1)
                .collect(),
            other => describe(other),
        };
        let what = expectation(expected, true);
        TreeError(false, format!("must be {what}, got {got}"))
    }

    fn missing_field(field: &'static str) -> Self {
        TreeError(false, format!("[{field:?}] is missing"))
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        let names: Vec<String> = expected.iter().map(|name| format!("{name:?}")).collect();
        let choices = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.concat(),
        };
        TreeError(false, format!("must be {choices}, got {variant:?}"))
    }
}

/// The deserializer of [`from_value`]: one value of the tree.
struct At<'a>(&'a Value);

impl<'a> IntoDeserializer<'_, TreeError> for &'a Value {
    type Deserializer = At<'a>;

    fn into_deserializer(self) -> At<'a> {
        At(self)
    }
}

type Read<T> = std::result::Result<T, TreeError>;

impl<'de> de::Deserializer<'de> for At<'_> {
    type Error = TreeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Read<V::Value> {
        match self.0 {
            Value::None => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            // The narrowest form: serde's visitors of every integer and float type take these.
            Value::Int(v) => match (i64::try_from(*v), u64::try_from(*v)) {
                (Ok(v), _) => visitor.visit_i64(v),
                (_, Ok(v)) => visitor.visit_u64(v),
                _ => visitor.visit_i128(*v),
            },
            Value::BigInt { float: Some(v), .. } => visitor.visit_f64(*v),
            Value::BigInt { text, float: None } => {
                Err(de::Error::invalid_value(Unexpected::Other(text), &visitor))
            }
            Value::Float(v) => visitor.visit_f64(*v),
            Value::Str(s) => visitor.visit_str(s),
            Value::List(items) => visitor.visit_seq(SeqDeserializer::new(items.iter())),
            Value::Dict(entries) => {
                let entries = entries.iter().map(|(key, value)| (key.as_str(), value));
                visitor.visit_map(MapDeserializer::new(entries))
            }
            Value::Other { type_name, text } => Err(de::Error::invalid_type(
                Unexpected::Other(&format!("{type_name} ({text})")),
                &visitor,
            )),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Read<V::Value> {
        match self.0 {
            Value::None => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    /// A struct's dict: a key that none of its `fields` names is refused (read or refused,
    /// never dropped) before any field is read.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Read<V::Value> {
        let Value::Dict(entries) = self.0 else {
            let got = self.0.type_name();
            return Err(TreeError(true, format!("must be a dict, got {got}")));
        };
        let mut keys = entries.iter().map(|(key, _)| key);
        if let Some(key) = keys.find(|key| !fields.contains(&key.as_str())) {
            let fields = fields.join(", ");
            let message = format!("[{key:?}] is not a field (the fields: {fields})");
            return Err(TreeError(false, message));
        }
        self.deserialize_any(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Read<V::Value> {
        match self.0 {
            Value::Str(name) => visitor.visit_enum(name.as_str().into_deserializer()),
            _ => self.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct newtype_struct seq tuple tuple_struct map identifier ignored_any
    }
}

#[cfg(test)]
mod tests;
