use super::*;
use crate::persist::tree::Value;
use crate::persist::{crc32, frame, FRAME_LEN};
use crate::ErrorKind;
use crate::MatrixView;
use proptest::prelude::*;

fn sample_state(config: EstimatorConfig) -> EstimatorState {
    let est = AcceptanceEstimator::new(config).unwrap();
    let x = [1.0f32, -2.0, 3.5, 0.25, 8.0, -1.0];
    let view = || MatrixView::new("f", &x, 2, 3).unwrap();
    est.observe::<f32, f32>(view(), &[3, 2], &[1, 2], None)
        .unwrap();
    est.refit();
    est.observe::<f32, f32>(view(), &[2, 1], &[0, 1], None)
        .unwrap();
    est.state()
}

fn configs() -> [EstimatorConfig; 3] {
    let mut manual = EstimatorConfig::map(3);
    manual.refit_interval = None;
    [
        EstimatorConfig::new(3),
        EstimatorConfig::version_1(3),
        manual,
    ]
}

/// `payload` framed as `version` with a valid checksum.
fn framed(version: u32, payload: &[u8]) -> Vec<u8> {
    frame(Kind::Estimator, version, payload)
}

#[test]
fn round_trips() {
    for config in configs() {
        let state = sample_state(config);
        assert_eq!(decode(&encode(&state)).unwrap(), state);
    }
}

#[test]
fn every_truncation_and_every_bit_flip_is_refused() {
    let mut config = EstimatorConfig::new(3);
    config.bins = 4; // every byte of the map state, in fewer of them
    let bytes = encode(&sample_state(config));
    for cut in 0..bytes.len() {
        assert!(decode(&bytes[..cut]).is_err(), "truncated at {cut}");
    }
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut corrupt = bytes.clone();
            corrupt[i] ^= 1 << bit;
            assert!(decode(&corrupt).is_err(), "flip at byte {i} bit {bit}");
        }
    }
}

#[test]
fn trailing_bytes_are_refused_after_the_frame_and_inside_it() {
    for config in configs() {
        let bytes = encode(&sample_state(config));
        for pad in [&[0u8][..], &[0; 4], &[0xFF; 9], &bytes[..24]] {
            // After the checksum: the frame's length no longer adds up.
            let mut padded = bytes.clone();
            padded.extend_from_slice(pad);
            let err = decode(&padded).unwrap_err();
            assert!(err.message.contains("length mismatch"), "{err}");
            // Inside the payload, behind a header and checksum that agree with it.
            let mut payload = bytes[FRAME_LEN - 4..bytes.len() - 4].to_vec();
            payload.extend_from_slice(pad);
            let err = decode(&framed(FORMAT_VERSION, &payload)).unwrap_err();
            assert_eq!(err.argument, "data");
            assert!(err.message.contains("unexpected bytes"), "{err}");
        }
    }
}

#[test]
fn the_length_depends_on_the_configuration_only() {
    for config in configs() {
        let fresh = AcceptanceEstimator::new(config.clone()).unwrap().to_bytes();
        assert_eq!(encode(&sample_state(config.clone())).len(), fresh.len());
        assert_eq!(encoded_len(&config).unwrap(), fresh.len());
    }
    // A map state's length grows with its bins; vLLM's update keeps none (`bins` itself is a
    // fixed-width int of the configuration's tree).
    let lengths = [16, 64, 256].map(|bins| {
        let mut map = EstimatorConfig::map(4);
        map.bins = bins;
        let mut vllm = EstimatorConfig::vllm(4);
        vllm.bins = bins;
        (encoded_len(&map).unwrap(), encoded_len(&vllm).unwrap())
    });
    assert!(lengths[0].0 < lengths[1].0 && lengths[1].0 < lengths[2].0);
    assert!(lengths[0].1 == lengths[1].1 && lengths[2].1 == lengths[1].1);
    // 48 bytes per bin and position: three integer and three float columns of 8 bytes; and
    // the round's `bins`, a varint, takes a second byte at 256.
    assert_eq!(lengths[2].0 - lengths[1].0, 48 * 4 * (256 - 64) + 1);
}

#[test]
fn the_longest_state_is_within_the_bound() {
    let mut config = EstimatorConfig::map(EstimatorConfig::MAX_POSITIONS);
    config.bins = MAX_BINS;
    let len = encoded_len(&config).unwrap();
    assert!(len <= MAX_ENCODED_LEN, "{len} > {MAX_ENCODED_LEN}");
    // The value tree's version 3 of the same state is the longest an earlier build wrote.
    let state = AcceptanceEstimator::new(config).unwrap().state();
    let tree_len = value_tree_bytes(&state).len();
    assert!(tree_len > len && tree_len <= MAX_ENCODED_LEN, "{tree_len}");
    assert!(
        tree_len > MAX_ENCODED_LEN - 32 * 1024,
        "{tree_len} is far below {MAX_ENCODED_LEN}"
    );
}

/// `state` framed as the value tree's version 3.
fn value_tree_bytes(state: &EstimatorState) -> Vec<u8> {
    let mut payload = Vec::new();
    value_tree::write(&crate::persist::state_dict::encode(state), &mut payload);
    framed(FORMAT_VERSION_3, &payload)
}

#[test]
fn the_value_trees_version_3_reads_as_its_state() {
    for config in configs() {
        let state = sample_state(config);
        let bytes = value_tree_bytes(&state);
        assert_eq!(&bytes[8..12], &3u32.to_le_bytes());
        assert_eq!(decode(&bytes).unwrap(), state);
        // Written again in this build's layout.
        assert_eq!(decode(&encode(&state)).unwrap(), state);
        assert_ne!(encode(&state), bytes);
    }
}

#[test]
fn a_broken_value_tree_is_refused_by_what_breaks_it() {
    let state = sample_state(EstimatorConfig::new(3));
    let payload = |bytes: &[u8]| bytes[FRAME_LEN - 4..bytes.len() - 4].to_vec();
    let good = payload(&value_tree_bytes(&state));
    type Edit<'a> = &'a dyn Fn(&mut Vec<u8>);
    let cases: [(Edit<'_>, &str); 4] = [
        (
            &|p| p.extend([0; 8]),
            "8 unexpected bytes after the last field",
        ),
        (
            &|p| p.truncate(p.len() - 3),
            "truncated while reading an int",
        ),
        (&|p| p[8] = 1, "exceeds the data"),
        (
            &|p| {
                // The format's value, "av_core.AcceptanceEstimator", renamed.
                let at = 23 + 1 + 8;
                p[at] = b'x';
            },
            "format",
        ),
    ];
    for (edit, message) in cases {
        let mut p = good.clone();
        edit(&mut p);
        let err = decode(&framed(FORMAT_VERSION_3, &p)).unwrap_err();
        assert_eq!((err.kind, err.argument), (ErrorKind::State, "data"));
        assert!(err.message.contains(message), "{err}");
    }
    // Every cut and bit flip of the payload, framed again, is refused or read, never a panic;
    // a cut short of the whole is always refused.
    for cut in 23..good.len() {
        assert!(
            decode(&framed(FORMAT_VERSION_3, &good[..cut])).is_err(),
            "cut {cut}"
        );
    }
    for i in (0..good.len()).step_by(3) {
        let mut p = good.clone();
        p[i] ^= 0x41;
        let _ = decode(&framed(FORMAT_VERSION_3, &p));
    }
    // A payload that starts otherwise keeps postcard's layout's error.
    let mut p = payload(&v3_bytes(&state));
    p.push(0);
    let err = decode(&framed(FORMAT_VERSION_3, &p)).unwrap_err();
    assert!(err.message.contains("1 unexpected bytes"), "{err}");
}

#[test]
fn future_versions_are_refused_by_name() {
    let mut bytes = encode(&sample_state(EstimatorConfig::new(3)));
    bytes[8..12].copy_from_slice(&5u32.to_le_bytes());
    let err = decode(&bytes).unwrap_err();
    assert!(err.message.contains("format version 5"), "{err}");
}

#[test]
fn the_payload_is_the_declared_fields_in_order() {
    let state = sample_state(EstimatorConfig::new(3));
    let bytes = encode(&state);
    let payload = &bytes[FRAME_LEN - 4..bytes.len() - 4];
    // The configuration first, by field name in the declaration's order, then the slope.
    let mut r = Reader { bytes: payload };
    let tree = value_tree::read(&mut r, 0).unwrap();
    let Value::Dict(entries) = &tree else {
        panic!("{tree:?}")
    };
    let names: Vec<&str> = entries.iter().map(|(key, _)| key.as_str()).collect();
    let declared: Vec<&str> = EstimatorConfig::FIELD_DOCS
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(names[..3], ["num_positions", "refit_interval", "damping"]);
    assert_eq!(names, declared);
    assert_eq!(tree.get("l2"), Some(&Value::Float(state.config.l2)));
    assert_eq!(r.bytes[..8], state.slope.to_le_bytes());
    // The update's part last: the map state's memory ends with its drift resets, 8 bytes
    // behind their length.
    let map = state.update.as_map().unwrap();
    let tail = [&[8u8][..], &map.memory.resets.to_le_bytes()].concat();
    assert!(payload.ends_with(&tail));
    // Counters are 8 bytes whatever their value.
    let mut counted = state.clone();
    counted.num_refits = u64::MAX >> 1;
    counted.update.as_map_mut().unwrap().memory.resets = 1 << 60;
    assert_eq!(encode(&counted).len(), bytes.len());
    assert_eq!(decode(&encode(&counted)).unwrap(), counted);
}

/// The configuration's tree of `state`'s version-4 payload, and the bytes after it.
fn split_payload(state: &EstimatorState) -> (Vec<(String, Value)>, Vec<u8>) {
    let bytes = encode(state);
    let mut r = Reader {
        bytes: &bytes[FRAME_LEN - 4..bytes.len() - 4],
    };
    match value_tree::read(&mut r, 0).unwrap() {
        Value::Dict(entries) => (entries, r.bytes.to_vec()),
        other => panic!("{other:?}"),
    }
}

/// A version-4 payload of `config`'s tree and `rest`, framed.
fn joined(config: Vec<(String, Value)>, rest: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    value_tree::write(&Value::Dict(config), &mut payload);
    payload.extend(rest);
    framed(FORMAT_VERSION, &payload)
}

#[test]
fn an_encoding_that_is_not_the_states_own_is_refused() {
    let state = sample_state(EstimatorConfig::new(3));
    let (config, rest) = split_payload(&state);
    assert_eq!(decode(&joined(config.clone(), &rest)).unwrap(), state);
    // The intercepts' length, 3, as a two-byte varint; two fields of the configuration
    // swapped; an integer where the configuration writes a float: the same state, in bytes it
    // never writes.
    let mut overlong = rest.clone();
    overlong.splice(8..9, [0x83, 0x00]).for_each(drop);
    let mut swapped = config.clone();
    swapped.swap(2, 3);
    let mut as_int = config.clone();
    as_int[2].1 = Value::Int(50); // damping, 50.0
    for bytes in [
        joined(config.clone(), &overlong),
        joined(swapped, &rest),
        joined(as_int, &rest),
    ] {
        let err = decode(&bytes).unwrap_err();
        assert_eq!((err.kind, err.argument), (ErrorKind::State, "data"));
        assert!(err.message.contains("not the state's encoding"), "{err}");
    }
    // Version 3's configuration by position: num_positions = 3 as a two-byte varint.
    let mut payload = v3_bytes(&state)[FRAME_LEN - 4..].to_vec();
    payload.truncate(payload.len() - 4);
    payload.splice(0..1, [0x83, 0x00]).for_each(drop);
    let err = decode(&framed(FORMAT_VERSION_3, &payload)).unwrap_err();
    assert!(err.message.contains("not the state's encoding"), "{err}");
}

#[test]
fn the_configuration_is_read_by_name() {
    let state = sample_state(EstimatorConfig::new(3));
    let (config, rest) = split_payload(&state);
    // A field a later build declares is refused by name (this build cannot honour it); a
    // field this build requires that the bytes lack is refused by name.
    let mut later = config.clone();
    later.push(("future_option".into(), Value::Float(1.0)));
    let err = decode(&joined(later, &rest)).unwrap_err();
    assert_eq!((err.kind, err.argument), (ErrorKind::State, "data"));
    assert!(
        err.message.contains("[\"future_option\"] is not a field"),
        "{err}"
    );
    let lacking: Vec<_> = config.into_iter().filter(|(k, _)| k != "drift_z").collect();
    let err = decode(&joined(lacking, &rest)).unwrap_err();
    assert!(err.message.contains("[\"drift_z\"] is missing"), "{err}");
}

/// `state` as version 3 in postcard, as the builds between postcard and version 4 wrote it.
fn v3_bytes(state: &EstimatorState) -> Vec<u8> {
    let c = &state.config;
    let config = ConfigV3 {
        num_positions: c.num_positions,
        refit_interval: c.refit_interval,
        damping: c.damping,
        l2: c.l2,
        init_slope: c.init_slope,
        init_intercept: c.init_intercept,
        max_log_odds: c.max_log_odds,
        max_step: c.max_step,
        max_slope: c.max_slope,
        max_intercept: c.max_intercept,
        memory: c.memory,
        drift_z: c.drift_z,
        update: c.update,
        bins: c.bins,
        prior_slope_sd: c.prior_slope_sd,
        prior_level_sd: c.prior_level_sd,
        prior_trend_sd: c.prior_trend_sd,
        prior_spread_sd: c.prior_spread_sd,
    };
    let coefficients = Coefficients {
        slope: state.slope,
        intercepts: Cow::Borrowed(&state.intercepts),
        steps_since_refit: state.steps_since_refit,
        num_refits: state.num_refits,
    };
    let payload = postcard::to_allocvec(&(&config, &coefficients, &state.update)).unwrap();
    framed(FORMAT_VERSION_3, &payload)
}

#[test]
fn version_3_in_postcard_reads_as_its_state() {
    for config in configs() {
        let state = sample_state(config);
        let bytes = v3_bytes(&state);
        assert_eq!(decode(&bytes).unwrap(), state);
        // Written again as version 4, which reads back to the same state.
        let again = encode(&state);
        assert_eq!(again[8..12], 4u32.to_le_bytes());
        assert_eq!(decode(&again).unwrap(), state);
    }
}

#[test]
fn a_payload_of_the_other_updates_part_is_refused() {
    // A vLLM-update state's payload relabelled as the map update's: the map state's fields
    // cannot be read from vLLM's statistics.
    let mut state = sample_state(EstimatorConfig::vllm(3));
    state.config.update = Update::Map;
    let bytes = encode(&state);
    let err = decode(&bytes).unwrap_err();
    assert_eq!((err.kind, err.argument), (ErrorKind::State, "data"));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(state) = decode(&bytes) {
            let _ = AcceptanceEstimator::from_state(&state);
        }
    }

    #[test]
    fn arbitrary_payloads_behind_a_valid_header_never_panic(
        version in 1u32..=4,
        payload in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut bytes = MAGIC.to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend((payload.len() as u64).to_le_bytes());
        bytes.extend(&payload);
        let checksum = crc32(&bytes);
        bytes.extend(checksum.to_le_bytes());
        if let Ok(state) = decode(&bytes) {
            let _ = AcceptanceEstimator::from_state(&state);
        }
    }
}
