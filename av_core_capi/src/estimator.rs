//! `avc_estimator`: the online acceptance estimator (`av_core::AcceptanceEstimator`).
//!
//! Thread safety (docs/design.md, "Determinism and concurrency"): predict, observe, refit,
//! save and every query take the handle shared and may run concurrently from any number of
//! threads. Observations are accumulated lock-free and order-independently, so concurrent observers give the same bits
//! as a serial run; refits are serialized internally; readers never see half-updated
//! coefficients. Only avc_estimator_free needs exclusive access.

use std::sync::atomic::AtomicU64;

use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView, Update};

use crate::handle::{borrow, destroy, publish, Handle};
use crate::raw::{input, input_ref, optional_out_value, out_value, output};
use crate::status::{guard, AvcStatus, FfiError, FfiResult, AVC_ERR_BUFFER_TOO_SMALL};

/// An online acceptance estimator. Create with avc_estimator_new or avc_estimator_load, free
/// with avc_estimator_free.
#[repr(C)]
pub struct AvcEstimator {
    tag: AtomicU64,
    estimator: AcceptanceEstimator,
}

impl Handle for AvcEstimator {
    const MAGIC: u64 = u64::from_le_bytes(*b"avcESTIM");
    const NAME: &'static str = "avc_estimator";
    fn tag(&self) -> &AtomicU64 {
        &self.tag
    }
}

impl AvcEstimator {
    fn new(estimator: AcceptanceEstimator) -> Self {
        AvcEstimator {
            tag: AtomicU64::new(Self::MAGIC),
            estimator,
        }
    }
}

/// Estimator configuration. Fill it with avc_estimator_config_default, then change fields;
/// the defaults are vLLM 0.33.0's, plus av_core's bounds, memory and drift test. How the
/// estimator refits (av_core's map update by default, or vLLM's update) is
/// avc_estimator_update.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AvcEstimatorConfig {
    /// Draft positions K, 1 to 64.
    pub num_positions: usize,
    /// Observe calls per round; each round ends with a refit (default 100). 0: manual, the
    /// estimator refits only when avc_estimator_refit is called (observes only count steps).
    pub refit_interval: u64,
    /// Damping D: a round with D observations moves a coefficient half a Newton step (50).
    pub damping: f64,
    /// Ridge added to every diagonal entry of the Newton system (1e-3).
    pub l2: f64,
    /// Cold-start slope (0.5).
    pub init_slope: f64,
    /// Cold-start intercept of every position (-0.2).
    pub init_intercept: f64,
    /// Features are clamped to [-max_log_odds, max_log_odds] (40).
    pub max_log_odds: f64,
    /// Largest change of any coefficient in one refit (4; INFINITY = unbounded).
    pub max_step: f64,
    /// Largest slope (10; INFINITY = unbounded).
    pub max_slope: f64,
    /// Largest absolute intercept (15; INFINITY = unbounded).
    pub max_intercept: f64,
    /// Discount per round, in [0, 1), of the memory of past rounds' quadratic models (0.8 by
    /// default, chosen in docs/memory.md; 0 = vLLM's memoryless refit).
    pub memory: f64,
    /// Drift test threshold in standard deviations of a round's chi-squared statistic: a round
    /// beyond it drops the memory (INFINITY = never).
    pub drift_z: f64,
}

impl From<&EstimatorConfig> for AvcEstimatorConfig {
    fn from(c: &EstimatorConfig) -> Self {
        AvcEstimatorConfig {
            num_positions: c.num_positions,
            refit_interval: c.refit_interval.unwrap_or(0),
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
        }
    }
}

impl From<&AvcEstimatorConfig> for EstimatorConfig {
    /// Fields the core adds later keep their defaults until C gets a struct for them (a test
    /// below holds the C fields to the core's names and order), so a new core option never
    /// breaks the build.
    #[allow(clippy::needless_update)] // deliberate: inert today, the default for new fields
    fn from(c: &AvcEstimatorConfig) -> Self {
        EstimatorConfig {
            num_positions: c.num_positions,
            refit_interval: (c.refit_interval != 0).then_some(c.refit_interval),
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
            ..EstimatorConfig::new(c.num_positions)
        }
    }
}

/// How an estimator refits: AVC_UPDATE_MAP or AVC_UPDATE_VLLM.
pub type AvcUpdate = i32;
/// av_core's update, the default (docs/estimator.md): per-position histograms, the MAP fit
/// iterated to convergence under a prior centred on the cold start, fits after 1, 2, 4, ...
/// observes of every round. Calibrated from the first refit; observes as fast as
/// AVC_UPDATE_VLLM, refits slower (they iterate).
pub const AVC_UPDATE_MAP: AvcUpdate = 0;
/// vLLM 0.33.0's update: one damped Newton step on the round's IRLS moments per round.
pub const AVC_UPDATE_VLLM: AvcUpdate = 1;

/// The update an estimator refits with and the map update's settings (the fields of the core
/// configuration that avc_estimator_config does not hold). Fill it with
/// avc_estimator_update_default, change fields, pass it to avc_estimator_new_with_update.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AvcEstimatorUpdate {
    /// AVC_UPDATE_MAP (default) or AVC_UPDATE_VLLM.
    pub update: AvcUpdate,
    /// map: bins per position over [-max_log_odds, max_log_odds], 1 to 256 (64).
    pub bins: usize,
    /// map: prior sd of the slope (0.15; INFINITY = no slope prior).
    pub prior_slope_sd: f64,
    /// map: prior sd of the intercepts' common level (1; INFINITY = unpenalized).
    pub prior_level_sd: f64,
    /// map: prior sd of the intercepts' trend in depth (0.2; 0 = shrink toward the mean alone).
    pub prior_trend_sd: f64,
    /// map: prior sd of each intercept around the trend (0.1; INFINITY = independent).
    pub prior_spread_sd: f64,
}

impl From<&EstimatorConfig> for AvcEstimatorUpdate {
    fn from(c: &EstimatorConfig) -> Self {
        AvcEstimatorUpdate {
            update: match c.update {
                Update::Map => AVC_UPDATE_MAP,
                Update::Vllm => AVC_UPDATE_VLLM,
            },
            bins: c.bins,
            prior_slope_sd: c.prior_slope_sd,
            prior_level_sd: c.prior_level_sd,
            prior_trend_sd: c.prior_trend_sd,
            prior_spread_sd: c.prior_spread_sd,
        }
    }
}

/// The core configuration of `config` with `update`'s fields.
fn with_update(
    config: &AvcEstimatorConfig,
    update: &AvcEstimatorUpdate,
) -> FfiResult<EstimatorConfig> {
    let mode = match update.update {
        AVC_UPDATE_MAP => Update::Map,
        AVC_UPDATE_VLLM => Update::Vllm,
        other => {
            return Err(FfiError::value(
                "update",
                format!("must be AVC_UPDATE_MAP (0) or AVC_UPDATE_VLLM (1), got {other}"),
            ))
        }
    };
    Ok(EstimatorConfig {
        update: mode,
        bins: update.bins,
        prior_slope_sd: update.prior_slope_sd,
        prior_level_sd: update.prior_level_sd,
        prior_trend_sd: update.prior_trend_sd,
        prior_spread_sd: update.prior_spread_sd,
        ..EstimatorConfig::from(config)
    })
}

/// Writes the default update (AVC_UPDATE_MAP, and the map settings' defaults) to update_out.
///
/// # Safety
///
/// update_out must be NULL (an error) or point to a writable avc_estimator_update.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_update_default(
    update_out: *mut AvcEstimatorUpdate,
) -> AvcStatus {
    guard("avc_estimator_update_default", || {
        // SAFETY: the caller's contract is `out_value`'s.
        let out = unsafe { out_value(update_out, "update_out")? };
        out.write((&EstimatorConfig::new(1)).into());
        Ok(())
    })
}

/// avc_estimator_new with the update and map settings of update (avc_estimator_new uses
/// avc_estimator_update_default's). On failure *estimator_out is NULL.
///
/// Errors: AVC_ERR_NULL (config, update, estimator_out), AVC_ERR_VALUE naming the first bad
/// field ("update" for an unknown update).
///
/// # Safety
///
/// config and update must be NULL or point to initialized structs; estimator_out must be NULL
/// or point to a writable avc_estimator pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_new_with_update(
    config: *const AvcEstimatorConfig,
    update: *const AvcEstimatorUpdate,
    estimator_out: *mut *mut AvcEstimator,
) -> AvcStatus {
    guard("avc_estimator_new_with_update", || {
        // SAFETY: the caller's contract is `out_value`'s and `input_ref`'s.
        let (out, config, update) = unsafe {
            let out = out_value(estimator_out, "estimator_out")?;
            out.write(std::ptr::null_mut());
            (
                out,
                input_ref(config, "config")?,
                input_ref(update, "update")?,
            )
        };
        let estimator = AcceptanceEstimator::new(with_update(config, update)?)?;
        out.write(publish(AvcEstimator::new(estimator)));
        Ok(())
    })
}

/// Copies the estimator's update and map settings to update_out.
///
/// # Safety
///
/// estimator must be NULL or a live estimator; update_out must be NULL or point to a
/// writable avc_estimator_update.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_get_update(
    estimator: *const AvcEstimator,
    update_out: *mut AvcEstimatorUpdate,
) -> AvcStatus {
    guard("avc_estimator_get_update", || {
        // SAFETY: the caller's contract is `borrow`'s and `out_value`'s.
        let (handle, out) = unsafe {
            (
                borrow(estimator, "estimator")?,
                out_value(update_out, "update_out")?,
            )
        };
        out.write((&handle.estimator.config()).into());
        Ok(())
    })
}

/// The `[rows, cols]` feature matrix at `features`.
///
/// # Safety
///
/// `raw::input`'s contract for `rows * cols` floats.
unsafe fn matrix<'a>(
    features: *const f32,
    num_rows: usize,
    num_cols: usize,
    argument: &'static str,
) -> FfiResult<MatrixView<'a, f32>> {
    let len = num_rows.checked_mul(num_cols).ok_or_else(|| {
        FfiError::value(
            argument,
            format!("shape [{num_rows}, {num_cols}] overflows size_t"),
        )
    })?;
    // SAFETY: forwarded contract.
    let data = unsafe { input(features, len, argument)? };
    Ok(MatrixView::new(argument, data, num_rows, num_cols)?)
}

/// Writes the default configuration for num_positions draft positions to config_out.
/// num_positions is checked by avc_estimator_new, not here.
///
/// # Safety
///
/// config_out must be NULL (an error) or point to a writable avc_estimator_config.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_config_default(
    num_positions: usize,
    config_out: *mut AvcEstimatorConfig,
) -> AvcStatus {
    guard("avc_estimator_config_default", || {
        // SAFETY: the caller's contract is `out_value`'s.
        let out = unsafe { out_value(config_out, "config_out")? };
        out.write((&EstimatorConfig::new(num_positions)).into());
        Ok(())
    })
}

/// Creates a cold-started estimator. On success *estimator_out is a new handle that the
/// caller owns and must pass to avc_estimator_free; on failure it is set to NULL.
///
/// Errors: AVC_ERR_NULL (config, estimator_out), AVC_ERR_VALUE naming the first bad field.
///
/// # Safety
///
/// config must be NULL or point to an initialized avc_estimator_config; estimator_out must be
/// NULL or point to a writable avc_estimator pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_new(
    config: *const AvcEstimatorConfig,
    estimator_out: *mut *mut AvcEstimator,
) -> AvcStatus {
    guard("avc_estimator_new", || {
        // SAFETY: the caller's contract is `out_value`'s and `input_ref`'s.
        let (out, config) = unsafe {
            let out = out_value(estimator_out, "estimator_out")?;
            out.write(std::ptr::null_mut());
            (out, input_ref(config, "config")?)
        };
        let estimator = AcceptanceEstimator::new(config.into())?;
        out.write(publish(AvcEstimator::new(estimator)));
        Ok(())
    })
}

/// Frees an estimator. NULL is a no-op. Freeing a pointer that is not a live estimator (for
/// example a second free of the same pointer) returns AVC_ERR_INVALID_HANDLE and frees
/// nothing (best effort: not if a new estimator has reused the address since).
///
/// # Safety
///
/// No other call may be using the estimator, on any thread; after AVC_OK the pointer is
/// dangling.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_free(estimator: *mut AvcEstimator) -> AvcStatus {
    // SAFETY: the caller guarantees exclusive access, which is `destroy`'s contract.
    guard("avc_estimator_free", || unsafe {
        destroy(estimator, "estimator")
    })
}

/// Copies the estimator's configuration to config_out.
///
/// # Safety
///
/// estimator must be NULL or a live estimator; config_out must be NULL or point to a
/// writable avc_estimator_config.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_get_config(
    estimator: *const AvcEstimator,
    config_out: *mut AvcEstimatorConfig,
) -> AvcStatus {
    guard("avc_estimator_get_config", || {
        // SAFETY: the caller's contract is `borrow`'s and `out_value`'s.
        let (handle, out) = unsafe {
            (
                borrow(estimator, "estimator")?,
                out_value(config_out, "config_out")?,
            )
        };
        out.write((&handle.estimator.config()).into());
        Ok(())
    })
}

/// Acceptance probabilities p = sigmoid(slope * x + intercept[k]) for the row-major float
/// features [num_rows, num_cols], written to probabilities (probabilities_len = num_rows *
/// num_cols). num_cols must equal the estimator's K; features must be finite (they are
/// clamped to +-max_log_odds). num_rows = 0 is allowed and writes nothing.
///
/// Errors: AVC_ERR_NULL (estimator; features or probabilities NULL with a non-zero length),
/// AVC_ERR_VALUE (num_cols != K, probabilities_len mismatch, NaN or infinite feature,
/// probabilities overlapping features). Safe to call from many threads at once.
///
/// # Safety
///
/// estimator must be NULL or a live estimator; features must point to num_rows * num_cols
/// readable floats and probabilities to probabilities_len writable floats (either may be
/// NULL when its length is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_predict(
    estimator: *const AvcEstimator,
    features: *const f32,
    num_rows: usize,
    num_cols: usize,
    probabilities: *mut f32,
    probabilities_len: usize,
) -> AvcStatus {
    guard("avc_estimator_predict", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (handle, features, out) = unsafe {
            (
                borrow(estimator, "estimator")?,
                matrix(features, num_rows, num_cols, "features")?,
                output(probabilities, probabilities_len, "probabilities")?,
            )
        };
        if out.len() != features.data().len() {
            return Err(FfiError::value(
                "probabilities_len",
                format!(
                    "must equal num_rows * num_cols = {}, got {}",
                    features.data().len(),
                    out.len()
                ),
            ));
        }
        out.ensure_disjoint("probabilities", features.data(), "features")?;
        let mut result = vec![0.0f32; out.len()];
        handle.estimator.predict(features, &mut result)?;
        out.write(&result);
        Ok(())
    })
}

/// Folds one decode step of verdicts into the current round; refits when the round is
/// complete (every refit_interval calls).
///
/// features [num_rows, num_cols] (num_cols = K) are the draft-time features; request r had
/// num_admitted[r] drafts verified and the first num_accepted[r] of them accepted
/// (0 <= num_accepted[r] <= num_admitted[r] <= K). predictions, if not NULL, are the
/// probabilities made at draft time ([num_rows, num_cols], in [0, 1]) used as IRLS weights,
/// as vLLM does; pass NULL with predictions_len = 0 to use the current coefficients'.
/// *refitted_out (optional, may be NULL) is set to whether this call refitted.
///
/// Errors: AVC_ERR_NULL, AVC_ERR_VALUE (K mismatch, array lengths that do not match num_rows,
/// NaN or infinite features, counts out of range, predictions outside [0, 1]). A rejected
/// call changes nothing. Safe to call from many threads at once: statistics are added without a
/// lock (the call that completes a round waits for a refit in progress), the result does not
/// depend on how observations are split or interleaved, and the refit counters end as a serial
/// run of the same calls leaves them.
///
/// # Safety
///
/// estimator must be NULL or a live estimator; every array must point to at least its
/// stated number of readable elements (or be NULL with length 0); refitted_out must be NULL
/// or point to a writable bool.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_observe(
    estimator: *mut AvcEstimator,
    features: *const f32,
    num_rows: usize,
    num_cols: usize,
    num_admitted: *const i64,
    num_admitted_len: usize,
    num_accepted: *const i64,
    num_accepted_len: usize,
    predictions: *const f32,
    predictions_len: usize,
    refitted_out: *mut bool,
) -> AvcStatus {
    guard("avc_estimator_observe", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (handle, features, admitted, accepted, refitted) = unsafe {
            (
                borrow(estimator, "estimator")?,
                matrix(features, num_rows, num_cols, "features")?,
                input(num_admitted, num_admitted_len, "num_admitted")?,
                input(num_accepted, num_accepted_len, "num_accepted")?,
                optional_out_value(refitted_out, "refitted_out")?,
            )
        };
        let predictions = if predictions.is_null() && predictions_len == 0 {
            None
        } else {
            // SAFETY: as above; NULL with a non-zero length is refused inside.
            let data = unsafe { input(predictions, predictions_len, "predictions")? };
            Some(MatrixView::new("predictions", data, num_rows, num_cols)?)
        };
        let did_refit = handle
            .estimator
            .observe(features, admitted, accepted, predictions)?;
        if let Some(out) = refitted {
            out.write(did_refit);
        }
        Ok(())
    })
}

/// Ends the current round now: refits on whatever it holds and clears it (a round with no
/// observations leaves the coefficients unchanged). Safe to call concurrently with predict
/// and observe.
///
/// # Safety
///
/// estimator must be NULL or a live estimator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_refit(estimator: *mut AvcEstimator) -> AvcStatus {
    guard("avc_estimator_refit", || {
        // SAFETY: the caller's contract is `borrow`'s.
        let handle = unsafe { borrow(estimator, "estimator")? };
        handle.estimator.refit();
        Ok(())
    })
}

/// Changes the ridge l2 and the damping of every later refit, as if the estimator had been
/// created with them (a refit running concurrently uses the old pair or the new one). A
/// negative or non-finite value returns AVC_ERR_VALUE naming it and changes nothing.
///
/// # Safety
///
/// estimator must be NULL or a live estimator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_set_regularization(
    estimator: *mut AvcEstimator,
    l2: f64,
    damping: f64,
) -> AvcStatus {
    guard("avc_estimator_set_regularization", || {
        // SAFETY: the caller's contract is `borrow`'s.
        let handle = unsafe { borrow(estimator, "estimator")? };
        handle.estimator.set_regularization(l2, damping)?;
        Ok(())
    })
}

/// Copies the current coefficients: the slope to *slope_out and the K intercepts to
/// intercepts (intercepts_len must equal K). The copy is consistent (never a mix of two
/// refits) even while other threads observe and refit.
///
/// # Safety
///
/// estimator must be NULL or a live estimator; slope_out must be NULL or point to a writable
/// double; intercepts must point to intercepts_len writable doubles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_coefficients(
    estimator: *const AvcEstimator,
    slope_out: *mut f64,
    intercepts: *mut f64,
    intercepts_len: usize,
) -> AvcStatus {
    guard("avc_estimator_coefficients", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (handle, slope, out) = unsafe {
            (
                borrow(estimator, "estimator")?,
                out_value(slope_out, "slope_out")?,
                output(intercepts, intercepts_len, "intercepts")?,
            )
        };
        let k = handle.estimator.num_positions();
        if out.len() != k {
            return Err(FfiError::value(
                "intercepts_len",
                format!("must equal num_positions = {k}, got {}", out.len()),
            ));
        }
        let coefficients = handle.estimator.coefficients();
        slope.write(coefficients.slope);
        out.write(&coefficients.intercepts);
        Ok(())
    })
}

/// The number of refits so far and of observe calls since the last one. Either output may
/// be NULL if not wanted.
///
/// # Safety
///
/// estimator must be NULL or a live estimator; each output must be NULL or point to a
/// writable uint64_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_counters(
    estimator: *const AvcEstimator,
    num_refits_out: *mut u64,
    steps_since_refit_out: *mut u64,
) -> AvcStatus {
    guard("avc_estimator_counters", || {
        // SAFETY: the caller's contract is `borrow`'s and `optional_out_value`'s.
        let (handle, refits, steps) = unsafe {
            (
                borrow(estimator, "estimator")?,
                optional_out_value(num_refits_out, "num_refits_out")?,
                optional_out_value(steps_since_refit_out, "steps_since_refit_out")?,
            )
        };
        let state = handle.estimator.state();
        if let Some(out) = refits {
            out.write(state.num_refits);
        }
        if let Some(out) = steps {
            out.write(state.steps_since_refit);
        }
        Ok(())
    })
}

/// Saves the full state (configuration, coefficients, open round, counters) as versioned,
/// checksummed bytes that avc_estimator_load restores bit-exactly, on any platform.
///
/// Writes the state's size to *len_out, then the bytes to buf if cap is large enough; if not,
/// returns AVC_ERR_BUFFER_TOO_SMALL and writes nothing to buf. The size depends on the
/// configuration only (K, the update, its bins, and whether refit_interval is 0), never on
/// what the estimator observed, so the usual pattern is a first call with buf = NULL, cap = 0
/// to learn it. A map estimator's state grows with its bins, by 48 bytes per bin and position
/// (at K = 4 and 64 bins, about 12.6 kB). Observations racing the save land either in it or
/// after it, never half.
///
/// # Safety
///
/// estimator must be NULL or a live estimator; buf must point to cap writable bytes (or be
/// NULL with cap = 0); len_out must be NULL (an error) or point to a writable size_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_save(
    estimator: *const AvcEstimator,
    buf: *mut u8,
    cap: usize,
    len_out: *mut usize,
) -> AvcStatus {
    guard("avc_estimator_save", || {
        // SAFETY: the caller's contract covers each pointer with the length it is passed with.
        let (handle, out, len) = unsafe {
            (
                borrow(estimator, "estimator")?,
                output(buf, cap, "buf")?,
                out_value(len_out, "len_out")?,
            )
        };
        let bytes = handle.estimator.to_bytes();
        let needed = bytes.len();
        len.write(needed);
        if cap < needed {
            return Err(FfiError {
                status: AVC_ERR_BUFFER_TOO_SMALL,
                message: format!(
                    "buf: cap = {cap} bytes, the state needs {needed} (written to *len_out)"
                ),
            });
        }
        out.prefix(needed).write(&bytes);
        Ok(())
    })
}

/// Restores an estimator saved by avc_estimator_save. On success *estimator_out is a new
/// handle owned by the caller; on failure it is NULL. Truncated, corrupt (checksum) or
/// future-version data gives AVC_ERR_VALUE naming "data"; a state no sequence of observations
/// can produce (impossible statistics, counters or memory) gives AVC_ERR_VALUE naming the field
/// ("round_stats", "steps_since_refit", "num_refits", "memory", ...).
///
/// # Safety
///
/// data must point to len readable bytes (or be NULL with len = 0); estimator_out must be
/// NULL (an error) or point to a writable avc_estimator pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn avc_estimator_load(
    data: *const u8,
    len: usize,
    estimator_out: *mut *mut AvcEstimator,
) -> AvcStatus {
    guard("avc_estimator_load", || {
        // SAFETY: the caller's contract is `out_value`'s and `input`'s.
        let (out, bytes) = unsafe {
            let out = out_value(estimator_out, "estimator_out")?;
            out.write(std::ptr::null_mut());
            (out, input(data, len, "data")?)
        };
        let estimator = AcceptanceEstimator::from_bytes(bytes)?;
        out.write(publish(AvcEstimator::new(estimator)));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field names of a struct from its `Debug` output (`Name { a: 1, b: 2 }`).
    fn field_names(debug: &str) -> Vec<String> {
        let body = &debug[debug.find('{').unwrap() + 1..debug.rfind('}').unwrap()];
        body.split(", ")
            .map(|field| field.split(':').next().unwrap().trim().to_owned())
            .collect()
    }

    #[test]
    fn the_c_config_holds_core_fields_in_order() {
        // avc_estimator_config holds the fields it has always held, avc_estimator_update the
        // update and the map settings: each a field of the core's configuration, under its
        // name and in its order, so that neither drifts from the core. A field the core adds
        // later takes its default through the C ABI until C gets a struct for it (additive,
        // with AVC_ABI_VERSION), and the structs keep their size and layout for C code built
        // against older headers.
        for core in [EstimatorConfig::new(3), EstimatorConfig::vllm(3)] {
            let c = AvcEstimatorConfig::from(&core);
            let u = AvcEstimatorUpdate::from(&core);
            let mut names = field_names(&format!("{c:?}"));
            names.extend(field_names(&format!("{u:?}")));
            let core_names = field_names(&format!("{core:?}"));
            let mut at = core_names.iter();
            for name in &names {
                assert!(
                    at.any(|field| field == name),
                    "the C field {name} is not a field of av_core::EstimatorConfig in its order"
                );
            }
            assert_eq!(with_update(&c, &u).unwrap(), core);
        }
        // The old struct alone gives the core's defaults for the fields it lacks.
        let core = EstimatorConfig::new(3);
        assert_eq!(
            EstimatorConfig::from(&AvcEstimatorConfig::from(&core)),
            core
        );
    }

    #[test]
    fn every_c_field_reaches_the_core() {
        let c = AvcEstimatorConfig {
            num_positions: 5,
            refit_interval: 7,
            damping: 11.0,
            l2: 0.25,
            init_slope: 0.75,
            init_intercept: 0.125,
            max_log_odds: 30.0,
            max_step: 2.0,
            max_slope: 3.0,
            max_intercept: 9.0,
            memory: 0.5,
            drift_z: 6.0,
        };
        assert_eq!(AvcEstimatorConfig::from(&EstimatorConfig::from(&c)), c);
    }
}
