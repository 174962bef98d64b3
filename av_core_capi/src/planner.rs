//! The verification planner: the stateless `avc_choose_draft_budget`,
//! `avc_assign_draft_budget`, `avc_plan_verification` and `avc_choose_draft_depth`, and the
//! stateful `avc_planner` (`av_core::planner::VerificationPlanner`), whose
//! `avc_planner_choose_draft_depth` decides the drafting depth from its remembered confidences.
//!
//! Thread safety: the stateless functions are reentrant (they may share one cost-tables
//! handle across threads). The core planner's `plan` needs exclusive access (it updates the
//! remembered confidences), so the handle holds it behind a mutex: calls on one planner from
//! several threads are safe and run one at a time. A serving engine normally plans from one
//! scheduler thread and never contends on it.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};

use av_core::planner::{
    self, BudgetSource, DepthMode, DepthPlan, Exploration, StepTokens, VerificationPlan,
    VerificationPlanner,
};
use av_core::{ErrorKind, MatrixView};

use crate::cost_tables::AvcCostTables;
use crate::handle::{borrow, destroy, publish, Handle};
use crate::raw::{input, input_ref, out_value, output, OutSlice};
use crate::status::{guard, AvcStatus, FfiError, FfiResult};

/// Which confidences size the draft budget (an int32_t; pass one of the constants).
pub type AvcBudgetSource = i32;

/// Size the budget from each slot's confidences of the previous step (new slots: 1.0). The
/// default, and the only lossless choice for autoregressive drafters (EAGLE, MTP, draft
/// models), whose deeper confidences depend on the token drafted earlier.
pub const AVC_BUDGET_SOURCE_PREVIOUS: AvcBudgetSource = 0;
/// Size the budget from this step's confidences: lossless only for drafters whose positions
/// do not depend on earlier draft tokens (parallel / block drafters).
pub const AVC_BUDGET_SOURCE_CURRENT: AvcBudgetSource = 1;

/// The step-level numbers the budget needs besides the confidences.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvcStepTokens {
    /// T: tokens scheduled this step that are not drafts (one per decode request, whole
    /// chunks for prefills). The target's cost is read at verify_ms[T + budget].
    pub num_non_draft_tokens: usize,
    /// s: requests that sample a token this step whatever the budget.
    pub num_sampling_requests: usize,
    /// Largest budget to consider; SIZE_MAX for no cap (every scheduled draft). Always capped
    /// at the number of scheduled drafts.
    pub max_draft_budget: usize,
}

impl From<&AvcStepTokens> for StepTokens {
    fn from(step: &AvcStepTokens) -> Self {
        StepTokens {
            num_non_draft_tokens: step.num_non_draft_tokens,
            num_sampling_requests: step.num_sampling_requests,
            max_draft_budget: (step.max_draft_budget != usize::MAX)
                .then_some(step.max_draft_budget),
        }
    }
}

/// What a plan decided (the admitted counts go to the caller's array).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AvcVerificationPlan {
    /// Total drafts to verify; the admitted counts sum to it.
    pub budget: usize,
    /// s + the survivals of the admitted drafts under the current confidences: the tokens the
    /// step is expected to emit.
    pub expected_accepted_tokens: f64,
    /// draft_ms[R] + verify_ms[T + budget], the step's predicted cost.
    pub predicted_cost_ms: f64,
}

impl From<VerificationPlan> for AvcVerificationPlan {
    fn from(plan: VerificationPlan) -> Self {
        AvcVerificationPlan {
            budget: plan.budget,
            expected_accepted_tokens: plan.expected_accepted_tokens,
            predicted_cost_ms: plan.predicted_cost_ms,
        }
    }
}

/// How the drafting depth is decided (an int32_t; pass one of the constants).
pub type AvcDepthMode = i32;

/// One depth D for the whole batch, each request drafting min(D, max_depths[r]): the shape
/// drafters that run in lockstep (CUDA graphs, EAGLE's fixed-depth loop) can use.
pub const AVC_DEPTH_MODE_BATCH: AvcDepthMode = 0;
/// Each request drafts its own depth (a prefix of its positions in survival order); never
/// worse than AVC_DEPTH_MODE_BATCH under the same cost model when draft_ms is non-decreasing.
pub const AVC_DEPTH_MODE_PER_REQUEST: AvcDepthMode = 1;

/// What a drafting-depth decision decided (the depths go to the caller's array).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AvcDepthPlan {
    /// The deepest depth any request drafts (0: run the step without the drafter).
    pub max_depth: usize,
    /// Total positions to draft, the sum of the depths.
    pub drafts: usize,
    /// The verification budget the decision anticipates (the verification planner decides
    /// the real one once the drafts exist).
    pub budget: usize,
    /// s + the anticipated budget's survivals: the tokens the step is expected to emit.
    pub expected_accepted_tokens: f64,
    /// The drafting cost of the chosen depths plus verify_ms[T + budget].
    pub predicted_cost_ms: f64,
}

impl From<DepthPlan> for AvcDepthPlan {
    fn from(plan: DepthPlan) -> Self {
        AvcDepthPlan {
            max_depth: plan.max_depth,
            drafts: plan.drafts,
            budget: plan.budget,
            expected_accepted_tokens: plan.expected_accepted_tokens,
            predicted_cost_ms: plan.predicted_cost_ms,
        }
    }
}

/// The core's mode for the C constant `mode`.
fn depth_mode(mode: AvcDepthMode) -> FfiResult<DepthMode> {
    match mode {
        AVC_DEPTH_MODE_BATCH => Ok(DepthMode::Batch),
        AVC_DEPTH_MODE_PER_REQUEST => Ok(DepthMode::PerRequest),
        other => Err(FfiError::value(
            "mode",
            format!(
                "must be AVC_DEPTH_MODE_BATCH (0) or AVC_DEPTH_MODE_PER_REQUEST (1), got {other}"
            ),
        )),
    }
}

/// A depth decision's error for C callers: an error about the cost tables' draft-depth table
/// (by its kind) names the C argument that holds the tables (`tables`, or `planner` for its
/// tables) and, when the table is missing, how to add one with the C functions; any other error
/// is the core's.
fn depth_error(error: av_core::Error, tables: &'static str, what: &str) -> FfiError {
    match error.kind {
        ErrorKind::MissingDepthTable => FfiError::value(
            tables,
            format!(
                "{what} no draft-depth table; add one with avc_cost_tables_with_draft_depth or \
                 avc_cost_tables_with_drafter"
            ),
        ),
        ErrorKind::DepthTableMismatch => FfiError::value(tables, error.message),
        _ => error.into(),
    }
}

/// A stateful verification planner: remembers each request slot's confidences of the previous
/// step. Create with avc_planner_new, free with avc_planner_free. Calls on one planner are
/// serialized by an internal lock, so it may be shared between threads.
#[repr(C)]
pub struct AvcPlanner {
    tag: AtomicU64,
    planner: Mutex<VerificationPlanner>,
}

impl Handle for AvcPlanner {
    const MAGIC: u64 = u64::from_le_bytes(*b"avcPLANR");
    const NAME: &'static str = "avc_planner";
    fn tag(&self) -> &AtomicU64 {
        &self.tag
    }
}

impl AvcPlanner {
    fn lock(&self) -> MutexGuard<'_, VerificationPlanner> {
        // The planner stores its new state only after a plan succeeded, so a panic (caught at
        // the boundary) cannot leave it half-updated; poisoning carries no information.
        self.planner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The `[rows, cols]` confidences at `confidences`.
///
/// # Safety
///
/// `raw::input`'s contract for `rows * cols` floats.
unsafe fn confidences_view<'a>(
    confidences: *const f32,
    num_rows: usize,
    num_cols: usize,
    argument: &'static str,
) -> FfiResult<MatrixView<'a, f32>> {
    let len = num_rows.checked_mul(num_cols).ok_or_else(|| {
        FfiError::value(
            argument,
            format!("shape [{num_rows}, {num_cols}] overflows size_t"),
        )
    })?;
    // SAFETY: forwarded contract.
    let data = unsafe { input(confidences, len, argument)? };
    Ok(MatrixView::new(argument, data, num_rows, num_cols)?)
}

/// Runs a decision that writes one `int32` per request (`out.len()` of them) into a buffer of
/// this thread's, then copies it to `out` once the decision succeeded (a rejected call writes
/// nothing). Every decision goes through here, so none allocates per call.
fn per_request<P, E: Into<FfiError>>(
    out: OutSlice<'_, i32>,
    decide: impl FnOnce(&mut [i32]) -> Result<P, E>,
) -> FfiResult<P> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|cell| {
        // A fresh buffer if this thread's is in use (a decision never calls back into C, so
        // that does not happen; the fallback keeps it from being a panic).
        let mut own = Vec::new();
        let mut guard = cell.try_borrow_mut();
        let buffer = match guard.as_mut() {
            Ok(buffer) => &mut **buffer,
            Err(_) => &mut own,
        };
        buffer.clear();
        buffer.resize(out.len(), 0);
        let decided = decide(buffer).map_err(Into::into)?;
        out.write(buffer);
        Ok(decided)
    })
}

/// Fails if `admitted` overlaps any of the inputs.
fn admitted_disjoint(
    admitted: &OutSlice<'_, i32>,
    confidences: &[f32],
    scheduled: &[i64],
    other: Option<(&[i64], &str)>,
) -> FfiResult {
    admitted.ensure_disjoint("admitted", confidences, "confidences")?;
    admitted.ensure_disjoint("admitted", scheduled, "scheduled_drafts")?;
    if let Some((data, name)) = other {
        admitted.ensure_disjoint("admitted", data, name)?;
    }
    Ok(())
}

/// The draft budget: the first b maximising (s + sum of the b highest survivals) /
/// (draft_ms[R] + verify_ms[T + b]), vLLM-compatible bit for bit.
///
/// confidences [num_rows, num_cols] are per-position acceptance probabilities given the
/// earlier drafts were accepted (what avc_estimator_predict returns), in [0, 1];
/// scheduled_drafts[r] (scheduled_len = num_rows) in 0..=num_cols is how many drafts request
/// r brought. Writes the budget to *budget_out.
///
/// Errors: AVC_ERR_NULL; AVC_ERR_VALUE for confidences outside [0, 1] or NaN, scheduled
/// counts out of range or of the wrong length, more requests than the draft table covers,
/// num_sampling_requests > num_rows, T + budget beyond the verify table.
///
/// # Safety
///
/// Arrays must point to their stated number of readable elements (or be NULL with length 0);
/// step must be NULL or point to an initialized avc_step_tokens; tables must be NULL or live
/// cost tables; budget_out must be NULL or point to a writable size_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_choose_draft_budget(
    confidences: *const f32,
    num_rows: usize,
    num_cols: usize,
    scheduled_drafts: *const i64,
    scheduled_len: usize,
    step: *const AvcStepTokens,
    tables: *const AvcCostTables,
    budget_out: *mut usize,
) -> AvcStatus {
    guard("avc_choose_draft_budget", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (confidences, scheduled, step, tables, out) = unsafe {
            (
                confidences_view(confidences, num_rows, num_cols, "confidences")?,
                input(scheduled_drafts, scheduled_len, "scheduled_drafts")?,
                input_ref(step, "step")?,
                borrow(tables, "tables")?,
                out_value(budget_out, "budget_out")?,
            )
        };
        let budget =
            planner::choose_draft_budget(confidences, scheduled, &step.into(), &tables.tables)?;
        out.write(budget);
        Ok(())
    })
}

/// Admits the budget highest-survival drafts: writes to admitted[r] (admitted_len =
/// num_rows) how many leading drafts of request r to verify. Always a prefix of each request,
/// never above scheduled_drafts[r], summing to min(budget, total scheduled drafts).
///
/// # Safety
///
/// Arrays must point to their stated number of readable (inputs) or writable (admitted)
/// elements, or be NULL with length 0; admitted must not overlap an input.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_assign_draft_budget(
    confidences: *const f32,
    num_rows: usize,
    num_cols: usize,
    scheduled_drafts: *const i64,
    scheduled_len: usize,
    budget: usize,
    admitted: *mut i32,
    admitted_len: usize,
) -> AvcStatus {
    guard("avc_assign_draft_budget", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (confidences, scheduled, out) = unsafe {
            (
                confidences_view(confidences, num_rows, num_cols, "confidences")?,
                input(scheduled_drafts, scheduled_len, "scheduled_drafts")?,
                output(admitted, admitted_len, "admitted")?,
            )
        };
        admitted_disjoint(&out, confidences.data(), scheduled, None)?;
        per_request(out, |admitted| {
            planner::assign_draft_budget(confidences, scheduled, budget, admitted)
        })
    })
}

/// Budget and assignment in one call. The budget is sized from budget_confidences when it is
/// not NULL (same shape as confidences, budget_confidences_len = num_rows * num_cols; pass
/// the previous step's confidences for autoregressive drafters), else from confidences; the
/// assignment always uses confidences. Writes admitted[r] and *plan_out.
///
/// # Safety
///
/// Arrays must point to their stated number of readable (inputs) or writable (admitted)
/// elements, or be NULL with length 0; step must be NULL or point to an initialized
/// avc_step_tokens; tables must be NULL or live cost tables; plan_out must be NULL or point
/// to a writable avc_verification_plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_plan_verification(
    confidences: *const f32,
    num_rows: usize,
    num_cols: usize,
    budget_confidences: *const f32,
    budget_confidences_len: usize,
    scheduled_drafts: *const i64,
    scheduled_len: usize,
    step: *const AvcStepTokens,
    tables: *const AvcCostTables,
    admitted: *mut i32,
    admitted_len: usize,
    plan_out: *mut AvcVerificationPlan,
) -> AvcStatus {
    guard("avc_plan_verification", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (confidences, scheduled, step, tables, out, plan) = unsafe {
            (
                confidences_view(confidences, num_rows, num_cols, "confidences")?,
                input(scheduled_drafts, scheduled_len, "scheduled_drafts")?,
                input_ref(step, "step")?,
                borrow(tables, "tables")?,
                output(admitted, admitted_len, "admitted")?,
                out_value(plan_out, "plan_out")?,
            )
        };
        let budget_view = if budget_confidences.is_null() && budget_confidences_len == 0 {
            None
        } else {
            // SAFETY: as above; NULL with a non-zero length is refused inside.
            let data = unsafe {
                input(
                    budget_confidences,
                    budget_confidences_len,
                    "budget_confidences",
                )?
            };
            Some(MatrixView::new(
                "budget_confidences",
                data,
                num_rows,
                num_cols,
            )?)
        };
        admitted_disjoint(&out, confidences.data(), scheduled, None)?;
        if let Some(view) = &budget_view {
            out.ensure_disjoint("admitted", view.data(), "budget_confidences")?;
        }
        let decided = per_request(out, |admitted| {
            planner::plan_verification(
                confidences,
                budget_view,
                scheduled,
                &step.into(),
                &tables.tables,
                admitted,
            )
        })?;
        plan.write(decided.into());
        Ok(())
    })
}

/// How many positions each request should draft this step, decided before drafting: for
/// each candidate depth the best verification budget, pricing the drafter by depth with the
/// tables' draft-depth table (avc_cost_tables_with_draft_depth / _with_drafter; its K must be
/// at least num_cols). Nothing here reads a token of the step it governs, so pass confidences
/// fixed before it (the previous step's; the stateful avc_planner_choose_draft_depth uses the
/// ones it remembers).
///
/// confidences [num_rows, num_cols] are per-position acceptance probabilities in [0, 1];
/// max_depths[r] (max_depths_len = num_rows) in 0..=num_cols caps request r (0 for requests
/// that cannot draft, such as prefills). step is as for avc_choose_draft_budget, with the
/// largest budget bounded by the sum of max_depths. mode is AVC_DEPTH_MODE_BATCH or
/// AVC_DEPTH_MODE_PER_REQUEST. Writes depths[r] (depths_len = num_rows), each in
/// 0..=max_depths[r] (all 0: run the step without the drafter), and *plan_out.
///
/// Errors: AVC_ERR_NULL; AVC_ERR_INVALID_HANDLE; AVC_ERR_VALUE for tables without a
/// draft-depth table or one shallower than num_cols, confidences outside [0, 1] or NaN,
/// max_depths out of range or of the wrong length, depths of the wrong length or overlapping
/// an input, a mode that is not one of the constants, and the step errors of
/// avc_choose_draft_budget. A rejected call writes nothing.
///
/// # Safety
///
/// Arrays must point to their stated number of readable (inputs) or writable (depths)
/// elements, or be NULL with length 0; depths must not overlap an input; step must be NULL or
/// point to an initialized avc_step_tokens; tables must be NULL or live cost tables; plan_out
/// must be NULL or point to a writable avc_depth_plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_choose_draft_depth(
    confidences: *const f32,
    num_rows: usize,
    num_cols: usize,
    max_depths: *const i64,
    max_depths_len: usize,
    step: *const AvcStepTokens,
    tables: *const AvcCostTables,
    mode: AvcDepthMode,
    depths: *mut i32,
    depths_len: usize,
    plan_out: *mut AvcDepthPlan,
) -> AvcStatus {
    guard("avc_choose_draft_depth", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (confidences, caps, step, tables, out, plan) = unsafe {
            (
                confidences_view(confidences, num_rows, num_cols, "confidences")?,
                input(max_depths, max_depths_len, "max_depths")?,
                input_ref(step, "step")?,
                borrow(tables, "tables")?,
                output(depths, depths_len, "depths")?,
                out_value(plan_out, "plan_out")?,
            )
        };
        let mode = depth_mode(mode)?;
        out.ensure_disjoint("depths", confidences.data(), "confidences")?;
        out.ensure_disjoint("depths", caps, "max_depths")?;
        let decided = per_request(out, |depths| {
            planner::choose_draft_depth(
                confidences,
                caps,
                &step.into(),
                &tables.tables,
                mode,
                depths,
            )
            .map_err(|error| depth_error(error, "tables", "have"))
        })?;
        plan.write(decided.into());
        Ok(())
    })
}

/// Creates a planner for num_slots request slots of num_positions (K >= 1) drafts each, with
/// a copy of tables (the tables handle may be freed afterwards). budget_source is
/// AVC_BUDGET_SOURCE_PREVIOUS (lossless for every drafter) or AVC_BUDGET_SOURCE_CURRENT.
/// Every slot starts with confidences 1.0. On success *planner_out is a new handle owned by
/// the caller (free with avc_planner_free); on failure it is NULL.
///
/// # Safety
///
/// tables must be NULL or live cost tables; planner_out must be NULL (an error) or point to
/// a writable avc_planner pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_new(
    tables: *const AvcCostTables,
    num_slots: usize,
    num_positions: usize,
    budget_source: AvcBudgetSource,
    planner_out: *mut *mut AvcPlanner,
) -> AvcStatus {
    guard("avc_planner_new", || {
        // SAFETY: the caller's contract is `out_value`'s and `borrow`'s.
        let (out, tables) = unsafe {
            let out = out_value(planner_out, "planner_out")?;
            out.write(std::ptr::null_mut());
            (out, borrow(tables, "tables")?)
        };
        let source = match budget_source {
            AVC_BUDGET_SOURCE_PREVIOUS => BudgetSource::Previous,
            AVC_BUDGET_SOURCE_CURRENT => BudgetSource::Current,
            other => {
                return Err(FfiError::value(
                    "budget_source",
                    format!(
                        "must be AVC_BUDGET_SOURCE_PREVIOUS (0) or AVC_BUDGET_SOURCE_CURRENT (1), got {other}"
                    ),
                ))
            }
        };
        let planner =
            VerificationPlanner::new(tables.tables.clone(), num_slots, num_positions, source)?;
        out.write(publish(AvcPlanner {
            tag: AtomicU64::new(AvcPlanner::MAGIC),
            planner: Mutex::new(planner),
        }));
        Ok(())
    })
}

/// Frees a planner. NULL is a no-op; a pointer that is not a live planner (a second free)
/// returns AVC_ERR_INVALID_HANDLE and frees nothing.
///
/// # Safety
///
/// No other call may be using the planner, on any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_free(planner: *mut AvcPlanner) -> AvcStatus {
    // SAFETY: the caller guarantees exclusive access, which is `destroy`'s contract.
    guard("avc_planner_free", || unsafe {
        destroy(planner, "planner")
    })
}

/// A new request took slot: its remembered confidences restart at 1.0.
///
/// # Safety
///
/// planner must be NULL or a live planner.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_add_request(
    planner: *mut AvcPlanner,
    slot: usize,
) -> AvcStatus {
    guard("avc_planner_add_request", || {
        // SAFETY: the caller's contract is `borrow`'s.
        let handle = unsafe { borrow(planner, "planner")? };
        handle.lock().add_request(slot)?;
        Ok(())
    })
}

/// Sets the exploration floor: each step, each request verifies its whole scheduled draft
/// block with probability `probability` (default 0.01; 0 turns it off), and drafting-depth
/// decisions widen the same requests. The draws come from (seed, step, slot), never from
/// tokens, so the floor stays lossless. AVC_ERR_VALUE for a probability outside [0, 1] or NaN;
/// a rejected call changes nothing.
///
/// # Safety
///
/// planner must be NULL or a live planner.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_set_exploration(
    planner: *mut AvcPlanner,
    probability: f64,
    seed: u64,
) -> AvcStatus {
    guard("avc_planner_set_exploration", || {
        // SAFETY: the caller's contract is `borrow`'s.
        let handle = unsafe { borrow(planner, "planner")? };
        let exploration = Exploration::new("probability", probability, seed)?;
        handle.lock().set_exploration(exploration);
        Ok(())
    })
}

/// Saves the planner's state (its cost tables, settings, the step count that drives the
/// exploration draws, and every slot's remembered confidences) as versioned, checksummed bytes
/// that avc_planner_load restores; the Python bindings' VerificationPlanner.to_bytes writes the
/// same bytes. A restored planner plans every later step exactly as this one would.
///
/// Writes the size to *len_out, then the bytes to buf if cap is large enough; if not, returns
/// AVC_ERR_BUFFER_TOO_SMALL and writes nothing to buf (a first call with buf = NULL, cap = 0
/// learns the size; it changes only when the planner does).
///
/// # Safety
///
/// planner must be NULL or a live planner; buf must point to cap writable bytes (or be NULL
/// with cap = 0); len_out must be NULL (an error) or point to a writable size_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_save(
    planner: *const AvcPlanner,
    buf: *mut u8,
    cap: usize,
    len_out: *mut usize,
) -> AvcStatus {
    guard("avc_planner_save", || {
        // SAFETY: the caller's contract is `persist::save`'s.
        unsafe {
            crate::persist::save(planner, "planner", buf, cap, len_out, |handle| {
                handle.lock().to_bytes()
            })
        }
    })
}

/// Restores a planner saved by avc_planner_save (or by the Python bindings, of this release or
/// an earlier one). On success *planner_out is a new handle owned by the caller; on failure it
/// is NULL. Truncated, corrupt (checksum), foreign or future-version data, or a state no
/// planner could hold, give AVC_ERR_VALUE naming "data".
///
/// # Safety
///
/// data must point to len readable bytes (or be NULL with len = 0); planner_out must be NULL
/// (an error) or point to a writable avc_planner pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_load(
    data: *const u8,
    len: usize,
    planner_out: *mut *mut AvcPlanner,
) -> AvcStatus {
    guard("avc_planner_load", || {
        // SAFETY: the caller's contract is `persist::load`'s.
        unsafe {
            crate::persist::load(data, len, planner_out, "planner_out", |bytes| {
                Ok(publish(AvcPlanner {
                    tag: AtomicU64::new(AvcPlanner::MAGIC),
                    planner: Mutex::new(VerificationPlanner::from_bytes(bytes)?),
                }))
            })
        }
    })
}

/// Plans one step for the requests in slots (distinct slot indices, slots_len = num_rows, one
/// per row of confidences) and remembers, for the next, this step's confidences of the
/// positions each request drafted (scheduled_drafts[r]; the others keep their values). The budget
/// comes from the budget source (previous step's confidences per slot, or the current ones);
/// the assignment from the current confidences. Writes admitted[r] (admitted_len = num_rows)
/// and *plan_out. A rejected call changes nothing.
///
/// # Safety
///
/// planner must be NULL or a live planner; arrays must point to their stated number of
/// readable (inputs) or writable (admitted) elements, or be NULL with length 0; step must be
/// NULL or point to an initialized avc_step_tokens; plan_out must be NULL or point to a
/// writable avc_verification_plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_plan(
    planner: *mut AvcPlanner,
    slots: *const i64,
    slots_len: usize,
    confidences: *const f32,
    num_rows: usize,
    num_cols: usize,
    scheduled_drafts: *const i64,
    scheduled_len: usize,
    step: *const AvcStepTokens,
    admitted: *mut i32,
    admitted_len: usize,
    plan_out: *mut AvcVerificationPlan,
) -> AvcStatus {
    guard("avc_planner_plan", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (handle, slots, confidences, scheduled, step, out, plan) = unsafe {
            (
                borrow(planner, "planner")?,
                input(slots, slots_len, "slots")?,
                confidences_view(confidences, num_rows, num_cols, "confidences")?,
                input(scheduled_drafts, scheduled_len, "scheduled_drafts")?,
                input_ref(step, "step")?,
                output(admitted, admitted_len, "admitted")?,
                out_value(plan_out, "plan_out")?,
            )
        };
        admitted_disjoint(&out, confidences.data(), scheduled, Some((slots, "slots")))?;
        let decided = per_request(out, |admitted| {
            handle
                .lock()
                .plan(slots, confidences, scheduled, &step.into(), admitted)
        })?;
        plan.write(decided.into());
        Ok(())
    })
}

/// Remembers this step's confidences of the positions each request in slots drafted
/// (scheduled_drafts[r]), as avc_planner_plan does, without planning: for engines that plan
/// verification themselves but take the drafting depth from avc_planner_choose_draft_depth.
/// slots (slots_len = num_rows) are distinct slot indices, one per row of confidences
/// ([num_rows, num_cols], num_cols = the planner's K); confidences past a request's drafts are
/// not read. Errors as avc_planner_plan's for these arguments. A rejected call changes nothing.
///
/// # Safety
///
/// planner must be NULL or a live planner; arrays must point to their stated number of
/// readable elements, or be NULL with length 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_remember(
    planner: *mut AvcPlanner,
    slots: *const i64,
    slots_len: usize,
    confidences: *const f32,
    num_rows: usize,
    num_cols: usize,
    scheduled_drafts: *const i64,
    scheduled_len: usize,
) -> AvcStatus {
    guard("avc_planner_remember", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (handle, slots, confidences, scheduled) = unsafe {
            (
                borrow(planner, "planner")?,
                input(slots, slots_len, "slots")?,
                confidences_view(confidences, num_rows, num_cols, "confidences")?,
                input(scheduled_drafts, scheduled_len, "scheduled_drafts")?,
            )
        };
        handle.lock().remember(slots, confidences, scheduled)?;
        Ok(())
    })
}

/// Counts one step without planning it: advances the step count that the exploration draws
/// read, as avc_planner_plan does. For engines that plan verification themselves (with
/// avc_planner_remember) and take only the drafting depth from
/// avc_planner_choose_draft_depth: call it once per step, after the depth decision; without
/// it every step draws the same explorers.
///
/// # Safety
///
/// planner must be NULL or a live planner.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_count_step(planner: *mut AvcPlanner) -> AvcStatus {
    guard("avc_planner_count_step", || {
        // SAFETY: the caller's contract is `borrow`'s.
        let handle = unsafe { borrow(planner, "planner")? };
        handle.lock().count_step();
        Ok(())
    })
}

/// The exploration draws of the coming step (the one the next avc_planner_choose_draft_depth
/// decides and the next avc_planner_plan or avc_planner_count_step counts): writes
/// explorers[r] (explorers_len = slots_len), whether request slots[r] explores (the plan
/// verifies its whole drafted block; the depth decision lets it draft as deep as the batch),
/// and *exploration_step_out, whether the step is an exploration step (its explorers draft
/// their whole block). The draws read only the seed, the step count and the slot. Changes no
/// state; a rejected call (AVC_ERR_NULL, AVC_ERR_VALUE for a slot out of range, a length
/// mismatch or explorers overlapping slots) writes nothing.
///
/// # Safety
///
/// planner must be NULL or a live planner; slots must point to slots_len readable elements
/// and explorers to explorers_len writable bools (each NULL with length 0);
/// exploration_step_out must be NULL or point to a writable bool.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_coming_explorers(
    planner: *const AvcPlanner,
    slots: *const i64,
    slots_len: usize,
    explorers: *mut bool,
    explorers_len: usize,
    exploration_step_out: *mut bool,
) -> AvcStatus {
    guard("avc_planner_coming_explorers", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (handle, slots, out, whole_out) = unsafe {
            (
                borrow(planner, "planner")?,
                input(slots, slots_len, "slots")?,
                output(explorers, explorers_len, "explorers")?,
                out_value(exploration_step_out, "exploration_step_out")?,
            )
        };
        out.ensure_disjoint("explorers", slots, "slots")?;
        let mut result = vec![false; out.len()];
        let whole = handle.lock().coming_explorers(slots, &mut result)?;
        out.write(&result);
        whole_out.write(whole);
        Ok(())
    })
}

/// Copies the confidences remembered for slot (what the next budget will read) to
/// confidences (confidences_len = the planner's K).
///
/// # Safety
///
/// planner must be NULL or a live planner; confidences must point to confidences_len
/// writable doubles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_previous_confidences(
    planner: *const AvcPlanner,
    slot: usize,
    confidences: *mut f64,
    confidences_len: usize,
) -> AvcStatus {
    guard("avc_planner_previous_confidences", || {
        // SAFETY: the caller's contract is `borrow`'s and `output`'s.
        let (handle, out) = unsafe {
            (
                borrow(planner, "planner")?,
                output(confidences, confidences_len, "confidences")?,
            )
        };
        let planner = handle.lock();
        let remembered = planner.previous_confidences(slot)?;
        if remembered.len() != out.len() {
            return Err(FfiError::value(
                "confidences_len",
                format!(
                    "must equal num_positions = {}, got {}",
                    remembered.len(),
                    out.len()
                ),
            ));
        }
        out.write(remembered);
        Ok(())
    })
}

/// How many positions each request in slots (distinct slot indices, slots_len = number of
/// requests R) should draft this step, decided by avc_choose_draft_depth's rule from the
/// confidences the planner remembers for those slots (the previous step's; 1.0 for new
/// requests). With the planner's exploration floor (1% of the requests per step, drawn from
/// the step count and the slot, never from tokens), a request that the next avc_planner_plan
/// explores drafts as deep as the deepest request already does, and in an exploration step
/// (1% of the steps) its full max_depths[r], so deep positions keep receiving labels. Changes
/// no state: the next plan is the same whether or not this was called.
///
/// The planner's cost tables need a draft-depth table covering its K (make the tables with
/// avc_cost_tables_with_draft_depth / _with_drafter before avc_planner_new). max_depths[r]
/// (max_depths_len = R) in 0..=K caps request r; mode is AVC_DEPTH_MODE_BATCH or
/// AVC_DEPTH_MODE_PER_REQUEST. Writes depths[r] (depths_len = R) and *plan_out; once drafted,
/// pass the depths (as scheduled_drafts) to the next avc_planner_plan.
///
/// Errors: as avc_choose_draft_depth, plus duplicate or out-of-range slots. A rejected call
/// writes nothing.
///
/// # Safety
///
/// planner must be NULL or a live planner; arrays must point to their stated number of
/// readable (inputs) or writable (depths) elements, or be NULL with length 0; depths must not
/// overlap an input; step must be NULL or point to an initialized avc_step_tokens; plan_out
/// must be NULL or point to a writable avc_depth_plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_planner_choose_draft_depth(
    planner: *const AvcPlanner,
    slots: *const i64,
    slots_len: usize,
    max_depths: *const i64,
    max_depths_len: usize,
    step: *const AvcStepTokens,
    mode: AvcDepthMode,
    depths: *mut i32,
    depths_len: usize,
    plan_out: *mut AvcDepthPlan,
) -> AvcStatus {
    guard("avc_planner_choose_draft_depth", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (handle, slots, caps, step, out, plan) = unsafe {
            (
                borrow(planner, "planner")?,
                input(slots, slots_len, "slots")?,
                input(max_depths, max_depths_len, "max_depths")?,
                input_ref(step, "step")?,
                output(depths, depths_len, "depths")?,
                out_value(plan_out, "plan_out")?,
            )
        };
        let mode = depth_mode(mode)?;
        out.ensure_disjoint("depths", slots, "slots")?;
        out.ensure_disjoint("depths", caps, "max_depths")?;
        let decided = per_request(out, |depths| {
            handle
                .lock()
                .choose_draft_depth(slots, caps, &step.into(), mode, depths)
                .map_err(|error| depth_error(error, "planner", "its cost tables have"))
        })?;
        plan.write(decided.into());
        Ok(())
    })
}
