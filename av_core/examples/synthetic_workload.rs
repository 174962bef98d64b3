//! The estimator and the planner on a synthetic workload, in pure Rust (no Python anywhere).
//!
//! A simulated drafter proposes `K` tokens for each of `R` requests per decode step; the
//! simulated target accepts draft `k` with probability `σ(ω·x + β_k)` for known "true"
//! coefficients, stopping at the first rejection. Each step runs the serving loop of
//! docs/design.md ("One decode step"): predict → plan (budget from the previous step's
//! confidences) → verify → observe. The estimator starts from vLLM's cold start and should recover the true
//! coefficients; the planner should verify fewer drafts than were drafted while keeping most of
//! the accepted tokens. A last section observes from four threads at once and checks that the
//! coefficients are bit-identical to a serial run (docs/design.md, "Determinism and
//! concurrency").
//!
//! ```text
//! cargo run -p av_core --release --example synthetic_workload [-- STEPS]
//! ```

use std::time::Instant;

use av_core::cost_tables::CostTables;
use av_core::planner::{BudgetSource, StepTokens, VerificationPlanner};
use av_core::{AcceptanceEstimator, EstimatorConfig, MatrixView};

const REQUESTS: usize = 32;
const K: usize = 6;
const TRUE_SLOPE: f64 = 0.55;
const TRUE_INTERCEPTS: [f64; K] = [1.2, 0.6, 0.1, -0.4, -0.9, -1.3];

/// xorshift64*: small, deterministic, good enough for a simulation.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Roughly normal (Irwin–Hall of three uniforms), mean `mean`, standard deviation `sd`.
    fn normal(&mut self, mean: f64, sd: f64) -> f64 {
        let sum = self.uniform() + self.uniform() + self.uniform();
        mean + sd * (sum - 1.5) * 2.0
    }
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// One decode step's drafts: features `x = logit(q_max)` per position, and how many drafts
/// each request brought.
struct Drafts {
    features: Vec<f32>,
    scheduled: Vec<i64>,
}

fn draft_step(rng: &mut Rng) -> Drafts {
    let mut features = Vec::with_capacity(REQUESTS * K);
    for _ in 0..REQUESTS {
        // A request's drafter is confident on easy text and less so deeper into the draft.
        let easiness = rng.normal(1.5, 1.5);
        for k in 0..K {
            features.push(rng.normal(easiness - 0.3 * k as f64, 2.0) as f32);
        }
    }
    let scheduled = (0..REQUESTS).map(|_| K as i64).collect();
    Drafts {
        features,
        scheduled,
    }
}

/// The target's verdict: accepted drafts of each request (the leading run within `admitted`).
fn verify(rng: &mut Rng, features: &[f32], admitted: &[i32]) -> Vec<i64> {
    (0..REQUESTS)
        .map(|r| {
            let mut run = 0;
            for k in 0..admitted[r] as usize {
                let p = sigmoid(TRUE_SLOPE * f64::from(features[r * K + k]) + TRUE_INTERCEPTS[k]);
                if rng.uniform() >= p {
                    break;
                }
                run += 1;
            }
            run
        })
        .collect()
}

fn cost_tables() -> CostTables {
    // Profiled (batch size, ms) points of a made-up GPU: a step function up to the cudagraph
    // capture limit of 64 tokens, linear above it.
    let draft = [(1.0, 0.4), (8.0, 0.5), (32.0, 0.9), (64.0, 1.5)];
    let verify = [
        (1.0, 8.0),
        (32.0, 8.2),
        (64.0, 8.5),
        (128.0, 10.5),
        (256.0, 14.5),
        (512.0, 22.0),
    ];
    CostTables::from_curves(&draft, &verify, 64, 512, 64).expect("valid curves")
}

fn main() -> Result<(), av_core::Error> {
    let steps: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("STEPS must be a number"))
        .unwrap_or(3000);
    let mut rng = Rng(0x5EED_CAFE_F00D_BEEF);

    let estimator = AcceptanceEstimator::new(EstimatorConfig::new(K))?;
    let mut planner = VerificationPlanner::new(cost_tables(), REQUESTS, K, BudgetSource::Previous)?;
    let slots: Vec<i64> = (0..REQUESTS as i64).collect();
    let step_tokens = StepTokens {
        num_non_draft_tokens: REQUESTS,
        num_sampling_requests: REQUESTS,
        max_draft_budget: None,
    };

    println!("{REQUESTS} requests x {K} draft positions, {steps} decode steps");
    println!("true: slope {TRUE_SLOPE:.3}, intercepts {TRUE_INTERCEPTS:?}\n");
    println!(
        "{:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "step", "slope", "max|Δβ|", "verified", "accepted", "expected", "ms/token"
    );

    let mut probabilities = vec![0.0f32; REQUESTS * K];
    let mut admitted = vec![0i32; REQUESTS];
    let (mut verified, mut accepted_total, mut expected, mut cost) = (0i64, 0i64, 0.0, 0.0);
    let started = Instant::now();
    let mut history = Vec::new();
    for step in 1..=steps {
        let drafts = draft_step(&mut rng);
        let features = MatrixView::new("features", &drafts.features, REQUESTS, K)?;
        estimator.predict(features, &mut probabilities)?;
        let confidences = MatrixView::new("confidences", &probabilities, REQUESTS, K)?;
        let plan = planner.plan(
            &slots,
            confidences,
            &drafts.scheduled,
            &step_tokens,
            &mut admitted,
        )?;
        let accepted = verify(&mut rng, &drafts.features, &admitted);
        let admitted_i64: Vec<i64> = admitted.iter().map(|&a| i64::from(a)).collect();
        estimator.observe(features, &admitted_i64, &accepted, Some(confidences))?;

        verified += i64::from(admitted.iter().sum::<i32>());
        accepted_total += accepted.iter().sum::<i64>();
        expected += plan.expected_accepted_tokens - REQUESTS as f64;
        cost += plan.predicted_cost_ms;
        if step <= 100 {
            history.push((drafts.features.clone(), admitted_i64, accepted));
        }
        for slot in 0..REQUESTS {
            if rng.next_u64() % 32 == 0 {
                planner.add_request(slot)?; // a request finished; a new one took its slot
            }
        }

        if step % (steps / 6).max(1) == 0 || step == steps {
            let coefficients = estimator.coefficients();
            let worst = coefficients
                .intercepts
                .iter()
                .zip(TRUE_INTERCEPTS)
                .map(|(b, t)| (b - t).abs())
                .fold(0.0, f64::max);
            let tokens = accepted_total as f64 + (step * REQUESTS) as f64;
            println!(
                "{step:>6} {:>7.3} {worst:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.4}",
                coefficients.slope,
                verified as f64 / (step * REQUESTS * K) as f64,
                accepted_total as f64 / verified.max(1) as f64,
                expected / accepted_total.max(1) as f64,
                cost / tokens,
            );
        }
    }
    let elapsed = started.elapsed();
    let coefficients = estimator.coefficients();
    println!(
        "\nfitted: slope {:.3}, intercepts {:?}",
        coefficients.slope,
        coefficients
            .intercepts
            .iter()
            .map(|b| (b * 1000.0).round() / 1000.0)
            .collect::<Vec<_>>()
    );
    println!(
        "verified {:.1}% of drafts; {:.1}% of verified drafts accepted; {} refits; \
         {:.2} µs per step for predict + plan + observe + simulation",
        100.0 * verified as f64 / (steps * REQUESTS * K) as f64,
        100.0 * accepted_total as f64 / verified.max(1) as f64,
        estimator.num_refits(),
        elapsed.as_secs_f64() * 1e6 / steps as f64,
    );
    println!("(columns: verified = share of drafts sent to the target; accepted = share of those");
    println!(" the target accepted; expected = planner's predicted / realized accepted drafts)");

    // Concurrency: the same 100 steps observed serially, and from four threads sharing one
    // estimator by reference, give bit-identical coefficients.
    let serial = AcceptanceEstimator::new(EstimatorConfig::new(K))?;
    for (features, admitted, accepted) in &history {
        let view = MatrixView::new("features", features, REQUESTS, K)?;
        serial.observe::<f32, f32>(view, admitted, accepted, None)?;
    }
    let shared = AcceptanceEstimator::new(EstimatorConfig::new(K))?;
    std::thread::scope(|scope| {
        for part in history.chunks(history.len().div_ceil(4).max(1)) {
            let shared = &shared;
            scope.spawn(move || {
                for (features, admitted, accepted) in part.iter().rev() {
                    let view = MatrixView::new("features", features, REQUESTS, K).unwrap();
                    shared
                        .observe::<f32, f32>(view, admitted, accepted, None)
                        .unwrap();
                }
            });
        }
    });
    serial.refit();
    shared.refit();
    let same = serial.coefficients() == shared.coefficients();
    println!(
        "\n{} steps observed from 4 threads in another order: coefficients {} the serial run's",
        history.len(),
        if same {
            "bit-identical to"
        } else {
            "DIFFER from"
        }
    );
    if !same {
        std::process::exit(1);
    }
    Ok(())
}
