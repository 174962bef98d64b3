use super::{
    depth_with, plan_with, BudgetSource, DepthMode, DepthPlan, Exploration, Scratch, StepTokens,
    VerificationPlan,
};
use crate::cost_tables::CostTables;
use crate::error::{Error, Result};
use crate::matrix::MatrixView;

const MAX_STATE_ENTRIES: usize = 1 << 26;

pub struct VerificationPlanner {
    cost_tables: CostTables,
    num_positions: usize,
    budget_source: BudgetSource,
    previous: Vec<f64>,
    gathered: Vec<f64>,
    marks: Vec<bool>,
    stamp: u64,
    scratch: Scratch,
    exploration: Exploration,
}

impl VerificationPlanner {
    pub fn new(
        cost_tables: CostTables,
        num_slots: usize,
        num_positions: usize,
        budget_source: BudgetSource,
    ) -> Result<Self> {
        if num_positions == 0 {
            return Err(Error::value("num_positions", "must be >= 1, got 0"));
        }
        if num_positions > MAX_STATE_ENTRIES {
            return Err(Error::value(
                "num_positions",
                format!("= {num_positions} exceeds {MAX_STATE_ENTRIES}"),
            ));
        }
        super::check_depth_table(&cost_tables, num_positions)?;
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
            marks: vec![false; num_slots],
            stamp: 0,
            scratch: Scratch::default(),
            exploration: Exploration::DEFAULT,
        })
    }

    pub const DEFAULT_EXPLORATION: f64 = Exploration::DEFAULT_PROBABILITY;

    pub fn set_exploration(&mut self, exploration: Exploration) {
        self.exploration = exploration;
    }

    pub fn exploration(&self) -> f64 {
        self.exploration.probability()
    }

    pub fn exploration_seed(&self) -> u64 {
        self.exploration.seed()
    }

    fn explores(&self, slot: u64) -> bool {
        self.exploration.explores(self.stamp, slot)
    }

    fn explore<T: Copy + Into<f64>>(
        &self,
        slots: &[i64],
        confidences: MatrixView<'_, T>,
        scheduled_drafts: &[i64],
        step: &StepTokens,
        admitted: &mut [i32],
        plan: &mut VerificationPlan,
    ) -> Result<()> {
        if !self.exploration.is_on() {
            return Ok(());
        }
        let total: usize = scheduled_drafts.iter().map(|&s| s.max(0) as usize).sum();
        let limit = step.max_draft_budget.map_or(total, |cap| cap.min(total));
        let mut added = false;
        for (r, (&slot, &scheduled)) in slots.iter().zip(scheduled_drafts).enumerate() {
            let (from, to) = (admitted[r] as usize, scheduled.max(0) as usize);
            if to <= from || plan.budget + (to - from) > limit || !self.explores(slot as u64) {
                continue;
            }
            let row = confidences.row(r);
            let mut survival: f64 = row[..from].iter().map(|&p| p.into()).product();
            for &p in &row[from..to] {
                survival *= p.into();
                plan.expected_accepted_tokens += survival;
            }
            plan.budget += to - from;
            admitted[r] = to as i32;
            added = true;
        }
        if added {
            let tables = &self.cost_tables;
            let scheduled: Vec<usize> = scheduled_drafts
                .iter()
                .map(|&s| s.max(0) as usize)
                .collect();
            let draft_ms = super::step_draft_ms(tables, &scheduled, &mut Vec::new())?;
            plan.predicted_cost_ms =
                draft_ms + tables.verify_ms()[step.num_non_draft_tokens + plan.budget];
        }
        Ok(())
    }

    pub fn cost_tables(&self) -> &CostTables {
        &self.cost_tables
    }

    pub fn num_slots(&self) -> usize {
        self.marks.len()
    }

    pub fn num_positions(&self) -> usize {
        self.num_positions
    }

    pub fn budget_source(&self) -> BudgetSource {
        self.budget_source
    }

    pub fn previous_confidences(&self, slot: usize) -> Result<&[f64]> {
        self.check_slot("slot", slot)?;
        Ok(&self.previous[slot * self.num_positions..(slot + 1) * self.num_positions])
    }

    pub fn add_request(&mut self, slot: usize) -> Result<()> {
        self.check_slot("slot", slot)?;
        let k = self.num_positions;
        self.previous[slot * k..(slot + 1) * k].fill(1.0);
        Ok(())
    }

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
        self.check_slots(slots)?;
        let mut plan = match self.budget_source {
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
        // The step counts only once the plan succeeded: a rejected call changes nothing.
        self.stamp = self.stamp.wrapping_add(1);
        let explored = self.explore(
            slots,
            confidences,
            scheduled_drafts,
            step,
            admitted,
            &mut plan,
        );
        if let Err(error) = explored {
            self.stamp = self.stamp.wrapping_sub(1);
            return Err(error);
        }
        self.store(slots, confidences, scheduled_drafts);
        Ok(plan)
    }

    pub fn remember<T: Copy + Into<f64>>(
        &mut self,
        slots: &[i64],
        confidences: MatrixView<'_, T>,
        scheduled_drafts: &[i64],
    ) -> Result<()> {
        let k = self.num_positions;
        confidences.expect_cols("confidences", k)?;
        let rows = confidences.rows();
        for (argument, len) in [
            ("slots", slots.len()),
            ("scheduled_drafts", scheduled_drafts.len()),
        ] {
            if len != rows {
                return Err(Error::value(
                    argument,
                    format!("has length {len} but confidences has {rows} rows"),
                ));
            }
        }
        self.check_slots(slots)?;
        for (r, &n) in scheduled_drafts.iter().enumerate() {
            if n < 0 || n as u64 > k as u64 {
                return Err(Error::value(
                    "scheduled_drafts",
                    format!("[{r}] = {n} is outside 0..={k}"),
                ));
            }
            let row = confidences.row(r);
            if let Some(j) = (0..n as usize).find(|&j| !(0.0..=1.0).contains(&row[j].into())) {
                return Err(Error::value(
                    "confidences",
                    format!(
                        "[{r}, {j}] = {} is not a probability in [0, 1]",
                        row[j].into()
                    ),
                ));
            }
        }
        self.store(slots, confidences, scheduled_drafts);
        Ok(())
    }

    pub fn count_step(&mut self) {
        self.stamp = self.stamp.wrapping_add(1);
    }

    pub fn coming_explorers(&self, slots: &[i64], explorers: &mut [bool]) -> Result<bool> {
        if explorers.len() != slots.len() {
            return Err(Error::value(
                "explorers",
                format!(
                    "has length {} but slots has {}",
                    explorers.len(),
                    slots.len()
                ),
            ));
        }
        let num_slots = self.marks.len();
        if let Some((r, &slot)) = slots
            .iter()
            .enumerate()
            .find(|&(_, &slot)| usize::try_from(slot).map_or(true, |s| s >= num_slots))
        {
            return Err(Error::value(
                "slots",
                format!("[{r}] = {slot} is outside 0..{num_slots}"),
            ));
        }
        let next = self.stamp.wrapping_add(1);
        for (explores, &slot) in explorers.iter_mut().zip(slots) {
            *explores = self.exploration.explores(next, slot as u64);
        }
        Ok(self.exploration.is_exploration_step(next))
    }

    fn store<T: Copy + Into<f64>>(
        &mut self,
        slots: &[i64],
        confidences: MatrixView<'_, T>,
        scheduled_drafts: &[i64],
    ) {
        // Only drafted positions carry news: past a request's scheduled drafts (a shallower
        // drafting depth, a request near its end) the remembered values stay.
        let k = self.num_positions;
        for (r, (&slot, &n)) in slots.iter().zip(scheduled_drafts).enumerate() {
            let slot = slot as usize;
            for (stored, &p) in self.previous[slot * k..slot * k + n as usize]
                .iter_mut()
                .zip(confidences.row(r))
            {
                *stored = p.into();
            }
        }
    }

    pub fn choose_draft_depth(
        &mut self,
        slots: &[i64],
        max_depths: &[i64],
        step: &StepTokens,
        mode: DepthMode,
        depths: &mut [i32],
    ) -> Result<DepthPlan> {
        let k = self.num_positions;
        self.check_slots(slots)?;
        if max_depths.len() != slots.len() {
            return Err(Error::value(
                "max_depths",
                format!(
                    "has length {} but slots has {}",
                    max_depths.len(),
                    slots.len()
                ),
            ));
        }
        self.gathered.clear();
        for &slot in slots {
            let slot = slot as usize;
            self.gathered
                .extend_from_slice(&self.previous[slot * k..(slot + 1) * k]);
        }
        let remembered = MatrixView::new("confidences", &self.gathered, slots.len(), k)?;
        let mut plan = depth_with(
            &mut self.scratch,
            remembered,
            max_depths,
            step,
            &self.cost_tables,
            mode,
            depths,
        )?;
        if self.exploration.is_on() {
            let next = self.stamp.wrapping_add(1);
            let before = (plan.drafts, plan.max_depth);
            // The requests the next plan explores (it verifies their whole drafted block) draft
            // as deep as the batch already does, which adds no drafter pass; in an exploration
            // step (probability ε, one draw per step) they draft their whole block.
            let whole = self.exploration.is_exploration_step(next);
            for (r, (&slot, &cap)) in slots.iter().zip(max_depths).enumerate() {
                let reach = if whole {
                    cap as i32
                } else {
                    (cap as usize).min(plan.max_depth) as i32
                };
                if depths[r] < reach && self.exploration.explores(next, slot as u64) {
                    depths[r] = reach;
                }
            }
            plan.drafts = depths.iter().map(|&d| d as usize).sum();
            plan.max_depth = depths.iter().map(|&d| d as usize).max().unwrap_or(0);
            if (plan.drafts, plan.max_depth) != before {
                let scheduled: Vec<usize> = depths.iter().map(|&d| d as usize).collect();
                let draft_ms = self
                    .cost_tables
                    .step_draft_cost_ms(&scheduled, &mut Vec::new())?;
                plan.predicted_cost_ms = draft_ms
                    + self.cost_tables.verify_ms()[step.num_non_draft_tokens + plan.budget];
            }
        }
        Ok(plan)
    }

    fn check_slots(&mut self, slots: &[i64]) -> Result<()> {
        let num_slots = self.marks.len();
        let mut checked = Ok(());
        let mut marked = 0;
        for (r, &slot) in slots.iter().enumerate() {
            let Some(index) = usize::try_from(slot).ok().filter(|&s| s < num_slots) else {
                checked = Err(Error::value(
                    "slots",
                    format!("[{r}] = {slot} is outside 0..{num_slots}"),
                ));
                break;
            };
            if self.marks[index] {
                checked = Err(Error::value(
                    "slots",
                    format!("[{r}] = {slot} appears twice"),
                ));
                break;
            }
            self.marks[index] = true;
            marked = r + 1;
        }
        for &slot in &slots[..marked] {
            self.marks[slot as usize] = false;
        }
        checked
    }

    fn check_slot(&self, argument: &'static str, slot: usize) -> Result<()> {
        if slot < self.marks.len() {
            Ok(())
        } else {
            Err(Error::value(
                argument,
                format!("= {slot} is outside 0..{}", self.marks.len()),
            ))
        }
    }
}

impl Clone for VerificationPlanner {
    fn clone(&self) -> Self {
        VerificationPlanner {
            cost_tables: self.cost_tables.clone(),
            num_positions: self.num_positions,
            budget_source: self.budget_source,
            previous: self.previous.clone(),
            gathered: Vec::new(),
            marks: vec![false; self.marks.len()],
            // The step count drives the exploration draws, so a copy continues the same sequence
            // (fresh slot stamps of 0 never collide with a later, larger stamp).
            stamp: self.stamp,
            scratch: Scratch::default(),
            exploration: self.exploration,
        }
    }
}
