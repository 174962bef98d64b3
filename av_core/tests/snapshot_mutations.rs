//! Saved estimator states that are corrupt *behind a valid checksum* never panic.
//!
//! Random bytes almost never get past the frame (magic, version, length, CRC-32), so they test
//! little beyond it. Here real encoded states — several K, with and without memory, mid-round,
//! both updates — have numbers of their state overwritten with hostile values (NaN, ±∞, −0,
//! huge and negative numbers, all-ones counts, random bits) and are encoded again behind a
//! valid checksum, so every input reaches field decoding and state validation. Whatever loads must then work:
//! predict in [0, 1], observe, refit to finite coefficients, and save back to the bytes it was
//! loaded from.

use av_core::persist::estimator::{decode, MAGIC};
use av_core::persist::state_dict;
use av_core::persist::tree::{ListBuilder, Value};
use av_core::{AcceptanceEstimator, ErrorKind, EstimatorConfig, MatrixView};
use proptest::prelude::*;
use std::sync::OnceLock;

fn real_state(k: usize, memory: f64, rounds: usize, map: bool) -> Vec<u8> {
    let mut config = match map {
        true => EstimatorConfig::map(k),
        false => EstimatorConfig::version_1(k),
    };
    config.bins = 8;
    config.memory = memory;
    config.refit_interval = Some(3);
    let est = AcceptanceEstimator::new(config).unwrap();
    for round in 0..rounds {
        let x: Vec<f32> = (0..4 * k)
            .map(|i| ((i * 7 + round * 3) % 11) as f32 - 4.0)
            .collect();
        let admitted: Vec<i64> = (0..4).map(|r| ((r + round) % (k + 1)) as i64).collect();
        let accepted: Vec<i64> = admitted.iter().map(|&a| a / 2).collect();
        let view = MatrixView::new("features", &x, 4, k).unwrap();
        est.observe(view, &admitted, &accepted, None::<MatrixView<'_, f32>>)
            .unwrap();
    }
    est.to_bytes()
}

/// Hostile 8-byte words: special floats, extreme integers, or the random bits given.
fn word(kind: u8, random: u64) -> [u8; 8] {
    match kind % 12 {
        0 => f64::NAN.to_le_bytes(),
        1 => f64::INFINITY.to_le_bytes(),
        2 => f64::NEG_INFINITY.to_le_bytes(),
        3 => (-0.0f64).to_le_bytes(),
        4 => f64::MAX.to_le_bytes(),
        5 => (-1.0f64).to_le_bytes(),
        6 => 1e-310f64.to_le_bytes(), // subnormal
        7 => u64::MAX.to_le_bytes(),
        8 => 0u64.to_le_bytes(),
        9 => (1u64 << 63).to_le_bytes(),
        10 => 2.0f64.to_le_bytes(),
        _ => random.to_le_bytes(),
    }
}

/// The list of `items` as the state's writer builds it (packed if all are of one kind).
fn list(items: Vec<Value>) -> Value {
    let mut list = ListBuilder::new(items.len());
    items.into_iter().for_each(|item| list.push(item));
    list.finish()
}

/// Calls `edit` on every number of `tree`, in order, with its index.
fn each_number(tree: &mut Value, next: &mut usize, edit: &mut impl FnMut(usize, &mut Value)) {
    match tree {
        Value::Int(_) | Value::Float(_) => {
            edit(*next, tree);
            *next += 1;
        }
        Value::List(items) => items
            .iter_mut()
            .for_each(|item| each_number(item, next, edit)),
        // A packed list's numbers, each edited as the item of a list and packed again.
        Value::Floats(_) | Value::Ints(_) => {
            let mut items: Vec<Value> = match std::mem::replace(tree, Value::None) {
                Value::Floats(v) => v.into_iter().map(Value::Float).collect(),
                Value::Ints(v) => v.into_iter().map(Value::Int).collect(),
                _ => unreachable!(),
            };
            items
                .iter_mut()
                .for_each(|item| each_number(item, next, edit));
            *tree = list(items);
        }
        Value::Dict(entries) => entries
            .iter_mut()
            .for_each(|(_, value)| each_number(value, next, edit)),
        _ => {}
    }
}

/// `bytes` with the given numbers of its state overwritten (a float by the word's bits, an
/// integer by its value), encoded again with a valid checksum; an error where the format has
/// no place for the value (a negative count), as the bytes of a format with one would give.
fn corrupt(bytes: Vec<u8>, edits: &[(usize, u8, u64)]) -> av_core::Result<Vec<u8>> {
    let mut tree = state_dict::encode(&decode(&bytes).unwrap());
    let mut count = 0;
    each_number(&mut tree, &mut count, &mut |_, _| {});
    for &(at, kind, random) in edits {
        let bits = u64::from_le_bytes(word(kind, random));
        let target = at % count;
        each_number(&mut tree, &mut 0, &mut |index, leaf| {
            if index == target {
                *leaf = match leaf {
                    Value::Float(_) => Value::Float(f64::from_bits(bits)),
                    _ => Value::Int(i128::from(bits as i64) * if kind % 2 == 0 { 1 } else { -1 }),
                };
            }
        });
    }
    let state = state_dict::decode(&tree, "data", ErrorKind::State)?;
    Ok(av_core::persist::estimator::encode(&state))
}

/// Everything a loaded estimator must do without panicking.
fn exercise(est: &AcceptanceEstimator, bytes: &[u8]) {
    assert_eq!(
        est.to_bytes(),
        bytes,
        "a loaded state re-encodes to its own bytes"
    );
    let k = est.num_positions();
    let x: Vec<f32> = (0..3 * k).map(|i| i as f32 - 2.0).collect();
    let view = MatrixView::new("features", &x, 3, k).unwrap();
    let mut p = vec![0.0f32; 3 * k];
    est.predict(view, &mut p).unwrap();
    assert!(p.iter().all(|p| (0.0..=1.0).contains(p)), "{p:?}");
    let before = est.to_bytes();
    let observed = est.observe(
        view,
        &[k as i64, 1, 0],
        &[1, 0, 0],
        Some(MatrixView::new("p", &p, 3, k).unwrap()),
    );
    if let Err(error) = observed {
        // Only a round already full (a count at the 2^56 bound) refuses a valid step, and it
        // refuses it whole.
        assert_eq!(error.argument, "num_admitted", "{error}");
        assert!(error.message.contains("past"), "{error}");
        assert_eq!(
            est.to_bytes(),
            before,
            "a refused observe changed the state"
        );
    }
    est.refit();
    let c = est.coefficients();
    assert!(c.slope.is_finite() && c.slope >= 0.0, "slope {}", c.slope);
    assert!(
        c.intercepts.iter().all(|b| b.is_finite()),
        "{:?}",
        c.intercepts
    );
    AcceptanceEstimator::from_bytes(&est.to_bytes())
        .expect("a working estimator saves a loadable state");
}

fn seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        vec![
            real_state(1, 0.0, 2, false),
            real_state(3, 0.8, 7, false),
            real_state(8, 0.9, 5, true),
            real_state(16, 0.0, 4, true),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn corrupt_payloads_behind_a_valid_checksum_never_panic(
        seed in 0usize..4,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u64>()), 1..4),
    ) {
        let corrupted = corrupt(seeds()[seed].clone(), &edits);
        let Ok(bytes) = corrupted else {
            return Ok(()); // a value the format cannot hold
        };
        assert_eq!(&bytes[..8], MAGIC);
        match decode(&bytes) {
            Err(e) => prop_assert!(!e.message.contains("checksum"), "stopped at the frame: {e}"),
            Ok(state) => {
                if let Ok(est) = AcceptanceEstimator::from_state(&state) {
                    exercise(&est, &bytes);
                }
            }
        }
    }
}

#[test]
fn the_corruptions_reach_validation_and_loading() {
    // The property above is only as strong as the paths it reaches: most corrupt payloads must
    // decode (the frame and field layout are intact), and some must even load.
    let (mut decoded, mut loaded, total) = (0, 0, 2000u64);
    for i in 0..total {
        let edits = [(
            (i as usize).wrapping_mul(2_654_435_761),
            (i % 256) as u8,
            i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        )];
        let Ok(bytes) = corrupt(seeds()[(i % 4) as usize].clone(), &edits) else {
            continue;
        };
        if let Ok(state) = decode(&bytes) {
            decoded += 1;
            if let Ok(est) = AcceptanceEstimator::from_state(&state) {
                loaded += 1;
                exercise(&est, &bytes);
            }
        }
    }
    eprintln!("{decoded} of {total} decoded, {loaded} loaded");
    assert!(
        decoded * 10 >= total * 8,
        "only {decoded} of {total} decoded"
    );
    assert!(loaded * 10 >= total, "only {loaded} of {total} loaded");
}

#[test]
fn saved_counters_at_their_limit_never_panic() {
    // The counters a corrupt file can carry at u64::MAX: the refit count (the next refit
    // increments it), the steps since the last refit (the next observe increments it) and the
    // memory's drift resets (the next round that fails the drift test increments it).
    // Refusing such a state is fine; loading it and then panicking is not.
    let bytes = real_state(2, 0.8, 4, false);
    let state = decode(&bytes).unwrap();
    for field in ["num_refits", "steps_since_refit", "memory.resets"] {
        let mut corrupt = state.clone();
        match field {
            "num_refits" => corrupt.num_refits = u64::MAX,
            "steps_since_refit" => corrupt.steps_since_refit = u64::MAX,
            _ => corrupt.update.as_vllm_mut().unwrap().memory.resets = u64::MAX,
        }
        if let Ok(est) = AcceptanceEstimator::from_state(&corrupt) {
            let encoded = est.to_bytes();
            exercise(&est, &encoded);
            // A confidently wrong round: the drift test fires and drops the memory.
            let x = vec![30.0f32; 64 * 2];
            let view = MatrixView::new("features", &x, 64, 2).unwrap();
            est.observe(view, &[2; 64], &[0; 64], None::<MatrixView<'_, f32>>)
                .unwrap();
            est.refit();
        }
    }
}
