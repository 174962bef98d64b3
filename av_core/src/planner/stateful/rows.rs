//! How the planner stores a step's confidences: each slot's remembered confidences and their
//! survivals, a row at a time, and each slot's part of its exploration draws.

use crate::matrix::MatrixView;
use crate::planner::exploration::slot_key;

/// Each slot's [`slot_key`].
pub(super) fn slot_keys(num_slots: usize) -> Vec<u64> {
    (0..num_slots as u64).map(slot_key).collect()
}

/// What [`super::VerificationPlanner`] stores: the slots' rows of remembered confidences and
/// survivals, from this call's confidences (and, after a plan, their survivals).
pub(super) struct StoreRows<'a, T> {
    pub(super) previous: &'a mut [f64],
    pub(super) survivals: &'a mut [f64],
    pub(super) slots: &'a [i64],
    pub(super) confidences: MatrixView<'a, T>,
    pub(super) scheduled_drafts: &'a [i64],
    pub(super) current: Option<&'a [f64]>,
}

/// Stores each slot's drafted positions, rows of `k` entries (`K`, when not 0, is `k` known at
/// compile time). Only drafted positions carry news: past a request's scheduled drafts (a
/// shallower drafting depth, a request near its end) the remembered values stay, and the
/// survivals past them are multiplied on from the new ones.
#[inline(always)]
pub(super) fn store_rows<T: Copy + Into<f64>, const K: usize>(rows: StoreRows<'_, T>, k: usize) {
    let k = if K > 0 { K } else { k };
    let StoreRows {
        previous,
        survivals,
        slots,
        confidences,
        scheduled_drafts,
        current,
    } = rows;
    let data = confidences.data();
    if let (true, Some(current)) = (K > 0, current) {
        // After a plan, at a depth known at compile time: rows of `K` (lengths the compiler
        // sees), and a whole drafted row is a conversion and a copy.
        let rows = data.chunks_exact(k).zip(current.chunks_exact(k));
        for ((confidences, current), (&slot, &n)) in rows.zip(slots.iter().zip(scheduled_drafts)) {
            let at = slot as usize * k;
            let (previous, survivals) = (&mut previous[at..at + k], &mut survivals[at..at + k]);
            if n as usize >= k {
                for (stored, &p) in previous.iter_mut().zip(confidences) {
                    *stored = p.into();
                }
                survivals.copy_from_slice(current);
            } else {
                store_row(previous, survivals, confidences, Some(current), n as usize);
            }
        }
        return;
    }
    for (r, (&slot, &n)) in slots.iter().zip(scheduled_drafts).enumerate() {
        let (at, n) = (slot as usize * k, n as usize);
        let row = Row {
            previous: &mut previous[at..at + k],
            survivals: &mut survivals[at..at + k],
            confidences: &data[r * k..r * k + k],
            current: current.map(|current| &current[r * k..r * k + k]),
        };
        if K > 0 {
            // Fixed-size rows: no bounds checks, an unrolled loop.
            if let (Ok(previous), Ok(survivals), Ok(confidences)) = (
                <&mut [f64; K]>::try_from(&mut *row.previous),
                <&mut [f64; K]>::try_from(&mut *row.survivals),
                <&[T; K]>::try_from(row.confidences),
            ) {
                store_row(previous, survivals, confidences, row.current, n);
                continue;
            }
        }
        store_row(row.previous, row.survivals, row.confidences, row.current, n);
    }
}

/// One slot's row for [`store_row`].
struct Row<'a, T> {
    previous: &'a mut [f64],
    survivals: &'a mut [f64],
    confidences: &'a [T],
    current: Option<&'a [f64]>,
}

/// Stores the first `n` confidences of one row and its survivals: this call's survivals
/// (`current`, the same products) for the drafted positions when the call planned, the
/// remembered confidences multiplied on from there past them.
#[inline(always)]
fn store_row<T: Copy + Into<f64>>(
    previous: &mut [f64],
    survivals: &mut [f64],
    confidences: &[T],
    current: Option<&[f64]>,
    n: usize,
) {
    let mut survival = 1.0f64;
    match current {
        Some(current) if n >= survivals.len() => {
            // A whole drafted row: its survivals are the plan's (separate loops vectorize).
            for (stored, &p) in previous.iter_mut().zip(confidences) {
                *stored = p.into();
            }
            survivals.copy_from_slice(current);
        }
        _ => {
            for (j, ((value, stored), &p)) in survivals
                .iter_mut()
                .zip(previous.iter_mut())
                .zip(confidences)
                .enumerate()
            {
                if j < n {
                    *stored = p.into();
                }
                survival = match current {
                    Some(current) if j < n => current[j],
                    _ => survival * (*stored + 0.0),
                };
                *value = survival;
            }
        }
    }
}
