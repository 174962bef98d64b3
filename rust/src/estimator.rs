//! `av_core._native.AcceptanceEstimator`: conversion around `av_core::AcceptanceEstimator`.

use av_core::estimator::{
    HistogramMemory, HistogramStats, Memory, PositionSums, RoundStats, FRACTION_BITS,
    X_FRACTION_BITS,
};
use av_core::{AcceptanceEstimator, EstimatorConfig, EstimatorState, MapState, MatrixView, Update};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyType};
use std::path::PathBuf;

use crate::convert::{
    float_matrix, int_vector, to_py_err, type_error, value_error, Float, FloatMatrix, FloatView,
    Int,
};
use crate::files::{atomic_write, read_file};

/// Name and version of the `state_dict` layout (version 1, before the map update, still loads
/// as a vllm estimator, and is still written for a vllm estimator at the default map settings).
const STATE_FORMAT: &str = "av_core.AcceptanceEstimator";
const STATE_FORMAT_VERSION: u32 = 2;

/// The update named by a Python string (`argument` names it in the error).
fn parse_update(name: &str, argument: &str) -> PyResult<Update> {
    Update::parse(name).ok_or_else(|| {
        value_error(
            argument,
            format!("must be \"map\" or \"vllm\", got {name:?}"),
        )
    })
}

/// Online acceptance estimator: p = sigmoid(slope * x + intercept[k]) on x = logit(q_max),
/// refitted from the target's verdicts (update "vllm", the default: vLLM's damped Newton step
/// every `refit_interval` observe calls; "map", opt-in: MAP fits of per-position histograms
/// after 1, 2, 4, ... observes of every round and at its end).
#[pyclass(module = "av_core._native", name = "AcceptanceEstimator", frozen)]
pub struct PyAcceptanceEstimator {
    inner: AcceptanceEstimator,
}

#[pymethods]
impl PyAcceptanceEstimator {
    #[new]
    #[pyo3(signature = (
        num_positions,
        *,
        refit_interval = Int::new(EstimatorConfig::DEFAULT_REFIT_INTERVAL as i128),
        damping = Float::new(EstimatorConfig::DEFAULT_DAMPING),
        l2 = Float::new(EstimatorConfig::DEFAULT_L2),
        init_slope = Float::new(EstimatorConfig::DEFAULT_INIT_SLOPE),
        init_intercept = Float::new(EstimatorConfig::DEFAULT_INIT_INTERCEPT),
        max_log_odds = Float::new(EstimatorConfig::DEFAULT_MAX_LOG_ODDS),
        max_step = Float::new(EstimatorConfig::DEFAULT_MAX_STEP),
        max_slope = Float::new(EstimatorConfig::DEFAULT_MAX_SLOPE),
        max_intercept = Float::new(EstimatorConfig::DEFAULT_MAX_INTERCEPT),
        memory = Float::new(EstimatorConfig::DEFAULT_MEMORY),
        drift_z = Float::new(EstimatorConfig::DEFAULT_DRIFT_Z),
        update = "vllm",
        bins = Int::new(EstimatorConfig::DEFAULT_BINS as i128),
        prior_slope_sd = Float::new(EstimatorConfig::DEFAULT_PRIOR_SLOPE_SD),
        prior_level_sd = Float::new(EstimatorConfig::DEFAULT_PRIOR_LEVEL_SD),
        prior_trend_sd = Float::new(EstimatorConfig::DEFAULT_PRIOR_TREND_SD),
        prior_spread_sd = Float::new(EstimatorConfig::DEFAULT_PRIOR_SPREAD_SD),
    ), text_signature = "(num_positions, *, refit_interval=100, damping=50.0, l2=0.001, init_slope=0.5, init_intercept=-0.2, max_log_odds=40.0, max_step=4.0, max_slope=10.0, max_intercept=15.0, memory=0.8, drift_z=3.09, update='vllm', bins=64, prior_slope_sd=0.15, prior_level_sd=1.0, prior_trend_sd=0.2, prior_spread_sd=0.1)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_positions: Int,
        refit_interval: Int,
        damping: Float,
        l2: Float,
        init_slope: Float,
        init_intercept: Float,
        max_log_odds: Float,
        max_step: Float,
        max_slope: Float,
        max_intercept: Float,
        memory: Float,
        drift_z: Float,
        update: &str,
        bins: Int,
        prior_slope_sd: Float,
        prior_level_sd: Float,
        prior_trend_sd: Float,
        prior_spread_sd: Float,
    ) -> PyResult<Self> {
        let config = EstimatorConfig {
            num_positions: num_positions.to_usize("num_positions")?,
            refit_interval: refit_interval.to_u64("refit_interval")?,
            damping: damping.value("damping")?,
            l2: l2.value("l2")?,
            init_slope: init_slope.value("init_slope")?,
            init_intercept: init_intercept.value("init_intercept")?,
            max_log_odds: max_log_odds.value("max_log_odds")?,
            max_step: max_step.value("max_step")?,
            max_slope: max_slope.value("max_slope")?,
            max_intercept: max_intercept.value("max_intercept")?,
            memory: memory.value("memory")?,
            drift_z: drift_z.value("drift_z")?,
            update: parse_update(update, "update")?,
            bins: bins.to_usize("bins")?,
            prior_slope_sd: prior_slope_sd.value("prior_slope_sd")?,
            prior_level_sd: prior_level_sd.value("prior_level_sd")?,
            prior_trend_sd: prior_trend_sd.value("prior_trend_sd")?,
            prior_spread_sd: prior_spread_sd.value("prior_spread_sd")?,
        };
        let inner = AcceptanceEstimator::new(config).map_err(to_py_err)?;
        Ok(PyAcceptanceEstimator { inner })
    }

    /// Acceptance probabilities, float32 [R, K], for features [R, K] (float32 or float64).
    fn predict<'py>(
        &self,
        py: Python<'py>,
        features: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let inner = &self.inner;
        // In place when C-contiguous: the core copies it once, checking as it copies.
        let matrix = float_matrix(features, "features", inner.num_positions())?;
        let (rows, cols) = (matrix.rows(), matrix.cols());
        let view = matrix.view("features")?;
        let out = py
            .detach(|| {
                let len = view_len(view);
                let mut out = Vec::new();
                out.try_reserve_exact(len).map_err(|_| {
                    av_core::Error::value("features", format!("no memory for {len} probabilities"))
                })?;
                out.resize(len, 0.0f32);
                match view {
                    FloatView::F32(v) => inner.predict(v, &mut out),
                    FloatView::F64(v) => inner.predict(v, &mut out),
                }
                .map(|()| out)
            })
            .map_err(to_py_err)?;
        let array = Array2::from_shape_vec((rows, cols), out)
            .map_err(|e| value_error("features", format!("shape [{rows}, {cols}]: {e}")))?;
        Ok(array.into_pyarray(py))
    }

    /// Folds one decode step of verdicts into the round; True when it refitted (vllm: it
    /// completed a round; map: it completed a round, or was the round's 1st, 2nd, 4th, ...).
    /// With `count_step=False` the verdicts join the round without counting a step (no refit
    /// runs): for callers that run the schedule themselves with `refit`.
    #[pyo3(signature = (features, num_admitted, num_accepted, predictions = None, *, count_step = true))]
    fn observe(
        &self,
        py: Python<'_>,
        features: &Bound<'_, PyAny>,
        num_admitted: &Bound<'_, PyAny>,
        num_accepted: &Bound<'_, PyAny>,
        predictions: Option<&Bound<'_, PyAny>>,
        count_step: bool,
    ) -> PyResult<bool> {
        let k = self.inner.num_positions();
        // Every array is copied here, with the GIL held, before the core sees it: a buffer
        // another thread rewrites once the GIL is released cannot change what was checked.
        let features = float_matrix(features, "features", k)?;
        let num_admitted = int_vector(num_admitted, "num_admitted")?;
        let num_accepted = int_vector(num_accepted, "num_accepted")?;
        let predictions: Option<FloatMatrix> = predictions
            .filter(|p| !p.is_none())
            .map(|p| float_matrix(p, "predictions", k))
            .transpose()?;
        let features = features.view("features")?;
        let predictions = predictions
            .as_ref()
            .map(|p| p.view("predictions"))
            .transpose()?;
        let inner = &self.inner;
        let (admitted, accepted): (&[i64], &[i64]) = (&num_admitted, &num_accepted);
        py.detach(|| observe_views(inner, features, admitted, accepted, predictions, count_step))
            .map_err(to_py_err)
    }

    /// Ends the round now: refits on whatever it holds and clears it. With `report=True`,
    /// returns the round's statistics (as in `state_dict()["round_stats"]`), the Newton step
    /// taken from them (`slope_step`, `intercept_steps`, before the step and range bounds) and
    /// the round's drift statistic (`drift_statistic`: about chi-square with K + 1 degrees of
    /// freedom while the coefficients it was collected under fit).
    #[pyo3(signature = (*, report = false, end_round = true))]
    fn refit<'py>(
        &self,
        py: Python<'py>,
        report: bool,
        end_round: bool,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let inner = &self.inner;
        let outcome = if end_round {
            py.detach(|| inner.refit())
        } else {
            py.detach(|| inner.refit_within_round())
                .map_err(to_py_err)?
        };
        if !report {
            return Ok(None);
        }
        let d = match (&outcome.histogram, inner.config().update) {
            (_, Update::Vllm) => stats_dict(py, &outcome.stats)?,
            (Some(round), Update::Map) => histogram_dict(py, round)?,
            (None, Update::Map) => PyDict::new(py),
        };
        d.set_item("slope_step", outcome.step.slope)?;
        d.set_item("intercept_steps", outcome.step.intercepts)?;
        let drift = match inner.config().update {
            Update::Vllm => inner.drift_statistic(&outcome.stats),
            Update::Map => outcome.drift_statistic.unwrap_or(f64::NAN),
        };
        d.set_item("drift_statistic", drift)?;
        d.set_item("iterations", outcome.iterations)?;
        d.set_item("end_round", end_round)?;
        Ok(Some(d))
    }

    /// Adds another round's statistics (a dict as in `state_dict()["round_stats"]`) to the open
    /// round, exactly: e.g. the other ranks' share of a round pooled across data-parallel ranks
    /// (`av_core.distributed.pool_round`). Refused, adding nothing, if the fraction bits or the
    /// number of positions differ or an `a`/`c` entry is negative.
    fn add_round_stats(&self, py: Python<'_>, round_stats: &Bound<'_, PyAny>) -> PyResult<()> {
        let inner = &self.inner;
        let config = inner.config();
        match config.update {
            Update::Vllm => {
                let stats = parse_round_stats(round_stats, "round_stats")?;
                py.detach(|| inner.add_round_stats(&stats))
                    .map_err(to_py_err)
            }
            Update::Map => {
                let round = parse_histogram(
                    round_stats,
                    "round_stats",
                    config.num_positions,
                    config.bins,
                )?;
                py.detach(|| inner.add_round_histogram(&round))
                    .map_err(to_py_err)
            }
        }
    }

    /// Shared slope.
    #[getter]
    fn slope(&self) -> f64 {
        self.inner.coefficients().slope
    }

    /// Per-position intercepts, float64 [K] (a copy).
    #[getter]
    fn intercepts<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        self.inner.coefficients().intercepts.into_pyarray(py)
    }

    /// Number of draft positions K.
    #[getter]
    fn num_positions(&self) -> usize {
        self.inner.num_positions()
    }

    /// Refits so far.
    #[getter]
    fn num_refits(&self) -> u64 {
        self.inner.num_refits()
    }

    /// Observe calls since the last refit.
    #[getter]
    fn steps_since_refit(&self) -> u64 {
        self.inner.steps_since_refit()
    }

    /// Observe calls per round.
    #[getter]
    fn refit_interval(&self) -> u64 {
        self.inner.config().refit_interval
    }

    /// Damping D, in observations.
    #[getter]
    fn damping(&self) -> f64 {
        self.inner.config().damping
    }

    /// Ridge λ.
    #[getter]
    fn l2(&self) -> f64 {
        self.inner.config().l2
    }

    /// Feature clamp.
    #[getter]
    fn max_log_odds(&self) -> f64 {
        self.inner.config().max_log_odds
    }

    /// Largest change of a coefficient in one refit.
    #[getter]
    fn max_step(&self) -> f64 {
        self.inner.config().max_step
    }

    /// Largest slope.
    #[getter]
    fn max_slope(&self) -> f64 {
        self.inner.config().max_slope
    }

    /// Largest absolute intercept.
    #[getter]
    fn max_intercept(&self) -> f64 {
        self.inner.config().max_intercept
    }

    /// Discount γ per round of the memory of past rounds (0 = vLLM's memoryless refit).
    #[getter]
    fn memory(&self) -> f64 {
        self.inner.config().memory
    }

    /// Drift test threshold (standard deviations); inf disables the test.
    #[getter]
    fn drift_z(&self) -> f64 {
        self.inner.config().drift_z
    }

    /// How the estimator refits: "map" (av_core's) or "vllm" (vLLM's damped Newton step).
    #[getter]
    fn update(&self) -> &'static str {
        self.inner.config().update.name()
    }

    /// map: bins per position of the feature histograms.
    #[getter]
    fn bins(&self) -> usize {
        self.inner.config().bins
    }

    /// map: the prior sd of the slope.
    #[getter]
    fn prior_slope_sd(&self) -> f64 {
        self.inner.config().prior_slope_sd
    }

    /// map: the prior sd of the intercepts' level.
    #[getter]
    fn prior_level_sd(&self) -> f64 {
        self.inner.config().prior_level_sd
    }

    /// map: the prior sd of the intercepts' trend in depth.
    #[getter]
    fn prior_trend_sd(&self) -> f64 {
        self.inner.config().prior_trend_sd
    }

    /// map: the prior sd of each intercept around the trend.
    #[getter]
    fn prior_spread_sd(&self) -> f64 {
        self.inner.config().prior_spread_sd
    }

    /// The state as versioned, checksummed bytes (see `from_bytes`).
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.to_bytes())
    }

    /// Rebuilds an estimator from `to_bytes()`; corrupt, truncated or future-version data
    /// raises ValueError.
    #[classmethod]
    fn from_bytes(_cls: &Bound<'_, PyType>, data: &[u8]) -> PyResult<Self> {
        let inner = AcceptanceEstimator::from_bytes(data).map_err(to_py_err)?;
        Ok(PyAcceptanceEstimator { inner })
    }

    /// Writes `to_bytes()` to `path` atomically: a temporary file in the same directory,
    /// flushed to disk, then renamed over `path`, so a crash leaves the old file intact.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let bytes = self.inner.to_bytes();
        py.detach(|| atomic_write(&path, &bytes))
    }

    /// Loads an estimator written by `save`. A corrupt, truncated or future-version file raises
    /// ValueError naming the path.
    #[classmethod]
    fn load(_cls: &Bound<'_, PyType>, py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let bytes =
            py.detach(|| read_file(&path, av_core::persist::estimator::MAX_ENCODED_LEN as u64))?;
        let inner = AcceptanceEstimator::from_bytes(&bytes)
            .map_err(|e| value_error("path", format!("{}: {e}", path.display())))?;
        Ok(PyAcceptanceEstimator { inner })
    }

    /// Labeled observations per position in the open round, int64 [K].
    fn round_counts<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let counts: Vec<i64> = self
            .inner
            .round_counts()
            .iter()
            .map(|&n| n as i64)
            .collect();
        counts.into_pyarray(py)
    }

    /// Everything (config, coefficients, round statistics, counters) as plain Python values;
    /// `from_state_dict` restores it bit-exactly. Statistics are exact fixed-point integers in
    /// units of 2**-fraction_bits.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = self.inner.state();
        let config = PyDict::new(py);
        config.set_item("num_positions", state.config.num_positions)?;
        set_options(&config, &state.config)?;
        // A vllm estimator at the default map settings (anyone who did not opt into map) keeps
        // the version-1 layout, as the bytes do (`persist::estimator::written_version`).
        let version_1 = av_core::persist::estimator::written_version(&state)
            == av_core::persist::estimator::FORMAT_VERSION_1;
        let version = if version_1 { 1 } else { STATE_FORMAT_VERSION };
        if version >= 2 {
            config.set_item("update", state.config.update.name())?;
            config.set_item("bins", state.config.bins)?;
            config.set_item("prior_slope_sd", state.config.prior_slope_sd)?;
            config.set_item("prior_level_sd", state.config.prior_level_sd)?;
            config.set_item("prior_trend_sd", state.config.prior_trend_sd)?;
            config.set_item("prior_spread_sd", state.config.prior_spread_sd)?;
        }
        let stats = match &state.map {
            None => stats_dict(py, &state.stats)?,
            Some(map) => histogram_dict(py, &map.round)?,
        };
        let d = PyDict::new(py);
        d.set_item("format", STATE_FORMAT)?;
        d.set_item("format_version", version)?;
        d.set_item("config", config)?;
        d.set_item("slope", state.slope)?;
        d.set_item("intercepts", state.intercepts)?;
        d.set_item("round_stats", stats)?;
        d.set_item("steps_since_refit", state.steps_since_refit)?;
        d.set_item("num_refits", state.num_refits)?;
        let memory = PyDict::new(py);
        match &state.map {
            None => {
                let m = &state.memory;
                memory.set_item("a", m.a)?;
                memory.set_item("b", m.b.clone())?;
                memory.set_item("c", m.c.clone())?;
                memory.set_item("rhs", m.rhs.clone())?;
                memory.set_item("total", m.total)?;
                memory.set_item("counts", m.counts.clone())?;
                memory.set_item("resets", m.resets)?;
            }
            Some(map) => {
                memory.set_item("count", map.memory.count.clone())?;
                memory.set_item("accepted", map.memory.accepted.clone())?;
                memory.set_item("x_sum", map.memory.x_sum.clone())?;
                memory.set_item("resets", map.resets)?;
                let reference = PyDict::new(py);
                reference.set_item("slope", map.reference_slope)?;
                reference.set_item("intercepts", map.reference_intercepts.clone())?;
                d.set_item("reference", reference)?;
                d.set_item("fitted_labels", map.fitted_labels)?;
            }
        }
        d.set_item("memory_state", memory)?;
        Ok(d)
    }

    /// Rebuilds an estimator from `state_dict()`, validating every field. A state of format
    /// version 1 (before the map update) is a vllm estimator and restores as one. With
    /// `update`, the estimator moves to that update: the configuration and coefficients are
    /// kept, the open round and the memory of past rounds start over.
    #[classmethod]
    #[pyo3(signature = (state, *, update = None))]
    fn from_state_dict(
        _cls: &Bound<'_, PyType>,
        state: &Bound<'_, PyAny>,
        update: Option<&str>,
    ) -> PyResult<Self> {
        let mut state = parse_state(state)?;
        if let Some(name) = update {
            state = state.with_update(parse_update(name, "update")?);
        }
        let inner = AcceptanceEstimator::from_state(&state).map_err(to_py_err)?;
        Ok(PyAcceptanceEstimator { inner })
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyDict>,))> {
        let constructor = slf.get_type().getattr("from_state_dict")?;
        Ok((constructor, (slf.get().state_dict(py)?,)))
    }

    fn __repr__(&self) -> String {
        let c = self.inner.coefficients();
        format!(
            "AcceptanceEstimator(num_positions={}, slope={:.4}, intercepts={:?}, num_refits={})",
            self.inner.num_positions(),
            c.slope,
            c.intercepts
                .iter()
                .map(|b| (b * 1e4).round() / 1e4)
                .collect::<Vec<_>>(),
            c.version
        )
    }
}

/// Registers the class and the core's estimator constants: `MAX_LOG_ODDS` (the log-odds clamp),
/// `ESTIMATOR_DEFAULTS` (the constructor's keyword defaults, `EstimatorConfig::new`) and
/// `VLLM_ESTIMATOR` (the keywords of vLLM 0.33.0's estimator, `EstimatorConfig::vllm`), the
/// mappings read-only.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyAcceptanceEstimator>()?;
    m.add("MAX_LOG_ODDS", EstimatorConfig::DEFAULT_MAX_LOG_ODDS)?;
    let py = m.py();
    let frozen = py.import("types")?.getattr("MappingProxyType")?;
    for (name, config) in [
        ("ESTIMATOR_DEFAULTS", EstimatorConfig::new(1)),
        ("VLLM_ESTIMATOR", EstimatorConfig::vllm(1)),
    ] {
        let options = PyDict::new(py);
        set_options(&options, &config)?;
        m.add(name, frozen.call1((options,))?)?;
    }
    Ok(())
}

/// Every configuration field but `num_positions` and the update's (`update`, `bins`, the prior
/// widths: opt-in, in `state_dict()["config"]` only of a version-2 state), by its keyword in the
/// constructor (and key in `state_dict()["config"]`).
fn set_options(d: &Bound<'_, PyDict>, config: &EstimatorConfig) -> PyResult<()> {
    d.set_item("refit_interval", config.refit_interval)?;
    d.set_item("damping", config.damping)?;
    d.set_item("l2", config.l2)?;
    d.set_item("init_slope", config.init_slope)?;
    d.set_item("init_intercept", config.init_intercept)?;
    d.set_item("max_log_odds", config.max_log_odds)?;
    d.set_item("max_step", config.max_step)?;
    d.set_item("max_slope", config.max_slope)?;
    d.set_item("max_intercept", config.max_intercept)?;
    d.set_item("memory", config.memory)?;
    d.set_item("drift_z", config.drift_z)?;
    Ok(())
}

/// A round's fixed-point statistics as a dict of per-position integer lists.
fn stats_dict<'py>(py: Python<'py>, stats: &RoundStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("fraction_bits", FRACTION_BITS)?;
    let column =
        |f: fn(&PositionSums) -> i128| -> Vec<i128> { stats.positions.iter().map(f).collect() };
    d.set_item("a", column(|p| p.a))?;
    d.set_item("b", column(|p| p.b))?;
    d.set_item("c", column(|p| p.c))?;
    d.set_item("g0", column(|p| p.g0))?;
    d.set_item("g1", column(|p| p.g1))?;
    let counts: Vec<u64> = stats.positions.iter().map(|p| p.n).collect();
    d.set_item("n", counts)?;
    Ok(d)
}

/// A round's histograms as a dict of flat, position-major integer lists (K·B entries each).
fn histogram_dict<'py>(py: Python<'py>, round: &HistogramStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("fraction_bits", X_FRACTION_BITS)?;
    d.set_item("bins", round.bins)?;
    d.set_item("count", round.count.clone())?;
    d.set_item("accepted", round.accepted.clone())?;
    d.set_item("x_sum", round.x_sum.clone())?;
    Ok(d)
}

/// Histograms from the dict `histogram_dict` writes, for an estimator of `num_positions`
/// positions and `bins` bins (`arg` names it in errors).
fn parse_histogram(
    item: &Bound<'_, PyAny>,
    arg: &'static str,
    num_positions: usize,
    bins: usize,
) -> PyResult<HistogramStats> {
    let s = item
        .cast::<PyDict>()
        .map_err(|_| type_error(arg, "round_stats must be a dict"))?;
    let bits: u32 = int_field(s, "fraction_bits", arg, U64)?;
    if bits != X_FRACTION_BITS {
        return Err(value_error(
            arg,
            format!(
                "round_stats hold {bits} fraction bits, this estimator's histograms \
                 {X_FRACTION_BITS} (a vllm round given to a map estimator?)"
            ),
        ));
    }
    let theirs: usize = int_field(s, "bins", arg, U64)?;
    if theirs != bins {
        return Err(value_error(
            arg,
            format!("round_stats have {theirs} bins, this estimator {bins}"),
        ));
    }
    Ok(HistogramStats {
        num_positions,
        bins,
        count: int_list(s, "count", arg, U64)?,
        accepted: int_list(s, "accepted", arg, U64)?,
        x_sum: int_list(s, "x_sum", arg, U64)?,
    })
}

/// Number of elements of a view.
fn view_len(view: FloatView<'_>) -> usize {
    match view {
        FloatView::F32(v) => v.data().len(),
        FloatView::F64(v) => v.data().len(),
    }
}

/// Dispatches `observe` over the dtype combinations.
fn observe_views(
    inner: &AcceptanceEstimator,
    features: FloatView<'_>,
    num_admitted: &[i64],
    num_accepted: &[i64],
    predictions: Option<FloatView<'_>>,
    count_step: bool,
) -> av_core::Result<bool> {
    fn one<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        inner: &AcceptanceEstimator,
        features: MatrixView<'_, T>,
        num_admitted: &[i64],
        num_accepted: &[i64],
        predictions: Option<MatrixView<'_, P>>,
        count_step: bool,
    ) -> av_core::Result<bool> {
        if count_step {
            inner.observe(features, num_admitted, num_accepted, predictions)
        } else {
            inner
                .add_observations(features, num_admitted, num_accepted, predictions)
                .map(|()| false)
        }
    }
    fn with<T: Copy + Into<f64>>(
        inner: &AcceptanceEstimator,
        features: MatrixView<'_, T>,
        num_admitted: &[i64],
        num_accepted: &[i64],
        predictions: Option<FloatView<'_>>,
        count_step: bool,
    ) -> av_core::Result<bool> {
        let (a, b) = (num_admitted, num_accepted);
        match predictions {
            None => one::<T, f32>(inner, features, a, b, None, count_step),
            Some(FloatView::F32(p)) => one(inner, features, a, b, Some(p), count_step),
            Some(FloatView::F64(p)) => one(inner, features, a, b, Some(p), count_step),
        }
    }
    match features {
        FloatView::F32(f) => with(
            inner,
            f,
            num_admitted,
            num_accepted,
            predictions,
            count_step,
        ),
        FloatView::F64(f) => with(
            inner,
            f,
            num_admitted,
            num_accepted,
            predictions,
            count_step,
        ),
    }
}

fn get_item<'py>(d: &Bound<'py, PyDict>, key: &str, argument: &str) -> PyResult<Bound<'py, PyAny>> {
    d.get_item(key)?
        .ok_or_else(|| value_error(argument, format!("missing key {key:?}")))
}

fn extract<'py, T: FromPyObjectOwned<'py>>(
    d: &Bound<'py, PyDict>,
    key: &str,
    argument: &str,
) -> PyResult<T> {
    get_item(d, key, argument)?.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        type_error(argument, format!("key {key:?}: {e}"))
    })
}

/// An integer field in `min..=max`: a bool or a non-integer is a `TypeError`, a value out of
/// range a `ValueError`, both naming the key.
fn int_field<T: TryFrom<i128>>(
    d: &Bound<'_, PyDict>,
    key: &str,
    argument: &str,
    (min, max): (i128, i128),
) -> PyResult<T> {
    let value: Int = extract(d, key, argument)?;
    checked_int(&value, &format!("{argument}[{key:?}]"), (min, max))
}

/// Each entry of an integer list field, as [`int_field`].
fn int_list<T: TryFrom<i128>>(
    d: &Bound<'_, PyDict>,
    key: &str,
    argument: &str,
    (min, max): (i128, i128),
) -> PyResult<Vec<T>> {
    let values: Vec<Int> = extract(d, key, argument)?;
    values
        .iter()
        .enumerate()
        .map(|(i, v)| checked_int(v, &format!("{argument}[{key:?}][{i}]"), (min, max)))
        .collect()
}

/// `value` as a `T` in `min..=max`; `named` is how errors name it (`state["steps_since_refit"]`).
fn checked_int<T: TryFrom<i128>>(
    value: &Int,
    named: &str,
    (min, max): (i128, i128),
) -> PyResult<T> {
    let v = value.in_range(named, min, max)?;
    T::try_from(v).map_err(|_| value_error(named, format!("{v} is out of range")))
}

/// A float field: a bool or a non-number is a `TypeError`, an int beyond float range a
/// `ValueError`.
fn float_field(d: &Bound<'_, PyDict>, key: &str, argument: &str) -> PyResult<f64> {
    let value: Float = extract(d, key, argument)?;
    value.value(&format!("{argument}[{key:?}]"))
}

/// A list of floats, as [`float_field`].
fn float_list(d: &Bound<'_, PyDict>, key: &str, argument: &str) -> PyResult<Vec<f64>> {
    let values: Vec<Float> = extract(d, key, argument)?;
    values
        .iter()
        .enumerate()
        .map(|(i, v)| v.value(&format!("{argument}[{key:?}][{i}]")))
        .collect()
}

const U64: (i128, i128) = (0, u64::MAX as i128);
const I128: (i128, i128) = (i128::MIN, i128::MAX);

fn parse_state(state: &Bound<'_, PyAny>) -> PyResult<EstimatorState> {
    let arg = "state";
    let d = state
        .cast::<PyDict>()
        .map_err(|_| type_error(arg, "expected a dict from state_dict()"))?;
    let format: String = extract(d, "format", arg)?;
    if format != STATE_FORMAT {
        return Err(value_error(
            arg,
            format!("format is {format:?}, expected {STATE_FORMAT:?}"),
        ));
    }
    let version: u32 = int_field(d, "format_version", arg, U64)?;
    if !(1..=STATE_FORMAT_VERSION).contains(&version) {
        return Err(value_error(
            arg,
            format!(
                "format_version {version} is not supported (this build reads 1 to \
                 {STATE_FORMAT_VERSION})"
            ),
        ));
    }
    let config_item = get_item(d, "config", arg)?;
    let c = config_item
        .cast::<PyDict>()
        .map_err(|_| type_error(arg, "key \"config\" must be a dict"))?;
    let mut config = EstimatorConfig {
        num_positions: int_field(c, "num_positions", arg, U64)?,
        refit_interval: int_field(c, "refit_interval", arg, U64)?,
        damping: float_field(c, "damping", arg)?,
        l2: float_field(c, "l2", arg)?,
        init_slope: float_field(c, "init_slope", arg)?,
        init_intercept: float_field(c, "init_intercept", arg)?,
        max_log_odds: float_field(c, "max_log_odds", arg)?,
        max_step: float_field(c, "max_step", arg)?,
        max_slope: float_field(c, "max_slope", arg)?,
        max_intercept: float_field(c, "max_intercept", arg)?,
        memory: float_field(c, "memory", arg)?,
        drift_z: float_field(c, "drift_z", arg)?,
        ..EstimatorConfig::new(1)
    };
    // Version 1 is the vllm update with the map fields' defaults.
    if version >= 2 {
        let update: String = extract(c, "update", arg)?;
        config.update = parse_update(&update, "state[\"config\"][\"update\"]")?;
        config.bins = int_field(c, "bins", arg, U64)?;
        config.prior_slope_sd = float_field(c, "prior_slope_sd", arg)?;
        config.prior_level_sd = float_field(c, "prior_level_sd", arg)?;
        config.prior_trend_sd = float_field(c, "prior_trend_sd", arg)?;
        config.prior_spread_sd = float_field(c, "prior_spread_sd", arg)?;
    }
    let memory_item = get_item(d, "memory_state", arg)?;
    let m = memory_item
        .cast::<PyDict>()
        .map_err(|_| type_error(arg, "key \"memory_state\" must be a dict"))?;
    let k = config.num_positions;
    let (stats, memory, map) = match config.update {
        Update::Vllm => {
            let stats = parse_round_stats(&get_item(d, "round_stats", arg)?, arg)?;
            let memory = Memory {
                a: float_field(m, "a", arg)?,
                b: float_list(m, "b", arg)?,
                c: float_list(m, "c", arg)?,
                rhs: float_list(m, "rhs", arg)?,
                total: float_field(m, "total", arg)?,
                counts: float_list(m, "counts", arg)?,
                resets: int_field(m, "resets", arg, U64)?,
            };
            (stats, memory, None)
        }
        Update::Map => {
            let round = parse_histogram(&get_item(d, "round_stats", arg)?, arg, k, config.bins)?;
            let reference_item = get_item(d, "reference", arg)?;
            let r = reference_item
                .cast::<PyDict>()
                .map_err(|_| type_error(arg, "key \"reference\" must be a dict"))?;
            let map = MapState {
                reference_slope: float_field(r, "slope", arg)?,
                reference_intercepts: float_list(r, "intercepts", arg)?,
                round,
                memory: HistogramMemory {
                    num_positions: k,
                    bins: config.bins,
                    count: float_list(m, "count", arg)?,
                    accepted: float_list(m, "accepted", arg)?,
                    x_sum: float_list(m, "x_sum", arg)?,
                },
                fitted_labels: int_field(d, "fitted_labels", arg, U64)?,
                resets: int_field(m, "resets", arg, U64)?,
            };
            (RoundStats::new(k), Memory::new(k), Some(map))
        }
    };
    Ok(EstimatorState {
        config,
        slope: float_field(d, "slope", arg)?,
        intercepts: float_list(d, "intercepts", arg)?,
        stats,
        steps_since_refit: int_field(d, "steps_since_refit", arg, U64)?,
        num_refits: int_field(d, "num_refits", arg, U64)?,
        memory,
        map,
    })
}

/// A round's statistics from the dict `stats_dict` writes (`argument` names it in errors).
fn parse_round_stats(item: &Bound<'_, PyAny>, arg: &'static str) -> PyResult<RoundStats> {
    let s = item
        .cast::<PyDict>()
        .map_err(|_| type_error(arg, "round_stats must be a dict"))?;
    let bits: u32 = int_field(s, "fraction_bits", arg, U64)?;
    if bits != FRACTION_BITS {
        return Err(value_error(
            arg,
            format!("round_stats use {bits} fraction bits, this build uses {FRACTION_BITS}"),
        ));
    }
    let columns: Vec<Vec<i128>> = ["a", "b", "c", "g0", "g1"]
        .iter()
        .map(|key| int_list::<i128>(s, key, arg, I128))
        .collect::<PyResult<_>>()?;
    let n: Vec<u64> = int_list(s, "n", arg, U64)?;
    if columns.iter().any(|col| col.len() != n.len()) {
        return Err(value_error(
            arg,
            "round_stats columns have different lengths",
        ));
    }
    let positions = (0..n.len())
        .map(|k| PositionSums {
            a: columns[0][k],
            b: columns[1][k],
            c: columns[2][k],
            g0: columns[3][k],
            g1: columns[4][k],
            n: n[k],
        })
        .collect();
    Ok(RoundStats { positions })
}
