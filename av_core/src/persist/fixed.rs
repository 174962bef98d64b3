//! Integers of a state at a fixed width in the bytes: a serde `with` module for the counters
//! and integer columns whose values would otherwise change a state's length (postcard writes
//! integers as varints). A format that is not human-readable (the bytes) gets the values'
//! little-endian bytes as one byte string; a human-readable one (the `state_dict` tree) the
//! plain values.
//!
//! # Example
//!
//! ```rust
//! #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
//! struct Counts {
//!     #[serde(with = "av_core::persist::fixed")]
//!     n: Vec<u64>,
//! }
//!
//! let small = postcard::to_allocvec(&Counts { n: vec![0, 1] }).unwrap();
//! let large = postcard::to_allocvec(&Counts { n: vec![u64::MAX, 1 << 40] }).unwrap();
//! assert_eq!(small.len(), large.len()); // 1 length byte, 16 value bytes
//! assert_eq!(postcard::from_bytes::<Counts>(&large).unwrap().n, [u64::MAX, 1 << 40]);
//! ```

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value [`serialize`] writes as little-endian bytes.
pub trait Fixed: Sized {
    /// The value's little-endian bytes.
    fn to_le(&self) -> Vec<u8>;
    /// The value of `bytes`, if they are a whole number of its integers.
    fn from_le(bytes: &[u8]) -> Option<Self>;
}

macro_rules! fixed {
    ($($int:ty),*) => {$(
        impl Fixed for $int {
            fn to_le(&self) -> Vec<u8> {
                self.to_le_bytes().to_vec()
            }

            fn from_le(bytes: &[u8]) -> Option<Self> {
                bytes.try_into().ok().map(<$int>::from_le_bytes)
            }
        }

        impl Fixed for Vec<$int> {
            fn to_le(&self) -> Vec<u8> {
                self.iter().flat_map(|v| v.to_le_bytes()).collect()
            }

            fn from_le(bytes: &[u8]) -> Option<Self> {
                let chunks = bytes.chunks_exact(size_of::<$int>());
                chunks.remainder().is_empty().then(|| chunks.filter_map(<$int as Fixed>::from_le).collect())
            }
        }
    )*};
}
fixed!(u64, i128);

/// Serializes `value`: plain in a human-readable format, else as its little-endian bytes.
pub fn serialize<T: Fixed + Serialize, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    if s.is_human_readable() {
        value.serialize(s)
    } else {
        s.serialize_bytes(&value.to_le())
    }
}

/// Reads what [`serialize`] wrote.
pub fn deserialize<'de, T: Fixed + Deserialize<'de>, D: Deserializer<'de>>(
    d: D,
) -> Result<T, D::Error> {
    if d.is_human_readable() {
        return T::deserialize(d);
    }
    let bytes = <&[u8]>::deserialize(d)?;
    T::from_le(bytes).ok_or_else(|| D::Error::invalid_length(bytes.len(), &"whole integers"))
}
