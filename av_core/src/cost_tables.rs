//! Step-cost tables: what one decode step costs, as a function of its shape.
//!
//! The planner weighs expected accepted tokens against time, so it needs two prices:
//! `draft_ms[R]`, the drafter's cost for a batch of `R` requests, and `verify_ms[T]`, the
//! target's cost for a forward pass over `T` tokens. Both come from profiling a handful of
//! sizes; [`CostTables::from_curves`] turns those samples into dense tables exactly as vLLM
//! 0.33.0 does (`build_cost_tables_from_curves`), so that budgets agree with vLLM's.
//!
//! A third, optional table prices drafting by depth, for the drafting-depth decision
//! ([`crate::planner::choose_draft_depth`]): `draft_depth_ms[d]` is the drafter's cost when it
//! drafts `d` positions (`0..=K`, `draft_depth_ms[0] = 0`: depth 0 means the drafter does not
//! run). The model is separable: a step of `R` requests drafting to depth `d` costs
//! `draft_ms[R] · draft_depth_ms[d] / draft_depth_ms[K]`, so `draft_ms[R]` keeps its meaning
//! (the full-depth cost, as vLLM profiles it) and the depth table supplies the shape —
//! proportional to `d` for an autoregressive drafter (one pass per position), a step from 0 to
//! the full cost for a block drafter (one pass whatever the depth).

use crate::error::{ensure_finite, Error, Result};

/// Floor of every draft-table entry (ms): drafting is never cheaper than free.
///
/// # Example
///
/// ```rust
/// use av_core::cost_tables::{CostTables, DRAFT_COST_FLOOR_MS};
///
/// // A noisy profile that went below zero after subtracting a baseline.
/// let tables = CostTables::from_curves(&[(1.0, -0.1)], &[(1.0, 5.0)], 2, 4, 0)?;
/// assert_eq!(tables.draft_ms(), [DRAFT_COST_FLOOR_MS; 3]);
/// # Ok::<(), av_core::Error>(())
/// ```
pub const DRAFT_COST_FLOOR_MS: f64 = 0.0;

/// Floor of every verify-table entry (ms): keeps the planner's cost denominator positive
/// (vLLM's value).
///
/// # Example
///
/// ```rust
/// use av_core::cost_tables::{CostTables, VERIFY_COST_FLOOR_MS};
///
/// let tables = CostTables::from_curves(&[(1.0, 0.4)], &[(1.0, 0.0)], 2, 4, 0)?;
/// assert!(tables.verify_ms().iter().all(|&ms| ms == VERIFY_COST_FLOOR_MS));
/// # Ok::<(), av_core::Error>(())
/// ```
pub const VERIFY_COST_FLOOR_MS: f64 = 1e-6;

/// Largest table length accepted (entries), so a typo cannot allocate gigabytes.
///
/// # Example
///
/// ```rust
/// use av_core::cost_tables::{CostTables, MAX_TABLE_LEN};
///
/// let curve = [(1.0, 1.0)];
/// let err = CostTables::from_curves(&curve, &curve, 8, MAX_TABLE_LEN, 0).unwrap_err();
/// assert_eq!(err.argument, "max_batch_tokens");
/// ```
pub const MAX_TABLE_LEN: usize = 1 << 24;

/// Largest drafting depth a draft-depth table may cover.
pub const MAX_DRAFT_DEPTH: usize = 1 << 12;

/// How a drafter's cost grows with the number of positions it drafts: the two shapes of
/// [`CostTables::with_drafter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrafterKind {
    /// One drafter pass per position (draft models, EAGLE, MTP): cost proportional to depth.
    Autoregressive,
    /// One pass drafts the whole block (parallel/block drafters): full cost at any depth ≥ 1.
    Parallel,
}

impl DrafterKind {
    /// The depth-cost shape for drafting up to `max_depth` positions, `[0, .., 1]`-normalized:
    /// `d / K` (autoregressive) or `1` for every `d ≥ 1` (parallel).
    ///
    /// ```rust
    /// use av_core::cost_tables::DrafterKind;
    ///
    /// assert_eq!(DrafterKind::Autoregressive.depth_shape(4), [0.0, 0.25, 0.5, 0.75, 1.0]);
    /// assert_eq!(DrafterKind::Parallel.depth_shape(3), [0.0, 1.0, 1.0, 1.0]);
    /// ```
    pub fn depth_shape(self, max_depth: usize) -> Vec<f64> {
        (0..=max_depth)
            .map(|d| match self {
                _ if d == 0 => 0.0,
                DrafterKind::Autoregressive => d as f64 / max_depth as f64,
                DrafterKind::Parallel => 1.0,
            })
            .collect()
    }

    /// Parses `"autoregressive"` or `"parallel"` (the names the bindings accept), given as
    /// `argument` (the name the caller's API gives it, for the error).
    ///
    /// ```rust
    /// use av_core::cost_tables::DrafterKind;
    ///
    /// assert_eq!(DrafterKind::parse("drafter", "parallel")?, DrafterKind::Parallel);
    /// let err = DrafterKind::parse("drafter", "block").unwrap_err();
    /// assert_eq!(err.argument, "drafter");
    /// assert_eq!(
    ///     err.message,
    ///     r#"drafter kind must be 'autoregressive' or 'parallel', got "block""#
    /// );
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn parse(argument: &'static str, name: &str) -> Result<Self> {
        match name {
            "autoregressive" => Ok(DrafterKind::Autoregressive),
            "parallel" => Ok(DrafterKind::Parallel),
            other => Err(Error::value(
                argument,
                format!("drafter kind must be 'autoregressive' or 'parallel', got {other:?}"),
            )),
        }
    }
}

/// Dense step-cost tables, in milliseconds.
///
/// `draft_ms[r]` is the drafter's cost for `r` requests (`0..=max_num_reqs`); `verify_ms[t]`
/// is the target's cost for `t` tokens (`0..=max_batch_tokens`). Entries are finite, draft
/// entries are `≥ 0` and verify entries are `> 0`, so the planner's ratio is always defined.
///
/// # Concurrency
///
/// Immutable once built: every method takes `&self` and nothing inside changes, so one table
/// may be shared freely (`&CostTables` or `Arc<CostTables>`) by any number of threads planning
/// at once. It is `Send + Sync` (checked at compile time in `lib.rs`).
///
/// # Example
///
/// ```rust
/// use av_core::cost_tables::CostTables;
///
/// // Drafter: 0.3 ms plus 0.05 ms per request; target: flat 8 ms up to 4 tokens, then 12 ms.
/// let draft_ms: Vec<f64> = (0..=4).map(|r| 0.3 + 0.05 * r as f64).collect();
/// let verify_ms = vec![8.0, 8.0, 8.0, 8.0, 8.0, 12.0, 12.0, 12.0, 12.0];
/// let tables = CostTables::new(draft_ms, verify_ms)?;
/// assert_eq!((tables.max_num_reqs(), tables.max_batch_tokens()), (4, 8));
/// assert_eq!(tables.verify_ms()[5], 12.0);
/// assert!(tables.verify_is_nondecreasing());
/// # Ok::<(), av_core::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CostTables {
    draft_ms: Vec<f64>,
    verify_ms: Vec<f64>,
    verify_nondecreasing: bool,
    draft_depth_ms: Option<Vec<f64>>,
}

impl CostTables {
    /// Tables from explicit arrays (for example measured offline, or loaded from disk).
    ///
    /// Fails unless both are non-empty and finite, draft costs are `≥ 0` and verify costs
    /// are `> 0`.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    ///
    /// let tables = CostTables::new(vec![0.0, 0.5, 0.6], vec![2.0; 17])?;
    /// assert_eq!(tables.draft_ms(), [0.0, 0.5, 0.6]);
    /// // A zero verify cost would make the planner divide by zero.
    /// let err = CostTables::new(vec![0.0], vec![0.0, 2.0]).unwrap_err();
    /// assert_eq!(err.to_string(), "verify_ms: [0] = 0 must be finite and > 0");
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn new(draft_ms: Vec<f64>, verify_ms: Vec<f64>) -> Result<Self> {
        check_table("draft_ms", &draft_ms, false)?;
        check_table("verify_ms", &verify_ms, true)?;
        let verify_nondecreasing = verify_ms.windows(2).all(|w| w[0] <= w[1]);
        Ok(CostTables {
            draft_ms,
            verify_ms,
            verify_nondecreasing,
            draft_depth_ms: None,
        })
    }

    /// Tables from profiled `(size, ms)` points, with vLLM 0.33.0's semantics.
    ///
    /// Costs first take their running maximum (a bigger batch never costs less). Up to
    /// `cudagraph_limit` a size is charged at the next profiled size `≥` it: captured graphs
    /// pad to the next captured size, so cost is a step function and interpolating would
    /// invent marginal costs that do not exist. Above the limit nothing pads, so cost is
    /// interpolated linearly between the profiled points that are themselves above the limit
    /// (never blending across the limit, where cudagraphs are lost). Past the last point the
    /// last segment is extended. `cudagraph_limit = 0` means no limit: a step function up to
    /// the last point. Finally draft entries are floored at [`DRAFT_COST_FLOOR_MS`] and verify
    /// entries at [`VERIFY_COST_FLOOR_MS`].
    ///
    /// Sizes must be finite, `≥ 0` and strictly increasing; costs finite; curves non-empty.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    ///
    /// let draft = [(1.0, 2.0), (8.0, 3.0)];
    /// let verify = [(1.0, 10.0), (64.0, 12.0), (128.0, 20.0), (256.0, 30.0)];
    /// let tables = CostTables::from_curves(&draft, &verify, 8, 512, 64)?;
    /// assert_eq!(tables.draft_ms()[4], 3.0); // padded up to the 8-request graph
    /// assert_eq!(tables.verify_ms()[40], 12.0); // padded up to the 64-token graph
    /// assert_eq!(tables.verify_ms()[192], 25.0); // interpolated above the capture limit
    /// assert_eq!(tables.verify_ms()[384], 40.0); // last segment extended
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn from_curves(
        draft_curve: &[(f64, f64)],
        verify_curve: &[(f64, f64)],
        max_num_reqs: usize,
        max_batch_tokens: usize,
        cudagraph_limit: usize,
    ) -> Result<Self> {
        check_curve("draft_curve", draft_curve)?;
        check_curve("verify_curve", verify_curve)?;
        check_table_len("max_num_reqs", max_num_reqs)?;
        check_table_len("max_batch_tokens", max_batch_tokens)?;
        let mut draft_ms = build_table(draft_curve, max_num_reqs, cudagraph_limit);
        let mut verify_ms = build_table(verify_curve, max_batch_tokens, cudagraph_limit);
        for cost in &mut draft_ms {
            *cost = cost.max(DRAFT_COST_FLOOR_MS);
        }
        for cost in &mut verify_ms {
            *cost = cost.max(VERIFY_COST_FLOOR_MS);
        }
        CostTables::new(draft_ms, verify_ms)
    }

    /// Tables from raw timings: repeated `(size, ms)` samples in any order, reduced to the
    /// median per size (vLLM replays each profiled size five times and takes the median,
    /// which ignores the odd slow replay), then [`CostTables::from_curves`].
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    ///
    /// // Five replays per size, in any order; one replay at size 1 hit a slow path.
    /// let draft = [(1.0, 0.4), (1.0, 0.4), (1.0, 0.5), (1.0, 0.4), (1.0, 0.4)];
    /// let verify = [(16.0, 9.0), (1.0, 7.0), (1.0, 30.0), (16.0, 9.0), (1.0, 7.0)];
    /// let tables = CostTables::from_samples(&draft, &verify, 4, 16, 0)?;
    /// assert_eq!(tables.verify_ms()[1], 7.0); // the median, not the 30 ms outlier
    /// assert_eq!(tables.draft_ms()[4], 0.4);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn from_samples(
        draft_samples: &[(f64, f64)],
        verify_samples: &[(f64, f64)],
        max_num_reqs: usize,
        max_batch_tokens: usize,
        cudagraph_limit: usize,
    ) -> Result<Self> {
        let draft_curve = median_curve("draft_samples", draft_samples)?;
        let verify_curve = median_curve("verify_samples", verify_samples)?;
        CostTables::from_curves(
            &draft_curve,
            &verify_curve,
            max_num_reqs,
            max_batch_tokens,
            cudagraph_limit,
        )
    }

    /// Drafter cost by number of requests, `draft_ms[r]` for `r` in `0..=max_num_reqs`.
    pub fn draft_ms(&self) -> &[f64] {
        &self.draft_ms
    }

    /// Target cost by number of tokens, `verify_ms[t]` for `t` in `0..=max_batch_tokens`.
    pub fn verify_ms(&self) -> &[f64] {
        &self.verify_ms
    }

    /// Whether `verify_ms` never decreases (true for every table built from curves): the
    /// planner then finds the cheapest cost over a range at its start.
    pub fn verify_is_nondecreasing(&self) -> bool {
        self.verify_nondecreasing
    }

    /// Largest request count the draft table covers.
    pub fn max_num_reqs(&self) -> usize {
        self.draft_ms.len() - 1
    }

    /// Largest token count the verify table covers.
    pub fn max_batch_tokens(&self) -> usize {
        self.verify_ms.len() - 1
    }

    /// These tables with a draft-cost-by-depth table (module docs): `draft_depth_ms[d]` for
    /// `d` in `0..=K`, finite, non-decreasing (drafting deeper never costs less), starting at
    /// `0` (depth 0 runs no drafter). Only its shape matters; see [`Self::draft_cost_ms`].
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    ///
    /// let tables = CostTables::new(vec![0.0, 2.0, 2.5], vec![5.0; 9])?;
    /// // Profiled at some batch: 1.1 ms for one position, 2.0 for two, 3.0 for three.
    /// let tables = tables.with_draft_depth(vec![0.0, 1.1, 2.0, 3.0])?;
    /// assert_eq!(tables.max_draft_depth(), Some(3));
    /// assert_eq!(tables.draft_cost_ms(2, 3)?, 2.5); // full depth: draft_ms[2]
    /// assert_eq!(tables.draft_cost_ms(2, 0)?, 0.0); // no drafter
    /// let err = CostTables::new(vec![0.0], vec![1.0])?.with_draft_depth(vec![0.0, 2.0, 1.0]);
    /// assert_eq!(err.unwrap_err().argument, "draft_depth_ms");
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn with_draft_depth(mut self, draft_depth_ms: Vec<f64>) -> Result<Self> {
        check_depth_table(&draft_depth_ms)?;
        self.draft_depth_ms = Some(draft_depth_ms);
        Ok(self)
    }

    /// [`Self::with_draft_depth`] from profiled `(depth, ms)` points, built like the other
    /// curves (running maximum, each depth charged at the next profiled depth `≥` it, the last
    /// segment extended) over `0..=max_draft_depth`, with depth 0 set to 0 (no drafter runs).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    ///
    /// let tables = CostTables::new(vec![0.0, 2.0], vec![5.0; 9])?
    ///     .with_draft_depth_curve(&[(1.0, 0.7), (2.0, 1.3)], 4)?;
    /// assert_eq!(tables.draft_depth_ms(), Some(&[0.0, 0.7, 1.3, 1.9000000000000001, 2.5][..]));
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn with_draft_depth_curve(
        self,
        curve: &[(f64, f64)],
        max_draft_depth: usize,
    ) -> Result<Self> {
        check_curve("draft_depth_curve", curve)?;
        check_max_depth("max_draft_depth", max_draft_depth)?;
        let mut table = build_table(curve, max_draft_depth, 0);
        table[0] = 0.0;
        for i in 1..table.len() {
            table[i] = table[i].max(table[i - 1]).max(DRAFT_COST_FLOOR_MS);
        }
        self.with_draft_depth(table)
    }

    /// [`Self::with_draft_depth`] with the canonical shape of `kind` up to `max_depth`
    /// ([`DrafterKind::depth_shape`]).
    ///
    /// ```rust
    /// use av_core::cost_tables::{CostTables, DrafterKind};
    ///
    /// let tables = CostTables::new(vec![0.0, 0.8], vec![5.0; 9])?
    ///     .with_drafter(DrafterKind::Autoregressive, 4)?;
    /// assert_eq!(tables.draft_cost_ms(1, 2)?, 0.4); // half the depth, half the passes
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn with_drafter(self, kind: DrafterKind, max_depth: usize) -> Result<Self> {
        check_max_depth("max_depth", max_depth)?;
        self.with_draft_depth(kind.depth_shape(max_depth))
    }

    /// The draft-cost-by-depth table, if these tables have one.
    pub fn draft_depth_ms(&self) -> Option<&[f64]> {
        self.draft_depth_ms.as_deref()
    }

    /// The deepest drafting depth the depth table covers (`K`), if there is one.
    pub fn max_draft_depth(&self) -> Option<usize> {
        self.draft_depth_ms.as_ref().map(|t| t.len() - 1)
    }

    /// The fraction of the full-depth drafting cost that drafting `depth` positions costs:
    /// `draft_depth_ms[depth] / draft_depth_ms[K]` (0 when the full depth is free, 1 past the
    /// table; 1 for `depth ≥ 1` without a depth table, 0 for depth 0).
    pub fn depth_fraction(&self, depth: usize) -> f64 {
        if depth == 0 {
            return 0.0;
        }
        match &self.draft_depth_ms {
            None => 1.0,
            Some(table) => {
                let full = table[table.len() - 1];
                if full <= 0.0 {
                    0.0
                } else {
                    table[depth.min(table.len() - 1)] / full
                }
            }
        }
    }

    /// The drafter's cost for `num_requests` requests drafting `depth` positions each:
    /// `draft_ms[R] · fraction(depth)` (see [`Self::depth_fraction`]); 0 when nothing is
    /// drafted. More requests than [`Self::max_num_reqs`] are a value error naming
    /// `num_requests`.
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    ///
    /// let tables = CostTables::new(vec![0.0, 1.0, 1.5], vec![5.0; 9])?;
    /// assert_eq!(tables.draft_cost_ms(2, 3)?, 1.5);
    /// assert_eq!(tables.draft_cost_ms(3, 1).unwrap_err().argument, "num_requests");
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn draft_cost_ms(&self, num_requests: usize, depth: usize) -> Result<f64> {
        let Some(&full) = self.draft_ms.get(num_requests) else {
            return Err(Error::value(
                "num_requests",
                format!(
                    "= {num_requests} exceeds max_num_reqs = {}",
                    self.max_num_reqs()
                ),
            ));
        };
        if num_requests == 0 || depth == 0 {
            return Ok(0.0);
        }
        Ok(full * self.depth_fraction(depth))
    }

    /// The drafter's cost of a step whose requests draft `depths[r]` positions each: pass `j`
    /// (the `j`-th position) runs over the `R_j` requests drafting at least `j` positions and
    /// costs `draft_ms[R_j] · (fraction(j) − fraction(j − 1))` — requests that stop drafting
    /// leave the drafter's batch. With equal depths `d` this is [`Self::draft_cost_ms`]`(R, d)`
    /// up to rounding (the passes are summed).
    /// `counts` is scratch space, of at most `K + 1` entries whatever the depths (a depth past
    /// the depth table costs what `K` does, so only `min(depth, K)` is counted; without a depth
    /// table `K` is 1). At most `max_num_reqs` requests may draft (`depths[r] > 0`); more are a
    /// value error naming `depths`.
    ///
    /// ```rust
    /// use av_core::cost_tables::{CostTables, DrafterKind};
    ///
    /// let draft_ms = vec![0.0, 1.0, 1.5, 2.0]; // full depth, by batch size
    /// let tables = CostTables::new(draft_ms, vec![5.0; 9])?.with_drafter(DrafterKind::Autoregressive, 2)?;
    /// // Two requests draft 2 positions, one drafts 1: pass 1 over 3 requests, pass 2 over 2.
    /// let cost = tables.step_draft_cost_ms(&[2, 1, 2], &mut Vec::new())?;
    /// assert_eq!(cost, 2.0 * 0.5 + 1.5 * 0.5);
    /// assert_eq!(cost, tables.draft_cost_ms(3, 1)? + tables.draft_cost_ms(2, 2)? - tables.draft_cost_ms(2, 1)?);
    /// let err = tables.step_draft_cost_ms(&[1, 1, 1, 1], &mut Vec::new()).unwrap_err();
    /// assert_eq!(err.argument, "depths");
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn step_draft_cost_ms(&self, depths: &[usize], counts: &mut Vec<usize>) -> Result<f64> {
        // Past the table every pass costs a zero fraction (fraction(j) = fraction(K) = 1 for
        // j ≥ K), so counting depths beyond K changes no bit of the sum; capping them keeps the
        // scratch at K + 1 entries whatever a caller passes.
        let cap = self.max_draft_depth().unwrap_or(1);
        counts.clear();
        counts.resize(cap + 1, 0);
        for &d in depths {
            counts[d.min(cap)] += 1;
        }
        self.draft_cost_of_depth_counts(counts)
    }

    /// [`Self::step_draft_cost_ms`] from how many requests draft each depth: `counts[d]`
    /// requests draft `d` positions (`d` up to the depth table's `K`; at most `K + 1` entries).
    /// `counts` is turned into the requests drafting at least each depth.
    pub(crate) fn draft_cost_of_depth_counts(&self, counts: &mut [usize]) -> Result<f64> {
        let Some(deepest) = counts.iter().rposition(|&c| c > 0).filter(|&d| d > 0) else {
            return Ok(0.0);
        };
        // counts[j] becomes R_j, the requests drafting at least j positions.
        for j in (1..deepest).rev() {
            counts[j] += counts[j + 1];
        }
        // counts[1] is every drafting request, the largest R_j.
        if counts[1] > self.max_num_reqs() {
            return Err(Error::value(
                "depths",
                format!(
                    "has {} drafting requests, more than max_num_reqs = {}",
                    counts[1],
                    self.max_num_reqs()
                ),
            ));
        }
        let mut cost = 0.0;
        let mut previous = 0.0;
        for (j, &rows) in counts.iter().enumerate().take(deepest + 1).skip(1) {
            let fraction = self.depth_fraction(j);
            if rows > 0 {
                cost += self.draft_ms[rows] * (fraction - previous);
            }
            previous = fraction;
        }
        Ok(cost)
    }

    /// `{"draft_ms": [...], "verify_ms": [...]}` (plus `"draft_depth_ms"` when there is a depth
    /// table); every value round-trips bit-exactly through
    /// [`CostTables::from_json`] (shortest round-trip decimal form).
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    ///
    /// let tables = CostTables::new(vec![0.0, 0.25], vec![1e-6, 7.5])?;
    /// assert_eq!(tables.to_json(), r#"{"draft_ms": [0.0, 0.25], "verify_ms": [1e-6, 7.5]}"#);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn to_json(&self) -> String {
        crate::persist::cost_tables::to_json(self)
    }

    /// Parses [`CostTables::to_json`]'s format (any JSON whitespace, keys in any order) and
    /// validates as [`CostTables::new`] does.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::CostTables;
    ///
    /// let tables = CostTables::from_curves(&[(1.0, 0.3)], &[(1.0, 7.1), (64.0, 9.3)], 8, 64, 0)?;
    /// assert_eq!(CostTables::from_json(&tables.to_json())?, tables); // bit-exact
    /// let err = CostTables::from_json(r#"{"draft_ms": [0.5]}"#).unwrap_err();
    /// assert_eq!(err.argument, "json");
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Self> {
        crate::persist::cost_tables::from_json(text)
    }

    /// The longest [`to_bytes`](Self::to_bytes) output (both tables at [`MAX_TABLE_LEN`], the
    /// deepest depth table): a reader never needs more bytes.
    pub const MAX_ENCODED_LEN: usize = crate::persist::cost_tables::MAX_ENCODED_LEN;

    /// The tables as versioned, checksummed bytes (the frame of [`crate::persist`], magic
    /// `AVCORE\0C`; the payload is [`crate::persist::cost_tables`]), bit-exact.
    ///
    /// # Example
    ///
    /// ```rust
    /// use av_core::cost_tables::{CostTables, DrafterKind};
    ///
    /// let tables = CostTables::new(vec![0.0, 0.3], vec![7.1, 9.3])?
    ///     .with_drafter(DrafterKind::Parallel, 4)?;
    /// let bytes = tables.to_bytes();
    /// assert_eq!(&bytes[..8], b"AVCORE\0C");
    /// assert_eq!(CostTables::from_bytes(&bytes)?, tables);
    /// let err = CostTables::from_bytes(&bytes[..20]).unwrap_err();
    /// assert_eq!(err.kind, av_core::ErrorKind::State);
    /// # Ok::<(), av_core::Error>(())
    /// ```
    pub fn to_bytes(&self) -> Vec<u8> {
        crate::persist::cost_tables::encode(self)
    }

    /// Tables from [`to_bytes`](Self::to_bytes); corrupt, truncated, foreign or
    /// future-version data, or a table no `CostTables` could hold, is an
    /// [`ErrorKind::State`](crate::ErrorKind::State) error naming `data`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        crate::persist::cost_tables::decode(bytes)
    }
}

/// The median cost per distinct size, sizes ascending (the mean of the two middle values for
/// an even count, as numpy's median).
///
/// # Example
///
/// ```rust
/// use av_core::cost_tables::median_curve;
///
/// let samples = [(8.0, 3.0), (1.0, 2.0), (8.0, 5.0), (1.0, 2.5), (1.0, 9.0)];
/// assert_eq!(median_curve("verify_samples", &samples)?, [(1.0, 2.5), (8.0, 4.0)]);
/// assert!(median_curve("verify_samples", &[]).is_err());
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn median_curve(argument: &'static str, samples: &[(f64, f64)]) -> Result<Vec<(f64, f64)>> {
    if samples.is_empty() {
        return Err(Error::value(
            argument,
            "is empty; profile at least one size",
        ));
    }
    for (i, &(size, cost)) in samples.iter().enumerate() {
        if !size.is_finite() || size < 0.0 {
            return Err(Error::value(
                argument,
                format!("size of sample {i} must be finite and >= 0, got {size}"),
            ));
        }
        if !cost.is_finite() {
            return Err(Error::value(
                argument,
                format!("cost of sample {i} must be finite, got {cost}"),
            ));
        }
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut curve = Vec::new();
    for group in sorted.chunk_by(|a, b| a.0 == b.0) {
        let n = group.len();
        let median = if n % 2 == 1 {
            group[n / 2].1
        } else {
            (group[n / 2 - 1].1 + group[n / 2].1) / 2.0
        };
        ensure_finite(argument, median)?;
        curve.push((group[0].0, median));
    }
    Ok(curve)
}

fn check_table(argument: &'static str, table: &[f64], positive: bool) -> Result<()> {
    if table.is_empty() {
        return Err(Error::value(
            argument,
            "is empty; it needs the entry for size 0",
        ));
    }
    if table.len() > MAX_TABLE_LEN {
        return Err(Error::value(
            argument,
            format!("has {} entries, more than {MAX_TABLE_LEN}", table.len()),
        ));
    }
    for (i, &cost) in table.iter().enumerate() {
        let ok = cost.is_finite() && if positive { cost > 0.0 } else { cost >= 0.0 };
        if !ok {
            let bound = if positive { "> 0" } else { ">= 0" };
            return Err(Error::value(
                argument,
                format!("[{i}] = {cost} must be finite and {bound}"),
            ));
        }
    }
    Ok(())
}

fn check_depth_table(table: &[f64]) -> Result<()> {
    let argument = "draft_depth_ms";
    if table.len() < 2 || table.len() > MAX_DRAFT_DEPTH + 1 {
        return Err(Error::value(
            argument,
            format!(
                "has {} entries; it needs depths 0..=K with 1 <= K <= {MAX_DRAFT_DEPTH}",
                table.len()
            ),
        ));
    }
    if table[0] != 0.0 {
        return Err(Error::value(
            argument,
            format!("[0] = {} must be 0 (depth 0 runs no drafter)", table[0]),
        ));
    }
    for (i, &cost) in table.iter().enumerate().skip(1) {
        if !cost.is_finite() || cost < table[i - 1] {
            return Err(Error::value(
                argument,
                format!(
                    "[{i}] = {cost} must be finite and >= [{}] = {} (deeper never costs less)",
                    i - 1,
                    table[i - 1]
                ),
            ));
        }
    }
    Ok(())
}

fn check_max_depth(argument: &'static str, max_depth: usize) -> Result<()> {
    if max_depth == 0 || max_depth > MAX_DRAFT_DEPTH {
        return Err(Error::value(
            argument,
            format!("= {max_depth} must be in 1..={MAX_DRAFT_DEPTH}"),
        ));
    }
    Ok(())
}

fn check_table_len(argument: &'static str, max_size: usize) -> Result<()> {
    if max_size >= MAX_TABLE_LEN {
        return Err(Error::value(
            argument,
            format!("= {max_size} is too large (at most {})", MAX_TABLE_LEN - 1),
        ));
    }
    Ok(())
}

fn check_curve(argument: &'static str, curve: &[(f64, f64)]) -> Result<()> {
    if curve.is_empty() {
        return Err(Error::value(
            argument,
            "is empty; profile at least one size",
        ));
    }
    for (i, &(size, cost)) in curve.iter().enumerate() {
        if !size.is_finite() || size < 0.0 {
            return Err(Error::value(
                argument,
                format!("size of point {i} must be finite and >= 0, got {size}"),
            ));
        }
        if !cost.is_finite() {
            return Err(Error::value(
                argument,
                format!("cost of point {i} must be finite, got {cost}"),
            ));
        }
        if i > 0 && size <= curve[i - 1].0 {
            return Err(Error::value(
                argument,
                format!(
                    "sizes must be strictly increasing, got {} then {size} at point {i}",
                    curve[i - 1].0
                ),
            ));
        }
    }
    Ok(())
}

/// One dense table, `0..=max_size`, before flooring (vLLM's `build_table`).
fn build_table(curve: &[(f64, f64)], max_size: usize, cudagraph_limit: usize) -> Vec<f64> {
    let xs: Vec<f64> = curve.iter().map(|p| p.0).collect();
    let mut ys: Vec<f64> = Vec::with_capacity(curve.len());
    for &(_, cost) in curve {
        ys.push(ys.last().map_or(cost, |&prev: &f64| prev.max(cost)));
    }
    let n = xs.len();
    // Profiled points above the capture limit (a suffix, since sizes increase).
    let above = if cudagraph_limit > 0 {
        xs.partition_point(|&x| x <= cudagraph_limit as f64)
    } else {
        n
    };
    let extrapolation_slope = (n > 1).then(|| (ys[n - 1] - ys[n - 2]) / (xs[n - 1] - xs[n - 2]));

    let mut table = Vec::with_capacity(max_size + 1);
    let mut next = 0; // first profiled index with xs[next] >= size
    for size in 0..=max_size {
        let x = size as f64;
        while next < n && xs[next] < x {
            next += 1;
        }
        let mut cost = ys[next.min(n - 1)];
        if cudagraph_limit > 0 && size > cudagraph_limit && above < n {
            cost = interpolate(x, &xs[above..], &ys[above..]);
        }
        if let Some(slope) = extrapolation_slope {
            if x > xs[n - 1] {
                cost = ys[n - 1] + slope * (x - xs[n - 1]);
            }
        }
        table.push(cost);
    }
    table
}

/// `numpy.interp(x, xs, ys)` for strictly increasing `xs`, with numpy's arithmetic
/// (`slope * (x - xs[j]) + ys[j]`), so tables match vLLM's bit for bit.
fn interpolate(x: f64, xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len();
    if x <= xs[0] {
        return ys[0];
    }
    if x >= xs[n - 1] {
        return ys[n - 1];
    }
    let j = xs.partition_point(|&p| p <= x) - 1;
    if xs[j] == x {
        return ys[j];
    }
    let slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j]);
    slope * (x - xs[j]) + ys[j]
}

#[cfg(test)]
mod tests;
