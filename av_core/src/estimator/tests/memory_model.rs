//! The memory of past rounds is the discounted sum of their quadratic models, as documented in
//! `memory.rs`: `A = Σ γ^age (H_s + λI)`, `b = Σ γ^age ((H_s + λI) θ_s + g_s)`, and the system a
//! refit solves is `A Δ = b − A θ` with discounted counts. Checked against that sum computed
//! densely and independently, over rounds collected under different coefficients.

use super::common::{sigmoid, Rng};
use crate::estimator::accumulator::RoundStats;
use crate::estimator::memory::Memory;

struct Round {
    stats: RoundStats,
    slope: f64,
    intercepts: Vec<f64>,
    /// Dense (H + λI) and g of this round, and its counts.
    h: Vec<f64>,
    g: Vec<f64>,
    counts: Vec<f64>,
}

fn round(rng: &mut Rng, k: usize, l2: f64) -> Round {
    let slope = rng.uniform(0.2, 1.5);
    let intercepts: Vec<f64> = (0..k).map(|_| rng.uniform(-1.5, 1.5)).collect();
    let n = k + 1;
    let mut stats = RoundStats::new(k);
    let (mut h, mut g, mut counts) = (vec![0.0; n * n], vec![0.0; n], vec![0.0; k]);
    for (pos, &beta) in intercepts.iter().enumerate() {
        for _ in 0..(20 + rng.below(60) as usize) {
            let x = rng.uniform(-3.0, 4.0);
            let p = sigmoid(slope * x + beta);
            let y = rng.unit() < 0.6;
            stats.positions[pos].add_observation(x, p, y);
            let (w, r) = (p * (1.0 - p), f64::from(u8::from(y)) - p);
            let mut v = vec![0.0; n];
            v[0] = x;
            v[pos + 1] = 1.0;
            for i in 0..n {
                g[i] += r * v[i];
                for j in 0..n {
                    h[i * n + j] += w * v[i] * v[j];
                }
            }
            counts[pos] += 1.0;
        }
    }
    for i in 0..n {
        h[i * n + i] += l2;
    }
    Round {
        stats,
        slope,
        intercepts,
        h,
        g,
        counts,
    }
}

fn close(what: &str, got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 1e-7 * want.abs().max(1.0),
        "{what}: memory {got}, discounted sum {want}"
    );
}

#[test]
fn the_memory_is_the_discounted_sum_of_the_rounds_quadratic_models() {
    let (k, l2) = (3usize, 1e-3);
    let n = k + 1;
    for gamma in [0.5, 0.8, 0.95] {
        let mut rng = Rng::new((gamma * 1000.0) as u64);
        let rounds: Vec<Round> = (0..6).map(|_| round(&mut rng, k, l2)).collect();
        let mut memory = Memory::new(k);
        let (mut a, mut b, mut counts) = (vec![0.0; n * n], vec![0.0; n], vec![0.0; k]);
        // The coefficients the refit steps from (any will do for the identity).
        let (slope, intercepts) = (0.7, vec![0.1, -0.4, 0.3]);
        for (s, r) in rounds.iter().enumerate() {
            // Fold round s (collected under its own coefficients); no drift test.
            let system = memory
                .fold(
                    gamma,
                    f64::INFINITY,
                    &r.stats.to_float(),
                    l2,
                    r.slope,
                    &r.intercepts,
                )
                .expect("the round has observations");
            // The independent discounted sum, expanded around each round's θ_s.
            let theta_s: Vec<f64> = std::iter::once(r.slope)
                .chain(r.intercepts.clone())
                .collect();
            for v in a.iter_mut().chain(&mut b).chain(&mut counts) {
                *v *= gamma;
            }
            for i in 0..n {
                b[i] += r.g[i] + (0..n).map(|j| r.h[i * n + j] * theta_s[j]).sum::<f64>();
                for j in 0..n {
                    a[i * n + j] += r.h[i * n + j];
                }
            }
            for (c, rc) in counts.iter_mut().zip(&r.counts) {
                *c += rc;
            }
            // The returned system is A and b − Aθ at θ = the round's own coefficients.
            let gradient: Vec<f64> = (0..n)
                .map(|i| b[i] - (0..n).map(|j| a[i * n + j] * theta_s[j]).sum::<f64>())
                .collect();
            let at = format!("γ={gamma} round {s}");
            close(&format!("{at} a"), system.a, a[0]);
            close(&format!("{at} g0"), system.g0, gradient[0]);
            for pos in 0..k {
                close(&format!("{at} b[{pos}]"), system.b[pos], a[(pos + 1) * n]);
                close(
                    &format!("{at} c[{pos}]"),
                    system.c[pos],
                    a[(pos + 1) * n + pos + 1],
                );
                close(
                    &format!("{at} g1[{pos}]"),
                    system.g1[pos],
                    gradient[pos + 1],
                );
                close(&format!("{at} n[{pos}]"), system.counts[pos], counts[pos]);
            }
            close(&format!("{at} total"), system.total, counts.iter().sum());
        }
        // An empty round decays everything, the right-hand side included.
        let before = memory.clone();
        let empty = RoundStats::new(k).to_float();
        assert!(memory
            .fold(gamma, f64::INFINITY, &empty, l2, slope, &intercepts)
            .is_none());
        for (after, prior) in memory.rhs.iter().zip(&before.rhs) {
            close("decayed rhs", *after, prior * gamma);
        }
        close("decayed a", memory.a, before.a * gamma);
    }
}
