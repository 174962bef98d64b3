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

use crate::cost_tables::CostTables;
use crate::error::{Error, Result};
use crate::matrix::MatrixView;

mod assignment;
mod budget;
mod counting;
mod depth;
mod engine;
mod exploration;
mod order;
mod ranked;
mod stateful;

pub use depth::{DepthMode, DepthPlan};
pub use exploration::Exploration;
pub use stateful::VerificationPlanner;

use engine::{with_engine, Rows, Sizing};

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
    with_engine(|engine| engine.budget(confidences, scheduled_drafts, step, cost_tables))
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
    with_engine(|engine| engine.assign(confidences, scheduled_drafts, budget, admitted))
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
    let sizing = match budget_confidences {
        Some(view) => Sizing::Other(Rows::Confidences(view)),
        None => Sizing::Current,
    };
    with_engine(|engine| {
        engine
            .plan(
                confidences,
                sizing,
                scheduled_drafts,
                step,
                cost_tables,
                admitted,
            )
            .map(|planned| planned.plan)
    })
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
    with_engine(|engine| {
        engine.depth(
            Rows::Confidences(confidences),
            max_depths,
            step,
            cost_tables,
            mode,
            depths,
        )
    })
}

#[cfg(test)]
mod tests;
