//! The verification planner's payload.
//!
//! Version 2 (written by this build; little-endian):
//!
//! ```text
//! num_slots                 u64
//! num_positions (K)         u64
//! budget source             u8: 0 previous, 1 current
//! exploration probability   f64
//! exploration seed          u64
//! step count                u64   (drives the exploration draws)
//! cost tables               the cost tables' binary payload, version 1 (persist::cost_tables)
//! remembered confidences    f64 × num_slots · K, slot-major
//! ```
//!
//! Version 1 (0.1.0; read, never written) had the same fields up to the step count, then
//! `draft_ms` and `verify_ms` (each a `u64` length and its values), the remembered confidences,
//! and an optional draft-depth table (a `u64` length and its values) that a reader could only
//! detect from how many bytes followed the confidences. Version 2 says whether there is one.

use super::cost_tables::{payload_len, put_tables, read_tables};
use super::frame::{broken, frame, unframe, Kind, Reader, DATA, FRAME_LEN};
use crate::cost_tables::{CostTables, MAX_DRAFT_DEPTH, MAX_TABLE_LEN};
use crate::error::{Error, Result};
use crate::planner::{BudgetSource, Exploration, VerificationPlanner};

/// Version of the planner's payload written by this build (and the newest it reads).
pub const PLANNER_VERSION: u32 = 2;

/// Length of a planner's framed state (module docs): tables of `draft_len` and `verify_len`
/// entries, `entries` remembered confidences (`num_slots × K`) and, when there is one, a
/// draft-depth table of `depth_len` entries.
pub(crate) const fn encoded_len(
    draft_len: usize,
    verify_len: usize,
    entries: usize,
    depth_len: Option<usize>,
) -> usize {
    FRAME_LEN + 8 + 8 + 1 + 8 + 8 + 8 + payload_len(draft_len, verify_len, depth_len) + 8 * entries
}

/// The longest state (both tables at [`MAX_TABLE_LEN`], the most remembered confidences, the
/// deepest depth table).
pub(crate) const MAX_ENCODED_LEN: usize = encoded_len(
    MAX_TABLE_LEN,
    MAX_TABLE_LEN,
    VerificationPlanner::MAX_STATE_ENTRIES,
    Some(MAX_DRAFT_DEPTH + 1),
);

/// `planner`'s state as framed bytes, version [`PLANNER_VERSION`].
pub(crate) fn encode(planner: &VerificationPlanner) -> Vec<u8> {
    let tables = planner.cost_tables();
    let remembered = planner.remembered();
    let len = encoded_len(
        tables.draft_ms().len(),
        tables.verify_ms().len(),
        remembered.len(),
        tables.draft_depth_ms().map(<[f64]>::len),
    );
    let mut payload = Vec::with_capacity(len - FRAME_LEN);
    payload.extend((planner.num_slots() as u64).to_le_bytes());
    payload.extend((planner.num_positions() as u64).to_le_bytes());
    payload.push(match planner.budget_source() {
        BudgetSource::Previous => 0,
        BudgetSource::Current => 1,
    });
    payload.extend(planner.exploration().to_le_bytes());
    payload.extend(planner.exploration_seed().to_le_bytes());
    payload.extend(planner.step_count().to_le_bytes());
    put_tables(&mut payload, tables);
    for value in remembered {
        payload.extend(value.to_le_bytes());
    }
    debug_assert_eq!(payload.len() + FRAME_LEN, len);
    frame(Kind::Planner, PLANNER_VERSION, &payload)
}

/// A planner from bytes of version 1 or 2. Corrupt, truncated, foreign or future-version data,
/// or values no planner could hold, are state errors naming `data`.
pub(crate) fn decode(bytes: &[u8]) -> Result<VerificationPlanner> {
    let frame = unframe(Kind::Planner, 1..=PLANNER_VERSION, bytes)?;
    let mut r = Reader {
        bytes: frame.payload,
    };
    let num_slots = r.u64("num_slots")?;
    let num_positions = r.u64("num_positions")?;
    let source = match r.u8("budget_source")? {
        0 => BudgetSource::Previous,
        1 => BudgetSource::Current,
        other => return Err(broken(format!("budget_source code {other} is not 0 or 1"))),
    };
    let exploration = r.f64("exploration")?;
    let seed = r.u64("exploration_seed")?;
    let step = r.u64("step count")?;
    let entries = num_slots.saturating_mul(num_positions);
    let (tables, mut r) = match frame.version {
        1 => read_v1_tables(r, entries)?,
        _ => (read_tables(&mut r)?, r),
    };
    // Each remembered confidence takes 8 bytes: refuse a count the data cannot hold before the
    // planner allocates them.
    if r.bytes.len() as u64 != entries.saturating_mul(8) {
        return Err(broken(format!(
            "{num_slots} slots x {num_positions} positions do not match the {} bytes of \
                 remembered confidences",
            r.bytes.len()
        )));
    }
    let invalid = |e: Error| e.in_saved(DATA, "the saved planner state is invalid");
    let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let mut planner =
        VerificationPlanner::new(tables, size(num_slots), size(num_positions), source)
            .map_err(invalid)?;
    planner.set_exploration(Exploration::new("exploration", exploration, seed).map_err(invalid)?);
    let mut remembered = Vec::with_capacity(planner.remembered().len());
    for _ in 0..planner.remembered().len() {
        let value = r.f64("previous confidences")?;
        if !(0.0..=1.0).contains(&value) {
            return Err(broken(format!(
                "a remembered confidence is {value}, outside [0, 1]"
            )));
        }
        remembered.push(value);
    }
    r.finish()?;
    planner.restore(&remembered, step);
    Ok(planner)
}

/// Version 1's tables: `draft_ms` and `verify_ms`, then (after the `entries` remembered
/// confidences) a draft-depth table when the bytes left say so. Returns the tables and a reader
/// over exactly the confidences.
fn read_v1_tables(mut r: Reader<'_>, entries: u64) -> Result<(CostTables, Reader<'_>)> {
    let (draft, verify) = (r.f64s("draft_ms")?, r.f64s("verify_ms")?);
    // Version 1 did not say whether a draft-depth table follows the confidences (its length,
    // then its entries): there is one when whole words follow them. Version 2 says so.
    let at = usize::try_from(entries)
        .unwrap_or(usize::MAX)
        .saturating_mul(8);
    let (confidences, depth) = match r.bytes.len() > at && r.bytes.len() % 8 == 0 {
        false => (r.bytes, None),
        true => {
            let mut tail = Reader {
                bytes: &r.bytes[at..],
            };
            let len = tail.u64("draft_depth_ms")?;
            if len != (tail.bytes.len() / 8) as u64 {
                let message = format!("draft-depth table length {len} does not match the data");
                return Err(broken(message));
            }
            (&r.bytes[..at], Some(tail))
        }
    };
    let invalid = |e: Error| e.in_saved(DATA, "the saved cost tables are invalid");
    let mut tables = CostTables::new(draft, verify).map_err(invalid)?;
    if let Some(mut tail) = depth {
        let depth = (0..tail.bytes.len() / 8).map(|_| tail.f64("draft_depth_ms"));
        let depth = depth.collect::<Result<Vec<_>>>()?;
        let invalid = |e: Error| e.in_saved(DATA, "the saved draft-depth table is invalid");
        tables = tables.with_draft_depth(depth).map_err(invalid)?;
    }
    Ok((tables, Reader { bytes: confidences }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost_tables::DrafterKind;
    use crate::planner::StepTokens;
    use crate::{ErrorKind, MatrixView};

    fn planner_after_steps(tables: CostTables) -> VerificationPlanner {
        let mut planner = VerificationPlanner::new(tables, 6, 3, BudgetSource::Previous).unwrap();
        planner.set_exploration(Exploration::new("exploration", 0.3, 7).unwrap());
        let conf = [0.9, 0.8, 0.7, 0.5, 0.4, 0.3, 0.99, 0.2, 0.1, 0.6, 0.6, 0.6];
        let step = StepTokens {
            num_non_draft_tokens: 4,
            num_sampling_requests: 4,
            max_draft_budget: None,
        };
        for _ in 0..3 {
            let view = MatrixView::new("c", &conf, 4, 3).unwrap();
            planner
                .plan(&[0, 2, 4, 5], view, &[3, 3, 2, 3], &step, &mut [0; 4])
                .unwrap();
        }
        planner
    }

    fn tables() -> CostTables {
        CostTables::new(
            vec![0.0; 5],
            (0..=40).map(|t| 1.0 + 0.1 * f64::from(t)).collect(),
        )
        .unwrap()
    }

    #[test]
    fn version_2_says_whether_a_depth_table_follows() {
        let plain = encode(&planner_after_steps(tables()));
        let deep = encode(&planner_after_steps(
            tables().with_drafter(DrafterKind::Parallel, 3).unwrap(),
        ));
        assert_eq!(plain[8..12], 2u32.to_le_bytes());
        // The flag byte right after the two tables: 0, then 1 with the table after it.
        let flag_at = FRAME_LEN - 4 + 41 + 8 + 5 * 8 + 8 + 41 * 8;
        assert_eq!((plain[flag_at], deep[flag_at]), (0, 1));
        assert_eq!(deep.len(), plain.len() + 8 + 4 * 8);
    }

    #[test]
    fn values_no_planner_holds_are_state_errors_naming_data() {
        let good = planner_after_steps(tables());
        let reframe = |edit: &dyn Fn(&mut Vec<u8>)| {
            let bytes = encode(&good);
            let mut payload = bytes[FRAME_LEN - 4..bytes.len() - 4].to_vec();
            edit(&mut payload);
            frame(Kind::Planner, PLANNER_VERSION, &payload)
        };
        type Edit<'a> = &'a dyn Fn(&mut Vec<u8>);
        let cases: [(Edit<'_>, &str); 4] = [
            (&|p| p[16] = 2, "budget_source code 2 is not 0 or 1"),
            (
                &|p| p[17..25].copy_from_slice(&1.5f64.to_le_bytes()),
                "the saved planner state is invalid: exploration: must be a probability in \
                 [0, 1], got 1.5",
            ),
            (
                &|p| {
                    let n = p.len();
                    p[n - 8..].copy_from_slice(&2.0f64.to_le_bytes());
                },
                "a remembered confidence is 2, outside [0, 1]",
            ),
            (
                &|p| p[8..16].copy_from_slice(&0u64.to_le_bytes()),
                "6 slots x 0 positions do not match the 144 bytes of remembered confidences",
            ),
        ];
        for (edit, message) in cases {
            let err = decode(&reframe(edit)).unwrap_err();
            assert_eq!((err.kind, err.argument), (ErrorKind::State, DATA));
            assert_eq!(err.message, message);
        }
    }

    #[test]
    fn round_trips_and_continues_identically() {
        let mut planner = planner_after_steps(tables());
        let mut back = VerificationPlanner::from_bytes(&planner.to_bytes()).unwrap();
        assert_eq!(back.to_bytes(), planner.to_bytes());
        let conf = [0.5; 12];
        let step = StepTokens {
            num_non_draft_tokens: 4,
            num_sampling_requests: 4,
            max_draft_budget: None,
        };
        let (mut a, mut b) = ([0i32; 4], [0i32; 4]);
        for _ in 0..5 {
            let view = MatrixView::new("c", &conf, 4, 3).unwrap();
            let x = planner
                .plan(&[0, 1, 2, 3], view, &[3; 4], &step, &mut a)
                .unwrap();
            let y = back
                .plan(&[0, 1, 2, 3], view, &[3; 4], &step, &mut b)
                .unwrap();
            assert_eq!((x, a), (y, b));
        }
    }

    #[test]
    fn encoded_len_is_the_length() {
        let planner = planner_after_steps(tables());
        let tables = planner.cost_tables();
        let (draft, verify) = (tables.draft_ms().len(), tables.verify_ms().len());
        assert_eq!(
            planner.to_bytes().len(),
            VerificationPlanner::encoded_len(draft, verify, 6 * 3, None)
        );
        let deep = VerificationPlanner::new(
            tables
                .clone()
                .with_draft_depth(vec![0.0, 1.0, 2.0, 2.5])
                .unwrap(),
            5,
            3,
            BudgetSource::Current,
        )
        .unwrap();
        let bytes = deep.to_bytes();
        assert_eq!(
            bytes.len(),
            VerificationPlanner::encoded_len(draft, verify, 5 * 3, Some(4))
        );
        assert!(bytes.len() <= VerificationPlanner::MAX_ENCODED_LEN);
    }

    #[test]
    fn a_saved_step_count_at_the_end_of_u64_wraps_instead_of_panicking() {
        let mut planner = planner_after_steps(tables());
        let remembered = planner.remembered().to_vec();
        planner.restore(&remembered, u64::MAX);
        let mut back = VerificationPlanner::from_bytes(&planner.to_bytes()).unwrap();
        let step = StepTokens {
            num_non_draft_tokens: 1,
            num_sampling_requests: 1,
            max_draft_budget: None,
        };
        let view = MatrixView::new("c", &[0.5; 3], 1, 3).unwrap();
        back.plan(&[0], view, &[3], &step, &mut [0]).unwrap();
        assert_eq!(back.step_count(), 0);
    }

    #[test]
    fn every_truncation_and_bit_flip_is_refused() {
        let bytes = planner_after_steps(tables()).to_bytes();
        for cut in 0..bytes.len() {
            assert!(VerificationPlanner::from_bytes(&bytes[..cut]).is_err());
        }
        for i in (0..bytes.len()).step_by(3) {
            let mut corrupt = bytes.clone();
            corrupt[i] ^= 0x20;
            assert!(
                VerificationPlanner::from_bytes(&corrupt).is_err(),
                "byte {i}"
            );
        }
        // An estimator's bytes are not a planner's.
        let est = crate::AcceptanceEstimator::new(crate::EstimatorConfig::new(3)).unwrap();
        let err = VerificationPlanner::from_bytes(&est.to_bytes()).unwrap_err();
        assert!(err.message.contains("magic"), "{err}");
    }
}
