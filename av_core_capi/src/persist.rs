//! Saving and loading planners and cost tables as bytes, from the core's persistence
//! (`av_core::persist`): the same frames the Python bindings write, so a state saved by one
//! loads in the other.

use crate::handle::{borrow, Handle};
use crate::raw::{input, out_value, output, OutSlice, OutValue};
use crate::status::FfiResult;

/// The save convention of every `avc_*_save`: the state's size to `len`, then the bytes to
/// `out` when its capacity `cap` is large enough; otherwise AVC_ERR_BUFFER_TOO_SMALL and
/// nothing written to `out`.
pub(crate) fn write_state(
    bytes: &[u8],
    out: OutSlice<'_, u8>,
    cap: usize,
    len: &OutValue<'_, usize>,
) -> FfiResult {
    // `cap` is `out`'s capacity (checked by `output`).
    debug_assert_eq!(cap, out.len());
    out.write_sized(bytes, len, |cap, needed| {
        format!("buf: cap = {cap} bytes, the state needs {needed} (written to *len_out)")
    })
}

/// The body of an `avc_*_save(handle, buf, cap, len_out)`: checks the handle (named `argument`)
/// and both outputs, then writes `to_bytes(handle)` by [`write_state`]'s convention.
///
/// # Safety
///
/// The entry point's contract: `handle` must be NULL or a live handle of kind `H`; `buf` must
/// point to `cap` writable bytes (or be NULL with `cap` = 0); `len_out` must be NULL (an error)
/// or point to a writable `size_t`.
pub(crate) unsafe fn save<H: Handle>(
    handle: *const H,
    argument: &str,
    buf: *mut u8,
    cap: usize,
    len_out: *mut usize,
    to_bytes: impl FnOnce(&H) -> Vec<u8>,
) -> FfiResult {
    // SAFETY: this function's contract is `borrow`'s, `output`'s and `out_value`'s.
    let (handle, out, len) = unsafe {
        (
            borrow(handle, argument)?,
            output(buf, cap, "buf")?,
            out_value(len_out, "len_out")?,
        )
    };
    write_state(&to_bytes(handle), out, cap, &len)
}

/// The body of an `avc_*_load(data, len, handle_out)`: NULL to `*handle_out` (named
/// `argument`) first, so that a failed load leaves it NULL, then the handle `from_bytes`
/// publishes from the caller's `len` bytes.
///
/// # Safety
///
/// The entry point's contract: `data` must point to `len` readable bytes (or be NULL with `len`
/// = 0); `handle_out` must be NULL (an error) or point to a writable handle pointer.
pub(crate) unsafe fn load<H>(
    data: *const u8,
    len: usize,
    handle_out: *mut *mut H,
    argument: &str,
    from_bytes: impl FnOnce(&[u8]) -> FfiResult<*mut H>,
) -> FfiResult {
    // SAFETY: this function's contract is `out_value`'s and `input`'s.
    let (out, bytes) = unsafe {
        let out = out_value(handle_out, argument)?;
        out.write(std::ptr::null_mut());
        (out, input(data, len, "data")?)
    };
    out.write(from_bytes(bytes)?);
    Ok(())
}
