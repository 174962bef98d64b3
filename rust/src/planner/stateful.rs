//! `av_core._native.VerificationPlanner`: conversion around
//! `av_core::planner::VerificationPlanner`.

use std::sync::{Mutex, MutexGuard};

use av_core::persist::Persistent;
use av_core::planner::{BudgetSource, Exploration, VerificationPlanner};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyType};
use std::path::PathBuf;

use super::{
    depth_mode, elements, non_negative, on_view, per_request, step_tokens, PyDepthPlan,
    PyVerificationPlan,
};
use crate::convert::{detach_if, float_matrix, int_vector, to_py_err, Float, Int, Text};
use crate::cost_tables::PyCostTables;
use crate::persist;

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
        budget_source = Text::new("previous"),
        exploration = Float::new(VerificationPlanner::DEFAULT_EXPLORATION),
        exploration_seed = Int::new(0),
    ), text_signature = "(cost_tables, num_positions, *, num_slots=None, budget_source=\"previous\", exploration=0.01, exploration_seed=0)")]
    fn new(
        #[pyo3(from_py_with = crate::cost_tables::bound_argument)] cost_tables: Bound<
            '_,
            PyCostTables,
        >,
        num_positions: Int,
        num_slots: Option<Int>,
        budget_source: Text,
        exploration: Float,
        exploration_seed: Int,
    ) -> PyResult<Self> {
        let source =
            BudgetSource::parse(budget_source.value("budget_source")?).map_err(to_py_err)?;
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
        inner.set_exploration(
            Exploration::new(
                "exploration",
                exploration.value("exploration")?,
                exploration_seed.to_u64("exploration_seed")?,
            )
            .map_err(to_py_err)?,
        );
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

    /// The seed of the exploration draws.
    #[getter]
    fn exploration_seed(&self) -> u64 {
        self.lock().exploration_seed()
    }

    /// Sets the exploration floor: probability `exploration` in [0, 1] (0 turns it off), draws
    /// from `exploration_seed`. The step count is kept. A rejected call changes nothing.
    #[pyo3(signature = (exploration, *, exploration_seed = Int::new(0)), text_signature = "(self, exploration, *, exploration_seed=0)")]
    fn set_exploration(&self, exploration: Float, exploration_seed: Int) -> PyResult<()> {
        let policy = Exploration::new(
            "exploration",
            exploration.value("exploration")?,
            exploration_seed.to_u64("exploration_seed")?,
        )
        .map_err(to_py_err)?;
        self.lock().set_exploration(policy);
        Ok(())
    }

    /// Counts one step without planning it (verification planned elsewhere): advances the step
    /// count that the exploration draws read, as `plan` does. Call it once per step, after
    /// `choose_draft_depth`.
    fn count_step(&self) {
        self.lock().count_step();
    }

    /// The exploration draws of the coming step (the one the next `choose_draft_depth` decides
    /// and the next `plan` or `count_step` counts): `(exploration_step, explorers)`, where
    /// `explorers[r]` (bool [R]) says whether request `slots[r]` explores and
    /// `exploration_step` whether explorers draft their whole block. Changes no state.
    fn coming_explorers<'py>(
        &self,
        py: Python<'py>,
        slots: &Bound<'_, PyAny>,
    ) -> PyResult<(bool, Bound<'py, PyArray1<bool>>)> {
        let slots = int_vector(slots, "slots")?;
        let mut explorers = vec![false; slots.len()];
        let whole = self
            .lock()
            .coming_explorers(&slots, &mut explorers)
            .map_err(to_py_err)?;
        Ok((whole, explorers.into_pyarray(py)))
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
        let scheduled = int_vector(scheduled_drafts, "scheduled_drafts")?;
        let view = matrix.view("confidences")?;
        let (plan, admitted) = per_request(
            py,
            "admitted",
            matrix.rows(),
            elements(&matrix),
            |admitted| {
                let mut planner = self.lock();
                on_view!(view, |v| planner
                    .plan(&slots, v, &scheduled, &step, admitted))
            },
        )?;
        Ok(PyVerificationPlan::wrap(plan, admitted))
    }

    /// How many positions each request in `slots` should draft at the coming step, from the
    /// confidences remembered for its slot. Requests the next `plan` explores draft as deep as
    /// the batch does, and their whole `max_depths[r]` in an exploration step (probability
    /// `exploration`). Changes no state. The cost tables need a draft-depth table.
    #[pyo3(signature = (slots, max_depths, *, num_non_draft_tokens, num_sampling_requests, max_draft_budget = None, mode = Text::new("batch")), text_signature = "($self, slots, max_depths, *, num_non_draft_tokens, num_sampling_requests, max_draft_budget=None, mode=\"batch\")")]
    #[allow(clippy::too_many_arguments)]
    fn choose_draft_depth(
        &self,
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        max_depths: &Bound<'_, PyAny>,
        num_non_draft_tokens: Int,
        num_sampling_requests: Int,
        max_draft_budget: Option<Int>,
        mode: Text,
    ) -> PyResult<PyDepthPlan> {
        let mode = depth_mode(mode.value("mode")?)?;
        let step = step_tokens(
            num_non_draft_tokens,
            num_sampling_requests,
            max_draft_budget,
        )?;
        let slots = int_vector(slots, "slots")?;
        let caps = int_vector(max_depths, "max_depths")?;
        let work = slots.len().saturating_mul(self.num_positions);
        let (plan, depths) = per_request(py, "depths", slots.len(), work, |depths| {
            self.lock()
                .choose_draft_depth(&slots, &caps, &step, mode, depths)
        })?;
        Ok(PyDepthPlan::wrap(plan, depths))
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
        let scheduled = int_vector(scheduled_drafts, "scheduled_drafts")?;
        let view = matrix.view("confidences")?;
        detach_if(py, elements(&matrix), || {
            let mut planner = self.lock();
            on_view!(view, |v| planner.remember(&slots, v, &scheduled))
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
        persist::to_bytes(py, &*self.lock())
    }

    /// Rebuilds a planner from `to_bytes()` (of this release or an earlier one); corrupt,
    /// truncated or future-version data raises StateError (a ValueError).
    #[classmethod]
    fn from_bytes(_cls: &Bound<'_, PyType>, py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        Self::wrap(py, persist::from_bytes(data)?)
    }

    /// Writes `to_bytes()` to `path` atomically (temporary file, fsync, rename): a crash leaves
    /// the old file intact.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let bytes = self.lock().encode();
        persist::save_encoded(py, &bytes, &path)
    }

    /// Loads a planner written by `save`; a corrupt, truncated or future-version file raises
    /// StateError (a ValueError) naming the path.
    #[classmethod]
    fn load(_cls: &Bound<'_, PyType>, py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        Self::wrap(py, persist::load(py, &path)?)
    }

    /// Pickling: the planner is rebuilt by `from_bytes` from its `to_bytes()`.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let bytes = slf.get().lock().encode();
        persist::reduce(slf.as_any(), bytes)
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
