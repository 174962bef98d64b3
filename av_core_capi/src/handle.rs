//! Opaque handles: boxing, tagging, borrowing and freeing.
//!
//! A handle is a `Box` of a `#[repr(C)]` struct whose first field is a tag, a 64-bit magic
//! number per kind of handle. Two defences protect against misuse, with different strengths:
//!
//! * **Double free is detected soundly.** Every live handle's address is in a process-wide
//!   registry; `*_free` removes it there *before* touching the memory, so freeing a pointer
//!   that is not live (already freed, never created, or a handle of another kind) returns
//!   `AVC_ERR_INVALID_HANDLE` without dereferencing it. The one blind spot is an address that
//!   a new handle of the same kind has reused since: that second free frees the new handle.
//! * **Use after free is detected on a best-effort basis.** Other calls check the tag (zeroed
//!   on free) instead of the registry, so that the estimator's hot path stays lock-free.
//!   Reading a freed handle's tag is already the caller's undefined behaviour; the check only
//!   turns the common outcome into an error instead of a crash.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::status::{FfiError, FfiResult, AVC_ERR_INVALID_HANDLE};

/// A kind of handle. Implementors are `#[repr(C)]` with the tag as their first field, so the
/// tag can be read through a pointer of any handle kind.
pub trait Handle: Sized {
    /// The tag of a live handle of this kind (never 0).
    const MAGIC: u64;
    /// The C type name, for error messages.
    const NAME: &'static str;
    /// The tag field (the first field of the `#[repr(C)]` struct).
    fn tag(&self) -> &AtomicU64;
}

/// Live handles (by [`key`]) and their kind's magic number.
static LIVE: Mutex<BTreeMap<usize, u64>> = Mutex::new(BTreeMap::new());

/// A handle's registry key: its address, bitwise inverted. Were the plain address stored,
/// leak checkers (valgrind, LeakSanitizer) would count every handle the caller forgot to free
/// as still reachable from the registry and report no leak.
fn key<H>(pointer: *const H) -> usize {
    !(pointer as usize)
}

fn live() -> std::sync::MutexGuard<'static, BTreeMap<usize, u64>> {
    // The map is updated in single calls that cannot panic half-way; poisoning is harmless.
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn invalid<H: Handle>(argument: &str, why: &str) -> FfiError {
    FfiError {
        status: AVC_ERR_INVALID_HANDLE,
        message: format!("{argument}: is not a live {} ({why})", H::NAME),
    }
}

/// Boxes `handle`, registers it as live and returns the pointer the caller will own.
pub fn publish<H: Handle>(handle: H) -> *mut H {
    debug_assert_eq!(handle.tag().load(Ordering::Relaxed), H::MAGIC);
    let pointer = Box::into_raw(Box::new(handle));
    live().insert(key(pointer), H::MAGIC);
    pointer
}

/// Borrows a handle for the duration of one call: NULL is `AVC_ERR_NULL`, a misaligned
/// pointer or a wrong tag is `AVC_ERR_INVALID_HANDLE`.
///
/// # Safety
///
/// `pointer` must be NULL or a pointer returned by this library's `*_new`/`*_load` for a
/// handle that has not been freed, and no `*_free` of it may run until the entry point
/// returns. The reference must not outlive that entry point.
pub unsafe fn borrow<'a, H: Handle>(pointer: *const H, argument: &str) -> FfiResult<&'a H> {
    if pointer.is_null() {
        return Err(FfiError::null(argument));
    }
    if !pointer.is_aligned() {
        return Err(invalid::<H>(argument, "misaligned pointer"));
    }
    // SAFETY: non-NULL and aligned (checked). The caller guarantees it points to a live handle
    // made by this library; every handle kind is `#[repr(C)]` with an `AtomicU64` tag first,
    // so reading the tag through this cast is a valid atomic read whatever the kind.
    let tag = unsafe { &*pointer.cast::<AtomicU64>() }.load(Ordering::Acquire);
    if tag != H::MAGIC {
        return Err(invalid::<H>(
            argument,
            "freed, or a different kind of handle",
        ));
    }
    // SAFETY: the tag says this is a live `H`, boxed by `publish` (so properly initialized),
    // and the caller guarantees that no free runs before the entry point returns.
    Ok(unsafe { &*pointer })
}

/// Frees a handle made by [`publish`]. NULL is a no-op (like C's `free`); a pointer that is
/// not a live handle of this kind is refused without being dereferenced.
///
/// # Safety
///
/// No other call may be using the handle (the C contract: free only after every call on it
/// has returned, on every thread).
pub unsafe fn destroy<H: Handle>(pointer: *mut H, argument: &str) -> FfiResult {
    if pointer.is_null() {
        return Ok(());
    }
    {
        let mut live = live();
        match live.get(&key(pointer)) {
            Some(&magic) if magic == H::MAGIC => {
                live.remove(&key(pointer));
            }
            Some(_) => return Err(invalid::<H>(argument, "a handle of a different kind")),
            None => return Err(invalid::<H>(argument, "already freed, or never created")),
        }
    }
    // SAFETY: the registry held this address with `H`'s magic, so it came from
    // `Box::into_raw(Box<H>)` in `publish` and has not been freed (removal from the registry,
    // done just above under its lock, happens exactly once per box). The caller guarantees no
    // other call is using it, so taking ownership back is exclusive.
    let boxed = unsafe { Box::from_raw(pointer) };
    boxed.tag().store(0, Ordering::Release);
    drop(boxed);
    Ok(())
}

/// Number of live handles of every kind (for leak tests).
pub fn live_handles() -> usize {
    live().len()
}
