//! The planner's one implementation of each decision: validation, survivals, budget,
//! assignment and depth, on buffers it reuses from call to call.
//!
//! Every planning entry point is a use of an [`Engine`]: the free functions
//! (`choose_draft_budget`, `assign_draft_budget`, `plan_verification`, `choose_draft_depth`)
//! borrow one per thread for a single call; a [`super::VerificationPlanner`] owns one and adds
//! the remembered confidences (which it hands over as [`Rows::Remembered`] survivals). So each
//! argument is checked in one place, in one order, and the error a call returns does not depend
//! on which entry point it came through.

use std::cell::RefCell;

use super::assignment::{self, AssignBuffers};
use super::budget::{self, BudgetBuffers};
use super::counting;
use super::depth::{self, DepthBuffers, DepthMode, DepthPlan};
use super::order::{reserve_len, Survivals};
use super::{StepTokens, VerificationPlan};
use crate::cost_tables::CostTables;
use crate::error::{Error, ErrorKind, Result};
use crate::matrix::MatrixView;

/// Where a decision's rows of confidences come from.
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a, T> {
    /// A caller's matrix, validated while its survivals are computed.
    Confidences(MatrixView<'a, T>),
    /// Survivals the stateful planner already holds (slot-major, `cols` per slot, each in
    /// `[0, 1]` and never `-0.0`), for the rows `slots` (checked by the planner). `generation`
    /// changes whenever any of them does.
    Remembered {
        survivals: &'a [f64],
        slots: &'a [i64],
        cols: usize,
        generation: u64,
    },
}

impl<T> Rows<'_, T> {
    fn shape(&self) -> (usize, usize) {
        match self {
            Rows::Confidences(view) => (view.rows(), view.cols()),
            Rows::Remembered { slots, cols, .. } => (slots.len(), *cols),
        }
    }
}

/// What sizes the budget of a plan.
#[derive(Clone, Copy)]
pub(crate) enum Sizing<'a, P> {
    /// The confidences being planned (vLLM's rule for parallel drafters).
    Current,
    /// Other rows of the same shape (the previous step's).
    Other(Rows<'a, P>),
}

/// A plan and the step's drafting cost it was priced with.
pub(crate) struct Planned {
    pub(crate) plan: VerificationPlan,
    pub(crate) draft_ms: f64,
}

/// Reusable buffers of every decision; their contents never outlive a call, except what the
/// accessors below expose until the next one.
#[derive(Default)]
pub(crate) struct Engine {
    scheduled: Vec<usize>,
    survivals: Survivals,
    /// The budget's survivals, and the depth decision's remembered rows.
    budget_survivals: Survivals,
    /// Which remembered rows `budget_survivals` holds (the generation of the survivals and the
    /// slots), when it holds remembered rows: a plan that follows a depth decision over the same
    /// slots, with nothing remembered in between, reads them without gathering them again.
    gathered: Option<(u64, Vec<i64>)>,
    budget_buffers: BudgetBuffers,
    assign_buffers: AssignBuffers,
    depth_buffers: DepthBuffers,
    draft_counts: Vec<usize>,
    /// The most requests and positions the buffers have room for ([`Engine::reserve`]).
    reserved: (usize, usize),
}

thread_local! {
    static ENGINE: RefCell<Engine> = RefCell::new(Engine::default());
}

/// Runs `f` on this thread's engine (the free functions' one-shot planner).
pub(crate) fn with_engine<R>(f: impl FnOnce(&mut Engine) -> R) -> R {
    ENGINE.with(|cell| f(&mut cell.borrow_mut()))
}

impl Engine {
    /// The validated scheduled counts of the last successful call.
    pub(crate) fn scheduled(&self) -> &[usize] {
        &self.scheduled
    }

    /// The survivals of the last successful plan's confidences (whole rows, row-major).
    pub(crate) fn survivals(&self) -> &[f64] {
        &self.survivals.values
    }

    /// Gives every buffer room for calls of up to `rows` requests of `cols` positions (and of
    /// any earlier size), so that no call that fits allocates: a buffer grown only as far as
    /// one call's data (a hull's members, a kept depth's histogram) would grow again at a
    /// later step whose data reach further. Runs after a call's arguments are validated, so
    /// `rows · cols` is the size of a caller's array.
    fn reserve(&mut self, rows: usize, cols: usize) {
        if rows <= self.reserved.0 && cols <= self.reserved.1 {
            return;
        }
        let (rows, cols) = (rows.max(self.reserved.0), cols.max(self.reserved.1));
        self.reserved = (rows, cols);
        let slots = rows.saturating_mul(cols);
        reserve_len(&mut self.scheduled, rows);
        reserve_len(&mut self.draft_counts, cols + 1);
        self.survivals.reserve(slots);
        self.budget_survivals.reserve(slots);
        self.budget_buffers.reserve(slots);
        self.assign_buffers.reserve(rows, slots);
        self.depth_buffers.reserve(rows, cols);
    }

    /// The drafting cost of a step whose requests draft `depths[r]` positions each
    /// ([`CostTables::step_draft_cost_ms`]), on the engine's buffers.
    pub(crate) fn depth_cost_ms(&mut self, depths: &[i32], tables: &CostTables) -> Result<f64> {
        self.scheduled.clear();
        self.scheduled
            .extend(depths.iter().map(|&d| usize::try_from(d).unwrap_or(0)));
        tables.step_draft_cost_ms(&self.scheduled, &mut self.draft_counts)
    }

    /// The draft budget over `confidences`' scheduled survivals.
    pub(crate) fn budget<T: Copy + Into<f64>>(
        &mut self,
        confidences: MatrixView<'_, T>,
        scheduled_drafts: &[i64],
        step: &StepTokens,
        tables: &CostTables,
    ) -> Result<usize> {
        let (limit, draft_ms) = self.prepare(confidences, scheduled_drafts, step, tables)?;
        let drafts = budget::Drafts {
            survivals: &self.survivals,
            cols: confidences.cols(),
            scheduled: &self.scheduled,
        };
        let costs = step_costs(step, draft_ms, tables, limit);
        Ok(budget::best_budget(drafts, costs, &mut self.budget_buffers).budget)
    }

    /// The `budget` highest survivals of `confidences`, as counts per request.
    pub(crate) fn assign<T: Copy + Into<f64>>(
        &mut self,
        confidences: MatrixView<'_, T>,
        scheduled_drafts: &[i64],
        budget: usize,
        admitted: &mut [i32],
    ) -> Result<()> {
        check_counts(
            confidences.cols(),
            confidences.rows(),
            "scheduled_drafts",
            scheduled_drafts,
            (&mut self.scheduled, &mut self.draft_counts),
        )?;
        check_len("admitted", admitted.len(), confidences.rows())?;
        self.reserve(confidences.rows(), confidences.cols());
        if !self.survivals.compute(confidences, &self.scheduled) {
            return Err(probability_error("confidences", confidences));
        }
        assignment::admit(
            &self.survivals,
            confidences.cols(),
            &self.scheduled,
            budget,
            None,
            &mut self.assign_buffers,
            admitted,
        );
        Ok(())
    }

    /// Budget (sized as `sizing` says) and assignment of `confidences`.
    pub(crate) fn plan<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &mut self,
        confidences: MatrixView<'_, T>,
        sizing: Sizing<'_, P>,
        scheduled_drafts: &[i64],
        step: &StepTokens,
        tables: &CostTables,
        admitted: &mut [i32],
    ) -> Result<Planned> {
        let (rows, cols) = (confidences.rows(), confidences.cols());
        if let Sizing::Other(other) = &sizing {
            let (other_rows, other_cols) = other.shape();
            if (other_rows, other_cols) != (rows, cols) {
                return Err(Error::value(
                    "budget_confidences",
                    format!(
                        "has shape [{other_rows}, {other_cols}] but confidences has [{rows}, {cols}]"
                    ),
                ));
            }
        }
        check_len("admitted", admitted.len(), rows)?;
        let current = matches!(sizing, Sizing::Current);
        let (limit, draft_ms) = self.prepare(confidences, scheduled_drafts, step, tables)?;
        if let Sizing::Other(other) = sizing {
            fill_survivals(
                (&mut self.budget_survivals, &mut self.gathered),
                other,
                &self.scheduled,
                "budget_confidences",
            )?;
        }
        let sized_from = if current {
            &self.survivals
        } else {
            &self.budget_survivals
        };
        let drafts = budget::Drafts {
            survivals: sized_from,
            cols,
            scheduled: &self.scheduled,
        };
        let chosen = budget::best_budget(
            drafts,
            step_costs(step, draft_ms, tables, limit),
            &mut self.budget_buffers,
        );
        assignment::admit(
            &self.survivals,
            cols,
            &self.scheduled,
            chosen.budget,
            current.then_some(chosen.threshold),
            &mut self.assign_buffers,
            admitted,
        );
        // With the budget sized elsewhere, `E` is summed over the admitted prefixes.
        let expected_accepted_tokens = if current {
            chosen.expected_tokens
        } else {
            step.num_sampling_requests as f64 + self.survivals.prefix_sum(cols, admitted)
        };
        Ok(Planned {
            plan: VerificationPlan {
                budget: chosen.budget,
                expected_accepted_tokens,
                predicted_cost_ms: draft_ms
                    + tables.verify_ms()[step.num_non_draft_tokens + chosen.budget],
            },
            draft_ms,
        })
    }

    /// The drafting depth of each row of `rows`, capped by `max_depths`.
    pub(crate) fn depth<T: Copy + Into<f64>>(
        &mut self,
        rows: Rows<'_, T>,
        max_depths: &[i64],
        step: &StepTokens,
        tables: &CostTables,
        mode: DepthMode,
        depths: &mut [i32],
    ) -> Result<DepthPlan> {
        let (num_rows, cols) = rows.shape();
        tables.max_draft_depth().ok_or_else(|| {
            Error::new(
                ErrorKind::MissingDepthTable,
                "cost_tables",
                "have no draft-depth table; add one (with_draft_depth, with_draft_depth_curve or \
                 with_drafter) to decide drafting depth",
            )
        })?;
        check_depth_table(tables, cols)?;
        let total = check_counts(
            cols,
            num_rows,
            "max_depths",
            max_depths,
            (&mut self.scheduled, &mut self.draft_counts),
        )?;
        if depths.len() != num_rows {
            return Err(Error::value(
                "depths",
                format!(
                    "has length {} but there are {num_rows} requests",
                    depths.len()
                ),
            ));
        }
        check_step(step, num_rows, total, tables)?;
        self.reserve(num_rows, cols);
        // Remembered rows go where a following plan's budget looks for them.
        let survivals = match rows {
            Rows::Confidences(_) => {
                let mut none = None;
                fill_survivals(
                    (&mut self.survivals, &mut none),
                    rows,
                    &self.scheduled,
                    "confidences",
                )?;
                &mut self.survivals
            }
            Rows::Remembered { .. } => {
                fill_survivals(
                    (&mut self.budget_survivals, &mut self.gathered),
                    rows,
                    &self.scheduled,
                    "confidences",
                )?;
                &mut self.budget_survivals
            }
        };
        let request = depth::DepthRequest {
            cols,
            caps: &self.scheduled,
            cap_counts: &self.draft_counts,
            step,
            tables,
        };
        Ok(match mode {
            DepthMode::Batch => depth::batch_depth(
                survivals,
                request,
                &mut self.depth_buffers,
                &mut self.budget_buffers,
                depths,
            ),
            DepthMode::PerRequest => {
                depth::per_request_depth(survivals, request, &mut self.depth_buffers, depths)
            }
        })
    }

    /// Validates a planning call (the scheduled drafts, the tables' depth, the step against the
    /// tables) and computes the survivals of `confidences`; returns the largest admissible
    /// budget and the step's drafting cost.
    fn prepare<T: Copy + Into<f64>>(
        &mut self,
        confidences: MatrixView<'_, T>,
        scheduled_drafts: &[i64],
        step: &StepTokens,
        tables: &CostTables,
    ) -> Result<(usize, f64)> {
        let cols = confidences.cols();
        let total = check_counts(
            cols,
            confidences.rows(),
            "scheduled_drafts",
            scheduled_drafts,
            (&mut self.scheduled, &mut self.draft_counts),
        )?;
        check_depth_table(tables, cols)?;
        let limit = check_step(step, confidences.rows(), total, tables)?;
        self.reserve(confidences.rows(), cols);
        if !self.survivals.compute(confidences, &self.scheduled) {
            return Err(probability_error("confidences", confidences));
        }
        // Priced from the counts of each depth `check_counts` took (a depth table covers
        // exactly these `cols` positions).
        let draft_ms = if tables.draft_depth_ms().is_some() {
            tables.draft_cost_of_depth_counts(&mut self.draft_counts)?
        } else {
            tables.draft_cost_ms(self.scheduled.len(), 1)?
        };
        Ok((limit, draft_ms))
    }
}

/// Survivals of `rows` into `survivals` for the scheduled counts; an error naming `argument`
/// if a caller's confidence is not a probability. `gathered` says which remembered rows
/// `survivals` holds: the same rows of the same generation are not gathered again.
fn fill_survivals<T: Copy + Into<f64>>(
    (survivals, gathered): (&mut Survivals, &mut Option<(u64, Vec<i64>)>),
    rows: Rows<'_, T>,
    scheduled: &[usize],
    argument: &'static str,
) -> Result<()> {
    match rows {
        Rows::Confidences(view) => {
            *gathered = None;
            if survivals.compute(view, scheduled) {
                Ok(())
            } else {
                Err(probability_error(argument, view))
            }
        }
        Rows::Remembered {
            survivals: remembered,
            slots,
            cols,
            generation,
        } => {
            match gathered {
                Some((held, held_slots)) if *held == generation && held_slots[..] == *slots => {
                    survivals.recount(cols, scheduled);
                }
                _ => {
                    survivals.gather_rows(remembered, slots, cols, scheduled);
                    let mut held_slots = gathered.take().map(|(_, s)| s).unwrap_or_default();
                    held_slots.clear();
                    held_slots.extend_from_slice(slots);
                    *gathered = Some((generation, held_slots));
                }
            }
            Ok(())
        }
    }
}

/// The step's costs for budgets `0..=limit`.
fn step_costs<'a>(
    step: &StepTokens,
    draft_ms: f64,
    tables: &'a CostTables,
    limit: usize,
) -> budget::StepCosts<'a> {
    let t = step.num_non_draft_tokens;
    budget::StepCosts {
        s: step.num_sampling_requests as f64,
        draft_ms,
        verify: &tables.verify_ms()[t..=t + limit],
        verify_nondecreasing: tables.verify_is_nondecreasing(),
    }
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

/// Validates per-request counts (`scheduled_drafts`, or `max_depths` for the depth decision:
/// the caller names them) of `rows` requests against `cols` positions; fills `out` with them
/// and `histogram[n]` with how many are `n`; returns their sum.
fn check_counts(
    cols: usize,
    rows: usize,
    argument: &'static str,
    counts: &[i64],
    (out, histogram): (&mut Vec<usize>, &mut Vec<usize>),
) -> Result<usize> {
    if counts.len() != rows {
        return Err(Error::value(
            argument,
            format!(
                "has length {} but confidences has {rows} rows",
                counts.len()
            ),
        ));
    }
    // One branch-free pass finds whether every count is in range; the first one out of range
    // is looked for only when one is. For `0 <= n <= cols`, `n - (cols + 1)` wraps (its top bit
    // is set) and so is the top bit of `!n`; a larger `n` clears the first, a negative `n` the
    // second. (Plain additions and masks: no 64-bit compare, which baseline x86-64 lacks.)
    let bound = cols as u64 + 1;
    let in_range = counts.iter().fold(u64::MAX, |all, &n| {
        all & (n as u64).wrapping_sub(bound) & !(n as u64)
    });
    if in_range >> 63 == 0 {
        let (r, n) = counts
            .iter()
            .enumerate()
            .find(|&(_, &n)| n < 0 || n as u64 > cols as u64)
            .map_or((0, 0), |(r, &n)| (r, n));
        return Err(Error::value(
            argument,
            format!("[{r}] = {n} is outside 0..={cols} (confidences has {cols} positions)"),
        ));
    }
    out.clear();
    out.extend(counts.iter().map(|&n| n as usize));
    // Every count is in `0..=cols` now. Most calls give every request the same count (a batch
    // depth, every request capped at `K`): then the histogram has one entry, found by a
    // branch-free pass instead of a tally, whose every increment would hit that one entry.
    let first = counts.first().map_or(0, |&n| n as u64);
    let differ = counts
        .iter()
        .fold(0u64, |differ, &n| differ | (n as u64 ^ first));
    if differ == 0 {
        histogram.clear();
        histogram.resize(cols + 1, 0);
        if rows > 0 {
            histogram[first as usize] = rows;
        }
        return Ok(rows * first as usize);
    }
    counting::tally(out, cols + 1, histogram);
    Ok(out.iter().sum())
}

/// The error for the first entry of `matrix` outside `[0, 1]` (call only when one was: if a
/// second read finds none, another thread rewrote the buffer during the call).
pub(crate) fn probability_error<T: Copy + Into<f64>>(
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

/// An output of one entry per request must have `rows` entries.
fn check_len(argument: &'static str, len: usize, rows: usize) -> Result<()> {
    if len != rows {
        return Err(Error::value(
            argument,
            format!("has length {len} but there are {rows} requests"),
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
mod tests {
    use super::check_counts;

    /// The counts, their histogram and their sum against a plain count, for batches whose
    /// counts are all equal (the one-entry histogram) and batches where one differs, at every
    /// position of the difference, of lengths below and above the tally's four-lane cut-off.
    #[test]
    fn counts_histogram_and_sum_match_a_plain_count() {
        let cols = 8usize;
        for rows in [0usize, 1, 2, 31, 32, 33, 256] {
            for base in 0..=cols as i64 {
                let mut cases = vec![vec![base; rows]];
                for at in [0, rows / 2, rows.saturating_sub(1)] {
                    if rows > 0 {
                        let mut one_off = vec![base; rows];
                        one_off[at] = (base + 1) % (cols as i64 + 1);
                        cases.push(one_off);
                    }
                }
                for counts in cases {
                    let (mut out, mut histogram) = (vec![99usize; 3], vec![99usize; 2]);
                    let total = check_counts(
                        cols,
                        rows,
                        "max_depths",
                        &counts,
                        (&mut out, &mut histogram),
                    )
                    .unwrap();
                    let expected: Vec<usize> = (0..=cols as i64)
                        .map(|n| counts.iter().filter(|&&c| c == n).count())
                        .collect();
                    assert_eq!(histogram, expected, "{counts:?}");
                    assert_eq!(total, counts.iter().sum::<i64>() as usize, "{counts:?}");
                    let as_usize: Vec<usize> = counts.iter().map(|&c| c as usize).collect();
                    assert_eq!(out, as_usize);
                }
            }
        }
        let mut out = Vec::new();
        let mut histogram = Vec::new();
        for bad in [-1i64, 9, i64::MIN, i64::MAX] {
            let err = check_counts(8, 3, "max_depths", &[8, bad, 8], (&mut out, &mut histogram))
                .unwrap_err();
            assert_eq!(err.argument, "max_depths");
            assert!(err.message.contains(&format!("[1] = {bad}")), "{err}");
        }
    }
}
