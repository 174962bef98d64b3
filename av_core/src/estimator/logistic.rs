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
//! Nothing is fused (Rust never contracts `a * b + c`): [`probability`] is the definition, and
//! the SSE2 baseline evaluates it as written. The float64 `σ` is within about 2 ulps of the exact
//! value, so the float32 result is within 1 ulp of glibc's `(1 / (1 + exp(-z))) as f32`, and
//! equal to it except where `σ(z)` lies within a few float64 ulps of a float32 rounding midpoint
//! (none among a million evenly spaced `z` in `[-130, 130]`; `z = 0.1799239588648795` is one
//! such point, a review found by searching for them).
//!
//! The AVX2 and AVX-512 variants ([`crate::simd`]) give the same float32 bits a faster way: the
//! same `z`, the same reduction and polynomial with fused multiply-adds (fewer operations, a
//! shorter chain), which lands within 64 float64 ulps of the definition's `σ`, and that result
//! rounded to float32 wherever every float64 within [`MARGIN_ULPS`] of it rounds to the same
//! float32 ([`rounds_alike`]); a block with a lane that does not is evaluated by the definition.
//! Blocks of 64 lanes (eight AVX-512 vectors, sixteen AVX2 ones), so that several independent
//! polynomials are in flight at once: one 8-lane group at a time left the loop waiting on its
//! chain of about 20 dependent operations.

use crate::simd;

/// The intercept pattern's length is a multiple of this: the widest group of lanes (one
/// AVX-512 vector of float64).
const LANES: usize = 8;
/// Lanes per block of the AVX2 and AVX-512 variants' main loop (eight groups of [`LANES`]).
const BLOCK: usize = 64;
/// Float64 ulps of room around the fused `σ` within which every value must round to the same
/// float32 for [`rounds_alike`] to pass it: 64 times the bound on the fused `σ`'s distance from
/// the definition's (64 ulps, see [`rounds_alike`]).
const MARGIN_ULPS: u64 = 1 << 12;
/// A float64 below `2^-125` (bits of `2^-125`) is not passed by its low bits: float32 rounds
/// there at another place for values below `2^-126` (subnormals).
const LEAST_NORMAL_BITS: u64 = 0x3820_0000_0000_0000;
/// Bits of `2^-151`: every float64 below `2^-150` rounds to float32 `+0`.
const TINY_BITS: u64 = 0x3680_0000_0000_0000;
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

/// [`exp_neg`] with fused multiply-adds: the same reduction (the same `n` but where `w·log2(e)`
/// lies within a rounding of a half-integer, and `|r| ≤ ln(2)/2` either way) and the same
/// degree-12 Taylor polynomial by the same Estrin scheme, each `a·b + c` rounded once. Not the
/// bits of `exp_neg`; both within `2^-48` of `e^(-z)` relative (see [`rounds_alike`]). Only for
/// variants compiled with `fma` (elsewhere `mul_add` is a library call).
#[inline(always)]
fn exp_neg_fused(z: f64) -> f64 {
    let w = (-z).clamp(-W_LIMIT, W_LIMIT);
    let shifted = w.mul_add(std::f64::consts::LOG2_E, ROUND_MAGIC);
    let n = shifted - ROUND_MAGIC;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, w));
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    let pairs = [
        C[0] + r,
        r.mul_add(C[3], C[2]),
        r.mul_add(C[5], C[4]),
        r.mul_add(C[7], C[6]),
        r.mul_add(C[9], C[8]),
        r.mul_add(C[11], C[10]),
    ];
    let quads = [
        r2.mul_add(pairs[1], pairs[0]),
        r2.mul_add(pairs[3], pairs[2]),
        r2.mul_add(pairs[5], pairs[4]),
    ];
    let low = r4.mul_add(quads[1], quads[0]);
    let high = r4.mul_add(C[12], quads[2]);
    let exp_r = r8.mul_add(high, low);
    f64::from_bits(exp_r.to_bits().wrapping_add(shifted.to_bits() << 52))
}

/// Whether `s`, the fused `σ` of some `z` (`1 / (1 + exp_neg_fused(z))`), rounds to the float32
/// that the definition's `σ` of that `z` rounds to ([`probability`]): when it lies in
/// `[2^-125, 1]` with every float64 within [`MARGIN_ULPS`] ulps of it on the same side of every
/// float32 rounding midpoint, or below `2^-151`.
///
/// Why that suffices. Both evaluations take the same `w` (the same operations, unfused) and
/// evaluate `e^w = 2^n · e^r`:
/// * `r`: `w − n·ln2_hi` is exact in both (`n·ln2_hi` is exact, and when `n ≠ 0` the difference
///   is a multiple of `2^-54` below `1/2`), then `n·ln2_lo` is subtracted with one or two
///   roundings: an absolute error below `2^-53`, so a relative error of `e^r` below `2^-53`
///   (the split of `ln 2` itself is off by under `2^-85` per unit of `n`);
/// * the polynomial: truncation below `3.5e-16 < 2^-51` relative at `|r| ≤ ln(2)/2`; each
///   evaluation rounds every term through at most 10 operations of relative error `2^-53`, on
///   terms that sum to at most `e^|r| ≤ e^(2|r|)·e^r ≤ 2·e^r`: below `20 · 2^-53` relative;
/// * `2^n` is exact (the result stays normal), `1 + e` and the division add `2^-53` each.
///
/// So each `σ` is within `2^-48` of the exact value relative, and the two within `2^-47` of each
/// other: under `2^-47 · 2^53 = 64` ulps of the float64 binade of `s` (the unit tests measure
/// it). The float32 rounding midpoints in `[2^-126, 1]` are exactly the float64 values whose
/// low 29 mantissa bits are `2^28`; rounding to nearest is monotone, so two values with no
/// midpoint between them round alike. With [`MARGIN_ULPS`] (`4,096`) of room on both sides of
/// `s` there is none between `s` and the definition's `σ` (a binade edge next to `s`, where the
/// ulp halves below it, is a float32 value, not a midpoint, and leaves the low bits of `s` far
/// from `2^28`). Below `2^-151` both are below `2^-150`, half the least float32 subnormal:
/// both round to `+0`. The band between (where float32 rounds at subnormal places, `z` about
/// −105 to −87), a NaN and anything above 1 are never passed. A uniformly spread `s` is passed
/// except with probability `2^-16` a lane.
#[inline(always)]
fn rounds_alike(s: f64) -> bool {
    const HALF: u64 = 1 << 28;
    const LOW_BITS: u64 = (1 << 29) - 1;
    let bits = s.to_bits();
    let from_midpoint = (bits & LOW_BITS).wrapping_sub(HALF - MARGIN_ULPS);
    let normal = bits.wrapping_sub(LEAST_NORMAL_BITS) <= 1f64.to_bits() - LEAST_NORMAL_BITS;
    (normal & (from_midpoint >= 2 * MARGIN_ULPS)) | (bits < TINY_BITS)
}

/// `out[i] = σ(slope · clamp(features[i], ±limit) + pattern[i % pattern.len()])`.
///
/// `pattern` is the intercepts repeated to a multiple of [`LANES`] (see [`intercept_pattern`]);
/// `out.len() == features.len()`. Only the last `< LANES` entries of the batch take the scalar
/// path.
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
    simd::dispatch!(
        level,
        avx512: x86::probabilities_avx512(args),
        avx2: x86::probabilities_avx2(args),
        baseline: probabilities_generic::<T, 4>(args),
    )
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

/// The fused kernel compiled for AVX2 and AVX-512 (the same code, wider vectors; both with
/// `fma`, which [`exp_neg_fused`] needs).
#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn probabilities_avx2<T: Copy + Into<f64>>(args: super::Args<'_, T>) {
        super::probabilities_fused(args);
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) fn probabilities_avx512<T: Copy + Into<f64>>(args: super::Args<'_, T>) {
        super::probabilities_fused(args);
    }
}

/// A lane's `z`: the feature clamped to `±limit`, scaled, plus its position's intercept
/// (unfused: every variant takes the same `z`).
#[inline(always)]
fn logit<T: Copy + Into<f64>>(x: T, slope: f64, limit: f64, beta: f64) -> f64 {
    slope * x.into().clamp(-limit, limit) + beta
}

/// The last `< L` entries of a batch, one by one by the definition; `pattern` starts at the
/// first one's intercept.
#[inline(always)]
fn one_by_one<T: Copy + Into<f64>>(
    features: &[T],
    (slope, pattern, limit): (f64, &[f64], f64),
    out: &mut [f32],
) {
    for ((&x, p), &beta) in features.iter().zip(out).zip(pattern) {
        *p = probability(logit(x, slope, limit, beta));
    }
}

/// The batch in groups of `L` lanes, by the definition ([`probability`]): the SSE2 baseline's
/// kernel, with `L = 4` (the polynomial keeps about a dozen values live, two registers each;
/// with 8 it spilled and ran slower than libm).
#[inline(always)]
fn probabilities_generic<T: Copy + Into<f64>, const L: usize>(
    (features, slope, pattern, limit, out): Args<'_, T>,
) {
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
            zs[i] = logit(x[i], slope, limit, beta[i]);
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
    one_by_one(
        xs.remainder(),
        (slope, &pattern[at..], limit),
        ps.into_remainder(),
    );
}

/// The batch in blocks of [`BLOCK`] lanes, then groups of [`LANES`], then one by one, each
/// block and group by [`fused_block`]: the AVX2 and AVX-512 kernel (the bits of
/// [`probabilities_generic`]).
#[inline(always)]
fn probabilities_fused<T: Copy + Into<f64>>((features, slope, pattern, limit, out): Args<'_, T>) {
    let mut at = 0usize;
    let mut xs = features.chunks_exact(BLOCK);
    let mut ps = out.chunks_exact_mut(BLOCK);
    for (x, p) in (&mut xs).zip(&mut ps) {
        fused_block::<T, BLOCK>(as_lanes(x), (slope, pattern, limit), &mut at, p);
    }
    let mut xs = xs.remainder().chunks_exact(LANES);
    let mut ps = ps.into_remainder().chunks_exact_mut(LANES);
    for (x, p) in (&mut xs).zip(&mut ps) {
        fused_block::<T, LANES>(as_lanes(x), (slope, pattern, limit), &mut at, p);
    }
    one_by_one(
        xs.remainder(),
        (slope, &pattern[at..], limit),
        ps.into_remainder(),
    );
}

/// `N` lanes (a multiple of [`LANES`]) of [`probabilities`] into `p`: the fused `σ` rounded to
/// float32 where [`rounds_alike`] passes every lane, else the definition's. The intercepts are
/// read from `pattern` at `at`, a group of [`LANES`] at a time, wrapping at its end.
#[inline(always)]
fn fused_block<T: Copy + Into<f64>, const N: usize>(
    x: &[T; N],
    (slope, pattern, limit): (f64, &[f64], f64),
    at: &mut usize,
    p: &mut [f32],
) {
    let mut beta = [0.0f64; N];
    for group in beta.chunks_exact_mut(LANES) {
        group.copy_from_slice(&pattern[*at..*at + LANES]);
        *at += LANES;
        if *at == pattern.len() {
            *at = 0;
        }
    }
    let mut zs = [0.0f64; N];
    for i in 0..N {
        zs[i] = logit(x[i], slope, limit, beta[i]);
    }
    let mut sigma = [0.0f64; N];
    for i in 0..N {
        sigma[i] = 1.0 / (1.0 + exp_neg_fused(zs[i]));
    }
    let mut alike = true;
    for &s in &sigma {
        alike &= rounds_alike(s);
    }
    let mut block = [0.0f32; N];
    if alike {
        for i in 0..N {
            block[i] = sigma[i] as f32;
        }
    } else {
        for i in 0..N {
            block[i] = probability(zs[i]);
        }
    }
    p.copy_from_slice(&block);
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

    /// The fused `σ` against the definition's over `z` in `[-130, 130]`: at most the 64 ulps
    /// that [`rounds_alike`]'s proof allows (it measures far fewer), and rounded to the same
    /// float32 wherever `rounds_alike` passes it.
    #[test]
    fn fused_sigma_stays_within_the_proofs_bound() {
        let fused = |z: f64| 1.0 / (1.0 + exp_neg_fused(z));
        let exact = |z: f64| 1.0 / (1.0 + exp_neg(z));
        let mut rng = XorShift::new(0x51_6d_a0);
        let (mut worst, mut passed, mut total) = (0u64, 0usize, 0usize);
        let n = 400_000;
        for i in 0..=n {
            let even = -130.0 + 260.0 * (f64::from(i) / f64::from(n));
            for z in [even, rng.unit_f64() * 40.0 - 20.0] {
                let (s, t) = (fused(z), exact(z));
                worst = worst.max(s.to_bits().abs_diff(t.to_bits()));
                if rounds_alike(s) {
                    assert_eq!((s as f32).to_bits(), (t as f32).to_bits(), "z = {z}");
                    passed += 1;
                }
                total += 1;
            }
        }
        assert!(worst <= 64, "{worst} ulps apart");
        assert!(worst <= MARGIN_ULPS / 64);
        // Everything but the subnormal band (z about -105 to -87, 7% of the even grid's half)
        // and the odd lane near a midpoint passes.
        assert!(passed * 100 > total * 95, "{passed} of {total} passed");
    }

    /// `z` where the fused `σ` and the definition's lie on either side of a float32 rounding
    /// midpoint (found by walking `z` across the logits of float32 midpoints): every variant
    /// must return the definition's float32 there.
    #[test]
    fn near_midpoints_every_variant_rounds_like_the_definition() {
        let zs = [
            0.118_327_562_208_980_18,
            -0.346_699_525_517_973_06,
            -0.155_259_907_612_609_02,
            -0.358_446_928_818_684_95,
            -0.184_307_370_548_217_3,
            -1.154_546_072_320_278,
            0.942_266_219_912_320_7,
            2.906_344_693_141_776,
            -1.172_657_240_259_576_7,
            -0.340_312_533_579_162_1,
            0.208_475_533_943_766_67,
            1.729_120_886_728_011_5,
        ];
        for &z in &zs {
            let unchecked = (1.0 / (1.0 + exp_neg_fused(z))) as f32;
            assert_ne!(unchecked.to_bits(), probability(z).to_bits(), "z = {z}");
            assert!(!rounds_alike(1.0 / (1.0 + exp_neg_fused(z))), "z = {z}");
        }
        let pattern = [0.0; LANES];
        for level in simd::available() {
            // Each at every place of a block, of a group and of the scalar tail.
            for len in [BLOCK + LANES + 3, LANES, 5] {
                for place in 0..len {
                    for &z in &zs {
                        let mut features = vec![0.25f64; len];
                        features[place] = z;
                        let mut out = vec![f32::NAN; len];
                        probabilities_at(level, (&features[..], 1.0, &pattern[..], 40.0, &mut out));
                        let want = probability(z).to_bits();
                        assert_eq!(out[place].to_bits(), want, "{level:?} z = {z} at {place}");
                    }
                }
            }
        }
    }

    /// [`rounds_alike`] at its edges: the margin around a midpoint, the float32 normal range,
    /// the bound below which everything rounds to zero, 1, and NaN.
    #[test]
    fn rounds_alike_passes_exactly_what_its_margin_allows() {
        // A float32 rounding midpoint: 0.75 + half a float32 ulp.
        let midpoint = 0.75f64 + f64::from(f32::EPSILON) / 4.0;
        assert_eq!(midpoint.to_bits() & ((1 << 29) - 1), 1 << 28);
        let ulps = |d: i64| f64::from_bits((midpoint.to_bits() as i64 + d) as u64);
        let margin = MARGIN_ULPS as i64;
        for d in [0, 1, -1, margin - 1, -margin] {
            assert!(!rounds_alike(ulps(d)), "{d}");
        }
        for d in [margin, -margin - 1, 1 << 27, -(1 << 27)] {
            assert!(rounds_alike(ulps(d)), "{d}");
        }
        // Wherever it passes, every float64 within the margin rounds to the same float32.
        let mut rng = XorShift::new(77);
        for _ in 0..200_000 {
            let s = rng.unit_f64().powi(8);
            if rounds_alike(s) && s >= 2f64.powi(-125) {
                let around = |d: i64| f64::from_bits((s.to_bits() as i64 + d) as u64) as f32;
                assert_eq!(around(-margin), s as f32, "{s}");
                assert_eq!(around(margin), s as f32, "{s}");
            }
        }
        let least = 2f64.powi(-125);
        assert!(rounds_alike(least) && rounds_alike(1.0) && rounds_alike(0.0));
        assert!(!rounds_alike(f64::from_bits(least.to_bits() - 1)));
        assert!(!rounds_alike(f64::from_bits(1f64.to_bits() + 1)));
        let tiny = 2f64.powi(-151);
        assert!(!rounds_alike(tiny) && rounds_alike(f64::from_bits(tiny.to_bits() - 1)));
        assert_eq!(f64::from_bits(tiny.to_bits() - 1) as f32, 0.0);
        assert!(!rounds_alike(f64::NAN) && !rounds_alike(-f64::NAN));
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
            for rows in [1usize, 7, 9, 64, 67] {
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
