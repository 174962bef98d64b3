//! The drafter feature on the CPU: `x = logit(q_max)` of each row of float32 logits, in one
//! fused pass over memory.
//!
//! For a row `z` with exp2 scale `s = log2(e) / T` the feature is
//! `x = -ln( Σ over every entry but one occurrence of the maximum m of 2^((z - m)·s) )`,
//! clamped to `±max_log_odds` (docs/design.md, "The estimator"). The complement is summed
//! directly, never formed as `total - 1`, so it keeps full relative precision as `q_max → 1`.
//!
//! Each row is read in blocks of [`BLOCK`] columns that stay in the L1 cache: a pass for the
//! block's maximum, minimum and NaNs (the only read from main memory), then a pass of
//! `2^((z - m)·s)` over the cached block with a branch-free polynomial `exp2` that the compiler
//! vectorises (16 lanes: four SSE2 vectors on the baseline x86-64 target, wider ones when the
//! crate is built for a CPU with AVX2 or AVX-512). The running state is `(m, c)`: the row maximum so far and the
//! complement relative to it. A block whose maximum is below `m` only adds its terms. A block
//! that reaches `m` sums its entries other than its maximum and counts the ties exactly (every
//! tie adds exactly 1); a block that raises `m` first rescales the old state,
//! `c ← (c + 1)·2^((m_old - m)·s)`. Nothing is ever subtracted from the sum.
//!
//! Rows are split across scoped threads when the input is large. On x86-64 the kernel is also
//! compiled for AVX2+FMA and AVX-512 and picked at run time (`simd.rs`; two `unsafe`
//! calls, each with its soundness argument). Those two variants evaluate the polynomial with
//! fused multiply-adds (0.30 → 0.235 ns per entry on one AVX-512 thread) and give the same bits
//! as each other; the SSE2 baseline has no FMA, rounds every product, and differs from them by a
//! few float32 ulps of the complement (tested below 1e-6 in `x`). No dependencies.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};
use crate::simd;

pub mod sampling;

/// Columns per block: 8 KiB of float32, well inside the L1 data cache.
pub const BLOCK: usize = 2048;
/// Lanes of the inner loops: four SSE2 vectors, two AVX2 vectors or one AVX-512 vector, wide
/// enough for the compiler to interleave.
const LANES: usize = 16;
/// Exponents are floored at -125 so that every term stays a normal float32 (the torch path floors
/// at -126): a term that small moves `x` only past any clamp.
const EXP2_FLOOR: f32 = -125.0;
/// Inputs at least this large are split across threads. Below it a thread costs more than it
/// saves: `[64, 32000]` took 0.93 ms on one thread against 1.1–3.9 ms on two (a busy neighbour
/// delays the second thread).
const PARALLEL_ELEMENTS: usize = 1 << 22;
/// Rows a thread takes from the shared counter at a time.
const ROWS_PER_GRAB: usize = 4;
/// `1.5·2^23`: adding it rounds a float32 in `[-2^22, 2^22]` to an integer held in the low
/// mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Whether the baseline build evaluates the polynomial with fused multiply-adds: only where they
/// are instructions (`f32::mul_add` elsewhere is a slow software call).
const NATIVE_FMA: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

// Degree-4 minimax coefficients of 2^f on [-0.5, 0.5] with constant term 1: relative error
// 2.9e-6 in float32, so a sum of positive terms, and x = -ln(sum), is off by at most ~3e-6.
const P1: f32 = 0.693_124_2;
const P2: f32 = 0.240_240_99;
const P3: f32 = 0.055_906_445;
const P4: f32 = 0.009_582_845;

/// `2^t` for `t <= 0` (including `-inf`), floored at `2^-125`; relative error below `3e-6`.
#[inline(always)]
fn exp2_nonpositive<const FMA: bool>(t: f32) -> f32 {
    let t = if t < EXP2_FLOOR { EXP2_FLOOR } else { t };
    exp2_in_range::<FMA>(t)
}

/// A block's maximum and minimum, ignoring NaN, and whether it holds a NaN.
type Range = (f32, f32, bool);

/// `(max, min, holds NaN)` of `z`; `(-inf, +inf, _)` for an empty slice. This is the pass that
/// reads main memory, so the extra comparisons are free.
#[inline(always)]
fn block_range(z: &[f32]) -> Range {
    let mut lanes = RangeLanes::new();
    let mut chunks = z.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (i, &v) in chunk.iter().enumerate() {
            lanes.add(i, v);
        }
    }
    lanes.finish(chunks.remainder())
}

/// Per-lane running maximum, minimum and "saw a NaN" of a block's range pass.
struct RangeLanes {
    hi: [f32; LANES],
    lo: [f32; LANES],
    nan: [u32; LANES],
}

impl RangeLanes {
    #[inline(always)]
    fn new() -> Self {
        RangeLanes {
            hi: [f32::NEG_INFINITY; LANES],
            lo: [f32::INFINITY; LANES],
            nan: [0; LANES],
        }
    }

    /// Takes `v` into lane `i` (plain comparisons, which ignore NaN and vectorize).
    #[inline(always)]
    fn add(&mut self, i: usize, v: f32) {
        self.hi[i] = if v > self.hi[i] { v } else { self.hi[i] };
        self.lo[i] = if v < self.lo[i] { v } else { self.lo[i] };
        self.nan[i] |= u32::from(v.is_nan());
    }

    /// The block's range: the lanes folded together with the `tail` that did not fill a lane.
    #[inline(always)]
    fn finish(self, tail: &[f32]) -> Range {
        let (mut max, mut min) = (f32::NEG_INFINITY, f32::INFINITY);
        for &v in self.hi.iter().chain(tail) {
            max = if v > max { v } else { max };
        }
        for &v in self.lo.iter().chain(tail) {
            min = if v < min { v } else { min };
        }
        let any_nan = self.nan.iter().any(|&v| v != 0) || tail.iter().any(|v| v.is_nan());
        (max, min, any_nan)
    }
}

/// `2^t` for `t ∈ [-125, 0]`, without the floor: the caller has checked the range.
///
/// `t = n + f` with `n` the nearest integer and `f ∈ [-0.5, 0.5]`; `2^f` is a degree-4 minimax
/// polynomial, and `n` is added straight into its exponent field (the result stays normal for
/// `n >= -125`). NaN in gives garbage out: rows holding NaN are caught before any sum.
#[inline(always)]
fn exp2_in_range<const FMA: bool>(t: f32) -> f32 {
    let shifted = t + ROUND_MAGIC;
    let f = t - (shifted - ROUND_MAGIC);
    let p = if FMA {
        P4.mul_add(f, P3)
            .mul_add(f, P2)
            .mul_add(f, P1)
            .mul_add(f, 1.0)
    } else {
        (((P4 * f + P3) * f + P2) * f + P1) * f + 1.0
    };
    // The low mantissa bits of `shifted` hold n (two's complement); shifted into the exponent
    // field they add n to p's exponent.
    f32::from_bits(p.to_bits().wrapping_add(shifted.to_bits().wrapping_shl(23)))
}

/// `Σ 2^((z - m)·s)` over the block; `in_range` says every exponent is at least -126.
#[inline(always)]
fn block_sum<const FMA: bool>(z: &[f32], m: f32, s: f32, in_range: bool) -> f64 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = z.chunks_exact(LANES);
    if in_range {
        for chunk in &mut chunks {
            for i in 0..LANES {
                acc[i] += exp2_in_range::<FMA>((chunk[i] - m) * s);
            }
        }
    } else {
        for chunk in &mut chunks {
            for i in 0..LANES {
                acc[i] += exp2_nonpositive::<FMA>((chunk[i] - m) * s);
            }
        }
    }
    let mut total: f64 = acc.iter().map(|&a| f64::from(a)).sum();
    for &v in chunks.remainder() {
        total += f64::from(exp2_nonpositive::<FMA>((v - m) * s));
    }
    total
}

/// `(Σ over entries other than m of 2^((z - m)·s), number of entries equal to m)`.
#[inline(always)]
fn block_sum_excluding<const FMA: bool>(z: &[f32], m: f32, s: f32) -> (f64, u64) {
    let mut acc = [0.0f32; LANES];
    let mut ties = [0u32; LANES];
    let mut chunks = z.chunks_exact(LANES);
    for chunk in &mut chunks {
        for i in 0..LANES {
            let tie = chunk[i] == m;
            let term = exp2_nonpositive::<FMA>((chunk[i] - m) * s);
            acc[i] += if tie { 0.0 } else { term };
            ties[i] += u32::from(tie);
        }
    }
    let mut total: f64 = acc.iter().map(|&a| f64::from(a)).sum();
    let mut count: u64 = ties.iter().map(|&t| u64::from(t)).sum();
    for &v in chunks.remainder() {
        if v == m {
            count += 1;
        } else {
            total += f64::from(exp2_nonpositive::<FMA>((v - m) * s));
        }
    }
    (total, count)
}

/// The exp2 scale `log2(e)·inv_temperature`, capped at float32's largest finite value.
fn exp2_scale(inv_temperature: f32) -> f32 {
    let s = f64::from(inv_temperature) * std::f64::consts::LOG2_E;
    if s > f64::from(f32::MAX) {
        f32::MAX
    } else {
        s as f32
    }
}

/// Logits one row can be read from, block by block, as float32: float32 itself, or bfloat16
/// bit patterns (the high half of a float32, so widening is exact).
///
/// Sealed: the kernel relies on `block` returning exactly the block's values and their range.
pub trait LogitElement: Copy + Sync + Sized + sealed::Sealed {
    /// Block `k` of `row` (columns `k·BLOCK..`) as float32, in `buffer` if it needs converting,
    /// with its range.
    #[doc(hidden)]
    fn block<'a>(row: &'a [Self], k: usize, buffer: &'a mut [f32; BLOCK]) -> (&'a [f32], Range);
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
    impl Sealed for i16 {}
}

impl LogitElement for f32 {
    #[inline(always)]
    fn block<'a>(row: &'a [f32], k: usize, _buffer: &'a mut [f32; BLOCK]) -> (&'a [f32], Range) {
        let block = &row[k * BLOCK..((k + 1) * BLOCK).min(row.len())];
        (block, block_range(block))
    }
}

/// bfloat16 logits as their raw 16-bit patterns (numpy has no bfloat16; a torch bfloat16
/// tensor viewed as `int16` or `uint16` hands them over without a copy).
impl LogitElement for u16 {
    #[inline(always)]
    fn block<'a>(row: &'a [u16], k: usize, buffer: &'a mut [f32; BLOCK]) -> (&'a [f32], Range) {
        widen_bfloat16(row, k, buffer, |bits| bits)
    }
}

/// bfloat16 bit patterns read as `i16` (what `tensor.view(torch.int16)` gives).
impl LogitElement for i16 {
    #[inline(always)]
    fn block<'a>(row: &'a [i16], k: usize, buffer: &'a mut [f32; BLOCK]) -> (&'a [f32], Range) {
        widen_bfloat16(row, k, buffer, |bits| bits as u16)
    }
}

/// Block `k` of a bfloat16 row widened into `buffer` (a bfloat16 is the high half of a float32),
/// and its range, taken in the same loop while the values are in registers.
#[inline(always)]
fn widen_bfloat16<'a, B: Copy>(
    row: &[B],
    k: usize,
    buffer: &'a mut [f32; BLOCK],
    bits: impl Fn(B) -> u16,
) -> (&'a [f32], Range) {
    let source = &row[k * BLOCK..((k + 1) * BLOCK).min(row.len())];
    let widened = &mut buffer[..source.len()];
    let widen = |b: B| f32::from_bits(u32::from(bits(b)) << 16);
    let mut lanes = RangeLanes::new();
    let mut chunks = widened
        .chunks_exact_mut(LANES)
        .zip(source.chunks_exact(LANES));
    for (wide, narrow) in &mut chunks {
        for i in 0..LANES {
            let v = widen(narrow[i]);
            wide[i] = v;
            lanes.add(i, v);
        }
    }
    let tail = source.len() - source.len() % LANES;
    for (wide, &narrow) in widened[tail..].iter_mut().zip(&source[tail..]) {
        *wide = widen(narrow);
    }
    let range = lanes.finish(&widened[tail..]);
    (widened, range)
}

/// The feature of one row, on the widest vector unit this CPU has (`simd.rs`).
fn row_log_odds<E: LogitElement>(z: &[E], inv_temperature: f32, max_log_odds: f32) -> f32 {
    run_at(simd::level(), z, inv_temperature, max_log_odds)
}

/// [`row_log_odds`] on the variant for `level`, which must be one this CPU runs.
fn run_at<E: LogitElement>(
    level: simd::Level,
    z: &[E],
    inv_temperature: f32,
    max_log_odds: f32,
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match level {
        simd::Level::Avx512 => {
            // SAFETY: `row_log_odds_avx512` only requires the CPU features it is compiled with
            // (`avx512f,avx512bw,avx512vl,avx2,fma`); `level` is `Avx512` only when
            // `simd::available` confirmed all of them on this CPU with
            // `is_x86_feature_detected!`. It has no other preconditions.
            return unsafe { x86::row_log_odds_avx512(z, inv_temperature, max_log_odds) };
        }
        simd::Level::Avx2 => {
            // SAFETY: as above, for `avx2,fma`, confirmed before `Avx2` is returned.
            return unsafe { x86::row_log_odds_avx2(z, inv_temperature, max_log_odds) };
        }
        simd::Level::Baseline => {}
    }
    let _ = level;
    row_log_odds_generic::<E, NATIVE_FMA>(z, inv_temperature, max_log_odds)
}

/// The kernel compiled for AVX2+FMA and AVX-512 (the same code, wider vectors).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::LogitElement;

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn row_log_odds_avx2<E: LogitElement>(
        z: &[E],
        inv_temperature: f32,
        max_log_odds: f32,
    ) -> f32 {
        super::row_log_odds_generic::<E, true>(z, inv_temperature, max_log_odds)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) fn row_log_odds_avx512<E: LogitElement>(
        z: &[E],
        inv_temperature: f32,
        max_log_odds: f32,
    ) -> f32 {
        super::row_log_odds_generic::<E, true>(z, inv_temperature, max_log_odds)
    }
}

/// The feature of one row (see the module docs), generic over the vector width it is compiled
/// for.
#[inline(always)]
fn row_log_odds_generic<E: LogitElement, const FMA: bool>(
    z: &[E],
    inv_temperature: f32,
    max_log_odds: f32,
) -> f32 {
    if inv_temperature.is_nan() {
        return f32::NAN;
    }
    let s = exp2_scale(inv_temperature);
    let mut m = f32::NEG_INFINITY;
    // Complement relative to m: Σ over the entries seen, but one occurrence of m, of 2^((z-m)s).
    let mut c = 0.0f64;
    let n_blocks = z.len().div_ceil(BLOCK);
    // Float32 rows are read in place; bfloat16 blocks are widened into this L1-resident buffer.
    let mut buffer = [0.0f32; BLOCK];
    for k in 0..n_blocks {
        // Two passes over a block that stays in L1: its range (the only read from main memory;
        // a bfloat16 block is widened in the same loop), then its terms. Fusing the next block's
        // range into this block's sum loop was measured 1.6x slower on AVX-512 (0.49 against
        // 0.31 ns per entry): the compiler shuffled the two loops' lanes into each other.
        let (block, (bm, bmin, nan)) = E::block(z, k, &mut buffer);
        if nan {
            return f32::NAN;
        }
        if bm < m {
            // The floor is needed only when some exponent falls below it.
            let in_range = (bmin - m) * s >= EXP2_FLOOR;
            c += block_sum::<FMA>(block, m, s, in_range);
        } else if bm == m {
            if m > f32::NEG_INFINITY {
                let (sum, ties) = block_sum_excluding::<FMA>(block, m, s);
                c += sum + ties as f64;
            } // else every entry so far is -inf
        } else {
            // bm > m: a new maximum. The old maximum and its complement move into the sum.
            if m > f32::NEG_INFINITY {
                c = (c + 1.0) * f64::from(exp2_nonpositive::<FMA>((m - bm) * s));
            }
            m = bm;
            if m == f32::INFINITY {
                return f32::NAN;
            }
            let (sum, ties) = block_sum_excluding::<FMA>(block, m, s);
            // At least the maximum itself ties, unless another thread rewrote the block between its
            // two passes; the row then comes out NaN or clamped, never a panic.
            c += sum + ties.saturating_sub(1) as f64;
        }
    }
    if !m.is_finite() {
        return f32::NAN;
    }
    // 2^((z - m)·s) = e^((z - m)/T), so c is the natural-base complement.
    let x = -c.ln();
    let limit = f64::from(max_log_odds);
    x.clamp(-limit, limit) as f32
}

/// `logit(q_max)` of each row of `[rows, vocab]` row-major logits, into `out[rows]`.
///
/// The logits are float32, or bfloat16 given as their bit patterns (`u16`, or `i16` as a torch
/// `int16` view gives them): a bfloat16 row gives exactly the feature of the same row widened to
/// float32.
///
/// `inv_temperature[r]` is `1 / T` for row r (1 for greedy or unscaled rows; `+inf` acts like
/// the largest finite scale; NaN gives a NaN row). `row_valid`, when given, marks the rows to
/// compute; the others are skipped and get 0. A row with a single finite entry gives
/// `+max_log_odds`; a row holding a NaN or `+inf`, or no finite entry, gives NaN.
///
/// # Errors
///
/// A value error naming the argument for inconsistent lengths, `vocab == 0`, a non-positive
/// `inv_temperature`, or a `max_log_odds` that is not finite and positive.
///
/// # Example
///
/// ```rust
/// use av_core::features::draft_log_odds_rows;
///
/// let logits = [0.0f32, 0.0, 1.0, -1.0];
/// let mut out = [0.0f32; 1];
/// draft_log_odds_rows(&logits, 1, 4, &[1.0], 40.0, None, &mut out)?;
/// let complement = 2.0 * (-1.0f64).exp() + (-2.0f64).exp();
/// assert!((f64::from(out[0]) + complement.ln()).abs() < 1e-5);
/// # Ok::<(), av_core::Error>(())
/// ```
pub fn draft_log_odds_rows<E: LogitElement>(
    logits: &[E],
    rows: usize,
    vocab: usize,
    inv_temperature: &[f32],
    max_log_odds: f32,
    row_valid: Option<&[bool]>,
    out: &mut [f32],
) -> Result<()> {
    if vocab == 0 {
        return Err(Error::value(
            "logits",
            "must have at least one vocabulary column",
        ));
    }
    if rows.checked_mul(vocab) != Some(logits.len()) {
        return Err(Error::value(
            "logits",
            format!(
                "has {} entries, expected rows × vocab = {rows} × {vocab}",
                logits.len()
            ),
        ));
    }
    if inv_temperature.len() != rows {
        return Err(Error::value(
            "inv_temperature",
            format!(
                "must have one entry per row ({rows}), got {}",
                inv_temperature.len()
            ),
        ));
    }
    if let Some(&bad) = inv_temperature.iter().find(|&&v| v <= 0.0) {
        return Err(Error::value(
            "inv_temperature",
            format!("must be positive (or NaN for an undefined row), got {bad}"),
        ));
    }
    if !(max_log_odds.is_finite() && max_log_odds > 0.0) {
        return Err(Error::value(
            "max_log_odds",
            format!("must be finite and positive, got {max_log_odds}"),
        ));
    }
    if let Some(valid) = row_valid {
        if valid.len() != rows {
            return Err(Error::value(
                "row_valid",
                format!("must have one entry per row ({rows}), got {}", valid.len()),
            ));
        }
    }
    if out.len() != rows {
        return Err(Error::value(
            "out",
            format!("must have one entry per row ({rows}), got {}", out.len()),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let row_feature = |r: usize| -> f32 {
        if row_valid.is_some_and(|v| !v[r]) {
            0.0
        } else {
            let row = &logits[r * vocab..(r + 1) * vocab];
            row_log_odds(row, inv_temperature[r], max_log_odds)
        }
    };
    let threads = if rows * vocab >= PARALLEL_ELEMENTS {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(rows)
    } else {
        1
    };
    if threads <= 1 {
        for (r, x) in out.iter_mut().enumerate() {
            *x = row_feature(r);
        }
        return Ok(());
    }
    // Rows are handed out a few at a time from a shared counter, so a thread that is descheduled
    // (a busy machine) delays the call by a few rows, not by its share of the batch.
    let next = AtomicUsize::new(0);
    let grab = || -> Vec<(usize, f32)> {
        let mut done = Vec::new();
        loop {
            let first = next.fetch_add(ROWS_PER_GRAB, Ordering::Relaxed);
            if first >= rows {
                return done;
            }
            for r in first..(first + ROWS_PER_GRAB).min(rows) {
                done.push((r, row_feature(r)));
            }
        }
    };
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads).map(|_| scope.spawn(grab)).collect();
        let mine = grab();
        for (r, x) in mine {
            out[r] = x;
        }
        for helper in helpers {
            let theirs = helper
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            for (r, x) in theirs {
                out[r] = x;
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::XorShift;
    use proptest::prelude::*;

    /// float64 reference: -ln Σ over all but one occurrence of the maximum of exp((z - m)/T).
    fn reference(z: &[f32], inv_t: f64, limit: f64) -> f64 {
        if z.iter().any(|v| v.is_nan() || *v == f32::INFINITY) {
            return f64::NAN;
        }
        let m = z
            .iter()
            .fold(f64::NEG_INFINITY, |a, &v| a.max(f64::from(v)));
        if !m.is_finite() {
            return f64::NAN;
        }
        let first = z.iter().position(|&v| f64::from(v) == m).unwrap();
        let c: f64 = z
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != first)
            .map(|(_, &v)| ((f64::from(v) - m) * inv_t).exp())
            .sum();
        (-c.ln()).clamp(-limit, limit)
    }

    fn feature(z: &[f32], inv_t: f32) -> f32 {
        let mut out = [0.0f32];
        draft_log_odds_rows(z, 1, z.len(), &[inv_t], 40.0, None, &mut out).unwrap();
        out[0]
    }

    /// Every vector width this CPU runs gives the bits of the same source (the kernel's lanes are
    /// explicit, so only the instructions differ): the FMA variants those of the fused
    /// polynomial, the SSE2 baseline those of the rounded one, and the two stay within 1e-6.
    #[test]
    fn simd_variants_agree_bit_for_bit() {
        let mut rng = XorShift::new(0x2545_f491_4f6c_dd1d);
        let mut next = || rng.unit_f32();
        let mut cases = vec![
            (1usize, 1.0f32),
            (7, 0.5),
            (2048, 1.0),
            (5000, 2.0),
            (33000, 0.7),
        ];
        // Rows whose feature is near 0, where float32 `x` resolves the complement finely
        // enough for the fused and the rounded polynomial to give different bits.
        cases.extend((0..64).map(|i| (3000 + i, 0.5 + i as f32 / 64.0)));
        let mut differing = 0;
        for (len, inv_t) in cases {
            let mut row: Vec<f32> = (0..len).map(|_| (next() - 0.5) * 40.0).collect();
            if len > 10 {
                row[len / 3] = row[len / 2]; // a tie at some value
                row[len - 1] = f32::NEG_INFINITY;
            }
            // The same source with fused and with separately rounded multiply-adds.
            let fused = row_log_odds_generic::<f32, true>(&row, inv_t, 40.0);
            let rounded = row_log_odds_generic::<f32, false>(&row, inv_t, 40.0);
            assert!(
                (fused - rounded).abs() < 1e-6,
                "len {len}: {fused} vs {rounded}"
            );
            differing += usize::from(fused != rounded);
            for level in simd::available() {
                let got = run_at(level, &row, inv_t, 40.0);
                let want = match level {
                    simd::Level::Baseline if !NATIVE_FMA => rounded,
                    _ => fused,
                };
                assert_eq!(got.to_bits(), want.to_bits(), "{level:?} len {len}");
            }
        }
        // Otherwise the comparisons above could not tell the two polynomials apart.
        assert!(differing > 0, "no row separates fused from rounded");
    }

    #[test]
    fn exp2_matches_std() {
        for exp2 in [exp2_nonpositive::<true>, exp2_nonpositive::<false>] {
            let mut worst = 0.0f64;
            let mut t = 0.0f32;
            while t > -125.0 {
                let got = f64::from(exp2(t));
                let want = f64::from(t).exp2();
                worst = worst.max((got / want - 1.0).abs());
                t -= 0.000_731;
            }
            assert!(worst < 4e-6, "worst relative error {worst}");
            assert_eq!(exp2(0.0), 1.0);
            assert_eq!(exp2(f32::NEG_INFINITY), 2f32.powi(-125));
        }
    }

    /// A bfloat16 row gives exactly the feature of the same row widened to float32: on every
    /// vector level, one row at a time and through the threaded batch entry point.
    #[test]
    fn bfloat16_rows_equal_their_float32_widening() {
        let mut rng = XorShift::new(0x0123_4567_89ab_cdef);
        let mut next = || rng.next_u64();
        let widen = |bits: &[u16]| -> Vec<f32> {
            bits.iter()
                .map(|&b| f32::from_bits(u32::from(b) << 16))
                .collect()
        };
        let vocab = 5000; // two full blocks and a partial one
        let rows = 900; // 4.5 M entries: the batch call splits rows across threads
        let mut logits = Vec::with_capacity(rows * vocab);
        for r in 0..rows {
            let spread = 1.0 + (r % 7) as f32 * 3.0;
            for _ in 0..vocab {
                let u = (next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                logits.push(((u * spread).to_bits() >> 16) as u16);
            }
        }
        // Special entries: NaN, +inf, -inf, -0.0, a subnormal, a tie with the row maximum
        // across blocks, and a single-finite-entry row.
        let specials: [(usize, u16); 5] = [
            (1, 0x7fc0),
            (2, 0x7f80),
            (3, 0xff80),
            (4, 0x8000),
            (5, 0x0001),
        ];
        for (r, bits) in specials {
            logits[r * vocab + 17] = bits;
        }
        logits[6 * vocab + 10] = 0x4200; // 32.0, tied across the first and the third block
        logits[6 * vocab + 4097] = 0x4200;
        // The last block has 904 columns: its last 8 are the tail past the 16-lane groups.
        logits[8 * vocab + 4999] = 0x7fc0; // a NaN in the tail
        logits[9 * vocab + 4998] = 0x4300; // 128.0: a new maximum in the tail
        for v in &mut logits[7 * vocab..8 * vocab] {
            *v = 0xff80; // -inf
        }
        logits[7 * vocab + 4500] = 0x3f80; // 1.0
        let inv_t: Vec<f32> = (0..rows).map(|r| 0.25 + (r % 5) as f32 * 0.5).collect();

        for r in 0..12 {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let wide = widen(row);
            for level in simd::available() {
                let got = run_at(level, row, inv_t[r], 40.0);
                let want = run_at(level, &wide[..], inv_t[r], 40.0);
                assert_eq!(got.to_bits(), want.to_bits(), "{level:?} row {r}");
            }
        }
        let mut got = vec![0.0f32; rows];
        draft_log_odds_rows(&logits, rows, vocab, &inv_t, 40.0, None, &mut got).unwrap();
        let signed: Vec<i16> = logits.iter().map(|&b| b as i16).collect();
        let mut got_signed = vec![0.0f32; rows];
        draft_log_odds_rows(&signed, rows, vocab, &inv_t, 40.0, None, &mut got_signed).unwrap();
        let mut want = vec![0.0f32; rows];
        let wide = widen(&logits);
        draft_log_odds_rows(&wide, rows, vocab, &inv_t, 40.0, None, &mut want).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
        assert_eq!(bits(&got_signed), bits(&want));
        assert!(got[1].is_nan() && got[2].is_nan(), "NaN and +inf rows");
        assert!(got[8].is_nan(), "a NaN in the last block's tail");
        assert!(
            got[9] > 30.0,
            "a maximum in the last block's tail dominates"
        );
        assert_eq!(got[7], 40.0, "a single finite entry");
    }

    #[test]
    fn adversarial_rows() {
        let vocab = 5000;
        let mut rows: Vec<(Vec<f32>, f32)> = Vec::new();
        // Near-one q_max: the complement far below float32's epsilon.
        for gap in [5.0f32, 17.0, 25.0, 35.0, 50.0, 69.0] {
            let mut z = vec![0.0f32; vocab];
            z[vocab / 2] = gap;
            rows.push((z, 1.0));
        }
        // Ties, in the same block and in different blocks.
        let mut z = vec![-3.0f32; vocab];
        z[10] = 2.0;
        z[11] = 2.0;
        rows.push((z, 1.0));
        let mut z = vec![-3.0f32; vocab];
        z[10] = 2.0;
        z[4000] = 2.0;
        rows.push((z, 1.0));
        // -inf entries, and a single finite entry.
        let mut z = vec![f32::NEG_INFINITY; vocab];
        z[3000] = 1.0;
        z[4999] = 0.5;
        rows.push((z.clone(), 1.0));
        z[4999] = f32::NEG_INFINITY;
        rows.push((z, 1.0));
        // Temperatures.
        let z: Vec<f32> = (0..vocab)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.01)
            .collect();
        for inv_t in [1e-3f32, 0.1, 1.0, 10.0, 1e3, 1e6] {
            rows.push((z.clone(), inv_t));
        }
        for (z, inv_t) in rows {
            let want = reference(&z, f64::from(inv_t), 40.0);
            let got = f64::from(feature(&z, inv_t));
            if want.abs() <= 30.0 {
                assert!((got - want).abs() <= 1e-4, "got {got}, want {want}");
            } else {
                assert!(
                    (got - want).abs() <= 1e-2 || got == 40.0,
                    "got {got}, want {want}"
                );
            }
        }
    }

    #[test]
    fn undefined_rows_are_nan() {
        let mut z = vec![0.0f32; 3000];
        z[2500] = f32::NAN;
        assert!(feature(&z, 1.0).is_nan());
        z[2500] = f32::INFINITY;
        assert!(feature(&z, 1.0).is_nan());
        let z = vec![f32::NEG_INFINITY; 3000];
        assert!(feature(&z, 1.0).is_nan());
        let mut z = vec![f32::NEG_INFINITY; 3000];
        z[5] = f32::NAN;
        assert!(feature(&z, 1.0).is_nan());
        let z = vec![1.0f32; 10];
        assert!(feature(&z, f32::NAN).is_nan());
        assert_eq!(feature(&[3.0], 1.0), 40.0);
    }

    #[test]
    fn threads_and_padding() {
        let rows = 110;
        let vocab = 40_000;
        assert!(
            rows * vocab >= PARALLEL_ELEMENTS,
            "exercise the threaded path"
        );
        let logits: Vec<f32> = (0..rows * vocab)
            .map(|i| ((i * 2_654_435_761usize) % 10_007) as f32 * 1e-3)
            .collect();
        let inv_t = vec![1.0f32; rows];
        let valid: Vec<bool> = (0..rows).map(|r| r % 3 != 0).collect();
        let mut out = vec![f32::NAN; rows];
        draft_log_odds_rows(&logits, rows, vocab, &inv_t, 40.0, Some(&valid), &mut out).unwrap();
        for r in 0..rows {
            let row = &logits[r * vocab..(r + 1) * vocab];
            if valid[r] {
                let want = reference(row, 1.0, 40.0);
                assert!((f64::from(out[r]) - want).abs() <= 1e-4);
            } else {
                assert_eq!(out[r], 0.0);
            }
        }
    }

    #[test]
    fn rejects_bad_arguments() {
        let mut out = [0.0f32; 1];
        let e = draft_log_odds_rows(&[1.0, 2.0], 1, 3, &[1.0], 40.0, None, &mut out).unwrap_err();
        assert_eq!(e.argument, "logits");
        let e = draft_log_odds_rows(&[1.0], 1, 1, &[0.0], 40.0, None, &mut out).unwrap_err();
        assert_eq!(e.argument, "inv_temperature");
        let e = draft_log_odds_rows(&[1.0], 1, 1, &[1.0], f32::NAN, None, &mut out).unwrap_err();
        assert_eq!(e.argument, "max_log_odds");
        let e = draft_log_odds_rows(&[1.0], 1, 0, &[1.0], 40.0, None, &mut out).unwrap_err();
        assert_eq!(e.argument, "logits");
    }

    proptest! {
        #[test]
        fn matches_float64_reference(
            z in proptest::collection::vec(-60.0f32..60.0, 1..6000),
            inv_t in prop_oneof![Just(1.0f32), 0.01f32..100.0],
        ) {
            let want = reference(&z, f64::from(inv_t), 40.0);
            let got = f64::from(feature(&z, inv_t));
            prop_assert!((got - want).abs() <= 1e-4 || (want.abs() > 30.0 && (got - want).abs() <= 1e-2),
                "got {got}, want {want}");
        }
    }
}
