//! The verification planner's bindings: `choose_draft_budget`, `assign_draft_budget`,
//! `plan_verification`, `VerificationPlan`, `choose_draft_depth`, `DepthPlan`, and (in
//! `stateful`) `VerificationPlanner`; `CostTables` is in `cost_tables`, as in the core.
//!
//! Conversion and error mapping only. The stateless functions and the planner's methods are
//! each one call into the core (where the free functions are one-shot uses of the planner's
//! engine), and every argument kind is converted by one function here: [`step_tokens`] for
//! the step's numbers, `float_matrix` and `int_vector` (in `convert`) for the arrays,
//! [`per_request`] for the output array and the GIL. Small batches run with the GIL held
//! (`convert::DETACH_AT`).

use av_core::cost_tables::CostTables;
use av_core::planner::{self, DepthMode, DepthPlan, StepTokens, VerificationPlan};
use av_core::MatrixView;
use numpy::ndarray::Ix1;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::convert::{
    computed_into, detach_if, float_matrix, int_vector, to_py_err, FloatMatrix, FloatView, Int,
    Text,
};
use crate::cost_tables::PyCostTables;
use crate::error::out_of_memory;

mod stateful;

use stateful::PyVerificationPlanner;

/// Adds the planner's classes and functions to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCostTables>()?;
    m.add(
        "DRAFT_COST_FLOOR_MS",
        av_core::cost_tables::DRAFT_COST_FLOOR_MS,
    )?;
    m.add(
        "VERIFY_COST_FLOOR_MS",
        av_core::cost_tables::VERIFY_COST_FLOOR_MS,
    )?;
    m.add_class::<PyVerificationPlan>()?;
    m.add_class::<PyVerificationPlanner>()?;
    m.add(
        "DEFAULT_EXPLORATION",
        av_core::planner::VerificationPlanner::DEFAULT_EXPLORATION,
    )?;
    m.add_class::<PyDepthPlan>()?;
    m.add_function(wrap_pyfunction!(choose_draft_budget, m)?)?;
    m.add_function(wrap_pyfunction!(choose_draft_depth, m)?)?;
    m.add_function(wrap_pyfunction!(assign_draft_budget, m)?)?;
    m.add_function(wrap_pyfunction!(plan_verification, m)?)?;
    Ok(())
}

/// A count or index argument.
pub(crate) fn non_negative(argument: &'static str, value: &Int) -> PyResult<usize> {
    value.to_usize(argument)
}

/// The width an empty list of confidences gets: the `K` of the tables' draft-depth table (which
/// an array must match), or 0 without one (no width is required then).
fn empty_width(tables: &CostTables) -> usize {
    tables.max_draft_depth().unwrap_or(0)
}

pub(crate) fn step_tokens(
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

pub(crate) fn depth_mode(name: &str) -> PyResult<DepthMode> {
    DepthMode::parse(name).map_err(to_py_err)
}

/// Runs `$body` with `$v` bound to the core view of either dtype.
macro_rules! on_view {
    ($view:expr, |$v:ident| $body:expr) => {
        match $view {
            $crate::convert::FloatView::F32($v) => $body,
            $crate::convert::FloatView::F64($v) => $body,
        }
    };
}
pub(crate) use on_view;

/// Runs a decision that writes one `int32` per request (`rows` of them, the array `output`)
/// over a batch of `elements` confidences: with the GIL held for small batches, released for
/// large ones (`convert::detach_if`). Returns the decision's result and the per-request array,
/// which the decision writes directly (`convert::computed_into`); on error no array is
/// returned.
pub(crate) fn per_request<'py, P: Send>(
    py: Python<'py>,
    output: &str,
    rows: usize,
    elements: usize,
    decide: impl FnOnce(&mut [i32]) -> av_core::Result<P> + Send,
) -> PyResult<(P, Bound<'py, PyArray1<i32>>)> {
    let no_memory = || out_of_memory(output, format!("no memory for {rows} results"));
    computed_into(py, Ix1(rows), no_memory, |out| {
        detach_if(py, elements, || decide(out)).map_err(to_py_err)
    })
}

/// How deep to draft this step: depths per request and what the decision anticipates.
#[pyclass(module = "av_core._native", name = "DepthPlan", frozen)]
pub(crate) struct PyDepthPlan {
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
    pub(crate) fn wrap(plan: DepthPlan, depths: Bound<'_, PyArray1<i32>>) -> Self {
        PyDepthPlan {
            depths: depths.unbind(),
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
#[pyo3(signature = (confidences, max_depths, *, num_non_draft_tokens, num_sampling_requests, cost_tables, max_draft_budget = None, mode = Text::new("batch")), text_signature = "(confidences, max_depths, *, num_non_draft_tokens, num_sampling_requests, cost_tables, max_draft_budget=None, mode=\"batch\")")]
#[allow(clippy::too_many_arguments)]
fn choose_draft_depth(
    py: Python<'_>,
    confidences: &Bound<'_, PyAny>,
    max_depths: &Bound<'_, PyAny>,
    num_non_draft_tokens: Int,
    num_sampling_requests: Int,
    #[pyo3(from_py_with = crate::cost_tables::argument)] cost_tables: PyRef<'_, PyCostTables>,
    max_draft_budget: Option<Int>,
    mode: Text,
) -> PyResult<PyDepthPlan> {
    let mode = depth_mode(mode.value("mode")?)?;
    let step = step_tokens(
        num_non_draft_tokens,
        num_sampling_requests,
        max_draft_budget,
    )?;
    let matrix = float_matrix(confidences, "confidences", empty_width(&cost_tables.inner))?;
    let caps = int_vector(max_depths, "max_depths")?;
    let view = matrix.view("confidences")?;
    let tables = &cost_tables.inner;
    let (plan, depths) = per_request(py, "depths", matrix.rows(), elements(&matrix), |depths| {
        on_view!(view, |v| planner::choose_draft_depth(
            v, &caps, &step, tables, mode, depths
        ))
    })?;
    Ok(PyDepthPlan::wrap(plan, depths))
}

/// One step's plan: the budget, admitted drafts per request, the tokens it is expected to
/// emit, and its predicted cost.
#[pyclass(module = "av_core._native", name = "VerificationPlan", frozen)]
pub(crate) struct PyVerificationPlan {
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
    pub(crate) fn wrap(plan: VerificationPlan, admitted: Bound<'_, PyArray1<i32>>) -> Self {
        PyVerificationPlan {
            budget: plan.budget,
            admitted: admitted.unbind(),
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
    #[pyo3(from_py_with = crate::cost_tables::argument)] cost_tables: PyRef<'_, PyCostTables>,
    max_draft_budget: Option<Int>,
) -> PyResult<usize> {
    let step = step_tokens(
        num_non_draft_tokens,
        num_sampling_requests,
        max_draft_budget,
    )?;
    let matrix = float_matrix(confidences, "confidences", empty_width(&cost_tables.inner))?;
    let scheduled = int_vector(scheduled_drafts, "scheduled_drafts")?;
    let view = matrix.view("confidences")?;
    let tables = &cost_tables.inner;
    detach_if(py, elements(&matrix), || {
        on_view!(view, |v| planner::choose_draft_budget(
            v, &scheduled, &step, tables
        ))
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
    let matrix = float_matrix(confidences, "confidences", 0)?;
    let scheduled = int_vector(scheduled_drafts, "scheduled_drafts")?;
    let view = matrix.view("confidences")?;
    let ((), admitted) = per_request(
        py,
        "admitted",
        matrix.rows(),
        elements(&matrix),
        |admitted| {
            on_view!(view, |v| planner::assign_draft_budget(
                v, &scheduled, budget, admitted
            ))
        },
    )?;
    Ok(admitted)
}

/// The number of confidences in a batch (what decides whether the GIL is released).
pub(crate) fn elements(matrix: &FloatMatrix) -> usize {
    matrix.rows().saturating_mul(matrix.cols())
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
    #[pyo3(from_py_with = crate::cost_tables::argument)] cost_tables: PyRef<'_, PyCostTables>,
    max_draft_budget: Option<Int>,
    budget_confidences: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyVerificationPlan> {
    let step = step_tokens(
        num_non_draft_tokens,
        num_sampling_requests,
        max_draft_budget,
    )?;
    let matrix = float_matrix(confidences, "confidences", empty_width(&cost_tables.inner))?;
    let scheduled = int_vector(scheduled_drafts, "scheduled_drafts")?;
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
    let (plan, admitted) = per_request(py, "admitted", rows, elements(&matrix), |admitted| {
        plan_views(view, budget_view, &scheduled, &step, tables, admitted)
    })?;
    Ok(PyVerificationPlan::wrap(plan, admitted))
}
