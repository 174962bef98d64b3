//! Unit tests of the histograms (moved out of histogram.rs: no Rust file over 900 lines
//! outside tests).

use super::*;
use crate::test_rng::XorShift;
use proptest::prelude::*;

#[test]
fn bins_are_equal_and_cover_the_clamped_range() {
    let binning = Binning::new(40.0, 64);
    for i in 0..=6400 {
        let x = -40.0 + f64::from(i) * 0.0125;
        let (bin, offset) = binning.locate(x);
        // An independent statement of the rule: ⌊(x + 40) / 1.25⌋, the last bin closed.
        let expect = (((x + 40.0) / 1.25).floor() as usize).min(63);
        assert!(
            bin == expect || ((x + 40.0) / 1.25).fract().abs() < 1e-12,
            "{x}"
        );
        assert!((offset as f64 / X_SCALE - (x + 40.0)).abs() <= 0.5 / X_SCALE + 1e-12);
        let (lo, hi) = binning.offset_range(bin);
        assert!(
            lo <= x + 40.0 && x + 40.0 <= hi,
            "{x} in bin {bin}: [{lo}, {hi}]"
        );
    }
    assert_eq!(binning.locate(f64::NAN).0, 0);
    assert_eq!(binning.locate(f64::INFINITY), binning.locate(40.0));
}

#[test]
fn locate_all_is_locate_bit_for_bit() {
    // The vectorized pass observe bins with against the scalar rule, on every bin edge (and
    // the floats either side of it), the clamp's edges, zeros, subnormals, huge values and
    // random features, for several bin counts and limits, on every vector unit this CPU has
    // (the SSE2 baseline and, where present, the AVX2 variant).
    let mut rng = XorShift::new(11);
    let levels = crate::simd::available();
    let cases = [(40.0, 64), (40.0, 1), (40.0, 7), (3.5, 1024), (100.0, 113)];
    for (level, (limit, bins)) in levels.iter().flat_map(|&l| cases.map(|c| (l, c))) {
        let binning = Binning::new(limit, bins);
        let mut xs: Vec<f64> = vec![0.0, -0.0, f64::MIN_POSITIVE, -1e-310, 1e300, -1e300];
        // A float and its neighbours (by bits; `next_up` is newer than the crate's MSRV).
        let around = |x: f64| {
            let bits = x.to_bits();
            [
                x,
                f64::from_bits(bits.wrapping_add(1)),
                f64::from_bits(bits.wrapping_sub(1)),
            ]
        };
        for x in [-limit, limit] {
            xs.extend(around(x));
        }
        for b in 0..=bins {
            let edge = b as f64 * 2.0 * limit / bins as f64 - limit;
            // The edge in `x`, and the `x` whose `u = x + L` lands on the edge in `u`.
            xs.extend(around(edge));
            xs.extend(around(b as f64 / binning.scale - limit));
        }
        xs.extend((0..5000).map(|_| (rng.unit_f64() - 0.5) * 3.0 * limit));
        xs.retain(|x| x.is_finite()); // the neighbour below 0.0's bits is a NaN
        xs.push(f64::INFINITY);
        xs.push(f64::NEG_INFINITY);
        let (mut got_bins, mut got_offsets) = (vec![0u32; xs.len()], vec![0u64; xs.len()]);
        assert!(!binning.locate_all_at(level, &xs, &mut got_bins, &mut got_offsets));
        let finite = xs.len() - 2;
        assert!(binning.locate_all_at(level, &xs[..finite], &mut got_bins, &mut got_offsets));
        for (i, &x) in xs.iter().enumerate() {
            let (bin, offset) = binning.locate(x);
            assert_eq!(
                (got_bins[i] as usize, got_offsets[i]),
                (bin, offset),
                "{x:e} on {level:?}"
            );
        }
        // f32 features (what the bindings pass) go through the same conversion.
        let xs32: Vec<f32> = xs[..finite]
            .iter()
            .map(|&x| x as f32)
            .filter(|x| x.is_finite())
            .collect();
        assert!(binning.locate_all_at(level, &xs32, &mut got_bins, &mut got_offsets));
        for (i, &x) in xs32.iter().enumerate() {
            let (bin, offset) = binning.locate(f64::from(x));
            assert_eq!(
                (got_bins[i] as usize, got_offsets[i]),
                (bin, offset),
                "{x:e} on {level:?}"
            );
        }
        // A NaN is not finite, and lands in range.
        let mut nan = [0.0, f64::NAN, 1.0];
        assert!(!binning.locate_all_at(level, &nan, &mut got_bins, &mut got_offsets));
        assert!((got_bins[1] as usize) < bins);
        nan[1] = 2.0;
        assert!(binning.locate_all_at(level, &nan, &mut got_bins, &mut got_offsets));
    }
}

#[test]
fn a_refused_add_leaves_no_trace_in_bins_before_the_full_one() {
    // Bins 0 and 1 are added before bin 2 is found full: they must come back out, from the
    // round and from the bound's count (a later add filling bin 0 to the bound fits).
    let binning = Binning::new(40.0, 4);
    let x_of = |bin: usize| -40.0 + 20.0 * bin as f64 + 1.0;
    for observe_path in [false, true] {
        let acc = HistogramAccumulator::new(1, 4);
        let mut full = HistogramStats::new(1, 4);
        full.add_observation(&binning, 0, x_of(2), true);
        full.count[2] = MAX_BIN_COUNT;
        full.accepted[2] = 0;
        full.x_sum[2] *= MAX_BIN_COUNT;
        acc.try_add(&full).unwrap();
        let mut step = StepHistogram::new(1, 4);
        let mut stats = HistogramStats::new(1, 4);
        for bin in 0..4 {
            let (b, offset) = binning.locate(x_of(bin));
            assert_eq!(b, bin);
            step.add(bin, true, offset);
            stats.add_observation(&binning, 0, x_of(bin), true);
        }
        let refused = if observe_path {
            acc.try_add_step(&step)
        } else {
            acc.try_add(&stats)
        };
        assert_eq!(refused, Err((0, 2)));
        let mut round = HistogramStats::new(1, 4);
        acc.drain_into(&mut round);
        assert_eq!(round, full, "the refused add left something behind");
        let mut fill = HistogramStats::new(1, 4);
        fill.add_observation(&binning, 0, x_of(0), false);
        fill.count[0] = MAX_BIN_COUNT;
        fill.x_sum[0] *= MAX_BIN_COUNT;
        assert_eq!(
            acc.try_add(&fill),
            Ok(()),
            "bin 0's refused label still counts"
        );
        assert_eq!(acc.try_add(&stats), Err((0, 0)));
    }
}

#[test]
fn impossible_histograms_are_refused() {
    let binning = Binning::new(40.0, 8);
    let mut good = HistogramStats::new(2, 8);
    let mut rng = XorShift::new(5);
    for _ in 0..100 {
        let x = rng.unit_f64() * 100.0 - 50.0;
        good.add_observation(&binning, 1, x, rng.next_u64() & 1 == 1);
    }
    assert!(good.validate("r", 2, 8, 40.0).is_ok());
    // Position 1, bin 4: features in [0, 10), none clamped (so an x_sum of 0 is impossible).
    let occupied = 8 + 4;
    assert!(good.count[occupied] > 0);
    let empty = good.count.iter().position(|&c| c == 0).unwrap();
    type Corruption = fn(&mut HistogramStats, usize, usize);
    let cases: [Corruption; 6] = [
        |h, o, _| h.accepted[o] = h.count[o] + 1,
        |h, _, e| h.x_sum[e] = 1,
        |h, o, _| h.x_sum[o] += 1 << 30,
        |h, o, _| h.x_sum[o] = 0,
        |h, o, _| h.count[o] = MAX_BIN_COUNT + 1,
        |h, _, _| {
            h.count.pop();
        },
    ];
    for (i, corrupt) in cases.iter().enumerate() {
        let mut bad = good.clone();
        corrupt(&mut bad, occupied, empty);
        let bins_ok = bad.count.len() == 16;
        let error = bad.validate("r", 2, 8, 40.0).unwrap_err();
        assert_eq!(error.argument, "r", "case {i}");
        assert!(bins_ok || error.message.contains("entries"), "case {i}");
    }
    assert!(good.validate("r", 3, 8, 40.0).is_err());
    assert!(good.validate("r", 2, 16, 40.0).is_err());
}

proptest! {
    #[test]
    fn any_order_and_split_gives_the_same_bits(
        seed in any::<u64>(), n in 0usize..200, split in 0usize..200, bins in 1usize..80,
    ) {
        let binning = Binning::new(40.0, bins);
        let mut rng = XorShift::new(seed | 1);
        let obs: Vec<(usize, f64, bool)> = (0..n)
            .map(|_| ((rng.next_u64() % 3) as usize, rng.unit_f64() * 120.0 - 60.0,
                      rng.next_u64() & 1 == 0))
            .collect();
        let mut whole = HistogramStats::new(3, bins);
        for &(k, x, y) in &obs {
            whole.add_observation(&binning, k, x, y);
        }
        let cut = split.min(n);
        let (mut a, mut b) = (HistogramStats::new(3, bins), HistogramStats::new(3, bins));
        for &(k, x, y) in obs[..cut].iter().rev() {
            a.add_observation(&binning, k, x, y);
        }
        for &(k, x, y) in &obs[cut..] {
            b.add_observation(&binning, k, x, y);
        }
        let acc = HistogramAccumulator::new(3, bins);
        acc.add(&b);
        acc.add(&a);
        let mut drained = HistogramStats::new(3, bins);
        acc.drain_into(&mut drained);
        prop_assert_eq!(&drained, &whole);
        prop_assert!(whole.validate("r", 3, bins, 40.0).is_ok());
        let mut memory = HistogramMemory::new(3, bins);
        memory.add_round(&whole, &binning);
        prop_assert!(memory.validate(3, bins, 0.8, 40.0).is_ok());
        // The memory's feature sums are the features' sums, to the fixed point's rounding.
        for k in 0..3 {
            let exact: f64 = obs.iter().filter(|o| o.0 == k).map(|o| o.1.clamp(-40.0, 40.0)).sum();
            let kept: f64 = memory.x_sum[k * bins..(k + 1) * bins].iter().sum();
            prop_assert!((exact - kept).abs() <= 1e-9 * (1.0 + exact.abs()) + n as f64 / X_SCALE);
        }
    }
}

#[test]
fn a_step_histogram_lists_its_occupied_bins_and_clears_to_empty() {
    // A reused step histogram against the column histograms built draft by draft: the same
    // sums, the occupied bins each listed once (the bins with a count, found by a scan here),
    // and after `clear` nothing left, over several layouts (the last bin included).
    let mut rng = XorShift::new(23);
    for (k, bins) in [(1, 1), (3, 7), (2, 64), (8, 64), (5, 113)] {
        let binning = Binning::new(40.0, bins);
        let mut step = StepHistogram::new(k, bins);
        for round in 0..4 {
            let mut expected = HistogramStats::new(k, bins);
            // Sparse and dense rounds, the last bin of the last position included.
            let drafts = [3, 40, 500, 1][round];
            for i in 0..drafts {
                let position = (rng.next_u64() % k as u64) as usize;
                let x = if i == 0 {
                    40.0
                } else {
                    rng.unit_f64() * 100.0 - 50.0
                };
                let position = if i == 0 { k - 1 } else { position };
                let accepted = rng.next_u64() & 1 == 1;
                let (bin, offset) = binning.locate(x);
                step.add(position * bins + bin, accepted, offset);
                expected.add_observation(&binning, position, x, accepted);
            }
            let scanned: Vec<usize> = (0..k * bins).filter(|&i| expected.count[i] > 0).collect();
            let mut listed: Vec<usize> = step.occupied().collect();
            listed.sort_unstable();
            assert_eq!(listed, scanned, "{k}x{bins}");
            for &index in &scanned {
                let sums = [
                    expected.count[index],
                    expected.accepted[index],
                    expected.x_sum[index],
                ];
                assert_eq!(step.sums(index), sums);
            }
            assert_eq!(step.clone().into_stats(), expected);
            step.clear();
            assert_eq!(step.occupied().count(), 0, "{k}x{bins}");
            assert_eq!(step.clone().into_stats(), HistogramStats::new(k, bins));
            assert!((0..k * bins).all(|i| step.sums(i) == [0; 3]), "{k}x{bins}");
        }
    }
}

#[test]
fn a_step_refused_at_the_bound_names_its_first_full_bin_whatever_the_order_it_was_built_in() {
    // Bins 1 and 2 of 4 are full; the step reaches them in descending order (bin 2 first): the
    // error names bin 1, the first in (k, b) order, and the open round keeps nothing of it.
    let binning = Binning::new(40.0, 4);
    let x_of = |bin: usize| -40.0 + 20.0 * bin as f64 + 1.0;
    let acc = HistogramAccumulator::new(1, 4);
    let mut full = HistogramStats::new(1, 4);
    for bin in [1, 2] {
        full.add_observation(&binning, 0, x_of(bin), false);
        full.count[bin] = MAX_BIN_COUNT;
        full.x_sum[bin] *= MAX_BIN_COUNT;
    }
    acc.try_add(&full).unwrap();
    let mut step = StepHistogram::new(1, 4);
    for bin in [3, 2, 1, 0] {
        let (b, offset) = binning.locate(x_of(bin));
        step.add(b, true, offset);
    }
    assert_eq!(step.occupied().collect::<Vec<_>>(), [3, 2, 1, 0]);
    assert_eq!(acc.try_add_step(&step), Err((0, 1)));
    let mut round = HistogramStats::new(1, 4);
    acc.drain_into(&mut round);
    assert_eq!(round, full, "the refused add left something behind");
}

#[test]
fn every_vector_unit_locates_labeled_rows_like_one_draft_at_a_time() {
    // `locate_rows` on every variant this CPU runs against the column histograms built draft
    // by draft with `locate`: float32 and float64 features (the clamp's edges and beyond
    // included), rows with nothing, some and every position labeled, and a non-finite feature
    // at a labeled place (reported) and at an unlabeled one (not read).
    let mut rng = XorShift::new(59);
    for (k, bins) in [(1, 1), (3, 7), (8, 64), (5, 113)] {
        let binning = Binning::new(40.0, bins);
        let rows = 37;
        let features: Vec<f64> = (0..rows * k)
            .map(|i| match i % 11 {
                0 => 40.0,
                1 => -40.0,
                2 => 1e6,
                _ => rng.unit_f64() * 100.0 - 50.0,
            })
            .collect();
        let admitted: Vec<i64> = (0..rows)
            .map(|_| (rng.next_u64() % (k as u64 + 1)) as i64)
            .collect();
        let accepted: Vec<i64> = admitted
            .iter()
            .map(|&a| (rng.next_u64() % (a as u64 + 1)) as i64)
            .collect();
        let mut expected = HistogramStats::new(k, bins);
        for row in 0..rows {
            let (a, c) = (admitted[row] as usize, accepted[row] as usize);
            for position in 0..k {
                if let Some(label) = crate::estimator::labels::label(position, a, c) {
                    let x = features[row * k + position];
                    expected.add_observation(&binning, position, x, label);
                }
            }
        }
        let narrow: Vec<f32> = features.iter().map(|&x| x as f32).collect();
        let mut expected32 = HistogramStats::new(k, bins);
        for row in 0..rows {
            let (a, c) = (admitted[row] as usize, accepted[row] as usize);
            for position in 0..k {
                if let Some(label) = crate::estimator::labels::label(position, a, c) {
                    let x = f64::from(narrow[row * k + position]);
                    expected32.add_observation(&binning, position, x, label);
                }
            }
        }
        for level in crate::simd::available() {
            let counts = (&admitted[..], &accepted[..]);
            let mut step = StepHistogram::new(k, bins);
            assert!(step.locate_rows_at(level, &binning, &features, counts));
            assert_eq!(step.clone().into_stats(), expected, "{level:?} {k}x{bins}");
            step.clear();
            assert!(step.locate_rows_at(level, &binning, &narrow, counts));
            assert_eq!(step.into_stats(), expected32, "{level:?} f32 {k}x{bins}");
            // A NaN where a row is labeled fails the pass; where none is, it is never read.
            let labeled_row = (0..rows).find(|&r| admitted[r].min(accepted[r] + 1) > 0);
            let unlabeled_row = (0..rows).find(|&r| admitted[r] == 0);
            if let Some(row) = labeled_row {
                let mut bad = features.clone();
                bad[row * k] = f64::NAN;
                let mut step = StepHistogram::new(k, bins);
                assert!(
                    !step.locate_rows_at(level, &binning, &bad, counts),
                    "{level:?}"
                );
            }
            if let Some(row) = unlabeled_row {
                let mut bad = features.clone();
                bad[row * k] = f64::INFINITY;
                let mut step = StepHistogram::new(k, bins);
                assert!(
                    step.locate_rows_at(level, &binning, &bad, counts),
                    "{level:?}"
                );
                assert_eq!(step.into_stats(), expected, "{level:?} {k}x{bins}");
            }
        }
    }
}
