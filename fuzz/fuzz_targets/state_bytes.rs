//! Arbitrary bytes as a saved estimator state: an error or a working estimator, never a panic,
//! and a state that loads must save back to the same bytes and keep working.
//!
//! Random bytes almost never carry a valid CRC, so half the inputs are wrapped in a valid
//! header and checksum first: that lets the fuzzer reach the field decoding and validation.
#![no_main]

use av_core::snapshot::{crc32, FORMAT_VERSION, MAGIC};
use av_core::{AcceptanceEstimator, MatrixView};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let wrapped;
    let data = if mode & 1 == 0 {
        rest
    } else {
        let mut bytes = MAGIC.to_vec();
        bytes.extend(FORMAT_VERSION.to_le_bytes());
        bytes.extend((rest.len() as u64).to_le_bytes());
        bytes.extend(rest);
        let checksum = crc32(&bytes);
        bytes.extend(checksum.to_le_bytes());
        wrapped = bytes;
        &wrapped[..]
    };
    if let Ok(est) = AcceptanceEstimator::from_bytes(data) {
        let bytes = est.to_bytes();
        assert_eq!(bytes, data, "a loaded state must re-encode to its own bytes");
        let k = est.num_positions();
        let x = vec![0.5f32; 2 * k];
        let mut out = vec![0.0f32; 2 * k];
        est.predict(MatrixView::new("f", &x, 2, k).unwrap(), &mut out).unwrap();
        assert!(out.iter().all(|p| (0.0..=1.0).contains(p)));
        est.observe::<f32, f32>(MatrixView::new("f", &x, 2, k).unwrap(), &[1, 0], &[0, 0], None)
            .unwrap();
        est.refit();
        let c = est.coefficients();
        assert!(c.slope.is_finite() && c.slope >= 0.0);
        assert!(c.intercepts.iter().all(|b| b.is_finite()));
    }
});
