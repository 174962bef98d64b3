//! Caller pointers in, caller buffers out: the checked conversions every entry point uses.
//!
//! Each helper rejects what would otherwise be undefined behaviour: NULL with a non-zero
//! length, a pointer not aligned for its element type, a length whose byte size overflows or
//! wraps the address space, and an output that overlaps an input. What it cannot check (that
//! the memory is really there, initialized, and not written by another thread during the
//! call) is the C caller's contract, stated in `docs/c-api.md` and on every function.
//!
//! Outputs are never turned into Rust references: the core computes into memory it owns, and
//! [`OutSlice::write`] / [`OutValue::write`] copy the result out through raw pointers at the
//! very end, once the call can no longer fail. So output buffers may be uninitialized, and a
//! rejected call leaves them untouched.

use std::marker::PhantomData;
use std::mem::size_of;
use std::ops::Range;

use crate::status::{FfiError, FfiResult, AVC_ERR_BUFFER_TOO_SMALL};

/// The byte range of `len` elements at `ptr`, after checking that it neither overflows
/// `isize` (a Rust allocation limit) nor wraps around the address space.
fn byte_range<T>(ptr: *const T, len: usize, argument: &str) -> FfiResult<Range<usize>> {
    let start = ptr as usize;
    len.checked_mul(size_of::<T>())
        .filter(|&bytes| bytes <= isize::MAX as usize)
        .and_then(|bytes| start.checked_add(bytes))
        .map(|end| start..end)
        .ok_or_else(|| {
            FfiError::value(
                argument,
                format!("length {len} is too large for the address space"),
            )
        })
}

fn check_pointer<T>(ptr: *const T, len: usize, argument: &str) -> FfiResult<()> {
    if ptr.is_null() {
        return Err(FfiError {
            status: crate::status::AVC_ERR_NULL,
            message: format!("{argument}: is NULL but its length is {len}"),
        });
    }
    if !ptr.is_aligned() {
        return Err(FfiError::value(
            argument,
            format!(
                "pointer {ptr:p} is not aligned to {} bytes",
                std::mem::align_of::<T>()
            ),
        ));
    }
    byte_range(ptr, len, argument).map(|_| ())
}

/// Borrows the caller's array of `len` elements for the duration of one call. `len == 0`
/// gives an empty slice whatever `ptr` is (NULL included).
///
/// # Safety
///
/// If `len > 0` and `ptr` is not NULL, `ptr` must point to `len` initialized values of `T`
/// inside one allocation, readable and not written by anyone until the entry point returns.
/// The returned slice must not outlive that entry point.
pub unsafe fn input<'a, T>(ptr: *const T, len: usize, argument: &str) -> FfiResult<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    check_pointer(ptr, len, argument)?;
    // SAFETY: `ptr` is non-NULL and aligned for `T`, and `len * size_of::<T>()` fits in
    // `isize` without wrapping (all checked just above). The caller guarantees that the `len`
    // elements are initialized, live in one allocation and are not mutated during the call,
    // and that the slice does not outlive the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Borrows one caller struct for the duration of one call.
///
/// # Safety
///
/// If `ptr` is not NULL it must point to an initialized `T`, not written by anyone until the
/// entry point returns, and the reference must not outlive that entry point.
pub unsafe fn input_ref<'a, T>(ptr: *const T, argument: &str) -> FfiResult<&'a T> {
    if ptr.is_null() {
        return Err(FfiError::null(argument));
    }
    check_pointer(ptr, 1, argument)?;
    // SAFETY: non-NULL and aligned (checked); the caller guarantees it points to an
    // initialized `T` that stays unchanged for the call, which bounds the reference's use.
    Ok(unsafe { &*ptr })
}

/// A checked destination for exactly `len` values, written once at the end of a call.
#[derive(Debug)]
pub struct OutSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _caller: PhantomData<&'a mut [T]>,
}

/// Checks the caller's output array of `len` elements; nothing is written yet.
///
/// # Safety
///
/// If `len > 0` and `ptr` is not NULL, `ptr` must point to `len` writable elements of `T`
/// (initialized or not) inside one allocation owned by the caller, not accessed by anyone
/// else until the entry point returns, and the result must not outlive that entry point.
pub unsafe fn output<'a, T: Copy>(
    ptr: *mut T,
    len: usize,
    argument: &str,
) -> FfiResult<OutSlice<'a, T>> {
    if len > 0 {
        check_pointer(ptr, len, argument)?;
    }
    Ok(OutSlice {
        ptr,
        len,
        _caller: PhantomData,
    })
}

impl<T: Copy> OutSlice<'_, T> {
    /// The number of elements the caller provided.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the caller provided no room at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Fails, naming both arguments, if this output shares a byte with `input`.
    pub fn ensure_disjoint<U>(&self, argument: &str, input: &[U], input_name: &str) -> FfiResult {
        if self.len == 0 || input.is_empty() {
            return Ok(());
        }
        let out = byte_range(self.ptr.cast_const(), self.len, argument)?;
        let bytes = input.as_ptr_range();
        let inp = bytes.start as usize..bytes.end as usize;
        if out.start < inp.end && inp.start < out.end {
            return Err(FfiError::value(
                argument,
                format!("overlaps {input_name}; outputs must not share memory with inputs"),
            ));
        }
        Ok(())
    }

    /// The first `len` elements (`len` at most [`len`](Self::len)).
    pub fn prefix(self, len: usize) -> Self {
        assert!(len <= self.len, "OutSlice::prefix: {len} > {}", self.len);
        OutSlice { len, ..self }
    }

    /// Copies `values`, which must have exactly [`len`](Self::len) elements, to the caller.
    pub fn write(self, values: &[T]) {
        assert_eq!(
            values.len(),
            self.len,
            "OutSlice::write: length checked by the caller"
        );
        if self.len == 0 {
            return;
        }
        // SAFETY: `output` checked that `ptr` is non-NULL, aligned and spans `len` elements
        // without wrapping; the caller of `output` guaranteed that they are writable and
        // accessed by nobody else during the call. `values` is memory owned by Rust (a
        // computed result), so the two ranges cannot overlap, and `T: Copy` needs no drop.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.ptr, self.len) };
    }

    /// The size-query convention of every call that fills a buffer of the caller's choosing:
    /// `values.len()` to `len`, then `values` to this output if it has room for them; otherwise
    /// AVC_ERR_BUFFER_TOO_SMALL with `too_small(capacity, needed)` as the message, and nothing
    /// written here.
    pub fn write_sized(
        self,
        values: &[T],
        len: &OutValue<'_, usize>,
        too_small: impl FnOnce(usize, usize) -> String,
    ) -> FfiResult {
        let needed = values.len();
        len.write(needed);
        if self.len < needed {
            return Err(FfiError {
                status: AVC_ERR_BUFFER_TOO_SMALL,
                message: too_small(self.len, needed),
            });
        }
        self.prefix(needed).write(values);
        Ok(())
    }
}

/// A checked destination for one value, written once at the end of a call.
#[derive(Debug)]
pub struct OutValue<'a, T> {
    ptr: *mut T,
    _caller: PhantomData<&'a mut T>,
}

/// Checks a required output pointer (NULL is an error); nothing is written yet.
///
/// # Safety
///
/// If `ptr` is not NULL it must point to a `T` (initialized or not) writable by this call
/// and accessed by nobody else until the entry point returns; the result must not outlive
/// that entry point.
pub unsafe fn out_value<'a, T: Copy>(ptr: *mut T, argument: &str) -> FfiResult<OutValue<'a, T>> {
    if ptr.is_null() {
        return Err(FfiError::null(argument));
    }
    check_pointer(ptr.cast_const(), 1, argument)?;
    Ok(OutValue {
        ptr,
        _caller: PhantomData,
    })
}

/// Like [`out_value`], but NULL means "the caller does not want this value".
///
/// # Safety
///
/// As for [`out_value`].
pub unsafe fn optional_out_value<'a, T: Copy>(
    ptr: *mut T,
    argument: &str,
) -> FfiResult<Option<OutValue<'a, T>>> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded contract: the caller of this function upholds `out_value`'s.
    unsafe { out_value(ptr, argument) }.map(Some)
}

impl<T: Copy> OutValue<'_, T> {
    /// Stores `value` in the caller's slot (again, if called twice).
    pub fn write(&self, value: T) {
        // SAFETY: `out_value` checked non-NULL and alignment; its caller guaranteed the slot
        // is writable and not accessed by anyone else during the call. `write` does not read
        // or drop the old contents, so uninitialized memory is fine.
        unsafe { self.ptr.write(value) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{AVC_ERR_NULL, AVC_ERR_VALUE};

    #[test]
    fn null_is_an_error_only_with_a_length() {
        // SAFETY: len 0 never dereferences; the NULL with len 3 is rejected before use.
        unsafe {
            assert!(input::<f32>(std::ptr::null(), 0, "x").unwrap().is_empty());
            let error = input::<f32>(std::ptr::null(), 3, "x").unwrap_err();
            assert_eq!(error.status, AVC_ERR_NULL);
            assert_eq!(error.message, "x: is NULL but its length is 3");
        }
    }

    #[test]
    fn misaligned_and_huge_arrays_are_refused() {
        let data = [0u64; 4];
        let misaligned = (data.as_ptr() as usize + 1) as *const u64;
        // SAFETY: both calls are rejected by the checks before any dereference.
        unsafe {
            let error = input(misaligned, 1, "x").unwrap_err();
            assert_eq!(error.status, AVC_ERR_VALUE);
            assert!(error.message.contains("not aligned"), "{}", error.message);
            let error = input(data.as_ptr(), usize::MAX / 4, "x").unwrap_err();
            assert!(error.message.contains("too large"), "{}", error.message);
        }
    }

    #[test]
    fn overlapping_outputs_are_refused() {
        let mut buffer = [0.0f32; 8];
        let ptr = buffer.as_mut_ptr();
        // SAFETY: the slices and outputs all stay inside `buffer`, which outlives them; the
        // overlapping pair is only compared, never written.
        unsafe {
            let first = input(ptr.cast_const(), 4, "features").unwrap();
            let out = output(ptr.add(2), 4, "out").unwrap();
            let error = out.ensure_disjoint("out", first, "features").unwrap_err();
            assert_eq!(
                error.message,
                "out: overlaps features; outputs must not share memory with inputs"
            );
            let out = output(ptr.add(4), 4, "out").unwrap();
            out.ensure_disjoint("out", first, "features").unwrap();
        }
    }

    #[test]
    fn outputs_are_written_only_by_write() {
        let mut buffer = [1.0f64; 3];
        // SAFETY: `buffer` is a live, exclusive array of three f64 for the whole block.
        unsafe {
            let out = output(buffer.as_mut_ptr(), 3, "out").unwrap();
            assert_eq!(out.len(), 3);
            out.write(&[4.0, 5.0, 6.0]);
        }
        assert_eq!(buffer, [4.0, 5.0, 6.0]);
    }
}
