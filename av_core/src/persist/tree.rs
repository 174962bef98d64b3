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

use serde::de::{self, DeserializeOwned, IntoDeserializer, Unexpected, Visitor};
use serde::ser::{self, Impossible, Serialize};

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
        text: e.message,
    })
}

/// The serializer of [`to_value`].
struct Writer;

type Written = std::result::Result<Value, TreeError>;
type Collecting = std::result::Result<Collect, TreeError>;
type NoTree = Impossible<Value, TreeError>;

/// A list or a struct's dict being written.
#[derive(Default)]
struct Collect {
    items: Vec<Value>,
    entries: Vec<(String, Value)>,
}

fn no_tree<T>(what: &str) -> std::result::Result<T, TreeError> {
    Err(ser::Error::custom(format!("{what} has no tree")))
}

macro_rules! write_scalars {
    ($($method:ident($type:ty) => $variant:ident;)*) => {$(
        fn $method(self, v: $type) -> Written {
            Ok(Value::$variant(v.into()))
        }
    )*};
}

impl ser::Serializer for Writer {
    type Ok = Value;
    type Error = TreeError;
    type SerializeSeq = Collect;
    type SerializeTuple = Collect;
    type SerializeTupleStruct = Collect;
    type SerializeTupleVariant = NoTree;
    type SerializeMap = NoTree;
    type SerializeStruct = Collect;
    type SerializeStructVariant = NoTree;

    write_scalars! {
        serialize_bool(bool) => Bool;
        serialize_i8(i8) => Int;
        serialize_i16(i16) => Int;
        serialize_i32(i32) => Int;
        serialize_i64(i64) => Int;
        serialize_i128(i128) => Int;
        serialize_u8(u8) => Int;
        serialize_u16(u16) => Int;
        serialize_u32(u32) => Int;
        serialize_u64(u64) => Int;
        serialize_f32(f32) => Float;
        serialize_f64(f64) => Float;
        serialize_char(char) => Str;
        serialize_str(&str) => Str;
    }

    fn serialize_bytes(self, v: &[u8]) -> Written {
        Ok(Value::List(
            v.iter().map(|&b| Value::Int(b.into())).collect(),
        ))
    }

    fn serialize_none(self) -> Written {
        Ok(Value::None)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Written {
        v.serialize(self)
    }

    fn serialize_unit(self) -> Written {
        Ok(Value::None)
    }

    fn serialize_unit_struct(self, _: &'static str) -> Written {
        Ok(Value::None)
    }

    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Written {
        Ok(Value::Str(variant.into()))
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

    fn serialize_seq(self, _: Option<usize>) -> Collecting {
        Ok(Collect::default())
    }

    fn serialize_tuple(self, _: usize) -> Collecting {
        Ok(Collect::default())
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Collecting {
        Ok(Collect::default())
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Collecting {
        Ok(Collect::default())
    }

    fn serialize_map(self, _: Option<usize>) -> std::result::Result<NoTree, TreeError> {
        no_tree("a map")
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> std::result::Result<NoTree, TreeError> {
        no_tree(&format!("{name}: a tuple variant"))
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> std::result::Result<NoTree, TreeError> {
        no_tree(&format!("{name}: a struct variant"))
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
/// whole path).
pub fn from_value_at<T: DeserializeOwned>(
    tree: &Value,
    path: &[&str],
    argument: &'static str,
    kind: ErrorKind,
) -> Result<T> {
    T::deserialize(At(tree)).map_err(|mut e| {
        e.path
            .extend(path.iter().rev().map(|key| format!("[{key:?}]")));
        let at: String = e.path.iter().rev().map(String::as_str).collect();
        let message = match at.is_empty() {
            true => e.message,
            false => format!("{at} {}", e.message),
        };
        Error::new(
            if e.wrong_type { ErrorKind::Type } else { kind },
            argument,
            message,
        )
    })
}

/// A bad value (read), or a value with no tree (written): what is wrong, and where (the path's
/// steps `["key"]` or `[index]`, innermost first as the error rises).
#[derive(Debug)]
struct TreeError {
    wrong_type: bool,
    message: String,
    path: Vec<String>,
}

impl TreeError {
    fn new(wrong_type: bool, message: String) -> Self {
        TreeError {
            wrong_type,
            message,
            path: Vec::new(),
        }
    }

    fn under(mut self, step: String) -> Self {
        self.path.push(step);
        self
    }
}

impl std::fmt::Display for TreeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TreeError {}

impl ser::Error for TreeError {
    fn custom<T: std::fmt::Display>(message: T) -> Self {
        TreeError::new(false, message.to_string())
    }
}

/// What `expected` (serde's words for what a visitor takes) is in a message, and the range
/// of an integer type.
fn expectation(expected: &dyn de::Expected) -> (String, Option<String>) {
    let text = expected.to_string();
    let int = |min: i128, max: u128| ("an integer".into(), Some(format!("{min}..={max}")));
    match text.as_str() {
        "f32" | "f64" => ("a number".into(), None),
        "u8" => int(0, u8::MAX.into()),
        "u16" => int(0, u16::MAX.into()),
        "u32" => int(0, u32::MAX.into()),
        "u64" | "usize" => int(0, u64::MAX.into()),
        "i64" => int(i64::MIN.into(), i64::MAX as u128),
        "i128" => int(i128::MIN, i128::MAX as u128),
        "a boolean" => ("a bool".into(), None),
        "a string" | "a borrowed string" | "a character" => ("a string".into(), None),
        "a sequence" => ("a list".into(), None),
        _ => (text, None),
    }
}

impl de::Error for TreeError {
    fn custom<T: std::fmt::Display>(message: T) -> Self {
        TreeError::new(false, message.to_string())
    }

    fn invalid_type(got: Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        if let Unexpected::Other(text) = got {
            if text.starts_with("integer `") {
                // An integer beyond what the type's visitor takes: out of its range.
                return Self::invalid_value(got, expected);
            }
        }
        let (what, _) = expectation(expected);
        TreeError::new(true, format!("must be {what}, got {}", describe(got)))
    }

    fn invalid_value(got: Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        let (what, range) = expectation(expected);
        let got = match got {
            Unexpected::Signed(v) => v.to_string(),
            Unexpected::Unsigned(v) => v.to_string(),
            Unexpected::Other(text) => text
                .trim_start_matches("integer `")
                .split('`')
                .next()
                .unwrap_or(text)
                .into(),
            other => describe(other),
        };
        let what = match range {
            Some(range) => format!("{what} in {range}"),
            None => what,
        };
        TreeError::new(false, format!("must be {what}, got {got}"))
    }

    fn missing_field(field: &'static str) -> Self {
        TreeError::new(false, "is missing".into()).under(format!("[{field:?}]"))
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        let names: Vec<String> = expected.iter().map(|name| format!("{name:?}")).collect();
        let choices = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.concat(),
        };
        TreeError::new(false, format!("must be {choices}, got {variant:?}"))
    }
}

/// The deserializer of [`from_value`]: one value of the tree.
struct At<'a>(&'a Value);

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
            Value::List(items) => visitor.visit_seq(Items(items.iter().enumerate())),
            Value::Dict(entries) => visitor.visit_map(Entries(entries.iter(), None)),
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
            return Err(TreeError::new(true, format!("must be a dict, got {got}")));
        };
        if let Some((key, _)) = entries
            .iter()
            .find(|(key, _)| !fields.contains(&key.as_str()))
        {
            let message = format!("is not a field (the fields: {})", fields.join(", "));
            return Err(TreeError::new(false, message).under(format!("[{key:?}]")));
        }
        visitor.visit_map(Entries(entries.iter(), None))
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

/// A list's items being read.
struct Items<'a>(std::iter::Enumerate<std::slice::Iter<'a, Value>>);

impl<'de> de::SeqAccess<'de> for Items<'_> {
    type Error = TreeError;

    fn next_element_seed<T: de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Read<Option<T::Value>> {
        self.0
            .next()
            .map(|(i, item)| {
                seed.deserialize(At(item))
                    .map_err(|e| e.under(format!("[{i}]")))
            })
            .transpose()
    }
}

/// A dict's entries being read (and the one whose value is next).
struct Entries<'a>(
    std::slice::Iter<'a, (String, Value)>,
    Option<&'a (String, Value)>,
);

impl<'de> de::MapAccess<'de> for Entries<'_> {
    type Error = TreeError;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(&mut self, seed: K) -> Read<Option<K::Value>> {
        self.1 = self.0.next();
        self.1
            .map(|(key, _)| seed.deserialize(key.as_str().into_deserializer()))
            .transpose()
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(&mut self, seed: V) -> Read<V::Value> {
        let (key, value) = self
            .1
            .ok_or_else(|| TreeError::new(false, "a value without its key".into()))?;
        seed.deserialize(At(value))
            .map_err(|e| e.under(format!("[{key:?}]")))
    }
}

#[cfg(test)]
mod tests;
