//! The map update's observe through the public API, against references written here from the
//! documented rules (docs/estimator.md, "Bin of a feature"): every labeled draft lands in bin
//! `min(B − 1, ⌊(clamp(x, ±L) + L) · B / (2L)⌋)` with offset `round-half-even((clamp(x) + L) ·
//! 2^16)`, whichever path observe takes (few labeled drafts or many, f32 or f64), and a
//! non-finite feature anywhere in a step, labeled or not, refuses the whole step by name and
//! changes nothing.

use av_core::estimator::HistogramStats;
use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};

const NO_PREDICTIONS: Option<MatrixView<'static, f64>> = None;

/// A map estimator of `k` positions and `bins` bins over `±limit`, refitted only on request (so
/// its open round is exactly the steps observed).
fn manual_map(k: usize, bins: usize, limit: f64) -> AcceptanceEstimator {
    let mut config = EstimatorConfig::map(k);
    config.bins = bins;
    config.max_log_odds = limit;
    config.refit_interval = None;
    AcceptanceEstimator::new(config).unwrap()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A feature meant to break binning: a bin edge or a clamp bound (give or take one ulp),
/// huge, tiny, subnormal, signed zero, or an ordinary value.
fn adversarial(rng: &mut Rng, limit: f64, bins: usize) -> f64 {
    // A neighbour of `x` a few ulps away (of zero: the smallest subnormals).
    let nudge = |x: f64, ulps: i64| {
        if x == 0.0 {
            ulps as f64 * 5e-324
        } else {
            f64::from_bits((x.to_bits() as i64 + ulps) as u64)
        }
    };
    let edge = -limit + rng.below(bins as u64 + 1) as f64 * (2.0 * limit / bins as f64);
    match rng.below(6) {
        0 => edge,
        1 => nudge(edge, rng.below(3) as i64 - 1),
        2 => nudge(
            [limit, -limit][rng.below(2) as usize],
            rng.below(5) as i64 - 2,
        ),
        3 => [
            1e300,
            -1e300,
            f64::MAX,
            -f64::MAX,
            3.4e38,
            -3.4e38,
            1e-310,
            -1e-310,
            5e-324,
            0.0,
            -0.0,
        ][rng.below(11) as usize],
        4 => (rng.unit() - 0.5) * 1e6,
        _ => (rng.unit() - 0.5) * 3.0 * limit,
    }
}

/// The histograms of one step built one labeled draft at a time from the documented rule.
fn reference(
    k: usize,
    bins: usize,
    limit: f64,
    features: &[f64],
    admitted: &[i64],
    accepted: &[i64],
) -> HistogramStats {
    let mut stats = HistogramStats::new(k, bins);
    let scale = bins as f64 / (2.0 * limit);
    for (row, (&ad, &ac)) in admitted.iter().zip(accepted).enumerate() {
        // The accepted drafts and the first rejection are labeled.
        let labeled = ad.min(ac + 1) as usize;
        for position in 0..labeled {
            let u = features[row * k + position].clamp(-limit, limit) + limit;
            let bin = ((u * scale).floor() as usize).min(bins - 1);
            let index = position * bins + bin;
            stats.count[index] += 1;
            stats.accepted[index] += u64::from((position as i64) < ac);
            stats.x_sum[index] += (u * 65536.0).round_ties_even() as u64;
        }
    }
    stats
}

/// Counts of `rows` requests: every draft labeled, none, one a request, or at random.
fn counts(rng: &mut Rng, rows: usize, k: usize, pattern: u64) -> (Vec<i64>, Vec<i64>) {
    (0..rows)
        .map(|_| match pattern {
            0 => (k as i64, k as i64),
            1 => (0, 0),
            2 => (1, 0),
            3 => (k as i64, 0),
            _ => {
                let ad = rng.below(k as u64 + 1) as i64;
                (ad, rng.below(ad as u64 + 1) as i64)
            }
        })
        .unzip()
}

/// `features` (`[R, K]`) with counts `step` through `step_histogram`, and through `observe` into
/// the open round of a fresh estimator of `K` positions and `B` bins over `±L`: both `expected`.
fn check<T: Copy + Into<f64>>(
    features: &[T],
    (k, bins, limit): (usize, usize, f64),
    (admitted, accepted): (&[i64], &[i64]),
    expected: &HistogramStats,
    what: &str,
) {
    let est = manual_map(k, bins, limit);
    let view = MatrixView::new("features", features, features.len() / k, k).unwrap();
    let got = est
        .step_histogram(view, admitted, accepted, NO_PREDICTIONS)
        .unwrap();
    assert_eq!(&got, expected, "{what}: step_histogram");
    est.observe(view, admitted, accepted, NO_PREDICTIONS)
        .unwrap();
    let state = est.state();
    assert_eq!(
        &state.update.as_map().unwrap().round,
        expected,
        "{what}: observe"
    );
}

#[test]
fn adversarial_features_bin_as_the_documented_rule_on_every_path() {
    let mut rng = Rng(0x5DEE_CE66_D1CE_5EED);
    for (k, bins) in [(1, 1), (1, 1024), (3, 7), (8, 64), (64, 1), (64, 1024)] {
        for limit in [40.0, 1.0, 100.0, 7.3] {
            for pattern in 0..5 {
                let rows = [1, 9, 70][rng.below(3) as usize];
                let features: Vec<f64> = (0..rows * k)
                    .map(|_| adversarial(&mut rng, limit, bins))
                    .collect();
                let (admitted, accepted) = counts(&mut rng, rows, k, pattern);
                // Past f32's range the narrow copy takes f32's largest value, keeping the sign.
                let narrow: Vec<f32> = features
                    .iter()
                    .map(|&x| match x as f32 {
                        n if n.is_finite() => n,
                        n => f32::MAX.copysign(n),
                    })
                    .collect();
                let widened: Vec<f64> = narrow.iter().map(|&x| f64::from(x)).collect();
                let what = format!("K = {k}, B = {bins}, L = {limit}, counts {pattern}");
                let expected = reference(k, bins, limit, &features, &admitted, &accepted);
                let (layout, step) = ((k, bins, limit), (&admitted[..], &accepted[..]));
                check(&features, layout, step, &expected, &format!("{what}, f64"));
                let expected = reference(k, bins, limit, &widened, &admitted, &accepted);
                check(&narrow, layout, step, &expected, &format!("{what}, f32"));
            }
        }
    }
}

#[test]
fn a_non_finite_feature_anywhere_refuses_the_step_and_changes_nothing() {
    // Labeled or not, in a step with few labeled drafts or many: the call names `features` and
    // the flat index, and the estimator's bytes and its next step are as if it never happened.
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    for k in [1usize, 3, 8, 64] {
        for pattern in 0..5 {
            let rows = [1usize, 6, 40][rng.below(3) as usize];
            let good: Vec<f64> = (0..rows * k).map(|_| (rng.unit() - 0.5) * 30.0).collect();
            let (admitted, accepted) = counts(&mut rng, rows, k, pattern);
            let next: Vec<f64> = (0..rows * k).map(|_| (rng.unit() - 0.5) * 30.0).collect();
            let reference = manual_map(k, 64, 40.0);
            let view = MatrixView::new("features", &next, rows, k).unwrap();
            reference
                .observe(view, &admitted, &accepted, NO_PREDICTIONS)
                .unwrap();
            let flat = rows * k;
            for place in [0, flat / 2, flat - 1, rng.below(flat as u64) as usize] {
                for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                    let what = format!("K = {k}, counts {pattern}, {bad} at {place}");
                    let mut features = good.clone();
                    features[place] = bad;
                    let narrow: Vec<f32> = features.iter().map(|&x| x as f32).collect();
                    let est = manual_map(k, 64, 40.0);
                    let before = est.to_bytes();
                    let wide = MatrixView::new("features", &features, rows, k).unwrap();
                    let f32_view = MatrixView::new("features", &narrow, rows, k).unwrap();
                    let errors = [
                        est.observe(wide, &admitted, &accepted, NO_PREDICTIONS)
                            .unwrap_err(),
                        est.observe(f32_view, &admitted, &accepted, NO_PREDICTIONS)
                            .unwrap_err(),
                        est.add_observations(wide, &admitted, &accepted, NO_PREDICTIONS)
                            .unwrap_err(),
                        est.step_histogram(wide, &admitted, &accepted, NO_PREDICTIONS)
                            .unwrap_err(),
                    ];
                    for error in errors {
                        assert_eq!(error.argument, "features", "{what}: {error}");
                        let at = format!("at flat index {place}");
                        assert!(error.message.contains(&at), "{what}: {error}");
                    }
                    assert!(est.to_bytes() == before, "{what}: the state changed");
                    let view = MatrixView::new("features", &next, rows, k).unwrap();
                    est.observe(view, &admitted, &accepted, NO_PREDICTIONS)
                        .unwrap();
                    assert!(
                        est.to_bytes() == reference.to_bytes(),
                        "{what}: the next step differs"
                    );
                }
            }
        }
    }
}
