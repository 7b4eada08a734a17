//! The int8 products on blocked weights (one scale per [`Q8_BLOCK`] values of a row, core's
//! `ops::q8`): each block's sum is an exact i32, and the blocks are added in order as
//! `acc = acc + (d as f32 * x_scale) * w_scale`, unfused, on every path here — the
//! reference's operations, so the same bits.
//!
//! With VNNI a 64-byte step holds two blocks: sixteen `vpdpbusd` (one per row of a
//! sixteen-row pass, or per pair of a 4 x 4 tile) leave each pair's partial sums in sixteen
//! lanes, and [`fold16x2_i32`] folds them into two vectors, the first block's sixteen sums
//! and the second's. The fold is about twice the products' work; decode is bound by
//! reading the weights, which this does not change.

use super::*;
use rusting_brain_core::ops::q8::{blocks_of, Q8_BLOCK};

/// An activation row rounded to int8 block by block: the values, and per block its scale
/// and the sum of its values (the bias of VNNI's unsigned operand comes off with it). A
/// row under per-row weights is one block.
#[derive(Default)]
pub struct QuantRow {
    /// The rounded values.
    pub q: Vec<i8>,
    /// Values per block.
    pub block: usize,
    /// Each block's sum.
    pub sums: Vec<i32>,
    /// Each block's scale (absmax / 127).
    pub scales: Vec<f32>,
}

impl QuantRow {
    /// `x` rounded in blocks of `block` values as core's `quantize_activation_blocks`
    /// rounds it ([`quantize_i8_into`] per block, to the bit).
    pub fn of(x: &[f32], block: usize) -> Self {
        let mut r = QuantRow::default();
        r.fill(x, block);
        r
    }

    /// [`QuantRow::of`] into this row's buffers.
    pub fn fill(&mut self, x: &[f32], block: usize) {
        let block = block.max(1);
        self.block = block;
        self.q.clear();
        self.sums.clear();
        self.scales.clear();
        let mut tmp = Vec::new();
        for chunk in x.chunks(block) {
            let scale = quantize_i8_into(chunk, &mut tmp);
            self.sums.push(tmp.iter().map(|&v| v as i32).sum());
            self.scales.push(scale);
            self.q.extend_from_slice(&tmp);
        }
    }

    /// The borrowed form the kernels read.
    pub fn row(&self) -> Int8Row<'_> {
        Int8Row { q: &self.q, block: self.block, sums: &self.sums, scales: &self.scales }
    }
}

/// [`q8_rows`] on blocked weights: `out[r] = sum over blocks b of (d_rb as f32 * sx_b) *
/// scales[r * nb + b]` in block order, plus `beta * out[r]` when `beta` is not zero, for
/// `nb = a.scales.len()` blocks of `a.block` (= [`Q8_BLOCK`]) values.
pub(super) fn q8_rows_blocked(
    out: &mut [f32], a: &Int8Row, w: &[i8], stride: usize, scales: &[f32], beta: f32,
) {
    let (n, k, nb) = (out.len(), a.q.len(), a.scales.len());
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
    for (b, (xb, wb)) in a.q.chunks(a.block).zip(row.chunks(a.block)).enumerate() {
        acc += dot_i8(xb, wb) as f32 * a.scales[b] * ws[b];
    }
    acc
}

/// [`q8_rows_blocked`] on VNNI for `out.len()` a multiple of 16: the weights as the
/// unsigned side (biased by 128, taken off block by block with the block's sum of `x`).
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni; rows `0..out.len()` of `a.q.len()`
/// bytes at `stride` must lie inside `w`; `scales` holds `out.len() * nb` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_rows16_blocked_vnni(
    out: &mut [f32], a: &Int8Row, w: &[i8], stride: usize, scales: &[f32], beta: f32,
) {
    use std::arch::x86_64::*;
    let (x, k, nb) = (a.q, a.q.len(), a.scales.len());
    let steps = k.div_ceil(64);
    let flip = _mm512_set1_epi8(i8::MIN);
    let xp = x.as_ptr();
    // Row r's scale of block b is at (16 pass + r) * nb + b: sixteen rows nb apart.
    let index = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(nb as i32),
    );
    let vbeta = _mm512_set1_ps(beta);
    for (p, o16) in out.chunks_exact_mut(16).enumerate() {
        let base = w.as_ptr().wrapping_add(p * 16 * stride);
        let group = [0, 1, 2, 3].map(|g| base.wrapping_add(4 * g * stride));
        let next = base.wrapping_add(16 * stride);
        let sc = scales.as_ptr().wrapping_add(p * 16 * nb);
        let mut total = _mm512_setzero_ps();
        // Adds block b's sixteen sums (less the bias) to `total`, in block order.
        let add_block = |total: &mut __m512, d: __m512i, b: usize| {
            let d = _mm512_sub_epi32(d, _mm512_set1_epi32(128 * a.sums[b]));
            // SAFETY: rows 16 p.. 16 p + 15 have nb scales each (the contract), b < nb.
            let ws = unsafe { _mm512_i32gather_ps::<4>(index, sc.wrapping_add(b) as *const f32) };
            let v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(a.scales[b])), ws);
            *total = _mm512_add_ps(*total, v);
        };
        for c in 0..steps {
            let left = k - c * 64;
            let mask: __mmask64 = if left >= 64 { !0 } else { (1u64 << left) - 1 };
            // SAFETY: bytes c * 64.. under `mask` are inside x (k bytes) and every row.
            let xv = unsafe { _mm512_maskz_loadu_epi8(mask, xp.add(c * 64)) };
            let ahead = next.wrapping_add(c * 1024);
            let mut acc = [[_mm512_setzero_si512(); 4]; 4];
            for (g, a4) in acc.iter_mut().enumerate() {
                let at = group[g].wrapping_add(c * 64);
                for (u, acc) in a4.iter_mut().enumerate() {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add((4 * g + u) * 64));
                    // SAFETY: as above, for row 16 p + 4 g + u.
                    let wv = unsafe { _mm512_maskz_loadu_epi8(mask, at.wrapping_add(u * stride)) };
                    // Masked-off bytes are 0 in x, so the flipped weight there adds 0.
                    *acc = _mm512_dpbusd_epi32(*acc, _mm512_xor_si512(wv, flip), xv);
                }
            }
            // SAFETY: avx512f (the contract).
            let (lo, hi) = unsafe { fold16x2_i32(&acc) };
            add_block(&mut total, lo, 2 * c);
            if 2 * c + 1 < nb {
                add_block(&mut total, hi, 2 * c + 1);
            }
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

/// Sixteen i32 accumulators (`acc[g][u]`, four groups of four) to two vectors: the sums of
/// each one's lanes 0..8 (the first 32 bytes of a 64-byte step, one block) and of its
/// lanes 8..16 (the second block), `acc[g][u]`'s in lane `4 g + u` of each, as
/// [`fold16_i32`] orders them. Within a group, interleave-and-add leaves each 128-bit lane
/// with its four rows' partial sums; 128-bit lane shuffles then pair lanes 0+1 and 2+3.
///
/// # Safety
/// The CPU must have avx512f (checked by the callers).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn fold16x2_i32(
    acc: &[[std::arch::x86_64::__m512i; 4]; 4],
) -> (std::arch::x86_64::__m512i, std::arch::x86_64::__m512i) {
    use std::arch::x86_64::*;
    let pair =
        |a: __m512i, b: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let group = |a: &[__m512i; 4]| {
        let (t01, t23) = (pair(a[0], a[1]), pair(a[2], a[3]));
        _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23))
    };
    // (a.L0 + a.L1, a.L2 + a.L3, b.L0 + b.L1, b.L2 + b.L3): each group's two blocks.
    let halves = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(_mm512_shuffle_i32x4::<0x88>(a, b), _mm512_shuffle_i32x4::<0xDD>(a, b))
    };
    let u = acc.each_ref().map(group);
    let (v01, v23) = (halves(u[0], u[1]), halves(u[2], u[3]));
    (_mm512_shuffle_i32x4::<0x88>(v01, v23), _mm512_shuffle_i32x4::<0xDD>(v01, v23))
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
    let k = xs[0].q.len();
    #[cfg(target_arch = "x86_64")]
    if has_vnni()
        && xs.iter().all(|x| x.q.len() == k && x.scales.len() == nb)
        && rows.iter().all(|r| r.len() >= k)
    {
        // SAFETY: has_vnni() checked the features; every row holds k bytes; `out` and `ws`
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

/// [`tile4x4_blocked`] with VNNI: per 64-byte step the sixteen pairs' products, folded into
/// the two blocks' sums ([`fold16x2_i32`]), less the bias, scaled and added in block order.
///
/// # Safety
/// avx512f, avx512bw and avx512vnni; every row of `xs` and `rows` holds `k` bytes, every
/// `xs[u]` has `nb` blocks; `out` holds `3 * stride + 4` elements and `ws` `4 * nb`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile4x4_blocked_vnni(
    out: &mut [f32], stride: usize, xs: [&Int8Row; 4], rows: [&[i8]; 4], ws: &[f32], beta: f32,
) {
    use std::arch::x86_64::*;
    let (k, nb) = (xs[0].q.len(), xs[0].scales.len());
    let flip = _mm512_set1_epi8(i8::MIN);
    // Lane 4 u + v pairs activation row u with weight row v.
    let per_x = |a: [i32; 4]| {
        _mm512_setr_epi32(
            a[0], a[0], a[0], a[0], a[1], a[1], a[1], a[1], a[2], a[2], a[2], a[2], a[3], a[3], a[3], a[3],
        )
    };
    let add_block = |total: &mut __m512, d: __m512i, b: usize| {
        let d = _mm512_sub_epi32(d, per_x([0, 1, 2, 3].map(|u| 128 * xs[u].sums[b])));
        let sx = _mm512_castsi512_ps(per_x([0, 1, 2, 3].map(|u| xs[u].scales[b].to_bits() as i32)));
        let sw = [0, 1, 2, 3].map(|v| ws[v * nb + b]);
        // SAFETY: `sw` is four floats.
        let sw = _mm512_broadcast_f32x4(unsafe { _mm_loadu_ps(sw.as_ptr()) });
        let v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), sx), sw);
        *total = _mm512_add_ps(*total, v);
    };
    let mut total = _mm512_setzero_ps();
    for c in 0..k.div_ceil(64) {
        let left = k - c * 64;
        let mask: __mmask64 = if left >= 64 { !0 } else { (1u64 << left) - 1 };
        // SAFETY: bytes c * 64.. under `mask` are inside every row (k bytes each).
        let w = rows.map(|r| {
            _mm512_xor_si512(unsafe { _mm512_maskz_loadu_epi8(mask, r.as_ptr().add(c * 64)) }, flip)
        });
        let mut acc = [[_mm512_setzero_si512(); 4]; 4];
        for (a, x) in acc.iter_mut().zip(&xs) {
            // SAFETY: as above.
            let xv = unsafe { _mm512_maskz_loadu_epi8(mask, x.q.as_ptr().add(c * 64)) };
            for (aj, wj) in a.iter_mut().zip(&w) {
                *aj = _mm512_dpbusd_epi32(*aj, *wj, xv);
            }
        }
        // SAFETY: avx512f (the contract).
        let (lo, hi) = unsafe { fold16x2_i32(&acc) };
        add_block(&mut total, lo, 2 * c);
        if 2 * c + 1 < nb {
            add_block(&mut total, hi, 2 * c + 1);
        }
    }
    let y = [
        _mm512_extractf32x4_ps::<0>(total),
        _mm512_extractf32x4_ps::<1>(total),
        _mm512_extractf32x4_ps::<2>(total),
        _mm512_extractf32x4_ps::<3>(total),
    ];
    let betav = _mm_set1_ps(beta);
    for (u, yu) in y.into_iter().enumerate() {
        // SAFETY: u * stride + 4 <= 3 * stride + 4 <= out.len() (the contract).
        unsafe {
            let p = out.as_mut_ptr().add(u * stride);
            let v = if beta == 0.0 { yu } else { _mm_add_ps(yu, _mm_mul_ps(betav, _mm_loadu_ps(p))) };
            _mm_storeu_ps(p, v);
        }
    }
}
