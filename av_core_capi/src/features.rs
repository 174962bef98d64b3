//! `avc_draft_log_odds`: the drafter feature `x = logit(q_max)` from raw float32 logits, for
//! engines written in C (`av_core::features::sampling`). Stateless and reentrant.

use av_core::features::sampling::draft_log_odds_sampling;

use crate::raw::{input, output};
use crate::status::{guard, AvcStatus, FfiError};

/// The drafter feature x = logit(q_max) of each row of float32 logits [num_rows, vocab]
/// (row-major, num_rows * vocab elements), under the sampler settings the draft is drawn with:
/// q = softmax(z / T), truncated by top-k, then by top-p on the renormalised top-k
/// distribution (the smallest prefix, in descending order, holding at least p; never fewer
/// than one token). Writes x[r] to features (features_len = num_rows), clamped to
/// +-max_log_odds: the estimator's input (avc_estimator_predict / _observe). The feature reads
/// the drafter's distribution only, never the token drawn from it.
///
/// Per-row settings, each an array of num_rows entries or NULL with length 0 (the default for
/// every row): temperature (default 1; finite; <= 0 is greedy and leaves the logits
/// unscaled), top_k (default none; <= 0 or >= vocab is none; below -1 is an error) and top_p
/// (default none; in (0, 1], >= 1 is none). Rows that truncate nothing use the fused
/// kernel the Python API's float32 path uses; truncated rows sort only the head of the row.
///
/// A row holding a NaN or +inf logit, or no finite one, gives NaN (the estimator refuses it);
/// a row whose truncation keeps one token gives +max_log_odds. num_rows = 0 writes nothing.
///
/// Errors: AVC_ERR_NULL (an array NULL with a non-zero length); AVC_ERR_VALUE naming the
/// argument (and row) for vocab = 0, a settings array whose length is neither 0 nor num_rows,
/// features_len != num_rows, a non-finite temperature, top_k below -1, top_p NaN or <= 0,
/// max_log_odds not finite and positive, features overlapping an input. A rejected call writes
/// nothing.
///
/// # Safety
///
/// logits must point to num_rows * vocab readable floats; each settings array to its stated
/// number of readable elements (or be NULL with length 0); features to features_len writable
/// floats (or NULL with length 0). No array may be written by another thread during the call.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn avc_draft_log_odds(
    logits: *const f32,
    num_rows: usize,
    vocab: usize,
    temperature: *const f32,
    temperature_len: usize,
    top_k: *const i32,
    top_k_len: usize,
    top_p: *const f32,
    top_p_len: usize,
    max_log_odds: f32,
    features: *mut f32,
    features_len: usize,
) -> AvcStatus {
    guard("avc_draft_log_odds", || {
        if vocab == 0 {
            return Err(FfiError::value(
                "vocab",
                "must be at least 1 (the logits' row length)",
            ));
        }
        let logits_len = num_rows.checked_mul(vocab).ok_or_else(|| {
            FfiError::value(
                "num_rows",
                format!("num_rows * vocab = {num_rows} * {vocab} overflows"),
            )
        })?;
        // SAFETY: the caller's contract covers each pointer with the length it is passed with
        // (logits with num_rows * vocab).
        let (logits, temperature, top_k, top_p, out) = unsafe {
            (
                input(logits, logits_len, "logits")?,
                input(temperature, temperature_len, "temperature")?,
                input(top_k, top_k_len, "top_k")?,
                input(top_p, top_p_len, "top_p")?,
                output(features, features_len, "features")?,
            )
        };
        if out.len() != num_rows {
            return Err(FfiError::value(
                "features_len",
                format!("must equal num_rows = {num_rows}, got {}", out.len()),
            ));
        }
        out.ensure_disjoint("features", logits, "logits")?;
        out.ensure_disjoint("features", temperature, "temperature")?;
        out.ensure_disjoint("features", top_k, "top_k")?;
        out.ensure_disjoint("features", top_p, "top_p")?;
        let top_k: Vec<i64> = top_k.iter().map(|&k| i64::from(k)).collect();
        let mut result = vec![0.0f32; num_rows];
        draft_log_odds_sampling(
            logits,
            num_rows,
            vocab,
            temperature,
            &top_k,
            top_p,
            max_log_odds,
            &mut result,
        )?;
        out.write(&result);
        Ok(())
    })
}
