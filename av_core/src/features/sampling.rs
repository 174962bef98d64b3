//! The drafter feature under a sampler's settings: `x = logit(q_max)` of
//! `q = truncate(softmax(z / T))`, with the temperature `T`, top-k and top-p of each row, for
//! engines that sample the draft from that truncated `q` (a llama.cpp sampler chain, vLLM's
//! sampler).
//!
//! The truncation is vLLM's rule, the one `av_core.features.draft_log_odds` applies: top-k
//! first, then top-p on the renormalised top-k distribution, keeping the smallest prefix (in
//! descending order) that holds at least `p` of the mass, never fewer than one token. A row
//! whose settings truncate nothing goes through the fused kernel ([`draft_log_odds_rows`]); a
//! truncated row is ordered and its complement (the kept mass after one occurrence of the
//! maximum, relative to the maximum) summed directly, so it stays exact as `q_max → 1` too.
//!
//! Only the head of a truncated row needs ordering: the kept set is a prefix, so the row's
//! `n` largest entries are selected and sorted (`n = 64`, doubled until the prefix ends inside
//! them), which keeps top-p on a 150k-entry vocabulary well under a full sort.

use crate::error::{Error, Result};

use super::draft_log_odds_rows;

/// Entries selected and sorted first when a top-p cut is searched for.
const FIRST_HEAD: usize = 64;

/// One row's sampler settings once checked: the scale of the logits and what truncation
/// keeps.
#[derive(Clone, Copy, Debug)]
struct RowSettings {
    /// `1 / T`, or 1 for a greedy row (`T <= 0` leaves the logits unscaled).
    inv_temperature: f32,
    /// Entries top-k keeps (`vocab` when off).
    top_k: usize,
    /// Mass top-p keeps (1 when off).
    top_p: f64,
}

impl RowSettings {
    fn truncates(&self, vocab: usize) -> bool {
        self.top_k < vocab || self.top_p < 1.0
    }
}

/// `logit(q_max)` of each row of float32 `[rows, vocab]` row-major logits under the sampler
/// settings of that row, into `out[rows]`.
///
/// * `temperature`: one entry per row, or empty for 1 on every row. Finite; `<= 0` is greedy
///   and leaves the logits unscaled (vLLM's convention).
/// * `top_k`: one entry per row, or empty for none. `<= 0` or `>= vocab` is no top-k; below
///   -1 is an error (llama.cpp and vLLM use 0 and -1 for "off").
/// * `top_p`: one entry per row, or empty for none. In `(0, 1]`; `>= 1` is no top-p.
///
/// A row holding a NaN or `+inf`, or no finite entry, gives NaN; a row whose truncation keeps
/// one entry (or with one finite entry) gives `+max_log_odds`. Rows that truncate nothing give
/// exactly [`draft_log_odds_rows`]'s value.
///
/// # Errors
///
/// A value error naming the argument (and the row) for inconsistent lengths, `vocab == 0`, a
/// non-finite temperature, a top-k below -1, a top-p that is NaN or `<= 0`, or a
/// `max_log_odds` that is not finite and positive.
///
/// # Example
///
/// ```rust
/// use av_core::features::sampling::draft_log_odds_sampling;
///
/// // q = (0.4, 0.3, 0.2, 0.1); top-p 0.5 keeps 0.4 and 0.3, so x = ln(0.4 / 0.3).
/// let logits = [0.4f32.ln(), 0.3f32.ln(), 0.2f32.ln(), 0.1f32.ln()];
/// let mut out = [0.0f32; 1];
/// draft_log_odds_sampling(&logits, 1, 4, &[1.0], &[], &[0.5], 40.0, &mut out)?;
/// assert!((out[0] - (4.0f32 / 3.0).ln()).abs() < 1e-5);
/// # Ok::<(), av_core::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn draft_log_odds_sampling(
    logits: &[f32],
    rows: usize,
    vocab: usize,
    temperature: &[f32],
    top_k: &[i64],
    top_p: &[f32],
    max_log_odds: f32,
    out: &mut [f32],
) -> Result<()> {
    let settings = check_settings(rows, vocab, temperature, top_k, top_p)?;
    let inv_temperature: Vec<f32> = settings.iter().map(|s| s.inv_temperature).collect();
    let plain: Vec<bool> = settings.iter().map(|s| !s.truncates(vocab)).collect();
    // Checks the logits' length, max_log_odds and out, and computes every untruncated row.
    draft_log_odds_rows(
        logits,
        rows,
        vocab,
        &inv_temperature,
        max_log_odds,
        Some(&plain),
        out,
    )?;
    for (r, s) in settings.iter().enumerate() {
        if s.truncates(vocab) {
            out[r] = truncated_row(&logits[r * vocab..(r + 1) * vocab], s, max_log_odds);
        }
    }
    Ok(())
}

/// Each row's settings from the per-row arrays (empty: the default for every row).
fn check_settings(
    rows: usize,
    vocab: usize,
    temperature: &[f32],
    top_k: &[i64],
    top_p: &[f32],
) -> Result<Vec<RowSettings>> {
    for (argument, len) in [
        ("temperature", temperature.len()),
        ("top_k", top_k.len()),
        ("top_p", top_p.len()),
    ] {
        if len != 0 && len != rows {
            return Err(Error::value(
                argument,
                format!("must have one entry per row ({rows}) or none, got {len}"),
            ));
        }
    }
    (0..rows)
        .map(|r| {
            let t = temperature.get(r).copied().unwrap_or(1.0);
            if !t.is_finite() {
                return Err(Error::value(
                    "temperature",
                    format!("[{r}] = {t} must be finite (<= 0 for greedy)"),
                ));
            }
            let k = top_k.get(r).copied().unwrap_or(0);
            if k < -1 {
                return Err(Error::value(
                    "top_k",
                    format!("[{r}] = {k} must be >= 1, or 0 or -1 for no top-k"),
                ));
            }
            let p = top_p.get(r).copied().unwrap_or(1.0);
            if p.is_nan() || p <= 0.0 {
                return Err(Error::value(
                    "top_p",
                    format!("[{r}] = {p} must lie in (0, 1] (>= 1 is no top-p)"),
                ));
            }
            // 1 / T of a tiny positive T is +inf, which the kernel takes as its largest scale.
            let inv_temperature = if t > 0.0 { 1.0 / t } else { 1.0 };
            Ok(RowSettings {
                inv_temperature,
                top_k: usize::try_from(k)
                    .ok()
                    .filter(|&k| k > 0)
                    .map_or(vocab, |k| k.min(vocab)),
                top_p: if p >= 1.0 { 1.0 } else { f64::from(p) },
            })
        })
        .collect()
}

/// Descending order of scaled logits (`-inf` last).
fn descending(a: &f32, b: &f32) -> std::cmp::Ordering {
    b.total_cmp(a)
}

/// The feature of one truncated row (module docs).
fn truncated_row(z: &[f32], settings: &RowSettings, max_log_odds: f32) -> f32 {
    if z.iter().any(|v| v.is_nan() || *v == f32::INFINITY) {
        return f32::NAN;
    }
    let m = z.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    if m == f32::NEG_INFINITY {
        return f32::NAN;
    }
    // Scaled exponents relative to the maximum, <= 0 (a +inf scale sends every entry below
    // the maximum to -inf, where exp gives 0).
    let inv_t = settings.inv_temperature;
    let mut y: Vec<f32> = z
        .iter()
        .map(|&v| if v == m { 0.0 } else { (v - m) * inv_t })
        .collect();
    if settings.top_k < y.len() {
        y.select_nth_unstable_by(settings.top_k - 1, descending);
        y.truncate(settings.top_k);
    }
    let kept = if settings.top_p < 1.0 {
        let total: f64 = y.iter().map(|&v| f64::from(v).exp()).sum();
        nucleus(&mut y, settings.top_p * total)
    } else {
        // Top-k alone keeps all of the selected entries; their order does not matter.
        y.len()
    };
    // y[..kept] are the kept entries; one of them is the maximum (0), left out once.
    let mut complement = 0.0f64;
    let mut skipped_max = false;
    for &v in &y[..kept] {
        if v == 0.0 && !skipped_max {
            skipped_max = true;
        } else {
            complement += f64::from(v).exp();
        }
    }
    let limit = f64::from(max_log_odds);
    (-complement.ln()).clamp(-limit, limit) as f32
}

/// Orders the head of `y` and returns how many entries top-p keeps: the first `j` in
/// descending order such that the mass before entry `j` reaches `mass` (at least 1). On return
/// `y[..j]` holds exactly those entries.
fn nucleus(y: &mut [f32], mass: f64) -> usize {
    let len = y.len();
    let mut head = FIRST_HEAD.min(len);
    loop {
        if head < len {
            y.select_nth_unstable_by(head - 1, descending);
        }
        y[..head].sort_unstable_by(descending);
        let mut before = 0.0f64;
        for (j, &v) in y[..head].iter().enumerate() {
            if j > 0 && before >= mass {
                return j;
            }
            before += f64::from(v).exp();
        }
        if head == len {
            return len;
        }
        head = (head * 4).min(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::XorShift;

    /// float64 reference, written from the rule and nothing else: sort every probability of
    /// softmax(z / T) in descending order, keep the first k, renormalise, keep entry j while the
    /// mass before it is below p, and return ln(kept max / kept rest).
    fn reference(z: &[f32], t: f64, k: usize, p: f64) -> f64 {
        let m = z
            .iter()
            .fold(f64::NEG_INFINITY, |a, &v| a.max(f64::from(v)));
        let mut q: Vec<f64> = z.iter().map(|&v| ((f64::from(v) - m) / t).exp()).collect();
        q.sort_by(|a, b| b.total_cmp(a));
        q.truncate(k);
        let total: f64 = q.iter().sum();
        let mut kept = Vec::new();
        let mut before = 0.0;
        for &v in &q {
            if !kept.is_empty() && before >= p * total {
                break;
            }
            kept.push(v);
            before += v;
        }
        let rest = kept[1..].iter().fold(0.0, |a, &v| a + v);
        if rest == 0.0 {
            return 40.0;
        }
        (kept[0] / rest).ln().clamp(-40.0, 40.0)
    }

    fn feature(z: &[f32], t: f32, k: i64, p: f32) -> f32 {
        let mut out = [f32::NAN];
        draft_log_odds_sampling(z, 1, z.len(), &[t], &[k], &[p], 40.0, &mut out).unwrap();
        out[0]
    }

    /// q = (0.4, 0.3, 0.2, 0.1), in shuffled columns.
    fn hand_row() -> [f32; 4] {
        [0.2f32.ln(), 0.4f32.ln(), 0.1f32.ln(), 0.3f32.ln()]
    }

    #[test]
    fn hand_cases_follow_the_rule() {
        let z = hand_row();
        let close = |got: f32, want: f64| (f64::from(got) - want).abs() < 1e-5;
        // Untruncated: 0.4 against 0.6.
        assert!(close(feature(&z, 1.0, 0, 1.0), (0.4f64 / 0.6).ln()));
        // Top-k 2 keeps 0.4, 0.3.
        assert!(close(feature(&z, 1.0, 2, 1.0), (4.0f64 / 3.0).ln()));
        // Top-p 0.5: the mass before 0.3 is 0.4 < 0.5 (kept), before 0.2 it is 0.7 (cut).
        assert!(close(feature(&z, 1.0, 0, 0.5), (4.0f64 / 3.0).ln()));
        // Top-p 0.75 keeps three entries (0.7 < 0.75).
        assert!(close(feature(&z, 1.0, -1, 0.75), (0.4f64 / 0.5).ln()));
        // Top-p 0.35 keeps only the maximum.
        assert_eq!(feature(&z, 1.0, 0, 0.35), 40.0);
        // Top-k 3 then top-p on the renormalised (4, 3, 2) / 9: the mass before the third is
        // 7/9 = 0.78, kept under p = 0.8, cut under p = 0.7.
        assert!(close(feature(&z, 1.0, 3, 0.8), (0.4f64 / 0.5).ln()));
        assert!(close(feature(&z, 1.0, 3, 0.7), (4.0f64 / 3.0).ln()));
        // Temperature 2 on top-k 2: q ∝ (sqrt 0.4, sqrt 0.3).
        assert!(close(feature(&z, 2.0, 2, 1.0), 0.5 * (4.0f64 / 3.0).ln()));
        // Greedy (T <= 0) leaves the logits unscaled.
        assert_eq!(feature(&z, 0.0, 2, 1.0), feature(&z, 1.0, 2, 1.0));
        assert_eq!(feature(&z, -1.0, 0, 1.0), feature(&z, 1.0, 0, 1.0));
    }

    #[test]
    fn ties_leave_out_one_maximum() {
        assert_eq!(feature(&[1.0, 1.0, 0.0], 1.0, 1, 1.0), 40.0);
        assert_eq!(feature(&[1.0, 1.0, 0.0], 1.0, 2, 1.0), 0.0);
        assert_eq!(feature(&[1.0, 1.0, 0.0], 1.0, 2, 0.9), 0.0);
        // q = (0.42, 0.42, 0.16): top-p 0.5 keeps both maxima, 0.4 only one.
        assert_eq!(feature(&[1.0, 1.0, 0.0], 1.0, 0, 0.5), 0.0);
        assert_eq!(feature(&[1.0, 1.0, 0.0], 1.0, 0, 0.4), 40.0);
    }

    #[test]
    fn undefined_rows_are_nan_and_single_entries_clamp() {
        assert!(feature(&[0.0, f32::NAN, 1.0], 1.0, 2, 1.0).is_nan());
        assert!(feature(&[0.0, f32::INFINITY], 1.0, 1, 1.0).is_nan());
        assert!(feature(&[f32::NEG_INFINITY; 3], 1.0, 2, 0.5).is_nan());
        assert_eq!(
            feature(&[f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY], 1.0, 2, 0.9),
            40.0
        );
    }

    /// Random rows and settings against the float64 reference, including vocabularies large
    /// enough that the top-p head is widened several times.
    #[test]
    fn random_rows_match_the_reference() {
        let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
        for case in 0..400 {
            let vocab = [2, 5, 63, 64, 65, 300, 5000][case % 7];
            let spread = [0.5f32, 4.0, 20.0][case % 3];
            let z: Vec<f32> = (0..vocab)
                .map(|_| (rng.unit_f32() - 0.5) * spread)
                .collect();
            let t = [1.0f32, 0.3, 2.5][(case / 7) % 3];
            let k = match case % 5 {
                0 => 0,
                1 => -1,
                _ => 1 + (rng.next_u64() % vocab as u64) as i64,
            };
            let p = if case % 4 == 0 {
                1.0
            } else {
                0.05 + 0.94 * rng.unit_f32()
            };
            let got = feature(&z, t, k, p);
            let k_eff = if k <= 0 { vocab } else { k as usize };
            let want = reference(&z, f64::from(t), k_eff, f64::from(p));
            // The fused kernel's bound (features.rs): float32 exponents lose absolute precision
            // far out in the tail.
            let bound = if want.abs() <= 30.0 { 1e-4 } else { 1e-2 };
            assert!(
                (f64::from(got) - want).abs() <= bound,
                "case {case}: vocab {vocab} T {t} k {k} p {p}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn untruncated_rows_are_the_fused_kernel_bit_for_bit() {
        let mut rng = XorShift::new(0x51_7cc1_b727_220a);
        let (rows, vocab) = (6, 3000);
        let z: Vec<f32> = (0..rows * vocab)
            .map(|_| (rng.unit_f32() - 0.5) * 30.0)
            .collect();
        let temperature = [1.0f32, 0.7, 0.0, 1.3, 2.0, -1.0];
        let top_k = [0i64, -1, 0, 3000, 40, 0];
        let top_p = [1.0f32, 1.0, 1.0, 1.0, 1.0, 0.9];
        let mut got = [0.0f32; 6];
        draft_log_odds_sampling(
            &z,
            rows,
            vocab,
            &temperature,
            &top_k,
            &top_p,
            40.0,
            &mut got,
        )
        .unwrap();
        let inv: Vec<f32> = temperature
            .iter()
            .map(|&t| if t > 0.0 { 1.0 / t } else { 1.0 })
            .collect();
        let mut fused = [0.0f32; 6];
        draft_log_odds_rows(&z, rows, vocab, &inv, 40.0, None, &mut fused).unwrap();
        for r in 0..4 {
            assert_eq!(got[r].to_bits(), fused[r].to_bits(), "row {r}");
        }
        // Rows 4 and 5 truncate, so they differ from the untruncated feature.
        assert!(
            got[4] > fused[4] && got[5] > fused[5],
            "{got:?} vs {fused:?}"
        );
        // Empty settings arrays mean T = 1 and no truncation.
        let mut defaults = [0.0f32; 6];
        draft_log_odds_sampling(&z, rows, vocab, &[], &[], &[], 40.0, &mut defaults).unwrap();
        let mut ones = [0.0f32; 6];
        draft_log_odds_rows(&z, rows, vocab, &[1.0; 6], 40.0, None, &mut ones).unwrap();
        assert_eq!(defaults, ones);
    }

    #[test]
    fn bad_arguments_name_themselves_and_write_nothing() {
        let z = hand_row();
        let call = |t: &[f32], k: &[i64], p: &[f32], vocab: usize, limit: f32| {
            let mut out = [7.0f32];
            let err = draft_log_odds_sampling(&z, 1, vocab, t, k, p, limit, &mut out).unwrap_err();
            assert_eq!(out, [7.0]);
            err.to_string()
        };
        assert_eq!(
            call(&[f32::NAN], &[], &[], 4, 40.0),
            "temperature: [0] = NaN must be finite (<= 0 for greedy)"
        );
        assert_eq!(
            call(&[f32::INFINITY], &[], &[], 4, 40.0),
            "temperature: [0] = inf must be finite (<= 0 for greedy)"
        );
        assert_eq!(
            call(&[], &[-2], &[], 4, 40.0),
            "top_k: [0] = -2 must be >= 1, or 0 or -1 for no top-k"
        );
        assert_eq!(
            call(&[], &[], &[0.0], 4, 40.0),
            "top_p: [0] = 0 must lie in (0, 1] (>= 1 is no top-p)"
        );
        assert!(call(&[], &[], &[f32::NAN], 4, 40.0).starts_with("top_p: [0] = NaN"));
        assert_eq!(
            call(&[1.0, 1.0], &[], &[], 4, 40.0),
            "temperature: must have one entry per row (1) or none, got 2"
        );
        assert!(call(&[], &[], &[], 3, 40.0).starts_with("logits:"));
        assert!(call(&[], &[2], &[], 4, f32::NAN).starts_with("max_log_odds:"));
    }
}
