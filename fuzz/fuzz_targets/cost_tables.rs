//! Arbitrary curves into the cost-table builder: an error or valid tables (finite, floored,
//! non-decreasing), never a panic; and arbitrary text into the JSON reader.
#![no_main]

use av_core::cost_tables::CostTables;
use libfuzzer_sys::fuzz_target;

fn curve(bytes: &[u8]) -> Vec<(f64, f64)> {
    bytes
        .chunks_exact(4)
        .map(|c| {
            let size = f64::from(u16::from_le_bytes([c[0], c[1]]) % 600);
            let ms = f64::from(i16::from_le_bytes([c[2], c[3]])) / 16.0;
            (size, ms)
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let split = 6 + usize::from(data[0]) % (data.len() - 5);
    let (head, rest) = data.split_at(split.min(data.len()));
    let max_num_reqs = usize::from(head[1]) * 2;
    let max_batch_tokens = usize::from(u16::from_le_bytes([head[2], head[3]]) % 2048);
    let limit = usize::from(head[4]) * 4;
    let (draft, verify) = rest.split_at(rest.len() / 2);
    for result in [
        CostTables::from_curves(&curve(draft), &curve(verify), max_num_reqs, max_batch_tokens, limit),
        CostTables::from_samples(&curve(draft), &curve(verify), max_num_reqs, max_batch_tokens, limit),
    ] {
        if let Ok(tables) = result {
            assert_eq!(tables.draft_ms().len(), max_num_reqs + 1);
            assert_eq!(tables.verify_ms().len(), max_batch_tokens + 1);
            assert!(tables.draft_ms().iter().all(|v| v.is_finite() && *v >= 0.0));
            assert!(tables.verify_ms().iter().all(|v| v.is_finite() && *v >= 1e-6));
            let back = CostTables::from_json(&tables.to_json()).unwrap();
            assert_eq!(back, tables);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = CostTables::from_json(text);
    }
});
