//! The int8 loops: exact i32 dot products (VNNI where present), the int8 products' row and
//! tile kernels, and the rounding of activations to int8.

use super::*;

#[inline(always)]
pub(super) fn dot_i8_body<const FMA: bool>(x: &[i8], w: &[i8]) -> i32 {
    let n = x.len().min(w.len());
    let (x, w) = (&x[..n], &w[..n]);
    let mut acc = [0i32; STEP];
    let (cx, cw) = (x.chunks_exact(STEP), w.chunks_exact(STEP));
    let (tx, tw) = (cx.remainder(), cw.remainder());
    for (xs, ws) in cx.zip(cw) {
        let xs: &[i8; STEP] = xs.try_into().expect("chunks_exact yields STEP elements");
        let ws: &[i8; STEP] = ws.try_into().expect("chunks_exact yields STEP elements");
        for l in 0..STEP {
            acc[l] += xs[l] as i32 * ws[l] as i32;
        }
    }
    let tail: i32 = tx.iter().zip(tw).map(|(&a, &b)| a as i32 * b as i32).sum();
    acc.iter().sum::<i32>() + tail
}

/// sum(x * w) over int8 with AVX-512 VNNI: `vpdpbusd` multiplies unsigned by signed bytes,
/// so x is biased to `x + 128` (a sign-bit flip) and `128 * sum(w)`, from a second
/// `vpdpbusd` against ones, is taken off. Exact in i32 for rows up to ~10^6 values.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni (checked by the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn dot_i8_vnni(x: &[i8], w: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    let n = x.len().min(w.len());
    let chunks = n / 64;
    let mut acc = _mm512_setzero_si512();
    let mut wsum = _mm512_setzero_si512();
    let flip = _mm512_set1_epi8(i8::MIN);
    let ones = _mm512_set1_epi8(1);
    for c in 0..chunks {
        // SAFETY: c * 64 + 64 <= n <= both lengths, so each 64-byte load is in bounds;
        // unaligned loads need no alignment.
        let (xv, wv) = unsafe {
            (
                _mm512_loadu_si512(x.as_ptr().add(c * 64) as *const __m512i),
                _mm512_loadu_si512(w.as_ptr().add(c * 64) as *const __m512i),
            )
        };
        acc = _mm512_dpbusd_epi32(acc, _mm512_xor_si512(xv, flip), wv);
        wsum = _mm512_dpbusd_epi32(wsum, ones, wv);
    }
    let mut total = _mm512_reduce_add_epi32(acc) - 128 * _mm512_reduce_add_epi32(wsum);
    for i in chunks * 64..n {
        total += x[i] as i32 * w[i] as i32;
    }
    total
}

/// `[x . r0, x . r1, x . r2, x . r3]` over int8, exact in i32, with `xsum = sum(x)` given
/// (computed once per activation row): four weight rows share each load of `x` and the
/// function's entry, which is what a decode-sized product spends its time on.
#[inline]
pub fn dot4_i8(x: &[i8], xsum: i32, rows: [&[i8]; 4]) -> [i32; 4] {
    #[cfg(target_arch = "x86_64")]
    if has_vnni() {
        // SAFETY: has_vnni() checked avx512f, avx512bw and avx512vnni on this CPU.
        return unsafe { dot4_i8_vnni(x, xsum, rows) };
    }
    let _ = xsum;
    rows.map(|r| dot_i8_generic(x, r))
}

/// `dot4_i8` with VNNI: `vpdpbusd` multiplies unsigned by signed bytes, so here the
/// weights are the unsigned side, biased to `w + 128` (a sign-bit flip), and the bias's
/// contribution `128 * sum(x)` comes off at the end -- one product per row instead of the
/// two `dot_i8_vnni` needs, since `sum(x)` is shared by every row.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni (checked by the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn dot4_i8_vnni(x: &[i8], xsum: i32, rows: [&[i8]; 4]) -> [i32; 4] {
    use std::arch::x86_64::*;
    let n = rows.iter().fold(x.len(), |m, r| m.min(r.len()));
    let chunks = n / 64;
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_si512(); 4];
    // The caller walks a matrix four rows at a time, so the next call reads the rows one
    // quad further on: ask for them now. Rows of ~0.5-1.5 KB are too short for the
    // hardware prefetcher to lock on, and without this a core streamed int8 weights at a
    // third of its read bandwidth. A prefetch of an address past the matrix is harmless.
    let quad = (rows[1].as_ptr() as usize).wrapping_sub(rows[0].as_ptr() as usize).wrapping_mul(4);
    for c in 0..chunks {
        for r in &rows {
            let ahead = r.as_ptr().wrapping_add(c * 64).wrapping_add(quad);
            _mm_prefetch::<_MM_HINT_T0>(ahead);
        }
        // SAFETY: c * 64 + 64 <= n <= every length, so each 64-byte load is in bounds;
        // unaligned loads need no alignment.
        let xv = unsafe { _mm512_loadu_si512(x.as_ptr().add(c * 64) as *const __m512i) };
        for (a, r) in acc.iter_mut().zip(&rows) {
            // SAFETY: as above.
            let wv = unsafe { _mm512_loadu_si512(r.as_ptr().add(c * 64) as *const __m512i) };
            *a = _mm512_dpbusd_epi32(*a, _mm512_xor_si512(wv, flip), xv);
        }
    }
    // Only the bytes the chunks covered carry the bias.
    let covered: i32 =
        if chunks * 64 == x.len() { xsum } else { x[..chunks * 64].iter().map(|&v| v as i32).sum() };
    let mut out = [0i32; 4];
    for (o, (a, r)) in out.iter_mut().zip(acc.iter().zip(&rows)) {
        let mut total = _mm512_reduce_add_epi32(*a) - 128 * covered;
        for i in chunks * 64..n {
            total += x[i] as i32 * r[i] as i32;
        }
        *o = total;
    }
    out
}

/// An activation row rounded for an int8 product ([`QuantRow`]): under per-row weights
/// the int8 values, their sum and the row's scale; under blocked weights the 13-bit values
/// and a scale a block.
pub struct Int8Row<'a> {
    /// The int8 values (one block a row).
    pub q: &'a [i8],
    /// The 13-bit values (several blocks).
    pub wide: &'a [i16],
    /// Values per block (the row's length when it is one block).
    pub block: usize,
    /// The int8 values' sum (the bias of VNNI's unsigned operand comes off with it).
    pub sums: &'a [i32],
    /// What one unit of `q` is worth, block by block.
    pub scales: &'a [f32],
    /// The 13-bit values split into bytes, `64 hi + lo`, padded to whole 64-byte steps
    /// ([`QuantRow::lo`]).
    pub lo: &'a [u8],
    /// See `lo`.
    pub hi: &'a [i8],
    /// Each block's sum of `hi`.
    pub hi_sums: &'a [i32],
    /// Each block's sum of `wide`.
    pub wide_sums: &'a [i32],
}

/// A decode product's rows (per-row weights; blocked ones go to `q8_rows_blocked`):
/// `out[r] = (x . w_r) * sx * scales[r]`, plus `beta * out[r]`
/// when `beta` is not zero, for the weight rows `w_r = w[r * stride..r * stride + k]`,
/// `r < out.len()`, with `x`, `sx` and `k` from the rounded row `a`: to the bit what
/// core's `q8_matmul` stores (the integer sums are exact, the scaling is the same two
/// products and one add, not fused).
///
/// With VNNI, sixteen rows a pass: one load of `x` serves sixteen weight rows, the sixteen
/// accumulators are folded into one vector by a transposing tree, and the scaling is one
/// vector op per step. Row at a time, the folds and the scalar scaling cost as much as the
/// products at the widths of a small model (k = 256: four 64-byte steps a row).
pub fn q8_rows(out: &mut [f32], a: &Int8Row, w: &[i8], stride: usize, scales: &[f32], beta: f32) {
    let (n, k) = (out.len(), a.q.len().max(a.wide.len()));
    assert!(stride >= k && scales.len() >= n, "q8_rows: a row or a scale short");
    assert!(n == 0 || w.len() >= (n - 1) * stride + k, "q8_rows: the weights end early");
    if a.scales.len() > 1 {
        // Blocked weights: `scales` holds each row's block scales, row after row.
        return q8_rows_blocked(out, a, w, stride, scales, beta);
    }
    let (x, xsum, sx) = (a.q, a.sums[0], a.scales[0]);
    // Rows in whole sixteen-row passes on VNNI; the rest (all of them elsewhere) below.
    let done = if cfg!(target_arch = "x86_64") && has_vnni() { n / 16 * 16 } else { 0 };
    #[cfg(target_arch = "x86_64")]
    if done > 0 {
        // SAFETY: has_vnni() checked avx512f, avx512bw and avx512vnni; the asserts above
        // put every row `r < done` of `k` bytes inside `w` and its scale inside `scales`.
        unsafe { q8_rows16_vnni(&mut out[..done], a, w, stride, scales, beta) };
    }
    let row = |j: usize| &w[j * stride..j * stride + k];
    let store = |o: &mut f32, acc: i32, j: usize| {
        let v = acc as f32 * sx * scales[j];
        *o = if beta == 0.0 { v } else { v + beta * *o };
    };
    let rest = &mut out[done..];
    let quads = rest.len() / 4;
    for q in 0..quads {
        let j = done + 4 * q;
        let acc = dot4_i8(x, xsum, [row(j), row(j + 1), row(j + 2), row(j + 3)]);
        for (u, a) in acc.into_iter().enumerate() {
            store(&mut rest[4 * q + u], a, j + u);
        }
    }
    for u in 4 * quads..rest.len() {
        store(&mut rest[u], dot_i8(x, row(done + u)), done + u);
    }
}

/// [`q8_rows`] on VNNI for `out.len()` a multiple of 16, the weights as the unsigned side
/// (biased by 128, taken off with `xsum`) as in `dot4_i8_vnni`.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni; rows `0..out.len()` of `a.q.len()`
/// bytes at `stride` must lie inside `w`, and `scales` must have `out.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn q8_rows16_vnni(
    out: &mut [f32], a: &Int8Row, w: &[i8], stride: usize, scales: &[f32], beta: f32,
) {
    use std::arch::x86_64::*;
    let (x, xsum, sx) = (a.q, a.sums[0], a.scales[0]);
    let k = x.len();
    let (full, tail) = (k / 64, k % 64);
    // A short last step reads only its bytes; the zeroed rest adds 128 * 0 to every sum.
    let tail_mask: __mmask64 = if tail == 0 { 0 } else { (1u64 << tail) - 1 };
    let flip = _mm512_set1_epi8(i8::MIN);
    let bias = _mm512_set1_epi32(128 * xsum);
    let (vsx, vbeta) = (_mm512_set1_ps(sx), _mm512_set1_ps(beta));
    let xp = x.as_ptr();
    for (b, o16) in out.chunks_exact_mut(16).enumerate() {
        let base = w.as_ptr().wrapping_add(b * 16 * stride);
        let mut acc = [[_mm512_setzero_si512(); 4]; 4];
        // Row 4 g + u of the block starts at group[g] + u * stride: four pointers and the
        // stride's multiples, which the addressing modes take as they are (sixteen row
        // pointers did not fit the registers, and every load reloaded its own).
        let group = [0, 1, 2, 3].map(|g| base.wrapping_add(4 * g * stride));
        // The next block's bytes (the rows are contiguous), sixteen lines a step: rows of a
        // few hundred bytes are too short for the hardware prefetcher to lock on. A
        // prefetch past the matrix is harmless.
        let next = base.wrapping_add(16 * stride);
        let step = |acc: &mut [[__m512i; 4]; 4], c: usize, mask: __mmask64| {
            // SAFETY: bytes c * 64.. under `mask` are inside x (k bytes) and inside each row.
            let xv = unsafe { _mm512_maskz_loadu_epi8(mask, xp.add(c * 64)) };
            let ahead = next.wrapping_add(c * 1024);
            for (g, a4) in acc.iter_mut().enumerate() {
                let p = group[g].wrapping_add(c * 64);
                for (u, a) in a4.iter_mut().enumerate() {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add((4 * g + u) * 64));
                    // SAFETY: as above, for row 16 b + 4 g + u (< out.len()).
                    let wv = unsafe { _mm512_maskz_loadu_epi8(mask, p.wrapping_add(u * stride)) };
                    *a = _mm512_dpbusd_epi32(*a, _mm512_xor_si512(wv, flip), xv);
                }
            }
        };
        for c in 0..full {
            step(&mut acc, c, !0);
        }
        if tail != 0 {
            step(&mut acc, full, tail_mask);
        }
        // Row 4 g + u's total in lane 4 g + u.
        let totals = _mm512_sub_epi32(fold16_i32(&acc), bias);
        // SAFETY: scales has out.len() >= 16 b + 16 values; o16 is 16 writable floats.
        unsafe {
            let sc = _mm512_loadu_ps(scales.as_ptr().add(b * 16));
            let mut v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(totals), vsx), sc);
            if beta != 0.0 {
                v = _mm512_add_ps(v, _mm512_mul_ps(vbeta, _mm512_loadu_ps(o16.as_ptr())));
            }
            _mm512_storeu_ps(o16.as_mut_ptr(), v);
        }
    }
}

/// Sixteen i32 accumulators (four groups of four) to one vector of their sixteen totals,
/// `acc[g][u]`'s in lane `4 g + u`, by a transposing tree rather than a horizontal
/// reduction each (which cost as much as the products at k = 256): within a group,
/// interleave-and-add so each 128-bit lane holds partial sums of its four; across groups,
/// 128-bit lane shuffles and adds. Integer sums: any order gives the same value.
///
/// # Safety
/// The CPU must have avx512f (checked by the callers).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn fold16_i32(acc: &[[std::arch::x86_64::__m512i; 4]; 4]) -> std::arch::x86_64::__m512i {
    // Lanes 0..8 and 8..16 folded apart, then added: the same shuffles and adds.
    // SAFETY: avx512f (the contract).
    let (lo, hi) = unsafe { super::int8_blocks::fold16x2_i32(acc) };
    std::arch::x86_64::_mm512_add_epi32(lo, hi)
}

/// `out[i][j] = xs[i] . rows[j]` over int8 for four activation rows and four weight rows,
/// exact in i32, with `xsums[i] = sum(xs[i])`: the tile of the int8 GEMM that prompt
/// processing runs. Each 64-byte load of a weight row serves four activation rows (the
/// row-at-a-time `dot4_i8` reloads the weights for every row), and the sixteen sums are
/// folded together at the end instead of one horizontal reduction each.
#[inline]
pub fn dot4x4_i8(xs: [&[i8]; 4], xsums: [i32; 4], rows: [&[i8]; 4]) -> [[i32; 4]; 4] {
    #[cfg(target_arch = "x86_64")]
    if has_vnni() {
        // SAFETY: has_vnni() checked avx512f, avx512bw and avx512vnni on this CPU.
        return unsafe { dot4x4_i8_vnni(xs, xsums, rows) };
    }
    let _ = xsums;
    xs.map(|x| rows.map(|r| dot_i8_generic(x, r)))
}

/// The sixteen sums of a 4 x 4 tile over the first `chunks` 64-byte chunks, with the
/// weights made unsigned (+128: the bias `128 * sum(x)` is still in them), folded into one
/// vector (`fold16_i32`'s lane order: activation row `i`, weight row `j` in lane `4 i + j`).
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni; every row of `xs` and `rows` holds
/// at least `64 * chunks` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
pub(super) unsafe fn tile_sums_vnni(
    xs: [&[i8]; 4], rows: [&[i8]; 4], chunks: usize,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [[_mm512_setzero_si512(); 4]; 4];
    for c in 0..chunks {
        // SAFETY: c * 64 + 64 <= 64 * chunks bytes are in every row (the contract);
        // unaligned loads need no alignment.
        let w = rows.map(|r| unsafe {
            _mm512_xor_si512(_mm512_loadu_si512(r.as_ptr().add(c * 64) as *const __m512i), flip)
        });
        for (a, x) in acc.iter_mut().zip(&xs) {
            // SAFETY: as above.
            let xv = unsafe { _mm512_loadu_si512(x.as_ptr().add(c * 64) as *const __m512i) };
            for (aj, wj) in a.iter_mut().zip(&w) {
                *aj = _mm512_dpbusd_epi32(*aj, *wj, xv);
            }
        }
    }
    // SAFETY: avx512f (the contract).
    unsafe { fold16_i32(&acc) }
}

/// The int8 GEMM's 4 x 4 tile and its outputs: `out[u * stride + v] = (xs[u] . rows[v]) as
/// f32 * sx[u] * scales[v]`, plus `beta * out[u * stride + v]` when `beta` is not 0 (the
/// old value is not read otherwise), for `u, v < 4`; `xsums[u] = sum(xs[u])`. The plain
/// form is [`dot4x4_i8`] and a store per element; with VNNI and rows a whole number of
/// 64 bytes long the sixteen outputs are converted, scaled and stored as vectors, in the
/// same operations on each element (the per-element stores had been a sixth of a prompt's
/// processing).
///
/// # Panics
/// When `out` has fewer than `3 * stride + 4` elements or `scales` fewer than 4.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn tile4x4_i8(
    out: &mut [f32], stride: usize, xs: [&[i8]; 4], xsums: [i32; 4], sx: [f32; 4], rows: [&[i8]; 4],
    scales: &[f32], beta: f32,
) {
    let scales: &[f32; 4] = scales[..4].try_into().expect("four scales");
    let _ = &out[3 * stride..3 * stride + 4];
    #[cfg(target_arch = "x86_64")]
    {
        let n = xs[0].len();
        if has_vnni() && n.is_multiple_of(64) && rows.iter().chain(&xs).all(|r| r.len() == n) {
            // SAFETY: has_vnni() checked the features; the rows are n = 64 * (n / 64)
            // bytes long; `out` holds 3 * stride + 4 elements (checked above).
            return unsafe { tile4x4_i8_vnni(out, stride, xs, xsums, sx, rows, scales, beta) };
        }
    }
    let acc = dot4x4_i8(xs, xsums, rows);
    for (u, acc_u) in acc.iter().enumerate() {
        for (v, &a) in acc_u.iter().enumerate() {
            let o = &mut out[u * stride + v];
            let y = a as f32 * sx[u] * scales[v];
            *o = if beta == 0.0 { y } else { y + beta * *o };
        }
    }
}

/// [`tile4x4_i8`] with VNNI: the folded sums less the bias, converted (round to nearest, as
/// `as f32`), times `sx` then the scales, each activation row's four outputs one 128-bit
/// store.
///
/// # Safety
/// avx512f, avx512bw and avx512vnni; every row of `xs` and `rows` is `64 * k` bytes long
/// for some k; `out` holds at least `3 * stride + 4` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile4x4_i8_vnni(
    out: &mut [f32], stride: usize, xs: [&[i8]; 4], xsums: [i32; 4], sx: [f32; 4], rows: [&[i8]; 4],
    scales: &[f32; 4], beta: f32,
) {
    use std::arch::x86_64::*;
    // SAFETY: the contract: every row is 64 * (len / 64) bytes.
    let all = unsafe { tile_sums_vnni(xs, rows, xs[0].len() / 64) };
    let b = xsums.map(|x| x.wrapping_mul(128));
    let bias = _mm512_setr_epi32(
        b[0], b[0], b[0], b[0], b[1], b[1], b[1], b[1], b[2], b[2], b[2], b[2], b[3], b[3], b[3], b[3],
    );
    let s = sx;
    let sxv = _mm512_setr_ps(
        s[0], s[0], s[0], s[0], s[1], s[1], s[1], s[1], s[2], s[2], s[2], s[2], s[3], s[3], s[3], s[3],
    );
    // SAFETY: `scales` is four floats.
    let scv = _mm512_broadcast_f32x4(unsafe { _mm_loadu_ps(scales.as_ptr()) });
    let y = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(all, bias)), sxv), scv);
    // SAFETY: the contract: `out` holds 3 * stride + 4 elements.
    unsafe { store4x4(out, stride, y, beta) };
}

/// `dot4x4_i8` with VNNI, the weights as the unsigned side as in `dot4_i8_vnni`.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni (checked by the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn dot4x4_i8_vnni(xs: [&[i8]; 4], xsums: [i32; 4], rows: [&[i8]; 4]) -> [[i32; 4]; 4] {
    use std::arch::x86_64::*;
    let n = rows.iter().chain(&xs).fold(usize::MAX, |m, r| m.min(r.len()));
    let chunks = n / 64;
    // SAFETY: the caller's contract (avx512f, avx512bw, avx512vnni); chunks * 64 <= n.
    let all = unsafe { tile_sums_vnni(xs, rows, chunks) };
    let mut totals = [[0i32; 4]; 4];
    // SAFETY: `totals` is 64 writable bytes; unaligned stores need no alignment.
    unsafe { _mm512_storeu_si512(totals.as_mut_ptr() as *mut __m512i, all) };
    let mut out = [[0i32; 4]; 4];
    for (i, (o, sums)) in out.iter_mut().zip(totals).enumerate() {
        let x = xs[i];
        // Only the bytes the chunks covered carry the bias.
        let covered: i32 =
            if chunks * 64 == x.len() { xsums[i] } else { x[..chunks * 64].iter().map(|&v| v as i32).sum() };
        for (j, (oj, s)) in o.iter_mut().zip(sums).enumerate() {
            let r = rows[j];
            let mut total = s - 128 * covered;
            for t in chunks * 64..n {
                total += x[t] as i32 * r[t] as i32;
            }
            *oj = total;
        }
    }
    out
}

/// An activation row rounded to int8 with its own scale, to the bit what core's
/// `quantize_activations` gives (the reference twin; tests compare them on ties, NaN and
/// tails). A scalar `roundf` per value cost as much as the int8 products it feeds at
/// decode time.
pub fn quantize_i8(x: &[f32]) -> (Vec<i8>, f32) {
    let mut out = Vec::new();
    let scale = quantize_i8_into(x, &mut out);
    (out, scale)
}

/// [`quantize_i8`] into `out` (resized to `x.len()`), returning the scale: a decode step
/// rounds ~25 activation rows, and on the AVX-512 path a kept buffer spares an allocation
/// each (the other paths return core's new vector in its place).
pub fn quantize_i8_into(x: &[f32], out: &mut Vec<i8>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa(), Isa::Avx512) {
        // SAFETY: isa() reported avx512f on this CPU (run-time detection).
        return unsafe { quantize_i8_avx512(x, out) };
    }
    let (q, scale) = rusting_brain_core::ops::q8::quantize_activations(x);
    *out = q;
    scale
}

/// # Safety
/// The CPU must have avx512f (checked by the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn quantize_i8_avx512(x: &[f32], out: &mut Vec<i8>) -> f32 {
    use std::arch::x86_64::*;
    let chunks = x.len() / 16;
    let load = |c: usize| {
        // SAFETY: c < chunks, so the 16 floats at c * 16 lie inside x.
        unsafe { _mm512_loadu_ps(x.as_ptr().add(c * 16)) }
    };
    // max(|v|, m) returns m when v is NaN, as f32::max does in the reference's fold.
    let mut m = _mm512_setzero_ps();
    for c in 0..chunks {
        m = _mm512_max_ps(_mm512_abs_ps(load(c)), m);
    }
    let absmax = x[chunks * 16..].iter().fold(_mm512_reduce_max_ps(m), |m, v| m.max(v.abs()));
    let scale = absmax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    // Every byte is written below.
    out.resize(x.len(), 0);
    let (vinv, half, lo, hi) =
        (_mm512_set1_ps(inv), _mm512_set1_ps(0.5), _mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    let (sign, one) = (_mm512_set1_epi32(i32::MIN), _mm512_castps_si512(_mm512_set1_ps(1.0)));
    for c in 0..chunks {
        let y = _mm512_mul_ps(load(c), vinv);
        // roundf (half away from zero) exactly: truncate, then step away from zero when the
        // dropped fraction is at least one half; y - trunc(y) is exact below 2^23, and
        // above it y is already an integer.
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(y, t)), half);
        let step = _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(y), sign), one));
        let r = _mm512_mask_add_ps(t, away, t, step);
        // NaN stays NaN through the clamp (max and min return their second operand on
        // NaN), converts to 0x8000_0000 and truncates to the byte 0, as `NaN as i8` does.
        let r = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
        let bytes = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r));
        // SAFETY: the 16 bytes at c * 16 lie inside out (out.len() == x.len()).
        unsafe { _mm_storeu_si128(out.as_mut_ptr().add(c * 16) as *mut __m128i, bytes) };
    }
    for (o, &v) in out[chunks * 16..].iter_mut().zip(&x[chunks * 16..]) {
        *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// sum(x * w) over int8, exact in i32: VNNI where the CPU has it, else widening SIMD loops.
#[inline]
pub fn dot_i8(x: &[i8], w: &[i8]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if has_vnni() {
        // SAFETY: has_vnni() checked avx512f, avx512bw and avx512vnni on this CPU.
        return unsafe { dot_i8_vnni(x, w) };
    }
    dot_i8_generic(x, w)
}

dispatch!(
    /// sum(x * w) over int8 in i32, without VNNI (see `dot_i8`).
    dot_i8_generic => dot_i8_body(x: &[i8], w: &[i8]) -> i32
);
