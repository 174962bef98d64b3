//! Every state format of the crate, in one place: the frame, the payload of each stateful type,
//! and the payload versions.
//!
//! Every saved state is one frame (little-endian):
//!
//! ```text
//! magic            "AVCORE\0" and a kind tag byte: E estimator, P planner, C cost tables
//! payload version  u32, of that kind's payload (bumped on any change, never guessed)
//! payload length   u64
//! payload          the kind's fields (below)
//! CRC-32 (IEEE)    u32, of everything before it
//! ```
//!
//! | kind | payload | version written | versions read |
//! |---|---|---|---|
//! | [`Kind::Estimator`] | [`estimator`] (the declared state: the configuration by name, the statistics in postcard) | 4 | 1 to 4 |
//! | [`Kind::Planner`] | [`planner`] (embeds the cost tables' payload) | 2 | 1, 2 |
//! | [`Kind::CostTables`] | [`cost_tables`] | 1 | 1 |
//!
//! The estimator's state is declared once (serde derives on its types): its bytes are that
//! declaration (the configuration as its tree, by field name, then the rest in postcard's wire
//! format), and [`state_dict`] is the same declaration as a tree of plain values ([`tree`],
//! which each binding converts to its own values).
//!
//! Cost tables also read and write the JSON text of earlier releases
//! ([`CostTables::to_json`](crate::cost_tables::CostTables::to_json)).
//!
//! Decoding checks magic, kind, version, length and checksum before it reads a field, then
//! validates the state like any other input; arbitrary bytes give an
//! [`ErrorKind::State`](crate::ErrorKind::State) error naming `data`, never a panic. The core
//! only turns states into bytes and back: files are read and written by the bindings.
//!
//! # Example
//!
//! ```rust
//! use av_core::cost_tables::CostTables;
//! use av_core::persist::{Kind, Persistent};
//! use av_core::planner::{BudgetSource, VerificationPlanner};
//!
//! let tables = CostTables::new(vec![0.0, 0.5], vec![1.0; 9])?;
//! let bytes = tables.to_bytes();
//! assert_eq!(Kind::of(&bytes), Some(Kind::CostTables));
//! assert_eq!(CostTables::from_bytes(&bytes)?, tables);
//! assert!(bytes.len() <= CostTables::MAX_ENCODED_LEN);
//!
//! // Generic code (the bindings' save/load/pickling) goes through the trait.
//! fn round_trip<T: Persistent>(value: &T) -> av_core::Result<T> {
//!     T::decode(&value.encode())
//! }
//! let planner = VerificationPlanner::new(tables, 4, 1, BudgetSource::Previous)?;
//! assert_eq!(round_trip(&planner)?.to_bytes(), planner.to_bytes());
//! # Ok::<(), av_core::Error>(())
//! ```

pub mod cost_tables;

pub mod estimator;
pub mod fixed;

mod frame;
pub mod planner;
pub mod state_dict;
pub mod tree;

pub use frame::{crc32, frame, unframe, Frame, Kind, FRAME_LEN, MAGIC_PREFIX};

pub(crate) use frame::Reader;

use crate::cost_tables::CostTables;
use crate::error::Result;
use crate::planner::VerificationPlanner;
use crate::AcceptanceEstimator;

/// A type whose state the core saves: one frame of [`Persistent::KIND`], at most
/// [`Persistent::MAX_ENCODED_LEN`] bytes. The bindings derive `to_bytes`/`from_bytes`,
/// `save`/`load` and pickling from it.
pub trait Persistent: Sized {
    /// The kind tag of its frame.
    const KIND: Kind;
    /// The longest encoding: a reader never needs more bytes.
    const MAX_ENCODED_LEN: usize;
    /// The state as versioned, checksummed bytes.
    fn encode(&self) -> Vec<u8>;
    /// The state from [`Persistent::encode`]'s bytes (of this or an earlier release).
    fn decode(bytes: &[u8]) -> Result<Self>;
}

/// [`Persistent`] for each stateful type: its kind, its module's bound, and the functions that
/// write and read its bytes.
macro_rules! persistent {
    ($($type:ty: $kind:ident, $module:ident, $encode:path, $decode:path;)*) => {$(
        impl Persistent for $type {
            const KIND: Kind = Kind::$kind;
            const MAX_ENCODED_LEN: usize = $module::MAX_ENCODED_LEN;

            fn encode(&self) -> Vec<u8> {
                $encode(self)
            }

            fn decode(bytes: &[u8]) -> Result<Self> {
                $decode(bytes)
            }
        }
    )*};
}

persistent! {
    AcceptanceEstimator: Estimator, estimator, Self::to_bytes, Self::from_bytes;
    VerificationPlanner: Planner, planner, planner::encode, planner::decode;
    CostTables: CostTables, cost_tables, cost_tables::encode, cost_tables::decode;
}
