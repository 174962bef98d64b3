//! Cost tables as JSON text (`{"draft_ms": [...], "verify_ms": [...]}`, plus `"draft_depth_ms"`
//! when there is a depth table): the file format `CostTables.to_json()` writes in Python, so a
//! C program reads the tables a profiler wrote without a JSON library of its own.

use std::ffi::c_char;

use av_core::cost_tables::CostTables;

use crate::cost_tables::{publish_tables, AvcCostTables};
use crate::handle::borrow;
use crate::raw::{input, out_value, output};
use crate::status::{guard, AvcStatus, FfiError};

/// Tables from JSON text in the format avc_cost_tables_to_json and the Python API's
/// CostTables.to_json write: {"draft_ms": [...], "verify_ms": [...]} and, optionally,
/// "draft_depth_ms": [...] (any JSON whitespace, keys in any order), validated as
/// avc_cost_tables_new and avc_cost_tables_with_draft_depth validate. text holds len bytes of
/// UTF-8 (no terminating NUL needed; a trailing NUL is refused as text after the object). On
/// success *tables_out is a new handle owned by the caller (free with avc_cost_tables_free); on
/// failure it is NULL.
///
/// Errors: AVC_ERR_NULL (text NULL with len > 0, tables_out NULL); AVC_ERR_VALUE naming "text"
/// for bytes that are not UTF-8, "json" for text that is not the format (invalid JSON, a
/// missing, unknown or duplicate key, trailing text), or the table ("draft_ms", "verify_ms",
/// "draft_depth_ms") whose values the tables cannot hold.
///
/// # Safety
///
/// text must point to len readable bytes (or be NULL with len = 0); tables_out must be NULL
/// (an error) or point to a writable avc_cost_tables pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_from_json(
    text: *const c_char,
    len: usize,
    tables_out: *mut *mut AvcCostTables,
) -> AvcStatus {
    guard("avc_cost_tables_from_json", || {
        // SAFETY: the caller's contract covers both pointers.
        let (out, bytes) = unsafe {
            let out = out_value(tables_out, "tables_out")?;
            out.write(std::ptr::null_mut());
            (out, input(text.cast::<u8>(), len, "text")?)
        };
        let text = std::str::from_utf8(bytes).map_err(|e| {
            FfiError::value(
                "text",
                format!("is not UTF-8 (invalid byte at offset {})", e.valid_up_to()),
            )
        })?;
        out.write(publish_tables(CostTables::from_json(text)?));
        Ok(())
    })
}

/// Writes the tables as JSON text (avc_cost_tables_from_json's format; every number in the
/// shortest form that parses back to the same bits, so the round trip is exact), followed by
/// a terminating NUL. *len_out is set to the size needed, NUL included; if cap is smaller,
/// returns AVC_ERR_BUFFER_TOO_SMALL and writes nothing to buf (a first call with buf = NULL,
/// cap = 0 learns the size).
///
/// # Safety
///
/// tables must be NULL or live cost tables; buf must point to cap writable bytes (or be NULL
/// with cap = 0); len_out must be NULL (an error) or point to a writable size_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_to_json(
    tables: *const AvcCostTables,
    buf: *mut c_char,
    cap: usize,
    len_out: *mut usize,
) -> AvcStatus {
    guard("avc_cost_tables_to_json", || {
        // SAFETY: the caller's contract covers each pointer.
        let (handle, out, len) = unsafe {
            (
                borrow(tables, "tables")?,
                output(buf, cap, "buf")?,
                out_value(len_out, "len_out")?,
            )
        };
        // JSON text is ASCII here (numbers, keys, punctuation), so each byte is one c_char.
        let text: Vec<c_char> = handle
            .tables
            .to_json()
            .bytes()
            .chain(std::iter::once(0))
            .map(|b| b as c_char)
            .collect();
        out.write_sized(&text, &len, |cap, needed| {
            format!("buf: cap = {cap} bytes, the text needs {needed} with its NUL (written to *len_out)")
        })
    })
}
