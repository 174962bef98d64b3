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
//! AVX-512 variants ([`crate::simd`]) give the same bits. The float64 `σ` is within about 2 ulps
//! of the exact value, so the float32 result is within 1 ulp of glibc's
//! `(1 / (1 + exp(-z))) as f32`, and equal to it except where `σ(z)` lies within a few float64
//! ulps of a float32 rounding midpoint (none among a million evenly spaced `z` in `[-130, 130]`;
//! `z = 0.1799239588648795` is one such point, a review found by searching for them).

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
#[inline(always)]
pub fn probability(z: f64) -> f32 {
    (1.0 / (1.0 + exp_neg(z))) as f32
}

/// `e^(-z)` for `z` clamped to `±120` (within about 2 ulps): the exponential of
/// [`probability`], shared with the float64 logistic of the `map` refit ([`super::map`]).
#[inline(always)]
pub fn exp_neg(z: f64) -> f64 {
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
    f64::from_bits(exp_r.to_bits().wrapping_add(shifted.to_bits() << 52))
}

/// `out[i] = σ(slope · clamp(features[i], ±limit) + pattern[i % pattern.len()])`.
///
/// `pattern` is the intercepts repeated to a multiple of [`LANES`] (see [`intercept_pattern`]);
/// `out.len() == features.len()`. Only the last `< L` entries of the batch take the scalar path.
pub(crate) fn probabilities<T: Copy + Into<f64>>(
    features: &[T],
    slope: f64,
    pattern: &[f64],
    limit: f64,
    out: &mut [f32],
) {
    debug_assert_eq!(features.len(), out.len());
    debug_assert_eq!(pattern.len() % LANES, 0);
    probabilities_at(simd::level(), (features, slope, pattern, limit, out));
}

/// [`probabilities`] on the variant for `level`, which must be one this CPU runs.
fn probabilities_at<T: Copy + Into<f64>>(level: simd::Level, args: Args<'_, T>) {
    #[cfg(target_arch = "x86_64")]
    match level {
        simd::Level::Avx512 => {
            // SAFETY: `probabilities_avx512` only requires the CPU features it is compiled with
            // (`avx512f,avx512bw,avx512vl,avx2,fma`); `level` is `Avx512` only when
            // `simd::available` confirmed each of them on this CPU with
            // `is_x86_feature_detected!`.
            return unsafe { x86::probabilities_avx512(args) };
        }
        simd::Level::Avx2 => {
            // SAFETY: as above, for `avx2,fma`, confirmed before `Avx2` is listed.
            return unsafe { x86::probabilities_avx2(args) };
        }
        simd::Level::Baseline => {}
    }
    let _ = level;
    probabilities_generic::<T, 4>(args)
}

/// The intercepts `β_0..β_{K-1}` repeated to the shortest length that is a multiple of both
/// `K` and [`LANES`], into `pattern`.
#[cfg_attr(not(test), allow(dead_code))] // predict builds its pattern on the stack
pub(crate) fn intercept_pattern(intercepts: &[f64], pattern: &mut Vec<f64>) {
    debug_assert!(
        !intercepts.is_empty(),
        "an estimator has at least one position"
    );
    pattern.clear();
    pattern.resize(pattern_len(intercepts.len()), 0.0);
    pattern[..intercepts.len()].copy_from_slice(intercepts);
    repeat_intercepts(pattern, intercepts.len());
}

/// The length of [`intercept_pattern`]'s pattern for `k` positions: the least common multiple
/// of `k` and [`LANES`] (at most `8·k`).
pub(crate) fn pattern_len(k: usize) -> usize {
    let k = k.max(1);
    let mut period = k;
    while period % LANES != 0 {
        period += k;
    }
    period
}

/// Completes a pattern whose first `k` entries are the intercepts: every later entry repeats
/// the one `k` before it.
pub(crate) fn repeat_intercepts(pattern: &mut [f64], k: usize) {
    for i in k.max(1)..pattern.len() {
        pattern[i] = pattern[i - k];
    }
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
    // `pattern` is a whole number of groups and starts over at a position-0 entry, so group
    // after group reads the next `L` intercepts, wrapping at its end.
    let mut at = 0usize;
    let mut xs = features.chunks_exact(L);
    let mut ps = out.chunks_exact_mut(L);
    for (x, p) in (&mut xs).zip(&mut ps) {
        // Fixed-size arrays, so the loops below have no bounds checks and vectorize.
        let x: &[T; L] = as_lanes(x);
        let beta: &[f64; L] = as_lanes(&pattern[at..at + L]);
        let mut zs = [0.0f64; L];
        for i in 0..L {
            zs[i] = z(x[i], beta[i]);
        }
        let mut group = [0.0f32; L];
        for i in 0..L {
            group[i] = probability(zs[i]);
        }
        p.copy_from_slice(&group);
        at += L;
        if at == pattern.len() {
            at = 0;
        }
    }
    for ((&x, p), &beta) in xs
        .remainder()
        .iter()
        .zip(ps.into_remainder())
        .zip(&pattern[at..])
    {
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
    use crate::test_rng::XorShift;

    fn libm(z: f64) -> f32 {
        (1.0 / (1.0 + (-z).exp())) as f32
    }

    /// Distance in float32 ulps (both results are non-negative).
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn within_one_ulp_of_libm() {
        let n = 1_000_000;
        let mut differing = 0;
        for i in 0..=n {
            let z = -130.0 + 260.0 * (f64::from(i) / f64::from(n));
            let (got, want) = (probability(z), libm(z));
            assert!(ulps(got, want) <= 1, "σ({z}) = {got} against {want}");
            differing += usize::from(got != want);
        }
        // Equal except near float32 rounding midpoints, which an even grid almost never hits.
        assert!(differing <= 10, "{differing} of {n} differ by an ulp");
        // A midpoint case: still within one ulp.
        let z = 0.179_923_958_864_879_5;
        assert!(ulps(probability(z), libm(z)) <= 1);
        // The extremes, and points where e^-z is a power of two.
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

    /// Every vector width this CPU runs gives the bits of the scalar formula: float32 and
    /// float64 features, `z` past the ±120 clamp, and batches that end in a partial group.
    #[test]
    fn simd_variants_agree_bit_for_bit() {
        let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15);
        let mut next = || rng.unit_f64();
        let slope = 4.0; // features clamped to ±40: z reaches ±160 + β
        for k in [1usize, 3, 5, 8, 12, 16] {
            let intercepts: Vec<f64> = (0..k).map(|_| next() * 4.0 - 2.0).collect();
            let mut pattern = Vec::new();
            intercept_pattern(&intercepts, &mut pattern);
            assert_eq!(pattern.len() % LANES, 0);
            assert_eq!(pattern.len() % k, 0);
            for rows in [1usize, 7, 64] {
                let wide: Vec<f64> = (0..rows * k).map(|_| next() * 120.0 - 60.0).collect();
                let narrow: Vec<f32> = wide.iter().map(|&x| x as f32).collect();
                let want = |features: &[f64]| -> Vec<u32> {
                    features
                        .iter()
                        .enumerate()
                        .map(|(i, &x)| {
                            probability(slope * x.clamp(-40.0, 40.0) + intercepts[i % k]).to_bits()
                        })
                        .collect()
                };
                let narrow_as_wide: Vec<f64> = narrow.iter().map(|&x| f64::from(x)).collect();
                for level in simd::available() {
                    let mut out = vec![f32::NAN; rows * k];
                    probabilities_at(
                        level,
                        (&narrow[..], slope, &pattern[..], 40.0, &mut out[..]),
                    );
                    let got: Vec<u32> = out.iter().map(|p| p.to_bits()).collect();
                    assert_eq!(
                        got,
                        want(&narrow_as_wide),
                        "{level:?} f32, K = {k}, R = {rows}"
                    );
                    probabilities_at(level, (&wide[..], slope, &pattern[..], 40.0, &mut out[..]));
                    let got: Vec<u32> = out.iter().map(|p| p.to_bits()).collect();
                    assert_eq!(got, want(&wide), "{level:?} f64, K = {k}, R = {rows}");
                }
            }
        }
    }
}

/// The examples of this module's items, which doctests cannot reach (the module is private):
/// the same code, run as unit tests.
#[cfg(test)]
mod examples {
    #[test]
    fn probability_example() {
        use crate::estimator::logistic::probability;

        assert_eq!(probability(0.0), 0.5);
        assert_eq!(probability(-3f64.ln()), 0.25); // 1 / (1 + 3)
        assert_eq!(
            (probability(200.0), probability(f64::NEG_INFINITY)),
            (1.0, 0.0)
        );
    }

    #[test]
    fn exp_neg_example() {
        use crate::estimator::logistic::exp_neg;

        assert_eq!(exp_neg(0.0), 1.0);
        assert!((exp_neg(-2.0) / 2f64.exp() - 1.0).abs() < 1e-15);
        assert_eq!(exp_neg(-500.0), exp_neg(-120.0)); // clamped
    }
}
