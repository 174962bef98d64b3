//! `av_core._native.CostTables`: conversion around `av_core::cost_tables::CostTables`.

use av_core::cost_tables::{median_curve, CostTables, DrafterKind};
use numpy::{IntoPyArray, PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyType};
use std::path::PathBuf;

use crate::convert::{as_ndarray, int_vector, to_py_err, type_error, value_error, Int, Text};
use crate::persist;
use crate::planner::non_negative;

/// `(size, ms)` points from a sequence of pairs or an `[n, 2]` array.
fn curve_points(obj: &Bound<'_, PyAny>, argument: &'static str) -> PyResult<Vec<(f64, f64)>> {
    let array = as_ndarray(obj, argument)?;
    if array.len() == 0 {
        return Ok(Vec::new());
    }
    if array.ndim() != 2 || array.shape()[1] != 2 {
        return Err(value_error(
            argument,
            format!(
                "expected (size, ms) pairs, shape [n, 2], got shape {:?}",
                array.shape()
            ),
        ));
    }
    // Real numbers only: a complex or boolean curve is a caller's mistake, not something to
    // cast silently.
    let kind = array.dtype().kind();
    if !matches!(kind, b'f' | b'i' | b'u') {
        return Err(type_error(
            argument,
            format!("expected real numbers, got dtype {}", array.dtype()),
        ));
    }
    let converted = array
        .call_method1("astype", ("float64",))
        .map_err(|e| type_error(argument, format!("expected numbers ({e})")))?;
    let converted = converted.cast::<numpy::PyArray2<f64>>()?;
    let values = converted.try_readonly()?;
    Ok(values
        .as_array()
        .rows()
        .into_iter()
        .map(|row| (row[0], row[1]))
        .collect())
}

/// The signature shared by `CostTables::from_curves` and `CostTables::from_samples`.
type TableBuilder =
    fn(&[(f64, f64)], &[(f64, f64)], usize, usize, usize) -> av_core::Result<CostTables>;

/// The optional draft-depth argument of a table builder: the object, its name, the requested
/// depth and whether it holds raw samples (reduced to the median per depth).
type DepthArgument<'a, 'py> = (
    Option<&'a Bound<'py, PyAny>>,
    &'static str,
    Option<Int>,
    bool,
);

/// Converts two (size, ms) arrays and the three sizes, calls `builder`, then adds the
/// draft-depth table when one was given.
fn build_tables(
    builder: TableBuilder,
    (draft, draft_name): (&Bound<'_, PyAny>, &'static str),
    (verify, verify_name): (&Bound<'_, PyAny>, &'static str),
    [max_num_reqs, max_batch_tokens, cudagraph_limit]: [Int; 3],
    (depth, depth_name, max_draft_depth, samples): DepthArgument<'_, '_>,
) -> PyResult<PyCostTables> {
    let depth = depth_curve(depth, depth_name, max_draft_depth, samples)?;
    let draft = curve_points(draft, draft_name)?;
    let verify = curve_points(verify, verify_name)?;
    let inner = builder(
        &draft,
        &verify,
        non_negative("max_num_reqs", &max_num_reqs)?,
        non_negative("max_batch_tokens", &max_batch_tokens)?,
        non_negative("cudagraph_limit", &cudagraph_limit)?,
    )
    .map_err(to_py_err)?;
    let inner = match depth {
        None => inner,
        Some((curve, max_depth)) => inner
            .with_draft_depth_curve(&curve, max_depth)
            .map_err(to_py_err)?,
    };
    Ok(PyCostTables { inner })
}

/// Step-cost tables in milliseconds: `draft_ms[r]` for `r` requests, `verify_ms[t]` for `t`
/// target tokens.
#[pyclass(module = "av_core._native", name = "CostTables", frozen)]
pub struct PyCostTables {
    pub(crate) inner: CostTables,
}

#[pymethods]
impl PyCostTables {
    /// Tables from explicit arrays (finite; draft >= 0, verify > 0; the optional depth table
    /// starts at 0 and never decreases).
    #[new]
    #[pyo3(signature = (draft_ms, verify_ms, *, draft_depth_ms = None))]
    fn new(
        draft_ms: &Bound<'_, PyAny>,
        verify_ms: &Bound<'_, PyAny>,
        draft_depth_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let draft_ms = crate::convert::float_vector(draft_ms, "draft_ms")?;
        let verify_ms = crate::convert::float_vector(verify_ms, "verify_ms")?;
        let depth = draft_depth_ms
            .filter(|d| !d.is_none())
            .map(|d| crate::convert::float_vector(d, "draft_depth_ms"))
            .transpose()?;
        let mut inner = CostTables::new(draft_ms, verify_ms).map_err(to_py_err)?;
        if let Some(depth) = depth {
            inner = inner.with_draft_depth(depth).map_err(to_py_err)?;
        }
        Ok(PyCostTables { inner })
    }

    /// A copy with a draft-cost-by-depth table: explicit ms per depth `0..=K`, or the shape
    /// of a drafter kind (`"autoregressive"`: proportional to depth; `"parallel"`: one pass)
    /// with `max_depth`.
    #[pyo3(signature = (draft_depth_ms, *, max_depth = None))]
    fn with_draft_depth(
        &self,
        draft_depth_ms: &Bound<'_, PyAny>,
        max_depth: Option<Int>,
    ) -> PyResult<Self> {
        let tables = self.inner.clone();
        let inner = if let Ok(kind) = draft_depth_ms.extract::<String>() {
            let kind = drafter_kind(&kind)?;
            let depth = max_depth.ok_or_else(|| {
                value_error("max_depth", "is required with a drafter kind".to_owned())
            })?;
            tables.with_drafter(kind, non_negative("max_depth", &depth)?)
        } else {
            if max_depth.is_some() {
                return Err(value_error(
                    "max_depth",
                    "applies only with a drafter kind; an explicit table sets its own depth"
                        .to_owned(),
                ));
            }
            let table = crate::convert::float_vector(draft_depth_ms, "draft_depth_ms")?;
            tables.with_draft_depth(table)
        }
        .map_err(to_py_err)?;
        Ok(PyCostTables { inner })
    }

    /// Tables from profiled (size, ms) points with vLLM 0.33.0's semantics.
    /// `draft_depth_curve` adds a draft-cost-by-depth table from profiled (depth, ms) points
    /// over depths `0..=max_draft_depth` (default: the deepest profiled depth).
    #[classmethod]
    #[pyo3(
        signature = (draft_curve, verify_curve, *, max_num_reqs, max_batch_tokens, cudagraph_limit = Int::new(0), draft_depth_curve = None, max_draft_depth = None),
        text_signature = "($cls, draft_curve, verify_curve, *, max_num_reqs, max_batch_tokens, cudagraph_limit=0, draft_depth_curve=None, max_draft_depth=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn from_curves(
        _cls: &Bound<'_, PyType>,
        draft_curve: &Bound<'_, PyAny>,
        verify_curve: &Bound<'_, PyAny>,
        max_num_reqs: Int,
        max_batch_tokens: Int,
        cudagraph_limit: Int,
        draft_depth_curve: Option<&Bound<'_, PyAny>>,
        max_draft_depth: Option<Int>,
    ) -> PyResult<Self> {
        build_tables(
            CostTables::from_curves,
            (draft_curve, "draft_curve"),
            (verify_curve, "verify_curve"),
            [max_num_reqs, max_batch_tokens, cudagraph_limit],
            (
                draft_depth_curve,
                "draft_depth_curve",
                max_draft_depth,
                false,
            ),
        )
    }

    /// Tables from raw repeated (size, ms) timings: the median per size, then `from_curves`.
    /// `draft_depth_samples`: raw repeated (depth, ms) timings of the drafter, reduced to the
    /// median per depth like the others.
    #[classmethod]
    #[pyo3(
        signature = (draft_samples, verify_samples, *, max_num_reqs, max_batch_tokens, cudagraph_limit = Int::new(0), draft_depth_samples = None, max_draft_depth = None),
        text_signature = "($cls, draft_samples, verify_samples, *, max_num_reqs, max_batch_tokens, cudagraph_limit=0, draft_depth_samples=None, max_draft_depth=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn from_samples(
        _cls: &Bound<'_, PyType>,
        draft_samples: &Bound<'_, PyAny>,
        verify_samples: &Bound<'_, PyAny>,
        max_num_reqs: Int,
        max_batch_tokens: Int,
        cudagraph_limit: Int,
        draft_depth_samples: Option<&Bound<'_, PyAny>>,
        max_draft_depth: Option<Int>,
    ) -> PyResult<Self> {
        build_tables(
            CostTables::from_samples,
            (draft_samples, "draft_samples"),
            (verify_samples, "verify_samples"),
            [max_num_reqs, max_batch_tokens, cudagraph_limit],
            (
                draft_depth_samples,
                "draft_depth_samples",
                max_draft_depth,
                true,
            ),
        )
    }

    /// Drafter cost by depth, float64 [K + 1] (a copy), or None without a depth table.
    #[getter]
    fn draft_depth_ms<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<f64>>> {
        self.inner
            .draft_depth_ms()
            .map(|t| t.to_vec().into_pyarray(py))
    }

    /// Deepest depth the depth table covers (K), or None.
    #[getter]
    fn max_draft_depth(&self) -> Option<usize> {
        self.inner.max_draft_depth()
    }

    /// Drafting cost of `num_requests` requests drafting `depth` positions each:
    /// draft_ms[R] * draft_depth_ms[depth] / draft_depth_ms[K] (draft_ms[R] without a depth
    /// table; 0 for no requests or depth 0).
    fn draft_cost_ms(&self, num_requests: Int, depth: Int) -> PyResult<f64> {
        let r = non_negative("num_requests", &num_requests)?;
        let d = non_negative("depth", &depth)?;
        self.inner.draft_cost_ms(r, d).map_err(to_py_err)
    }

    /// Drafting cost of a step whose requests draft `depths[r]` positions each (pass j runs
    /// over the requests drafting at least j positions).
    fn step_draft_cost_ms(&self, depths: &Bound<'_, PyAny>) -> PyResult<f64> {
        let depths = int_vector(depths, "depths")?;
        let mut converted = Vec::with_capacity(depths.len());
        for (r, &d) in depths.iter().enumerate() {
            let d = usize::try_from(d)
                .map_err(|_| value_error("depths", format!("[{r}] = {d} is negative")))?;
            converted.push(d);
        }
        self.inner
            .step_draft_cost_ms(&converted, &mut Vec::new())
            .map_err(to_py_err)
    }

    /// Drafter cost by number of requests, float64 [max_num_reqs + 1] (a copy).
    #[getter]
    fn draft_ms<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        self.inner.draft_ms().to_vec().into_pyarray(py)
    }

    /// Target cost by number of tokens, float64 [max_batch_tokens + 1] (a copy).
    #[getter]
    fn verify_ms<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        self.inner.verify_ms().to_vec().into_pyarray(py)
    }

    /// Largest request count the draft table covers.
    #[getter]
    fn max_num_reqs(&self) -> usize {
        self.inner.max_num_reqs()
    }

    /// Largest token count the verify table covers.
    #[getter]
    fn max_batch_tokens(&self) -> usize {
        self.inner.max_batch_tokens()
    }

    /// `{"draft_ms": [...], "verify_ms": [...]}` (plus `"draft_depth_ms"`), round-tripping
    /// bit-exactly.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// Tables from `to_json()` output; text that is not that format raises StateError (a
    /// ValueError) naming json.
    #[classmethod]
    fn from_json(_cls: &Bound<'_, PyType>, text: Text) -> PyResult<Self> {
        let inner = CostTables::from_json(text.value("text")?).map_err(to_py_err)?;
        Ok(PyCostTables { inner })
    }

    /// The tables as versioned, checksummed bytes (bit-exact; smaller and faster than
    /// `to_json()`); `from_bytes` restores them.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        persist::to_bytes(py, &self.inner)
    }

    /// Tables from `to_bytes()`; corrupt, truncated or future-version data raises StateError
    /// (a ValueError).
    #[classmethod]
    fn from_bytes(_cls: &Bound<'_, PyType>, data: &[u8]) -> PyResult<Self> {
        Ok(PyCostTables {
            inner: persist::from_bytes(data)?,
        })
    }

    /// Writes `to_bytes()` to `path` atomically (temporary file, fsync, rename): a crash leaves
    /// the old file intact.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        persist::save(py, &self.inner, &path)
    }

    /// Loads tables written by `save`; a corrupt, truncated or future-version file raises
    /// StateError (a ValueError) naming the path.
    #[classmethod]
    fn load(_cls: &Bound<'_, PyType>, py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        Ok(PyCostTables {
            inner: persist::load(py, &path)?,
        })
    }

    /// The tables are immutable: a copy is the same object.
    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyCostTables>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    /// Pickling: the tables are rebuilt by `from_bytes` from their `to_bytes()` (pickles of
    /// 0.1.0, through `from_json`, still load).
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        persist::reduce(slf.as_any(), slf.get().inner.to_bytes())
    }

    fn __repr__(&self) -> String {
        match self.inner.max_draft_depth() {
            None => format!(
                "CostTables(max_num_reqs={}, max_batch_tokens={})",
                self.inner.max_num_reqs(),
                self.inner.max_batch_tokens()
            ),
            Some(depth) => format!(
                "CostTables(max_num_reqs={}, max_batch_tokens={}, max_draft_depth={depth})",
                self.inner.max_num_reqs(),
                self.inner.max_batch_tokens()
            ),
        }
    }
}

/// Profiled (depth, ms) points and the depth the table should cover.
type DepthCurve = (Vec<(f64, f64)>, usize);

/// The (depth, ms) curve and its table depth, from points or raw samples.
fn depth_curve(
    obj: Option<&Bound<'_, PyAny>>,
    argument: &'static str,
    max_draft_depth: Option<Int>,
    samples: bool,
) -> PyResult<Option<DepthCurve>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        if max_draft_depth.is_some() {
            return Err(value_error("max_draft_depth", format!("needs {argument}")));
        }
        return Ok(None);
    };
    let mut curve = curve_points(obj, argument)?;
    if samples {
        curve = median_curve(argument, &curve).map_err(to_py_err)?;
    }
    let max_depth = match max_draft_depth {
        Some(d) => non_negative("max_draft_depth", &d)?,
        None => curve
            .last()
            .map_or(0, |&(depth, _)| depth.max(0.0) as usize),
    };
    Ok(Some((curve, max_depth)))
}

/// A drafter kind given in place of `draft_depth_ms` (the error names that argument).
fn drafter_kind(name: &str) -> PyResult<DrafterKind> {
    DrafterKind::parse("draft_depth_ms", name).map_err(to_py_err)
}

/// A `cost_tables` argument: the tables, or `InvalidTypeError` naming the argument and what was
/// passed (pyo3's own check would raise a bare `TypeError`, outside `av_core.Error`). Used as
/// `#[pyo3(from_py_with = crate::cost_tables::bound_argument)]`.
pub fn bound_argument<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyCostTables>> {
    match obj.cast::<PyCostTables>() {
        Ok(tables) => Ok(tables.clone()),
        Err(_) => Err(type_error(
            "cost_tables",
            format!(
                "must be an av_core.CostTables, got {}",
                obj.get_type().name()?
            ),
        )),
    }
}

/// [`bound_argument`], borrowed.
pub fn argument<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PyRef<'py, PyCostTables>> {
    Ok(bound_argument(obj)?.borrow())
}
