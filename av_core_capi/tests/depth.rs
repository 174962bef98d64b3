//! The drafting-depth entry points (`avc_cost_tables_with_draft_depth`, `_with_drafter`,
//! `_draft_depth`, `avc_choose_draft_depth`, `avc_planner_choose_draft_depth`,
//! `avc_planner_remember`, `avc_planner_count_step`, `avc_planner_coming_explorers`), called from
//! Rust: they give the core's bits, and every rejected call names its argument and leaves the
//! outputs and the handles as they were.

#![cfg(feature = "capi")]

mod common;

use std::ptr::{null, null_mut};

use av_core::cost_tables::{CostTables, DrafterKind};
use av_core::planner::{self, BudgetSource, DepthMode, StepTokens, VerificationPlanner};
use av_core::MatrixView;
use av_core_capi::cost_tables::*;
use av_core_capi::planner::*;
use av_core_capi::status::*;
use common::{last_error, rejected};

const K: usize = 3;

/// A cost-tables handle, freed on drop.
struct Tables(*mut AvcCostTables);

impl Tables {
    fn new(draft_ms: &[f64], verify_ms: &[f64]) -> Self {
        let mut handle = null_mut();
        // SAFETY: both arrays are readable for their lengths; `handle` is a writable local.
        let status = unsafe {
            avc_cost_tables_new(
                draft_ms.as_ptr(),
                draft_ms.len(),
                verify_ms.as_ptr(),
                verify_ms.len(),
                &mut handle,
            )
        };
        assert_eq!(status, AVC_OK, "{}", last_error());
        Tables(handle)
    }

    fn with_drafter(&self, kind: AvcDrafterKind, max_depth: usize) -> Self {
        let mut handle = null_mut();
        // SAFETY: live tables; `handle` is a writable local.
        let status = unsafe { avc_cost_tables_with_drafter(self.0, kind, max_depth, &mut handle) };
        assert_eq!(status, AVC_OK, "{}", last_error());
        Tables(handle)
    }

    /// The depth table through `avc_cost_tables_draft_depth` (empty when absent).
    fn depth_table(&self) -> Vec<f64> {
        let mut len = usize::MAX;
        // SAFETY: live tables; NULL with capacity 0 is the size query.
        let status = unsafe { avc_cost_tables_draft_depth(self.0, null_mut(), 0, &mut len) };
        if len == 0 {
            assert_eq!(status, AVC_OK);
            return Vec::new();
        }
        assert_eq!(status, AVC_ERR_BUFFER_TOO_SMALL);
        let mut table = vec![f64::NAN; len];
        // SAFETY: `table` has exactly `len` writable doubles.
        let status =
            unsafe { avc_cost_tables_draft_depth(self.0, table.as_mut_ptr(), len, &mut len) };
        assert_eq!(status, AVC_OK, "{}", last_error());
        assert_eq!(len, table.len());
        table
    }

    /// Both dense tables through `avc_cost_tables_copy`.
    fn dense(&self) -> (Vec<f64>, Vec<f64>) {
        let (mut reqs, mut tokens) = (0, 0);
        // SAFETY: live tables; both outputs are writable locals.
        assert_eq!(
            unsafe { avc_cost_tables_sizes(self.0, &mut reqs, &mut tokens) },
            AVC_OK
        );
        let (mut draft, mut verify) = (vec![0.0; reqs + 1], vec![0.0; tokens + 1]);
        // SAFETY: each array has the length it is passed with.
        let status = unsafe {
            avc_cost_tables_copy(
                self.0,
                draft.as_mut_ptr(),
                draft.len(),
                verify.as_mut_ptr(),
                verify.len(),
            )
        };
        assert_eq!(status, AVC_OK);
        (draft, verify)
    }
}

impl Drop for Tables {
    fn drop(&mut self) {
        // SAFETY: the handle is live and no other call uses it any more.
        assert_eq!(unsafe { avc_cost_tables_free(self.0) }, AVC_OK);
    }
}

/// A planner handle, freed on drop.
struct Planner(*mut AvcPlanner);

impl Planner {
    fn new(tables: &Tables, num_slots: usize) -> Self {
        let mut handle = null_mut();
        // SAFETY: live tables; `handle` is a writable local.
        let status = unsafe {
            avc_planner_new(
                tables.0,
                num_slots,
                K,
                AVC_BUDGET_SOURCE_PREVIOUS,
                &mut handle,
            )
        };
        assert_eq!(status, AVC_OK, "{}", last_error());
        Planner(handle)
    }

    fn plan(&self, slots: &[i64], confidences: &[f32], scheduled: &[i64], step: &AvcStepTokens) {
        let rows = slots.len();
        let mut admitted = vec![0i32; rows];
        let mut plan = AvcVerificationPlan {
            budget: 0,
            expected_accepted_tokens: 0.0,
            predicted_cost_ms: 0.0,
        };
        // SAFETY: live planner; every array is passed with its own length.
        let status = unsafe {
            avc_planner_plan(
                self.0,
                slots.as_ptr(),
                rows,
                confidences.as_ptr(),
                rows,
                K,
                scheduled.as_ptr(),
                rows,
                step,
                admitted.as_mut_ptr(),
                rows,
                &mut plan,
            )
        };
        assert_eq!(status, AVC_OK, "{}", last_error());
    }

    /// `avc_planner_remember` with `confidences` read as `[rows, cols]` (`rows · cols` must
    /// not exceed its length).
    fn remember(
        &self,
        slots: &[i64],
        confidences: &[f32],
        (rows, cols): (usize, usize),
        scheduled: &[i64],
    ) -> AvcStatus {
        assert!(rows * cols <= confidences.len());
        // SAFETY: live planner; every array is passed with at most its own length.
        unsafe {
            avc_planner_remember(
                self.0,
                slots.as_ptr(),
                slots.len(),
                confidences.as_ptr(),
                rows,
                cols,
                scheduled.as_ptr(),
                scheduled.len(),
            )
        }
    }

    fn remembered(&self, slot: usize) -> Vec<f64> {
        let mut out = vec![0.0; K];
        // SAFETY: live planner; `out` has K writable doubles.
        let status = unsafe { avc_planner_previous_confidences(self.0, slot, out.as_mut_ptr(), K) };
        assert_eq!(status, AVC_OK, "{}", last_error());
        out
    }

    fn depth(
        &self,
        slots: &[i64],
        max_depths: &[i64],
        step: &AvcStepTokens,
        mode: AvcDepthMode,
        depths: &mut [i32],
        plan: &mut AvcDepthPlan,
    ) -> AvcStatus {
        // SAFETY: live planner; every array is passed with its own length.
        unsafe {
            avc_planner_choose_draft_depth(
                self.0,
                slots.as_ptr(),
                slots.len(),
                max_depths.as_ptr(),
                max_depths.len(),
                step,
                mode,
                depths.as_mut_ptr(),
                depths.len(),
                plan,
            )
        }
    }
    /// [`Self::depth`] into fresh buffers, asserting that it succeeds.
    fn decide(
        &self,
        slots: &[i64],
        max_depths: &[i64],
        step: &AvcStepTokens,
        mode: AvcDepthMode,
    ) -> (Vec<i32>, AvcDepthPlan) {
        let mut depths = vec![-1i32; slots.len()];
        let mut plan = UNTOUCHED;
        let status = self.depth(slots, max_depths, step, mode, &mut depths, &mut plan);
        assert_eq!(status, AVC_OK, "{}", last_error());
        (depths, plan)
    }
}

impl Drop for Planner {
    fn drop(&mut self) {
        // SAFETY: the handle is live and no other call uses it any more.
        assert_eq!(unsafe { avc_planner_free(self.0) }, AVC_OK);
    }
}

/// A plan no call writes: any field changed shows a rejected call wrote it.
const UNTOUCHED: AvcDepthPlan = AvcDepthPlan {
    max_depth: 77,
    drafts: 77,
    budget: 77,
    expected_accepted_tokens: -7.0,
    predicted_cost_ms: -7.0,
};

fn step(rows: usize) -> AvcStepTokens {
    AvcStepTokens {
        num_non_draft_tokens: rows,
        num_sampling_requests: rows,
        max_draft_budget: usize::MAX,
    }
}

/// Stateless depth through the C entry point.
#[allow(clippy::too_many_arguments)]
fn choose(
    confidences: &[f32],
    rows: usize,
    cols: usize,
    max_depths: &[i64],
    step: &AvcStepTokens,
    tables: &Tables,
    mode: AvcDepthMode,
    depths: &mut [i32],
    plan: &mut AvcDepthPlan,
) -> AvcStatus {
    // SAFETY: every array is passed with its own length; live tables; writable plan.
    unsafe {
        avc_choose_draft_depth(
            confidences.as_ptr(),
            rows,
            cols,
            max_depths.as_ptr(),
            max_depths.len(),
            step,
            tables.0,
            mode,
            depths.as_mut_ptr(),
            depths.len(),
            plan,
        )
    }
}

/// Deterministic confidences in [0, 1] for `rows` requests, and per-request caps.
fn batch(seed: u64, rows: usize) -> (Vec<f32>, Vec<i64>) {
    let mut state = seed.wrapping_add(1);
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let confidences = (0..rows * K)
        .map(|_| (next() % 1001) as f32 / 1000.0)
        .collect();
    let caps = (0..rows)
        .map(|_| (next() % (K as u64 + 1)) as i64)
        .collect();
    (confidences, caps)
}

const MODES: [(AvcDepthMode, DepthMode); 2] = [
    (AVC_DEPTH_MODE_BATCH, DepthMode::Batch),
    (AVC_DEPTH_MODE_PER_REQUEST, DepthMode::PerRequest),
];

fn assert_same_plan(got: &AvcDepthPlan, want: &planner::DepthPlan) {
    assert_eq!(
        (got.max_depth, got.drafts, got.budget),
        (want.max_depth, want.drafts, want.budget)
    );
    assert_eq!(
        got.expected_accepted_tokens.to_bits(),
        want.expected_accepted_tokens.to_bits()
    );
    assert_eq!(
        got.predicted_cost_ms.to_bits(),
        want.predicted_cost_ms.to_bits()
    );
}

// ---- cost tables -------------------------------------------------------------------------

#[test]
fn with_draft_depth_makes_new_tables_and_leaves_the_input() {
    let base = Tables::new(&[0.0, 1.0, 1.5], &[2.0, 3.0, 4.0, 5.0]);
    let depth = [0.0, 1.1, 2.0, 3.0];
    let mut handle = null_mut();
    // SAFETY: live tables; `depth` is readable for its length; `handle` is a writable local.
    let status = unsafe {
        avc_cost_tables_with_draft_depth(base.0, depth.as_ptr(), depth.len(), &mut handle)
    };
    assert_eq!(status, AVC_OK, "{}", last_error());
    let deep = Tables(handle);
    assert_ne!(deep.0, base.0);
    assert_eq!(deep.depth_table(), depth);
    assert_eq!(deep.dense(), base.dense());
    assert!(base.depth_table().is_empty(), "the input gained a table");

    // A second table replaces the first, again in a new handle.
    let replaced = deep.with_drafter(AVC_DRAFTER_KIND_PARALLEL, 2);
    assert_eq!(replaced.depth_table(), [0.0, 1.0, 1.0]);
    assert_eq!(deep.depth_table(), depth);

    // The core's tables, bit for bit.
    let core = CostTables::new(vec![0.0, 1.0, 1.5], vec![2.0, 3.0, 4.0, 5.0])
        .unwrap()
        .with_draft_depth(depth.to_vec())
        .unwrap();
    assert_eq!(deep.depth_table(), core.draft_depth_ms().unwrap());
}

#[test]
fn with_drafter_gives_the_core_shapes() {
    let base = Tables::new(&[0.0, 1.0], &[2.0; 4]);
    for (kind, core_kind) in [
        (AVC_DRAFTER_KIND_AUTOREGRESSIVE, DrafterKind::Autoregressive),
        (AVC_DRAFTER_KIND_PARALLEL, DrafterKind::Parallel),
    ] {
        for max_depth in [1, 4, 7] {
            let tables = base.with_drafter(kind, max_depth);
            assert_eq!(tables.depth_table(), core_kind.depth_shape(max_depth));
        }
    }
    assert_eq!(
        base.with_drafter(AVC_DRAFTER_KIND_AUTOREGRESSIVE, 4)
            .depth_table(),
        [0.0, 0.25, 0.5, 0.75, 1.0]
    );
}

#[test]
fn rejected_tables_constructors_return_null_and_change_nothing() {
    let base = Tables::new(&[0.0, 1.0], &[2.0; 4]);
    let sentinel = base.0; // any non-NULL value: a failure must overwrite it with NULL
    let mut out = sentinel;

    // SAFETY: every call below passes arrays with their lengths (or NULL, refused before any
    // read) and a writable `out`, or NULL for `out`, which is refused before any write.
    unsafe {
        let good = [0.0, 1.0, 2.0];
        rejected(
            avc_cost_tables_with_draft_depth(base.0, good.as_ptr(), 3, null_mut()),
            AVC_ERR_NULL,
            "avc_cost_tables_with_draft_depth: tables_out: must not be NULL",
        );
        rejected(
            avc_cost_tables_with_draft_depth(null(), good.as_ptr(), 3, &mut out),
            AVC_ERR_NULL,
            "avc_cost_tables_with_draft_depth: tables: must not be NULL",
        );
        assert!(out.is_null());
        out = sentinel;
        rejected(
            avc_cost_tables_with_draft_depth(base.0, null(), 3, &mut out),
            AVC_ERR_NULL,
            "avc_cost_tables_with_draft_depth: draft_depth_ms: is NULL but its length is 3",
        );
        assert!(out.is_null());
        for (table, message) in [
            (&[][..], "draft_depth_ms: has 0 entries"),
            (&[0.0][..], "draft_depth_ms: has 1 entries"),
            (&[0.5, 1.0][..], "draft_depth_ms: [0] = 0.5 must be 0"),
            (
                &[0.0, 2.0, 1.0][..],
                "draft_depth_ms: [2] = 1 must be finite",
            ),
            (
                &[0.0, f64::NAN][..],
                "draft_depth_ms: [1] = NaN must be finite",
            ),
            (&[0.0, f64::INFINITY][..], "draft_depth_ms: [1] = inf"),
        ] {
            out = sentinel;
            rejected(
                avc_cost_tables_with_draft_depth(base.0, table.as_ptr(), table.len(), &mut out),
                AVC_ERR_VALUE,
                &format!("avc_cost_tables_with_draft_depth: {message}"),
            );
            assert!(out.is_null());
        }
        // A handle of another kind is refused by the tag check.
        let planner = Planner::new(&base, 1);
        out = sentinel;
        rejected(
            avc_cost_tables_with_draft_depth(
                planner.0.cast::<AvcCostTables>(),
                good.as_ptr(),
                3,
                &mut out,
            ),
            AVC_ERR_INVALID_HANDLE,
            "avc_cost_tables_with_draft_depth: tables: is not a live avc_cost_tables",
        );
        assert!(out.is_null());

        rejected(
            avc_cost_tables_with_drafter(base.0, AVC_DRAFTER_KIND_PARALLEL, 2, null_mut()),
            AVC_ERR_NULL,
            "avc_cost_tables_with_drafter: tables_out",
        );
        for (tables, kind, max_depth, status, message) in [
            (null(), 0, 2, AVC_ERR_NULL, "tables: must not be NULL"),
            (
                base.0.cast_const(),
                2,
                2,
                AVC_ERR_VALUE,
                "kind: must be AVC_DRAFTER_KIND_AUTOREGRESSIVE (0) or AVC_DRAFTER_KIND_PARALLEL \
                 (1), got 2",
            ),
            (base.0, -1, 2, AVC_ERR_VALUE, "kind: must be"),
            (
                base.0,
                AVC_DRAFTER_KIND_AUTOREGRESSIVE,
                0,
                AVC_ERR_VALUE,
                "max_depth: = 0 must be in 1..=4096",
            ),
            (
                base.0,
                AVC_DRAFTER_KIND_PARALLEL,
                4097,
                AVC_ERR_VALUE,
                "max_depth: = 4097 must be in 1..=4096",
            ),
            (
                base.0,
                AVC_DRAFTER_KIND_PARALLEL,
                usize::MAX,
                AVC_ERR_VALUE,
                "max_depth:",
            ),
        ] {
            out = sentinel;
            rejected(
                avc_cost_tables_with_drafter(tables, kind, max_depth, &mut out),
                status,
                &format!("avc_cost_tables_with_drafter: {message}"),
            );
            assert!(out.is_null());
        }
    }
    assert!(base.depth_table().is_empty());
}

#[test]
fn draft_depth_copies_out_or_reports_the_size() {
    let plain = Tables::new(&[0.0, 1.0], &[2.0; 4]);
    let deep = plain.with_drafter(AVC_DRAFTER_KIND_AUTOREGRESSIVE, 4);
    let mut buffer = [-1.0f64; 8];
    let mut len = 99usize;

    // SAFETY: `buffer` has 8 writable doubles and every call passes at most that capacity (or
    // NULL, refused before any write); `len` is a writable local or NULL (refused).
    unsafe {
        // No depth table: length 0, success, nothing written to the buffer.
        assert_eq!(
            avc_cost_tables_draft_depth(plain.0, buffer.as_mut_ptr(), 8, &mut len),
            AVC_OK
        );
        assert_eq!((len, buffer), (0, [-1.0; 8]));

        // Too small: the length is reported, the buffer untouched.
        for capacity in [0, 1, 4] {
            len = 99;
            rejected(
                avc_cost_tables_draft_depth(deep.0, buffer.as_mut_ptr(), capacity, &mut len),
                AVC_ERR_BUFFER_TOO_SMALL,
                &format!(
                    "avc_cost_tables_draft_depth: draft_depth_ms: capacity = {capacity}, the \
                     table has 5 entries"
                ),
            );
            assert_eq!((len, buffer), (5, [-1.0; 8]));
        }
        len = 99;
        assert_eq!(
            avc_cost_tables_draft_depth(deep.0, null_mut(), 0, &mut len),
            AVC_ERR_BUFFER_TOO_SMALL
        );
        assert_eq!(len, 5);

        // Other errors write nothing at all.
        len = 99;
        for (tables, out, capacity, len_out, status, message) in [
            (
                null(),
                buffer.as_mut_ptr(),
                8,
                &mut len as *mut usize,
                AVC_ERR_NULL,
                "tables: must not be NULL",
            ),
            (
                deep.0.cast_const(),
                buffer.as_mut_ptr(),
                8,
                null_mut(),
                AVC_ERR_NULL,
                "len_out: must not be NULL",
            ),
            (
                deep.0,
                null_mut(),
                8,
                &mut len,
                AVC_ERR_NULL,
                "draft_depth_ms: is NULL but its length is 8",
            ),
            (
                deep.0,
                buffer.as_mut_ptr().cast::<u8>().add(1).cast::<f64>(),
                4,
                &mut len,
                AVC_ERR_VALUE,
                "draft_depth_ms: pointer",
            ),
        ] {
            rejected(
                avc_cost_tables_draft_depth(tables, out, capacity, len_out),
                status,
                &format!("avc_cost_tables_draft_depth: {message}"),
            );
            assert_eq!((len, buffer), (99, [-1.0; 8]));
        }

        // A larger buffer: only the table's length is written.
        assert_eq!(
            avc_cost_tables_draft_depth(deep.0, buffer.as_mut_ptr(), 8, &mut len),
            AVC_OK
        );
        assert_eq!(len, 5);
        assert_eq!(buffer, [0.0, 0.25, 0.5, 0.75, 1.0, -1.0, -1.0, -1.0]);
    }
}

// ---- stateless depth ---------------------------------------------------------------------

#[test]
fn choose_draft_depth_gives_the_cores_bits() {
    let rows = 12;
    let draft: Vec<f64> = (0..=rows).map(|r| 0.15 * r as f64).collect();
    let verify: Vec<f64> = (0..=rows * (K + 1))
        .map(|t| 6.0 + (t.saturating_sub(16) as f64) * 0.3)
        .collect();
    let base = Tables::new(&draft, &verify);
    let mut seen = std::collections::BTreeSet::new();
    for (kind, core_kind) in [
        (AVC_DRAFTER_KIND_AUTOREGRESSIVE, DrafterKind::Autoregressive),
        (AVC_DRAFTER_KIND_PARALLEL, DrafterKind::Parallel),
    ] {
        let tables = base.with_drafter(kind, K);
        let core = CostTables::new(draft.clone(), verify.clone())
            .unwrap()
            .with_drafter(core_kind, K)
            .unwrap();
        for seed in 0..30u64 {
            let (confidences, caps) = batch(seed, rows);
            let mut step = step(rows);
            if seed % 3 == 0 {
                step.max_draft_budget = (seed % 7) as usize;
            }
            for (mode, core_mode) in MODES {
                let mut want_depths = vec![0i32; rows];
                let view = MatrixView::new("confidences", &confidences, rows, K).unwrap();
                let want = planner::choose_draft_depth(
                    view,
                    &caps,
                    &StepTokens::from(&step),
                    &core,
                    core_mode,
                    &mut want_depths,
                )
                .unwrap();
                let mut depths = vec![-1i32; rows];
                let mut plan = UNTOUCHED;
                let status = choose(
                    &confidences,
                    rows,
                    K,
                    &caps,
                    &step,
                    &tables,
                    mode,
                    &mut depths,
                    &mut plan,
                );
                assert_eq!(status, AVC_OK, "{}", last_error());
                assert_eq!(depths, want_depths);
                assert_same_plan(&plan, &want);
                seen.insert((kind, mode, plan.max_depth));
                assert_eq!(
                    plan.drafts,
                    depths.iter().map(|&d| d as usize).sum::<usize>()
                );
            }
        }
    }
    // Every (kind, mode) pair saw more than one depth, so the comparison is not vacuous.
    for kind in [AVC_DRAFTER_KIND_AUTOREGRESSIVE, AVC_DRAFTER_KIND_PARALLEL] {
        for (mode, _) in MODES {
            let depths = seen.iter().filter(|s| (s.0, s.1) == (kind, mode)).count();
            assert!(depths >= 2, "{seen:?}");
        }
    }
}

#[test]
fn hopeless_drafts_are_not_drafted_and_confident_free_ones_are_drafted_fully() {
    let rows = 2;
    let flat_verify = [10.0; 13];
    let step = step(rows);
    let caps = [K as i64; 2];
    for (mode, _) in MODES {
        // Drafting 3 positions costs 100 ms; the drafts are hopeless. Depth 0 (no drafter)
        // gives s / verify_ms[T] = 2 / 10 = 0.2; any depth d pays 100 d / 3 ms more for at most
        // 0.06 more tokens.
        let expensive = Tables::new(&[0.0, 100.0, 100.0, 100.0], &flat_verify)
            .with_drafter(AVC_DRAFTER_KIND_AUTOREGRESSIVE, K);
        let hopeless = [0.01f32; 6];
        let mut depths = [-1i32; 2];
        let mut plan = UNTOUCHED;
        let status = choose(
            &hopeless,
            rows,
            K,
            &caps,
            &step,
            &expensive,
            mode,
            &mut depths,
            &mut plan,
        );
        assert_eq!(status, AVC_OK, "{}", last_error());
        assert_eq!(depths, [0, 0]);
        assert_eq!(
            plan,
            AvcDepthPlan {
                max_depth: 0,
                drafts: 0,
                budget: 0,
                expected_accepted_tokens: 2.0,
                predicted_cost_ms: 10.0,
            }
        );

        // Free drafting, confident drafts, flat verification: every position is worth it.
        let free =
            Tables::new(&[0.0; 4], &flat_verify).with_drafter(AVC_DRAFTER_KIND_AUTOREGRESSIVE, K);
        let confident = [0.9f32; 6];
        let status = choose(
            &confident,
            rows,
            K,
            &caps,
            &step,
            &free,
            mode,
            &mut depths,
            &mut plan,
        );
        assert_eq!(status, AVC_OK, "{}", last_error());
        assert_eq!(depths, [3, 3]);
        assert_eq!((plan.max_depth, plan.drafts, plan.budget), (3, 6, 6));
        let p = f64::from(0.9f32);
        let expected = 2.0 + 2.0 * (p + p * p + p * p * p);
        assert!(
            (plan.expected_accepted_tokens - expected).abs() < 1e-12,
            "{}",
            plan.expected_accepted_tokens
        );
        assert_eq!(plan.predicted_cost_ms, 10.0);
    }
}

/// The arguments of one `avc_choose_draft_depth` call, as raw pointers.
#[derive(Clone, Copy)]
struct Call {
    confidences: *const f32,
    rows: usize,
    cols: usize,
    caps: *const i64,
    caps_len: usize,
    step: *const AvcStepTokens,
    tables: *const AvcCostTables,
    mode: AvcDepthMode,
    depths: *mut i32,
    depths_len: usize,
    plan: *mut AvcDepthPlan,
}

impl Call {
    /// # Safety
    ///
    /// Every pointer must be valid for its length, or be one the entry point refuses before
    /// using it.
    unsafe fn run(self) -> AvcStatus {
        // SAFETY: forwarded contract.
        unsafe {
            avc_choose_draft_depth(
                self.confidences,
                self.rows,
                self.cols,
                self.caps,
                self.caps_len,
                self.step,
                self.tables,
                self.mode,
                self.depths,
                self.depths_len,
                self.plan,
            )
        }
    }
}

#[test]
fn rejected_choose_draft_depth_writes_nothing() {
    let rows = 2;
    let verify = [10.0; 13];
    let plain = Tables::new(&[0.0, 1.0, 1.0, 1.0], &verify);
    let tables = plain.with_drafter(AVC_DRAFTER_KIND_AUTOREGRESSIVE, K);
    let shallow = plain.with_drafter(AVC_DRAFTER_KIND_PARALLEL, K - 1);
    let confidences = [0.9f32, 0.8, 0.5, 0.7, 0.2, 0.1];
    let mut nan = confidences;
    nan[4] = f32::NAN;
    let mut above = confidences;
    above[1] = 1.5;
    let caps = [3i64, 2];
    let too_deep = [4i64, 0];
    let negative = [0i64, -1];
    let good = step(rows);
    let too_many_samplers = AvcStepTokens {
        num_sampling_requests: 3,
        ..good
    };
    let too_many_tokens = AvcStepTokens {
        num_non_draft_tokens: 8,
        ..good
    };
    let planner = Planner::new(&tables, 1);
    // Room for the depths and for two i64 caps viewed as four i32 depths (the overlap case).
    let mut depths = [-5i32; 2];
    let mut caps_buffer = [3i64, 2];
    let mut plan = UNTOUCHED;
    let valid = Call {
        confidences: confidences.as_ptr(),
        rows,
        cols: K,
        caps: caps.as_ptr(),
        caps_len: 2,
        step: &good,
        tables: tables.0,
        mode: AVC_DEPTH_MODE_BATCH,
        depths: depths.as_mut_ptr(),
        depths_len: 2,
        plan: &mut plan,
    };
    let overlapping = Call {
        caps: caps_buffer.as_ptr(),
        depths: caps_buffer.as_mut_ptr().cast::<i32>(),
        ..valid
    };
    let cases = [
        (
            Call {
                confidences: null(),
                ..valid
            },
            AVC_ERR_NULL,
            "confidences: is NULL but its length is 6",
        ),
        (
            Call {
                caps: null(),
                ..valid
            },
            AVC_ERR_NULL,
            "max_depths: is NULL but its length is 2",
        ),
        (
            Call {
                step: null(),
                ..valid
            },
            AVC_ERR_NULL,
            "step: must not be NULL",
        ),
        (
            Call {
                tables: null(),
                ..valid
            },
            AVC_ERR_NULL,
            "tables: must not be NULL",
        ),
        (
            Call {
                depths: null_mut(),
                ..valid
            },
            AVC_ERR_NULL,
            "depths: is NULL but its length is 2",
        ),
        (
            Call {
                plan: null_mut(),
                ..valid
            },
            AVC_ERR_NULL,
            "plan_out: must not be NULL",
        ),
        (
            Call {
                tables: planner.0.cast::<AvcCostTables>(),
                ..valid
            },
            AVC_ERR_INVALID_HANDLE,
            "tables: is not a live avc_cost_tables",
        ),
        (
            Call { mode: 2, ..valid },
            AVC_ERR_VALUE,
            "mode: must be AVC_DEPTH_MODE_BATCH (0) or AVC_DEPTH_MODE_PER_REQUEST (1), got 2",
        ),
        (
            Call { mode: -1, ..valid },
            AVC_ERR_VALUE,
            "mode: must be AVC_DEPTH_MODE_BATCH (0) or AVC_DEPTH_MODE_PER_REQUEST (1), got -1",
        ),
        (
            Call {
                tables: plain.0,
                ..valid
            },
            AVC_ERR_VALUE,
            "tables: have no draft-depth table; add one with avc_cost_tables_with_draft_depth \
             or avc_cost_tables_with_drafter",
        ),
        (
            Call {
                tables: shallow.0,
                ..valid
            },
            AVC_ERR_VALUE,
            "tables: draft-depth table covers depths 0..=2 but the confidences have 3 positions",
        ),
        (
            Call {
                caps_len: 1,
                ..valid
            },
            AVC_ERR_VALUE,
            "max_depths: has length 1",
        ),
        (
            Call {
                caps: too_deep.as_ptr(),
                ..valid
            },
            AVC_ERR_VALUE,
            "max_depths:",
        ),
        (
            Call {
                caps: negative.as_ptr(),
                ..valid
            },
            AVC_ERR_VALUE,
            "max_depths:",
        ),
        (
            Call {
                depths_len: 1,
                ..valid
            },
            AVC_ERR_VALUE,
            "depths: has length 1 but there are 2 requests",
        ),
        (
            Call {
                confidences: nan.as_ptr(),
                ..valid
            },
            AVC_ERR_VALUE,
            "confidences: [1, 1] = NaN",
        ),
        (
            Call {
                confidences: above.as_ptr(),
                ..valid
            },
            AVC_ERR_VALUE,
            "confidences: [0, 1] = 1.5",
        ),
        (
            Call {
                step: &too_many_samplers,
                ..valid
            },
            AVC_ERR_VALUE,
            "num_sampling_requests: = 3 exceeds",
        ),
        (
            Call {
                step: &too_many_tokens,
                ..valid
            },
            AVC_ERR_VALUE,
            "num_non_draft_tokens: 8 plus the largest budget 5",
        ),
        (
            overlapping,
            AVC_ERR_VALUE,
            "depths: overlaps max_depths; outputs must not share memory with inputs",
        ),
    ];
    for (call, status, message) in cases {
        // SAFETY: every pointer is valid for its length, or NULL (refused before use).
        let got = unsafe { call.run() };
        rejected(got, status, &format!("avc_choose_draft_depth: {message}"));
        assert_eq!(depths, [-5, -5], "{message}");
        assert_eq!(caps_buffer, [3, 2], "{message}");
        assert_eq!(plan, UNTOUCHED, "{message}");
    }
    // The same arguments, corrected, succeed.
    // SAFETY: every pointer is valid for its length.
    assert_eq!(unsafe { valid.run() }, AVC_OK, "{}", last_error());
    assert!(depths
        .iter()
        .zip(caps)
        .all(|(&d, c)| (0..=c).contains(&i64::from(d))));
    assert_ne!(plan, UNTOUCHED);
}

// ---- stateful depth ----------------------------------------------------------------------

#[test]
fn the_planner_decides_like_the_core_planner_and_changes_nothing() {
    let num_slots = 8;
    let rows = 5;
    let draft: Vec<f64> = (0..=num_slots).map(|r| 1.5 + 0.3 * r as f64).collect();
    let verify: Vec<f64> = (0..=num_slots * (K + 1))
        .map(|t| 8.0 + (t.saturating_sub(10) as f64) * 0.4)
        .collect();
    let tables = Tables::new(&draft, &verify).with_drafter(AVC_DRAFTER_KIND_AUTOREGRESSIVE, K);
    let core_tables = CostTables::new(draft, verify)
        .unwrap()
        .with_drafter(DrafterKind::Autoregressive, K)
        .unwrap();
    // The core planner and `asked` decide depths every step; `plain` only plans. All three
    // must plan alike: asking for depths changes no state.
    let mut core =
        VerificationPlanner::new(core_tables, num_slots, K, BudgetSource::Previous).unwrap();
    let asked = Planner::new(&tables, num_slots);
    let plain = Planner::new(&tables, num_slots);
    let step = step(rows);
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..40u64 {
        let slots: Vec<i64> = (0..rows as i64)
            .map(|r| (r * 3 + seed as i64) % num_slots as i64)
            .collect();
        let (confidences, caps) = batch(seed, rows);
        for (mode, core_mode) in MODES {
            let mut want = vec![0i32; rows];
            let want_plan = core
                .choose_draft_depth(
                    &slots,
                    &caps,
                    &StepTokens::from(&step),
                    core_mode,
                    &mut want,
                )
                .unwrap();
            let (depths, plan) = asked.decide(&slots, &caps, &step, mode);
            assert_eq!(depths, want);
            assert_same_plan(&plan, &want_plan);
        }
        // Draft what was decided (batch mode) and plan the step with these confidences.
        let (depths, plan) = asked.decide(&slots, &caps, &step, AVC_DEPTH_MODE_BATCH);
        seen.insert(plan.max_depth);
        let scheduled: Vec<i64> = depths.iter().map(|&d| i64::from(d)).collect();
        let view = MatrixView::new("confidences", &confidences, rows, K).unwrap();
        core.plan(
            &slots,
            view,
            &scheduled,
            &StepTokens::from(&step),
            &mut vec![0; rows],
        )
        .unwrap();
        asked.plan(&slots, &confidences, &scheduled, &step);
        plain.plan(&slots, &confidences, &scheduled, &step);
        for slot in 0..num_slots {
            assert_eq!(asked.remembered(slot), plain.remembered(slot));
            assert_eq!(
                asked.remembered(slot),
                core.previous_confidences(slot).unwrap()
            );
        }
    }
    // The decisions were not all alike (the check above would then be weak).
    assert!(seen.len() >= 3, "batch depths seen: {seen:?}");
}

#[test]
fn the_planner_drafts_fresh_slots_and_stops_after_poor_drafts() {
    // The core's example: drafting 3 positions costs 6 ms, verifying a flat 10 ms.
    let tables = Tables::new(&[0.0, 6.0, 6.0, 6.0], &[10.0; 13])
        .with_drafter(AVC_DRAFTER_KIND_AUTOREGRESSIVE, K);
    let planner = Planner::new(&tables, 4);
    let slots = [0i64, 1];
    let caps = [3i64, 3];
    let step = step(2);
    // Fresh slots remember 1.0: depth 3 gives (2 + 6) / (6 + 10) = 0.5, the best.
    for (mode, _) in MODES {
        let (depths, plan) = planner.decide(&slots, &caps, &step, mode);
        assert_eq!(depths, [3, 3]);
        assert_eq!(
            plan,
            AvcDepthPlan {
                max_depth: 3,
                drafts: 6,
                budget: 6,
                expected_accepted_tokens: 8.0,
                predicted_cost_ms: 16.0,
            }
        );
    }
    // After poor drafts (0.01) no depth beats running without the drafter (2 / 10).
    planner.plan(&slots, &[0.01; 6], &[3, 3], &step);
    for (mode, _) in MODES {
        let (depths, plan) = planner.decide(&slots, &caps, &step, mode);
        assert_eq!(depths, [0, 0]);
        assert_eq!((plan.max_depth, plan.drafts, plan.budget), (0, 0, 0));
        assert_eq!(plan.predicted_cost_ms, 10.0);
    }
}

#[test]
fn rejected_planner_depth_writes_nothing_and_changes_nothing() {
    let plain_tables = Tables::new(&[0.0, 1.0, 1.0, 1.0, 1.0], &[10.0; 17]);
    let tables = plain_tables.with_drafter(AVC_DRAFTER_KIND_PARALLEL, K);
    let planner = Planner::new(&tables, 4);
    let without = Planner::new(&plain_tables, 4);
    let step = step(2);
    planner.plan(&[0, 2], &[0.9, 0.5, 0.1, 0.3, 0.2, 0.1], &[3, 3], &step);
    let before: Vec<Vec<f64>> = (0..4).map(|slot| planner.remembered(slot)).collect();
    let slots = [0i64, 2];
    let caps = [3i64, 3];
    let mut depths = [-5i32; 2];
    let mut plan = UNTOUCHED;
    let f = "avc_planner_choose_draft_depth: ";

    let check = |status: AvcStatus,
                 expected: AvcStatus,
                 message: &str,
                 depths: &[i32; 2],
                 plan: &AvcDepthPlan| {
        rejected(status, expected, &format!("{f}{message}"));
        assert_eq!(depths, &[-5, -5], "{message}");
        assert_eq!(plan, &UNTOUCHED, "{message}");
    };
    for (slots, caps, mode, expected, message) in [
        (
            &[1i64, 1][..],
            &caps[..],
            AVC_DEPTH_MODE_BATCH,
            AVC_ERR_VALUE,
            "slots: [1] = 1 appears twice",
        ),
        (
            &[0, 4],
            &caps,
            AVC_DEPTH_MODE_PER_REQUEST,
            AVC_ERR_VALUE,
            "slots: [1] = 4 is outside 0..4",
        ),
        (
            &[-1, 0],
            &caps,
            AVC_DEPTH_MODE_BATCH,
            AVC_ERR_VALUE,
            "slots: [0] = -1 is outside 0..4",
        ),
        (
            &slots,
            &caps[..1],
            AVC_DEPTH_MODE_BATCH,
            AVC_ERR_VALUE,
            "max_depths: has length 1 but slots has 2",
        ),
        (
            &slots,
            &[4, 0],
            AVC_DEPTH_MODE_BATCH,
            AVC_ERR_VALUE,
            "max_depths:",
        ),
        (&slots, &caps, 7, AVC_ERR_VALUE, "mode: must be"),
    ] {
        let status = planner.depth(slots, caps, &step, mode, &mut depths, &mut plan);
        check(status, expected, message, &depths, &plan);
    }
    let status = planner.depth(
        &slots,
        &caps,
        &step,
        AVC_DEPTH_MODE_BATCH,
        &mut depths[..1],
        &mut plan,
    );
    check(
        status,
        AVC_ERR_VALUE,
        "depths: has length 1 but there are 2 requests",
        &depths,
        &plan,
    );
    let status = without.depth(
        &slots,
        &caps,
        &step,
        AVC_DEPTH_MODE_BATCH,
        &mut depths,
        &mut plan,
    );
    check(
        status,
        AVC_ERR_VALUE,
        "planner: its cost tables have no draft-depth table; add one with \
         avc_cost_tables_with_draft_depth or avc_cost_tables_with_drafter",
        &depths,
        &plan,
    );
    let too_many = AvcStepTokens {
        num_non_draft_tokens: 12,
        ..step
    };
    let status = planner.depth(
        &slots,
        &caps,
        &too_many,
        AVC_DEPTH_MODE_BATCH,
        &mut depths,
        &mut plan,
    );
    check(
        status,
        AVC_ERR_VALUE,
        "num_non_draft_tokens:",
        &depths,
        &plan,
    );

    // SAFETY: each call passes valid arrays with their lengths, except the one NULL argument
    // under test (refused before use); `slots_buffer` viewed as i32 stays inside its bytes.
    unsafe {
        let status = avc_planner_choose_draft_depth(
            null(),
            slots.as_ptr(),
            2,
            caps.as_ptr(),
            2,
            &step,
            AVC_DEPTH_MODE_BATCH,
            depths.as_mut_ptr(),
            2,
            &mut plan,
        );
        check(
            status,
            AVC_ERR_NULL,
            "planner: must not be NULL",
            &depths,
            &plan,
        );
        let status = avc_planner_choose_draft_depth(
            tables.0.cast::<AvcPlanner>(),
            slots.as_ptr(),
            2,
            caps.as_ptr(),
            2,
            &step,
            AVC_DEPTH_MODE_BATCH,
            depths.as_mut_ptr(),
            2,
            &mut plan,
        );
        check(
            status,
            AVC_ERR_INVALID_HANDLE,
            "planner: is not a live avc_planner",
            &depths,
            &plan,
        );
        let status = avc_planner_choose_draft_depth(
            planner.0,
            null(),
            2,
            caps.as_ptr(),
            2,
            &step,
            AVC_DEPTH_MODE_BATCH,
            depths.as_mut_ptr(),
            2,
            &mut plan,
        );
        check(status, AVC_ERR_NULL, "slots: is NULL", &depths, &plan);
        let status = avc_planner_choose_draft_depth(
            planner.0,
            slots.as_ptr(),
            2,
            null(),
            2,
            &step,
            AVC_DEPTH_MODE_BATCH,
            depths.as_mut_ptr(),
            2,
            &mut plan,
        );
        check(status, AVC_ERR_NULL, "max_depths: is NULL", &depths, &plan);
        let status = avc_planner_choose_draft_depth(
            planner.0,
            slots.as_ptr(),
            2,
            caps.as_ptr(),
            2,
            null(),
            AVC_DEPTH_MODE_BATCH,
            depths.as_mut_ptr(),
            2,
            &mut plan,
        );
        check(
            status,
            AVC_ERR_NULL,
            "step: must not be NULL",
            &depths,
            &plan,
        );
        let status = avc_planner_choose_draft_depth(
            planner.0,
            slots.as_ptr(),
            2,
            caps.as_ptr(),
            2,
            &step,
            AVC_DEPTH_MODE_BATCH,
            null_mut(),
            2,
            &mut plan,
        );
        check(status, AVC_ERR_NULL, "depths: is NULL", &depths, &plan);
        let status = avc_planner_choose_draft_depth(
            planner.0,
            slots.as_ptr(),
            2,
            caps.as_ptr(),
            2,
            &step,
            AVC_DEPTH_MODE_BATCH,
            depths.as_mut_ptr(),
            2,
            null_mut(),
        );
        check(
            status,
            AVC_ERR_NULL,
            "plan_out: must not be NULL",
            &depths,
            &plan,
        );
        let mut slots_buffer = [0i64, 2];
        let status = avc_planner_choose_draft_depth(
            planner.0,
            slots_buffer.as_ptr(),
            2,
            caps.as_ptr(),
            2,
            &step,
            AVC_DEPTH_MODE_BATCH,
            slots_buffer.as_mut_ptr().cast::<i32>(),
            2,
            &mut plan,
        );
        check(
            status,
            AVC_ERR_VALUE,
            "depths: overlaps slots",
            &depths,
            &plan,
        );
        assert_eq!(slots_buffer, [0, 2]);
    }
    // Nothing the planner remembers changed, and a corrected call succeeds.
    let after: Vec<Vec<f64>> = (0..4).map(|slot| planner.remembered(slot)).collect();
    assert_eq!(after, before);
    let (_, plan) = planner.decide(&slots, &caps, &step, AVC_DEPTH_MODE_BATCH);
    assert_ne!(plan, UNTOUCHED);
}

#[test]
fn exploration_can_be_set_and_widens_the_planners_depths() {
    let tables = Tables::new(&[0.0, 6.0, 6.0, 6.0], &[10.0; 13])
        .with_drafter(AVC_DRAFTER_KIND_AUTOREGRESSIVE, K);
    let planner = Planner::new(&tables, 4);
    let (slots, caps, step) = ([0i64, 1], [3i64, 3], step(2));
    planner.plan(&slots, &[0.01; 6], &[3, 3], &step);
    // Every request explores, and every step is an exploration step: whole blocks.
    // SAFETY: live planner.
    assert_eq!(
        unsafe { avc_planner_set_exploration(planner.0, 1.0, 3) },
        AVC_OK
    );
    let (depths, _) = planner.decide(&slots, &caps, &step, AVC_DEPTH_MODE_BATCH);
    assert_eq!(depths, [3, 3]);
    // Rejected probabilities name the C argument and change nothing.
    for bad in [1.5, -0.1, f64::NAN] {
        // SAFETY: live planner.
        let status = unsafe { avc_planner_set_exploration(planner.0, bad, 0) };
        rejected(
            status,
            AVC_ERR_VALUE,
            "avc_planner_set_exploration: probability: ",
        );
    }
    // SAFETY: NULL is refused before use.
    let status = unsafe { avc_planner_set_exploration(null_mut(), 0.0, 0) };
    rejected(status, AVC_ERR_NULL, "avc_planner_set_exploration: planner");
    let (depths, _) = planner.decide(&slots, &caps, &step, AVC_DEPTH_MODE_BATCH);
    assert_eq!(depths, [3, 3]);
    // Off: the poor drafts are not drafted at all.
    // SAFETY: live planner.
    assert_eq!(
        unsafe { avc_planner_set_exploration(planner.0, 0.0, 0) },
        AVC_OK
    );
    let (depths, _) = planner.decide(&slots, &caps, &step, AVC_DEPTH_MODE_BATCH);
    assert_eq!(depths, [0, 0]);
}

#[test]
fn remember_stores_what_plan_stores_and_rejects_without_change() {
    let tables = Tables::new(&[0.0, 2.0, 2.0, 2.0], &[10.0; 13])
        .with_drafter(AVC_DRAFTER_KIND_AUTOREGRESSIVE, K);
    let core_tables = CostTables::new(vec![0.0, 2.0, 2.0, 2.0], vec![10.0; 13])
        .unwrap()
        .with_drafter(DrafterKind::Autoregressive, K)
        .unwrap();
    let mut core = VerificationPlanner::new(core_tables, 4, K, BudgetSource::Previous).unwrap();
    let remembering = Planner::new(&tables, 4);
    let planning = Planner::new(&tables, 4);
    let slots = [2i64, 0];
    let confidences = [0.9f32, 0.5, f32::NAN, 0.2, 0.3, 0.4];
    // Slot 2 drafted two positions (the NaN past them is never read); slot 0 drafted three.
    let scheduled = [2i64, 3];
    assert_eq!(
        remembering.remember(&slots, &confidences, (2, K), &scheduled),
        AVC_OK,
        "{}",
        last_error()
    );
    let no_nan: Vec<f32> = confidences
        .iter()
        .map(|&p| if p.is_nan() { 0.7 } else { p })
        .collect();
    planning.plan(&slots, &no_nan, &scheduled, &step(2));
    let view = MatrixView::new("confidences", &confidences[..], 2, K).unwrap();
    core.remember(&slots, view, &scheduled).unwrap();
    for slot in 0..4 {
        assert_eq!(remembering.remembered(slot), planning.remembered(slot));
        assert_eq!(
            remembering.remembered(slot),
            core.previous_confidences(slot).unwrap()
        );
    }
    assert_eq!(remembering.remembered(2), [f64::from(0.9f32), 0.5, 1.0]);
    // The depth decision reads what was remembered, like the core planner's.
    let caps = [3i64, 3];
    let (depths, plan) = remembering.decide(&slots, &caps, &step(2), AVC_DEPTH_MODE_PER_REQUEST);
    let mut want = [0i32; 2];
    let want_plan = core
        .choose_draft_depth(
            &slots,
            &caps,
            &StepTokens::from(&step(2)),
            DepthMode::PerRequest,
            &mut want,
        )
        .unwrap();
    assert_eq!(depths, want);
    assert_same_plan(&plan, &want_plan);

    // Rejected calls name the C argument and remember nothing.
    let before: Vec<Vec<f64>> = (0..4).map(|slot| remembering.remembered(slot)).collect();
    // (slots, confidences, scheduled_drafts, status, argument named)
    type Case<'a> = (&'a [i64], &'a [f32], &'a [i64], AvcStatus, &'a str);
    let cases: [Case<'_>; 5] = [
        (&[2, 2], &confidences, &scheduled, AVC_ERR_VALUE, "slots"),
        (&[2, 9], &confidences, &scheduled, AVC_ERR_VALUE, "slot"),
        (
            &slots,
            &confidences,
            &[2, 4],
            AVC_ERR_VALUE,
            "scheduled_drafts",
        ),
        (
            &slots,
            &[0.5, 1.5, 0.5, 0.5, 0.5, 0.5],
            &scheduled,
            AVC_ERR_VALUE,
            "confidences",
        ),
        (
            &slots,
            &confidences,
            &[2],
            AVC_ERR_VALUE,
            "scheduled_drafts",
        ),
    ];
    for (bad_slots, bad_confidences, bad_scheduled, status, argument) in cases {
        let got = remembering.remember(bad_slots, bad_confidences, (2, K), bad_scheduled);
        rejected(got, status, &format!("avc_planner_remember: {argument}"));
    }
    // The planner's K is 3, not 2.
    let got = remembering.remember(&slots, &confidences, (3, 2), &scheduled);
    rejected(got, AVC_ERR_VALUE, "avc_planner_remember: confidences");
    // SAFETY: NULL is refused before use.
    let got = unsafe {
        avc_planner_remember(
            null_mut(),
            slots.as_ptr(),
            2,
            confidences.as_ptr(),
            2,
            K,
            scheduled.as_ptr(),
            2,
        )
    };
    rejected(got, AVC_ERR_NULL, "avc_planner_remember: planner");
    // SAFETY: a NULL array with a nonzero length is refused before use.
    let got = unsafe {
        avc_planner_remember(
            remembering.0,
            null(),
            2,
            confidences.as_ptr(),
            2,
            K,
            scheduled.as_ptr(),
            2,
        )
    };
    rejected(got, AVC_ERR_NULL, "avc_planner_remember: slots");
    for (slot, remembered) in before.iter().enumerate() {
        assert_eq!(&remembering.remembered(slot), remembered);
    }
}

/// `avc_planner_coming_explorers` into fresh buffers (`explorers` pre-filled, so a rejected
/// call that wrote anything shows).
fn coming(planner: *const AvcPlanner, slots: &[i64]) -> (AvcStatus, bool, Vec<bool>) {
    let mut explorers = vec![true; slots.len()];
    let mut whole = true;
    // SAFETY: `planner` is live or NULL; every array is passed with its own length.
    let status = unsafe {
        avc_planner_coming_explorers(
            planner,
            slots.as_ptr(),
            slots.len(),
            explorers.as_mut_ptr(),
            explorers.len(),
            &mut whole,
        )
    };
    (status, whole, explorers)
}

#[test]
fn count_step_and_coming_explorers_follow_the_core() {
    let tables = Tables::new(&[0.0; 17], &[10.0; 16 * 4 + 17])
        .with_drafter(AVC_DRAFTER_KIND_AUTOREGRESSIVE, K);
    let core_tables = CostTables::new(vec![0.0; 17], vec![10.0; 16 * 4 + 17])
        .unwrap()
        .with_drafter(DrafterKind::Autoregressive, K)
        .unwrap();
    let mut core = VerificationPlanner::new(core_tables, 16, K, BudgetSource::Previous).unwrap();
    core.set_exploration(av_core::planner::Exploration::new("p", 0.3, 5).unwrap());
    let planner = Planner::new(&tables, 16);
    // SAFETY: live planner.
    assert_eq!(
        unsafe { avc_planner_set_exploration(planner.0, 0.3, 5) },
        AVC_OK
    );
    let slots: Vec<i64> = (0..16).collect();
    let mut seen = Vec::new();
    for _ in 0..40 {
        let (status, whole, explorers) = coming(planner.0, &slots);
        assert_eq!(status, AVC_OK, "{}", last_error());
        let mut want = vec![false; 16];
        assert_eq!(whole, core.coming_explorers(&slots, &mut want).unwrap());
        assert_eq!(explorers, want);
        seen.push(explorers);
        // SAFETY: live planner.
        assert_eq!(unsafe { avc_planner_count_step(planner.0) }, AVC_OK);
        core.count_step();
    }
    // Each counted step draws anew (30% of 16 requests: equal draws in a row are rare).
    assert!(seen.windows(2).filter(|w| w[0] == w[1]).count() < 4);
    // Rejected calls name the argument and write nothing.
    for (slots, argument) in [(&[0i64, 16][..], "slots"), (&[-1][..], "slots")] {
        let (status, whole, explorers) = coming(planner.0, slots);
        rejected(
            status,
            AVC_ERR_VALUE,
            &format!("avc_planner_coming_explorers: {argument}"),
        );
        assert!(whole && explorers.iter().all(|&e| e));
    }
    let (status, ..) = coming(null(), &slots);
    rejected(
        status,
        AVC_ERR_NULL,
        "avc_planner_coming_explorers: planner",
    );
    let mut short = [true; 2];
    // SAFETY: live planner; `short` has 2 writable bools, fewer than the 3 slots.
    let status = unsafe {
        avc_planner_coming_explorers(
            planner.0,
            slots.as_ptr(),
            3,
            short.as_mut_ptr(),
            2,
            null_mut(),
        )
    };
    rejected(
        status,
        AVC_ERR_NULL,
        "avc_planner_coming_explorers: exploration_step_out",
    );
    let mut whole = true;
    // SAFETY: as above, with a writable flag.
    let status = unsafe {
        avc_planner_coming_explorers(
            planner.0,
            slots.as_ptr(),
            3,
            short.as_mut_ptr(),
            2,
            &mut whole,
        )
    };
    rejected(
        status,
        AVC_ERR_VALUE,
        "avc_planner_coming_explorers: explorers",
    );
    assert!(whole && short == [true, true]);
    // SAFETY: NULL is refused before use.
    let status = unsafe { avc_planner_count_step(null_mut()) };
    rejected(status, AVC_ERR_NULL, "avc_planner_count_step: planner");
    // The rejected calls counted nothing: the draws still follow the core's.
    let (_, whole, explorers) = coming(planner.0, &slots);
    let mut want = vec![false; 16];
    assert_eq!(whole, core.coming_explorers(&slots, &mut want).unwrap());
    assert_eq!(explorers, want);
}
