//! `av_core._native.AcceptanceEstimator` and its `EstimatorConfig`: conversion around
//! `av_core::AcceptanceEstimator`. The `state_dict` format, the refit report and the names of
//! the configuration's fields are the core's (`av_core::persist::state_dict`); this file turns
//! their trees into Python values and back ([`crate::tree`]).

use av_core::persist::state_dict;
use av_core::persist::tree::Value;
use av_core::{AcceptanceEstimator, ErrorKind, EstimatorConfig, MatrixView, Update};
use numpy::ndarray::Ix2;
use numpy::{IntoPyArray, PyArray1, PyArray2};
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCFunction, PyDict, PyString, PyTuple, PyType};
use std::path::PathBuf;

use crate::convert::{
    byte_string, computed_into, detach_if, float_matrix, int_vector, to_py_err, value_error, Flag,
    Float, FloatMatrix, FloatView, Int, Text,
};
use crate::files::{atomic_write, read_file};
use crate::tree::{from_py, to_py, tree_to_dict};

/// Online acceptance estimator: p = sigmoid(slope * x + intercept[k]) on x = logit(q_max),
/// refitted from the target's verdicts (update "map", the default: MAP fits of per-position
/// histograms after 1, 2, 4, ... observes of every round and at its end; "vllm": vLLM's damped
/// Newton step every `refit_interval` observe calls).
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
        refit_interval = Some(Int::new(EstimatorConfig::DEFAULT_REFIT_INTERVAL as i128)),
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
        update = Text::new(Update::default().name()),
        bins = Int::new(EstimatorConfig::DEFAULT_BINS as i128),
        prior_slope_sd = Float::new(EstimatorConfig::DEFAULT_PRIOR_SLOPE_SD),
        prior_level_sd = Float::new(EstimatorConfig::DEFAULT_PRIOR_LEVEL_SD),
        prior_trend_sd = Float::new(EstimatorConfig::DEFAULT_PRIOR_TREND_SD),
        prior_spread_sd = Float::new(EstimatorConfig::DEFAULT_PRIOR_SPREAD_SD),
    ), text_signature = "(num_positions, *, refit_interval=100, damping=50.0, l2=0.001, init_slope=0.5, init_intercept=-0.2, max_log_odds=40.0, max_step=4.0, max_slope=10.0, max_intercept=15.0, memory=0.8, drift_z=3.09, update='map', bins=64, prior_slope_sd=0.15, prior_level_sd=1.0, prior_trend_sd=0.2, prior_spread_sd=0.1)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_positions: Int,
        refit_interval: Option<Int>,
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
        update: Text,
        bins: Int,
        prior_slope_sd: Float,
        prior_level_sd: Float,
        prior_trend_sd: Float,
        prior_spread_sd: Float,
    ) -> PyResult<Self> {
        let config = EstimatorConfig {
            num_positions: num_positions.to_usize("num_positions")?,
            // At least 1 (None is the manual mode): the range the message states.
            refit_interval: refit_interval
                .map(|v| {
                    v.in_range("refit_interval", 1, i128::from(u64::MAX))
                        .map(|n| n as u64)
                })
                .transpose()?,
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
            update: Update::named(update.value("update")?, "update").map_err(to_py_err)?,
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
        // A copy (`convert`'s module docs), which the core checks as it computes; small batches
        // run with the GIL held (`convert::DETACH_AT`).
        let matrix = float_matrix(features, "features", inner.num_positions())?;
        let (rows, cols) = (matrix.rows(), matrix.cols());
        let view = matrix.view("features")?;
        let len = view_len(view);
        let no_memory = || value_error("features", format!("no memory for {len} probabilities"));
        let ((), probabilities) = computed_into(py, Ix2(rows, cols), no_memory, |out| {
            detach_if(py, len, || match view {
                FloatView::F32(v) => inner.predict(v, out),
                FloatView::F64(v) => inner.predict(v, out),
            })
            .map_err(to_py_err)
        })?;
        Ok(probabilities)
    }

    /// Folds one decode step of verdicts into the round; True when it refitted (vllm: it
    /// completed a round; map: it completed a round, or was the round's 1st, 2nd, 4th, ...).
    /// With `count_step=False` the verdicts join the round without counting a step (no refit
    /// runs): for callers that run the schedule themselves with `refit`.
    #[pyo3(signature = (features, num_admitted, num_accepted, predictions = None, *, count_step = Flag::new(true)), text_signature = "($self, features, num_admitted, num_accepted, predictions=None, *, count_step=True)")]
    fn observe(
        &self,
        py: Python<'_>,
        features: &Bound<'_, PyAny>,
        num_admitted: &Bound<'_, PyAny>,
        num_accepted: &Bound<'_, PyAny>,
        predictions: Option<&Bound<'_, PyAny>>,
        count_step: Flag,
    ) -> PyResult<bool> {
        let count_step = count_step.value("count_step")?;
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
        detach_if(py, view_len(features), || {
            observe_views(inner, features, admitted, accepted, predictions, count_step)
        })
        .map_err(to_py_err)
    }

    /// Ends the round now: refits on whatever it holds and clears it. With `report=True`,
    /// returns the round's statistics (as in `state_dict()["round_stats"]`), the Newton step
    /// taken from them (`slope_step`, `intercept_steps`, before the step and range bounds) and
    /// the round's drift statistic (`drift_statistic`: about chi-square with K + 1 degrees of
    /// freedom while the coefficients it was collected under fit).
    #[pyo3(
        signature = (*, report = Flag::new(false), end_round = Flag::new(true)),
        text_signature = "($self, *, report=False, end_round=True)"
    )]
    fn refit<'py>(
        &self,
        py: Python<'py>,
        report: Flag,
        end_round: Flag,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let (report, end_round) = (report.value("report")?, end_round.value("end_round")?);
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
        tree_to_dict(py, &state_dict::refit_report(inner, &outcome, end_round)).map(Some)
    }

    /// Changes the ridge `l2` and the damping of every later refit, as if the estimator had
    /// been built with them (bit for bit the estimator `from_state_dict` rebuilds with the two
    /// fields changed). Atomic: a refit running concurrently uses the old pair or the new one.
    /// A bad value raises ValueError naming it, and nothing changes.
    #[pyo3(signature = (*, l2, damping))]
    fn set_regularization(&self, l2: Float, damping: Float) -> PyResult<()> {
        let (l2, damping) = (l2.value("l2")?, damping.value("damping")?);
        self.inner
            .set_regularization(l2, damping)
            .map_err(to_py_err)
    }

    /// Adds another round's statistics (a dict as in `state_dict()["round_stats"]`) to the open
    /// round, exactly: e.g. the other ranks' share of a round pooled across data-parallel ranks
    /// (`av_core.distributed.pool_round`). Refused, adding nothing, if the fraction bits or the
    /// number of positions differ or an `a`/`c` entry is negative.
    fn add_round_stats(&self, py: Python<'_>, round_stats: &Bound<'_, PyAny>) -> PyResult<()> {
        let inner = &self.inner;
        let round = from_py(round_stats, "round_stats")?;
        py.detach(|| inner.add_round_tree(&round, "round_stats"))
            .map_err(to_py_err)
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

    /// The configuration, a frozen `EstimatorConfig` (each field is also an attribute of the
    /// estimator: `est.l2 == est.config.l2`).
    #[getter]
    fn config(&self) -> PyEstimatorConfig {
        PyEstimatorConfig {
            inner: self.inner.config().clone(),
        }
    }

    /// The state as versioned, checksummed bytes (see `from_bytes`).
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.to_bytes())
    }

    /// Rebuilds an estimator from `to_bytes()` (bytes or any bytes-like object); corrupt,
    /// truncated or future-version data raises ValueError.
    #[classmethod]
    fn from_bytes(_cls: &Bound<'_, PyType>, data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let data = byte_string(data, "data")?;
        let inner = AcceptanceEstimator::from_bytes(&data).map_err(to_py_err)?;
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
        tree_to_dict(py, &state_dict::encode(&self.inner.state()))
    }

    /// Rebuilds an estimator from `state_dict()`, validating every field. A state of format
    /// version 1 (before the map update) is a vllm estimator and restores as one. With
    /// `update`, the estimator moves to that update: the configuration and coefficients are
    /// kept, the open round and the memory of past rounds start over (the state is validated
    /// whole first, so a corrupt one is refused whatever the update).
    #[classmethod]
    #[pyo3(signature = (state, *, update = None))]
    fn from_state_dict(
        _cls: &Bound<'_, PyType>,
        state: &Bound<'_, PyAny>,
        update: Option<Text>,
    ) -> PyResult<Self> {
        let update = update
            .map(|name| Update::named(name.value("update")?, "update").map_err(to_py_err))
            .transpose()?;
        let state = state_dict::decode(&from_py(state, "state")?, "state", ErrorKind::Value)
            .map_err(to_py_err)?;
        let inner = match update {
            // The core validates the state as saved before it moves.
            Some(update) => AcceptanceEstimator::from_state_with_update(&state, update),
            None => AcceptanceEstimator::from_state(&state),
        }
        .map_err(to_py_err)?;
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

/// The configuration of an estimator (`AcceptanceEstimator.config`), frozen: every field of the
/// core's `EstimatorConfig` as an attribute and by key (`config.l2`, `config["l2"]`), in the
/// constructor's order, so `AcceptanceEstimator(**est.config)` builds a cold estimator with the
/// same configuration and `dict(config)` is a plain dict.
#[pyclass(module = "av_core._native", name = "EstimatorConfig", frozen, eq)]
#[derive(PartialEq)]
pub struct PyEstimatorConfig {
    inner: EstimatorConfig,
}

#[pymethods]
impl PyEstimatorConfig {
    fn __getitem__<'py>(&self, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        // Any other key, a non-string included, is missing (a KeyError, as a dict's).
        let value = named_field(key).and_then(|name| field(&self.inner, name));
        let value = value.ok_or_else(|| PyKeyError::new_err(key.clone().unbind()))?;
        to_py(key.py(), &value)
    }

    fn __contains__(&self, key: &Bound<'_, PyAny>) -> bool {
        named_field(key).is_some()
    }

    fn __len__(&self) -> usize {
        EstimatorConfig::FIELD_DOCS.len()
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.keys(py)?.as_any().try_iter()?.into_any())
    }

    /// The field names, in the constructor's order.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, EstimatorConfig::FIELD_DOCS.iter().map(|(name, _)| name))
    }

    /// The fields as a new dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        tree_to_dict(py, &state_dict::config(&self.inner))
    }

    /// The configuration `fields` describes, as `to_dict()` writes it: `num_positions` is
    /// required, a field left out takes the constructor's default, and a key that names no
    /// field, a value of the wrong type or out of range raises (ValueError / TypeError naming
    /// the field), as `AcceptanceEstimator(**fields)` would. Any Mapping is read (an
    /// `EstimatorConfig` gives itself); a key that is not a string is refused.
    #[classmethod]
    fn from_dict(_cls: &Bound<'_, PyType>, fields: &Bound<'_, PyAny>) -> PyResult<Self> {
        if let Ok(config) = fields.cast::<PyEstimatorConfig>() {
            return Ok(PyEstimatorConfig {
                inner: config.get().inner.clone(),
            });
        }
        let inner =
            state_dict::decode_config(&from_py(fields, "fields")?, "fields").map_err(to_py_err)?;
        Ok(PyEstimatorConfig { inner })
    }

    /// Pickling: rebuilt by `from_dict` from `to_dict()`.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyDict>,))> {
        let constructor = slf.get_type().getattr("from_dict")?;
        Ok((constructor, (slf.get().to_dict(py)?,)))
    }

    /// The configuration is immutable: a copy is the same object.
    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
    }

    /// The hash of the fields' values: equal configurations hash alike (`0.0` and `-0.0`
    /// included, as Python's floats do).
    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        let values = self.to_dict(py)?.values();
        PyTuple::new(py, values)?.hash()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let mut parts = Vec::with_capacity(EstimatorConfig::FIELD_DOCS.len());
        for (name, value) in self.to_dict(py)?.iter() {
            parts.push(format!("{name}={}", value.repr()?));
        }
        Ok(format!("EstimatorConfig({})", parts.join(", ")))
    }
}

/// The config field `key` names, if it is a string naming one.
fn named_field(key: &Bound<'_, PyAny>) -> Option<&'static str> {
    let name = key.cast::<PyString>().ok()?;
    let name = name.to_str().ok()?;
    let fields = EstimatorConfig::FIELD_DOCS.iter();
    fields.map(|&(field, _)| field).find(|&field| field == name)
}

/// The value of the field `name` in `config`'s tree.
fn field(config: &EstimatorConfig, name: &str) -> Option<Value> {
    state_dict::config(config).get(name).cloned()
}

/// Adds every field of the configuration to `class` as a read-only property (with the core's
/// one-line doc, [`EstimatorConfig::FIELD_DOCS`]) reading it from the config `config_of` finds
/// in an instance: one list of fields, not a getter per field.
fn add_config_properties(
    class: &Bound<'_, PyType>,
    config_of: fn(&Bound<'_, PyAny>) -> PyResult<EstimatorConfig>,
) -> PyResult<()> {
    let py = class.py();
    let property = py.import("builtins")?.getattr("property")?;
    for &(name, doc) in &EstimatorConfig::FIELD_DOCS {
        let getter = PyCFunction::new_closure(
            py,
            None,
            None,
            move |args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>| {
                let config = config_of(&args.get_item(0)?)?;
                let value = field(&config, name).unwrap_or(Value::None);
                to_py(args.py(), &value).map(Bound::unbind)
            },
        )?;
        let none = py.None();
        class.setattr(
            name,
            property.call1((getter, none.clone_ref(py), none, doc))?,
        )?;
    }
    Ok(())
}

/// Registers the classes and the core's estimator constants: `MAX_LOG_ODDS` (the log-odds
/// clamp), `ESTIMATOR_DEFAULTS` (the constructor's keyword defaults of format version 1,
/// `EstimatorConfig::new`) and `VLLM_ESTIMATOR` (the keywords of vLLM 0.33.0's estimator,
/// `EstimatorConfig::vllm`), the mappings read-only.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyAcceptanceEstimator>()?;
    m.add_class::<PyEstimatorConfig>()?;
    let py = m.py();
    add_config_properties(&py.get_type::<PyAcceptanceEstimator>(), |obj| {
        Ok(obj
            .cast::<PyAcceptanceEstimator>()?
            .get()
            .inner
            .config()
            .clone())
    })?;
    add_config_properties(&py.get_type::<PyEstimatorConfig>(), |obj| {
        Ok(obj.cast::<PyEstimatorConfig>()?.get().inner.clone())
    })?;
    m.add("MAX_LOG_ODDS", EstimatorConfig::DEFAULT_MAX_LOG_ODDS)?;
    let frozen = py.import("types")?.getattr("MappingProxyType")?;
    for (name, config) in [
        ("ESTIMATOR_DEFAULTS", EstimatorConfig::new(1)),
        ("VLLM_ESTIMATOR", EstimatorConfig::vllm(1)),
    ] {
        let options = tree_to_dict(py, &state_dict::options(&config))?;
        m.add(name, frozen.call1((options,))?)?;
    }
    Ok(())
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
