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

/// Stores each slot's drafted positions, rows of `k` entries, on the variant for `level`,
/// which must be one this CPU runs ([`crate::simd::available`]): conversions, copies and the
/// baseline's multiplications in the baseline's order, so every variant stores the same bits.
#[inline]
pub(super) fn store_at<T: Copy + Into<f64>>(
    level: crate::simd::Level,
    rows: StoreRows<'_, T>,
    k: usize,
) {
    crate::simd::dispatch!(
        level,
        avx512: x86::store_avx512(rows, k),
        avx2: x86::store_avx2(rows, k),
        baseline: store_any(rows, k),
    );
}

/// The stores compiled for AVX2 and AVX-512 (the same code, wider vectors).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::StoreRows;

    crate::simd::wide_variants! {
        fn store_avx2 / store_avx512 [T: Copy + Into<f64>] (rows: StoreRows<'_, T>, k: usize) {
            super::store_any(rows, k)
        }
    }
}

/// The body of every [`store_at`] variant: common depths get a fixed-width loop (whole rows
/// unrolled).
#[inline(always)]
fn store_any<T: Copy + Into<f64>>(rows: StoreRows<'_, T>, k: usize) {
    match k {
        4 => store_rows::<T, 4>(rows, 4),
        8 => store_rows::<T, 8>(rows, 8),
        16 => store_rows::<T, 16>(rows, 16),
        k => store_rows::<T, 0>(rows, k),
    }
}

/// Stores each slot's drafted positions, rows of `k` entries (`K`, when not 0, is `k` known at
/// compile time). Only drafted positions carry news: past a request's scheduled drafts (a
/// shallower drafting depth, a request near its end) the remembered values stay, and the
/// survivals past them are multiplied on from the new ones.
#[inline(always)]
fn store_rows<T: Copy + Into<f64>, const K: usize>(rows: StoreRows<'_, T>, k: usize) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level stores the baseline's bits: remembered confidences and survivals, after a
    /// plan and after a bare remember, for whole, partial and empty drafted rows, at the
    /// depths with a fixed-width loop and others.
    #[test]
    fn every_level_stores_the_baselines_bits() {
        let mut next = crate::planner::tests::xorshift(0x2545_f491_4f6c_dd1du64);
        for k in [1, 3, 4, 5, 8, 12, 16] {
            let num_slots = 11;
            let slots: Vec<i64> = vec![7, 0, 3, 10, 5, 1, 9];
            let rows = slots.len();
            let confidences: Vec<f32> = (0..rows * k)
                .map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32)
                .collect();
            let drafts: Vec<i64> = (0..rows)
                .map(|r| {
                    if r % 3 == 0 {
                        k as i64
                    } else {
                        (next() % (k as u64 + 1)) as i64
                    }
                })
                .collect();
            // The plan's survivals of these rows (any values: the store copies them).
            let current: Vec<f64> = (0..rows * k)
                .map(|_| (next() >> 11) as f64 / 9e15)
                .collect();
            let old: Vec<f64> = (0..num_slots * k)
                .map(|_| (next() >> 11) as f64 / 9e15)
                .collect();
            for planned in [true, false] {
                let store = |level| {
                    let (mut previous, mut survivals) = (old.clone(), old.clone());
                    let view = MatrixView::new("c", &confidences[..], rows, k).unwrap();
                    let rows = StoreRows {
                        previous: &mut previous,
                        survivals: &mut survivals,
                        slots: &slots,
                        confidences: view,
                        scheduled_drafts: &drafts,
                        current: planned.then_some(&current[..]),
                    };
                    store_at(level, rows, k);
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    (bits(&previous), bits(&survivals))
                };
                let baseline = store(crate::simd::Level::Baseline);
                // The store writes something: the drafted slots' remembered confidences change.
                assert_ne!(
                    baseline.0,
                    old.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                );
                for level in crate::simd::available() {
                    assert_eq!(store(level), baseline, "{level:?} k={k} planned={planned}");
                }
            }
        }
    }
}
