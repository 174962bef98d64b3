//! The C ABI of [`av_core`]: the estimator, the cost tables and the stateful planner behind
//! opaque handles, for schedulers that are not written in Python or Rust.
//!
//! The header is `include/av_core.h`, generated from this crate's source by cbindgen and
//! checked in; `tests/header.rs` fails when it is stale. `docs/c-api.md` is the user's guide:
//! ownership, thread safety, error handling and how to build and link the libraries.
//!
//! Conventions, identical for every `avc_*` function:
//!
//! * It returns an [`AvcStatus`](status::AvcStatus) (`AVC_OK` = 0); on any other code
//!   `avc_last_error()` holds a message that names the function and the bad argument. The
//!   only exceptions are the infallible queries `avc_last_error`, `avc_status_name`,
//!   `avc_version_string` and `avc_abi_version`.
//! * Results go to caller-owned memory passed as pointer + length; no function allocates
//!   memory that the caller must free, except handles, which are freed by their `*_free`.
//! * A rejected call changes nothing: neither the handle nor any output buffer, except that a
//!   failed constructor (including `avc_cost_tables_with_draft_depth` / `_with_drafter`, which
//!   derive new tables and leave their input as it was) sets its handle output to NULL, and
//!   `avc_estimator_save` and `avc_cost_tables_draft_depth` report the size they need.
//! * No Rust panic crosses the boundary: every entry point runs under `catch_unwind` and a
//!   panic becomes `AVC_ERR_PANIC`.
//!
//! The unsafe surface is two small modules: [`raw`] turns caller pointers into slices and
//! output slots after checking NULL, length, alignment and overlap, and [`handle`] owns the
//! boxing, tagging and freeing of handles. The entry points themselves contain no `unsafe`
//! block beyond calling those helpers.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]
// The `avc_*` docs are written for C readers (cbindgen copies them into the header verbatim),
// so they use C's `array[r]` notation, which rustdoc would otherwise take for links.
#![allow(rustdoc::broken_intra_doc_links)]

#[cfg(feature = "capi")]
pub mod status;

#[cfg(feature = "capi")]
pub mod raw;

#[cfg(feature = "capi")]
pub mod handle;

#[cfg(feature = "capi")]
pub mod version;

#[cfg(feature = "capi")]
pub mod environment;

#[cfg(feature = "capi")]
pub mod estimator;

#[cfg(feature = "capi")]
pub mod cost_tables;

#[cfg(feature = "capi")]
pub mod planner;

#[cfg(feature = "capi")]
mod persist;

#[cfg(feature = "capi")]
pub mod features;

#[cfg(feature = "capi")]
pub mod cost_tables_json;

/// The core types a handle wraps must be shareable the way docs/design.md ("Determinism and
/// concurrency") says: the estimator and the cost tables are used from many threads at once, and the planner moves
/// between threads (its handle serializes calls with a mutex, so it needs `Send` only).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<av_core::AcceptanceEstimator>();
    send_sync::<av_core::cost_tables::CostTables>();
    send::<av_core::planner::VerificationPlanner>();
};
