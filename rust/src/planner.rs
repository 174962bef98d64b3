//! The verification planner's bindings: `CostTables`, `choose_draft_budget`,
//! `assign_draft_budget`, `plan_verification`, `VerificationPlan` and `VerificationPlanner`.
//! Conversion and error mapping only; every computation runs in `av_core` with the GIL
//! released.

use std::sync::{Mutex, MutexGuard};

use av_core::cost_tables::CostTables;
use av_core::planner::{self, BudgetSource, StepTokens, VerificationPlan, VerificationPlanner};
use av_core::MatrixView;
use numpy::{IntoPyArray, PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple, PyType};
use std::path::PathBuf;

use crate::files::{atomic_write, read_file};

use crate::convert::{
    as_ndarray, float_matrix, int_vector, to_py_err, type_error, value_error, FloatMatrix,
    FloatView,
};

/// Adds the planner's classes and functions to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCostTables>()?;
    m.add_class::<PyVerificationPlan>()?;
    m.add_class::<PyVerificationPlanner>()?;
    m.add_function(wrap_pyfunction!(choose_draft_budget, m)?)?;
    m.add_function(wrap_pyfunction!(assign_draft_budget, m)?)?;
    m.add_function(wrap_pyfunction!(plan_verification, m)?)?;
    Ok(())
}

fn non_negative(argument: &'static str, value: i64) -> PyResult<usize> {
    usize::try_from(value)
        .map_err(|_| value_error(argument, format!("must be non-negative, got {value}")))
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

/// Converts two (size, ms) arrays and the three sizes, then calls `builder`.
fn build_tables(
    builder: TableBuilder,
    (draft, draft_name): (&Bound<'_, PyAny>, &'static str),
    (verify, verify_name): (&Bound<'_, PyAny>, &'static str),
    [max_num_reqs, max_batch_tokens, cudagraph_limit]: [i64; 3],
) -> PyResult<PyCostTables> {
    let draft = curve_points(draft, draft_name)?;
    let verify = curve_points(verify, verify_name)?;
    let inner = builder(
        &draft,
        &verify,
        non_negative("max_num_reqs", max_num_reqs)?,
        non_negative("max_batch_tokens", max_batch_tokens)?,
        non_negative("cudagraph_limit", cudagraph_limit)?,
    )
    .map_err(to_py_err)?;
    Ok(PyCostTables { inner })
}

fn step_tokens(
    num_non_draft_tokens: i64,
    num_sampling_requests: i64,
    max_draft_budget: Option<i64>,
) -> PyResult<StepTokens> {
    Ok(StepTokens {
        num_non_draft_tokens: non_negative("num_non_draft_tokens", num_non_draft_tokens)?,
        num_sampling_requests: non_negative("num_sampling_requests", num_sampling_requests)?,
        max_draft_budget: max_draft_budget
            .map(|cap| non_negative("max_draft_budget", cap))
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
    /// Tables from explicit arrays (finite; draft >= 0, verify > 0).
    #[new]
    fn new(draft_ms: &Bound<'_, PyAny>, verify_ms: &Bound<'_, PyAny>) -> PyResult<Self> {
        let draft_ms = crate::convert::float_vector(draft_ms, "draft_ms")?;
        let verify_ms = crate::convert::float_vector(verify_ms, "verify_ms")?;
        let inner = CostTables::new(draft_ms, verify_ms).map_err(to_py_err)?;
        Ok(PyCostTables { inner })
    }

    /// Tables from profiled (size, ms) points with vLLM 0.33.0's semantics.
    #[classmethod]
    #[pyo3(signature = (draft_curve, verify_curve, *, max_num_reqs, max_batch_tokens, cudagraph_limit = 0))]
    fn from_curves(
        _cls: &Bound<'_, PyType>,
        draft_curve: &Bound<'_, PyAny>,
        verify_curve: &Bound<'_, PyAny>,
        max_num_reqs: i64,
        max_batch_tokens: i64,
        cudagraph_limit: i64,
    ) -> PyResult<Self> {
        build_tables(
            CostTables::from_curves,
            (draft_curve, "draft_curve"),
            (verify_curve, "verify_curve"),
            [max_num_reqs, max_batch_tokens, cudagraph_limit],
        )
    }

    /// Tables from raw repeated (size, ms) timings: the median per size, then `from_curves`.
    #[classmethod]
    #[pyo3(signature = (draft_samples, verify_samples, *, max_num_reqs, max_batch_tokens, cudagraph_limit = 0))]
    fn from_samples(
        _cls: &Bound<'_, PyType>,
        draft_samples: &Bound<'_, PyAny>,
        verify_samples: &Bound<'_, PyAny>,
        max_num_reqs: i64,
        max_batch_tokens: i64,
        cudagraph_limit: i64,
    ) -> PyResult<Self> {
        build_tables(
            CostTables::from_samples,
            (draft_samples, "draft_samples"),
            (verify_samples, "verify_samples"),
            [max_num_reqs, max_batch_tokens, cudagraph_limit],
        )
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
        format!(
            "CostTables(max_num_reqs={}, max_batch_tokens={})",
            self.inner.max_num_reqs(),
            self.inner.max_batch_tokens()
        )
    }
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
    num_non_draft_tokens: i64,
    num_sampling_requests: i64,
    cost_tables: PyRef<'_, PyCostTables>,
    max_draft_budget: Option<i64>,
) -> PyResult<usize> {
    let step = step_tokens(
        num_non_draft_tokens,
        num_sampling_requests,
        max_draft_budget,
    )?;
    let matrix = float_matrix(confidences, "confidences")?;
    let scheduled = int_vector(scheduled_drafts, "scheduled_drafts")?;
    let view = matrix.view("confidences")?;
    let tables = &cost_tables.inner;
    py.detach(|| match view {
        FloatView::F32(v) => planner::choose_draft_budget(v, &scheduled, &step, tables),
        FloatView::F64(v) => planner::choose_draft_budget(v, &scheduled, &step, tables),
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
    budget: i64,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let budget = non_negative("budget", budget)?;
    let matrix = float_matrix(confidences, "confidences")?;
    let scheduled = int_vector(scheduled_drafts, "scheduled_drafts")?;
    let rows = matrix.rows();
    let view = matrix.view("confidences")?;
    let admitted = py
        .detach(|| {
            let mut admitted = vec![0i32; rows];
            match view {
                FloatView::F32(v) => {
                    planner::assign_draft_budget(v, &scheduled, budget, &mut admitted)
                }
                FloatView::F64(v) => {
                    planner::assign_draft_budget(v, &scheduled, budget, &mut admitted)
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
    num_non_draft_tokens: i64,
    num_sampling_requests: i64,
    cost_tables: PyRef<'_, PyCostTables>,
    max_draft_budget: Option<i64>,
    budget_confidences: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyVerificationPlan> {
    let step = step_tokens(
        num_non_draft_tokens,
        num_sampling_requests,
        max_draft_budget,
    )?;
    let matrix = float_matrix(confidences, "confidences")?;
    let scheduled = int_vector(scheduled_drafts, "scheduled_drafts")?;
    let budget_matrix: Option<FloatMatrix<'_>> = budget_confidences
        .filter(|b| !b.is_none())
        .map(|b| float_matrix(b, "budget_confidences"))
        .transpose()?;
    let rows = matrix.rows();
    let view = matrix.view("confidences")?;
    let budget_view = budget_matrix
        .as_ref()
        .map(|b| b.view("budget_confidences"))
        .transpose()?;
    let tables = &cost_tables.inner;
    let (plan, admitted) = py
        .detach(|| {
            let mut admitted = vec![0i32; rows];
            plan_views(view, budget_view, &scheduled, &step, tables, &mut admitted)
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
        exploration = VerificationPlanner::DEFAULT_EXPLORATION,
        exploration_seed = 0,
    ))]
    fn new(
        cost_tables: Bound<'_, PyCostTables>,
        num_positions: i64,
        num_slots: Option<i64>,
        budget_source: &str,
        exploration: f64,
        exploration_seed: u64,
    ) -> PyResult<Self> {
        let source = BudgetSource::parse(budget_source).map_err(to_py_err)?;
        let tables = cost_tables.get().inner.clone();
        let num_slots = match num_slots {
            Some(n) => non_negative("num_slots", n)?,
            None => tables.max_num_reqs(),
        };
        let mut inner = VerificationPlanner::new(
            tables,
            num_slots,
            non_negative("num_positions", num_positions)?,
            source,
        )
        .map_err(to_py_err)?;
        inner
            .set_exploration(exploration, exploration_seed)
            .map_err(to_py_err)?;
        Ok(PyVerificationPlanner {
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
    fn add_request(&self, slot: i64) -> PyResult<()> {
        let slot = non_negative("slot", slot)?;
        self.lock().add_request(slot).map_err(to_py_err)
    }

    /// Plans one step for the requests in `slots` and remembers this step's confidences.
    #[pyo3(signature = (slots, confidences, scheduled_drafts, *, num_non_draft_tokens, num_sampling_requests, max_draft_budget = None))]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        confidences: &Bound<'_, PyAny>,
        scheduled_drafts: &Bound<'_, PyAny>,
        num_non_draft_tokens: i64,
        num_sampling_requests: i64,
        max_draft_budget: Option<i64>,
    ) -> PyResult<PyVerificationPlan> {
        let step = step_tokens(
            num_non_draft_tokens,
            num_sampling_requests,
            max_draft_budget,
        )?;
        let slots = int_vector(slots, "slots")?;
        let matrix = float_matrix(confidences, "confidences")?;
        let scheduled = int_vector(scheduled_drafts, "scheduled_drafts")?;
        let rows = matrix.rows();
        let view = matrix.view("confidences")?;
        let (plan, admitted) = py
            .detach(|| {
                let mut admitted = vec![0i32; rows];
                let mut planner = self.lock();
                match view {
                    FloatView::F32(v) => planner.plan(&slots, v, &scheduled, &step, &mut admitted),
                    FloatView::F64(v) => planner.plan(&slots, v, &scheduled, &step, &mut admitted),
                }
                .map(|plan| (plan, admitted))
            })
            .map_err(to_py_err)?;
        Ok(PyVerificationPlan::wrap(py, plan, admitted))
    }

    /// The confidences remembered for `slot`, float64 [K] (what the next budget reads).
    fn previous_confidences<'py>(
        &self,
        py: Python<'py>,
        slot: i64,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let slot = non_negative("slot", slot)?;
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
        let bytes = py.detach(|| read_file(&path))?;
        let planner = VerificationPlanner::from_bytes(&bytes)
            .map_err(|e| value_error("path", format!("{}: {e}", path.display())))?;
        Self::wrap(py, planner)
    }

    /// An independent planner with the same tables, settings and remembered confidences.
    fn copy(&self, py: Python<'_>) -> Self {
        PyVerificationPlanner {
            inner: Mutex::new(self.lock().clone()),
            cost_tables: self.cost_tables.clone_ref(py),
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
