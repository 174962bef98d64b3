//! Arbitrary bytes as a saved estimator state: an error or a working estimator, never a panic,
//! and a state that loads must save back to the same bytes, read back from its `state_dict`
//! tree to the same bytes, and keep working.
//!
//! Random bytes almost never carry a valid CRC, so the first byte picks one of three modes:
//! the bytes as they are; the bytes as a payload wrapped in a valid header and checksum; or a
//! real encoded state (K, memory and round chosen by the next bytes) whose payload is
//! overwritten at fuzzer-chosen offsets with fuzzer-chosen 8-byte words, checksum recomputed.
//! The last mode keeps the field layout intact, so the fuzzer spends its time on the values
//! validation must refuse (NaN, ±∞, negative or overflowing counters) rather than on lengths.
#![no_main]

use av_core::persist::{crc32, state_dict};
use av_core::persist::estimator::{FORMAT_VERSION, MAGIC};
use av_core::{AcceptanceEstimator, ErrorKind, EstimatorConfig, MatrixView, Update};
use libfuzzer_sys::fuzz_target;

const HEADER: usize = 8 + 4 + 8;

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend(FORMAT_VERSION.to_le_bytes());
    bytes.extend((payload.len() as u64).to_le_bytes());
    bytes.extend(payload);
    let checksum = crc32(&bytes);
    bytes.extend(checksum.to_le_bytes());
    bytes
}

/// A real state: `k` positions, memory on or off, av_core's map update or vLLM's, a few
/// observed steps and refits.
fn real_state(k: usize, memory: bool, vllm: bool, steps: usize) -> Vec<u8> {
    let mut config = if vllm {
        EstimatorConfig::new(k).with_update(Update::Vllm)
    } else {
        EstimatorConfig::map(k)
    };
    config.bins = 8; // a map payload short enough for the fuzzer's offsets to cover
    config.memory = if memory { 0.8 } else { 0.0 };
    config.refit_interval = Some(2);
    let est = AcceptanceEstimator::new(config).expect("valid config");
    for step in 0..steps {
        let x: Vec<f32> = (0..3 * k).map(|i| ((i + step) % 7) as f32 - 3.0).collect();
        let admitted: Vec<i64> = (0..3).map(|r| ((r + step) % (k + 1)) as i64).collect();
        let accepted: Vec<i64> = admitted.iter().map(|&a| a / 2).collect();
        let view = MatrixView::new("f", &x, 3, k).expect("shape");
        est.observe(view, &admitted, &accepted, None::<MatrixView<'_, f32>>)
            .expect("valid observation");
    }
    est.to_bytes()
}

fn mutated(input: &[u8]) -> Option<Vec<u8>> {
    let (&[k, flags], edits) = input.split_first_chunk::<2>()?;
    let mut bytes = real_state(
        1 + usize::from(k % 8),
        flags & 1 == 1,
        flags & 2 == 2,
        usize::from(flags >> 2) % 6,
    );
    let payload = bytes.len() - HEADER - 4;
    for edit in edits.chunks_exact(10) {
        let at = HEADER + usize::from(u16::from_le_bytes([edit[0], edit[1]])) % (payload - 7);
        bytes[at..at + 8].copy_from_slice(&edit[2..10]);
    }
    let body = bytes.len() - 4;
    let checksum = crc32(&bytes[..body]);
    bytes[body..].copy_from_slice(&checksum.to_le_bytes());
    Some(bytes)
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let data = match mode % 3 {
        0 => rest.to_vec(),
        1 => framed(rest),
        _ => match mutated(rest) {
            Some(bytes) => bytes,
            None => return,
        },
    };
    if let Ok(est) = AcceptanceEstimator::from_bytes(&data) {
        let bytes = est.to_bytes();
        assert_eq!(
            bytes, data,
            "a loaded state must re-encode to its own bytes"
        );
        // Its state_dict tree reads back to the same state, bit for bit.
        let tree = state_dict::encode(&est.state());
        let state = state_dict::decode(&tree, "state", ErrorKind::Value).expect("its tree reads");
        let back = AcceptanceEstimator::from_state(&state).expect("its tree's state loads");
        assert_eq!(back.to_bytes(), data, "the state_dict must round-trip bit for bit");
        let k = est.num_positions();
        let x = vec![0.5f32; 2 * k];
        let mut out = vec![0.0f32; 2 * k];
        est.predict(MatrixView::new("f", &x, 2, k).unwrap(), &mut out)
            .unwrap();
        assert!(out.iter().all(|p| (0.0..=1.0).contains(p)));
        let before = est.to_bytes();
        let observed = est.observe::<f32, f32>(
            MatrixView::new("f", &x, 2, k).unwrap(),
            &[1, 0],
            &[0, 0],
            None,
        );
        if let Err(error) = observed {
            // Only a round already at its count bound refuses a valid step, whole (vllm: a
            // position at 2^56; map: a bin at 2^40).
            assert_eq!(error.argument, "num_admitted", "{error}");
            assert_eq!(
                est.to_bytes(),
                before,
                "a refused observe changed the state"
            );
        }
        est.refit();
        let c = est.coefficients();
        assert!(c.slope.is_finite() && c.slope >= 0.0);
        assert!(c.intercepts.iter().all(|b| b.is_finite()));
        AcceptanceEstimator::from_bytes(&est.to_bytes()).expect("a working estimator reloads");
    }
});
