//! The products on 4-bit weights (core's `ops::q4`): the activations rounded to 13-bit
//! integers in blocks of 32 ([`QuantRow::fill_wide`]), each block's `s1 = sum(x q)` an
//! exact i32 and `s2 = sum(x)` kept with the row, the blocks added in order as
//! `acc = acc + (s1 as f32 * x_scale) * d; acc = acc - (s2 as f32 * x_scale) * m`,
//! unfused, on every path here: the reference's operations, so the same bits.
//!
//! With VNNI a 64-value step of a weight row is one 32-byte load, split into its low and
//! high nibbles (values 0..32 and 32..64, Q4_K's order, so the two halves side by side are
//! the values in order) and met by the activations' two byte halves `x = 64 hi + lo`
//! with two `vpdpbusd` (the nibbles are the unsigned operand, so no bias comes off).
//! Sixteen rows a pass, folded to block sums as the int8 kernel folds them.

use super::*;
use rusting_brain_core::ops::q4::{q4_row_scales, Q4_BLOCK};

/// `out[r] = sum over blocks b of the row's 4-bit products` (see the module docs), plus
/// `beta * out[r]` when `beta` is not zero, for weight rows `stride` bytes apart in `w`
/// (Q4_K's nibble order, whole 32-byte groups) and their scales, `q4_row_scales(k)` a
/// row from `scales[0]`. `a` is rounded by [`QuantRow::fill_wide`] in blocks of 32.
///
/// # Panics
/// When `a` is not rounded in blocks of 32, or `w` or `scales` end early.
pub fn q4_rows(out: &mut [f32], a: &Int8Row, w: &[u8], stride: usize, scales: &[f32], beta: f32) {
    let (n, k) = (out.len(), a.wide.len());
    let (nb, rs) = (a.scales.len(), q4_row_scales(k));
    assert!(
        a.block == Q4_BLOCK && nb == k.div_ceil(Q4_BLOCK) && a.wide_sums.len() == nb,
        "q4_rows: blocks of 32"
    );
    let groups = 32 * k.div_ceil(64);
    assert!(stride >= groups && scales.len() >= n * rs, "q4_rows: a row or a scale short");
    assert!(n == 0 || w.len() >= (n - 1) * stride + groups, "q4_rows: the weights end early");
    let done = if cfg!(target_arch = "x86_64") && has_vnni() { n / 16 * 16 } else { 0 };
    #[cfg(target_arch = "x86_64")]
    if done > 0 {
        // SAFETY: has_vnni() checked avx512f, avx512bw and avx512vnni; the asserts above put
        // every row r < done (whole 32-byte groups) inside `w` and its scales in `scales`.
        unsafe { q4_rows16_vnni(&mut out[..done], a, w, stride, scales, beta) };
    }
    for r in done..n {
        let acc = q4_dot(a, &w[r * stride..r * stride + groups], &scales[r * rs..(r + 1) * rs]);
        out[r] = if beta == 0.0 { acc } else { acc + beta * out[r] };
    }
}

/// One output of a 4-bit product: `a` against weight row `row` (whole 32-byte groups)
/// with its scales `sc` (`[row_d, row_m, d_0, m_0, ...]`).
#[inline]
pub fn q4_dot(a: &Int8Row, row: &[u8], sc: &[f32]) -> f32 {
    let k = a.wide.len();
    let mut acc = 0.0f32;
    for (g, bytes) in row.chunks_exact(32).enumerate().take(k.div_ceil(64)) {
        // The group's two blocks: low nibbles against values 64 g.., high against 64 g + 32...
        let x = &a.wide[64 * g..k.min(64 * g + 64)];
        let (x0, x1) = x.split_at(x.len().min(32));
        let s_low: i32 = x0.iter().zip(bytes).map(|(&v, &b)| v as i32 * (b & 15) as i32).sum();
        let s_high: i32 = x1.iter().zip(bytes).map(|(&v, &b)| v as i32 * (b >> 4) as i32).sum();
        for (b, s1) in [(2 * g, s_low), (2 * g + 1, s_high)] {
            if b < a.scales.len() {
                let s = a.scales[b];
                acc += (s1 as f32 * s) * sc[2 + 2 * b];
                acc -= (a.wide_sums[b] as f32 * s) * sc[3 + 2 * b];
            }
        }
    }
    acc
}

/// [`q4_rows`] on VNNI for `out.len()` a multiple of 16.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni; rows `0..out.len()` of
/// `32 * k.div_ceil(64)` bytes at `stride` must lie inside `w`; `scales` holds
/// `out.len() * q4_row_scales(k)` values; `a.lo` and `a.hi` hold whole 64-byte steps.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q4_rows16_vnni(out: &mut [f32], a: &Int8Row, w: &[u8], stride: usize, scales: &[f32], beta: f32) {
    use std::arch::x86_64::*;
    let (k, nb) = (a.wide.len(), a.scales.len());
    let (steps, rs) = (k.div_ceil(64), q4_row_scales(k));
    assert!(a.lo.len() >= steps * 64 && a.hi.len() >= steps * 64, "q4_rows: split activations");
    let low4 = _mm256_set1_epi8(15);
    for (p, o16) in out.chunks_exact_mut(16).enumerate() {
        let base = w.as_ptr().wrapping_add(p * 16 * stride);
        // The next pass's rows, eight lines a step in memory order (a step reads half a
        // line of each row): a line a row every other step (the same lines, row by row)
        // ran SmolLM2's 4-bit decode at 108 tokens/s on Zen 4, memory order at 144.
        let next = base.wrapping_add(16 * stride);
        let sc = scales.as_ptr().wrapping_add(p * 16 * rs);
        let mut total = _mm512_setzero_ps();
        let mut add_block = |s1: __m512i, d: __m512, m: __m512, b: usize| {
            let s = a.scales[b];
            let t = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(s)), d);
            total = _mm512_add_ps(total, t);
            let t = _mm512_mul_ps(_mm512_set1_ps(a.wide_sums[b] as f32 * s), m);
            total = _mm512_sub_ps(total, t);
        };
        for c in 0..steps {
            // SAFETY: a.lo and a.hi hold whole steps (asserted above).
            let (lv, hv) = unsafe {
                (
                    _mm512_loadu_si512(a.lo.as_ptr().add(c * 64) as *const __m512i),
                    _mm512_loadu_si512(a.hi.as_ptr().add(c * 64) as *const __m512i),
                )
            };
            let ahead = next.wrapping_add(c * 512);
            let mut acc = [[_mm512_setzero_si512(); 4]; 4];
            for (g, a4) in acc.iter_mut().enumerate() {
                for (u, acc) in a4.iter_mut().enumerate() {
                    let r = 4 * g + u;
                    if r % 2 == 0 {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(r * 32) as *const i8);
                    }
                    // SAFETY: the step's 32 bytes of row 16 p + r lie inside it (the contract).
                    let wb = unsafe {
                        _mm256_loadu_si256(base.wrapping_add(r * stride + c * 32) as *const __m256i)
                    };
                    let (lo, hi) =
                        (_mm256_and_si256(wb, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(wb), low4));
                    let wv = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                    let low = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, lv);
                    let high = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, hv);
                    *acc = _mm512_add_epi32(low, _mm512_slli_epi32::<6>(high));
                }
            }
            // SAFETY: avx512f (the contract).
            let (s_low, s_high) = unsafe { fold16x2_i32(&acc) };
            // SAFETY: rows 16 p.. 16 p + 15 have rs scales each (the contract); the step's
            // blocks 2c (and 2c + 1 when there is one) are inside each row's.
            let [d0, m0, d1, m1] =
                unsafe { step_scales(sc, rs, 2 + 4 * c, if 2 * c + 1 < nb { 4 } else { 2 }) };
            add_block(s_low, d0, m0, 2 * c);
            if 2 * c + 1 < nb {
                add_block(s_high, d1, m1, 2 * c + 1);
            }
        }
        // SAFETY: avx512f (the contract).
        unsafe { store16(o16, total, beta) };
    }
}
