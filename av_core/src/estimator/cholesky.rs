//! A small dense Cholesky solve for the Newton step.
//!
//! The refit solves `(H + λI) Δ = g` with `n = K + 1 ≤ 65` unknowns. `H + λI` is symmetric
//! positive definite whenever `λ > 0` (`H = XᵀWX` is positive semi-definite), so `LLᵀ`
//! factorisation is the stable, allocation-light choice; at these sizes a hand-written loop beats
//! any library call. The arrowhead structure admits a closed form (a Schur complement on the
//! slope), which the tests use as an independent check rather than as a second code path.

/// Solves `m · x = rhs` in place for a symmetric positive-definite `n × n` matrix stored
/// row-major in `m` (only the lower triangle is read; `m` is overwritten by the factor `L`).
///
/// Returns `false`, leaving `rhs` unspecified, when `m` is not numerically positive definite
/// (a pivot that is not strictly positive and finite); the caller treats that step as non-finite.
pub fn solve_spd(m: &mut [f64], rhs: &mut [f64]) -> bool {
    let n = rhs.len();
    assert_eq!(m.len(), n * n, "matrix must be n × n for n = rhs.len()");
    for j in 0..n {
        let mut diagonal = m[j * n + j];
        for p in 0..j {
            diagonal -= m[j * n + p] * m[j * n + p];
        }
        if !(diagonal > 0.0 && diagonal.is_finite()) {
            return false;
        }
        let pivot = diagonal.sqrt();
        m[j * n + j] = pivot;
        for i in j + 1..n {
            let mut value = m[i * n + j];
            for p in 0..j {
                value -= m[i * n + p] * m[j * n + p];
            }
            m[i * n + j] = value / pivot;
        }
    }
    // Forward substitution L y = rhs, then back substitution Lᵀ x = y.
    for i in 0..n {
        let mut value = rhs[i];
        for p in 0..i {
            value -= m[i * n + p] * rhs[p];
        }
        rhs[i] = value / m[i * n + i];
    }
    for i in (0..n).rev() {
        let mut value = rhs[i];
        for p in i + 1..n {
            value -= m[p * n + i] * rhs[p];
        }
        rhs[i] = value / m[i * n + i];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The arrowhead system `[[a, bᵀ], [b, diag(c)]] [ω; β] = [g0; g1]` in closed form:
    /// eliminate β through the Schur complement of the diagonal block.
    fn arrowhead_solve(a: f64, b: &[f64], c: &[f64], g0: f64, g1: &[f64]) -> Vec<f64> {
        let schur = a - b.iter().zip(c).map(|(b, c)| b * b / c).sum::<f64>();
        let coupled = g0
            - b.iter()
                .zip(c)
                .zip(g1)
                .map(|((b, c), g)| b * g / c)
                .sum::<f64>();
        let omega = coupled / schur;
        let mut x = vec![omega];
        x.extend(
            b.iter()
                .zip(c)
                .zip(g1)
                .map(|((b, c), g)| (g - b * omega) / c),
        );
        x
    }

    fn arrowhead_matrix(a: f64, b: &[f64], c: &[f64]) -> Vec<f64> {
        let n = b.len() + 1;
        let mut m = vec![0.0; n * n];
        m[0] = a;
        for k in 0..b.len() {
            m[k + 1] = b[k];
            m[(k + 1) * n] = b[k];
            m[(k + 1) * n + k + 1] = c[k];
        }
        m
    }

    /// An arrowhead `XᵀWX + λI` built from random observations, so it is positive definite.
    fn arrowhead_strategy() -> impl Strategy<Value = (f64, Vec<f64>, Vec<f64>, f64, Vec<f64>)> {
        (1usize..=64).prop_flat_map(|k| {
            (
                proptest::collection::vec((-40.0f64..40.0, 0.0f64..0.25, 0usize..50), k),
                proptest::collection::vec(-100.0f64..100.0, k + 1),
                1e-3f64..1.0,
            )
                .prop_map(move |(obs, g, ridge)| {
                    let mut a = ridge;
                    let mut b = vec![0.0; k];
                    let mut c = vec![ridge; k];
                    for (i, &(x, w, count)) in obs.iter().enumerate() {
                        let n = count as f64;
                        a += n * w * x * x;
                        b[i] = n * w * x;
                        c[i] += n * w;
                    }
                    (a, b, c, g[0], g[1..].to_vec())
                })
        })
    }

    #[test]
    fn solves_a_hand_system() {
        // [[4, 2], [2, 3]] x = [2, 1] → x = [0.5, 0].
        let mut m = vec![4.0, 2.0, 2.0, 3.0];
        let mut rhs = vec![2.0, 1.0];
        assert!(solve_spd(&mut m, &mut rhs));
        assert!((rhs[0] - 0.5).abs() < 1e-15 && rhs[1].abs() < 1e-15);
    }

    #[test]
    fn rejects_matrices_that_are_not_positive_definite() {
        let mut m = vec![1.0, 2.0, 2.0, 1.0];
        assert!(!solve_spd(&mut m, &mut [1.0, 1.0]));
        let mut zero = vec![0.0; 4];
        assert!(!solve_spd(&mut zero, &mut [0.0, 0.0]));
        let mut nan = vec![f64::NAN, 0.0, 0.0, 1.0];
        assert!(!solve_spd(&mut nan, &mut [0.0, 0.0]));
    }

    proptest! {
        #[test]
        fn residual_is_small((a, b, c, g0, g1) in arrowhead_strategy()) {
            let matrix = arrowhead_matrix(a, &b, &c);
            let mut rhs = vec![g0];
            rhs.extend(&g1);
            let mut factor = matrix.clone();
            let mut x = rhs.clone();
            prop_assert!(solve_spd(&mut factor, &mut x));
            let n = rhs.len();
            let scale = matrix.iter().fold(0.0f64, |m, v| m.max(v.abs()))
                * x.iter().fold(0.0f64, |m, v| m.max(v.abs()))
                + rhs.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for i in 0..n {
                let lhs: f64 = (0..n).map(|j| matrix[i * n + j] * x[j]).sum();
                prop_assert!((lhs - rhs[i]).abs() <= 1e-9 * scale, "row {i}: {lhs} vs {}", rhs[i]);
            }
        }

        #[test]
        fn agrees_with_the_arrowhead_closed_form((a, b, c, g0, g1) in arrowhead_strategy()) {
            let mut factor = arrowhead_matrix(a, &b, &c);
            let mut x = vec![g0];
            x.extend(&g1);
            prop_assert!(solve_spd(&mut factor, &mut x));
            let closed = arrowhead_solve(a, &b, &c, g0, &g1);
            for (got, want) in x.iter().zip(&closed) {
                prop_assert!((got - want).abs() <= 1e-7 * (1.0 + want.abs()), "{got} vs {want}");
            }
        }
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn solve_spd_example() {
        use crate::estimator::cholesky::solve_spd;

        // [[4, 2], [2, 3]] x = [10, 8]  →  x = [1.75, 1.5]
        let mut m = [4.0, 2.0, 2.0, 3.0];
        let mut rhs = [10.0, 8.0];
        assert!(solve_spd(&mut m, &mut rhs));
        assert!((rhs[0] - 1.75).abs() < 1e-12 && (rhs[1] - 1.5).abs() < 1e-12);
        // Singular: refused rather than dividing by zero.
        assert!(!solve_spd(&mut [1.0, 1.0, 1.0, 1.0], &mut [1.0, 1.0]));
    }
}
