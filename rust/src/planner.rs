//! The verification planner's bindings: `CostTables`, `choose_draft_budget`,
//! `assign_draft_budget`, `plan_verification`, `VerificationPlan`, `VerificationPlanner`,
//! `choose_draft_depth` and `DepthPlan`.
//! Conversion and error mapping only; every computation runs in `av_core` with the GIL
//! released.

use std::sync::{Mutex, MutexGuard};

use av_core::cost_tables::{median_curve, CostTables, DrafterKind};
use av_core::planner::{
    self, BudgetSource, DepthMode, DepthPlan, StepTokens, VerificationPlan, VerificationPlanner,
};
use av_core::MatrixView;
use numpy::{IntoPyArray, PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple, PyType};
use std::path::PathBuf;

use crate::files::{atomic_write, read_file};

use crate::convert::{
    as_ndarray, float_matrix, int_vector, to_py_err, type_error, value_error, Float, FloatMatrix,
    FloatView, Int,
};

/// Adds the planner's classes and functions to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCostTables>()?;
    m.add_class::<PyVerificationPlan>()?;
    m.add_class::<PyVerificationPlanner>()?;
    m.add_class::<PyDepthPlan>()?;
    m.add_function(wrap_pyfunction!(choose_draft_budget, m)?)?;
    m.add_function(wrap_pyfunction!(choose_draft_depth, m)?)?;
    m.add_function(wrap_pyfunction!(assign_draft_budget, m)?)?;
    m.add_function(wrap_pyfunction!(plan_verification, m)?)?;
    Ok(())
}

fn non_negative(argument: &'static str, value: &Int) -> PyResult<usize> {
    value.to_usize(argument)
}

/// The width an empty list of confidences gets: the `K` of the tables' draft-depth table (which
/// an array must match), or 0 without one (no width is required then).
fn empty_width(tables: &CostTables) -> usize {
    tables.max_draft_depth().unwrap_or(0)
}

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

fn step_tokens(
    num_non_draft_tokens: Int,
    num_sampling_requests: Int,
    max_draft_budget: Option<Int>,
) -> PyResult<StepTokens> {
    Ok(StepTokens {
        num_non_draft_tokens: non_negative("num_non_draft_tokens", &num_non_draft_tokens)?,
        num_sampling_requests: non_negative("num_sampling_requests", &num_sampling_requests)?,
        max_draft_budget: max_draft_budget
            .map(|cap| non_negative("max_draft_budget", &cap))
            .transpose()?,
    })
}

/// Step-cost tables in milliseconds: `draft_ms[r]` for `r` requests, `verify_ms[t]` for `t`
/// target tokens.
#[pyclass(module = "av_core._native", name = "CostTables", frozen)]
pub struct PyCostTables {
    inner: CostTables,
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
            tables
                .with_drafter(kind, non_negative("max_depth", &depth)?)
                .map_err(|mut e| {
                    // The core names its own parameter; this method calls it max_depth.
                    if e.argument == "max_draft_depth" {
                        e.argument = "max_depth";
                    }
                    e
                })
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
        if r > self.inner.max_num_reqs() {
            return Err(value_error(
                "num_requests",
                format!("= {r} exceeds max_num_reqs = {}", self.inner.max_num_reqs()),
            ));
        }
        Ok(self.inner.draft_cost_ms(r, d))
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
        let active = converted.iter().filter(|&&d| d > 0).count();
        if active > self.inner.max_num_reqs() {
            return Err(value_error(
                "depths",
                format!(
                    "has {active} drafting requests, more than max_num_reqs = {}",
                    self.inner.max_num_reqs()
                ),
            ));
        }
        Ok(self.inner.step_draft_cost_ms(&converted, &mut Vec::new()))
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

    /// `{"draft_ms": [...], "verify_ms": [...]}`, round-tripping bit-exactly.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// Tables from `to_json()` output.
    #[classmethod]
    fn from_json(_cls: &Bound<'_, PyType>, text: &str) -> PyResult<Self> {
        let inner = CostTables::from_json(text).map_err(to_py_err)?;
        Ok(PyCostTables { inner })
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyCostTables>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let constructor = slf.get_type().getattr("from_json")?;
        Ok((constructor, (slf.get().inner.to_json(),)))
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
    DrafterKind::parse(name)
        .map_err(|e| value_error("draft_depth_ms", format!("drafter kind {}", e.message)))
}

fn depth_mode(name: &str) -> PyResult<DepthMode> {
    DepthMode::parse(name).map_err(to_py_err)
}

/// How deep to draft this step: depths per request and what the decision anticipates.
#[pyclass(module = "av_core._native", name = "DepthPlan", frozen)]
pub struct PyDepthPlan {
    /// Positions to draft per request, int32 [R] (all 0: run the step without the drafter).
    #[pyo3(get)]
    depths: Py<PyArray1<i32>>,
    /// The deepest depth drafted by any request.
    #[pyo3(get)]
    max_depth: usize,
    /// Total positions to draft.
    #[pyo3(get)]
    drafts: usize,
    /// The verification budget the decision anticipates.
    #[pyo3(get)]
    budget: usize,
    /// s + the anticipated budget's survivals.
    #[pyo3(get)]
    expected_accepted_tokens: f64,
    /// Drafting cost of the depths plus verify_ms[T + budget].
    #[pyo3(get)]
    predicted_cost_ms: f64,
}

impl PyDepthPlan {
    fn wrap(py: Python<'_>, plan: DepthPlan, depths: Vec<i32>) -> Self {
        PyDepthPlan {
            depths: depths.into_pyarray(py).unbind(),
            max_depth: plan.max_depth,
            drafts: plan.drafts,
            budget: plan.budget,
            expected_accepted_tokens: plan.expected_accepted_tokens,
            predicted_cost_ms: plan.predicted_cost_ms,
        }
    }
}

#[pymethods]
impl PyDepthPlan {
    fn __repr__(&self, py: Python<'_>) -> String {
        let depths: Vec<i32> = self
            .depths
            .bind(py)
            .try_readonly()
            .map(|a| a.as_array().to_vec())
            .unwrap_or_default();
        format!(
            "DepthPlan(depths={depths:?}, max_depth={}, drafts={}, budget={}, expected_accepted_tokens={}, predicted_cost_ms={})",
            self.max_depth, self.drafts, self.budget, self.expected_accepted_tokens, self.predicted_cost_ms
        )
    }
}

/// How many positions each request should draft, decided before drafting from confidences
/// fixed before it (the previous step's): mode "batch" (one depth, capped per request) or
/// "per_request". The cost tables need a draft-depth table.
#[pyfunction]
#[pyo3(signature = (confidences, max_depths, *, num_non_draft_tokens, num_sampling_requests, cost_tables, max_draft_budget = None, mode = "batch"))]
#[allow(clippy::too_many_arguments)]
fn choose_draft_depth(
    py: Python<'_>,
    confidences: &Bound<'_, PyAny>,
    max_depths: &Bound<'_, PyAny>,
    num_non_draft_tokens: Int,
    num_sampling_requests: Int,
    cost_tables: PyRef<'_, PyCostTables>,
    max_draft_budget: Option<Int>,
    mode: &str,
) -> PyResult<PyDepthPlan> {
    let mode = depth_mode(mode)?;
    let step = step_tokens(
        num_non_draft_tokens,
        num_sampling_requests,
        max_draft_budget,
    )?;
    let matrix = float_matrix(confidences, "confidences", empty_width(&cost_tables.inner))?;
    let cap_ints = int_vector(max_depths, "max_depths")?;
    let caps: &[i64] = &cap_ints;
    let rows = matrix.rows();
    let view = matrix.view("confidences")?;
    let tables = &cost_tables.inner;
    let (plan, depths) = py
        .detach(|| {
            let mut depths = vec![0i32; rows];
            match view {
                FloatView::F32(v) => {
                    planner::choose_draft_depth(v, caps, &step, tables, mode, &mut depths)
                }
                FloatView::F64(v) => {
                    planner::choose_draft_depth(v, caps, &step, tables, mode, &mut depths)
                }
            }
            .map(|plan| (plan, depths))
        })
        .map_err(to_py_err)?;
    Ok(PyDepthPlan::wrap(py, plan, depths))
}

/// One step's plan: the budget, admitted drafts per request, the tokens it is expected to
/// emit, and its predicted cost.
#[pyclass(module = "av_core._native", name = "VerificationPlan", frozen)]
pub struct PyVerificationPlan {
    /// Total drafts to verify (the admitted counts sum to it).
    #[pyo3(get)]
    budget: usize,
    /// Admitted drafts per request, int32 [R].
    #[pyo3(get)]
    admitted: Py<PyArray1<i32>>,
    /// s + the survivals of the admitted slots (current confidences).
    #[pyo3(get)]
    expected_accepted_tokens: f64,
    /// draft_ms[R] + verify_ms[T + budget].
    #[pyo3(get)]
    predicted_cost_ms: f64,
}

impl PyVerificationPlan {
    fn wrap(py: Python<'_>, plan: VerificationPlan, admitted: Vec<i32>) -> Self {
        PyVerificationPlan {
            budget: plan.budget,
            admitted: admitted.into_pyarray(py).unbind(),
            expected_accepted_tokens: plan.expected_accepted_tokens,
            predicted_cost_ms: plan.predicted_cost_ms,
        }
    }
}

#[pymethods]
impl PyVerificationPlan {
    /// `budget, admitted, expected_accepted_tokens, predicted_cost_ms = plan`.
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let items = PyTuple::new(
            py,
            [
                self.budget.into_pyobject(py)?.into_any(),
                self.admitted.bind(py).clone().into_any(),
                self.expected_accepted_tokens.into_pyobject(py)?.into_any(),
                self.predicted_cost_ms.into_pyobject(py)?.into_any(),
            ],
        )?;
        items.try_iter().map(Bound::into_any)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let admitted: Vec<i32> = self
            .admitted
            .bind(py)
            .try_readonly()
            .map(|a| a.as_array().to_vec())
            .unwrap_or_default();
        format!(
            "VerificationPlan(budget={}, admitted={admitted:?}, expected_accepted_tokens={}, predicted_cost_ms={})",
            self.budget, self.expected_accepted_tokens, self.predicted_cost_ms
        )
    }
}

/// The draft budget: the first b maximising (s + sum of the top-b survivals) / (draft_ms[R] +
/// verify_ms[T + b]).
#[pyfunction]
#[pyo3(signature = (confidences, scheduled_drafts, *, num_non_draft_tokens, num_sampling_requests, cost_tables, max_draft_budget = None))]
fn choose_draft_budget(
    py: Python<'_>,
    confidences: &Bound<'_, PyAny>,
    scheduled_drafts: &Bound<'_, PyAny>,
    num_non_draft_tokens: Int,
    num_sampling_requests: Int,
    cost_tables: PyRef<'_, PyCostTables>,
    max_draft_budget: Option<Int>,
) -> PyResult<usize> {
    let step = step_tokens(
        num_non_draft_tokens,
        num_sampling_requests,
        max_draft_budget,
    )?;
    let matrix = float_matrix(confidences, "confidences", empty_width(&cost_tables.inner))?;
    let scheduled_ints = int_vector(scheduled_drafts, "scheduled_drafts")?;
    let scheduled: &[i64] = &scheduled_ints;
    let view = matrix.view("confidences")?;
    let tables = &cost_tables.inner;
    py.detach(|| match view {
        FloatView::F32(v) => planner::choose_draft_budget(v, scheduled, &step, tables),
        FloatView::F64(v) => planner::choose_draft_budget(v, scheduled, &step, tables),
    })
    .map_err(to_py_err)
}

/// Admitted drafts per request, int32 [R]: the `budget` highest survivals, a prefix of each
/// request.
#[pyfunction]
fn assign_draft_budget<'py>(
    py: Python<'py>,
    confidences: &Bound<'py, PyAny>,
    scheduled_drafts: &Bound<'py, PyAny>,
    budget: Int,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let budget = non_negative("budget", &budget)?;
    // In place (when C-contiguous): the planning functions read each confidence and each
    // scheduled count once, checking the value they use (see `av_core::planner`).
    let matrix = float_matrix(confidences, "confidences", 0)?;
    let scheduled_ints = int_vector(scheduled_drafts, "scheduled_drafts")?;
    let scheduled: &[i64] = &scheduled_ints;
    let rows = matrix.rows();
    let view = matrix.view("confidences")?;
    let admitted = py
        .detach(|| {
            let mut admitted = vec![0i32; rows];
            match view {
                FloatView::F32(v) => {
                    planner::assign_draft_budget(v, scheduled, budget, &mut admitted)
                }
                FloatView::F64(v) => {
                    planner::assign_draft_budget(v, scheduled, budget, &mut admitted)
                }
            }
            .map(|()| admitted)
        })
        .map_err(to_py_err)?;
    Ok(admitted.into_pyarray(py))
}

fn plan_views(
    confidences: FloatView<'_>,
    budget_confidences: Option<FloatView<'_>>,
    scheduled: &[i64],
    step: &StepTokens,
    tables: &CostTables,
    admitted: &mut [i32],
) -> av_core::Result<VerificationPlan> {
    use FloatView::{F32, F64};
    let none = None::<MatrixView<'_, f32>>;
    match (confidences, budget_confidences) {
        (F32(c), None) => planner::plan_verification(c, none, scheduled, step, tables, admitted),
        (F64(c), None) => planner::plan_verification(c, none, scheduled, step, tables, admitted),
        (F32(c), Some(F32(b))) => {
            planner::plan_verification(c, Some(b), scheduled, step, tables, admitted)
        }
        (F32(c), Some(F64(b))) => {
            planner::plan_verification(c, Some(b), scheduled, step, tables, admitted)
        }
        (F64(c), Some(F32(b))) => {
            planner::plan_verification(c, Some(b), scheduled, step, tables, admitted)
        }
        (F64(c), Some(F64(b))) => {
            planner::plan_verification(c, Some(b), scheduled, step, tables, admitted)
        }
    }
}

/// Budget and assignment in one call; the budget is sized from `budget_confidences` when
/// given (the previous step's), else from `confidences`.
#[pyfunction]
#[pyo3(signature = (confidences, scheduled_drafts, *, num_non_draft_tokens, num_sampling_requests, cost_tables, max_draft_budget = None, budget_confidences = None))]
#[allow(clippy::too_many_arguments)]
fn plan_verification(
    py: Python<'_>,
    confidences: &Bound<'_, PyAny>,
    scheduled_drafts: &Bound<'_, PyAny>,
    num_non_draft_tokens: Int,
    num_sampling_requests: Int,
    cost_tables: PyRef<'_, PyCostTables>,
    max_draft_budget: Option<Int>,
    budget_confidences: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyVerificationPlan> {
    let step = step_tokens(
        num_non_draft_tokens,
        num_sampling_requests,
        max_draft_budget,
    )?;
    let matrix = float_matrix(confidences, "confidences", empty_width(&cost_tables.inner))?;
    let scheduled_ints = int_vector(scheduled_drafts, "scheduled_drafts")?;
    let scheduled: &[i64] = &scheduled_ints;
    let budget_matrix: Option<FloatMatrix> = budget_confidences
        .filter(|b| !b.is_none())
        // An empty list is as wide as `confidences`, the shape it must match.
        .map(|b| float_matrix(b, "budget_confidences", matrix.cols()))
        .transpose()?;
    let rows = matrix.rows();
    let view = matrix.view("confidences")?;
    let budget_view = budget_matrix
        .as_ref()
        // With no rows at all there is nothing to size the budget from, and an empty list has
        // no width to compare: the plan is the one without budget confidences.
        .filter(|b| rows > 0 || b.rows() > 0)
        .map(|b| b.view("budget_confidences"))
        .transpose()?;
    let tables = &cost_tables.inner;
    let (plan, admitted) = py
        .detach(|| {
            let mut admitted = vec![0i32; rows];
            plan_views(view, budget_view, scheduled, &step, tables, &mut admitted)
                .map(|plan| (plan, admitted))
        })
        .map_err(to_py_err)?;
    Ok(PyVerificationPlan::wrap(py, plan, admitted))
}

/// Plans every decode step, remembering each request slot's confidences of the previous step
/// so the budget can be sized from them (budget_source="previous", the default).
#[pyclass(module = "av_core._native", name = "VerificationPlanner", frozen)]
pub struct PyVerificationPlanner {
    inner: Mutex<VerificationPlanner>,
    cost_tables: Py<PyCostTables>,
    /// K, fixed at construction (an empty list of confidences is `[0, K]`).
    num_positions: usize,
}

impl PyVerificationPlanner {
    fn lock(&self) -> MutexGuard<'_, VerificationPlanner> {
        // A panic cannot leave the planner half-updated (state is written after success).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PyVerificationPlanner {
    fn wrap(py: Python<'_>, planner: VerificationPlanner) -> PyResult<Self> {
        let tables = Py::new(
            py,
            PyCostTables {
                inner: planner.cost_tables().clone(),
            },
        )?;
        Ok(PyVerificationPlanner {
            num_positions: planner.num_positions(),
            inner: Mutex::new(planner),
            cost_tables: tables,
        })
    }
}

#[pymethods]
impl PyVerificationPlanner {
    #[new]
    #[pyo3(signature = (
        cost_tables,
        num_positions,
        *,
        num_slots = None,
        budget_source = "previous",
        exploration = Float::new(VerificationPlanner::DEFAULT_EXPLORATION),
        exploration_seed = Int::new(0),
    ), text_signature = "(cost_tables, num_positions, *, num_slots=None, budget_source=\"previous\", exploration=..., exploration_seed=0)")]
    fn new(
        cost_tables: Bound<'_, PyCostTables>,
        num_positions: Int,
        num_slots: Option<Int>,
        budget_source: &str,
        exploration: Float,
        exploration_seed: Int,
    ) -> PyResult<Self> {
        let source = BudgetSource::parse(budget_source).map_err(to_py_err)?;
        let tables = cost_tables.get().inner.clone();
        let num_slots = match num_slots {
            Some(n) => non_negative("num_slots", &n)?,
            None => tables.max_num_reqs(),
        };
        let mut inner = VerificationPlanner::new(
            tables,
            num_slots,
            non_negative("num_positions", &num_positions)?,
            source,
        )
        .map_err(to_py_err)?;
        inner
            .set_exploration(
                exploration.value("exploration")?,
                exploration_seed.to_u64("exploration_seed")?,
            )
            .map_err(to_py_err)?;
        Ok(PyVerificationPlanner {
            num_positions: inner.num_positions(),
            inner: Mutex::new(inner),
            cost_tables: cost_tables.unbind(),
        })
    }

    /// Probability that a request verifies its whole draft block in a step (exploration floor).
    #[getter]
    fn exploration(&self) -> f64 {
        self.lock().exploration()
    }

    /// A new request took `slot`: its remembered confidences restart at 1.0.
    fn add_request(&self, slot: Int) -> PyResult<()> {
        let slot = non_negative("slot", &slot)?;
        self.lock().add_request(slot).map_err(to_py_err)
    }

    /// Plans one step for the requests in `slots` and remembers this step's confidences of the
    /// positions each request drafted (`scheduled_drafts`); the rest keep their earlier values.
    #[pyo3(signature = (slots, confidences, scheduled_drafts, *, num_non_draft_tokens, num_sampling_requests, max_draft_budget = None))]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        confidences: &Bound<'_, PyAny>,
        scheduled_drafts: &Bound<'_, PyAny>,
        num_non_draft_tokens: Int,
        num_sampling_requests: Int,
        max_draft_budget: Option<Int>,
    ) -> PyResult<PyVerificationPlan> {
        let step = step_tokens(
            num_non_draft_tokens,
            num_sampling_requests,
            max_draft_budget,
        )?;
        // Copies: the planner reads its arguments more than once (the exploration floor and
        // what it remembers read them again after planning), so they must be its own.
        let slots = int_vector(slots, "slots")?;
        let matrix = float_matrix(confidences, "confidences", self.num_positions)?;
        let scheduled_ints: Vec<i64> = int_vector(scheduled_drafts, "scheduled_drafts")?;
        let scheduled: &[i64] = &scheduled_ints;
        let rows = matrix.rows();
        let view = matrix.view("confidences")?;
        let (plan, admitted) = py
            .detach(|| {
                let mut admitted = vec![0i32; rows];
                let mut planner = self.lock();
                match view {
                    FloatView::F32(v) => planner.plan(&slots, v, scheduled, &step, &mut admitted),
                    FloatView::F64(v) => planner.plan(&slots, v, scheduled, &step, &mut admitted),
                }
                .map(|plan| (plan, admitted))
            })
            .map_err(to_py_err)?;
        Ok(PyVerificationPlan::wrap(py, plan, admitted))
    }

    /// How many positions each request in `slots` should draft at the coming step, from the
    /// confidences remembered for its slot. Requests the next `plan` explores draft as deep as
    /// the batch does, and their whole `max_depths[r]` in an exploration step (probability
    /// `exploration`). Changes no state. The cost tables need a draft-depth table.
    #[pyo3(signature = (slots, max_depths, *, num_non_draft_tokens, num_sampling_requests, max_draft_budget = None, mode = "batch"))]
    #[allow(clippy::too_many_arguments)]
    fn choose_draft_depth(
        &self,
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        max_depths: &Bound<'_, PyAny>,
        num_non_draft_tokens: Int,
        num_sampling_requests: Int,
        max_draft_budget: Option<Int>,
        mode: &str,
    ) -> PyResult<PyDepthPlan> {
        let mode = depth_mode(mode)?;
        let step = step_tokens(
            num_non_draft_tokens,
            num_sampling_requests,
            max_draft_budget,
        )?;
        let slots = int_vector(slots, "slots")?;
        let cap_ints: Vec<i64> = int_vector(max_depths, "max_depths")?;
        let caps: &[i64] = &cap_ints;
        let (plan, depths) = py
            .detach(|| {
                let mut depths = vec![0i32; slots.len()];
                self.lock()
                    .choose_draft_depth(&slots, caps, &step, mode, &mut depths)
                    .map(|plan| (plan, depths))
            })
            .map_err(to_py_err)?;
        Ok(PyDepthPlan::wrap(py, plan, depths))
    }

    /// Remembers this step's confidences of the positions each request drafted
    /// (`scheduled_drafts`), as `plan` does, without planning (verification planned elsewhere).
    fn remember(
        &self,
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        confidences: &Bound<'_, PyAny>,
        scheduled_drafts: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        // Copies: the planner reads its arguments more than once (the exploration floor and
        // what it remembers read them again after planning), so they must be its own.
        let slots = int_vector(slots, "slots")?;
        let matrix = float_matrix(confidences, "confidences", self.num_positions)?;
        let scheduled_ints: Vec<i64> = int_vector(scheduled_drafts, "scheduled_drafts")?;
        let scheduled: &[i64] = &scheduled_ints;
        let view = matrix.view("confidences")?;
        py.detach(|| {
            let mut planner = self.lock();
            match view {
                FloatView::F32(v) => planner.remember(&slots, v, scheduled),
                FloatView::F64(v) => planner.remember(&slots, v, scheduled),
            }
        })
        .map_err(to_py_err)
    }

    /// The confidences remembered for `slot`, float64 [K] (what the next budget reads).
    fn previous_confidences<'py>(
        &self,
        py: Python<'py>,
        slot: Int,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let slot = non_negative("slot", &slot)?;
        let row = self
            .lock()
            .previous_confidences(slot)
            .map_err(to_py_err)?
            .to_vec();
        Ok(row.into_pyarray(py))
    }

    /// The planner's state (tables, settings, step count, remembered confidences) as versioned,
    /// checksummed bytes; `from_bytes` restores it.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.lock().to_bytes())
    }

    /// Rebuilds a planner from `to_bytes()`; corrupt, truncated or future-version data raises
    /// ValueError.
    #[classmethod]
    fn from_bytes(_cls: &Bound<'_, PyType>, py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        let planner = VerificationPlanner::from_bytes(data).map_err(to_py_err)?;
        Self::wrap(py, planner)
    }

    /// Writes `to_bytes()` to `path` atomically (temporary file, fsync, rename): a crash leaves
    /// the old file intact.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let bytes = self.lock().to_bytes();
        py.detach(|| atomic_write(&path, &bytes))
    }

    /// Loads a planner written by `save`; a corrupt, truncated or future-version file raises
    /// ValueError naming the path.
    #[classmethod]
    fn load(_cls: &Bound<'_, PyType>, py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let bytes = py.detach(|| read_file(&path, VerificationPlanner::MAX_ENCODED_LEN as u64))?;
        let planner = VerificationPlanner::from_bytes(&bytes)
            .map_err(|e| value_error("path", format!("{}: {e}", path.display())))?;
        Self::wrap(py, planner)
    }

    /// An independent planner with the same tables, settings and remembered confidences.
    fn copy(&self, py: Python<'_>) -> Self {
        PyVerificationPlanner {
            inner: Mutex::new(self.lock().clone()),
            cost_tables: self.cost_tables.clone_ref(py),
            num_positions: self.num_positions,
        }
    }

    fn __copy__(&self, py: Python<'_>) -> Self {
        self.copy(py)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> Self {
        self.copy(py)
    }

    /// The cost tables the planner prices steps with.
    #[getter]
    fn cost_tables(&self, py: Python<'_>) -> Py<PyCostTables> {
        self.cost_tables.clone_ref(py)
    }

    /// Number of request slots.
    #[getter]
    fn num_slots(&self) -> usize {
        self.lock().num_slots()
    }

    /// Draft positions per request, K.
    #[getter]
    fn num_positions(&self) -> usize {
        self.lock().num_positions()
    }

    /// "previous" or "current".
    #[getter]
    fn budget_source(&self) -> &'static str {
        self.lock().budget_source().as_str()
    }

    fn __repr__(&self) -> String {
        let planner = self.lock();
        format!(
            "VerificationPlanner(num_positions={}, num_slots={}, budget_source={:?})",
            planner.num_positions(),
            planner.num_slots(),
            planner.budget_source().as_str()
        )
    }
}
