//! Unit tests of the map fit (moved out of map.rs: no Rust file over 900 lines outside
//! tests).

use super::*;
use crate::test_rng::XorShift;

/// A dense reference: the prior precision built by inverting the covariance
/// `σ₀² 11ᵀ + σ₁² zzᵀ + σ_b² I` with Gauss–Jordan, independently of the closed form.
fn precision_by_inversion(k: usize, w: &PriorWidths) -> Vec<f64> {
    let z: Vec<f64> = (0..k).map(|j| j as f64 - (k as f64 - 1.0) / 2.0).collect();
    let mut cov = vec![0.0; k * k];
    for i in 0..k {
        for j in 0..k {
            cov[i * k + j] = w.level_sd.powi(2)
                + w.trend_sd.powi(2) * z[i] * z[j]
                + if i == j { w.spread_sd.powi(2) } else { 0.0 };
        }
    }
    let mut inv = vec![0.0; k * k];
    for i in 0..k {
        inv[i * k + i] = 1.0;
    }
    for col in 0..k {
        let pivot = cov[col * k + col];
        for j in 0..k {
            cov[col * k + j] /= pivot;
            inv[col * k + j] /= pivot;
        }
        for row in 0..k {
            if row != col {
                let f = cov[row * k + col];
                for j in 0..k {
                    cov[row * k + j] -= f * cov[col * k + j];
                    inv[row * k + j] -= f * inv[col * k + j];
                }
            }
        }
    }
    inv
}

#[test]
fn the_closed_form_precision_inverts_the_hierarchical_covariance() {
    for k in [1usize, 2, 4, 7, 16] {
        for widths in [
            PriorWidths::DEFAULT,
            PriorWidths {
                trend_sd: 0.0,
                ..PriorWidths::DEFAULT
            },
            PriorWidths {
                slope_sd: 0.3,
                level_sd: 2.5,
                trend_sd: 0.7,
                spread_sd: 0.4,
            },
        ] {
            let prior = Prior::new(k, &widths, 0.5, -0.2);
            let want = precision_by_inversion(k, &widths);
            let dim = k + 1;
            for i in 0..k {
                for j in 0..k {
                    let got = prior.precision()[(i + 1) * dim + j + 1];
                    let w = want[i * k + j];
                    assert!((got - w).abs() <= 1e-8 * (1.0 + w.abs()), "{k} {i} {j}");
                }
                assert_eq!(prior.precision()[i + 1], 0.0);
            }
        }
    }
    // Infinite widths are the limits: no prior at all.
    let none = PriorWidths {
        slope_sd: f64::INFINITY,
        level_sd: 1.0,
        trend_sd: 0.2,
        spread_sd: f64::INFINITY,
    };
    assert!(Prior::new(4, &none, 0.5, -0.2)
        .precision()
        .iter()
        .all(|&p| p == 0.0));
}

/// `(H + P + λI)` restricted to the coordinates `index`, assembled entry by entry (row-major).
fn dense_system(t: &Terms, precision: &[f64], index: &[usize], l2: f64) -> Vec<f64> {
    let dim = t.g.len();
    let mut matrix = Vec::with_capacity(index.len() * index.len());
    for &i in index {
        for &j in index {
            let hessian = match (i, j) {
                (0, 0) => t.h00,
                (0, j) => t.h0k[j - 1],
                (i, 0) => t.h0k[i - 1],
                (i, j) if i == j => t.hkk[i - 1],
                _ => 0.0,
            };
            let ridge = if i == j { l2 } else { 0.0 };
            matrix.push(hessian + precision[i * dim + j] + ridge);
        }
    }
    matrix
}

/// The dense reference of [`fit`]: the same iteration with the system assembled as a dense
/// `(H + P + λI)_FF` and solved by Cholesky (how the fit was first written).
fn fit_dense(bins: &FitBins, prior: &Prior, start: &[f64], l2: f64) -> Fit {
    let k = bins.num_positions();
    let dim = k + 1;
    let precision = prior.precision();
    let mut theta = start.to_vec();
    let mut free: Vec<bool> = std::iter::once(true)
        .chain((0..k).map(|position| bins.has_labels(position)))
        .collect();
    let mut iterations = 0;
    while iterations < MAX_ITERATIONS {
        iterations += 1;
        let t = terms(bins, &theta);
        let index: Vec<usize> = (0..dim).filter(|&i| free[i]).collect();
        if index.is_empty() {
            break;
        }
        let mut matrix = dense_system(&t, &precision, &index, l2);
        let mut rhs: Vec<f64> = index
            .iter()
            .map(|&i| {
                let row = &precision[i * dim..(i + 1) * dim];
                let pull: f64 = (0..dim).map(|j| row[j] * (theta[j] - prior.mean[j])).sum();
                t.g[i] - pull
            })
            .collect();
        if !crate::estimator::cholesky::solve_spd(&mut matrix, &mut rhs)
            || !rhs.iter().all(|d| d.is_finite())
        {
            break;
        }
        let largest = rhs.iter().fold(0.0f64, |m, d| m.max(d.abs()));
        if largest > ITERATION_CAP {
            rhs.iter_mut().for_each(|d| *d *= ITERATION_CAP / largest);
        }
        for (&i, &d) in index.iter().zip(&rhs) {
            theta[i] += d;
        }
        if theta[0] < 0.0 {
            theta[0] = 0.0;
            free[0] = false;
        }
        if largest < TOLERANCE {
            break;
        }
    }
    Fit { theta, iterations }
}

/// Random histograms of `k` positions, some left empty, labels from a logistic curve whose
/// slope may be 0 or negative (so the fit's slope can hit its bound).
fn random_bins(rng: &mut XorShift, k: usize, binning: &Binning) -> FitBins {
    let mut round = HistogramStats::new(k, binning.bins());
    let slope = rng.unit_f64() * 1.6 - 0.4;
    let empty = rng.next_u64() % (k as u64 + 1);
    for _ in 0..(20 + rng.next_u64() % 800) {
        let position = (rng.next_u64() % k as u64) as usize;
        if (position as u64) < empty && k > 1 {
            continue;
        }
        let x = rng.unit_f64() * 16.0 - 6.0;
        let p = 1.0 / (1.0 + (-(slope * x + 0.8 - 0.3 * position as f64)).exp());
        round.add_observation(binning, position, x, rng.unit_f64() < p);
    }
    FitBins::gather(None, Some(&round), binning, k)
}

fn random_widths(rng: &mut XorShift) -> PriorWidths {
    let mut pick = |values: &[f64]| values[(rng.next_u64() % values.len() as u64) as usize];
    PriorWidths {
        slope_sd: pick(&[0.15, 0.05, 1.0, f64::INFINITY]),
        level_sd: pick(&[1.0, 0.3, 5.0, f64::INFINITY]),
        trend_sd: pick(&[0.2, 0.0, 1.0, f64::INFINITY]),
        spread_sd: pick(&[0.1, 0.02, 0.5, f64::INFINITY]),
    }
}

#[test]
fn the_structured_step_solves_the_dense_system() {
    // Against the dense (H + P + λI)_FF assembled entry by entry and solved by Cholesky, on
    // random Hessians, free sets (the slope held or not, positions without labels) and
    // prior widths, the infinite and zero limits included.
    let binning = Binning::new(40.0, 64);
    let mut rng = XorShift::new(7);
    for case in 0..400 {
        let k = 1 + (rng.next_u64() % 16) as usize;
        let bins = random_bins(&mut rng, k, &binning);
        let prior = Prior::new(k, &random_widths(&mut rng), 0.5, -0.2);
        let theta: Vec<f64> = (0..=k).map(|_| rng.unit_f64() * 2.0 - 1.0).collect();
        let t = terms(&bins, &theta);
        let mut free: Vec<bool> = std::iter::once(rng.next_u64() % 4 != 0)
            .chain((0..k).map(|j| bins.has_labels(j)))
            .collect();
        if case % 7 == 0 {
            free[1 + (rng.next_u64() % k as u64) as usize] = false;
        }
        let l2 = [1e-3, 0.0, 0.5][case % 3];
        let r: Vec<f64> = (0..=k).map(|_| rng.unit_f64() * 20.0 - 10.0).collect();
        let dim = k + 1;
        let precision = prior.precision();
        let index: Vec<usize> = (0..dim).filter(|&i| free[i]).collect();
        let mut matrix = dense_system(&t, &precision, &index, l2);
        let dense_matrix = matrix.clone();
        let mut dense: Vec<f64> = index.iter().map(|&i| r[i]).collect();
        let solved = crate::estimator::cholesky::solve_spd(&mut matrix, &mut dense);
        let step = newton_step(&t, &prior, &free, l2, &r);
        assert_eq!(step.is_some(), solved, "case {case}");
        let Some(step) = step else { continue };
        for (i, &d) in step.iter().enumerate() {
            if !free[i] {
                assert_eq!(d, 0.0, "case {case}: fixed coordinate {i} moved");
            }
        }
        // The residual of the dense system at the structured step, relative to its scale.
        let n = index.len();
        let scale = dense_matrix.iter().fold(0.0f64, |m, v| m.max(v.abs()))
            * step.iter().fold(0.0f64, |m, v| m.max(v.abs()))
            + r.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for row in 0..n {
            let lhs: f64 = (0..n)
                .map(|col| dense_matrix[row * n + col] * step[index[col]])
                .sum();
            let want = r[index[row]];
            assert!(
                (lhs - want).abs() <= 1e-10 * scale,
                "case {case} row {row}: {lhs} vs {want}"
            );
        }
        for (row, &i) in index.iter().enumerate() {
            let d = dense[row];
            assert!(
                (step[i] - d).abs() <= 1e-8 * (1.0 + d.abs()),
                "case {case}, coordinate {i}: {} vs {d}",
                step[i]
            );
        }
    }
}

#[test]
fn the_system_that_is_not_positive_definite_is_refused() {
    // Without prior and ridge: a position whose Hessian vanishes (a zero pivot), and a
    // slope coupled more strongly than its curvature allows (a negative Schur complement);
    // the dense Cholesky refuses both too. A ridge makes the first definite again.
    let none = PriorWidths {
        slope_sd: f64::INFINITY,
        level_sd: f64::INFINITY,
        trend_sd: f64::INFINITY,
        spread_sd: f64::INFINITY,
    };
    let prior = Prior::new(2, &none, 0.5, -0.2);
    let (all, r) = ([true; 3], [1.0; 3]);
    let zero_pivot = Terms {
        g: vec![0.0; 3],
        h00: 1.0,
        h0k: vec![0.0, 0.0],
        hkk: vec![0.0, 1.0],
    };
    assert!(newton_step(&zero_pivot, &prior, &all, 0.0, &r).is_none());
    assert!(newton_step(&zero_pivot, &prior, &all, 1e-3, &r).is_some());
    let indefinite = Terms {
        h0k: vec![2.0, 0.0],
        hkk: vec![1.0, 1.0],
        ..zero_pivot
    };
    assert!(newton_step(&indefinite, &prior, &all, 0.0, &r).is_none());
    let mut dense = [1.0, 2.0, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 1.0];
    assert!(!crate::estimator::cholesky::solve_spd(
        &mut dense,
        &mut [1.0; 3]
    ));
    // Holding the slope leaves a definite intercept block.
    assert!(newton_step(&indefinite, &prior, &[false, true, true], 0.0, &r).is_some());
}

#[test]
fn the_score_statistic_is_the_dense_arrowheads() {
    // Against the statistic of the same arrowhead solved by a dense Cholesky (the drift
    // test's shared `drift_statistic`), positions without labels included.
    use crate::estimator::memory::drift_statistic;
    use crate::estimator::refit::ArrowheadSystem;
    let binning = Binning::new(40.0, 64);
    let mut rng = XorShift::new(5);
    for case in 0..200 {
        let k = 1 + (rng.next_u64() % 16) as usize;
        let bins = random_bins(&mut rng, k, &binning);
        let theta: Vec<f64> = (0..=k).map(|_| rng.unit_f64() * 2.0 - 1.0).collect();
        let l2 = [1e-3, 0.5][case % 2];
        let t = terms(&bins, &theta);
        let dense = drift_statistic(&ArrowheadSystem {
            a: t.h00 + l2,
            b: t.h0k.clone(),
            c: t.hkk.iter().map(|c| c + l2).collect(),
            g0: t.g[0],
            g1: t.g[1..].to_vec(),
            total: 0.0,
            counts: vec![0.0; k],
        });
        let ours = score_statistic(&bins, &theta, l2);
        assert!(
            (ours - dense).abs() <= 1e-9 * (1.0 + dense.abs()),
            "case {case}: {ours} vs {dense}"
        );
    }
    // Without a ridge, a position with no label leaves the system singular: ∞, as before.
    let mut round = HistogramStats::new(2, 64);
    round.add_observation(&binning, 0, 1.0, true);
    let bins = FitBins::gather(None, Some(&round), &binning, 2);
    assert_eq!(score_statistic(&bins, &[0.5, 0.0, 0.0], 0.0), f64::INFINITY);
}

#[test]
fn the_fit_matches_its_dense_reference() {
    let binning = Binning::new(40.0, 64);
    let mut rng = XorShift::new(11);
    for case in 0..200 {
        let k = 1 + (rng.next_u64() % 16) as usize;
        let bins = random_bins(&mut rng, k, &binning);
        let prior = Prior::new(k, &random_widths(&mut rng), 0.5, -0.2);
        let start: Vec<f64> = (0..=k).map(|_| rng.unit_f64() * 2.0 - 1.0).collect();
        let l2 = [1e-3, 0.0][case % 2];
        let (ours, dense) = (
            fit(&bins, &prior, &start, l2),
            fit_dense(&bins, &prior, &start, l2),
        );
        for (a, b) in ours.theta.iter().zip(&dense.theta) {
            assert!(
                (a - b).abs() <= 1e-8 * (1.0 + b.abs()),
                "case {case}: {a} vs {b}"
            );
        }
        assert!(
            ours.iterations.abs_diff(dense.iterations) <= 1,
            "case {case}: {} vs {} iterations",
            ours.iterations,
            dense.iterations
        );
    }
}

#[test]
fn the_fit_solves_the_map_equations() {
    // At the returned θ the penalized score vanishes (to the tolerance), checked on random
    // histograms with a dense evaluation of the score independent of `terms`.
    let binning = Binning::new(40.0, 64);
    for seed in 0..20u64 {
        let mut rng = XorShift::new(seed + 1);
        let k = 1 + (seed % 5) as usize;
        let mut round = HistogramStats::new(k, 64);
        for _ in 0..400 {
            let position = (rng.next_u64() % k as u64) as usize;
            let x = rng.unit_f64() * 12.0 - 4.0;
            let p = 1.0 / (1.0 + (-(0.55 * x + 0.3 - 0.2 * position as f64)).exp());
            round.add_observation(&binning, position, x, rng.unit_f64() < p);
        }
        let bins = FitBins::gather(None, Some(&round), &binning, k);
        let prior = Prior::new(k, &PriorWidths::DEFAULT, 0.5, -0.2);
        let start: Vec<f64> = std::iter::once(0.5).chain(vec![-0.2; k]).collect();
        let result = fit(&bins, &prior, &start, 0.0);
        assert!(result.iterations < MAX_ITERATIONS, "seed {seed}");
        let theta = &result.theta;
        let dim = k + 1;
        let mut score = vec![0.0; dim];
        for position in 0..k {
            for i in bins.starts[position]..bins.starts[position + 1] {
                let z = theta[0] * bins.x[i] + theta[position + 1];
                let r = bins.a[i] - bins.n[i] / (1.0 + (-z).exp());
                score[0] += r * bins.x[i];
                score[position + 1] += r;
            }
        }
        for (i, s) in score.iter().enumerate() {
            let pull: f64 = (0..dim)
                .map(|j| prior.precision()[i * dim + j] * (theta[j] - prior.mean[j]))
                .sum();
            assert!((s - pull).abs() < 1e-6, "seed {seed}, coordinate {i}");
        }
    }
}

/// `terms` as it was written before its groups were vectorized: lane `i % 4` per bin of
/// the whole groups, the remainder's bin `i` on lane `i − whole`, one bin at a time.
fn terms_one_bin_at_a_time(bins: &FitBins, theta: &[f64]) -> Terms {
    let k = bins.num_positions();
    let slope = theta[0];
    let mut out = Terms {
        g: vec![0.0; k + 1],
        h00: 0.0,
        h0k: vec![0.0; k],
        hkk: vec![0.0; k],
    };
    let (mut g0, mut h00) = ([0.0; LANES], [0.0; LANES]);
    for position in 0..k {
        let beta = theta[position + 1];
        let range = bins.starts[position]..bins.starts[position + 1];
        let (n, a, x) = (
            &bins.n[range.clone()],
            &bins.a[range.clone()],
            &bins.x[range],
        );
        let (mut r_sum, mut wx_sum, mut w_sum) = ([0.0; LANES], [0.0; LANES], [0.0; LANES]);
        let whole = n.len() / LANES * LANES;
        for i in 0..n.len() {
            let l = if i < whole { i % LANES } else { i - whole };
            let e = exp_neg(slope * x[i] + beta);
            let p = 1.0 / (1.0 + e);
            let q = e * p;
            let w = n[i] * p * q;
            let r = a[i] - n[i] * p;
            let wx = w * x[i];
            g0[l] += r * x[i];
            h00[l] += wx * x[i];
            r_sum[l] += r;
            wx_sum[l] += wx;
            w_sum[l] += w;
        }
        out.g[position + 1] = combine(r_sum);
        out.h0k[position] = combine(wx_sum);
        out.hkk[position] = combine(w_sum);
    }
    out.g[0] = combine(g0);
    out.h00 = combine(h00);
    out
}

#[test]
fn every_variant_of_terms_gives_the_bits_of_one_bin_at_a_time() {
    let binning = Binning::new(40.0, 64);
    let bits = |t: &Terms| {
        let mut all = vec![t.h00.to_bits()];
        all.extend(t.g.iter().chain(&t.h0k).chain(&t.hkk).map(|v| v.to_bits()));
        all
    };
    for seed in 0..30u64 {
        let mut rng = XorShift::new(seed + 7);
        let k = 1 + (seed % 7) as usize;
        let mut round = HistogramStats::new(k, 64);
        // From a handful of labels (positions with 0–3 bins: only the remainder) to many.
        for _ in 0..(seed * seed * 3) {
            let position = (rng.next_u64() % k as u64) as usize;
            let x = (rng.unit_f64() - 0.4) * 30.0;
            round.add_observation(&binning, position, x, rng.unit_f64() < 0.6);
        }
        let mut memory = HistogramMemory::new(k, 64);
        memory.add_round(&round, &binning);
        memory.decay(0.8);
        let bins = FitBins::gather(Some(&memory), Some(&round), &binning, k);
        let theta: Vec<f64> = (0..=k).map(|i| 0.5 - 0.3 * i as f64).collect();
        let want = bits(&terms_one_bin_at_a_time(&bins, &theta));
        for level in crate::simd::available() {
            assert_eq!(
                bits(&terms_at(level, &bins, &theta)),
                want,
                "{level:?}, {seed}"
            );
        }
        assert_eq!(bits(&terms(&bins, &theta)), want);
    }
}

#[test]
fn positions_without_labels_keep_their_intercept_bit_for_bit() {
    let binning = Binning::new(40.0, 64);
    let mut round = HistogramStats::new(3, 64);
    for i in 0..30 {
        round.add_observation(&binning, 0, f64::from(i) / 5.0 - 2.0, i % 3 != 0);
    }
    let bins = FitBins::gather(None, Some(&round), &binning, 3);
    let prior = Prior::new(3, &PriorWidths::DEFAULT, 0.5, -0.2);
    let start = [0.5, -0.2, 0.123_456_789, -1.75];
    let result = fit(&bins, &prior, &start, 1e-3);
    assert_ne!(result.theta[1], -0.2);
    assert_eq!(result.theta[2].to_bits(), start[2].to_bits());
    assert_eq!(result.theta[3].to_bits(), start[3].to_bits());
}
