//! The int8 products on blocked weights (one scale per [`Q8_BLOCK`] values of a row, core's
//! `ops::q8`): the activations rounded to 13-bit integers in the same blocks (held in
//! `i16`), each block's sum an exact i32, and the blocks added in order as
//! `acc = acc + (d as f32 * x_scale) * w_scale`, unfused, on every path here — the
//! reference's operations, so the same bits.
//!
//! With VNNI a block is one `vpdpwssd` a weight row (32 activations against 32 weights
//! widened to i16, pairs summed into sixteen i32 lanes); sixteen rows' (or a 4 x 4 tile's)
//! accumulators are folded into one vector of block sums by [`fold16_i32`], then scaled
//! and added as vectors. The fold costs about what the products do; decode is bound by
//! reading the weights, which this does not change.

use super::*;
use rusting_brain_core::ops::q8::{blocks_of, quantize_activations_wide, Q8_BLOCK};

/// An activation row rounded for one kind of int8 weight: under blocked weights (more
/// than one block a row) the 13-bit values in `wide` and a scale a block; under per-row
/// weights (one block) the int8 values in `q`, their sum (the bias of VNNI's unsigned
/// operand comes off with it) and the row's scale.
#[derive(Default)]
pub struct QuantRow {
    /// The int8 values (one block a row).
    pub q: Vec<i8>,
    /// The 13-bit values (several blocks).
    pub wide: Vec<i16>,
    /// Values per block.
    pub block: usize,
    /// The int8 values' sum (one block a row).
    pub sums: Vec<i32>,
    /// Each block's scale.
    pub scales: Vec<f32>,
}

impl QuantRow {
    /// `x` rounded for weights with blocks of `block` values: core's
    /// `quantize_activations_wide` over several blocks, [`quantize_i8_into`] (core's
    /// `quantize_activations`, to the bit) over one.
    pub fn of(x: &[f32], block: usize) -> Self {
        let mut r = QuantRow::default();
        r.fill(x, block);
        r
    }

    /// [`QuantRow::of`] into this row's buffers.
    pub fn fill(&mut self, x: &[f32], block: usize) {
        let block = block.clamp(1, x.len().max(1));
        self.block = block;
        self.sums.clear();
        self.scales.clear();
        if blocks_of(x.len(), block) > 1 {
            self.q.clear();
            let (wide, scales) = quantize_activations_wide(x, block);
            (self.wide, self.scales) = (wide, scales);
        } else {
            self.wide.clear();
            let scale = quantize_i8_into(x, &mut self.q);
            self.sums.push(self.q.iter().map(|&v| v as i32).sum());
            self.scales.push(scale);
        }
    }

    /// The borrowed form the kernels read.
    pub fn row(&self) -> Int8Row<'_> {
        Int8Row { q: &self.q, wide: &self.wide, block: self.block, sums: &self.sums, scales: &self.scales }
    }
}

/// [`q8_rows`] on blocked weights: `out[r] = sum over blocks b of (d_rb as f32 * sx_b) *
/// scales[r * nb + b]` in block order, plus `beta * out[r]` when `beta` is not zero, for
/// `nb = a.scales.len()` blocks of `a.block` (= [`Q8_BLOCK`]) values of `a.wide`.
pub(super) fn q8_rows_blocked(
    out: &mut [f32], a: &Int8Row, w: &[i8], stride: usize, scales: &[f32], beta: f32,
) {
    let (n, k, nb) = (out.len(), a.wide.len(), a.scales.len());
    assert!(a.block == Q8_BLOCK && nb == blocks_of(k, Q8_BLOCK), "q8_rows: blocks of 32 values");
    assert!(scales.len() >= n * nb, "q8_rows: a scale short");
    let done = if cfg!(target_arch = "x86_64") && has_vnni() { n / 16 * 16 } else { 0 };
    #[cfg(target_arch = "x86_64")]
    if done > 0 {
        // SAFETY: has_vnni() checked avx512f, avx512bw and avx512vnni; q8_rows asserted
        // every row r < n of k bytes inside `w`; the scales were asserted above.
        unsafe { q8_rows16_blocked_vnni(&mut out[..done], a, w, stride, scales, beta) };
    }
    for r in done..n {
        let row = &w[r * stride..r * stride + k];
        let acc = blocked_dot(a, row, &scales[r * nb..(r + 1) * nb]);
        out[r] = if beta == 0.0 { acc } else { acc + beta * out[r] };
    }
}

/// One output of a blocked product: `a`'s blocks against weight row `row` with its
/// block scales `ws`, added up in block order.
#[inline]
pub(super) fn blocked_dot(a: &Int8Row, row: &[i8], ws: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (b, (xb, wb)) in a.wide.chunks(a.block).zip(row.chunks(a.block)).enumerate() {
        acc += dot_i16_i8(xb, wb) as f32 * a.scales[b] * ws[b];
    }
    acc
}

/// sum(x * w) over 13-bit activations and int8 weights, exact in i32 (a block's worth:
/// 32 x 4095 x 127 is far inside i32). A plain loop the compiler widens and vectorizes.
#[inline]
fn dot_i16_i8(x: &[i16], w: &[i8]) -> i32 {
    x.iter().zip(w).map(|(&a, &b)| a as i32 * b as i32).sum()
}

/// Block `b` of sixteen rows against `x` with VNNI: `acc[g][u]`, sixteen lanes of pair
/// sums each, for row `4 g + u` at `group[g] + u * stride`. Short last blocks read only
/// their values (masked; the rest count as 0).
///
/// # Safety
/// avx512f, avx512bw and avx512vnni; `xv` holds block `b` of the activations; every row
/// holds the block's values from `c0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn widen_block(
    acc: &mut [[std::arch::x86_64::__m512i; 4]; 4], xv: std::arch::x86_64::__m512i, rows: [*const i8; 4],
    stride: usize, c0: usize, mask: u64,
) {
    use std::arch::x86_64::*;
    for (g, a4) in acc.iter_mut().enumerate() {
        for (u, a) in a4.iter_mut().enumerate() {
            // SAFETY: the contract: the masked bytes c0.. of row 4 g + u are inside it.
            let w8 = unsafe { _mm512_maskz_loadu_epi8(mask, rows[g].wrapping_add(u * stride + c0)) };
            let w16 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(w8));
            *a = _mm512_dpwssd_epi32(_mm512_setzero_si512(), xv, w16);
        }
    }
}

/// [`q8_rows_blocked`] on VNNI for `out.len()` a multiple of 16.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni; rows `0..out.len()` of
/// `a.wide.len()` bytes at `stride` must lie inside `w`; `scales` holds `out.len() * nb`
/// values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_rows16_blocked_vnni(
    out: &mut [f32], a: &Int8Row, w: &[i8], stride: usize, scales: &[f32], beta: f32,
) {
    use std::arch::x86_64::*;
    let (x, k, nb) = (a.wide, a.wide.len(), a.scales.len());
    // Row r's scale of block b is at (16 pass + r) * nb + b: sixteen rows nb apart.
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let index = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(nb as i32));
    let vbeta = _mm512_set1_ps(beta);
    for (p, o16) in out.chunks_exact_mut(16).enumerate() {
        let base = w.as_ptr().wrapping_add(p * 16 * stride);
        let group = [0, 1, 2, 3].map(|g| base.wrapping_add(4 * g * stride));
        // The next pass's rows (contiguous after these), a line a row every other block:
        // rows of a few hundred bytes are too short for the hardware prefetcher to lock on.
        let next = base.wrapping_add(16 * stride);
        let sc = scales.as_ptr().wrapping_add(p * 16 * nb);
        let mut total = _mm512_setzero_ps();
        for b in 0..nb {
            let c0 = b * Q8_BLOCK;
            let len = (k - c0).min(Q8_BLOCK);
            let mask = (1u64 << len) - 1;
            if b % 2 == 0 {
                for r in 0..16 {
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(r * stride + c0));
                }
            }
            // SAFETY: the block's `len` values lie inside x (k values from c0).
            let xv = unsafe { _mm512_maskz_loadu_epi16(mask as __mmask32, x.as_ptr().add(c0)) };
            let mut acc = [[_mm512_setzero_si512(); 4]; 4];
            // SAFETY: the contract puts every row's k bytes inside `w`.
            unsafe { widen_block(&mut acc, xv, group, stride, c0, mask) };
            // SAFETY: avx512f; rows 16 p.. 16 p + 15 have nb scales each (the contract).
            let (d, ws) = unsafe {
                (fold16_i32(&acc), _mm512_i32gather_ps::<4>(index, sc.wrapping_add(b) as *const f32))
            };
            let v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(a.scales[b])), ws);
            total = _mm512_add_ps(total, v);
        }
        // SAFETY: o16 is 16 writable floats.
        unsafe {
            let v = if beta == 0.0 {
                total
            } else {
                _mm512_add_ps(total, _mm512_mul_ps(vbeta, _mm512_loadu_ps(o16.as_ptr())))
            };
            _mm512_storeu_ps(o16.as_mut_ptr(), v);
        }
    }
}

/// The blocked int8 GEMM's 4 x 4 tile: `out[u * stride + v] = blocked_dot(xs[u], rows[v])`
/// (plus `beta * out[u * stride + v]` when `beta` is not 0) for `u, v < 4`, `ws` the four
/// weight rows' block scales (`4 * nb`, row after row).
///
/// # Panics
/// When `out` has fewer than `3 * stride + 4` elements or `ws` fewer than `4 * nb`.
#[inline]
pub fn tile4x4_blocked(
    out: &mut [f32], stride: usize, xs: [&Int8Row; 4], rows: [&[i8]; 4], ws: &[f32], beta: f32,
) {
    let nb = xs[0].scales.len();
    let _ = (&out[3 * stride..3 * stride + 4], &ws[..4 * nb]);
    let k = xs[0].wide.len();
    #[cfg(target_arch = "x86_64")]
    if has_vnni()
        && xs.iter().all(|x| x.wide.len() == k && x.scales.len() == nb)
        && rows.iter().all(|r| r.len() >= k)
        && nb == blocks_of(k, Q8_BLOCK)
    {
        // SAFETY: has_vnni() checked the features; every row holds k values; `out` and `ws`
        // were bounds-checked above.
        return unsafe { tile4x4_blocked_vnni(out, stride, xs, rows, ws, beta) };
    }
    for (u, x) in xs.iter().enumerate() {
        for (v, r) in rows.iter().enumerate() {
            let o = &mut out[u * stride + v];
            let y = blocked_dot(x, r, &ws[v * nb..(v + 1) * nb]);
            *o = if beta == 0.0 { y } else { y + beta * *o };
        }
    }
}

/// [`tile4x4_blocked`] with VNNI: per block the sixteen pairs' products, folded into the
/// block's sums ([`fold16_i32`]: activation row `u`, weight row `v` in lane `4 u + v`),
/// scaled and added in block order.
///
/// # Safety
/// avx512f, avx512bw and avx512vnni; every row of `xs` holds `k` values in `nb` blocks of
/// 32 and every row of `rows` `k` bytes; `out` holds `3 * stride + 4` elements and `ws`
/// `4 * nb`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile4x4_blocked_vnni(
    out: &mut [f32], stride: usize, xs: [&Int8Row; 4], rows: [&[i8]; 4], ws: &[f32], beta: f32,
) {
    use std::arch::x86_64::*;
    let (k, nb) = (xs[0].wide.len(), xs[0].scales.len());
    let mut total = _mm512_setzero_ps();
    for b in 0..nb {
        let c0 = b * Q8_BLOCK;
        let mask = (1u64 << (k - c0).min(Q8_BLOCK)) - 1;
        // SAFETY: the block's masked bytes lie inside every weight row (k bytes each).
        let w = rows.map(|r| {
            let w8 = unsafe { _mm512_maskz_loadu_epi8(mask, r.as_ptr().add(c0)) };
            _mm512_cvtepi8_epi16(_mm512_castsi512_si256(w8))
        });
        let mut acc = [[_mm512_setzero_si512(); 4]; 4];
        for (a, x) in acc.iter_mut().zip(&xs) {
            // SAFETY: as above, for the activations (k values each).
            let xv = unsafe { _mm512_maskz_loadu_epi16(mask as __mmask32, x.wide.as_ptr().add(c0)) };
            for (aj, wj) in a.iter_mut().zip(&w) {
                *aj = _mm512_dpwssd_epi32(_mm512_setzero_si512(), xv, *wj);
            }
        }
        // SAFETY: avx512f (the contract).
        let d = unsafe { fold16_i32(&acc) };
        let s = [0, 1, 2, 3].map(|u| xs[u].scales[b]);
        let sx = _mm512_setr_ps(
            s[0], s[0], s[0], s[0], s[1], s[1], s[1], s[1], s[2], s[2], s[2], s[2], s[3], s[3], s[3], s[3],
        );
        let sw = [0, 1, 2, 3].map(|v| ws[v * nb + b]);
        // SAFETY: `sw` is four floats.
        let sw = _mm512_broadcast_f32x4(unsafe { _mm_loadu_ps(sw.as_ptr()) });
        total = _mm512_add_ps(total, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), sx), sw));
    }
    // SAFETY: the contract: `out` holds 3 * stride + 4 elements.
    unsafe { store4x4(out, stride, total, beta) };
}

/// Stores a 4 x 4 tile held in one vector (row `u`'s four outputs in lanes `4 u..4 u + 4`)
/// at `out[u * stride..]`, each as `y` or `y + beta * out` when `beta` is not 0 (the old
/// value is not read otherwise).
///
/// # Safety
/// avx512f; `out` holds at least `3 * stride + 4` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store4x4(out: &mut [f32], stride: usize, y: std::arch::x86_64::__m512, beta: f32) {
    use std::arch::x86_64::*;
    let rows4 = [
        _mm512_extractf32x4_ps::<0>(y),
        _mm512_extractf32x4_ps::<1>(y),
        _mm512_extractf32x4_ps::<2>(y),
        _mm512_extractf32x4_ps::<3>(y),
    ];
    let betav = _mm_set1_ps(beta);
    for (u, yu) in rows4.into_iter().enumerate() {
        // SAFETY: u * stride + 4 <= 3 * stride + 4 <= out.len() (the contract).
        unsafe {
            let p = out.as_mut_ptr().add(u * stride);
            let v = if beta == 0.0 { yu } else { _mm_add_ps(yu, _mm_mul_ps(betav, _mm_loadu_ps(p))) };
            _mm_storeu_ps(p, v);
        }
    }
}
