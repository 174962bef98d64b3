//! The stateful planner: remembers each request slot's confidences of the previous step.

use std::fmt;

use super::engine::{Engine, Rows, Sizing};
use super::{BudgetSource, DepthMode, DepthPlan, Exploration, StepTokens, VerificationPlan};
use crate::cost_tables::CostTables;
use crate::error::{Error, Result};
use crate::matrix::MatrixView;
use crate::persist::Persistent;

mod rows;

use rows::{slot_keys, store_at, StoreRows};

/// Most `num_slots × num_positions` entries of remembered confidences.
const MAX_STATE_ENTRIES: usize = 1 << 26;

/// Plans every decode step, sizing the budget from the previous step's confidences of each
/// request slot (`BudgetSource::Previous`, the default, lossless for every drafter) or from the
/// current ones (`BudgetSource::Current`, lossless only for drafters whose positions do not
/// depend on earlier draft tokens). The assignment always uses the current confidences.
///
/// State is one row of `K` confidences per slot, starting at 1.0 (vLLM's choice for a new
/// request: optimistic, so a fresh request is not starved of verification on its first step).
/// Each successful [`VerificationPlanner::plan`] stores, for the next step, the current
/// confidences of the positions each request drafted (its `scheduled_drafts`; the others keep
/// their earlier values); a rejected call changes nothing.
///
/// # Concurrency
///
/// The planner is `Send + Sync` (checked at compile time), so it can move to, or be shared
/// with, another thread, but it is not concurrently mutable: [`plan`](Self::plan),
/// [`add_request`](Self::add_request) and [`set_exploration`](Self::set_exploration) take
/// `&mut self` and need exclusive access. Keep one planner per scheduler thread, or wrap a
/// shared one in a `Mutex`. The `&self` accessors (`cost_tables`, `num_slots`,
/// `num_positions`, `budget_source`, `exploration`, `previous_confidences`) may run from any
/// number of threads at once while no `&mut self` call is in progress. Its [`CostTables`] are
/// immutable; clone them (or the planner) freely.
///
/// # Example
///
/// ```rust
/// use std::sync::{Arc, Mutex};
/// use av_core::cost_tables::CostTables;
/// use av_core::planner::{BudgetSource, StepTokens, VerificationPlanner};
/// use av_core::MatrixView;
///
/// let tables = CostTables::new(vec![0.0; 9], vec![1.0; 64])?;
/// let planner = VerificationPlanner::new(tables, 16, 3, BudgetSource::Previous)?;
/// assert_eq!((planner.num_slots(), planner.num_positions()), (16, 3));
/// let planner = Arc::new(Mutex::new(planner));
/// let scheduler = {
///     let planner = Arc::clone(&planner);
///     std::thread::spawn(move || {
///         let confidences = [0.9, 0.8, 0.7];
///         let view = MatrixView::new("confidences", &confidences, 1, 3).unwrap();
///         let step = StepTokens {
///             num_non_draft_tokens: 1,
///             num_sampling_requests: 1,
///             ..Default::default()
///         };
///         let mut admitted = [0; 1];
///         planner.lock().unwrap().plan(&[4], view, &[3], &step, &mut admitted).unwrap();
///         admitted
///     })
/// };
/// assert_eq!(scheduler.join().unwrap(), [3]); // verifying is flat-priced: take everything
/// assert_eq!(planner.lock().unwrap().previous_confidences(4)?, [0.9, 0.8, 0.7]);
/// # Ok::<(), av_core::Error>(())
/// ```
pub struct VerificationPlanner {
    cost_tables: CostTables,
    num_positions: usize,
    budget_source: BudgetSource,
    /// Each slot's remembered confidences, slot-major.
    previous: Vec<f64>,
    /// Their survivals (`Π_{j ≤ k} previous[slot, j]`, multiplied as the planner multiplies
    /// confidences), what the budget and the depth decision read.
    survivals: Vec<f64>,
    /// Changes whenever `survivals` does (the engine keeps gathered rows while it stays).
    generation: u64,
    /// Each slot's part of its exploration draws.
    slot_keys: Vec<u64>,
    /// `marks[slot] == epoch`: the slot was seen in the current call's `slots`.
    marks: Vec<u32>,
    epoch: u32,
    /// The `slots` of the last call whose check passed (distinct and in range): a call with
    /// the same slots, such as the plan after the depth decision of its step, is not checked
    /// again (`num_slots` never changes, so they stay valid).
    checked: Vec<i64>,
    stamp: u64,
    engine: Engine,
    exploration: Exploration,
}

impl VerificationPlanner {
    /// A planner for `num_slots` request slots of `num_positions` (`K ≥ 1`) drafts each.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    /// use av_core::planner::{BudgetSource, VerificationPlanner};
    ///
    /// let tables = CostTables::new(vec![0.2; 257], vec![5.0; 2049])?;
    /// let planner = VerificationPlanner::new(tables, 256, 4, BudgetSource::Previous)?;
    /// assert_eq!(planner.budget_source(), BudgetSource::Previous);
    /// assert_eq!(planner.previous_confidences(0)?, [1.0; 4]); // optimistic start
    /// assert_eq!(planner.cost_tables().max_num_reqs(), 256);
    /// let tables = planner.cost_tables().clone();
    /// assert!(VerificationPlanner::new(tables, 8, 0, BudgetSource::Current).is_err());
    /// # Ok::<(), av_core::Error>(())
    /// ```
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
        super::engine::check_depth_table(&cost_tables, num_positions)?;
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
            survivals: vec![1.0; entries],
            generation: 0,
            slot_keys: slot_keys(num_slots),
            marks: vec![0; num_slots],
            epoch: 0,
            checked: Vec::new(),
            stamp: 0,
            engine: Engine::default(),
            exploration: Exploration::DEFAULT,
        })
    }

    /// Default exploration floor: one request in a hundred verifies its whole draft block.
    pub const DEFAULT_EXPLORATION: f64 = Exploration::DEFAULT_PROBABILITY;

    /// Sets the exploration floor ([`Exploration`]): each step, each request independently
    /// verifies its whole scheduled draft block with its probability, whatever the budget, and
    /// the drafting-depth decision widens the same requests. The extra drafts never push the
    /// step past `max_draft_budget` or the cost tables. [`Exploration::OFF`] turns it off
    /// (vLLM's behaviour).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    /// use av_core::planner::{BudgetSource, Exploration, StepTokens, VerificationPlanner};
    /// use av_core::MatrixView;
    ///
    /// let verify_ms: Vec<f64> = (0..=8).map(|t| 0.5 + 0.25 * t as f64).collect();
    /// let tables = CostTables::new(vec![0.0; 9], verify_ms)?;
    /// let mut planner = VerificationPlanner::new(tables, 8, 2, BudgetSource::Current)?;
    /// assert_eq!(planner.exploration(), VerificationPlanner::DEFAULT_EXPLORATION);
    /// // Low confidences: the budget is 0, but with probability 1 every request explores.
    /// planner.set_exploration(Exploration::new("exploration", 1.0, 42)?);
    /// assert_eq!((planner.exploration(), planner.exploration_seed()), (1.0, 42));
    /// let view = MatrixView::new("confidences", &[0.1, 0.1, 0.1, 0.1], 2, 2)?;
    /// let step = StepTokens {
    ///     num_non_draft_tokens: 2,
    ///     num_sampling_requests: 2,
    ///     ..Default::default()
    /// };
    /// let mut admitted = [0; 2];
    /// assert_eq!(planner.plan(&[0, 1], view, &[2, 2], &step, &mut admitted)?.budget, 4);
    /// assert_eq!(admitted, [2, 2]);
    /// assert_eq!(Exploration::new("exploration", 1.5, 0).unwrap_err().argument, "exploration");
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn set_exploration(&mut self, exploration: Exploration) {
        self.exploration = exploration;
    }

    /// The exploration probability.
    pub fn exploration(&self) -> f64 {
        self.exploration.probability()
    }

    /// The seed of the exploration draws.
    pub fn exploration_seed(&self) -> u64 {
        self.exploration.seed()
    }

    /// The cost tables the planner prices steps with.
    pub fn cost_tables(&self) -> &CostTables {
        &self.cost_tables
    }

    /// Number of request slots.
    pub fn num_slots(&self) -> usize {
        self.slot_keys.len()
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
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    /// use av_core::planner::{BudgetSource, StepTokens, VerificationPlanner};
    /// use av_core::MatrixView;
    ///
    /// let tables = CostTables::new(vec![0.0; 5], vec![1.0; 16])?;
    /// let mut planner = VerificationPlanner::new(tables, 4, 2, BudgetSource::Previous)?;
    /// let view = MatrixView::new("confidences", &[0.3, 0.2], 1, 2)?;
    /// let step = StepTokens {
    ///     num_non_draft_tokens: 1,
    ///     num_sampling_requests: 1,
    ///     ..Default::default()
    /// };
    /// planner.plan(&[2], view, &[2], &step, &mut [0])?;
    /// assert_eq!(planner.previous_confidences(2)?, [0.3, 0.2]);
    /// planner.add_request(2)?; // the request finished; a new one reuses slot 2
    /// assert_eq!(planner.previous_confidences(2)?, [1.0, 1.0]);
    /// assert!(planner.add_request(4).is_err()); // only slots 0..4
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn add_request(&mut self, slot: usize) -> Result<()> {
        self.check_slot("slot", slot)?;
        let k = self.num_positions;
        self.previous[slot * k..(slot + 1) * k].fill(1.0);
        self.survivals[slot * k..(slot + 1) * k].fill(1.0);
        self.generation = self.generation.wrapping_add(1);
        Ok(())
    }

    /// Plans one step for the requests in `slots` (distinct slot indices, one per row of
    /// `confidences`), writes the admitted counts to `admitted`, and remembers this step's
    /// confidences for the next. See [`super::plan_verification`] for the arguments.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    /// use av_core::planner::{BudgetSource, Exploration, StepTokens, VerificationPlanner};
    /// use av_core::MatrixView;
    ///
    /// // Drafting is free; verifying costs 0.5 ms + 0.25 ms per token.
    /// let verify_ms: Vec<f64> = (0..=8).map(|t| 0.5 + 0.25 * t as f64).collect();
    /// let tables = CostTables::new(vec![0.0; 9], verify_ms)?;
    /// let mut planner = VerificationPlanner::new(tables, 8, 2, BudgetSource::Previous)?;
    /// planner.set_exploration(Exploration::OFF); // no exploration floor: the budget alone decides
    /// let step = StepTokens {
    ///     num_non_draft_tokens: 2,
    ///     num_sampling_requests: 2,
    ///     ..Default::default()
    /// };
    /// let confidences = [0.1, 0.1, 0.1, 0.1]; // slots 3 and 5, two drafts each
    /// let view = MatrixView::new("confidences", &confidences, 2, 2)?;
    /// let mut admitted = [0; 2];
    /// // First step: the budget reads the optimistic 1.0s, so the new requests are verified.
    /// assert_eq!(planner.plan(&[3, 5], view, &[2, 2], &step, &mut admitted)?.budget, 4);
    /// assert_eq!(admitted, [2, 2]);
    /// // Next step: it reads last step's 0.1s, and nothing is worth verifying.
    /// assert_eq!(planner.plan(&[3, 5], view, &[2, 2], &step, &mut admitted)?.budget, 0);
    /// assert_eq!(admitted, [0, 0]);
    /// # Ok::<(), av_core::Error>(())
    /// ```
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
        let remembered: Rows<'_, f64> = Rows::Remembered {
            survivals: &self.survivals,
            slots,
            cols: k,
            generation: self.generation,
        };
        let sizing = match self.budget_source {
            BudgetSource::Previous => Sizing::Other(remembered),
            BudgetSource::Current => Sizing::Current,
        };
        let planned = self.engine.plan(
            confidences,
            sizing,
            scheduled_drafts,
            step,
            &self.cost_tables,
            admitted,
        )?;
        // The step counts only once the plan succeeded: a rejected call changes nothing.
        self.stamp = self.stamp.wrapping_add(1);
        let mut plan = planned.plan;
        if self.exploration.is_on() {
            self.explore(slots, step, planned.draft_ms, admitted, &mut plan);
        }
        self.store(slots, confidences, scheduled_drafts, true);
        Ok(plan)
    }

    /// Widens `plan` to whole draft blocks for the requests that explore this step, within the
    /// step's draft limit; updates the plan's totals. Reads the engine's scheduled counts and
    /// survivals of the plan just made.
    fn explore(
        &self,
        slots: &[i64],
        step: &StepTokens,
        draft_ms: f64,
        admitted: &mut [i32],
        plan: &mut VerificationPlan,
    ) {
        let k = self.num_positions;
        let scheduled = self.engine.scheduled();
        let survivals = self.engine.survivals();
        let total: usize = scheduled.iter().sum();
        let limit = step.max_draft_budget.map_or(total, |cap| cap.min(total));
        let mut added = false;
        let draws = self.exploration.draws(self.stamp);
        for (r, (&slot, &to)) in slots.iter().zip(scheduled).enumerate() {
            let from = admitted[r] as usize;
            if to <= from
                || plan.budget + (to - from) > limit
                || !draws.explores(self.slot_keys[slot as usize])
            {
                continue;
            }
            for &survival in &survivals[r * k + from..r * k + to] {
                plan.expected_accepted_tokens += survival;
            }
            plan.budget += to - from;
            admitted[r] = to as i32;
            added = true;
        }
        if added {
            plan.predicted_cost_ms =
                draft_ms + self.cost_tables.verify_ms()[step.num_non_draft_tokens + plan.budget];
        }
    }

    /// Remembers this step's confidences of the positions each request drafted
    /// (`scheduled_drafts[r]`), as [`Self::plan`] does, without planning: for engines whose
    /// verification is planned elsewhere (vLLM's own budget) but whose drafting depth comes
    /// from [`Self::choose_draft_depth`]. Confidences past a request's drafts are not read. A
    /// rejected call changes nothing.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    /// use av_core::planner::{BudgetSource, VerificationPlanner};
    /// use av_core::MatrixView;
    ///
    /// let tables = CostTables::new(vec![0.0; 3], vec![1.0; 9])?;
    /// let mut planner = VerificationPlanner::new(tables, 4, 2, BudgetSource::Previous)?;
    /// let view = MatrixView::new("confidences", &[0.5, f64::NAN], 1, 2)?;
    /// planner.remember(&[3], view, &[1])?; // one drafted position; the NaN is never read
    /// assert_eq!(planner.previous_confidences(3)?, [0.5, 1.0]);
    /// # Ok::<(), av_core::Error>(())
    /// ```
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
        self.store(slots, confidences, scheduled_drafts, false);
        Ok(())
    }

    /// Counts one step without planning it: advances the step count that the exploration draws
    /// read, as a successful [`Self::plan`] does. For engines that plan verification elsewhere
    /// and take only the drafting depth from [`Self::choose_draft_depth`] (remembering with
    /// [`Self::remember`]): call it once per step, after the depth decision; without it every
    /// step would draw the same explorers.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    /// use av_core::planner::{BudgetSource, Exploration, VerificationPlanner};
    ///
    /// let tables = CostTables::new(vec![0.0; 3], vec![1.0; 9])?;
    /// let mut planner = VerificationPlanner::new(tables, 64, 2, BudgetSource::Previous)?;
    /// planner.set_exploration(Exploration::new("exploration", 0.5, 3)?);
    /// let slots: Vec<i64> = (0..64).collect();
    /// let (mut before, mut after) = ([false; 64], [false; 64]);
    /// planner.coming_explorers(&slots, &mut before)?;
    /// planner.count_step();
    /// planner.coming_explorers(&slots, &mut after)?;
    /// assert_ne!(before, after); // a new step, new draws
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn count_step(&mut self) {
        self.stamp = self.stamp.wrapping_add(1);
    }

    /// The exploration draws of the coming step (the one the next [`Self::choose_draft_depth`]
    /// decides and the next [`Self::plan`] or [`Self::count_step`] counts): writes to
    /// `explorers[r]` whether request `slots[r]` explores (the plan verifies its whole drafted
    /// block; the depth decision lets it draft as deep as the batch) and returns whether the
    /// step is an exploration step (its explorers draft their whole block). Draws read only the
    /// seed, the step count and the slot, never a confidence or a token. Changes no state.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    /// use av_core::planner::{BudgetSource, Exploration, VerificationPlanner};
    ///
    /// let tables = CostTables::new(vec![0.0; 3], vec![1.0; 9])?;
    /// let mut planner = VerificationPlanner::new(tables, 8, 2, BudgetSource::Previous)?;
    /// planner.set_exploration(Exploration::ALWAYS);
    /// let mut explorers = [false; 2];
    /// assert!(planner.coming_explorers(&[1, 6], &mut explorers)?);
    /// assert_eq!(explorers, [true, true]);
    /// planner.set_exploration(Exploration::OFF);
    /// assert!(!planner.coming_explorers(&[1, 6], &mut explorers)?);
    /// assert_eq!(explorers, [false, false]);
    /// let err = planner.coming_explorers(&[8], &mut [false]).unwrap_err();
    /// assert_eq!(err.to_string(), "slots: [0] = 8 is outside 0..8");
    /// # Ok::<(), av_core::Error>(())
    /// ```
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
        let num_slots = self.slot_keys.len();
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
        let draws = self.exploration.draws(self.stamp.wrapping_add(1));
        for (explores, &slot) in explorers.iter_mut().zip(slots) {
            *explores = draws.explores(self.slot_keys[slot as usize]);
        }
        Ok(self
            .exploration
            .is_exploration_step(self.stamp.wrapping_add(1)))
    }

    /// Writes the drafted positions' confidences of `slots` (validated by the caller) and the
    /// survivals of the rows they change. With `planned`, the engine holds this call's
    /// survivals of `confidences` (the same products), which are copied instead of multiplied.
    fn store<T: Copy + Into<f64>>(
        &mut self,
        slots: &[i64],
        confidences: MatrixView<'_, T>,
        scheduled_drafts: &[i64],
        planned: bool,
    ) {
        self.generation = self.generation.wrapping_add(1);
        let rows = StoreRows {
            previous: &mut self.previous,
            survivals: &mut self.survivals,
            slots,
            confidences,
            scheduled_drafts,
            current: planned.then_some(self.engine.survivals()),
        };
        store_at(crate::simd::level(), rows, self.num_positions);
    }

    /// How many positions each request in `slots` should draft at the coming step, from the
    /// confidences remembered for its slot (fixed before this step's drafts exist, so the
    /// decision is lossless for every drafter). `max_depths[r]` caps request `r` (`0..=K`).
    ///
    /// Exploration, with the planner's exploration probability `ε` (draws from the seed, the
    /// coming step and the slot, never from tokens): a request that the next [`Self::plan`]
    /// explores drafts as deep as the deepest request already does (no extra drafter pass), so
    /// its whole drafted block gets verified; in an exploration step (probability `ε`, one draw
    /// per step) those requests draft their full `max_depths[r]`, so deep positions keep
    /// receiving labels even when the decision has been "do not draft" for a while. Only
    /// explorers widen: the rest of the batch, whose remembered confidences may be stale or
    /// optimistic, is never pulled into drafting (and so into a verification budget sized from
    /// those confidences).
    /// See [`super::choose_draft_depth`] for the rule; depths go to `depths`. Changes no state.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::{CostTables, DrafterKind};
    /// use av_core::planner::{BudgetSource, DepthMode, Exploration, StepTokens, VerificationPlanner};
    /// use av_core::MatrixView;
    ///
    /// // Drafting 2 positions costs 4 ms; verifying is a flat 10 ms.
    /// let tables = CostTables::new(vec![0.0, 4.0, 4.0], vec![10.0; 8])?
    ///     .with_drafter(DrafterKind::Autoregressive, 2)?;
    /// let mut planner = VerificationPlanner::new(tables, 4, 2, BudgetSource::Previous)?;
    /// planner.set_exploration(Exploration::OFF);
    /// let step = StepTokens {
    ///     num_non_draft_tokens: 2,
    ///     num_sampling_requests: 2,
    ///     ..Default::default()
    /// };
    /// let mut depths = [0; 2];
    /// // Fresh slots remember optimistic 1.0s: draft everything.
    /// planner.choose_draft_depth(&[0, 1], &[2, 2], &step, DepthMode::Batch, &mut depths)?;
    /// assert_eq!(depths, [2, 2]);
    /// // After a step of poor drafts, drafting is not worth its passes.
    /// let poor = MatrixView::new("confidences", &[0.05, 0.05, 0.05, 0.05], 2, 2)?;
    /// planner.plan(&[0, 1], poor, &[2, 2], &step, &mut [0; 2])?;
    /// planner.choose_draft_depth(&[0, 1], &[2, 2], &step, DepthMode::Batch, &mut depths)?;
    /// assert_eq!(depths, [0, 0]);
    /// # Ok::<(), av_core::Error>(())
    /// ```
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
        let remembered: Rows<'_, f64> = Rows::Remembered {
            survivals: &self.survivals,
            slots,
            cols: k,
            generation: self.generation,
        };
        let mut plan = self.engine.depth(
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
            let draws = self.exploration.draws(next);
            for (r, (&slot, &cap)) in slots.iter().zip(max_depths).enumerate() {
                let reach = if whole {
                    cap as i32
                } else {
                    (cap as usize).min(plan.max_depth) as i32
                };
                if depths[r] < reach && draws.explores(self.slot_keys[slot as usize]) {
                    depths[r] = reach;
                }
            }
            plan.drafts = depths.iter().map(|&d| d as usize).sum();
            plan.max_depth = depths.iter().map(|&d| d as usize).max().unwrap_or(0);
            if (plan.drafts, plan.max_depth) != before {
                let draft_ms = self.engine.depth_cost_ms(depths, &self.cost_tables)?;
                plan.predicted_cost_ms = draft_ms
                    + self.cost_tables.verify_ms()[step.num_non_draft_tokens + plan.budget];
            }
        }
        Ok(plan)
    }

    /// Checks that `slots` are distinct and in range, marking each with this call's epoch (so
    /// a rejected call leaves no trace: the next call counts from a new epoch). The slots of
    /// the last call that passed are kept: the same slots again pass after one comparison.
    fn check_slots(&mut self, slots: &[i64]) -> Result<()> {
        if self.checked[..] == *slots {
            return Ok(());
        }
        self.check_new_slots(slots)?;
        self.checked.clear();
        self.checked.extend_from_slice(slots);
        Ok(())
    }

    /// [`Self::check_slots`] for slots not checked before.
    fn check_new_slots(&mut self, slots: &[i64]) -> Result<()> {
        let num_slots = self.marks.len();
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            // Every mark is an old epoch's after the counter wraps: start over.
            self.marks.fill(0);
            self.epoch = 1;
        }
        for (r, &slot) in slots.iter().enumerate() {
            let Some(index) = usize::try_from(slot).ok().filter(|&s| s < num_slots) else {
                return Err(Error::value(
                    "slots",
                    format!("[{r}] = {slot} is outside 0..{num_slots}"),
                ));
            };
            if self.marks[index] == self.epoch {
                return Err(Error::value(
                    "slots",
                    format!("[{r}] = {slot} appears twice"),
                ));
            }
            self.marks[index] = self.epoch;
        }
        Ok(())
    }

    fn check_slot(&self, argument: &'static str, slot: usize) -> Result<()> {
        if slot < self.num_slots() {
            Ok(())
        } else {
            Err(Error::value(
                argument,
                format!("= {slot} is outside 0..{}", self.num_slots()),
            ))
        }
    }
}

impl VerificationPlanner {
    /// Most `num_slots × num_positions` entries of remembered confidences.
    pub(crate) const MAX_STATE_ENTRIES: usize = MAX_STATE_ENTRIES;

    /// Length of [`VerificationPlanner::to_bytes`]'s output for tables of `draft_len` and
    /// `verify_len` entries, `entries` remembered confidences (`num_slots × K`) and, when there is
    /// one, a draft-depth table of `depth_len` entries (layout: [`crate::persist::planner`]).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    /// use av_core::planner::{BudgetSource, VerificationPlanner};
    ///
    /// let tables = CostTables::new(vec![0.0; 3], vec![1.0; 9])?;
    /// let planner = VerificationPlanner::new(tables, 2, 4, BudgetSource::Previous)?;
    /// assert_eq!(planner.to_bytes().len(), VerificationPlanner::encoded_len(3, 9, 8, None));
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub const fn encoded_len(
        draft_len: usize,
        verify_len: usize,
        entries: usize,
        depth_len: Option<usize>,
    ) -> usize {
        crate::persist::planner::encoded_len(draft_len, verify_len, entries, depth_len)
    }

    /// The longest state [`to_bytes`](Self::to_bytes) can write (both tables at
    /// [`MAX_TABLE_LEN`](crate::cost_tables::MAX_TABLE_LEN), the most remembered confidences,
    /// the deepest depth table): a reader never needs more bytes.
    pub const MAX_ENCODED_LEN: usize = <Self as Persistent>::MAX_ENCODED_LEN;

    /// The planner's state — cost tables, settings, the step count that drives exploration and
    /// every slot's remembered confidences — as versioned, checksummed bytes (the frame of
    /// [`crate::persist`], magic `AVCORE\0P`; the payload is [`crate::persist::planner`]).
    ///
    /// ```
    /// use av_core::cost_tables::CostTables;
    /// use av_core::planner::{BudgetSource, VerificationPlanner};
    ///
    /// let tables = CostTables::new(vec![0.0; 3], vec![1.0; 9]).unwrap();
    /// let planner = VerificationPlanner::new(tables, 2, 4, BudgetSource::Previous).unwrap();
    /// let back = VerificationPlanner::from_bytes(&planner.to_bytes()).unwrap();
    /// assert_eq!(back.to_bytes(), planner.to_bytes());
    /// assert!(VerificationPlanner::from_bytes(&[0u8; 10]).is_err());
    /// ```
    pub fn to_bytes(&self) -> Vec<u8> {
        self.encode()
    }

    /// Rebuilds a planner from [`to_bytes`](Self::to_bytes) (of this release or an earlier
    /// one). Corrupt, truncated, foreign or future-version data, or values that a planner could
    /// not hold, are refused with an [`ErrorKind::State`](crate::ErrorKind::State) error.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::decode(bytes)
    }

    /// Every slot's remembered confidences, slot-major (what the state saves).
    pub(crate) fn remembered(&self) -> &[f64] {
        &self.previous
    }

    /// Steps planned so far (wrapping), which the exploration draws read.
    pub(crate) fn step_count(&self) -> u64 {
        self.stamp
    }

    /// Restores what [`Self::remembered`] and [`Self::step_count`] returned (validated by the
    /// caller: `remembered` has one value in `[0, 1]` per entry).
    pub(crate) fn restore(&mut self, remembered: &[f64], step_count: u64) {
        self.previous.copy_from_slice(remembered);
        let k = self.num_positions;
        for (survivals, previous) in self
            .survivals
            .chunks_exact_mut(k)
            .zip(self.previous.chunks_exact(k))
        {
            let mut survival = 1.0f64;
            for (value, &p) in survivals.iter_mut().zip(previous) {
                survival *= p + 0.0;
                *value = survival;
            }
        }
        self.generation = self.generation.wrapping_add(1);
        self.stamp = step_count;
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
            survivals: self.survivals.clone(),
            generation: self.generation,
            slot_keys: self.slot_keys.clone(),
            marks: vec![0; self.marks.len()],
            epoch: 0,
            checked: Vec::new(),
            // The step count drives the exploration draws, so a copy continues the same sequence.
            stamp: self.stamp,
            engine: Engine::default(),
            exploration: self.exploration,
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
