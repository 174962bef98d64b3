//! Argument conversion and error mapping: Python objects in, core views out.
//!
//! Arrays: every array argument reaches the core in row-major (C) order and is read once:
//!
//! * any layout gives exactly the answer of its C-contiguous copy: an array that is not
//!   C-contiguous and aligned (Fortran order, transposes, negative or zero strides,
//!   non-contiguous slices, misaligned buffers, CPU torch views) goes through numpy's own
//!   C-order copy;
//! * what the core validates is what it uses: other threads may write the caller's buffer
//!   while the call runs (numpy and torch release the GIL). So every array argument is copied
//!   into memory the binding owns ([`float_matrix`], [`int_vector`], [`float_vector`]; an
//!   `R × K` batch is a few kilobytes: one `memcpy` from numpy's pointer, into a pooled buffer
//!   for matrices) before the GIL is released, and the core reads only that copy. The copy is
//!   made through the raw pointer, never a `&[T]` of the caller's buffer: a shared reference
//!   tells the compiler the memory does not change, and an optimised build then read the
//!   caller's buffer again after the check (a NaN reached `predict`'s output under a racing
//!   writer). Only the big feature kernels (`features.rs`) read their contiguous logits in
//!   place; a race there can only change that row's feature, never break a check.
//! * an array whose descriptor is numpy's own int64, int32, float32 or float64 one (the common
//!   case) is recognised by the descriptor's address, without numpy's comparison of dtypes; any
//!   other descriptor takes the general conversion, which copies the same values.
//!
//! Results: the per-request arrays and `predict`'s probabilities are new numpy arrays the core
//! computes into directly ([`computed_into`]), never seen by Python half-written.
//!
//! Scalars: integer and float arguments arrive as [`Int`] and [`Float`], which never fail to
//! convert, so that the function body can refuse them with an error naming the argument: a bool
//! is a `TypeError` (not an int), an integer outside the argument's range a `ValueError` with
//! the value (PyO3's own conversion would raise `OverflowError` without the name).
//!
//! Every failure names the argument.

use av_core::MatrixView;
use numpy::ndarray::{Dimension, Ix1, Ix2};
use numpy::{
    Element, PyArray, PyArray1, PyArray2, PyArrayDescr, PyArrayDescrMethods, PyArrayMethods,
    PyUntypedArray, PyUntypedArrayMethods, PY_ARRAY_API,
};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};

use crate::error::out_of_memory;
pub use crate::error::{to_py_err, type_error, value_error};

mod scalars;

pub use scalars::{byte_string, short_repr, Flag, Float, Int, Text};

// --- arrays ----------------------------------------------------------------------------------

fn numpy_asarray<'py>(py: Python<'py>) -> PyResult<&'py Bound<'py, PyAny>> {
    static ASARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    ASARRAY
        .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py.import("numpy")?.getattr("asarray")?.unbind())
        })
        .map(|f| f.bind(py))
}

/// An argument as a numpy array, and whether numpy inferred its dtype (a list or tuple: an
/// empty one then is float64, and is accepted wherever an empty array of the right dtype is).
pub struct Converted<'py> {
    /// The array (the caller's own object when it is one).
    pub array: Bound<'py, PyUntypedArray>,
    /// The argument was a Python sequence, not an array or tensor.
    pub inferred: bool,
}

impl Converted<'_> {
    /// An empty array whose dtype came from numpy's inference, not from the caller.
    fn inferred_empty(&self) -> bool {
        self.inferred && self.array.len() == 0
    }
}

/// The object as a numpy array: itself if it is one, else `numpy.asarray(obj)` (zero-copy for
/// CPU torch tensors and anything else exposing the array interface).
pub fn as_ndarray<'py>(
    obj: &Bound<'py, PyAny>,
    argument: &str,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    convert(obj, argument).map(|c| c.array)
}

/// [`as_ndarray`], saying whether the dtype was inferred.
pub fn convert<'py>(obj: &Bound<'py, PyAny>, argument: &str) -> PyResult<Converted<'py>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return Ok(Converted {
            array: array.clone(),
            inferred: false,
        });
    }
    let py = obj.py();
    let inferred = obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>();
    let converted = match numpy_asarray(py)?.call1((obj,)) {
        Ok(array) => array,
        // A tensor on an accelerator: its values copied to the host by the tensor's own
        // `detach().cpu()` (one synchronous copy), then read like any host tensor. The
        // extension asks nothing of the Python package; callers that reuse a pinned buffer
        // stage through `av_core.features.to_host` themselves.
        Err(_) if is_device_tensor(obj) => {
            let host = obj
                .call_method0("detach")
                .and_then(|tensor| tensor.call_method0("cpu"))
                .map_err(|e| {
                    type_error(argument, format!("cannot copy the tensor to host: {e}"))
                })?;
            if is_device_tensor(&host) {
                return Err(type_error(
                    argument,
                    format!("{}.cpu() gave a tensor still on a device", type_name(obj)),
                ));
            }
            return convert(&host, argument);
        }
        Err(e) => match resolved_tensor(obj) {
            // A CPU tensor that numpy refuses as it is (one that requires grad, or carries
            // torch's lazy negation or conjugation bit): its values, resolved.
            Some(resolved) => numpy_asarray(py)?
                .call1((resolved,))
                .map_err(|e| not_an_array(obj, argument, e))?,
            None => return Err(not_an_array(obj, argument, e)),
        },
    };
    let array = converted.cast_into::<PyUntypedArray>().map_err(|e| {
        type_error(
            argument,
            format!("numpy.asarray gave {}", type_name(e.into_inner().as_any())),
        )
    })?;
    Ok(Converted { array, inferred })
}

/// The `TypeError` for an object numpy cannot read (a `BaseException` that is not an
/// `Exception`, such as `KeyboardInterrupt`, goes through unchanged).
fn not_an_array(obj: &Bound<'_, PyAny>, argument: &str, error: PyErr) -> PyErr {
    if !error.is_instance_of::<PyException>(obj.py()) {
        return error;
    }
    type_error(
        argument,
        format!(
            "expected a numpy array or a tensor, got {} ({error})",
            type_name(obj)
        ),
    )
}

/// `obj.detach().resolve_conj().resolve_neg()` for a torch tensor, else `None`.
fn resolved_tensor<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let tensor = obj.call_method0("detach").ok()?;
    let tensor = tensor.call_method0("resolve_conj").ok()?;
    tensor.call_method0("resolve_neg").ok()
}

/// Whether `obj` looks like a torch tensor on a device other than the CPU.
fn is_device_tensor(obj: &Bound<'_, PyAny>) -> bool {
    obj.getattr("is_cuda")
        .and_then(|flag| flag.is_truthy())
        .unwrap_or(false)
}

/// The type name of `obj`, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

fn dtype_name(array: &Bound<'_, PyUntypedArray>) -> String {
    array.dtype().to_string()
}

/// The elements of `array` in row-major order, in a vector of our own (one read of each
/// element; see the module docs). `argument` names it if it cannot be copied.
pub fn row_major<T: Element + Copy, D: numpy::ndarray::Dimension>(
    array: &Bound<'_, PyArray<T, D>>,
    argument: &str,
) -> PyResult<Vec<T>> {
    let mut out = Vec::new();
    row_major_into(array, argument, &mut out)?;
    Ok(out)
}

/// [`row_major`] into `out` (cleared first), reusing its allocation.
fn row_major_into<T: Element + Copy, D: numpy::ndarray::Dimension>(
    array: &Bound<'_, PyArray<T, D>>,
    argument: &str,
    out: &mut Vec<T>,
) -> PyResult<()> {
    out.clear();
    let data = array.data();
    if array.is_c_contiguous() && data.is_aligned() {
        // No numpy borrow flag is taken: the copy goes through the raw pointer, never a
        // reference, so there is no Rust borrow for a writer to conflict with.
        let len = array.len();
        out.try_reserve_exact(len)
            .map_err(|_| no_memory_for_copy(array.as_untyped(), argument))?;
        // One memcpy from numpy's pointer, never through a `&[T]`: other threads may write the
        // buffer meanwhile (numpy and torch release the GIL), and a shared reference would let
        // the compiler assume it does not change and read it again later.
        // SAFETY: `data` points to `len` elements of `T` (the array is C-contiguous and aligned,
        // checked above, and `array` keeps its buffer alive for the call); `out` has capacity
        // for `len` and does not overlap numpy's buffer (it is our own allocation); every bit
        // pattern is a valid `T` (the element types are f32, f64, i32, i64, u64), so bytes
        // another thread writes during the copy still give valid values, which the core then
        // validates on our copy.
        unsafe {
            std::ptr::copy_nonoverlapping(data.cast_const(), out.as_mut_ptr(), len);
            out.set_len(len);
        }
        return Ok(());
    }
    // Any other layout: numpy's own C-order copy (aligned, row-major, nobody else's), read
    // once more into our vector.
    let py = array.py();
    let copy = match array.call_method1(pyo3::intern!(py, "copy"), (pyo3::intern!(py, "C"),)) {
        Ok(copy) => copy,
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py) => {
            return Err(no_memory_for_copy(array.as_untyped(), argument))
        }
        Err(e) => return Err(e),
    };
    let copy = copy.cast_into::<PyArray<T, D>>().map_err(PyErr::from)?;
    let readonly = copy.try_readonly()?;
    let slice = readonly
        .as_slice()
        .map_err(|_| value_error(argument, "numpy's C-order copy is not contiguous"))?;
    out.try_reserve_exact(slice.len())
        .map_err(|_| no_memory_for_copy(array.as_untyped(), argument))?;
    out.extend_from_slice(slice);
    Ok(())
}

/// The error for a copy of `array` that does not fit in memory: a view can imply far more
/// elements than its memory holds (numpy.broadcast_to), and such a copy is a ValueError naming
/// the argument, never an abort.
fn no_memory_for_copy(array: &Bound<'_, PyUntypedArray>, argument: &str) -> PyErr {
    out_of_memory(
        argument,
        format!(
            "cannot copy an array of shape {:?} ({} elements): out of memory",
            array.shape(),
            array.len()
        ),
    )
}

/// numpy's own descriptors of the four element types the copies read directly, held for the
/// life of the process.
struct Descriptors {
    i32: Py<PyArrayDescr>,
    i64: Py<PyArrayDescr>,
    f32: Py<PyArrayDescr>,
    f64: Py<PyArrayDescr>,
}

fn descriptors(py: Python<'_>) -> &Descriptors {
    static DESCRIPTORS: PyOnceLock<Descriptors> = PyOnceLock::new();
    DESCRIPTORS.get_or_init(py, || Descriptors {
        i32: numpy::dtype::<i32>(py).unbind(),
        i64: numpy::dtype::<i64>(py).unbind(),
        f32: numpy::dtype::<f32>(py).unbind(),
        f64: numpy::dtype::<f64>(py).unbind(),
    })
}

/// `array` as a `PyArray<T, D>` when its descriptor is `descr` itself (numpy's own descriptor
/// of `T`, compared by address) and it has `D`'s number of dimensions: the common case, told
/// apart without numpy's comparison of dtypes. `None` says nothing about the array: the general
/// conversion then decides.
fn exactly<'a, 'py, T: Element, D: Dimension>(
    array: &'a Bound<'py, PyUntypedArray>,
    descr: &Py<PyArrayDescr>,
) -> Option<&'a Bound<'py, PyArray<T, D>>> {
    // SAFETY: `array` is a numpy array (its type was checked when it became a
    // `PyUntypedArray`), so its object is a `PyArrayObject` whose `descr` field numpy always
    // sets; the field is read, not dereferenced.
    let same = unsafe { (*array.as_array_ptr()).descr } == descr.as_ptr().cast();
    if !same || Some(array.ndim()) != D::NDIM {
        return None;
    }
    // SAFETY: `PyArray<T, D>`'s own type check accepts exactly a numpy array whose number of
    // dimensions is `D::NDIM` and whose descriptor is equivalent to `T`'s; this one is a numpy
    // array with that number of dimensions, and its descriptor is `T`'s (the caller passes
    // `T`'s descriptor as `descr`, the same object), the first case numpy's equivalence
    // accepts.
    Some(unsafe { array.cast_unchecked::<PyArray<T, D>>() })
}

/// Element types whose copies come from a per-thread pool of buffers.
pub trait Pooled: Element + Copy + 'static {
    /// This thread's spare buffers of `Self`.
    fn spares() -> &'static std::thread::LocalKey<std::cell::RefCell<Vec<Vec<Self>>>>;
}

macro_rules! pooled {
    ($($t:ty),*) => {$(
        impl Pooled for $t {
            fn spares() -> &'static std::thread::LocalKey<std::cell::RefCell<Vec<Vec<Self>>>> {
                thread_local! {
                    static SPARES: std::cell::RefCell<Vec<Vec<$t>>> = const {
                        std::cell::RefCell::new(Vec::new())
                    };
                }
                &SPARES
            }
        }
    )*};
}

pooled!(f32, f64, i32, i64);

/// A spare buffer of this thread's pool, or a new empty one.
fn take_spare<T: Pooled>() -> Vec<T> {
    T::spares()
        .try_with(|cell| {
            cell.try_borrow_mut()
                .ok()
                .and_then(|mut spares| spares.pop())
        })
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keeps `buffer` for reuse on this thread (unless the pool is full or the buffer huge).
fn give_spare<T: Pooled>(buffer: Vec<T>) {
    if buffer.capacity() == 0 || buffer.capacity() > MAX_SPARE_LEN {
        return;
    }
    // A thread shutting down has no pool any more: the buffer is then simply freed.
    let _ = T::spares().try_with(|cell| {
        if let Ok(mut spares) = cell.try_borrow_mut() {
            if spares.len() < MAX_SPARES {
                spares.push(buffer);
            }
        }
    });
}

/// Buffers larger than this (elements) are not kept for reuse.
const MAX_SPARE_LEN: usize = 1 << 20;
/// Spare buffers kept per thread and element type.
const MAX_SPARES: usize = 4;

/// A row-major copy in a buffer borrowed from the thread's pool and returned to it on drop, so
/// that a hot loop copies its arguments without allocating.
pub struct Copied<T: Pooled>(Vec<T>);

impl<T: Pooled> Copied<T> {
    /// The elements of `array`, row-major.
    fn of<D: numpy::ndarray::Dimension>(
        array: &Bound<'_, PyArray<T, D>>,
        argument: &str,
    ) -> PyResult<Self> {
        let mut copied = Copied(take_spare());
        row_major_into(array, argument, &mut copied.0)?;
        Ok(copied)
    }

    /// An empty copy.
    fn empty() -> Self {
        Copied(Vec::new())
    }

    /// `values` in a pooled buffer (one pass, no zero-fill first).
    pub fn collect(values: impl ExactSizeIterator<Item = T>) -> Self {
        let mut buffer = take_spare();
        buffer.clear();
        buffer.extend(values);
        Copied(buffer)
    }

    /// `len` zeros in a pooled buffer: an output to compute into before the caller's array is
    /// made from it.
    pub fn zeros(len: usize) -> Self
    where
        T: Default,
    {
        let mut buffer = take_spare();
        buffer.clear();
        buffer.resize(len, T::default());
        Copied(buffer)
    }
}

impl<T: Pooled> std::ops::DerefMut for Copied<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<T: Pooled> std::ops::Deref for Copied<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Pooled> Drop for Copied<T> {
    fn drop(&mut self) {
        give_spare(std::mem::take(&mut self.0));
    }
}

/// Element types of the arrays the calls return, for which all-zero bytes are a valid value.
///
/// # Safety
///
/// An implementor must be a plain number type whose all-zero bit pattern is a valid value.
pub unsafe trait Output: Element + Copy + Default {}

// SAFETY: all-zero bytes are `0` and `0.0`.
unsafe impl Output for i32 {}
// SAFETY: as for `i32`.
unsafe impl Output for f32 {}

/// A new C-ordered numpy array of shape `dims`, zero-filled, with `fill` computing into its
/// elements before any other code can see it: one allocation, no copy. On an error of
/// `fill` the array is dropped unseen (a failed call returns no half-written array); with no
/// memory for the array, `no_memory()` is the error.
pub fn computed_into<'py, T: Output, D: Dimension, R>(
    py: Python<'py>,
    dims: D,
    no_memory: impl Fn() -> PyErr,
    fill: impl FnOnce(&mut [T]) -> PyResult<R>,
) -> PyResult<(R, Bound<'py, PyArray<T, D>>)> {
    let mut dims = dims;
    let ndim = std::ffi::c_int::try_from(dims.ndim()).map_err(|_| no_memory())?;
    // SAFETY: `PyArray_NewFromDescr` reads `ndim` extents from the pointer (`dims` holds
    // `ndim` `usize`, the layout of numpy's `npy_intp`; an extent beyond `isize::MAX` reads as
    // negative, which numpy refuses with an exception), takes no strides, no data and no base
    // object (NULL: numpy allocates a C-ordered buffer for the shape), steals the reference to
    // the descriptor that `into_dtype_ptr` hands over, and returns a new reference or NULL with
    // an exception set. The GIL is held (`py`).
    let raw = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            numpy::npyffi::get_type_object(py, numpy::npyffi::NpyTypes::PyArray_Type),
            T::get_dtype(py).into_dtype_ptr(),
            ndim,
            dims.slice_mut().as_mut_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: `raw` is a new reference or NULL with a Python exception set (above).
    let array = match unsafe { Bound::from_owned_ptr_or_err(py, raw) } {
        Ok(array) => array,
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py) => {
            return Err(no_memory())
        }
        Err(e) => return Err(e),
    };
    // SAFETY: `PyArray_NewFromDescr` made an ndarray of `ndim` dimensions with `T`'s
    // descriptor, which is exactly what `PyArray<T, D>`'s type check accepts.
    let array = unsafe { array.cast_into_unchecked::<PyArray<T, D>>() };
    let len = array.len();
    let data = array.data();
    if len == 0 || !data.is_aligned() {
        // Nothing to write, or a buffer from a user-set numpy allocator that is not aligned
        // for `T`: computed into our own buffer, then copied byte by byte.
        let mut own = Vec::new();
        own.try_reserve_exact(len).map_err(|_| no_memory())?;
        own.resize(len, T::default());
        let result = fill(&mut own)?;
        // SAFETY: `data` has room for `len` elements of `T` (numpy allocated the array's
        // buffer for its shape and dtype); bytes need no alignment; `own` is a separate
        // allocation, so the ranges do not overlap; nothing else can see the new array.
        unsafe {
            std::ptr::copy_nonoverlapping(
                own.as_ptr().cast::<u8>(),
                data.cast::<u8>(),
                std::mem::size_of_val(own.as_slice()),
            );
        }
        return Ok((result, array));
    }
    // SAFETY: `data` points to the new array's buffer of `len` elements of `T`, aligned
    // (checked above). The array was made here and is referenced only by `array`, which is not
    // handed out before the slice's last use, so no other code (Python or another thread, with
    // or without the GIL) can read or write the buffer meanwhile, and `array` keeps it alive.
    // The buffer is first written whole with zero bytes through the raw pointer (numpy's
    // allocation is not initialised), and all-zero bytes are a valid `T` (`Output`), so the
    // slice made next covers `len` valid values.
    let out = unsafe {
        std::ptr::write_bytes(data, 0, len);
        std::slice::from_raw_parts_mut(data, len)
    };
    let result = fill(out)?;
    Ok((result, array))
}

/// Batches of fewer elements than this are computed with the GIL held.
///
/// Releasing the GIL and taking it back costs a few hundred nanoseconds uncontended, and
/// when another thread takes it meanwhile, getting it back waits for that thread's switch
/// interval (5 ms by default): on a scheduler's critical path, a few microseconds of work run
/// faster holding it. Every input is the binding's own copy either way, so holding it changes
/// what other threads may do, never what the core reads.
pub const DETACH_AT: usize = 1 << 16;

/// Runs `f`, releasing the GIL while it runs when the batch has at least [`DETACH_AT`]
/// elements.
pub fn detach_if<T: Send>(py: Python<'_>, elements: usize, f: impl FnOnce() -> T + Send) -> T {
    if elements >= DETACH_AT {
        py.detach(f)
    } else {
        f()
    }
}

/// A native-byte-order copy of a float array in the other byte order (`None` for any other
/// dtype).
fn native_float<'py>(
    array: &Bound<'py, PyUntypedArray>,
) -> PyResult<Option<Bound<'py, PyUntypedArray>>> {
    let dtype = array.dtype();
    if dtype.kind() != b'f' || dtype.is_native_byteorder() != Some(false) {
        return Ok(None);
    }
    let target = match dtype.itemsize() {
        4 => "=f4",
        8 => "=f8",
        _ => return Ok(None),
    };
    let converted = array.call_method1("astype", (target,))?;
    Ok(Some(converted.cast_into::<PyUntypedArray>()?))
}

/// A `[rows, cols]` float matrix in one of the supported dtypes, row-major.
pub enum FloatMatrix {
    /// float32 data.
    F32(Copied<f32>, usize, usize),
    /// float64 data.
    F64(Copied<f64>, usize, usize),
}

impl FloatMatrix {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        match self {
            FloatMatrix::F32(_, r, _) | FloatMatrix::F64(_, r, _) => *r,
        }
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        match self {
            FloatMatrix::F32(_, _, c) | FloatMatrix::F64(_, _, c) => *c,
        }
    }

    /// A core view of the data (`argument` names it in errors).
    pub fn view(&self, argument: &'static str) -> PyResult<FloatView<'_>> {
        Ok(match self {
            FloatMatrix::F32(d, r, c) => {
                FloatView::F32(MatrixView::new(argument, d, *r, *c).map_err(to_py_err)?)
            }
            FloatMatrix::F64(d, r, c) => {
                FloatView::F64(MatrixView::new(argument, d, *r, *c).map_err(to_py_err)?)
            }
        })
    }
}

/// A view of one of the dtypes; `Copy`, so it moves into a GIL-free closure.
#[derive(Clone, Copy)]
pub enum FloatView<'a> {
    /// float32 data.
    F32(MatrixView<'a, f32>),
    /// float64 data.
    F64(MatrixView<'a, f64>),
}

/// Extracts a 2-D float32/float64 matrix, copied (module docs). An empty list or tuple is a
/// `[0, empty_cols]` float64 matrix (pass the width the call expects, or 0).
pub fn float_matrix<'py>(
    obj: &Bound<'py, PyAny>,
    argument: &str,
    empty_cols: usize,
) -> PyResult<FloatMatrix> {
    matrix(obj, argument, empty_cols)
}

fn matrix<'py>(
    obj: &Bound<'py, PyAny>,
    argument: &str,
    empty_cols: usize,
) -> PyResult<FloatMatrix> {
    let converted = convert(obj, argument)?;
    if converted.inferred_empty() && converted.array.ndim() == 1 {
        return Ok(FloatMatrix::F64(Copied::empty(), 0, empty_cols));
    }
    matrix_from(&converted.array, argument).map_err(|e| memory_error(obj.py(), e, argument))
}

fn matrix_from<'py>(array: &Bound<'py, PyUntypedArray>, argument: &str) -> PyResult<FloatMatrix> {
    let own = descriptors(array.py());
    if let Some(a) = exactly::<f32, Ix2>(array, &own.f32) {
        let (rows, cols) = (a.shape()[0], a.shape()[1]);
        return Ok(FloatMatrix::F32(Copied::of(a, argument)?, rows, cols));
    }
    if let Some(a) = exactly::<f64, Ix2>(array, &own.f64) {
        let (rows, cols) = (a.shape()[0], a.shape()[1]);
        return Ok(FloatMatrix::F64(Copied::of(a, argument)?, rows, cols));
    }
    if array.ndim() != 2 {
        return Err(value_error(
            argument,
            format!("expected a 2-D array [R, K], got shape {:?}", array.shape()),
        ));
    }
    let (rows, cols) = (array.shape()[0], array.shape()[1]);
    // A float32 or float64 descriptor that is not numpy's own (a copy of one, a byte order
    // spelled out): numpy's comparison of dtypes decides.
    if let Ok(a) = array.cast::<PyArray2<f32>>() {
        return Ok(FloatMatrix::F32(Copied::of(a, argument)?, rows, cols));
    }
    if let Ok(a) = array.cast::<PyArray2<f64>>() {
        return Ok(FloatMatrix::F64(Copied::of(a, argument)?, rows, cols));
    }
    if let Some(native) = native_float(array)? {
        // A private copy in native byte order: nobody else can write it.
        return matrix_from(&native, argument);
    }
    Err(type_error(
        argument,
        format!(
            "unsupported dtype {}; expected float32 or float64",
            dtype_name(array)
        ),
    ))
}

/// Extracts a 1-D float64 vector (any float or integer dtype is converted).
pub fn float_vector(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Vec<f64>> {
    let converted = convert(obj, argument)?;
    vector_from(&converted.array, argument).map_err(|e| memory_error(obj.py(), e, argument))
}

/// numpy's MemoryError (a conversion of a view implying more elements than memory holds, such
/// as a large `numpy.broadcast_to`) as an `OutOfMemoryError` (a ValueError) naming the argument;
/// other errors as they are.
fn memory_error(py: Python<'_>, error: PyErr, argument: &str) -> PyErr {
    if error.is_instance_of::<pyo3::exceptions::PyMemoryError>(py) {
        out_of_memory(
            argument,
            format!("cannot be converted: out of memory ({error})"),
        )
    } else {
        error
    }
}

fn vector_from(array: &Bound<'_, PyUntypedArray>, argument: &str) -> PyResult<Vec<f64>> {
    if array.ndim() != 1 {
        return Err(value_error(
            argument,
            format!("expected a 1-D array, got shape {:?}", array.shape()),
        ));
    }
    if let Ok(a) = array.cast::<PyArray1<f64>>() {
        return row_major(a, argument);
    }
    if let Ok(a) = array.cast::<PyArray1<f32>>() {
        return Ok(row_major(a, argument)?.into_iter().map(f64::from).collect());
    }
    if let Some(native) = native_float(array)? {
        return vector_from(&native, argument);
    }
    if is_integer(array) {
        let converted = array.call_method1("astype", ("float64",))?;
        let a = converted.cast::<PyArray1<f64>>()?;
        return row_major(a, argument);
    }
    Err(type_error(
        argument,
        format!(
            "unsupported dtype {}; expected a float array",
            dtype_name(array)
        ),
    ))
}

fn is_integer(array: &Bound<'_, PyUntypedArray>) -> bool {
    matches!(array.dtype().kind(), b'i' | b'u')
}

/// Extracts a 1-D integer vector as `i64`, copied into a buffer of the thread's pool (int32 and
/// int64 are read directly; other integer dtypes are converted; floats and bools are refused,
/// except an empty list or tuple). An unsigned value beyond `i64::MAX` is refused here, with its
/// value: every integer array the API takes holds small counts or indices.
pub fn int_vector(obj: &Bound<'_, PyAny>, argument: &str) -> PyResult<Copied<i64>> {
    let converted = convert(obj, argument)?;
    ints_from(&converted, argument).map_err(|e| memory_error(obj.py(), e, argument))
}

fn ints_from(converted: &Converted<'_>, argument: &str) -> PyResult<Copied<i64>> {
    let array = &converted.array;
    let own = descriptors(array.py());
    if let Some(a) = exactly::<i64, Ix1>(array, &own.i64) {
        return Copied::of(a, argument);
    }
    // int32: what the planner's per-request outputs are, passed back as arguments.
    if let Some(a) = exactly::<i32, Ix1>(array, &own.i32) {
        return widened(a, argument);
    }
    if array.ndim() != 1 {
        return Err(value_error(
            argument,
            format!("expected a 1-D array [R], got shape {:?}", array.shape()),
        ));
    }
    // An int64 or int32 descriptor that is not numpy's own: numpy's comparison decides.
    if let Ok(a) = array.cast::<PyArray1<i64>>() {
        return Copied::of(a, argument);
    }
    if let Ok(a) = array.cast::<PyArray1<i32>>() {
        return widened(a, argument);
    }
    if converted.inferred_empty() {
        return Ok(Copied::empty());
    }
    if is_integer(array) {
        if array.dtype().kind() == b'u' && array.dtype().itemsize() == 8 {
            let converted = array.call_method1("astype", ("=u8",))?;
            let values = row_major(converted.cast::<PyArray1<u64>>()?, argument)?;
            let mut ints = Copied::<i64>::zeros(values.len());
            for (i, (out, &v)) in ints.iter_mut().zip(&values).enumerate() {
                *out = i64::try_from(v)
                    .map_err(|_| value_error(argument, format!("[{i}] = {v} is out of range")))?;
            }
            return Ok(ints);
        }
        let converted = array.call_method1("astype", ("int64",))?;
        return Copied::of(converted.cast::<PyArray1<i64>>()?, argument);
    }
    Err(type_error(
        argument,
        format!(
            "unsupported dtype {}; expected an integer array",
            dtype_name(array)
        ),
    ))
}

/// An int32 vector as `i64`, in a buffer of the thread's pool.
fn widened(array: &Bound<'_, PyArray1<i32>>, argument: &str) -> PyResult<Copied<i64>> {
    let data = array.data();
    if !(array.is_c_contiguous() && data.is_aligned()) {
        let narrow = Copied::of(array, argument)?;
        return Ok(Copied::collect(narrow.iter().map(|&n| i64::from(n))));
    }
    // One pass from numpy's buffer into ours: each element read once through the raw pointer
    // (no `&[i32]` of a buffer other threads may write; see `row_major_into`).
    let len = array.len();
    let mut wide = Copied::<i64>(take_spare());
    wide.0.clear();
    wide.0
        .try_reserve_exact(len)
        .map_err(|_| no_memory_for_copy(array.as_untyped(), argument))?;
    let to = wide.0.as_mut_ptr();
    // SAFETY: `data` points to `len` aligned `i32` of a C-contiguous array (checked above) that
    // `array` keeps alive for the call, and `to` to room for `len` `i64` (reserved above) in
    // our own allocation, which does not overlap numpy's buffer; every `i < len` is in bounds
    // of both. Every bit pattern is a valid `i32`, so a value another thread writes meanwhile
    // is still an `i32`, and the core validates our copy, not numpy's buffer. The `len` values
    // are written before the length covers them.
    unsafe {
        for i in 0..len {
            to.add(i).write(i64::from(data.add(i).read()));
        }
        wide.0.set_len(len);
    }
    Ok(wide)
}
