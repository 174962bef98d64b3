//! The verification planner: how many drafts to verify this step, and whose.
//!
//! Inputs per step: `confidences[r, k]`, the probability that draft `k` of request `r` is
//! accepted given that drafts `0..k` were (not yet multiplied), and `scheduled_drafts[r]`, how
//! many drafts request `r` brought. The survival `S[r, k] = Π_{j≤k} confidences[r, j]` is the
//! probability that the target accepts draft `k`, so verifying a set of prefixes is expected to
//! yield the sum of their survivals in accepted drafts.
//!
//! * [`choose_draft_budget`] — how many drafts to verify in total (docs/design.md,
//!   "The planner and its cost tables"; vLLM-compatible bit for bit).
//! * [`assign_draft_budget`] — which ones: the highest survivals, a prefix of every request.
//! * [`plan_verification`] — both in one call, with the budget optionally sized from other
//!   confidences (the previous step's), which is what keeps autoregressive drafters lossless.
//! * [`VerificationPlanner`] — keeps the previous step's confidences per request slot and
//!   plans with `budget_source = previous` (the default) or `current`.
//! * [`choose_draft_depth`] — before drafting: how many positions to draft at all, per request
//!   or for the batch, pricing the drafter by depth (`planner::depth`). The stateful planner
//!   offers it on its remembered confidences.
//!
//! Cost: nothing sorts the `R·K` survivals. Each row is already descending, so one counting
//! pass over value buckets bounds the budget's objective and only the few buckets that can hold
//! the optimum are sorted and scanned (`planner::budget`); the assignment needs only the
//! budget's threshold, found by the same scan or by one more counting pass
//! (`planner::assignment`). `O(R·K)` passes plus a sort of a small candidate set.

use std::cell::RefCell;

use crate::cost_tables::CostTables;
use crate::error::{Error, ErrorKind, Result};
use crate::matrix::MatrixView;

mod assignment;
mod budget;
mod counting;
mod depth;
mod exploration;
mod order;
mod stateful;

pub use depth::{DepthMode, DepthPlan};
pub use exploration::Exploration;
pub use stateful::VerificationPlanner;

use assignment::AssignBuffers;
use budget::BudgetBuffers;
use depth::DepthBuffers;
use order::Survivals;

/// Which confidences size the draft budget.
///
/// Speculative sampling stays lossless only if the decision to verify draft `k` does not read
/// the token drafted at `k`. For an autoregressive drafter (EAGLE, MTP, draft models) the
/// confidences past `k` depend on that token, and the budget reads all of them; so the
/// budget must come from the previous step's confidences (vLLM does this). Drafters whose
/// positions do not depend on earlier draft tokens (parallel / block drafters) may use the
/// current ones. The assignment always uses the current confidences; it is lossless either way
/// (see `planner::assignment`).
///
/// # Example
///
/// ```rust
/// use av_core::planner::BudgetSource;
///
/// assert_eq!(BudgetSource::default(), BudgetSource::Previous); // lossless for every drafter
/// assert_eq!(BudgetSource::Current.as_str(), "current");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BudgetSource {
    /// Size the budget from each slot's confidences of the previous step (new slots: 1.0).
    #[default]
    Previous,
    /// Size the budget from this step's confidences.
    Current,
}

impl BudgetSource {
    /// Parses `"previous"` or `"current"`.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::planner::BudgetSource;
    ///
    /// assert_eq!(BudgetSource::parse("current")?, BudgetSource::Current);
    /// let err = BudgetSource::parse("Previous").unwrap_err(); // case-sensitive
    /// assert_eq!(err.argument, "budget_source");
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "previous" => Ok(BudgetSource::Previous),
            "current" => Ok(BudgetSource::Current),
            other => Err(Error::value(
                "budget_source",
                format!("must be \"previous\" or \"current\", got \"{other}\""),
            )),
        }
    }

    /// `"previous"` or `"current"`.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetSource::Previous => "previous",
            BudgetSource::Current => "current",
        }
    }
}

/// The step-level numbers the budget needs besides the confidences.
///
/// # Example
///
/// ```rust
/// use av_core::planner::StepTokens;
///
/// // 6 decode requests (one token each) plus a 250-token prefill chunk; the 6 decodes sample.
/// let step = StepTokens {
///     num_non_draft_tokens: 6 + 250,
///     num_sampling_requests: 6,
///     ..StepTokens::default() // max_draft_budget: None, every scheduled draft
/// };
/// assert_eq!(step.max_draft_budget, None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepTokens {
    /// `T`: tokens scheduled this step that are not drafts (one per decode request, whole
    /// chunks for prefills). The target's cost is read at `verify_ms[T + b]`.
    pub num_non_draft_tokens: usize,
    /// `s`: requests that sample a token this step whatever the budget (each yields one
    /// token, so it is the numerator at `b = 0`).
    pub num_sampling_requests: usize,
    /// Largest budget to consider (vLLM caps it by the sampler's logits chunk); `None` means
    /// every scheduled draft. Always capped at the number of scheduled drafts.
    pub max_draft_budget: Option<usize>,
}

/// What [`plan_verification`] decided (the admitted counts are written to the caller's
/// buffer). See the example on [`plan_verification`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VerificationPlan {
    /// Total drafts to verify; the admitted counts sum to it.
    pub budget: usize,
    /// `s + Σ` survivals of the admitted slots under the current confidences: the tokens this
    /// step is expected to emit. Equals vLLM's `E(budget)` when the budget is sized from the
    /// current confidences.
    pub expected_accepted_tokens: f64,
    /// `draft_ms[R] + verify_ms[T + budget]`, the step's predicted cost.
    pub predicted_cost_ms: f64,
}

/// Reusable buffers for one planning call; their contents never outlive the call.
#[derive(Default)]
pub(crate) struct Scratch {
    scheduled: Vec<usize>,
    survivals: Survivals,
    budget_survivals: Survivals,
    budget_buffers: BudgetBuffers,
    assign_buffers: AssignBuffers,
    depth_buffers: DepthBuffers,
    draft_counts: Vec<usize>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| f(&mut cell.borrow_mut()))
}

/// The draft budget: the first `b` maximising `E(b) / C(b)` (module docs of
/// `planner::budget`), over the survivals of the scheduled slots of `confidences`.
///
/// Fails (naming the argument) on confidences outside `[0, 1]` or non-finite, scheduled counts
/// outside `0..=K` or of the wrong length, more requests than the draft table covers,
/// `num_sampling_requests > R`, or `T + max budget` beyond the verify table.
///
/// # Example
///
/// ```rust
/// use av_core::cost_tables::CostTables;
/// use av_core::planner::{choose_draft_budget, StepTokens};
/// use av_core::MatrixView;
///
/// // Verifying costs 1 ms up to 3 tokens, then 100 ms: a cost cliff.
/// let tables = CostTables::new(vec![0.0; 3], vec![1.0, 1.0, 1.0, 1.0, 100.0, 100.0, 100.0])?;
/// let confidences = [0.1, 0.1, 0.9, 0.9]; // 2 requests × 2 drafts
/// let view = MatrixView::new("confidences", &confidences, 2, 2)?;
/// let step = StepTokens {
///     num_non_draft_tokens: 2,
///     num_sampling_requests: 2,
///     ..Default::default()
/// };
/// // Only the 0.9 draft is worth verifying before the cliff.
/// assert_eq!(choose_draft_budget(view, &[2, 2], &step, &tables)?, 1);
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn choose_draft_budget<T: Copy + Into<f64>>(
    confidences: MatrixView<'_, T>,
    scheduled_drafts: &[i64],
    step: &StepTokens,
    cost_tables: &CostTables,
) -> Result<usize> {
    with_scratch(|scratch| {
        let (limit, draft_ms) = prepare(
            scratch,
            confidences,
            scheduled_drafts,
            step,
            cost_tables,
            false,
        )?;
        let Scratch {
            scheduled,
            survivals,
            budget_buffers,
            ..
        } = scratch;
        let drafts = budget::Drafts {
            survivals,
            cols: confidences.cols(),
            scheduled,
        };
        Ok(budget_of(drafts, step, draft_ms, cost_tables, limit, budget_buffers).budget)
    })
}

/// Validates a planning call (shapes, scheduled drafts, the step against the tables) and
/// computes the survivals of `confidences` into `scratch` (with their running sums when
/// asked); returns the largest admissible budget and the step's drafting cost.
fn prepare<T: Copy + Into<f64>>(
    scratch: &mut Scratch,
    confidences: MatrixView<'_, T>,
    scheduled_drafts: &[i64],
    step: &StepTokens,
    cost_tables: &CostTables,
    running_sums: bool,
) -> Result<(usize, f64)> {
    let total = check_common(confidences, ("scheduled_drafts", scheduled_drafts), scratch)?;
    check_depth_table(cost_tables, confidences.cols())?;
    let limit = check_step(step, confidences.rows(), total, cost_tables)?;
    if !scratch
        .survivals
        .compute(confidences, &scratch.scheduled, running_sums)
    {
        return Err(probability_error("confidences", confidences));
    }
    let draft_ms = step_draft_ms(cost_tables, &scratch.scheduled, &mut scratch.draft_counts)?;
    Ok((limit, draft_ms))
}

/// Admitted drafts per request: the `budget` highest survivals (ties to the shallower
/// position, then the lower request), always a prefix of each request, never above
/// `scheduled_drafts[r]`, summing to `min(budget, Σ scheduled_drafts)`. Written to `admitted`
/// (length `R`).
///
/// # Example
///
/// ```rust
/// use av_core::planner::assign_draft_budget;
/// use av_core::MatrixView;
///
/// // Survivals: request 0 → 0.9, 0.72, 0.216; request 1 → 0.6, 0.3, 0.27.
/// let confidences = [0.9, 0.8, 0.3, 0.6, 0.5, 0.9];
/// let view = MatrixView::new("confidences", &confidences, 2, 3)?;
/// let mut admitted = [0; 2];
/// assign_draft_budget(view, &[3, 3], 3, &mut admitted)?;
/// assert_eq!(admitted, [2, 1]); // 0.9, 0.72 and 0.6
/// assign_draft_budget(view, &[3, 1], 4, &mut admitted)?;
/// assert_eq!(admitted, [3, 1]); // request 1 brought only one draft
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn assign_draft_budget<T: Copy + Into<f64>>(
    confidences: MatrixView<'_, T>,
    scheduled_drafts: &[i64],
    budget: usize,
    admitted: &mut [i32],
) -> Result<()> {
    with_scratch(|scratch| {
        check_common(confidences, ("scheduled_drafts", scheduled_drafts), scratch)?;
        check_admitted_len(admitted, confidences.rows())?;
        let Scratch {
            scheduled,
            survivals,
            assign_buffers,
            ..
        } = scratch;
        if !survivals.compute(confidences, scheduled, false) {
            return Err(probability_error("confidences", confidences));
        }
        assignment::admit(
            survivals,
            confidences.cols(),
            scheduled,
            budget,
            None,
            assign_buffers,
            admitted,
        );
        Ok(())
    })
}

/// Budget and assignment in one call.
///
/// The budget is sized from `budget_confidences` when given (same shape as `confidences`;
/// [`VerificationPlanner`] passes the previous step's), else from `confidences`; the
/// assignment always uses `confidences`. Admitted counts go to `admitted` (length `R`).
/// Errors as [`choose_draft_budget`]; on error `admitted` is untouched.
///
/// # Example
///
/// ```rust
/// use av_core::cost_tables::CostTables;
/// use av_core::planner::{plan_verification, StepTokens};
/// use av_core::MatrixView;
///
/// let tables = CostTables::new(vec![0.5; 3], vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0])?;
/// let confidences = [0.5, 0.5, 1.0, 0.25];
/// let view = MatrixView::new("confidences", &confidences, 2, 2)?;
/// let step = StepTokens {
///     num_non_draft_tokens: 2,
///     num_sampling_requests: 2,
///     ..Default::default()
/// };
/// let mut admitted = [0; 2];
/// let current = None::<MatrixView<'_, f64>>; // size the budget from `confidences` too
/// let plan = plan_verification(view, current, &[2, 2], &step, &tables, &mut admitted)?;
/// assert_eq!((plan.budget, admitted), (3, [2, 1]));
/// assert_eq!(plan.expected_accepted_tokens, 2.0 + 1.0 + 0.5 + 0.25);
/// assert_eq!(plan.predicted_cost_ms, 0.5 + 1.0); // draft_ms[2] + verify_ms[2 + 3]
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn plan_verification<T: Copy + Into<f64>, P: Copy + Into<f64>>(
    confidences: MatrixView<'_, T>,
    budget_confidences: Option<MatrixView<'_, P>>,
    scheduled_drafts: &[i64],
    step: &StepTokens,
    cost_tables: &CostTables,
    admitted: &mut [i32],
) -> Result<VerificationPlan> {
    with_scratch(|scratch| {
        plan_with(
            scratch,
            confidences,
            budget_confidences,
            scheduled_drafts,
            step,
            cost_tables,
            admitted,
        )
    })
}

/// [`plan_verification`] on explicit scratch buffers (the stateful planner owns its own).
pub(crate) fn plan_with<T: Copy + Into<f64>, P: Copy + Into<f64>>(
    scratch: &mut Scratch,
    confidences: MatrixView<'_, T>,
    budget_confidences: Option<MatrixView<'_, P>>,
    scheduled_drafts: &[i64],
    step: &StepTokens,
    cost_tables: &CostTables,
    admitted: &mut [i32],
) -> Result<VerificationPlan> {
    let rows = confidences.rows();
    let cols = confidences.cols();
    if let Some(other) = budget_confidences {
        check_same_shape(other, rows, cols)?;
    }
    check_admitted_len(admitted, rows)?;
    let current = budget_confidences.is_none();
    // With the budget sized elsewhere, `E` is summed over the admitted prefixes afterwards.
    let (limit, draft_ms) = prepare(
        scratch,
        confidences,
        scheduled_drafts,
        step,
        cost_tables,
        !current,
    )?;
    let Scratch {
        scheduled,
        survivals,
        budget_survivals,
        budget_buffers,
        assign_buffers,
        ..
    } = scratch;
    let sized_from: &Survivals = match budget_confidences {
        Some(other) => {
            if !budget_survivals.compute(other, scheduled, false) {
                return Err(probability_error("budget_confidences", other));
            }
            budget_survivals
        }
        None => survivals,
    };
    let drafts = budget::Drafts {
        survivals: sized_from,
        cols,
        scheduled,
    };
    let chosen = budget_of(drafts, step, draft_ms, cost_tables, limit, budget_buffers);
    let budget = chosen.budget;
    assignment::admit(
        survivals,
        cols,
        scheduled,
        budget,
        current.then_some(chosen.threshold),
        assign_buffers,
        admitted,
    );
    let expected_accepted_tokens = if current {
        chosen.expected_tokens
    } else {
        step.num_sampling_requests as f64 + survivals.prefix_sum(cols, admitted)
    };
    Ok(VerificationPlan {
        budget,
        expected_accepted_tokens,
        predicted_cost_ms: draft_ms + cost_tables.verify_ms()[step.num_non_draft_tokens + budget],
    })
}

/// A draft-depth table must cover exactly the `K` positions planned: its `draft_ms[R]` is the
/// cost of drafting all of them.
pub(crate) fn check_depth_table(cost_tables: &CostTables, cols: usize) -> Result<()> {
    match cost_tables.max_draft_depth() {
        Some(depth) if depth != cols => Err(Error::new(
            ErrorKind::DepthTableMismatch,
            "cost_tables",
            format!(
                "draft-depth table covers depths 0..={depth} but the confidences have {cols} \
                 positions; profile it up to K = {cols}"
            ),
        )),
        _ => Ok(()),
    }
}

/// The drafting cost of a step with these scheduled drafts: `draft_ms[R]` (vLLM's constant)
/// without a draft-depth table, the depth-priced cost with one. More requests than the draft
/// table covers are a value error (callers check the step against the tables first).
pub(crate) fn step_draft_ms(
    cost_tables: &CostTables,
    scheduled: &[usize],
    counts: &mut Vec<usize>,
) -> Result<f64> {
    if cost_tables.draft_depth_ms().is_some() {
        cost_tables.step_draft_cost_ms(scheduled, counts)
    } else {
        cost_tables.draft_cost_ms(scheduled.len(), 1)
    }
}

/// The budget over `drafts`, up to `limit`, priced with the step's costs.
fn budget_of(
    drafts: budget::Drafts<'_>,
    step: &StepTokens,
    draft_ms: f64,
    cost_tables: &CostTables,
    limit: usize,
    buffers: &mut BudgetBuffers,
) -> budget::Budget {
    let t = step.num_non_draft_tokens;
    let costs = budget::StepCosts {
        s: step.num_sampling_requests as f64,
        draft_ms,
        verify: &cost_tables.verify_ms()[t..=t + limit],
        verify_nondecreasing: cost_tables.verify_is_nondecreasing(),
    };
    budget::best_budget(drafts, costs, buffers)
}

/// How many positions each request should draft this step, decided before drafting from
/// confidences fixed before it (the previous step's; `planner::depth` has the rule and the
/// math). `max_depths[r]` caps request `r` (`0..=K`; 0 for requests that cannot draft, such as
/// prefills). The cost tables need a draft-depth table ([`CostTables::with_draft_depth`]) that
/// covers `K`. Depths go to `depths` (length `R`); an all-zero result means the step runs
/// without the drafter. Errors name the argument; on error `depths` is untouched.
///
/// # Example
///
/// ```rust
/// use av_core::cost_tables::{CostTables, DrafterKind};
/// use av_core::planner::{choose_draft_depth, DepthMode, StepTokens};
/// use av_core::MatrixView;
///
/// // An autoregressive drafter: 1 ms per position at full depth 2; verification is flat.
/// let tables = CostTables::new(vec![0.0, 2.0, 2.0], vec![10.0; 8])?
///     .with_drafter(DrafterKind::Autoregressive, 2)?;
/// let step = StepTokens {
///     num_non_draft_tokens: 2,
///     num_sampling_requests: 2,
///     ..Default::default()
/// };
/// let mut depths = [0; 2];
/// // Confident drafts: both positions pay for their passes.
/// let view = MatrixView::new("confidences", &[0.9, 0.9, 0.9, 0.9], 2, 2)?;
/// choose_draft_depth(view, &[2, 2], &step, &tables, DepthMode::Batch, &mut depths)?;
/// assert_eq!(depths, [2, 2]);
/// // Hopeless drafts: not drafting at all is best.
/// let view = MatrixView::new("confidences", &[0.01, 0.01, 0.01, 0.01], 2, 2)?;
/// let plan = choose_draft_depth(view, &[2, 2], &step, &tables, DepthMode::Batch, &mut depths)?;
/// assert_eq!((depths, plan.max_depth), ([0, 0], 0));
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn choose_draft_depth<T: Copy + Into<f64>>(
    confidences: MatrixView<'_, T>,
    max_depths: &[i64],
    step: &StepTokens,
    cost_tables: &CostTables,
    mode: DepthMode,
    depths: &mut [i32],
) -> Result<DepthPlan> {
    with_scratch(|scratch| {
        depth_with(
            scratch,
            confidences,
            max_depths,
            step,
            cost_tables,
            mode,
            depths,
        )
    })
}

/// [`choose_draft_depth`] on explicit scratch buffers.
pub(crate) fn depth_with<T: Copy + Into<f64>>(
    scratch: &mut Scratch,
    confidences: MatrixView<'_, T>,
    max_depths: &[i64],
    step: &StepTokens,
    cost_tables: &CostTables,
    mode: DepthMode,
    depths: &mut [i32],
) -> Result<DepthPlan> {
    let rows = confidences.rows();
    let cols = confidences.cols();
    cost_tables.max_draft_depth().ok_or_else(|| {
        Error::new(
            ErrorKind::MissingDepthTable,
            "cost_tables",
            "have no draft-depth table; add one (with_draft_depth, with_draft_depth_curve or \
             with_drafter) to decide drafting depth",
        )
    })?;
    check_depth_table(cost_tables, cols)?;
    let total = check_common(confidences, ("max_depths", max_depths), scratch)?;
    if depths.len() != rows {
        return Err(Error::value(
            "depths",
            format!("has length {} but there are {rows} requests", depths.len()),
        ));
    }
    check_step(step, rows, total, cost_tables)?;
    let Scratch {
        scheduled,
        survivals,
        budget_buffers,
        depth_buffers,
        ..
    } = scratch;
    if !survivals.compute(confidences, scheduled, false) {
        return Err(probability_error("confidences", confidences));
    }
    let request = depth::DepthRequest {
        cols,
        caps: scheduled,
        step,
        tables: cost_tables,
    };
    Ok(match mode {
        DepthMode::Batch => {
            depth::batch_depth(survivals, request, depth_buffers, budget_buffers, depths)
        }
        DepthMode::PerRequest => {
            depth::per_request_depth(survivals, request, depth_buffers, depths)
        }
    })
}

/// Validates the shapes and the per-request counts (`scheduled_drafts`, or `max_depths` for the
/// depth decision: the caller names them) against the confidences (whose values are checked
/// while their survivals are computed); fills `scratch.scheduled`; returns `Σ counts`.
fn check_common<T>(
    confidences: MatrixView<'_, T>,
    (argument, scheduled_drafts): (&'static str, &[i64]),
    scratch: &mut Scratch,
) -> Result<usize> {
    let rows = confidences.rows();
    let cols = confidences.cols();
    if scheduled_drafts.len() != rows {
        return Err(Error::value(
            argument,
            format!(
                "has length {} but confidences has {rows} rows",
                scheduled_drafts.len()
            ),
        ));
    }
    let scheduled = &mut scratch.scheduled;
    scheduled.clear();
    let mut total = 0usize;
    for (r, &n) in scheduled_drafts.iter().enumerate() {
        if n < 0 || n as u64 > cols as u64 {
            return Err(Error::value(
                argument,
                format!("[{r}] = {n} is outside 0..={cols} (confidences has {cols} positions)"),
            ));
        }
        scheduled.push(n as usize);
        total += n as usize;
    }
    Ok(total)
}

/// The error for the first entry of `matrix` outside `[0, 1]` (call only when one was: if a
/// second read finds none, another thread rewrote the buffer during the call).
fn probability_error<T: Copy + Into<f64>>(
    argument: &'static str,
    matrix: MatrixView<'_, T>,
) -> Error {
    let cols = matrix.cols().max(1);
    let found = matrix
        .data()
        .iter()
        .map(|&p| -> f64 { p.into() })
        .enumerate()
        .find(|&(_, p)| !(0.0..=1.0).contains(&p));
    match found {
        Some((i, p)) => Error::value(
            argument,
            format!(
                "[{}, {}] = {p} is not a probability in [0, 1]",
                i / cols,
                i % cols
            ),
        ),
        None => Error::buffer_changed(argument),
    }
}

fn check_same_shape<P>(other: MatrixView<'_, P>, rows: usize, cols: usize) -> Result<()> {
    if other.rows() != rows || other.cols() != cols {
        return Err(Error::value(
            "budget_confidences",
            format!(
                "has shape [{}, {}] but confidences has [{rows}, {cols}]",
                other.rows(),
                other.cols()
            ),
        ));
    }
    Ok(())
}

fn check_admitted_len(admitted: &[i32], rows: usize) -> Result<()> {
    if admitted.len() != rows {
        return Err(Error::value(
            "admitted",
            format!(
                "has length {} but there are {rows} requests",
                admitted.len()
            ),
        ));
    }
    Ok(())
}

/// Checks the step against the tables; returns the largest admissible budget.
fn check_step(
    step: &StepTokens,
    rows: usize,
    total: usize,
    cost_tables: &CostTables,
) -> Result<usize> {
    if rows > cost_tables.max_num_reqs() {
        return Err(Error::value(
            "confidences",
            format!(
                "has {rows} requests, more than the cost tables cover (max_num_reqs = {})",
                cost_tables.max_num_reqs()
            ),
        ));
    }
    if step.num_sampling_requests > rows {
        return Err(Error::value(
            "num_sampling_requests",
            format!(
                "= {} exceeds the number of requests ({rows})",
                step.num_sampling_requests
            ),
        ));
    }
    let limit = step.max_draft_budget.map_or(total, |cap| cap.min(total));
    let max_tokens = cost_tables.max_batch_tokens();
    if step
        .num_non_draft_tokens
        .checked_add(limit)
        .is_none_or(|t| t > max_tokens)
    {
        return Err(Error::value(
            "num_non_draft_tokens",
            format!(
                "{} plus the largest budget {limit} exceeds the cost tables' max_batch_tokens = {max_tokens}",
                step.num_non_draft_tokens
            ),
        ));
    }
    Ok(limit)
}

#[cfg(test)]
mod tests;
