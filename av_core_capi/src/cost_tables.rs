//! `avc_cost_tables`: step-cost tables (`av_core::cost_tables::CostTables`).
//!
//! Immutable once built, so every query may run concurrently from any number of threads.

use std::sync::atomic::AtomicU64;

use av_core::cost_tables::{CostTables, DrafterKind};

use crate::handle::{borrow, destroy, publish, Handle};
use crate::raw::{input, out_value, output};
use crate::status::{guard, AvcStatus, FfiError, FfiResult};

/// Dense step-cost tables in milliseconds: draft_ms[r] for r requests and verify_ms[t] for t
/// target tokens. Create with avc_cost_tables_new / _from_curves / _from_samples, free with
/// avc_cost_tables_free. Immutable: every function may use one handle from many threads.
#[repr(C)]
pub struct AvcCostTables {
    tag: AtomicU64,
    pub(crate) tables: CostTables,
}

impl Handle for AvcCostTables {
    const MAGIC: u64 = u64::from_le_bytes(*b"avcCOSTS");
    const NAME: &'static str = "avc_cost_tables";
    fn tag(&self) -> &AtomicU64 {
        &self.tag
    }
}

/// One profiled point of a cost curve: a batch size and its measured cost in milliseconds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AvcCostPoint {
    /// Number of requests (draft curve) or target tokens (verify curve).
    pub size: f64,
    /// Measured cost in milliseconds.
    pub ms: f64,
}

/// Boxes and registers `tables` as a new handle.
pub(crate) fn publish_tables(tables: CostTables) -> *mut AvcCostTables {
    publish(AvcCostTables {
        tag: AtomicU64::new(AvcCostTables::MAGIC),
        tables,
    })
}

/// The points of a curve as `(size, ms)` pairs.
///
/// # Safety
///
/// `raw::input`'s contract for `len` points.
unsafe fn curve(
    points: *const AvcCostPoint,
    len: usize,
    argument: &'static str,
) -> FfiResult<Vec<(f64, f64)>> {
    // SAFETY: forwarded contract.
    let points = unsafe { input(points, len, argument)? };
    Ok(points.iter().map(|p| (p.size, p.ms)).collect())
}

type Builder = fn(&[(f64, f64)], &[(f64, f64)], usize, usize, usize) -> av_core::Result<CostTables>;

/// Shared body of `_from_curves` and `_from_samples`.
///
/// # Safety
///
/// The C contract of those two functions.
#[allow(clippy::too_many_arguments)]
unsafe fn build(
    function: &'static str,
    names: [&'static str; 2],
    builder: Builder,
    draft: *const AvcCostPoint,
    draft_len: usize,
    verify: *const AvcCostPoint,
    verify_len: usize,
    sizes: [usize; 3],
    tables_out: *mut *mut AvcCostTables,
) -> AvcStatus {
    guard(function, || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (out, draft, verify) = unsafe {
            let out = out_value(tables_out, "tables_out")?;
            out.write(std::ptr::null_mut());
            (
                out,
                curve(draft, draft_len, names[0])?,
                curve(verify, verify_len, names[1])?,
            )
        };
        let tables = builder(&draft, &verify, sizes[0], sizes[1], sizes[2])?;
        out.write(publish_tables(tables));
        Ok(())
    })
}

/// Tables from explicit arrays: draft_ms[r] for r = 0..draft_len-1 requests and verify_ms[t]
/// for t = 0..verify_len-1 tokens. Both non-empty and finite; draft costs non-negative,
/// verify costs positive. The arrays are copied. On success *tables_out is a new handle owned by the caller
/// (free with avc_cost_tables_free); on failure it is NULL.
///
/// # Safety
///
/// draft_ms and verify_ms must point to their stated number of readable doubles (or be NULL
/// with length 0, which is then rejected as empty); tables_out must be NULL (an error) or
/// point to a writable avc_cost_tables pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_new(
    draft_ms: *const f64,
    draft_len: usize,
    verify_ms: *const f64,
    verify_len: usize,
    tables_out: *mut *mut AvcCostTables,
) -> AvcStatus {
    guard("avc_cost_tables_new", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (out, draft, verify) = unsafe {
            let out = out_value(tables_out, "tables_out")?;
            out.write(std::ptr::null_mut());
            (
                out,
                input(draft_ms, draft_len, "draft_ms")?,
                input(verify_ms, verify_len, "verify_ms")?,
            )
        };
        let tables = CostTables::new(draft.to_vec(), verify.to_vec())?;
        out.write(publish_tables(tables));
        Ok(())
    })
}

/// Tables from profiled (size, ms) points with vLLM 0.33.0's semantics: running maximum of
/// the costs; a step function (next profiled size >= it) up to cudagraph_limit (0 = no
/// limit); linear interpolation between the points above the limit; the last segment
/// extended past the last point; draft entries floored at 0 and verify entries at 1e-6 ms.
/// The tables cover 0..=max_num_reqs requests and 0..=max_batch_tokens tokens. Sizes must be
/// finite, >= 0 and strictly increasing; costs finite; curves non-empty.
///
/// # Safety
///
/// draft_curve and verify_curve must point to their stated number of readable points (or be
/// NULL with length 0); tables_out must be NULL (an error) or point to a writable
/// avc_cost_tables pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_from_curves(
    draft_curve: *const AvcCostPoint,
    draft_len: usize,
    verify_curve: *const AvcCostPoint,
    verify_len: usize,
    max_num_reqs: usize,
    max_batch_tokens: usize,
    cudagraph_limit: usize,
    tables_out: *mut *mut AvcCostTables,
) -> AvcStatus {
    // SAFETY: this function's contract is `build`'s.
    unsafe {
        build(
            "avc_cost_tables_from_curves",
            ["draft_curve", "verify_curve"],
            CostTables::from_curves,
            draft_curve,
            draft_len,
            verify_curve,
            verify_len,
            [max_num_reqs, max_batch_tokens, cudagraph_limit],
            tables_out,
        )
    }
}

/// Tables from raw timings: repeated (size, ms) samples in any order, reduced to the median
/// per size (vLLM replays each profiled size and takes the median), then as
/// avc_cost_tables_from_curves.
///
/// # Safety
///
/// As avc_cost_tables_from_curves.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_from_samples(
    draft_samples: *const AvcCostPoint,
    draft_len: usize,
    verify_samples: *const AvcCostPoint,
    verify_len: usize,
    max_num_reqs: usize,
    max_batch_tokens: usize,
    cudagraph_limit: usize,
    tables_out: *mut *mut AvcCostTables,
) -> AvcStatus {
    // SAFETY: this function's contract is `build`'s.
    unsafe {
        build(
            "avc_cost_tables_from_samples",
            ["draft_samples", "verify_samples"],
            CostTables::from_samples,
            draft_samples,
            draft_len,
            verify_samples,
            verify_len,
            [max_num_reqs, max_batch_tokens, cudagraph_limit],
            tables_out,
        )
    }
}

/// Frees cost tables. NULL is a no-op; a pointer that is not live cost tables (a second free)
/// returns AVC_ERR_INVALID_HANDLE and frees nothing. Planners made from the tables keep
/// their own copy and stay valid.
///
/// # Safety
///
/// No other call may be using the tables, on any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_free(tables: *mut AvcCostTables) -> AvcStatus {
    // SAFETY: the caller guarantees exclusive access, which is `destroy`'s contract.
    guard("avc_cost_tables_free", || unsafe {
        destroy(tables, "tables")
    })
}

/// The largest request count and token count the tables cover (so draft_ms has
/// max_num_reqs + 1 entries and verify_ms max_batch_tokens + 1). Either output may be NULL.
///
/// # Safety
///
/// tables must be NULL or live cost tables; each output must be NULL or point to a writable
/// size_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_sizes(
    tables: *const AvcCostTables,
    max_num_reqs_out: *mut usize,
    max_batch_tokens_out: *mut usize,
) -> AvcStatus {
    guard("avc_cost_tables_sizes", || {
        // SAFETY: the caller's contract is `borrow`'s and `optional_out_value`'s.
        let (handle, reqs, tokens) = unsafe {
            (
                borrow(tables, "tables")?,
                crate::raw::optional_out_value(max_num_reqs_out, "max_num_reqs_out")?,
                crate::raw::optional_out_value(max_batch_tokens_out, "max_batch_tokens_out")?,
            )
        };
        if let Some(out) = reqs {
            out.write(handle.tables.max_num_reqs());
        }
        if let Some(out) = tokens {
            out.write(handle.tables.max_batch_tokens());
        }
        Ok(())
    })
}

/// Copies both tables out: draft_len must be max_num_reqs + 1 and verify_len
/// max_batch_tokens + 1 (see avc_cost_tables_sizes).
///
/// # Safety
///
/// tables must be NULL or live cost tables; draft_ms and verify_ms must point to their stated
/// number of writable doubles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_copy(
    tables: *const AvcCostTables,
    draft_ms: *mut f64,
    draft_len: usize,
    verify_ms: *mut f64,
    verify_len: usize,
) -> AvcStatus {
    guard("avc_cost_tables_copy", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (handle, draft, verify) = unsafe {
            (
                borrow(tables, "tables")?,
                output(draft_ms, draft_len, "draft_ms")?,
                output(verify_ms, verify_len, "verify_ms")?,
            )
        };
        for (out, table, argument) in [
            (&draft, handle.tables.draft_ms(), "draft_len"),
            (&verify, handle.tables.verify_ms(), "verify_len"),
        ] {
            if out.len() != table.len() {
                return Err(FfiError::value(
                    argument,
                    format!(
                        "must be {} (the table's length), got {}",
                        table.len(),
                        out.len()
                    ),
                ));
            }
        }
        draft.write(handle.tables.draft_ms());
        verify.write(handle.tables.verify_ms());
        Ok(())
    })
}

/// How a drafter's cost grows with the number of positions it drafts (an int32_t; pass one of
/// the constants): the shape avc_cost_tables_with_drafter gives the draft-depth table.
pub type AvcDrafterKind = i32;

/// One drafter pass per drafted position (draft models, EAGLE, MTP): drafting d of K positions
/// costs d / K of the full-depth cost.
pub const AVC_DRAFTER_KIND_AUTOREGRESSIVE: AvcDrafterKind = 0;
/// One pass drafts the whole block (parallel / block drafters): any depth >= 1 costs the full
/// cost, depth 0 nothing.
pub const AVC_DRAFTER_KIND_PARALLEL: AvcDrafterKind = 1;

/// New tables: a copy of tables plus a draft-cost-by-depth table, for the drafting-depth
/// decision (avc_choose_draft_depth, avc_planner_choose_draft_depth). draft_depth_ms[d]
/// (draft_depth_len = K + 1, 1 <= K <= 4096) is the drafter's cost when it drafts d
/// positions: draft_depth_ms[0] = 0 (depth 0 runs no drafter), finite and non-decreasing.
/// Only its shape matters: R requests drafting d positions cost
/// draft_ms[R] * draft_depth_ms[d] / draft_depth_ms[K], so draft_ms keeps its meaning (the
/// full-depth cost). Replaces any depth table tables already has. The array is copied and
/// tables is left unchanged (and still owned by the caller). On success *tables_out is a new
/// handle owned by the caller (free with avc_cost_tables_free); on failure it is NULL.
///
/// # Safety
///
/// tables must be NULL or live cost tables; draft_depth_ms must point to draft_depth_len
/// readable doubles (or be NULL with length 0, which is then rejected as too short);
/// tables_out must be NULL (an error) or point to a writable avc_cost_tables pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_with_draft_depth(
    tables: *const AvcCostTables,
    draft_depth_ms: *const f64,
    draft_depth_len: usize,
    tables_out: *mut *mut AvcCostTables,
) -> AvcStatus {
    guard("avc_cost_tables_with_draft_depth", || {
        // SAFETY: the caller's contract is `out_value`'s, `borrow`'s and `input`'s, each
        // pointer with the length it is passed with.
        let (out, handle, depth) = unsafe {
            let out = out_value(tables_out, "tables_out")?;
            out.write(std::ptr::null_mut());
            (
                out,
                borrow(tables, "tables")?,
                input(draft_depth_ms, draft_depth_len, "draft_depth_ms")?,
            )
        };
        let tables = handle.tables.clone().with_draft_depth(depth.to_vec())?;
        out.write(publish_tables(tables));
        Ok(())
    })
}

/// New tables: a copy of tables plus the canonical draft-depth table of a drafter kind up to
/// max_depth (K, 1..=4096) positions: d / K for AVC_DRAFTER_KIND_AUTOREGRESSIVE, 1 for every
/// d >= 1 for AVC_DRAFTER_KIND_PARALLEL (and 0 at d = 0). Otherwise as
/// avc_cost_tables_with_draft_depth: tables is unchanged; on success *tables_out is a new
/// handle owned by the caller, on failure NULL.
///
/// Errors: AVC_ERR_NULL; AVC_ERR_INVALID_HANDLE; AVC_ERR_VALUE for a kind that is not one of
/// the constants or max_depth outside 1..=4096.
///
/// # Safety
///
/// tables must be NULL or live cost tables; tables_out must be NULL (an error) or point to a
/// writable avc_cost_tables pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_with_drafter(
    tables: *const AvcCostTables,
    kind: AvcDrafterKind,
    max_depth: usize,
    tables_out: *mut *mut AvcCostTables,
) -> AvcStatus {
    guard("avc_cost_tables_with_drafter", || {
        // SAFETY: the caller's contract is `out_value`'s and `borrow`'s.
        let (out, handle) = unsafe {
            let out = out_value(tables_out, "tables_out")?;
            out.write(std::ptr::null_mut());
            (out, borrow(tables, "tables")?)
        };
        let kind = match kind {
            AVC_DRAFTER_KIND_AUTOREGRESSIVE => DrafterKind::Autoregressive,
            AVC_DRAFTER_KIND_PARALLEL => DrafterKind::Parallel,
            other => {
                return Err(FfiError::value(
                    "kind",
                    format!(
                        "must be AVC_DRAFTER_KIND_AUTOREGRESSIVE (0) or AVC_DRAFTER_KIND_PARALLEL (1), got {other}"
                    ),
                ))
            }
        };
        let tables = handle.tables.clone().with_drafter(kind, max_depth)?;
        out.write(publish_tables(tables));
        Ok(())
    })
}

/// Copies the draft-depth table out. Writes its length to *len_out: K + 1, or 0 when the
/// tables have none (then nothing else is written and the call succeeds). If capacity is at
/// least that length the table goes to draft_depth_ms[0..len]; if not, returns
/// AVC_ERR_BUFFER_TOO_SMALL and writes nothing to draft_depth_ms (only *len_out). Query the
/// length with draft_depth_ms = NULL, capacity = 0.
///
/// # Safety
///
/// tables must be NULL or live cost tables; draft_depth_ms must point to capacity writable
/// doubles (or be NULL with capacity = 0); len_out must be NULL (an error) or point to a
/// writable size_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_draft_depth(
    tables: *const AvcCostTables,
    draft_depth_ms: *mut f64,
    capacity: usize,
    len_out: *mut usize,
) -> AvcStatus {
    guard("avc_cost_tables_draft_depth", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (handle, out, len) = unsafe {
            (
                borrow(tables, "tables")?,
                output(draft_depth_ms, capacity, "draft_depth_ms")?,
                out_value(len_out, "len_out")?,
            )
        };
        let table = handle.tables.draft_depth_ms().unwrap_or(&[]);
        out.write_sized(table, &len, |capacity, needed| {
            format!(
                "draft_depth_ms: capacity = {capacity}, the table has {needed} entries \
                 (written to *len_out)"
            )
        })
    })
}

/// Saves the tables (all three, bit-exact) as versioned, checksummed bytes that
/// avc_cost_tables_load restores, on any platform; the Python bindings' CostTables.to_bytes
/// writes the same bytes.
///
/// Writes the size to *len_out, then the bytes to buf if cap is large enough; if not, returns
/// AVC_ERR_BUFFER_TOO_SMALL and writes nothing to buf (a first call with buf = NULL, cap = 0
/// learns the size).
///
/// # Safety
///
/// tables must be NULL or live cost tables; buf must point to cap writable bytes (or be NULL
/// with cap = 0); len_out must be NULL (an error) or point to a writable size_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_save(
    tables: *const AvcCostTables,
    buf: *mut u8,
    cap: usize,
    len_out: *mut usize,
) -> AvcStatus {
    guard("avc_cost_tables_save", || {
        // SAFETY: the caller's contract is `persist::save`'s.
        unsafe {
            crate::persist::save(tables, "tables", buf, cap, len_out, |handle| {
                handle.tables.to_bytes()
            })
        }
    })
}

/// Restores cost tables saved by avc_cost_tables_save (or by the Python bindings). On success
/// *tables_out is a new handle owned by the caller; on failure it is NULL. Truncated, corrupt
/// (checksum), foreign or future-version data, or tables no avc_cost_tables could hold, give
/// AVC_ERR_VALUE naming "data".
///
/// # Safety
///
/// data must point to len readable bytes (or be NULL with len = 0); tables_out must be NULL
/// (an error) or point to a writable avc_cost_tables pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_cost_tables_load(
    data: *const u8,
    len: usize,
    tables_out: *mut *mut AvcCostTables,
) -> AvcStatus {
    guard("avc_cost_tables_load", || {
        // SAFETY: the caller's contract is `persist::load`'s.
        unsafe {
            crate::persist::load(data, len, tables_out, "tables_out", |bytes| {
                Ok(publish_tables(CostTables::from_bytes(bytes)?))
            })
        }
    })
}
