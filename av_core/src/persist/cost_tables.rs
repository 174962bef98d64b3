//! The cost tables' formats: a framed binary payload, and the JSON text of earlier releases.
//!
//! Binary payload, version 1 (little-endian):
//!
//! ```text
//! draft_ms          u64 length, then f64 × length
//! verify_ms         u64 length, then f64 × length
//! draft-depth flag  u8: 0 none, 1 a table follows
//! draft_depth_ms    (flag 1) u64 length, then f64 × length
//! ```
//!
//! JSON: `{"draft_ms": [...], "verify_ms": [...]}` plus `"draft_depth_ms"` when there is a depth
//! table, every number in the shortest form that parses back to the same bits. It is parsed by
//! `serde_json` (any JSON whitespace, keys in any order; unknown or duplicate keys, non-finite
//! numbers and trailing text are refused).

use serde::Deserialize;

use super::frame::{broken, frame, put_f64s, unframe, Kind, Reader, DATA, FRAME_LEN};
use crate::cost_tables::{CostTables, MAX_DRAFT_DEPTH, MAX_TABLE_LEN};
use crate::error::{Error, Result};

/// Version of the cost tables' binary payload written by this build (and the newest it reads).
pub const COST_TABLES_VERSION: u32 = 1;

/// Length of the binary payload (without the frame) of tables of `draft_len` and `verify_len`
/// entries and, when there is one, a draft-depth table of `depth_len` entries.
pub(crate) const fn payload_len(
    draft_len: usize,
    verify_len: usize,
    depth_len: Option<usize>,
) -> usize {
    let depth = match depth_len {
        Some(len) => 8 + 8 * len,
        None => 0,
    };
    (8 + 8 * draft_len) + (8 + 8 * verify_len) + 1 + depth
}

/// The longest framed cost tables (both tables at [`MAX_TABLE_LEN`], the deepest depth table).
pub(crate) const MAX_ENCODED_LEN: usize =
    FRAME_LEN + payload_len(MAX_TABLE_LEN, MAX_TABLE_LEN, Some(MAX_DRAFT_DEPTH + 1));

/// Appends the binary payload of `tables` (module docs).
pub(crate) fn put_tables(out: &mut Vec<u8>, tables: &CostTables) {
    put_f64s(out, tables.draft_ms());
    put_f64s(out, tables.verify_ms());
    match tables.draft_depth_ms() {
        None => out.push(0),
        Some(depth) => {
            out.push(1);
            put_f64s(out, depth);
        }
    }
}

/// Reads a binary payload written by [`put_tables`] and validates it like
/// [`CostTables::new`]; a table no `CostTables` could hold is a state error.
pub(crate) fn read_tables(r: &mut Reader<'_>) -> Result<CostTables> {
    let draft = r.f64s("draft_ms")?;
    let verify = r.f64s("verify_ms")?;
    let depth = match r.u8("the draft-depth flag")? {
        0 => None,
        1 => Some(r.f64s("draft_depth_ms")?),
        other => return Err(broken(format!("draft-depth flag {other} is not 0 or 1"))),
    };
    let invalid = |e: Error| e.in_saved(DATA, "the saved cost tables are invalid");
    let tables = CostTables::new(draft, verify).map_err(invalid)?;
    match depth {
        None => Ok(tables),
        Some(depth) => tables.with_draft_depth(depth).map_err(invalid),
    }
}

/// `tables` as framed bytes.
pub(crate) fn encode(tables: &CostTables) -> Vec<u8> {
    let len = payload_len(
        tables.draft_ms().len(),
        tables.verify_ms().len(),
        tables.draft_depth_ms().map(<[f64]>::len),
    );
    let mut payload = Vec::with_capacity(len);
    put_tables(&mut payload, tables);
    debug_assert_eq!(payload.len(), len);
    frame(Kind::CostTables, COST_TABLES_VERSION, &payload)
}

/// Tables from [`encode`]'s bytes.
pub(crate) fn decode(bytes: &[u8]) -> Result<CostTables> {
    let frame = unframe(Kind::CostTables, 1..=COST_TABLES_VERSION, bytes)?;
    let mut r = Reader {
        bytes: frame.payload,
    };
    let tables = read_tables(&mut r)?;
    r.finish()?;
    Ok(tables)
}

/// The JSON text (module docs).
pub(crate) fn to_json(tables: &CostTables) -> String {
    // `{:?}` is the shortest text that parses back to the same bits, and JSON for a finite
    // value ("0.5", "1e-6", "100.0").
    let array = |values: &[f64]| {
        let values: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
        format!("[{}]", values.join(", "))
    };
    let (draft, verify) = (array(tables.draft_ms()), array(tables.verify_ms()));
    let depth = tables.draft_depth_ms().map(array);
    let depth = depth.map_or(String::new(), |d| format!(", \"draft_depth_ms\": {d}"));
    format!("{{\"draft_ms\": {draft}, \"verify_ms\": {verify}{depth}}}")
}

/// The JSON object, as `serde` reads it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TablesJson {
    draft_ms: Vec<f64>,
    verify_ms: Vec<f64>,
    #[serde(default)]
    draft_depth_ms: Option<Vec<f64>>,
}

/// Tables from the JSON text, validated as [`CostTables::new`] does (whose errors keep their
/// argument: `verify_ms`, `draft_depth_ms`); text that is not the format is a state error
/// naming `json`.
pub(crate) fn from_json(text: &str) -> Result<CostTables> {
    let parsed: TablesJson =
        serde_json::from_str(text).map_err(|e| Error::state("json", e.to_string()))?;
    let tables = CostTables::new(parsed.draft_ms, parsed.verify_ms)?;
    match parsed.draft_depth_ms {
        Some(depth) => tables.with_draft_depth(depth),
        None => Ok(tables),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost_tables::DrafterKind;
    use crate::ErrorKind;

    fn sample() -> CostTables {
        CostTables::new(vec![0.0, 0.1, 1e-300], vec![1e-6, 0.3, 12345.678, 1e22]).unwrap()
    }

    #[test]
    fn bytes_round_trip_with_and_without_a_depth_table() {
        for tables in [
            sample(),
            sample()
                .with_drafter(DrafterKind::Autoregressive, 3)
                .unwrap(),
        ] {
            let bytes = encode(&tables);
            assert_eq!(&bytes[..8], b"AVCORE\0C");
            assert!(bytes.len() <= MAX_ENCODED_LEN);
            assert_eq!(decode(&bytes).unwrap(), tables);
        }
    }

    #[test]
    fn corrupt_bytes_are_state_errors() {
        let bytes = encode(&sample().with_drafter(DrafterKind::Parallel, 2).unwrap());
        for cut in 0..bytes.len() {
            let err = decode(&bytes[..cut]).unwrap_err();
            assert_eq!((err.kind, err.argument), (ErrorKind::State, "data"));
        }
        // A well-framed payload whose table no CostTables could hold.
        let mut payload = Vec::new();
        put_f64s(&mut payload, &[0.0]);
        put_f64s(&mut payload, &[0.0]);
        payload.push(0);
        let err = decode(&frame(Kind::CostTables, 1, &payload)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::State);
        assert_eq!(
            err.to_string(),
            "data: the saved cost tables are invalid: verify_ms: [0] = 0 must be finite and > 0"
        );
        let mut payload = Vec::new();
        put_f64s(&mut payload, &[0.0]);
        put_f64s(&mut payload, &[1.0]);
        payload.push(2);
        let err = decode(&frame(Kind::CostTables, 1, &payload)).unwrap_err();
        assert_eq!(err.message, "draft-depth flag 2 is not 0 or 1");
        payload.pop();
        payload.extend([0, 9]);
        let err = decode(&frame(Kind::CostTables, 1, &payload)).unwrap_err();
        assert_eq!(err.message, "1 unexpected bytes after the last field");
        payload.pop();
        assert_eq!(
            decode(&frame(Kind::CostTables, 1, &payload))
                .unwrap()
                .verify_ms(),
            [1.0]
        );
    }

    #[test]
    fn json_keeps_negative_zero_and_subnormals_bit_for_bit() {
        let tables =
            CostTables::new(vec![-0.0, 5e-324, 2.2250738585072014e-308], vec![1.0]).unwrap();
        let back = from_json(&to_json(&tables)).unwrap();
        for (a, b) in back.draft_ms().iter().zip(tables.draft_ms()) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }
}
