//! Acceptance probabilities `p = σ(z) = 1 / (1 + e^(-z))`, `z = ω·x + β_k`, for a whole batch
//! of features at once: what [`AcceptanceEstimator::predict`](crate::AcceptanceEstimator::predict)
//! returns.
//!
//! Why not `1.0 / (1.0 + (-z).exp())` per entry: libm's `exp` is a call the compiler cannot
//! vectorize, and from `R·K = 4096` on numpy's SIMD `exp` beat it. Here `e^w`, `w = -z`, is
//! evaluated in explicit arrays of one vector's lanes that the compiler vectorizes:
//!
//! * `w` is clamped to `±120`. Beyond it `σ` rounds to exactly 0 or 1 in float32 either way
//!   (`σ(-120) ≈ 7.7e-53`, far below float32's smallest subnormal), and `e^w` stays normal.
//! * `w = n·ln 2 + r`: `n` is the nearest integer to `w·log2(e)` (the `1.5·2^52` rounding
//!   trick), `r = (w − n·ln2_hi) − n·ln2_lo` with fdlibm's split of `ln 2` (`n·ln2_hi` is
//!   exact), so `|r| ≤ ln(2)/2`.
//! * `e^r` is its Taylor polynomial to degree 12 (truncation below `3.5e-16` relative at
//!   `|r| = ln(2)/2`), evaluated by Estrin's scheme: a dependency chain four products deep
//!   instead of Horner's twelve, which had left the loop waiting on latency.
//! * `2^n` is added into the exponent field, then one float64 division and a rounding to
//!   float32.
//!
//! Nothing is fused (Rust never contracts `a * b + c`), so the SSE2 baseline and the AVX2 and
//! AVX-512 variants ([`crate::simd`]) give the same bits. Against glibc's
//! `(1 / (1 + exp(-z))) as f32` the result agreed on every one of 4 million `z` spread over
//! `[-130, 130]` (the tests check a million), since the float64 value is within a few ulps of
//! the exact one and float32 rounding hides the difference.

use crate::simd;

/// The intercept pattern's length is a multiple of this: the widest group of lanes (one
/// AVX-512 vector of float64).
const LANES: usize = 8;
/// `|w|` beyond this gives a float32 `σ` of exactly 0 or 1 anyway.
const W_LIMIT: f64 = 120.0;
/// `1.5·2^52`: adding it rounds a float64 of magnitude below `2^51` to an integer held in the
/// low mantissa bits.
const ROUND_MAGIC: f64 = 6_755_399_441_055_744.0;
/// fdlibm's two-part `ln 2` (`ln2_hi ≈ 0.693147180369`, `ln2_lo ≈ 1.9082e-10`): the high part
/// has 32 significant bits (its last 21 mantissa bits are zero), so `n·ln2_hi` is exact for the
/// `|n| ≤ 174` that the clamp allows.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);

/// Taylor coefficients `1/j!`, `j = 0..=12`.
const C: [f64; 13] = [
    1.0,
    1.0,
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5_040.0,
    1.0 / 40_320.0,
    1.0 / 362_880.0,
    1.0 / 3_628_800.0,
    1.0 / 39_916_800.0,
    1.0 / 479_001_600.0,
];

/// `σ(z)` rounded to float32; the arithmetic of every lane of the batch kernel behind `predict`.
///
/// ```rust
/// use av_core::logistic::probability;
///
/// assert_eq!(probability(0.0), 0.5);
/// assert_eq!(probability(-3f64.ln()), 0.25); // 1 / (1 + 3)
/// assert_eq!((probability(200.0), probability(f64::NEG_INFINITY)), (1.0, 0.0));
/// ```
#[inline(always)]
pub fn probability(z: f64) -> f32 {
    // NaN never reaches here: features and coefficients are finite.
    let w = (-z).clamp(-W_LIMIT, W_LIMIT);
    let shifted = w * std::f64::consts::LOG2_E + ROUND_MAGIC;
    let n = shifted - ROUND_MAGIC;
    let r = (w - n * LN2_HI) - n * LN2_LO;
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    let pairs = [
        C[0] + r * C[1],
        C[2] + r * C[3],
        C[4] + r * C[5],
        C[6] + r * C[7],
        C[8] + r * C[9],
        C[10] + r * C[11],
    ];
    let quads = [
        pairs[0] + r2 * pairs[1],
        pairs[2] + r2 * pairs[3],
        pairs[4] + r2 * pairs[5],
    ];
    let low = quads[0] + r4 * quads[1];
    let high = quads[2] + r4 * C[12];
    let exp_r = low + r8 * high;
    // The low mantissa bits of `shifted` hold n (two's complement); shifted into the exponent
    // field they multiply by 2^n (|n| ≤ 174 keeps the result normal).
    let exp_w = f64::from_bits(exp_r.to_bits().wrapping_add(shifted.to_bits() << 52));
    (1.0 / (1.0 + exp_w)) as f32
}

/// `out[i] = σ(slope · clamp(features[i], ±limit) + pattern[i % pattern.len()])`.
///
/// `pattern` is the intercepts repeated to a multiple of [`LANES`] (see [`intercept_pattern`]);
/// `out.len() == features.len()`.
pub(crate) fn probabilities<T: Copy + Into<f64>>(
    features: &[T],
    slope: f64,
    pattern: &[f64],
    limit: f64,
    out: &mut [f32],
) {
    debug_assert_eq!(features.len(), out.len());
    debug_assert_eq!(pattern.len() % LANES, 0);
    let args = (features, slope, pattern, limit, out);
    #[cfg(target_arch = "x86_64")]
    match simd::level() {
        simd::Level::Avx512 => {
            // SAFETY: `probabilities_avx512` only requires the CPU features it is compiled with
            // (`avx512f,avx512bw,avx512vl,avx2,fma`); `level()` returns `Avx512` only after
            // `is_x86_feature_detected!` confirmed each of them on this CPU.
            return unsafe { x86::probabilities_avx512(args) };
        }
        simd::Level::Avx2 => {
            // SAFETY: as above, for `avx2,fma`, confirmed before `Avx2` is returned.
            return unsafe { x86::probabilities_avx2(args) };
        }
        simd::Level::Baseline => {}
    }
    probabilities_generic::<T, 4>(args)
}

/// The intercepts `β_0..β_{K-1}` repeated to the shortest length that is a multiple of both
/// `K` and [`LANES`], into `pattern`.
pub(crate) fn intercept_pattern(intercepts: &[f64], pattern: &mut Vec<f64>) {
    debug_assert!(
        !intercepts.is_empty(),
        "an estimator has at least one position"
    );
    let k = intercepts.len().max(1);
    let mut period = k;
    while period % LANES != 0 {
        period += k;
    }
    pattern.clear();
    pattern.extend(intercepts.iter().copied().cycle().take(period));
}

/// Arguments of [`probabilities`], passed as one tuple to its variants.
type Args<'a, T> = (&'a [T], f64, &'a [f64], f64, &'a mut [f32]);

/// The kernel compiled for AVX2 and AVX-512 (the same code, wider vectors).
#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn probabilities_avx2<T: Copy + Into<f64>>(args: super::Args<'_, T>) {
        super::probabilities_generic::<T, 8>(args);
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) fn probabilities_avx512<T: Copy + Into<f64>>(args: super::Args<'_, T>) {
        super::probabilities_generic::<T, 8>(args);
    }
}

/// The batch in groups of `L` lanes. The polynomial keeps about a dozen values live, so the
/// SSE2 baseline takes `L = 4` (two registers per value; with 8 it spilled and ran slower than
/// libm), AVX2 and AVX-512 take 8. The lane count changes no arithmetic.
#[inline(always)]
fn probabilities_generic<T: Copy + Into<f64>, const L: usize>(
    (features, slope, pattern, limit, out): Args<'_, T>,
) {
    // A lane's z: the feature clamped to ±limit, scaled, plus its position's intercept.
    let z = |x: T, beta: f64| slope * x.into().clamp(-limit, limit) + beta;
    let period = pattern.len();
    let mut xs = features.chunks_exact(period);
    let mut ps = out.chunks_exact_mut(period);
    for (x_period, p_period) in (&mut xs).zip(&mut ps) {
        let lanes = x_period
            .chunks_exact(L)
            .zip(p_period.chunks_exact_mut(L))
            .zip(pattern.chunks_exact(L));
        for ((x, p), beta) in lanes {
            // Fixed-size arrays, so the loops below have no bounds checks and vectorize.
            let (x, beta): (&[T; L], &[f64; L]) = (as_lanes(x), as_lanes(beta));
            let mut zs = [0.0f64; L];
            for i in 0..L {
                zs[i] = z(x[i], beta[i]);
            }
            let mut ps = [0.0f32; L];
            for i in 0..L {
                ps[i] = probability(zs[i]);
            }
            p.copy_from_slice(&ps);
        }
    }
    for ((&x, p), &beta) in xs.remainder().iter().zip(ps.into_remainder()).zip(pattern) {
        *p = probability(z(x, beta));
    }
}

/// A chunk of exactly `L` elements as an array.
#[inline(always)]
fn as_lanes<T, const L: usize>(chunk: &[T]) -> &[T; L] {
    chunk.try_into().expect("chunks_exact yields L elements")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn libm(z: f64) -> f32 {
        (1.0 / (1.0 + (-z).exp())) as f32
    }

    #[test]
    fn matches_libm_formula() {
        let n = 1_000_000;
        let mut differing = Vec::new();
        for i in 0..=n {
            let z = -130.0 + 260.0 * (f64::from(i) / f64::from(n));
            if probability(z).to_bits() != libm(z).to_bits() {
                differing.push(z);
            }
        }
        assert!(differing.is_empty(), "differs from libm at {differing:?}");
        // The extremes, and z whose e^-z lands on powers of two and their neighbours.
        for z in [
            0.0,
            -0.0,
            1e-300,
            -1e-300,
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            709.0,
            -745.0,
            103.0,
            -103.0,
            -87.3,
            std::f64::consts::LN_2,
            -std::f64::consts::LN_2 * 100.0,
        ] {
            assert_eq!(probability(z).to_bits(), libm(z).to_bits(), "z = {z}");
        }
    }

    #[test]
    fn monotone() {
        let mut last = 0.0f32;
        let mut z = -110.0;
        while z < 20.0 {
            let p = probability(z);
            assert!(p >= last, "σ({z}) = {p} < {last}");
            last = p;
            z += 0.0013;
        }
    }

    /// Every vector width this CPU runs gives the bits of the scalar formula, over batches
    /// whose length is not a multiple of the period (the scalar tail).
    #[test]
    fn simd_variants_agree_bit_for_bit() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for k in [1usize, 3, 5, 8, 12, 16] {
            let intercepts: Vec<f64> = (0..k).map(|_| next() * 4.0 - 2.0).collect();
            let mut pattern = Vec::new();
            intercept_pattern(&intercepts, &mut pattern);
            assert_eq!(pattern.len() % LANES, 0);
            assert_eq!(pattern.len() % k, 0);
            for rows in [1usize, 7, 64] {
                let features: Vec<f32> = (0..rows * k)
                    .map(|_| (next() * 120.0 - 60.0) as f32)
                    .collect();
                let want: Vec<u32> = features
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        let x = f64::from(x).clamp(-40.0, 40.0);
                        probability(1.3 * x + intercepts[i % k]).to_bits()
                    })
                    .collect();
                for level in simd::available() {
                    let mut out = vec![f32::NAN; features.len()];
                    let args = (&features[..], 1.3, &pattern[..], 40.0, &mut out[..]);
                    match level {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: `level` comes from `simd::available()`, which lists only the
                        // levels whose CPU features this CPU has.
                        simd::Level::Avx512 => unsafe { x86::probabilities_avx512(args) },
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: as above.
                        simd::Level::Avx2 => unsafe { x86::probabilities_avx2(args) },
                        _ => probabilities_generic::<f32, 4>(args),
                    }
                    let got: Vec<u32> = out.iter().map(|p| p.to_bits()).collect();
                    assert_eq!(got, want, "{level:?} K = {k}, R = {rows}");
                }
            }
        }
    }
}
