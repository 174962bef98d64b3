//! A position no round labels any more decays in the memory until its weight underflows, and
//! the state the estimator holds then still saves and loads (found by the state_bytes fuzz
//! target: a memory with a subnormal `b` and no weight was refused as not positive
//! semi-definite).

use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView, Update};

#[test]
fn a_position_decayed_to_underflow_still_reloads() {
    let mut config = EstimatorConfig::new(2).with_update(Update::Vllm);
    config.memory = 0.3; // below 0.5, so a one-ulp subnormal rounds to zero (0.8 keeps it)
    config.l2 = 0.0; // no ridge: nothing keeps the unlabeled position's weight above zero
    config.drift_z = f64::INFINITY; // no resets: the memory only decays
    config.refit_interval = Some(1);
    let est = AcceptanceEstimator::new(config).unwrap();
    let none = None::<MatrixView<'_, f32>>;
    // One step labels both positions, with a large feature at position 1 (|b| = 40·c there).
    let both = [0.5f32, 40.0];
    est.observe(MatrixView::new("f", &both, 1, 2).unwrap(), &[2], &[2], none)
        .unwrap();
    let mut underflowed = false;
    for step in 0..1000 {
        // Later steps label position 0 only (one draft admitted and rejected).
        est.observe(MatrixView::new("f", &both, 1, 2).unwrap(), &[1], &[0], none)
            .unwrap();
        let state = est.state();
        let memory = &state.update.as_vllm().unwrap().memory;
        let (b, c) = (memory.b[1], memory.c[1]);
        underflowed |= c == 0.0 && b != 0.0;
        if step % 50 == 0 || (c == 0.0 && b != 0.0) {
            let back = AcceptanceEstimator::from_bytes(&est.to_bytes());
            assert!(
                back.is_ok(),
                "step {step}: b = {b}, c = {c}: {:?}",
                back.err()
            );
        }
    }
    assert!(
        underflowed,
        "the run never reached a weightless b (the case under test)"
    );
}
