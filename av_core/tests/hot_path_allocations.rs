//! The decode step's four calls allocate nothing once their buffers have grown: after one step
//! at a batch's largest size, `choose_draft_depth`, `predict`, `plan` and `observe` run on the
//! buffers the planner and the estimator already own, at that size and every smaller one, and
//! so do `predict`, `plan` and `observe` of an engine that drafts its own depth (no depth
//! decision first). The exception is an `observe` that refits (once a round, and under `map`
//! at the round's 1st, 2nd, 4th, ... steps), whose fit builds its own vectors.
//!
//! A counting global allocator counts the allocations (and reallocations) of the test's own
//! thread; other test threads in this binary do not disturb the count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use av_core::cost_tables::{CostTables, DrafterKind};
use av_core::planner::{BudgetSource, DepthMode, Exploration, StepTokens, VerificationPlanner};
use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};

mod common;
use common::Rng;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: a thread being torn down has no counter left, and is not counted.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so it
// upholds `GlobalAlloc`'s contract exactly as `System` does; the counter is a thread-local
// `Cell` with a const initializer (no allocation, no lazy initialization that could recurse
// into the allocator).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Tables in the shape of a captured profile: a step up past the captured sizes, drafting cost
/// growing with the batch, an autoregressive drafter of `k` passes.
fn tables(max_rows: usize, k: usize) -> CostTables {
    let tokens = max_rows * (k + 1);
    let verify = (0..=tokens)
        .map(|n| if n <= 512 { 6.0 } else { 7.0 } + 0.004 * n as f64)
        .collect();
    let draft = (0..=max_rows).map(|n| 1.0 + 0.002 * n as f64).collect();
    CostTables::new(draft, verify)
        .and_then(|t| t.with_drafter(DrafterKind::Autoregressive, k))
        .expect("valid tables")
}

/// One engine's step loop: a planner and an estimator over `max_rows` slots of `k` positions.
struct Engine {
    k: usize,
    planner: VerificationPlanner,
    estimator: AcceptanceEstimator,
    /// The depth decision's mode; `None`: the engine plans without it.
    mode: Option<DepthMode>,
    draws: Rng,
    features: Vec<f32>,
    probabilities: Vec<f32>,
    slots: Vec<i64>,
    caps: Vec<i64>,
    depths: Vec<i32>,
    scheduled: Vec<i64>,
    admitted: Vec<i32>,
    admitted_i64: Vec<i64>,
    accepted: Vec<i64>,
    /// Allocations per call: depth, predict, plan, and observe in the steps it does not refit.
    by_call: [u64; 4],
    /// Steps whose observe refitted.
    refits: u64,
}

impl Engine {
    fn new(max_rows: usize, k: usize, config: EstimatorConfig, mode: Option<DepthMode>) -> Self {
        let mut planner =
            VerificationPlanner::new(tables(max_rows, k), max_rows, k, BudgetSource::Previous)
                .expect("planner");
        planner.set_exploration(Exploration::new("exploration", 0.2, 7).expect("exploration"));
        Engine {
            k,
            planner,
            estimator: AcceptanceEstimator::new(config).expect("estimator"),
            mode,
            draws: Rng::new(0x9E37_79B9_7F4A_7C15),
            features: vec![0.0; max_rows * k],
            probabilities: vec![0.0; max_rows * k],
            slots: Vec::with_capacity(max_rows),
            caps: Vec::with_capacity(max_rows),
            depths: vec![0; max_rows],
            scheduled: vec![0; max_rows],
            admitted: vec![0; max_rows],
            admitted_i64: vec![0; max_rows],
            accepted: vec![0; max_rows],
            by_call: [0; 4],
            refits: 0,
        }
    }

    /// One decode step of `rows` requests (slots `offset..offset + rows`), adding the
    /// allocations of each of the four calls to [`Self::by_call`].
    fn step(&mut self, rows: usize, offset: usize) {
        let k = self.k;
        // The test's own inputs, written into buffers sized up front.
        self.slots.clear();
        self.slots.extend((offset..offset + rows).map(|s| s as i64));
        self.caps.clear();
        for _ in 0..rows {
            let cap = (self.draws.unit() * (k + 1) as f64) as i64;
            self.caps.push(cap.max(1));
        }
        for x in &mut self.features[..rows * k] {
            *x = (self.draws.unit() * 8.0 - 2.0) as f32;
        }
        let step = StepTokens {
            num_non_draft_tokens: rows,
            num_sampling_requests: rows,
            max_draft_budget: None,
        };
        let mut at = allocations();
        let mut mark = |call: usize, by_call: &mut [u64; 4]| {
            let now = allocations();
            by_call[call] += now - at;
            at = now;
        };
        match self.mode {
            Some(mode) => {
                self.planner
                    .choose_draft_depth(
                        &self.slots,
                        &self.caps,
                        &step,
                        mode,
                        &mut self.depths[..rows],
                    )
                    .expect("depth");
            }
            // An engine that drafts its own depth: every request drafts its cap.
            None => {
                for (depth, &cap) in self.depths.iter_mut().zip(&self.caps) {
                    *depth = cap as i32;
                }
            }
        }
        mark(0, &mut self.by_call);
        let features = MatrixView::new("features", &self.features[..rows * k], rows, k)
            .expect("features view");
        self.estimator
            .predict(features, &mut self.probabilities[..rows * k])
            .expect("predict");
        mark(1, &mut self.by_call);
        for (out, &d) in self.scheduled.iter_mut().zip(&self.depths[..rows]) {
            *out = i64::from(d);
        }
        let probabilities =
            MatrixView::new("confidences", &self.probabilities[..rows * k], rows, k)
                .expect("probabilities view");
        self.planner
            .plan(
                &self.slots,
                probabilities,
                &self.scheduled[..rows],
                &step,
                &mut self.admitted[..rows],
            )
            .expect("plan");
        mark(2, &mut self.by_call);
        // The verdicts (test-side, outside the count): a prefix of each admitted block.
        for r in 0..rows {
            let a = i64::from(self.admitted[r]);
            self.admitted_i64[r] = a;
            self.accepted[r] = ((self.draws.unit() * (a + 1) as f64) as i64).min(a);
        }
        let at = allocations();
        let refitted = self
            .estimator
            .observe(
                features,
                &self.admitted_i64[..rows],
                &self.accepted[..rows],
                Some(probabilities),
            )
            .expect("observe");
        if refitted {
            self.refits += 1;
        } else {
            self.by_call[3] += allocations() - at;
        }
    }
}

/// One step at the largest batch, then 300 counted steps of batch sizes up to it (fewer rows,
/// other slots): the allocations the counted steps made, per call, and how many refitted.
fn allocations_after_warm_up(
    max_rows: usize,
    k: usize,
    config: EstimatorConfig,
    mode: Option<DepthMode>,
) -> ([u64; 4], u64) {
    let mut engine = Engine::new(max_rows, k, config, mode);
    engine.step(max_rows, 0);
    engine.by_call = [0; 4];
    engine.refits = 0;
    for i in 0..300 {
        let rows = match i % 4 {
            0 => max_rows,
            1 => (max_rows / 2).max(1),
            2 => 1,
            _ => (max_rows / 3).max(1),
        };
        engine.step(rows, (max_rows - rows) * (i % 2));
    }
    (engine.by_call, engine.refits)
}

#[test]
fn the_counter_sees_an_allocation() {
    // The check below can fail: a fresh planner's first calls grow its buffers.
    let before = allocations();
    let mut engine = Engine::new(256, 8, EstimatorConfig::map(8), Some(DepthMode::Batch));
    engine.step(256, 0);
    let made: u64 = engine.by_call.iter().sum();
    assert!(
        made > 0,
        "the first step grows buffers, yet none was counted"
    );
    assert!(allocations() > before);
}

#[test]
fn steady_steps_allocate_nothing() {
    let mut found = Vec::new();
    for k in [4, 8, 16] {
        for max_rows in [1, 8, 64, 256, 1024] {
            for mode in [Some(DepthMode::Batch), Some(DepthMode::PerRequest), None] {
                for (name, config) in [
                    ("map", EstimatorConfig::map(k)),
                    ("vllm", EstimatorConfig::vllm(k)),
                ] {
                    let (made, refits) = allocations_after_warm_up(max_rows, k, config, mode);
                    // The counted steps cross round ends (the default interval is 100 steps),
                    // so refitting steps are among them, and left out of the count.
                    assert!(refits >= 2, "{name}: {refits} refits in 300 steps");
                    if made != [0; 4] {
                        found.push(format!(
                            "R = {max_rows}, K = {k}, {mode:?}, {name}: {made:?}"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "allocations in 300 steps after the first (choose_draft_depth, predict, plan, \
         observe):\n{}",
        found.join("\n")
    );
}
