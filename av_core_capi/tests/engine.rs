//! The entry points an engine written in C needs besides the estimator and the planner
//! (`avc_draft_log_odds`, `avc_cost_tables_from_json`, `avc_cost_tables_to_json`), called from
//! Rust: they give the core's bits, and every rejected call names its argument and writes
//! nothing.

#![cfg(feature = "capi")]

mod common;

use std::ffi::{c_char, CStr};
use std::ptr::{null, null_mut};

use av_core::cost_tables::{CostTables, DrafterKind};
use av_core::features::sampling::draft_log_odds_sampling;
use av_core_capi::cost_tables::*;
use av_core_capi::cost_tables_json::*;
use av_core_capi::features::*;
use av_core_capi::status::*;
use common::{last_error, rejected};

/// The settings of one call; empty arrays are passed as NULL with length 0.
struct Settings<'a> {
    temperature: &'a [f32],
    top_k: &'a [i32],
    top_p: &'a [f32],
}

const DEFAULTS: Settings<'static> = Settings {
    temperature: &[],
    top_k: &[],
    top_p: &[],
};

fn ptr_or_null<T>(values: &[T]) -> *const T {
    if values.is_empty() {
        null()
    } else {
        values.as_ptr()
    }
}

/// Calls avc_draft_log_odds into `out` (which the caller pre-fills to see what is written).
fn log_odds(
    logits: &[f32],
    rows: usize,
    vocab: usize,
    s: &Settings<'_>,
    limit: f32,
    out: &mut [f32],
) -> AvcStatus {
    // SAFETY: every pointer is a live slice (or NULL with length 0) for the stated length; the
    // logits slice holds at least rows * vocab values wherever a call reads them.
    unsafe {
        avc_draft_log_odds(
            logits.as_ptr(),
            rows,
            vocab,
            ptr_or_null(s.temperature),
            s.temperature.len(),
            ptr_or_null(s.top_k),
            s.top_k.len(),
            ptr_or_null(s.top_p),
            s.top_p.len(),
            limit,
            out.as_mut_ptr(),
            out.len(),
        )
    }
}

/// Deterministic logits in roughly [-8, 8].
fn logits(rows: usize, vocab: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..rows * vocab)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 16.0
        })
        .collect()
}

/// The core's feature of the same rows (`av_core::features::sampling`, tested there against a
/// float64 reference written from the definition).
fn core_features(z: &[f32], rows: usize, vocab: usize, s: &Settings<'_>, limit: f32) -> Vec<f32> {
    let k64: Vec<i64> = s.top_k.iter().map(|&k| i64::from(k)).collect();
    let mut out = vec![0.0f32; rows];
    draft_log_odds_sampling(
        z,
        rows,
        vocab,
        s.temperature,
        &k64,
        s.top_p,
        limit,
        &mut out,
    )
    .unwrap();
    out
}

#[test]
fn features_are_the_cores_bit_for_bit() {
    let (rows, vocab) = (5, 700);
    let z = logits(rows, vocab, 7);
    let settings = Settings {
        temperature: &[1.0, 0.6, 0.0, 1.7, 1.0],
        top_k: &[0, 50, -1, 3, 0],
        top_p: &[1.0, 0.9, 0.5, 1.0, 0.3],
    };
    for (s, limit) in [(&settings, 40.0f32), (&DEFAULTS, 40.0), (&settings, 0.5)] {
        let mut got = vec![f32::NAN; rows];
        assert_eq!(log_odds(&z, rows, vocab, s, limit, &mut got), AVC_OK);
        let want = core_features(&z, rows, vocab, s, limit);
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "limit {limit}"
        );
        assert!(got.iter().all(|x| x.abs() <= limit));
    }
    // The settings change the result (the arrays are read, row by row).
    let mut truncated = vec![0.0f32; rows];
    let mut plain = vec![0.0f32; rows];
    assert_eq!(
        log_odds(&z, rows, vocab, &settings, 40.0, &mut truncated),
        AVC_OK
    );
    assert_eq!(
        log_odds(&z, rows, vocab, &DEFAULTS, 40.0, &mut plain),
        AVC_OK
    );
    assert_eq!(truncated[0], plain[0]);
    assert!(
        (1..rows).all(|r| truncated[r] != plain[r]),
        "{truncated:?} {plain:?}"
    );
}

#[test]
fn zero_rows_write_nothing_and_null_is_fine_with_length_zero() {
    // SAFETY: every array is NULL with length 0.
    let status = unsafe {
        avc_draft_log_odds(
            null(),
            0,
            10,
            null(),
            0,
            null(),
            0,
            null(),
            0,
            40.0,
            null_mut(),
            0,
        )
    };
    assert_eq!(status, AVC_OK, "{}", last_error());
}

#[test]
fn rejected_feature_calls_name_the_argument_and_write_nothing() {
    let z = logits(2, 4, 3);
    let check = |rows: usize, vocab: usize, s: Settings<'_>, limit: f32, out_len: usize| {
        let mut out = vec![9.0f32; out_len];
        let status = log_odds(&z, rows, vocab, &s, limit, &mut out);
        assert!(out.iter().all(|&v| v == 9.0), "an output was written");
        status
    };
    let s = |temperature, top_k, top_p| Settings {
        temperature,
        top_k,
        top_p,
    };
    let name = "avc_draft_log_odds: ";
    rejected(
        check(2, 0, s(&[], &[], &[]), 40.0, 2),
        AVC_ERR_VALUE,
        &format!("{name}vocab: must be at least 1"),
    );
    rejected(
        check(2, 4, s(&[1.0], &[], &[]), 40.0, 2),
        AVC_ERR_VALUE,
        &format!("{name}temperature: must have one entry per row (2) or none, got 1"),
    );
    rejected(
        check(2, 4, s(&[1.0, f32::NAN], &[], &[]), 40.0, 2),
        AVC_ERR_VALUE,
        &format!("{name}temperature: [1] = NaN must be finite"),
    );
    rejected(
        check(2, 4, s(&[], &[0, -3], &[]), 40.0, 2),
        AVC_ERR_VALUE,
        &format!("{name}top_k: [1] = -3 must be >= 1, or 0 or -1 for no top-k"),
    );
    rejected(
        check(2, 4, s(&[], &[], &[0.5, -0.1]), 40.0, 2),
        AVC_ERR_VALUE,
        &format!("{name}top_p: [1] = -0.1 must lie in (0, 1]"),
    );
    rejected(
        check(2, 4, s(&[], &[], &[]), 40.0, 3),
        AVC_ERR_VALUE,
        &format!("{name}features_len: must equal num_rows = 2, got 3"),
    );
    rejected(
        check(2, 4, s(&[], &[], &[]), f32::INFINITY, 2),
        AVC_ERR_VALUE,
        &format!("{name}max_log_odds: must be finite and positive"),
    );
    // SAFETY: rejected before any read: NULL logits with a non-zero length.
    let status = unsafe {
        avc_draft_log_odds(
            null(),
            2,
            4,
            null(),
            0,
            null(),
            0,
            null(),
            0,
            40.0,
            null_mut(),
            0,
        )
    };
    rejected(status, AVC_ERR_NULL, &format!("{name}logits: is NULL"));
    // SAFETY: rows * vocab overflows, which is refused before any pointer is read.
    let status = unsafe {
        avc_draft_log_odds(
            z.as_ptr(),
            usize::MAX,
            2,
            null(),
            0,
            null(),
            0,
            null(),
            0,
            40.0,
            null_mut(),
            0,
        )
    };
    rejected(status, AVC_ERR_VALUE, &format!("{name}num_rows: "));
    // features overlapping the logits.
    let mut buffer = logits(3, 4, 5);
    let before = buffer.clone();
    let ptr = buffer.as_mut_ptr();
    // SAFETY: both ranges lie inside `buffer`; the overlapping call is refused before writing.
    let status = unsafe {
        avc_draft_log_odds(
            ptr,
            2,
            4,
            null(),
            0,
            null(),
            0,
            null(),
            0,
            40.0,
            ptr.add(6),
            2,
        )
    };
    rejected(
        status,
        AVC_ERR_VALUE,
        &format!("{name}features: overlaps logits"),
    );
    assert_eq!(buffer, before);
}

fn from_json(text: &[u8]) -> (AvcStatus, *mut AvcCostTables) {
    let mut handle = std::ptr::dangling_mut::<AvcCostTables>();
    // SAFETY: `text` is a live byte slice; `handle` a writable local.
    let status =
        unsafe { avc_cost_tables_from_json(text.as_ptr().cast(), text.len(), &mut handle) };
    (status, handle)
}

fn to_json(handle: *const AvcCostTables) -> String {
    let mut len = 0usize;
    // SAFETY: a live handle; NULL with capacity 0 is the size query.
    let status = unsafe { avc_cost_tables_to_json(handle, null_mut(), 0, &mut len) };
    assert_eq!(status, AVC_ERR_BUFFER_TOO_SMALL);
    let mut buf = vec![1 as c_char; len];
    // One byte short: refused, nothing written.
    // SAFETY: `buf` has `len` writable bytes; cap len - 1 stays inside it.
    let status = unsafe { avc_cost_tables_to_json(handle, buf.as_mut_ptr(), len - 1, &mut len) };
    rejected(
        status,
        AVC_ERR_BUFFER_TOO_SMALL,
        "avc_cost_tables_to_json: buf: cap = ",
    );
    assert!(buf.iter().all(|&b| b == 1));
    // SAFETY: `buf` has exactly `len` writable bytes.
    let status = unsafe { avc_cost_tables_to_json(handle, buf.as_mut_ptr(), len, &mut len) };
    assert_eq!(status, AVC_OK, "{}", last_error());
    assert_eq!(buf[len - 1], 0);
    // SAFETY: the text is NUL-terminated inside `buf`.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn json_round_trips_bit_for_bit_and_matches_the_core() {
    let tables = CostTables::from_curves(
        &[(1.0, 34.0), (2.0, 47.0), (8.0, 120.0)],
        &[(1.0, 36.0), (3.0, 91.1), (40.0, 889.0)],
        8,
        40,
        0,
    )
    .unwrap()
    .with_drafter(DrafterKind::Autoregressive, 4)
    .unwrap();
    let text = tables.to_json();
    let (status, handle) = from_json(text.as_bytes());
    assert_eq!(status, AVC_OK, "{}", last_error());
    let mut draft = vec![0.0; 9];
    let mut verify = vec![0.0; 41];
    // SAFETY: a live handle; both arrays have the lengths passed.
    let status =
        unsafe { avc_cost_tables_copy(handle, draft.as_mut_ptr(), 9, verify.as_mut_ptr(), 41) };
    assert_eq!(status, AVC_OK, "{}", last_error());
    assert_eq!(draft, tables.draft_ms());
    assert_eq!(verify, tables.verify_ms());
    assert_eq!(to_json(handle), text);
    // Whitespace and key order are free.
    let (status, other) =
        from_json(b"\n{ \"verify_ms\" : [1.5, 2],\n  \"draft_ms\": [0, 0.25] }\n");
    assert_eq!(status, AVC_OK, "{}", last_error());
    assert_eq!(
        to_json(other),
        r#"{"draft_ms": [0.0, 0.25], "verify_ms": [1.5, 2.0]}"#
    );
    // SAFETY: both handles are live and freed once.
    unsafe {
        assert_eq!(avc_cost_tables_free(handle), AVC_OK);
        assert_eq!(avc_cost_tables_free(other), AVC_OK);
    }
}

#[test]
fn bad_json_is_refused_naming_what_is_wrong_and_leaves_no_handle() {
    let cases: [(&[u8], &str); 6] = [
        (b"", "avc_cost_tables_from_json: json: "),
        (
            b"{\"draft_ms\": [0.5]}",
            "avc_cost_tables_from_json: json: ",
        ),
        (
            b"{\"draft_ms\": [0.5], \"verify_ms\": [1], \"extra\": 1}",
            "avc_cost_tables_from_json: json: ",
        ),
        (
            b"{\"draft_ms\": [0.5], \"verify_ms\": [0]}",
            "avc_cost_tables_from_json: verify_ms: ",
        ),
        (
            b"{\"draft_ms\": [0.5], \"verify_ms\": [1], \"draft_depth_ms\": [1, 2]}",
            "avc_cost_tables_from_json: draft_depth_ms: ",
        ),
        (
            b"{\"draft_ms\": [0.5], \"verify_ms\": [\xff]}",
            "avc_cost_tables_from_json: text: is not UTF-8 (invalid byte at offset 34)",
        ),
    ];
    for (text, prefix) in cases {
        let (status, handle) = from_json(text);
        rejected(status, AVC_ERR_VALUE, prefix);
        assert!(handle.is_null());
    }
    // A trailing NUL is text after the object.
    let (status, handle) = from_json(b"{\"draft_ms\": [0.5], \"verify_ms\": [1]}\0");
    rejected(status, AVC_ERR_VALUE, "avc_cost_tables_from_json: json: ");
    assert!(handle.is_null());
    // SAFETY: NULL text with a length, and a NULL handle output: both refused before use.
    unsafe {
        let mut handle = null_mut();
        rejected(
            avc_cost_tables_from_json(null(), 3, &mut handle),
            AVC_ERR_NULL,
            "avc_cost_tables_from_json: text: is NULL",
        );
        rejected(
            avc_cost_tables_from_json(c"{}".as_ptr(), 2, null_mut()),
            AVC_ERR_NULL,
            "avc_cost_tables_from_json: tables_out: must not be NULL",
        );
        let mut len = 0;
        rejected(
            avc_cost_tables_to_json(null(), null_mut(), 0, &mut len),
            AVC_ERR_NULL,
            "avc_cost_tables_to_json: tables",
        );
    }
}
