//! vLLM's update (`update = "vllm"`, vLLM 0.33.0's estimator kept bit for bit): the round's
//! IRLS moments at the draft-time predictions ([`RoundStats`], added lock-free), one damped
//! Newton step per round ([`super::super::refit`]), and av_core's bounds, memory of past rounds'
//! quadratic models and drift test when configured ([`Memory`]).

use super::{RefitReport, Step, UpdateRule};
use crate::error::{Error, Result};
use crate::estimator::accumulator::{Accumulator, RoundStats, MAX_COUNT};
use crate::estimator::memory::Memory;
use crate::estimator::observe::StatsScratch;
use crate::estimator::refit::{newton_step, NewtonStep};
use crate::estimator::{Common, EstimatorConfig};
use crate::sync::{Mutex, MutexGuard};

/// vLLM's update of an estimator.
#[derive(Debug)]
pub(in crate::estimator) struct VllmUpdate {
    /// The open round, added to without a lock.
    accumulator: Accumulator,
    /// The memory of past rounds, behind the refit lock.
    memory: Mutex<Memory>,
    /// What observe computes a step's statistics into, kept between calls.
    scratch: Mutex<StatsScratch>,
}

/// vLLM's update's part of an [`EstimatorState`](crate::EstimatorState) (saved as
/// `round_stats` and `memory_state`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VllmState {
    /// The open round's statistics.
    #[serde(rename = "round_stats")]
    pub round: RoundStats,
    /// The memory of past rounds (empty when `config.memory` is 0).
    #[serde(rename = "memory_state")]
    pub memory: Memory,
}

/// vLLM's update's part of a [`RefitReport`].
#[derive(Clone, Debug, PartialEq)]
pub struct VllmReport {
    /// The round's statistics (now cleared from the estimator).
    pub round: RoundStats,
}

impl VllmUpdate {
    /// Adds `stats` to the open round unless a position's count would pass [`MAX_COUNT`] (the
    /// bound a restored state must meet, so that every state this estimator reaches saves and
    /// loads again) or the statistics are impossible ([`RoundStats::validate`]); then nothing
    /// changes and the error names `argument`.
    pub(in crate::estimator) fn add_round(
        &self,
        common: &Common,
        argument: &'static str,
        stats: &RoundStats,
    ) -> Result<()> {
        let config = &common.config;
        stats.validate(argument, config.num_positions, config.max_log_odds)?;
        self.add_valid(argument, stats)
    }

    /// [`add_round`](Self::add_round) for statistics known to be valid (`step_stats` made them).
    fn add_valid(&self, argument: &'static str, stats: &RoundStats) -> Result<()> {
        self.accumulator.try_add(stats).map_err(|k| {
            Error::value(
                argument,
                format!(
                    "would take position {k}'s count in this round past {MAX_COUNT} \
                     (refit first)"
                ),
            )
        })
    }

    /// The open round (a consistent snapshot; the round goes on).
    pub(in crate::estimator) fn round(&self) -> RoundStats {
        let _refits = self.lock();
        self.accumulator.snapshot()
    }
}

impl UpdateRule for VllmUpdate {
    type State = VllmState;
    type Locked = Memory;
    const FITS_WITHIN_ROUND: bool = false;

    fn new(config: &EstimatorConfig) -> Self {
        let k = config.num_positions;
        VllmUpdate {
            accumulator: Accumulator::new(k),
            memory: Mutex::new(Memory::new(k)),
            scratch: Mutex::new(StatsScratch::new(k)),
        }
    }

    fn fresh_state(config: &EstimatorConfig, _slope: f64, _intercepts: &[f64]) -> VllmState {
        let k = config.num_positions;
        VllmState {
            round: RoundStats::new(k),
            memory: Memory::new(k),
        }
    }

    fn restore(config: &EstimatorConfig, state: &VllmState, num_refits: u64) -> Result<Self> {
        let k = config.num_positions;
        state
            .round
            .validate("round_stats", k, config.max_log_odds)?;
        state
            .memory
            .validate(k, config.memory, config.max_log_odds, num_refits)?;
        let update = VllmUpdate {
            accumulator: Accumulator::new(k),
            memory: Mutex::new(state.memory.clone()),
            scratch: Mutex::new(StatsScratch::new(k)),
        };
        update.accumulator.add(&state.round);
        Ok(update)
    }

    fn lock(&self) -> MutexGuard<'_, Memory> {
        crate::estimator::lock(&self.memory)
    }

    fn state(&self, memory: &mut Memory) -> VllmState {
        VllmState {
            round: self.accumulator.snapshot(),
            memory: memory.clone(),
        }
    }

    fn observe<T: Copy + Into<f64>, P: Copy + Into<f64>>(
        &self,
        common: &Common,
        step: Step<'_, T, P>,
        count_step: bool,
    ) -> Result<bool> {
        // The kept scratch, or a new one while another thread computes its step in it.
        let (mut kept, mut own) = (self.scratch.try_lock().ok(), None);
        let scratch = match kept.as_deref_mut() {
            Some(scratch) => scratch,
            None => own.insert(StatsScratch::new(common.config.num_positions)),
        };
        let added = common
            .step_stats(step, scratch)
            .and_then(|()| self.add_valid("num_admitted", &scratch.stats));
        drop(kept);
        added?;
        Ok(count_step && common.count_step(self))
    }

    /// One damped Newton step on the round (on the memory with the round folded in, when the
    /// memory is on), within the bounds; the round starts over.
    fn end_round(&self, common: &Common, memory: &mut Memory) -> RefitReport {
        let config = &common.config;
        let stats = self.accumulator.take();
        let mut intercepts = Vec::with_capacity(config.num_positions);
        let (slope, version) = common.coefficients.read_into(&mut intercepts);
        let [l2, damping] = common.regularization();
        let float_stats = stats.to_float();
        let step = if config.memory == 0.0 {
            newton_step(slope, &float_stats, l2, damping)
        } else {
            let (gamma, z) = (config.memory, config.drift_z);
            match memory.fold(gamma, z, &float_stats, l2, slope, &intercepts) {
                Some(system) => system.damped_step(slope, damping),
                None => NewtonStep::zero(config.num_positions),
            }
        };
        let slope = config.bounds().apply(slope, &mut intercepts, &step);
        // The count saturates at the bound a restored state must meet (no run gets there: a
        // refit every microsecond would take two thousand years), so every state reloads.
        common
            .coefficients
            .write(slope, &intercepts, (version + 1).min(MAX_COUNT));
        RefitReport {
            step,
            update: VllmReport { round: stats }.into(),
        }
    }

    fn fit_within_round(&self, _common: &Common, _memory: &mut Memory) -> Option<RefitReport> {
        None // one step per round: a fit within it does not exist
    }

    fn round_counts(&self) -> Vec<u64> {
        self.round().positions.iter().map(|p| p.n).collect()
    }
}
