//! One decode step's contribution to the round statistics: the hot loop of `observe`.
//!
//! Inputs are already validated. For the common draft lengths (K ≤ 16) the loop is
//! monomorphized on K: each row is a fixed-size block of straight-line arithmetic with no
//! branches (unlabeled slots are masked to exact zeros), which the compiler vectorizes. Longer
//! drafts take a plain per-observation loop. Both give the same bits: every term goes through
//! the same fixed-point conversion, and integer sums do not depend on order.

use super::accumulator::{scaled_term_bits, PositionSums, RoundStats};
use super::fixed_point::MAGIC_BITS;
use super::labels::num_labeled;

/// Where the IRLS predictions come from.
#[derive(Clone, Copy)]
pub enum Predictions<'a, P> {
    /// The probabilities made at draft time, row-major `[R, K]`.
    Given(&'a [P]),
    /// The current coefficients: `σ(slope·x + intercepts[k])`.
    Current {
        /// Slope ω.
        slope: f64,
        /// Intercepts β_k.
        intercepts: &'a [f64],
    },
}

/// Rows summed in `i64` lanes before they are folded into the `i128` totals (each term is below
/// `2^48` units, so `2^14` rows cannot overflow).
const ROWS_PER_FLUSH: usize = 1 << 14;

/// Positions processed together; a row stops after the last group holding a labeled slot.
const GROUP: usize = 4;

#[inline]
fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// The statistics of one batch: `features` `[R, K]` (clamped to `±limit` here), `counts[r] =
/// (admitted, accepted)`, predictions from `predictions` (the tests' form of
/// [`batch_stats_into`]).
#[cfg(test)]
pub fn batch_stats<T: Copy + Into<f64>, P: Copy + Into<f64>>(
    num_positions: usize,
    features: &[T],
    counts: &[(usize, usize)],
    predictions: Predictions<'_, P>,
    limit: f64,
) -> RoundStats {
    let mut stats = RoundStats::new(num_positions);
    batch_stats_into(
        num_positions,
        features,
        counts,
        predictions,
        limit,
        &mut stats,
    );
    stats
}

/// [`batch_stats`] into `stats`, which is emptied first (its buffer stays: a caller that keeps
/// it between steps does not allocate).
pub fn batch_stats_into<T: Copy + Into<f64>, P: Copy + Into<f64>>(
    num_positions: usize,
    features: &[T],
    counts: &[(usize, usize)],
    predictions: Predictions<'_, P>,
    limit: f64,
    stats: &mut RoundStats,
) {
    stats.positions.clear();
    stats
        .positions
        .resize(num_positions, PositionSums::default());
    macro_rules! dispatch {
        ($($k:literal)*) => {
            match num_positions {
                $($k => fixed::<$k, T, P>(features, counts, predictions, limit, stats),)*
                _ => dynamic(num_positions, features, counts, predictions, limit, stats),
            }
        };
    }
    dispatch!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

fn fixed<const K: usize, T: Copy + Into<f64>, P: Copy + Into<f64>>(
    features: &[T],
    counts: &[(usize, usize)],
    predictions: Predictions<'_, P>,
    limit: f64,
    stats: &mut RoundStats,
) {
    let rows = counts.len();
    // PREFIX[l][i] = 1 when i < l: the labeled mask and the label of a row are table rows, so
    // the inner loop is pure arithmetic on fixed-size arrays.
    let prefix: [[f64; K]; 17] =
        std::array::from_fn(|l| std::array::from_fn(|i| if i < l { 1.0 } else { 0.0 }));
    for start in (0..rows).step_by(ROWS_PER_FLUSH) {
        let end = (start + ROWS_PER_FLUSH).min(rows);
        let mut lanes = [[0i64; K]; 5];
        let mut n = [0u64; K];
        // reach[g]: rows processed up to group g (positions < g·GROUP); index 0 stays empty.
        let mut reach = [0i64; 5];
        for row in start..end {
            let (admitted, accepted) = counts[row];
            let labeled = num_labeled(admitted, accepted);
            let raw: &[T; K] = features[row * K..row * K + K]
                .try_into()
                .expect("K columns");
            let x: [f64; K] = raw.map(|v| v.into().clamp(-limit, limit));
            let p: [f64; K] = match predictions {
                Predictions::Given(given) => {
                    let given: &[P; K] = given[row * K..row * K + K].try_into().expect("K columns");
                    given.map(Into::into)
                }
                Predictions::Current { slope, intercepts } => std::array::from_fn(|i| {
                    if i < labeled {
                        sigmoid(slope * x[i] + intercepts[i])
                    } else {
                        0.5
                    }
                }),
            };
            let (mask, y) = (&prefix[labeled], &prefix[accepted]);
            // Unlabeled slots past the last labeled one, in whole groups of 4, are skipped: they
            // would only add exact zeros.
            let upto = (labeled.div_ceil(GROUP) * GROUP).min(K);
            reach[upto.div_ceil(GROUP)] += 1;
            for i in 0..upto {
                let bits = scaled_term_bits(x[i], p[i], y[i], mask[i]);
                for (lane, b) in lanes.iter_mut().zip(bits) {
                    lane[i] = lane[i].wrapping_add(b);
                }
            }
            for count in &mut n[..labeled] {
                *count += 1;
            }
        }
        // Each lane summed `term·2^F + MAGIC` over the rows whose processed prefix reached its
        // position: `reach[g]` rows stopped after group g, so position i saw every row that
        // stopped after a later group.
        for (i, sums) in stats.positions.iter_mut().enumerate() {
            let rows_here: i64 = reach[i / GROUP + 1..].iter().sum();
            let offset = rows_here.wrapping_mul(MAGIC_BITS);
            let [a, b, c, g0, g1] = lanes.map(|lane| i128::from(lane[i].wrapping_sub(offset)));
            sums.merge(&PositionSums {
                a,
                b,
                c,
                g0,
                g1,
                n: n[i],
            });
        }
    }
}

fn dynamic<T: Copy + Into<f64>, P: Copy + Into<f64>>(
    k: usize,
    features: &[T],
    counts: &[(usize, usize)],
    predictions: Predictions<'_, P>,
    limit: f64,
    stats: &mut RoundStats,
) {
    for (row, &(admitted, accepted)) in counts.iter().enumerate() {
        let labeled = num_labeled(admitted, accepted);
        for (position, sums) in stats.positions[..labeled].iter_mut().enumerate() {
            let index = row * k + position;
            let x = features[index].into().clamp(-limit, limit);
            let p = match predictions {
                Predictions::Given(given) => given[index].into(),
                Predictions::Current { slope, intercepts } => {
                    sigmoid(slope * x + intercepts[position])
                }
            };
            sums.add_observation(x, p, position < accepted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::XorShift;
    use proptest::prelude::*;

    /// `features` (`k` per row) with one more column of 1.5 per row.
    fn features_wider(features: &[f32], k: usize) -> Vec<f32> {
        features
            .chunks_exact(k)
            .flat_map(|row| row.iter().copied().chain([1.5]))
            .collect()
    }

    proptest! {
        #[test]
        fn fixed_and_dynamic_kernels_agree_bit_for_bit(
            k in 1usize..=16,
            rows in proptest::collection::vec((0usize..=16, 0usize..=16), 0..40),
            seed in any::<u64>(),
            given in any::<bool>(),
        ) {
            let counts: Vec<(usize, usize)> = rows
                .iter()
                .map(|&(a, b)| {
                    let admitted = a % (k + 1);
                    (admitted, b % (admitted + 1))
                })
                .collect();
            let mut rng = XorShift::new(seed | 1);
            let mut next = || rng.unit_f64();
            let features: Vec<f32> = (0..counts.len() * k).map(|_| (next() * 120.0 - 60.0) as f32).collect();
            let probs: Vec<f64> = (0..counts.len() * k).map(|_| next()).collect();
            let intercepts: Vec<f64> = (0..k).map(|_| next() - 0.5).collect();
            let predictions = if given {
                Predictions::Given(&probs[..])
            } else {
                Predictions::Current { slope: 0.7, intercepts: &intercepts }
            };
            let fast = batch_stats(k, &features, &counts, predictions, 40.0);
            let mut slow = RoundStats::new(k);
            dynamic(k, &features, &counts, predictions, 40.0, &mut slow);
            prop_assert_eq!(&fast, &slow);
            // A kept scratch (observe's) holds the last step's sums, of another width: it is
            // emptied before the step is added.
            let other: Predictions<'_, f64> = Predictions::Current { slope: 0.3, intercepts: &[0.1; 17][..=k] };
            let mut kept = batch_stats(k + 1, &features_wider(&features, k), &counts, other, 40.0);
            batch_stats_into(k, &features, &counts, predictions, 40.0, &mut kept);
            prop_assert_eq!(kept, fast);
        }
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn batch_stats_example() {
        use crate::estimator::batch::{batch_stats, Predictions};

        // Two requests, K = 3: the first had 3 drafts verified and 1 accepted, the second 2 and 2.
        let features = [2.0f32, 1.0, 0.5, 3.0, 2.5, -1.0];
        let counts = [(3, 1), (2, 2)];
        let current = Predictions::Current {
            slope: 0.5,
            intercepts: &[-0.2; 3],
        };
        let stats = batch_stats::<f32, f64>(3, &features, &counts, current, 40.0);
        let labeled: Vec<u64> = stats.positions.iter().map(|p| p.n).collect();
        assert_eq!(labeled, [2, 2, 0]);
        // The same rows with explicit draft-time predictions.
        let given = Predictions::Given(&[0.7f32, 0.6, 0.5, 0.8, 0.7, 0.2]);
        assert_eq!(
            batch_stats(3, &features, &counts, given, 40.0).total_count(),
            4
        );
    }
}
