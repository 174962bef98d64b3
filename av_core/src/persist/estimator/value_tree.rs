//! The value tree ([`Value`]) in a self-describing binary: the configuration of version 4
//! (by field name, so a field added to the declaration reads from earlier bytes as its serde
//! default), and the whole payload of version 3 as the builds between the state's serde
//! declaration and postcard wrote it (the `state_dict` tree, [`state_dict`], under the same
//! version number as postcard's version 3; read, never written).
//!
//! Each value is a tag byte, then (little-endian): `None` 0, `False` 1, `True` 2, an int 3
//! (`i128`), a float 4 (`f64`), a string 5 (`u64` length, UTF-8), a list 6 (`u64` count, items),
//! a dict 7 (`u64` count, then each key as a string without its tag, and its value); an
//! integer beyond `i128` 8 and a value of another type 9 (their texts). Every width is fixed,
//! so a tree has one encoding and its length depends on its shape and strings only. A
//! version-3 state is a dict whose first key is `format`, so its payload starts with the bytes
//! [`holds`] checks.

use super::super::frame::{broken, Reader, DATA};
use super::super::state_dict;
use super::super::tree::{ListBuilder, Value};
use crate::error::{ErrorKind, Result};
use crate::EstimatorState;

/// Deeper than any state nests (a `state_dict` is three levels).
const MAX_DEPTH: usize = 16;

/// The first bytes of every such payload: a dict's tag and count, then the first key,
/// `"format"` (after the count's 8 bytes).
const FIRST_KEY: &[u8; 14] = b"\x06\0\0\0\0\0\0\0format";

/// Whether a version-3 `payload` starts as the value tree's does.
pub(super) fn holds(payload: &[u8]) -> bool {
    payload.first() == Some(&7) && payload.get(9..23) == Some(&FIRST_KEY[..])
}

/// The state a value-tree payload holds, read as a `state_dict` and checked like one.
pub(super) fn decode(payload: &[u8]) -> Result<EstimatorState> {
    let mut r = Reader { bytes: payload };
    let tree = read(&mut r, 0)?;
    r.finish()?;
    state_dict::decode(&tree, DATA, ErrorKind::State)
}

/// One value and everything below it.
pub(super) fn read(r: &mut Reader<'_>, depth: usize) -> Result<Value> {
    if depth > MAX_DEPTH {
        return Err(broken(format!(
            "values nest deeper than {MAX_DEPTH} levels"
        )));
    }
    Ok(match r.u8("a tag")? {
        0 => Value::None,
        1 => Value::Bool(false),
        2 => Value::Bool(true),
        3 => Value::Int(r.i128("an int")?),
        4 => Value::Float(r.f64("a float")?),
        5 => Value::Str(text(r)?),
        6 => {
            let n = count(r, 1)?;
            let mut list = ListBuilder::new(n);
            for _ in 0..n {
                list.push(read(r, depth + 1)?);
            }
            list.finish()
        }
        7 => {
            let n = count(r, 9)?;
            let mut entries: Vec<(String, Value)> = Vec::with_capacity(n);
            for _ in 0..n {
                let key = text(r)?;
                if entries.iter().any(|(k, _)| *k == key) {
                    return Err(broken(format!("the key {key:?} appears twice")));
                }
                entries.push((key, read(r, depth + 1)?));
            }
            Value::Dict(entries)
        }
        8 => Value::BigInt {
            text: text(r)?,
            float: None,
        },
        9 => Value::Other {
            type_name: text(r)?,
            text: text(r)?,
        },
        tag => return Err(broken(format!("unknown value tag {tag}"))),
    })
}

/// A count of items at least `least` bytes long each, refused before any allocation if the
/// data cannot hold it.
fn count(r: &mut Reader<'_>, least: usize) -> Result<usize> {
    let n = r.u64("a length")?;
    match usize::try_from(n) {
        Ok(n) if n <= r.bytes.len() / least => Ok(n),
        _ => Err(broken(format!("a length of {n} exceeds the data"))),
    }
}

/// A length-prefixed UTF-8 string.
fn text(r: &mut Reader<'_>) -> Result<String> {
    let n = count(r, 1)?;
    let (head, rest) = r.bytes.split_at(n);
    r.bytes = rest;
    String::from_utf8(head.to_vec()).map_err(|_| broken("a string is not UTF-8"))
}

/// Appends `tree` in the binary that [`read`] reads.
pub(super) fn write(tree: &Value, out: &mut Vec<u8>) {
    fn text(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn list(out: &mut Vec<u8>, items: impl ExactSizeIterator<Item = Value>) {
        out.push(6);
        out.extend((items.len() as u64).to_le_bytes());
        items.for_each(|item| write(&item, out));
    }
    match tree {
        Value::None => out.push(0),
        Value::Bool(b) => out.push(1 + u8::from(*b)),
        Value::Int(v) => {
            out.push(3);
            out.extend(v.to_le_bytes());
        }
        Value::Float(v) => {
            out.push(4);
            out.extend(v.to_le_bytes());
        }
        Value::Str(s) => {
            out.push(5);
            text(out, s);
        }
        Value::List(items) => list(out, items.iter().cloned()),
        Value::Floats(items) => list(out, items.iter().map(|&v| Value::Float(v))),
        Value::Ints(items) => list(out, items.iter().map(|&v| Value::Int(v))),
        Value::Dict(entries) => {
            out.push(7);
            out.extend((entries.len() as u64).to_le_bytes());
            for (key, value) in entries {
                text(out, key);
                write(value, out);
            }
        }
        Value::BigInt { text: t, .. } => {
            out.push(8);
            text(out, t);
        }
        Value::Other { type_name, text: t } => {
            out.push(9);
            text(out, type_name);
            text(out, t);
        }
    }
}
