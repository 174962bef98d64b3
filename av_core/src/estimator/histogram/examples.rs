//! The histograms' usage examples, run as unit tests (the module is private).

#[test]
fn binning_example() {
    use crate::estimator::histogram::{Binning, X_SCALE};

    let binning = Binning::new(40.0, 64); // bins 1.25 wide
    assert_eq!(binning.locate(-40.0), (0, 0));
    assert_eq!(binning.locate(0.0), (32, (40.0 * X_SCALE) as u64));
    assert_eq!(binning.locate(40.0).0, 63); // the upper edge belongs to the last bin
    assert_eq!(binning.locate(1e6), binning.locate(40.0)); // clamped
}

#[test]
fn histogramstats_example() {
    use crate::estimator::histogram::{Binning, HistogramStats};

    let binning = Binning::new(40.0, 64);
    let mut round = HistogramStats::new(2, 64);
    round.add_observation(&binning, 0, 1.0, true);
    round.add_observation(&binning, 0, 1.1, false);
    round.add_observation(&binning, 1, -3.0, false);
    assert_eq!(round.total_count(), 3);
    assert_eq!(round.position_counts(), [2, 1]);
    let bin = 32; // both features of position 0 are in [0, 1.25)
    assert_eq!((round.count[bin], round.accepted[bin]), (2, 1));
    assert!(round.validate("round_stats", 2, 64, 40.0).is_ok());
}

#[test]
fn histogramaccumulator_example() {
    use crate::estimator::histogram::{Binning, HistogramAccumulator, HistogramStats};

    let binning = Binning::new(40.0, 64);
    let acc = HistogramAccumulator::new(1, 64);
    let mut step = HistogramStats::new(1, 64);
    step.add_observation(&binning, 0, 2.5, true);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| acc.add(&step));
        }
    });
    let mut round = HistogramStats::new(1, 64);
    acc.drain_into(&mut round);
    assert_eq!(
        (round.total_count(), round.accepted.iter().sum::<u64>()),
        (4, 4)
    );
}

#[allow(clippy::assign_op_pattern)] // the example as it was written for the docs
#[test]
fn try_add_example() {
    use crate::estimator::histogram::{
        Binning, HistogramAccumulator, HistogramStats, MAX_BIN_COUNT,
    };

    let binning = Binning::new(40.0, 64);
    let acc = HistogramAccumulator::new(1, 64);
    let mut step = HistogramStats::new(1, 64);
    step.add_observation(&binning, 0, 2.5, true);
    let mut full = step.clone();
    let bin = full.count.iter().position(|&c| c > 0).unwrap();
    full.count[bin] = MAX_BIN_COUNT - 1;
    full.accepted[bin] = 0;
    full.x_sum[bin] = full.x_sum[bin] * (MAX_BIN_COUNT - 1);
    assert_eq!(acc.try_add(&full), Ok(()));
    assert_eq!(acc.try_add(&step), Ok(())); // the bin is now at the bound
    assert_eq!(acc.try_add(&step), Err((0, bin)));
    let mut round = HistogramStats::new(1, 64);
    acc.drain_into(&mut round);
    assert_eq!(round.count[bin], MAX_BIN_COUNT); // the refused add left nothing behind
}

#[test]
fn histogrammemory_example() {
    use crate::estimator::histogram::{Binning, HistogramMemory, HistogramStats};

    let binning = Binning::new(40.0, 64);
    let mut round = HistogramStats::new(1, 64);
    round.add_observation(&binning, 0, 1.0, true);
    round.add_observation(&binning, 0, 0.5, false);
    let mut memory = HistogramMemory::new(1, 64);
    memory.add_round(&round, &binning);
    memory.decay(0.5);
    assert_eq!((memory.count[32], memory.accepted[32]), (1.0, 0.5));
    assert!((memory.x_sum[32] - 0.75).abs() < 1e-4); // (1.0 + 0.5) / 2
    assert!(memory.validate(1, 64, 0.8, 40.0).is_ok());
}
