//! The frame around every saved payload: magic and kind tag, payload version, length, CRC-32.

use std::ops::RangeInclusive;

use crate::error::{Error, Result};

/// The first seven bytes of every frame; the eighth is the [`Kind`] tag.
pub const MAGIC_PREFIX: &[u8; 7] = b"AVCORE\0";

/// Bytes of the frame around a payload: magic (with the kind tag), version, length, CRC-32.
pub const FRAME_LEN: usize = 8 + 4 + 8 + 4;

/// The argument every decoding error names: the saved data.
pub(crate) const DATA: &str = "data";

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

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320) of `bytes`.
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
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
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
    let mut out = Vec::with_capacity(payload.len() + FRAME_LEN);
    out.extend(kind.magic());
    out.extend(version.to_le_bytes());
    out.extend((payload.len() as u64).to_le_bytes());
    out.extend(payload);
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
    let magic = kind.magic();
    if bytes.get(..8) != Some(&magic[..]) {
        let found = match Kind::of(bytes) {
            Some(other) => format!(": {}", other.describe()),
            None => String::new(),
        };
        return Err(Error::state(
            DATA,
            format!("not {} (bad magic bytes{found})", kind.describe()),
        ));
    }
    let mut header = Reader { bytes: &bytes[8..] };
    let version = header.u32("the format version")?;
    if !versions.contains(&version) {
        let reads = if versions.start() == versions.end() {
            versions.start().to_string()
        } else {
            format!("{} to {}", versions.start(), versions.end())
        };
        return Err(Error::state(
            DATA,
            format!("format version {version} is not supported (this build reads {reads})"),
        ));
    }
    let length = header.u64("the payload length")?;
    let expected = (FRAME_LEN as u64 - 4)
        .checked_add(length)
        .and_then(|n| n.checked_add(4));
    if expected != Some(bytes.len() as u64) {
        return Err(Error::state(
            DATA,
            format!(
                "length mismatch: header promises a {length}-byte payload, the data has {} bytes \
                 in all (truncated or padded)",
                bytes.len()
            ),
        ));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
    let actual = crc32(body);
    if stored != actual {
        return Err(Error::state(
            DATA,
            format!("checksum mismatch (stored {stored:#010x}, computed {actual:#010x}): corrupt"),
        ));
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

impl Reader<'_> {
    pub(crate) fn take<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        if self.bytes.len() < N {
            return Err(Error::state(
                DATA,
                format!("truncated while reading {what}"),
            ));
        }
        let (head, rest) = self.bytes.split_at(N);
        self.bytes = rest;
        Ok(head.try_into().expect("split at N"))
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        self.take::<1>(what).map(|[b]| b)
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        self.take::<4>(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        self.take::<8>(what).map(u64::from_le_bytes)
    }

    pub(crate) fn f64(&mut self, what: &str) -> Result<f64> {
        self.take::<8>(what).map(f64::from_le_bytes)
    }

    pub(crate) fn i128(&mut self, what: &str) -> Result<i128> {
        self.take::<16>(what).map(i128::from_le_bytes)
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
            return Err(Error::state(
                DATA,
                format!("{what} length {len} exceeds the data"),
            ));
        }
        Ok(len)
    }

    /// Fails unless every byte was read.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(Error::state(
                DATA,
                format!("{} unexpected bytes after the last field", self.bytes.len()),
            ))
        }
    }
}

/// Appends a length-prefixed `f64` array (the layout [`Reader::f64s`] reads).
pub(crate) fn put_f64s(out: &mut Vec<u8>, values: &[f64]) {
    out.extend((values.len() as u64).to_le_bytes());
    for value in values {
        out.extend(value.to_le_bytes());
    }
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
