//! The examples of this module's items, which doctests cannot reach (the module is private):
//! the same code, run as unit tests.

#[test]
fn priorwidths_example() {
    use crate::estimator::map::{Prior, PriorWidths};

    let prior = Prior::new(1, &PriorWidths::DEFAULT, 0.5, -0.2);
    // K = 1: β = level + ε, so its precision is 1 / (σ₀² + σ_b²).
    assert!((prior.precision()[3] - 1.0 / (1.0 + 0.01)).abs() < 1e-12);
    assert!((prior.precision()[0] - 1.0 / 0.0225).abs() < 1e-9); // 1 / 0.15²
    assert_eq!(prior.mean, [0.5, -0.2]);
}

#[test]
fn gather_example() {
    use crate::estimator::histogram::{Binning, HistogramStats};
    use crate::estimator::map::FitBins;

    let binning = Binning::new(40.0, 64);
    let mut round = HistogramStats::new(2, 64);
    round.add_observation(&binning, 1, 2.0, true); // bin 33: [1.25, 2.5)
    round.add_observation(&binning, 1, 2.4, false);
    let bins = FitBins::gather(None, Some(&round), &binning, 2);
    assert_eq!(bins.starts, [0, 0, 1]); // one non-empty bin, at position 1
    assert_eq!((bins.n[0], bins.a[0]), (2.0, 1.0));
    assert!((bins.x[0] - 2.2).abs() < 1e-4);
}

#[test]
fn terms_example() {
    use crate::estimator::histogram::{Binning, HistogramStats};
    use crate::estimator::map::{terms, FitBins};

    let binning = Binning::new(40.0, 64);
    let mut round = HistogramStats::new(1, 64);
    round.add_observation(&binning, 0, 0.0, true);
    round.add_observation(&binning, 0, 0.0, false);
    let bins = FitBins::gather(None, Some(&round), &binning, 1);
    let t = terms(&bins, &[0.5, 0.0]); // p = 1/2 at x = 0
    assert_eq!((t.g[1], t.hkk[0]), (0.0, 0.5)); // r = 1 − 2·½; w = 2·¼
}

#[test]
fn fit_example() {
    use crate::estimator::histogram::{Binning, HistogramStats};
    use crate::estimator::map::{fit, FitBins, Prior, PriorWidths};

    // Confident drafts accepted, unsure ones rejected: the slope rises from the prior's 0.5.
    let binning = Binning::new(40.0, 64);
    let mut round = HistogramStats::new(1, 64);
    for _ in 0..50 {
        round.add_observation(&binning, 0, 4.0, true);
        round.add_observation(&binning, 0, -4.0, false);
    }
    let bins = FitBins::gather(None, Some(&round), &binning, 1);
    let prior = Prior::new(1, &PriorWidths::DEFAULT, 0.5, -0.2);
    let result = fit(&bins, &prior, &[0.5, -0.2], 1e-3);
    assert!(result.theta[0] > 0.5 && result.iterations <= 16);
}
