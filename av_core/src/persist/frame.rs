//! The frame around every saved payload: magic and kind tag, payload version, length, CRC-32.

use std::ops::RangeInclusive;

use crate::error::{Error, Result};

/// The first seven bytes of every frame; the eighth is the [`Kind`] tag.
pub const MAGIC_PREFIX: &[u8; 7] = b"AVCORE\0";

/// Bytes of the frame around a payload: magic (with the kind tag), version, length, CRC-32.
pub const FRAME_LEN: usize = 8 + 4 + 8 + 4;

/// The argument every decoding error names: the saved data.
pub(crate) const DATA: &str = "data";

/// The error of saved data that is no state of this build: a state error naming [`DATA`].
pub(crate) fn broken(message: impl Into<String>) -> Error {
    Error::state(DATA, message)
}

/// What a frame holds, by the last byte of its magic.
///
/// # Example
///
/// ```rust
/// use av_core::persist::Kind;
///
/// assert_eq!(&Kind::Planner.magic(), b"AVCORE\0P");
/// assert_eq!(Kind::of(b"AVCORE\0C\x01\0\0\0"), Some(Kind::CostTables));
/// assert_eq!(Kind::of(b"AVCORE\0Z"), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// An [`AcceptanceEstimator`](crate::AcceptanceEstimator)'s state
    /// ([`crate::persist::estimator`]).
    Estimator,
    /// A [`VerificationPlanner`](crate::planner::VerificationPlanner)'s state.
    Planner,
    /// [`CostTables`](crate::cost_tables::CostTables).
    CostTables,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::Estimator, Kind::Planner, Kind::CostTables];

    /// The kind tag, the eighth byte of the magic.
    pub const fn tag(self) -> u8 {
        match self {
            Kind::Estimator => b'E',
            Kind::Planner => b'P',
            Kind::CostTables => b'C',
        }
    }

    /// The eight magic bytes a frame of this kind starts with.
    pub const fn magic(self) -> [u8; 8] {
        let p = MAGIC_PREFIX;
        [p[0], p[1], p[2], p[3], p[4], p[5], p[6], self.tag()]
    }

    /// What the kind holds, for messages (`"an av_core planner state"`).
    pub const fn describe(self) -> &'static str {
        match self {
            Kind::Estimator => "an av_core estimator state",
            Kind::Planner => "an av_core planner state",
            Kind::CostTables => "av_core cost tables",
        }
    }

    /// The kind of the frame `bytes` starts with, if it is one.
    pub fn of(bytes: &[u8]) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|kind| bytes.get(..8) == Some(&kind.magic()[..]))
    }
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) of `bytes`, by [`crc32fast`].
///
/// # Example
///
/// ```rust
/// use av_core::persist::crc32;
///
/// assert_eq!(crc32(b"123456789"), 0xCBF4_3926); // the standard check value
/// assert_eq!(crc32(b""), 0);
/// ```
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Wraps `payload` as `magic | version | length | payload | CRC-32` (little-endian; the CRC
/// covers everything before it).
///
/// # Example
///
/// ```rust
/// use av_core::persist::{crc32, frame, unframe, Kind, FRAME_LEN};
///
/// let bytes = frame(Kind::CostTables, 3, b"payload");
/// assert_eq!(bytes.len(), FRAME_LEN + 7);
/// let (body, checksum) = bytes.split_at(bytes.len() - 4);
/// assert_eq!(checksum, crc32(body).to_le_bytes());
/// let read = unframe(Kind::CostTables, 1..=3, &bytes)?;
/// assert_eq!((read.version, read.payload), (3, &b"payload"[..]));
/// assert!(unframe(Kind::Planner, 1..=3, &bytes).is_err()); // another kind
/// assert!(unframe(Kind::CostTables, 1..=2, &bytes).is_err()); // a newer version
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn frame(kind: Kind, version: u32, payload: &[u8]) -> Vec<u8> {
    frame_with(kind, version, payload.len(), |mut out| {
        out.extend(payload);
        out
    })
}

/// [`frame`] of the payload `write` appends to the vector it is given (`capacity`: the
/// payload's expected length), written in place.
pub(crate) fn frame_with(
    kind: Kind,
    version: u32,
    capacity: usize,
    write: impl FnOnce(Vec<u8>) -> Vec<u8>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity + FRAME_LEN);
    out.extend(kind.magic());
    out.extend(version.to_le_bytes());
    out.extend([0; 8]);
    let mut out = write(out);
    let length = (out.len() - (FRAME_LEN - 4)) as u64;
    out[12..20].copy_from_slice(&length.to_le_bytes());
    let checksum = crc32(&out);
    out.extend(checksum.to_le_bytes());
    out
}

/// A checked frame: its payload version and payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The payload's format version (within the range the caller reads).
    pub version: u32,
    /// The payload.
    pub payload: &'a [u8],
}

/// Checks the frame written by [`frame`] (magic and kind tag, a version in `versions`, length,
/// checksum) and returns its payload. Every failure is an [`ErrorKind::State`] error naming
/// `data`.
///
/// [`ErrorKind::State`]: crate::ErrorKind::State
pub fn unframe(kind: Kind, versions: RangeInclusive<u32>, bytes: &[u8]) -> Result<Frame<'_>> {
    if bytes.get(..8) != Some(&kind.magic()[..]) {
        let found = Kind::of(bytes).map_or(String::new(), |k| format!(": {}", k.describe()));
        let expected = kind.describe();
        return Err(broken(format!("not {expected} (bad magic bytes{found})")));
    }
    let mut header = Reader { bytes: &bytes[8..] };
    let version = header.u32("the format version")?;
    if !versions.contains(&version) {
        let (first, last) = (versions.start(), versions.end());
        let reads = match first == last {
            true => first.to_string(),
            false => format!("{first} to {last}"),
        };
        let message =
            format!("format version {version} is not supported (this build reads {reads})");
        return Err(broken(message));
    }
    let length = header.u64("the payload length")?;
    let expected = length.checked_add(FRAME_LEN as u64);
    if expected != Some(bytes.len() as u64) {
        let all = bytes.len();
        return Err(broken(format!(
            "length mismatch: header promises a {length}-byte payload, the data has {all} bytes \
             in all (truncated or padded)"
        )));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    let (stored, actual) = (Reader { bytes: tail }.u32("the checksum")?, crc32(body));
    if stored != actual {
        let message = format!("checksum mismatch (stored {stored:#010x}, computed {actual:#010x})");
        return Err(broken(message + ": corrupt"));
    }
    Ok(Frame {
        version,
        payload: &body[FRAME_LEN - 4..],
    })
}

/// A little-endian cursor that fails with a state error instead of reading past the end.
pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
}

/// Reads of one number each.
macro_rules! numbers {
    ($($method:ident -> $int:ty;)*) => {$(
        pub(crate) fn $method(&mut self, what: &str) -> Result<$int> {
            self.take().map(<$int>::from_le_bytes).ok_or_else(|| truncated(what))
        }
    )*};
}

fn truncated(what: &str) -> Error {
    broken(format!("truncated while reading {what}"))
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.bytes.split_first_chunk::<N>()?;
        self.bytes = rest;
        Some(*head)
    }

    numbers! {
        u8 -> u8;
        u32 -> u32;
        u64 -> u64;
        f64 -> f64;
        i128 -> i128;
    }

    /// A length-prefixed `f64` array (`u64` length, then the values), refusing a length the
    /// data cannot hold before allocating anything.
    pub(crate) fn f64s(&mut self, what: &str) -> Result<Vec<f64>> {
        let len = self.words(what)?;
        (0..len).map(|_| self.f64(what)).collect()
    }

    /// A length-prefixed `u64` array, as [`f64s`](Self::f64s).
    pub(crate) fn u64s(&mut self, what: &str) -> Result<Vec<u64>> {
        let len = self.words(what)?;
        (0..len).map(|_| self.u64(what)).collect()
    }

    /// The length of an array of 8-byte words, refused if the data cannot hold it.
    fn words(&mut self, what: &str) -> Result<u64> {
        let len = self.u64(what)?;
        if len > (self.bytes.len() / 8) as u64 {
            return Err(broken(format!("{what} length {len} exceeds the data")));
        }
        Ok(len)
    }

    /// Fails unless every byte was read.
    pub(crate) fn finish(&self) -> Result<()> {
        match self.bytes.len() {
            0 => Ok(()),
            n => Err(broken(format!("{n} unexpected bytes after the last field"))),
        }
    }
}

/// Appends a length-prefixed `f64` array (the layout [`Reader::f64s`] reads).
pub(crate) fn put_f64s(out: &mut Vec<u8>, values: &[f64]) {
    out.extend((values.len() as u64).to_le_bytes());
    out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn a_frame_of_another_kind_says_what_it_is() {
        let bytes = frame(Kind::Estimator, 1, b"x");
        let err = unframe(Kind::Planner, 1..=2, &bytes).unwrap_err();
        assert_eq!(err.kind, crate::ErrorKind::State);
        assert_eq!(
            err.message,
            "not an av_core planner state (bad magic bytes: an av_core estimator state)"
        );
        let err = unframe(Kind::Planner, 1..=2, b"AVCORE").unwrap_err();
        assert_eq!(
            err.message,
            "not an av_core planner state (bad magic bytes)"
        );
        let err = unframe(Kind::Estimator, 2..=3, &bytes).unwrap_err();
        assert_eq!(
            err.message,
            "format version 1 is not supported (this build reads 2 to 3)"
        );
    }

    #[test]
    fn every_truncation_and_bit_flip_of_a_frame_is_refused() {
        let bytes = frame(Kind::CostTables, 1, b"a payload of some length");
        assert!(unframe(Kind::CostTables, 1..=1, &bytes).is_ok());
        for cut in 0..bytes.len() {
            assert!(unframe(Kind::CostTables, 1..=1, &bytes[..cut]).is_err());
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut corrupt = bytes.clone();
                corrupt[i] ^= 1 << bit;
                assert!(
                    unframe(Kind::CostTables, 1..=1, &corrupt).is_err(),
                    "{i} {bit}"
                );
            }
        }
    }

    #[test]
    fn arrays_refuse_lengths_the_data_cannot_hold() {
        let mut out = Vec::new();
        put_f64s(&mut out, &[1.5, -0.25]);
        assert_eq!(Reader { bytes: &out }.f64s("t").unwrap(), [1.5, -0.25]);
        let mut lying = out.clone();
        lying[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        let err = Reader { bytes: &lying }.f64s("t").unwrap_err();
        assert_eq!(
            err.message,
            format!("t length {} exceeds the data", u64::MAX)
        );
    }
}
