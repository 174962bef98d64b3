//! The stateful planner: remembers each request slot's confidences of the previous step.

use std::fmt;

use super::{plan_with, BudgetSource, Scratch, StepTokens, VerificationPlan};
use crate::cost_tables::CostTables;
use crate::error::{Error, Result};
use crate::matrix::MatrixView;

/// Most `num_slots × num_positions` entries of remembered confidences.
const MAX_STATE_ENTRIES: usize = 1 << 26;

/// Plans every decode step, sizing the budget from the previous step's confidences of each
/// request slot (`BudgetSource::Previous`, the default, lossless for every drafter) or from the
/// current ones (`BudgetSource::Current`, lossless only for drafters whose positions do not
/// depend on earlier draft tokens). The assignment always uses the current confidences.
///
/// State is one row of `K` confidences per slot, starting at 1.0 (vLLM's choice for a new
/// request: optimistic, so a fresh request is not starved of verification on its first step).
/// Each successful [`VerificationPlanner::plan`] stores the current rows of its slots for the
/// next step; a rejected call changes nothing.
pub struct VerificationPlanner {
    cost_tables: CostTables,
    num_positions: usize,
    budget_source: BudgetSource,
    previous: Vec<f64>,
    gathered: Vec<f64>,
    slot_stamps: Vec<u64>,
    stamp: u64,
    scratch: Scratch,
}

impl VerificationPlanner {
    /// A planner for `num_slots` request slots of `num_positions` (`K ≥ 1`) drafts each.
    pub fn new(
        cost_tables: CostTables,
        num_slots: usize,
        num_positions: usize,
        budget_source: BudgetSource,
    ) -> Result<Self> {
        if num_positions == 0 {
            return Err(Error::value("num_positions", "must be >= 1, got 0"));
        }
        let entries = num_slots
            .checked_mul(num_positions)
            .filter(|&e| e <= MAX_STATE_ENTRIES)
            .ok_or_else(|| {
                Error::value(
                    "num_slots",
                    format!(
                        "{num_slots} slots of {num_positions} positions exceed {MAX_STATE_ENTRIES} entries"
                    ),
                )
            })?;
        Ok(VerificationPlanner {
            cost_tables,
            num_positions,
            budget_source,
            previous: vec![1.0; entries],
            gathered: Vec::new(),
            slot_stamps: vec![0; num_slots],
            stamp: 0,
            scratch: Scratch::default(),
        })
    }

    /// The cost tables the planner prices steps with.
    pub fn cost_tables(&self) -> &CostTables {
        &self.cost_tables
    }

    /// Number of request slots.
    pub fn num_slots(&self) -> usize {
        self.slot_stamps.len()
    }

    /// Draft positions per request, `K`.
    pub fn num_positions(&self) -> usize {
        self.num_positions
    }

    /// Which confidences size the budget.
    pub fn budget_source(&self) -> BudgetSource {
        self.budget_source
    }

    /// The confidences remembered for `slot` (what the next budget will read).
    pub fn previous_confidences(&self, slot: usize) -> Result<&[f64]> {
        self.check_slot("slot", slot)?;
        Ok(&self.previous[slot * self.num_positions..(slot + 1) * self.num_positions])
    }

    /// A new request took `slot`: forget the old request's confidences (back to 1.0).
    pub fn add_request(&mut self, slot: usize) -> Result<()> {
        self.check_slot("slot", slot)?;
        let k = self.num_positions;
        self.previous[slot * k..(slot + 1) * k].fill(1.0);
        Ok(())
    }

    /// Plans one step for the requests in `slots` (distinct slot indices, one per row of
    /// `confidences`), writes the admitted counts to `admitted`, and remembers this step's
    /// confidences for the next. See [`super::plan_verification`] for the arguments.
    pub fn plan<T: Copy + Into<f64>>(
        &mut self,
        slots: &[i64],
        confidences: MatrixView<'_, T>,
        scheduled_drafts: &[i64],
        step: &StepTokens,
        admitted: &mut [i32],
    ) -> Result<VerificationPlan> {
        let k = self.num_positions;
        confidences.expect_cols("confidences", k)?;
        let rows = confidences.rows();
        if slots.len() != rows {
            return Err(Error::value(
                "slots",
                format!("has length {} but confidences has {rows} rows", slots.len()),
            ));
        }
        self.stamp += 1;
        for (r, &slot) in slots.iter().enumerate() {
            let index = usize::try_from(slot)
                .ok()
                .filter(|&s| s < self.slot_stamps.len())
                .ok_or_else(|| {
                    Error::value(
                        "slots",
                        format!("[{r}] = {slot} is outside 0..{}", self.slot_stamps.len()),
                    )
                })?;
            if self.slot_stamps[index] == self.stamp {
                return Err(Error::value(
                    "slots",
                    format!("[{r}] = {slot} appears twice"),
                ));
            }
            self.slot_stamps[index] = self.stamp;
        }
        let plan = match self.budget_source {
            BudgetSource::Previous => {
                self.gathered.clear();
                for &slot in slots {
                    let slot = slot as usize;
                    self.gathered
                        .extend_from_slice(&self.previous[slot * k..(slot + 1) * k]);
                }
                let stale = MatrixView::new("budget_confidences", &self.gathered, rows, k)?;
                plan_with(
                    &mut self.scratch,
                    confidences,
                    Some(stale),
                    scheduled_drafts,
                    step,
                    &self.cost_tables,
                    admitted,
                )?
            }
            BudgetSource::Current => plan_with(
                &mut self.scratch,
                confidences,
                None::<MatrixView<'_, f64>>,
                scheduled_drafts,
                step,
                &self.cost_tables,
                admitted,
            )?,
        };
        for (r, &slot) in slots.iter().enumerate() {
            let slot = slot as usize;
            for (stored, &p) in self.previous[slot * k..(slot + 1) * k]
                .iter_mut()
                .zip(confidences.row(r))
            {
                *stored = p.into();
            }
        }
        Ok(plan)
    }

    fn check_slot(&self, argument: &'static str, slot: usize) -> Result<()> {
        if slot < self.slot_stamps.len() {
            Ok(())
        } else {
            Err(Error::value(
                argument,
                format!("= {slot} is outside 0..{}", self.slot_stamps.len()),
            ))
        }
    }
}

impl Clone for VerificationPlanner {
    /// A copy with the same tables, settings and remembered confidences (fresh scratch).
    fn clone(&self) -> Self {
        VerificationPlanner {
            cost_tables: self.cost_tables.clone(),
            num_positions: self.num_positions,
            budget_source: self.budget_source,
            previous: self.previous.clone(),
            gathered: Vec::new(),
            slot_stamps: vec![0; self.slot_stamps.len()],
            stamp: 0,
            scratch: Scratch::default(),
        }
    }
}

impl fmt::Debug for VerificationPlanner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerificationPlanner")
            .field("num_slots", &self.num_slots())
            .field("num_positions", &self.num_positions)
            .field("budget_source", &self.budget_source)
            .finish_non_exhaustive()
    }
}
