//! The int8 products on blocked weights (one scale per [`Q8_BLOCK`] values of a row, core's
//! `ops::q8`): the activations rounded to 13-bit integers in the same blocks (held in
//! `i16`), each block's sum an exact i32, and the blocks added in order as
//! `acc = acc + (d as f32 * x_scale) * w_scale`, unfused, on every path here — the
//! reference's operations, so the same bits.
//!
//! With VNNI a decode step of 64 values is one load and two `vpdpbusd` a weight row (the
//! 13-bit activations split into bytes); sixteen rows' accumulators are folded into
//! vectors of block sums ([`fold16x2_i32`]), then scaled and added as vectors. The fold
//! costs about half what the products do, and reading sixteen rows a step at a time
//! streams slower than one sequential read (`bench/read_bandwidth.c`, docs/baseline.md):
//! a layout with each pass's rows interleaved would remove both.

use super::*;
use rusting_brain_core::ops::q8::{blocks_of, quantize_activations_wide_into, Q8_BLOCK};

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
    /// The 13-bit values split for VNNI's byte products, `x = 64 hi + lo`: `lo` in 0..64
    /// and `hi` in -64..64, padded with zeros to whole 64-byte steps.
    pub lo: Vec<u8>,
    /// See `lo`.
    pub hi: Vec<i8>,
    /// Each block's sum of `hi`.
    pub hi_sums: Vec<i32>,
    /// Each block's sum of the 13-bit values (the 4-bit products' offset term).
    pub wide_sums: Vec<i32>,
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
            self.fill_wide(x, block);
        } else {
            self.wide.clear();
            let scale = quantize_i8_into(x, &mut self.q);
            self.sums.push(self.q.iter().map(|&v| v as i32).sum());
            self.scales.push(scale);
        }
    }

    /// `x` rounded to 13-bit values in blocks of `block` (core's
    /// `quantize_activations_wide`) however many blocks there are: what 4-bit weights
    /// meet, and [`QuantRow::fill`] over several blocks.
    pub fn fill_wide(&mut self, x: &[f32], block: usize) {
        #[cfg(target_arch = "x86_64")]
        if block == Q8_BLOCK && matches!(isa(), Isa::Avx512) {
            self.block = block;
            self.sums.clear();
            self.scales.clear();
            self.q.clear();
            // SAFETY: isa() reported avx512f on this CPU (run-time detection).
            return unsafe { fill_wide_avx512(self, x) };
        }
        self.fill_wide_plain(x, block);
    }

    /// [`QuantRow::fill_wide`] in plain loops over core's rounding: every CPU's path, and
    /// the AVX-512 one's twin.
    pub fn fill_wide_plain(&mut self, x: &[f32], block: usize) {
        let block = block.max(1);
        self.block = block;
        self.sums.clear();
        self.scales.clear();
        {
            self.q.clear();
            quantize_activations_wide_into(x, block, &mut self.wide, &mut self.scales);
            let padded = x.len().div_ceil(64) * 64;
            self.lo.clear();
            self.hi.clear();
            self.lo.extend(self.wide.iter().map(|&v| (v & 63) as u8));
            self.hi.extend(self.wide.iter().map(|&v| (v >> 6) as i8));
            self.lo.resize(padded, 0);
            self.hi.resize(padded, 0);
            self.hi_sums.clear();
            self.hi_sums.extend(
                self.hi
                    .chunks(block)
                    .take(self.scales.len())
                    .map(|c| c.iter().map(|&v| v as i32).sum::<i32>()),
            );
            self.wide_sums.clear();
            self.wide_sums.extend(self.wide.chunks(block).map(|c| c.iter().map(|&v| v as i32).sum::<i32>()));
        }
    }

    /// The borrowed form the kernels read.
    pub fn row(&self) -> Int8Row<'_> {
        Int8Row {
            q: &self.q,
            wide: &self.wide,
            block: self.block,
            sums: &self.sums,
            scales: &self.scales,
            lo: &self.lo,
            hi: &self.hi,
            hi_sums: &self.hi_sums,
            wide_sums: &self.wide_sums,
        }
    }
}

/// [`QuantRow::fill_wide`] over blocks of [`Q8_BLOCK`] with AVX-512: core's
/// `quantize_activations_wide_into` to the bit (the same absmax, the same scalar scale and
/// reciprocal, the same product per value, `roundf`'s half away from zero done exactly,
/// NaN to 0), and the byte split and the blocks' sums from the same vectors. Decode rounds
/// ~90 rows a step (SmolLM2): the scalar loops with libm's `roundf` took a tenth of it.
///
/// # Safety
/// The CPU must have avx512f (checked by the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fill_wide_avx512(r: &mut QuantRow, x: &[f32]) {
    use rusting_brain_core::ops::q8::ACT_MAX;
    use std::arch::x86_64::*;
    let n = x.len();
    let nb = n.div_ceil(Q8_BLOCK);
    // Whole blocks while filling (the last block's tail comes out 0), cut to `n` after.
    r.wide.clear();
    r.wide.resize(nb * Q8_BLOCK, 0);
    let padded = n.div_ceil(64) * 64;
    r.lo.clear();
    r.lo.resize(padded, 0);
    r.hi.clear();
    r.hi.resize(padded, 0);
    r.hi_sums.clear();
    r.wide_sums.clear();
    let (half, lim, neg) = (_mm512_set1_ps(0.5), _mm512_set1_ps(ACT_MAX), _mm512_set1_ps(-ACT_MAX));
    let (sign, one) = (_mm512_set1_epi32(i32::MIN), _mm512_castps_si512(_mm512_set1_ps(1.0)));
    let six = _mm512_set1_epi32(63);
    for b in 0..nb {
        let at = b * Q8_BLOCK;
        let left = n - at;
        let mask = |from: usize| -> __mmask16 {
            let c = left.saturating_sub(from).min(16);
            ((1u32 << c) - 1) as u16
        };
        let (p0, p1) = (x.as_ptr().wrapping_add(at), x.as_ptr().wrapping_add(at + 16));
        // SAFETY: the masked floats of the block lie inside x (`left` from `at`); masked-off
        // lanes are not read.
        let v = unsafe { [_mm512_maskz_loadu_ps(mask(0), p0), _mm512_maskz_loadu_ps(mask(16), p1)] };
        // max(|v|, m) returns m when v is NaN, as f32::max does in the reference's fold.
        let m = _mm512_max_ps(_mm512_abs_ps(v[1]), _mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_setzero_ps()));
        let absmax = _mm512_reduce_max_ps(m);
        let scale = absmax / ACT_MAX;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let vinv = _mm512_set1_ps(inv);
        // Written out, not as a closure over `v`: a closure does not inherit this
        // function's target features.
        let mut q = [_mm512_setzero_si512(); 2];
        for (q, &v) in q.iter_mut().zip(&v) {
            let y = _mm512_mul_ps(v, vinv);
            // roundf exactly: truncate, then step away from zero when the dropped fraction
            // is at least one half (y - trunc(y) is exact).
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
            let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(y, t)), half);
            let step =
                _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(y), sign), one));
            let rounded = _mm512_min_ps(lim, _mm512_max_ps(neg, _mm512_mask_add_ps(t, away, t, step)));
            // NaN to 0, as `NaN as i16` gives.
            let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(y, y);
            *q = _mm512_maskz_mov_epi32(ordered, _mm512_cvttps_epi32(rounded));
        }
        let hi = [_mm512_srai_epi32::<6>(q[0]), _mm512_srai_epi32::<6>(q[1])];
        for h in 0..2 {
            let o = at + 16 * h;
            // SAFETY: wide holds nb whole blocks and lo/hi at least as many values (padded
            // to whole 64-value steps), so 16 values at `o` fit each.
            unsafe {
                _mm256_storeu_si256(r.wide.as_mut_ptr().add(o) as *mut __m256i, _mm512_cvtepi32_epi16(q[h]));
                let lo = _mm512_cvtepi32_epi8(_mm512_and_si512(q[h], six));
                _mm_storeu_si128(r.lo.as_mut_ptr().add(o) as *mut __m128i, lo);
                _mm_storeu_si128(r.hi.as_mut_ptr().add(o) as *mut __m128i, _mm512_cvtepi32_epi8(hi[h]));
            }
        }
        r.scales.push(scale);
        r.wide_sums.push(_mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1])));
        r.hi_sums.push(_mm512_reduce_add_epi32(_mm512_add_epi32(hi[0], hi[1])));
    }
    r.wide.truncate(n);
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

/// [`q8_rows_blocked`] on VNNI for `out.len()` a multiple of 16. The 13-bit activations go
/// in as two byte vectors, `x = 64 hi + lo` (`a.lo`, `a.hi`), so each 64-byte step of a
/// weight row is one load and two `vpdpbusd` (`lo` unsigned against the weights; the
/// weights made unsigned, `w + 128`, against `hi`), with no widening: per lane
/// `lo . w + 64 (hi . (w + 128))`, and `64 * 128 * sum(hi)` comes off each block after the
/// fold. The step's two blocks are folded together ([`fold16x2_i32`]). Integer sums, so
/// the same block sums as core's; the same float steps after.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni; rows `0..out.len()` of
/// `a.wide.len()` bytes at `stride` must lie inside `w`; `scales` holds `out.len() * nb`
/// values; `a.lo` and `a.hi` hold whole 64-byte steps.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_rows16_blocked_vnni(
    out: &mut [f32], a: &Int8Row, w: &[i8], stride: usize, scales: &[f32], beta: f32,
) {
    use std::arch::x86_64::*;
    let (k, nb) = (a.wide.len(), a.scales.len());
    let steps = k.div_ceil(64);
    assert!(a.lo.len() >= steps * 64 && a.hi.len() >= steps * 64, "q8_rows: split activations");
    // Row r's scale of block b is at (16 pass + r) * nb + b: sixteen rows nb apart.
    let flip = _mm512_set1_epi8(i8::MIN);
    for (p, o16) in out.chunks_exact_mut(16).enumerate() {
        let base = w.as_ptr().wrapping_add(p * 16 * stride);
        let group = [0, 1, 2, 3].map(|g| base.wrapping_add(4 * g * stride));
        // The next pass's rows (contiguous after these), sixteen lines a step in memory
        // order, as the per-row kernel does: rows of a few hundred bytes are too short for
        // the hardware prefetcher to lock on. Prefetching the same lines row by row read a
        // 150 MiB matrix at 19 GB/s on Zen 4, memory order at 20-26, a plain streaming
        // read at 26-36 (`bench/read_bandwidth.c`); decode went from 97 to 127 tokens/s
        // (SmolLM2). Two passes ahead measured slower.
        let next = base.wrapping_add(16 * stride);
        let sc = scales.as_ptr().wrapping_add(p * 16 * nb);
        let mut total = _mm512_setzero_ps();
        // Block b's sixteen sums (less the bias), scaled by the rows' scales `ws` and added
        // in block order.
        let mut add_block = |d: __m512i, ws: __m512, b: usize| {
            let d = _mm512_sub_epi32(d, _mm512_set1_epi32(8192 * a.hi_sums[b]));
            let v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(a.scales[b])), ws);
            total = _mm512_add_ps(total, v);
        };
        for c in 0..steps {
            let left = k - c * 64;
            let mask: __mmask64 = if left >= 64 { !0 } else { (1u64 << left) - 1 };
            // SAFETY: a.lo and a.hi hold whole steps (asserted above).
            let (lv, hv) = unsafe {
                (
                    _mm512_loadu_si512(a.lo.as_ptr().add(c * 64) as *const __m512i),
                    _mm512_loadu_si512(a.hi.as_ptr().add(c * 64) as *const __m512i),
                )
            };
            let ahead = next.wrapping_add(c * 1024);
            let mut acc = [[_mm512_setzero_si512(); 4]; 4];
            for (g, a4) in acc.iter_mut().enumerate() {
                for (u, acc) in a4.iter_mut().enumerate() {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add((4 * g + u) * 64));
                    // SAFETY: the masked bytes of row 16 p + 4 g + u lie inside it.
                    let wv =
                        unsafe { _mm512_maskz_loadu_epi8(mask, group[g].wrapping_add(u * stride + c * 64)) };
                    let low = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lv, wv);
                    let high = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(wv, flip), hv);
                    *acc = _mm512_add_epi32(low, _mm512_slli_epi32::<6>(high));
                }
            }
            // SAFETY: avx512f (the contract).
            let (lo, hi) = unsafe { fold16x2_i32(&acc) };
            let two = 2 * c + 1 < nb;
            // SAFETY: rows 16 p.. 16 p + 15 have nb scales each (the contract); the step's
            // blocks 2c (and 2c + 1 when `two`) are inside each row's.
            let [w0, w1, _, _] = unsafe { step_scales(sc, nb, 2 * c, if two { 2 } else { 1 }) };
            add_block(lo, w0, 2 * c);
            if two {
                add_block(hi, w1, 2 * c + 1);
            }
        }
        // SAFETY: avx512f (the contract).
        unsafe { store16(o16, total, beta) };
    }
}

/// The scales of one 64-value step for sixteen rows `rs` floats apart from `sc`: each
/// row's `floats` values at `at` (4: the 4-bit rows' `[d, m, d', m']`, its two blocks'
/// scales and offsets; 2: int8's two block scales; 1: int8's last block), as four vectors
/// of sixteen rows in row order, the floats not read coming back 0. Sixteen loads and a
/// 4 x 4 transpose in each 128-bit lane: the rows go into the lanes as
/// `(g, 4 + g, 8 + g, 12 + g)` so the transpose leaves them in order. Two gathers a block
/// cost more than the products (the 4-bit kernel ran at 0.8x int8's speed with them,
/// 1.2x without).
///
/// # Safety
/// avx512f; `sc + r * rs + at` holds `floats` floats for every r < 16, `floats` 1, 2 or 4.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn step_scales(
    sc: *const f32, rs: usize, at: usize, floats: usize,
) -> [std::arch::x86_64::__m512; 4] {
    use std::arch::x86_64::*;
    // Plain loads (a masked 128-bit load needs avx512vl, which `has_vnni` does not
    // check): four floats, two through a 64-bit load or one through a 32-bit load, each
    // zeroing the rest. Written out, not as closures: a closure does not inherit this
    // function's target features.
    let mut z = [_mm512_setzero_ps(); 4];
    for (g, zg) in z.iter_mut().enumerate() {
        let mut four = [_mm_setzero_ps(); 4];
        for (i, f) in four.iter_mut().enumerate() {
            let at = sc.wrapping_add((4 * i + g) * rs + at);
            // SAFETY: the contract: `floats` floats at `at`.
            *f = unsafe {
                match floats {
                    4 => _mm_loadu_ps(at),
                    2 => _mm_castpd_ps(_mm_load_sd(at as *const f64)),
                    _ => _mm_load_ss(at),
                }
            };
        }
        let v = _mm512_castps128_ps512(four[0]);
        let v = _mm512_insertf32x4::<1>(v, four[1]);
        let v = _mm512_insertf32x4::<2>(v, four[2]);
        *zg = _mm512_insertf32x4::<3>(v, four[3]);
    }
    let (t0, t1) = (_mm512_unpacklo_ps(z[0], z[1]), _mm512_unpackhi_ps(z[0], z[1]));
    let (t2, t3) = (_mm512_unpacklo_ps(z[2], z[3]), _mm512_unpackhi_ps(z[2], z[3]));
    let pd = _mm512_castps_pd;
    let ps = _mm512_castpd_ps;
    [
        ps(_mm512_unpacklo_pd(pd(t0), pd(t2))),
        ps(_mm512_unpackhi_pd(pd(t0), pd(t2))),
        ps(_mm512_unpacklo_pd(pd(t1), pd(t3))),
        ps(_mm512_unpackhi_pd(pd(t1), pd(t3))),
    ]
}

/// `o16 = total` (`beta` 0) or `total + beta * o16`: a sixteen-row pass's outputs.
///
/// # Safety
/// The CPU must have avx512f (checked by the callers).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store16(o16: &mut [f32], total: std::arch::x86_64::__m512, beta: f32) {
    use std::arch::x86_64::*;
    assert!(o16.len() >= 16, "store16: sixteen outputs");
    // SAFETY: o16 holds at least 16 floats (asserted).
    unsafe {
        let v = if beta == 0.0 {
            total
        } else {
            _mm512_add_ps(total, _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_loadu_ps(o16.as_ptr())))
        };
        _mm512_storeu_ps(o16.as_mut_ptr(), v);
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
    #[cfg(target_arch = "x86_64")]
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

/// Sixteen weight rows of a blocked int8 matrix laid out across the vector lanes, for
/// products of several activation rows (a prompt, or a server's step over several
/// requests): for block `b` and quad `j` (the block's values `4 j..4 j + 4`), the sixteen
/// rows' four bytes, row `r` in lane `r` of a 64-byte vector, each byte as the unsigned
/// `w + 128`; and for block `b` the sixteen rows' scales. With the rows across the lanes
/// one `vpdpbusd` of a quad broadcast from one activation row leaves each row's partial
/// block sum in its own lane: no fold. The 13-bit activations go in as their two bytes
/// (`x = 64 hi + lo`, [`QuantRow`]), each a signed operand against the unsigned weights,
/// so a block's sum is `lo . (w + 128) + 64 (hi . (w + 128)) - 128 sum(x)`, exact in i32.
///
/// The bytes are the int8 rows themselves (512 bytes a block of sixteen rows, in L1 for
/// SmolLM2's widest rows), laid out by a 16 x 16 transpose of 32-bit quads every two
/// blocks with no widening: an earlier layout of 16-bit pairs (`vpdpwssd`) took twice
/// the bytes and a widening and twice the shuffles a block, and on a server's 16-row
/// decode step laying it out cost as much as the products (`perf`, docs/baseline.md).
///
/// A 4-bit panel ([`Panel16::fill_q4`]) holds the values `q` (0..=15) as they are (no
/// `+ 128`), the blocks' scales `d`, and their offsets `m` (empty for int8), which the
/// product takes off as `(sum(x) * x_scale) * m` after each block, as core's `ops::q4`
/// does.
#[derive(Default)]
pub struct Panel16 {
    /// `(b * 8 + j) * 16 + r`: row `r`'s bytes `32 b + 4 j..32 b + 4 j + 4`, little end
    /// first; whole pairs of blocks.
    quads: Vec<u32>,
    scales: Vec<f32>,
    offsets: Vec<f32>,
    blocks: usize,
    /// What each stored byte holds above the weight: 128 for int8, 0 for 4 bits.
    bias: i32,
    /// The address and length in 64-byte lines of the next sixteen rows in the matrix (an
    /// address, never read through: it is prefetched).
    ahead: (usize, usize),
    /// Whether the products prefetch `ahead` (a few activation rows: spread over their
    /// first pass, 7% faster on a 16-row step) or the layout does (a prompt's band: in
    /// bursts as it lays the panel out, 7% faster on 512-row prompts).
    spread: bool,
    /// Rows unpacked from 4 bits, for `fill_q4` (kept to reuse the allocation).
    unpacked: Vec<i8>,
    /// The sixteen 4-bit rows' block scales, row after row, for `fill_q4` (kept likewise).
    row_scales: Vec<f32>,
}

impl Panel16 {
    /// Rows `0..16` of a 4-bit weight (`k` values each in Q4_K's nibble order, `stride`
    /// bytes apart in `w`) with their scales (`q4_row_scales(k)` a row, row after row):
    /// the values unpacked to bytes, then laid out as [`Panel16::fill`] lays out int8
    /// rows (without the `+ 128`), with each block's scale and offset.
    pub fn fill_q4(&mut self, w: &[u8], stride: usize, k: usize, scales: &[f32], rows: usize) {
        let (nb, rs) = (blocks_of(k, Q8_BLOCK), rusting_brain_core::ops::q4::q4_row_scales(k));
        let width = 32 * k.div_ceil(64);
        assert!(w.len() >= 15 * stride + width && scales.len() >= 16 * rs, "Panel16: sixteen 4-bit rows");
        let row_len = 64 * k.div_ceil(64);
        let mut unpacked = std::mem::take(&mut self.unpacked);
        unpacked.resize(16 * row_len, 0);
        let mut d = std::mem::take(&mut self.row_scales);
        d.clear();
        d.resize(16 * nb, 0.0);
        for r in 0..16 {
            let (src, dst) =
                (&w[r * stride..r * stride + width], &mut unpacked[r * row_len..(r + 1) * row_len]);
            unpack_nibbles(src, dst);
            for b in 0..nb {
                d[r * nb + b] = scales[r * rs + 2 + 2 * b];
            }
        }
        self.ahead = (w.as_ptr().wrapping_add(16 * stride) as usize, (16 * stride).div_ceil(64));
        self.spread = rows <= 16;
        self.lay_out(&unpacked, row_len, k, &d, 0);
        self.offsets.resize(nb * 16, 0.0);
        for b in 0..nb {
            for r in 0..16 {
                self.offsets[b * 16 + r] = scales[r * rs + 3 + 2 * b];
            }
        }
        self.unpacked = unpacked;
        self.row_scales = d;
    }

    /// Rows `0..16` of `w` (`k` bytes each, `stride` apart) and their scales (`16 * nb`,
    /// row after row), `nb = k.div_ceil(32)`; values past `k` are 0. `rows`: the
    /// activation rows that will meet the panel (it picks when the next sixteen weight
    /// rows are prefetched).
    pub fn fill(&mut self, w: &[i8], stride: usize, k: usize, scales: &[f32], rows: usize) {
        self.ahead = (w.as_ptr().wrapping_add(16 * stride) as usize, (16 * stride).div_ceil(64));
        self.spread = rows <= 16;
        self.lay_out(w, stride, k, scales, 128);
        self.offsets.clear();
    }

    /// [`Panel16::fill`] with each byte `w + bias` (128 or 0). With AVX-512 every two
    /// blocks of the sixteen rows are one 64-byte load a row and a 16 x 16 transpose of
    /// 32-bit quads; elsewhere byte by byte.
    fn lay_out(&mut self, w: &[i8], stride: usize, k: usize, scales: &[f32], bias: i32) {
        let nb = blocks_of(k, Q8_BLOCK);
        assert!(w.len() >= 15 * stride + k && scales.len() >= 16 * nb, "Panel16: sixteen rows");
        self.blocks = nb;
        self.bias = bias;
        self.quads.resize(nb.div_ceil(2) * 256, 0);
        self.scales.resize(nb.div_ceil(16) * 256, 0.0);
        #[cfg(target_arch = "x86_64")]
        if matches!(isa(), Isa::Avx512) && is_x86_feature_detected!("avx512bw") {
            // SAFETY: avx512f and avx512bw checked; the assert above puts every row's k
            // bytes inside `w` and its nb scales inside `scales`; `quads` holds whole
            // pairs of blocks and `self.scales` whole sixteens.
            return unsafe { self.lay_out_avx512(w, stride, k, scales) };
        }
        for (r, row) in scales.chunks_exact(nb).take(16).enumerate() {
            for (b, &s) in row.iter().enumerate() {
                self.scales[b * 16 + r] = s;
            }
        }
        let flip = bias as u8;
        let at =
            |r: usize, c: usize| if c < k { (w[r * stride + c] as u8 ^ flip) as u32 } else { flip as u32 };
        for b in 0..nb {
            for j in 0..8 {
                let c = b * Q8_BLOCK + 4 * j;
                for r in 0..16 {
                    self.quads[(b * 8 + j) * 16 + r] =
                        at(r, c) | (at(r, c + 1) << 8) | (at(r, c + 2) << 16) | (at(r, c + 3) << 24);
                }
            }
        }
    }

    /// [`Panel16::lay_out`]'s quads with AVX-512.
    ///
    /// # Safety
    /// avx512f and avx512bw; rows `0..16` of `k` bytes at `stride` lie inside `w` and
    /// their `blocks` scales each inside `scales`; `self.quads` holds
    /// `blocks.div_ceil(2) * 256` values and `self.scales` `blocks.div_ceil(16) * 256`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn lay_out_avx512(&mut self, w: &[i8], stride: usize, k: usize, scales: &[f32]) {
        use std::arch::x86_64::*;
        // The scales, sixteen blocks at a time: sixteen rows' loads and a transpose (row
        // by row in scalar loops they cost a quarter of the bytes' layout).
        let nb = self.blocks;
        for b0 in (0..nb).step_by(16) {
            let mask = ((1u32 << (nb - b0).min(16)) - 1) as __mmask16;
            let rows: [__m512i; 16] = std::array::from_fn(|r| {
                // SAFETY: row r's masked scales from b0 lie inside its nb (the contract).
                unsafe { _mm512_maskz_loadu_epi32(mask, scales.as_ptr().add(r * nb + b0) as *const i32) }
            });
            for (c, v) in transpose16x16_epi32(rows).iter().enumerate() {
                // SAFETY: self.scales holds whole sixteens of blocks (the contract).
                unsafe {
                    _mm512_storeu_si512(self.scales.as_mut_ptr().add((b0 + c) * 16) as *mut __m512i, *v)
                };
            }
        }
        let flip = _mm512_set1_epi8(self.bias as u8 as i8);
        let pairs = self.blocks.div_ceil(2);
        // A prompt's band: the next sixteen rows a burst a pair of blocks, in memory order
        // (`spread`).
        let (next, lines) = if self.spread { (0, 0) } else { self.ahead };
        let per = lines.div_ceil(pairs);
        for pair in 0..pairs {
            for line in pair * per..((pair + 1) * per).min(lines) {
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * line) as *const i8);
            }
            let c0 = pair * 64;
            let mask: __mmask64 = if k - c0 >= 64 { !0 } else { (1u64 << (k - c0)) - 1 };
            let rows: [__m512i; 16] = std::array::from_fn(|r| {
                // SAFETY: the masked bytes of row r from c0 lie inside it (the contract).
                let w8 = unsafe { _mm512_maskz_loadu_epi8(mask, w.as_ptr().add(r * stride + c0)) };
                _mm512_xor_si512(w8, flip)
            });
            // Quad q of the pair (block 2 pair + q / 8, its quad q % 8) across the rows.
            let cols = transpose16x16_epi32(rows);
            for (q, v) in cols.iter().enumerate() {
                // SAFETY: (16 pair + q) * 16 + 16 <= quads.len() (the contract).
                unsafe {
                    _mm512_storeu_si512(self.quads.as_mut_ptr().add((16 * pair + q) * 16) as *mut __m512i, *v)
                };
            }
        }
    }
}

/// Sixteen outputs of each activation row `xs[u]` against a [`Panel16`]:
/// `out[u * ldo + r] = blocked_dot(xs[u], row r)` (plus `beta * out[..]` when `beta` is
/// not 0), the same operations in the same order, so the same bits. Each row must be
/// rounded over several blocks ([`QuantRow::fill_wide`]: its bytes `lo` and `hi` and its
/// blocks' sums). Returns false (writing nothing) where the CPU has no VNNI; the caller
/// takes the tile path then.
pub fn panel16_rows(out: &mut [f32], ldo: usize, xs: &[QuantRow], panel: &Panel16, beta: f32) -> bool {
    let nb = panel.blocks;
    assert!(xs.iter().all(|x| x.scales.len() == nb && x.wide_sums.len() == nb), "panel16_rows: blocks");
    assert!(
        xs.iter().all(|x| x.lo.len() >= nb * Q8_BLOCK && x.hi.len() >= nb * Q8_BLOCK),
        "panel16_rows: bytes"
    );
    assert!(xs.is_empty() || out.len() >= (xs.len() - 1) * ldo + 16, "panel16_rows: out");
    #[cfg(target_arch = "x86_64")]
    if has_vnni() {
        let mut u = 0;
        // Eight rows a pass: sixteen independent chains of vpdpbusd hide its latency.
        while u < xs.len() {
            let (o, x) = (&mut out[u * ldo..], &xs[u..]);
            // SAFETY: has_vnni() checked the features; the asserts above put every row's
            // nb * 32 bytes, its nb scales and sums and its 16 outputs in bounds.
            // A step's few rows: the next rows' lines spread over the first pass's
            // products (a prompt's band took them in bursts as the panel was laid out).
            let ahead = u == 0 && panel.spread;
            u += unsafe {
                match xs.len() - u {
                    8.. => panel16_vnni::<8>(o, ldo, x, panel, beta, ahead),
                    4.. => panel16_vnni::<4>(o, ldo, x, panel, beta, ahead),
                    2.. => panel16_vnni::<2>(o, ldo, x, panel, beta, ahead),
                    _ => panel16_vnni::<1>(o, ldo, x, panel, beta, ahead),
                }
            };
        }
        return true;
    }
    let _ = (out, ldo, beta);
    false
}

/// 4-bit groups (32 bytes: values `l` in the low nibbles, `32 + l` in the high ones) to
/// one byte a value in order: `dst` holds 64 bytes a group of `src`.
fn unpack_nibbles(src: &[u8], dst: &mut [i8]) {
    assert!(src.len().is_multiple_of(32) && dst.len() >= 2 * src.len(), "unpack_nibbles: whole groups");
    #[cfg(target_arch = "x86_64")]
    if matches!(isa(), Isa::Avx512 | Isa::Avx2Fma) {
        // SAFETY: avx2 is part of both ISAs (checked when they were chosen); the assert
        // above bounds every load and store.
        return unsafe { unpack_nibbles_avx2(src, dst) };
    }
    for (g, bytes) in src.chunks_exact(32).enumerate() {
        for (l, &b) in bytes.iter().enumerate() {
            dst[64 * g + l] = (b & 15) as i8;
            dst[64 * g + 32 + l] = (b >> 4) as i8;
        }
    }
}

/// [`unpack_nibbles`] with AVX2: a group is one load, two masks and two stores.
///
/// # Safety
/// avx2; `src` is whole groups and `dst` twice its length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn unpack_nibbles_avx2(src: &[u8], dst: &mut [i8]) {
    use std::arch::x86_64::*;
    let low4 = _mm256_set1_epi8(15);
    for g in 0..src.len() / 32 {
        // SAFETY: the contract: group g's 32 bytes in `src`, 64 in `dst`.
        unsafe {
            let v = _mm256_loadu_si256(src.as_ptr().add(32 * g) as *const __m256i);
            let lo = _mm256_and_si256(v, low4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
            _mm256_storeu_si256(dst.as_mut_ptr().add(64 * g) as *mut __m256i, lo);
            _mm256_storeu_si256(dst.as_mut_ptr().add(64 * g + 32) as *mut __m256i, hi);
        }
    }
}

/// [`panel16_rows`] for `U` activation rows with VNNI.
///
/// Returns `U`, the rows done.
///
/// # Safety
/// avx512f, avx512bw and avx512vnni; `xs` holds at least `U` rows of `panel.blocks` blocks
/// (their bytes to whole blocks); `out` holds `(U - 1) * ldo + 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn panel16_vnni<const U: usize>(
    out: &mut [f32], ldo: usize, xs: &[QuantRow], panel: &Panel16, beta: f32, ahead: bool,
) -> usize {
    use std::arch::x86_64::*;
    let mut total = [_mm512_setzero_ps(); U];
    // With `ahead`, the next sixteen rows of the matrix a line a step into L2, spread over
    // the products so the misses overlap them (a burst of sixteen a block in the layout
    // left it waiting on memory as long as the products took). A prefetch cannot fault.
    let (next, lines) = if ahead { panel.ahead } else { (0, 0) };
    let prefetch = |line: usize| {
        if line < lines {
            _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * line) as *const i8);
        }
    };
    for b in 0..panel.blocks {
        // lo . (w + bias) and hi . (w + bias) for each row's block.
        let (mut lo, mut hi) = ([_mm512_setzero_si512(); U], [_mm512_setzero_si512(); U]);
        // SAFETY: the panel holds whole pairs of blocks (256 quads a block).
        let wp = unsafe { panel.quads.as_ptr().add(b * 128) };
        for j in 0..8 {
            // SAFETY: as above; unaligned loads need no alignment.
            let wv = unsafe { _mm512_loadu_si512(wp.add(j * 16) as *const __m512i) };
            prefetch(8 * b + j);
            for u in 0..U {
                let at = b * Q8_BLOCK + 4 * j;
                // SAFETY: the four bytes at `at` of each row's lo and hi lie inside them
                // (the contract). LLVM folds each broadcast into its `vpdpbusd` as an
                // embedded `{1to16}` operand (checked in the disassembly).
                let (l, h) = unsafe {
                    (
                        (xs[u].lo.as_ptr().add(at) as *const i32).read_unaligned(),
                        (xs[u].hi.as_ptr().add(at) as *const i32).read_unaligned(),
                    )
                };
                lo[u] = _mm512_dpbusd_epi32(lo[u], wv, _mm512_set1_epi32(l));
                hi[u] = _mm512_dpbusd_epi32(hi[u], wv, _mm512_set1_epi32(h));
            }
        }
        // SAFETY: as above.
        let ws = unsafe { _mm512_loadu_ps(panel.scales.as_ptr().add(b * 16)) };
        for (u, t) in total.iter_mut().enumerate() {
            let x = &xs[u];
            // lo + 64 hi = x, so the block's sum is w . x + bias * sum(x): the bias comes off.
            let d = _mm512_add_epi32(lo[u], _mm512_slli_epi32::<6>(hi[u]));
            let d = _mm512_sub_epi32(d, _mm512_set1_epi32(panel.bias * x.wide_sums[b]));
            let v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(x.scales[b])), ws);
            *t = _mm512_add_ps(*t, v);
        }
        if !panel.offsets.is_empty() {
            // 4-bit: each block's offset term, after its scaled sum.
            // SAFETY: a 4-bit panel holds nb * 16 offsets.
            let ms = unsafe { _mm512_loadu_ps(panel.offsets.as_ptr().add(b * 16)) };
            for (u, t) in total.iter_mut().enumerate() {
                let s2 = xs[u].wide_sums[b] as f32 * xs[u].scales[b];
                *t = _mm512_sub_ps(*t, _mm512_mul_ps(_mm512_set1_ps(s2), ms));
            }
        }
    }
    (8 * panel.blocks..lines).for_each(prefetch);
    for (u, t) in total.iter().enumerate() {
        // SAFETY: u * ldo + 16 <= out.len() (the contract).
        unsafe {
            let o = out.as_mut_ptr().add(u * ldo);
            let v = if beta == 0.0 {
                *t
            } else {
                _mm512_add_ps(*t, _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_loadu_ps(o)))
            };
            _mm512_storeu_ps(o, v);
        }
    }
    U
}

/// Sixteen vectors of sixteen 32-bit values transposed: lane `r` of output `c` is lane `c`
/// of input `r`. Interleaves of 32 and 64 bits within 128-bit lanes, then two rounds of
/// 128-bit lane shuffles (64 instructions).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16x16_epi32(r: [std::arch::x86_64::__m512i; 16]) -> [std::arch::x86_64::__m512i; 16] {
    use std::arch::x86_64::*;
    let t: [__m512i; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    let u: [__m512i; 16] = std::array::from_fn(|i| {
        // u[4g + {0, 1, 2, 3}] from t[4g] with t[4g + 2] (lo, hi), then t[4g + 1] with t[4g + 3].
        let (g, j) = (i / 4, i % 4);
        let (a, b) = (t[4 * g + j / 2], t[4 * g + j / 2 + 2]);
        if j % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    let v: [__m512i; 16] = std::array::from_fn(|i| {
        let (h, j) = (i / 8, i % 8);
        let (a, b) = (u[8 * h + j % 4], u[8 * h + j % 4 + 4]);
        if j < 4 {
            _mm512_shuffle_i32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_i32x4::<0xDD>(a, b)
        }
    });
    std::array::from_fn(|j| {
        let (a, b) = (v[j % 8], v[j % 8 + 8]);
        if j < 8 {
            _mm512_shuffle_i32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_i32x4::<0xDD>(a, b)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The panel's quads, byte by byte: rows across lanes, each byte `w + 128` (int8) or
    /// as it is (4 bits), `w = 0` past `k` (a short last block, rows longer than `k`, an
    /// odd block count), whichever path the layout takes on this CPU.
    #[test]
    fn a_panel_holds_each_rows_quads_in_its_lane() {
        for k in [1usize, 31, 32, 33, 64, 96, 100, 130] {
            let stride = k.div_ceil(4) * 4 + 8;
            let w: Vec<i8> =
                (0..16 * stride).map(|i| ((i * 37 + 11) % 256) as i32 - 128).map(|v| v as i8).collect();
            let nb = blocks_of(k, Q8_BLOCK);
            let scales: Vec<f32> = (0..16 * nb).map(|i| i as f32).collect();
            for bias in [128, 0] {
                let mut panel = Panel16::default();
                if bias == 128 {
                    panel.fill(&w, stride, k, &scales, 1);
                } else {
                    panel.lay_out(&w, stride, k, &scales, 0);
                }
                assert_eq!(panel.bias, bias);
                for b in 0..nb {
                    for j in 0..8 {
                        for r in 0..16 {
                            let at = |c: usize| {
                                let v = if c < k { w[r * stride + c] as i32 } else { 0 };
                                ((v + bias) as u8) as u32
                            };
                            let c = b * Q8_BLOCK + 4 * j;
                            let want = at(c) | (at(c + 1) << 8) | (at(c + 2) << 16) | (at(c + 3) << 24);
                            assert_eq!(
                                panel.quads[(b * 8 + j) * 16 + r],
                                want,
                                "k {k}, bias {bias}, block {b}, quad {j}, row {r}"
                            );
                        }
                    }
                    for r in 0..16 {
                        assert_eq!(panel.scales[b * 16 + r], scales[r * nb + b]);
                    }
                }
            }
        }
    }
}
