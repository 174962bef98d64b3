//! Helpers shared by the property tests: a seeded generator and a dense reference solver, both
//! independent of the code under test.
#![allow(dead_code)]

/// splitmix64: deterministic pseudo-random test data without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

pub fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Solves the dense `n × n` system `m x = rhs` (row-major) by Gaussian elimination with partial
/// pivoting: no structure assumed, nothing shared with the estimator's Cholesky solve.
pub fn dense_solve(mut m: Vec<f64>, mut rhs: Vec<f64>) -> Vec<f64> {
    let n = rhs.len();
    assert_eq!(m.len(), n * n);
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| m[i * n + col].abs().total_cmp(&m[j * n + col].abs()))
            .unwrap();
        if pivot != col {
            for j in 0..n {
                m.swap(col * n + j, pivot * n + j);
            }
            rhs.swap(col, pivot);
        }
        let p = m[col * n + col];
        assert!(p != 0.0, "singular reference system");
        for i in col + 1..n {
            let factor = m[i * n + col] / p;
            if factor != 0.0 {
                for j in col..n {
                    m[i * n + j] -= factor * m[col * n + j];
                }
                rhs[i] -= factor * rhs[col];
            }
        }
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let mut value = rhs[i];
        for j in i + 1..n {
            value -= m[i * n + j] * x[j];
        }
        x[i] = value / m[i * n + i];
    }
    x
}
