//! The atomics and the lock the concurrent parts use, swapped for `loom`'s model-checked ones
//! under `--cfg loom` (see `tests/loom.rs`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Backs off inside a wait loop: spins briefly, then yields the thread (under loom, always
/// yields so the model checker can schedule the thread being waited for).
#[inline]
pub(crate) fn backoff(spins: &mut u32) {
    #[cfg(loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        *spins += 1;
        if *spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
