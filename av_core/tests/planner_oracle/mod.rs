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

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BudgetSource {
    #[default]
    Previous,
    Current,
}

impl BudgetSource {
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

    pub fn as_str(self) -> &'static str {
        match self {
            BudgetSource::Previous => "previous",
            BudgetSource::Current => "current",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepTokens {
    pub num_non_draft_tokens: usize,
    pub num_sampling_requests: usize,
    pub max_draft_budget: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VerificationPlan {
    pub budget: usize,
    pub expected_accepted_tokens: f64,
    pub predicted_cost_ms: f64,
}

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
