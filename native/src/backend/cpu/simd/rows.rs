//! Attention's rows: one query (or a GQA group's heads) against a strided KV cache, scores
//! and the weighted sum of values.

use super::*;

#[inline(always)]
pub(super) fn dot_rows_body<const FMA: bool>(
    out: &mut [f32], q: &[f32], rows: &[f32], stride: usize, scale: f32,
) {
    let d = q.len();
    // One vector of accumulators, not `dot`'s four: a head is 32-128 wide, under `dot`'s
    // 64-element step, which would leave it all to the scalar tail.
    let (cq, tq) = (q.chunks_exact(LANES), q.chunks_exact(LANES).remainder());
    for (j, o) in out.iter_mut().enumerate() {
        let r = &rows[j * stride..j * stride + d];
        let mut acc = [0.0f32; LANES];
        for (x, y) in cq.clone().zip(r.chunks_exact(LANES)) {
            // As arrays: over slices LLVM vectorized this two lanes at a time (a decode
            // step's attention ran at a quarter of the vector width).
            let (x, y) = (lanes(x), lanes(y));
            for l in 0..LANES {
                acc[l] = madd::<FMA>(x[l], y[l], acc[l]);
            }
        }
        let mut tail = 0.0f32;
        for (x, y) in tq.iter().zip(&r[d - tq.len()..]) {
            tail = madd::<FMA>(*x, *y, tail);
        }
        *o = scale * (hsum(&acc) + tail);
    }
}

#[inline(always)]
pub(super) fn axpy_rows_body<const FMA: bool>(
    out: &mut [f32], p: &[f32], inv: f32, rows: &[f32], stride: usize,
) {
    let d = out.len();
    let row = |j: usize| &rows[j * stride..j * stride + d];
    // Four rows a pass, each element taking their terms in order (the same operations as
    // four axpys): `out` is loaded and stored once a pass instead of once a row.
    let mut groups = p.chunks_exact(4);
    let mut j = 0;
    for g in groups.by_ref() {
        let a = [g[0] * inv, g[1] * inv, g[2] * inv, g[3] * inv];
        let terms = out.iter_mut().zip(row(j)).zip(row(j + 1)).zip(row(j + 2)).zip(row(j + 3));
        for ((((o, &r0), &r1), &r2), &r3) in terms {
            let t = madd::<FMA>(a[0], r0, *o);
            let t = madd::<FMA>(a[1], r1, t);
            let t = madd::<FMA>(a[2], r2, t);
            *o = madd::<FMA>(a[3], r3, t);
        }
        j += 4;
    }
    for &pj in groups.remainder() {
        axpy_body::<FMA>(out, pj * inv, row(j));
        j += 1;
    }
}

dispatch!(
    /// [`dot_rows`] for any ISA and head width.
    dot_rows_any => dot_rows_body(out: &mut [f32], q: &[f32], rows: &[f32], stride: usize, scale: f32)
);

/// `out[j] = scale * dot(q, rows[j * stride..][..q.len()])` for every `j < out.len()`: one
/// head's attention scores against a strided KV cache, in one dispatched call (the per-row
/// `dot` calls cost more than their 32-wide work at decode time).
#[inline]
pub fn dot_rows(out: &mut [f32], q: &[f32], rows: &[f32], stride: usize, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && !q.is_empty() && q.len().is_multiple_of(LANES) {
        // SAFETY: isa() is Avx512 only after run-time detection found avx512f.
        return unsafe { dot_rows_avx512(out, q, rows, stride, scale) };
    }
    dot_rows_any(out, q, rows, stride, scale)
}

/// [`dot_rows_body`] on AVX-512 for heads a multiple of 16 wide, in the same operations (one
/// FMA chain per key, then `hsum`'s halvings 8, 4, 2 and 1 lanes apart, plus the empty
/// tail's 0), so the same bits. The generic body came out two lanes wide: LLVM shaped its
/// vectors by the reduction tree, and the scores took half a decode step's attention.
///
/// # Safety
/// The CPU must have avx512f.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot_rows_avx512(out: &mut [f32], q: &[f32], rows: &[f32], stride: usize, scale: f32) {
    use std::arch::x86_64::*;
    let d = q.len();
    let (zero, vscale) = (_mm512_setzero_ps(), _mm512_set1_ps(scale));
    // Sixteen keys a pass: sixteen FMA chains, then their sixteen `hsum`s at once
    // (`fold16`, the same bits); the scores come out as one vector.
    let full = out.len() / 16 * 16;
    for (b, o16) in out[..full].chunks_exact_mut(16).enumerate() {
        let base = &rows[b * 16 * stride..];
        let mut acc = [zero; 16];
        for c in (0..d).step_by(LANES) {
            // SAFETY: c + 16 <= d elements are in `q`; key b * 16 + r < out.len() has its
            // d elements inside `rows` (the caller's span).
            let x = unsafe { _mm512_loadu_ps(q.as_ptr().add(c)) };
            for (r, a) in acc.iter_mut().enumerate() {
                let y = unsafe { _mm512_loadu_ps(base[r * stride + c..r * stride + c + LANES].as_ptr()) };
                *a = _mm512_fmadd_ps(x, y, *a);
            }
        }
        let sums = fold16(&acc);
        let v = _mm512_mul_ps(vscale, _mm512_add_ps(sums, zero));
        // SAFETY: o16 is 16 writable floats.
        unsafe { _mm512_storeu_ps(o16.as_mut_ptr(), v) };
    }
    for (j, o) in out.iter_mut().enumerate().skip(full) {
        let r = &rows[j * stride..j * stride + d];
        let mut acc = zero;
        for c in (0..d).step_by(LANES) {
            // SAFETY: c + 16 <= d elements are in `q` and `r` (d is a multiple of 16).
            let (x, y) = unsafe { (_mm512_loadu_ps(q.as_ptr().add(c)), _mm512_loadu_ps(r.as_ptr().add(c))) };
            acc = _mm512_fmadd_ps(x, y, acc);
        }
        let hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
        let h8 = _mm256_add_ps(_mm512_castps512_ps256(acc), hi8);
        let h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
        let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
        let h1 = _mm_add_ss(h2, _mm_movehdup_ps(h2));
        *o = scale * (_mm_cvtss_f32(h1) + 0.0);
    }
}

/// `[hsum(acc[0]), .., hsum(acc[15])]` as one vector: sixteen horizontal sums at once by a
/// transposing tree whose every add joins the same two partial sums as `hsum` does (lanes
/// 8, 4, 2, then 1 apart), so each lane has `hsum`'s bits. Sum by sum, the four dependent
/// horizontal steps and the scalar stores were most of the attention scores' time.
///
/// # Safety
/// The CPU must have avx512f.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn fold16(acc: &[std::arch::x86_64::__m512; 16]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // Lanes 8 apart (128-bit blocks 0 + 2, 1 + 3), two sums a vector.
    let s8: [__m512; 8] = std::array::from_fn(|p| {
        let (a, b) = (acc[2 * p], acc[2 * p + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b))
    });
    // Lanes 4 apart (blocks 0 + 1 of each sum's half), four sums a vector, one a block.
    let s4: [__m512; 4] = std::array::from_fn(|p| {
        let (a, b) = (s8[2 * p], s8[2 * p + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b))
    });
    // Lanes 2 apart, then 1 apart: block k of the result holds sums k, 4 + k, 8 + k,
    // 12 + k.
    let s2: [__m512; 2] = std::array::from_fn(|p| {
        let (a, b) = (_mm512_castps_pd(s4[2 * p]), _mm512_castps_pd(s4[2 * p + 1]));
        _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)))
    });
    let s1 = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(s2[0], s2[1]), _mm512_shuffle_ps::<0xDD>(s2[0], s2[1]));
    // Sum i sits in lane 4 (i % 4) + i / 4.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, s1)
}

/// Attention scores of `h` query heads that share their keys (a GQA group):
/// `out[i * n + j] = scale * dot(q[i * d..][..d], rows[j * stride..][..d])` for `i < h`,
/// `j < n`, with `d = q.len() / h`. The same numbers as [`dot_rows`] head by head (each
/// score is one FMA chain and `hsum`'s tree either way); on AVX-512 each key row is read
/// once for up to four heads instead of once a head: at decode time the rows come from L2
/// or further, and reading them once a head was most of the scores' time.
pub fn dot_rows_heads(
    out: &mut [f32], n: usize, q: &[f32], h: usize, rows: &[f32], stride: usize, scale: f32,
) {
    let d = q.len().checked_div(h).unwrap_or(0);
    assert!(out.len() >= h * n && q.len() == h * d, "dot_rows_heads: {h} heads of {d} against {n} keys");
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && d > 0 && d.is_multiple_of(LANES) && n > 0 {
        let mut i = 0;
        while i < h {
            let take = (h - i).min(4);
            let (o, qs) = (&mut out[i * n..(i + take) * n], &q[i * d..(i + take) * d]);
            // SAFETY: isa() is Avx512 only after run-time detection found avx512f.
            unsafe {
                match take {
                    4 => dot_rows_heads_avx512::<4>(o, n, qs, rows, stride, scale),
                    3 => dot_rows_heads_avx512::<3>(o, n, qs, rows, stride, scale),
                    2 => dot_rows_heads_avx512::<2>(o, n, qs, rows, stride, scale),
                    _ => dot_rows_avx512(o, qs, rows, stride, scale),
                }
            }
            i += take;
        }
        return;
    }
    for i in 0..h {
        dot_rows(&mut out[i * n..(i + 1) * n], &q[i * d..(i + 1) * d], rows, stride, scale);
    }
}

/// [`dot_rows_heads`] for `H` heads (2 to 4) on AVX-512: `16 / H` keys a pass, each key's
/// row loaded once a 16-lane step and multiplied into every head's chain, the `H * (16 /
/// H)` sums folded at once by `fold16`. Keys past the last whole pass go through
/// [`dot_rows_avx512`]'s key-by-key tail, which gives the same bits.
///
/// # Safety
/// The CPU must have avx512f; `q.len()` is `H` heads of a multiple of 16 lanes, `out` holds
/// `H * n` scores and `rows` the `n` key rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot_rows_heads_avx512<const H: usize>(
    out: &mut [f32], n: usize, q: &[f32], rows: &[f32], stride: usize, scale: f32,
) {
    use std::arch::x86_64::*;
    let d = q.len() / H;
    let kb = LANES / H;
    let (zero, vscale) = (_mm512_setzero_ps(), _mm512_set1_ps(scale));
    let full = n / kb * kb;
    let mut lanes = [0.0f32; LANES];
    for j0 in (0..full).step_by(kb) {
        // acc[i * kb + r]: head i against key j0 + r.
        let mut acc = [zero; LANES];
        for c in (0..d).step_by(LANES) {
            // SAFETY: c + 16 <= d elements are in each head's query.
            let qs: [__m512; H] =
                std::array::from_fn(|i| unsafe { _mm512_loadu_ps(q.as_ptr().add(i * d + c)) });
            for r in 0..kb {
                let at = (j0 + r) * stride + c;
                let y = _mm512_loadu_ps(rows[at..at + LANES].as_ptr());
                for (i, x) in qs.iter().enumerate() {
                    acc[i * kb + r] = _mm512_fmadd_ps(*x, y, acc[i * kb + r]);
                }
            }
        }
        let v = _mm512_mul_ps(vscale, _mm512_add_ps(fold16(&acc), zero));
        // SAFETY: `lanes` is 16 floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
        for i in 0..H {
            out[i * n + j0..i * n + j0 + kb].copy_from_slice(&lanes[i * kb..(i + 1) * kb]);
        }
    }
    if full < n {
        for i in 0..H {
            let o = &mut out[i * n + full..(i + 1) * n];
            dot_rows_avx512(o, &q[i * d..(i + 1) * d], &rows[full * stride..], stride, scale);
        }
    }
}

/// The weighted sums of values of `h` heads that share their value rows:
/// `out[i * d..][..d] += sum_j (p[i * n + j] * inv[i]) * rows[j * stride..][..d]`, in order
/// of `j`, with `d = out.len() / h`. The same numbers as [`axpy_rows`] head by head; on
/// AVX-512 each value row is read once for every head, and the heads' independent FMA
/// chains overlap (one head's chain was bound by the FMA latency, a key every four cycles).
pub fn axpy_rows_heads(out: &mut [f32], p: &[f32], n: usize, inv: &[f32], rows: &[f32], stride: usize) {
    let h = inv.len();
    let d = out.len().checked_div(h).unwrap_or(0);
    assert!(p.len() >= h * n && out.len() == h * d, "axpy_rows_heads: {h} heads of {d} over {n} rows");
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && d > 0 && d.is_multiple_of(LANES) && d <= 4 * LANES {
        let per = 16 / (d / LANES); // heads whose accumulators fit in 16 registers
        let mut i = 0;
        while i < h {
            let take = (h - i).min(per).min(4);
            let o = &mut out[i * d..(i + take) * d];
            let (ps, iv) = (&p[i * n..(i + take) * n], &inv[i..i + take]);
            // SAFETY: isa() is Avx512 only after run-time detection found avx512f.
            unsafe {
                match take {
                    4 => axpy_rows_heads_avx512::<4>(o, ps, n, iv, rows, stride),
                    3 => axpy_rows_heads_avx512::<3>(o, ps, n, iv, rows, stride),
                    2 => axpy_rows_heads_avx512::<2>(o, ps, n, iv, rows, stride),
                    _ => axpy_rows_avx512(o, &ps[..n], iv[0], rows, stride),
                }
            }
            i += take;
        }
        return;
    }
    for i in 0..h {
        axpy_rows(&mut out[i * d..(i + 1) * d], &p[i * n..(i + 1) * n], inv[i], rows, stride);
    }
}

/// [`axpy_rows_heads`] for `H` heads (2 to 4) of 16 to 64 lanes on AVX-512: every head's
/// outputs in registers from the first row to the last, `_mm512_set1_ps(p * inv)` and one
/// FMA a vector as [`axpy_rows_avx512`] does (same bits).
///
/// # Safety
/// The CPU must have avx512f; `out` is `H` heads of 16 to 64 lanes (a multiple of 16), `p`
/// holds `H * n` weights and `rows` the `n` value rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn axpy_rows_heads_avx512<const H: usize>(
    out: &mut [f32], p: &[f32], n: usize, inv: &[f32], rows: &[f32], stride: usize,
) {
    use std::arch::x86_64::*;
    let d = out.len() / H;
    let vecs = d / LANES;
    // acc[i * 4 + v]: head i's lanes 16 v..16 v + 16.
    let mut acc = [_mm512_setzero_ps(); 16];
    for i in 0..H {
        for v in 0..vecs {
            // SAFETY: v < vecs, so head i's lane 16 v + 16 <= d.
            acc[i * 4 + v] = unsafe { _mm512_loadu_ps(out.as_ptr().add(i * d + v * LANES)) };
        }
    }
    for j in 0..n {
        let a: [__m512; H] = std::array::from_fn(|i| _mm512_set1_ps(p[i * n + j] * inv[i]));
        let r = &rows[j * stride..j * stride + d];
        for v in 0..vecs {
            // SAFETY: inside the row's d elements.
            let y = unsafe { _mm512_loadu_ps(r.as_ptr().add(v * LANES)) };
            for (i, a) in a.iter().enumerate() {
                acc[i * 4 + v] = _mm512_fmadd_ps(*a, y, acc[i * 4 + v]);
            }
        }
    }
    for i in 0..H {
        for v in 0..vecs {
            // SAFETY: as for the loads.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(i * d + v * LANES), acc[i * 4 + v]) };
        }
    }
}

dispatch!(
    /// [`axpy_rows`] for any ISA and width.
    axpy_rows_any => axpy_rows_body(out: &mut [f32], p: &[f32], inv: f32, rows: &[f32], stride: usize)
);

/// `out += sum_j (p[j] * inv) * rows[j * stride..][..out.len()]`, in order of `j`: the
/// weighted sum of values, one `axpy` per row as before, in one dispatched call.
#[inline]
pub fn axpy_rows(out: &mut [f32], p: &[f32], inv: f32, rows: &[f32], stride: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && !out.is_empty() && out.len().is_multiple_of(LANES) && out.len() <= 8 * LANES {
        // SAFETY: isa() is Avx512 only after run-time detection found avx512f.
        return unsafe { axpy_rows_avx512(out, p, inv, rows, stride) };
    }
    axpy_rows_any(out, p, inv, rows, stride)
}

/// [`axpy_rows_body`] on AVX-512 for a head of 16 to 128 lanes (a multiple of 16), its
/// outputs in registers from the first row to the last: the same FMAs in the same order
/// (same bits), without the store and reload of `out` every four rows.
///
/// # Safety
/// The CPU must have avx512f.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn axpy_rows_avx512(out: &mut [f32], p: &[f32], inv: f32, rows: &[f32], stride: usize) {
    use std::arch::x86_64::*;
    let vecs = out.len() / LANES;
    let mut acc = [_mm512_setzero_ps(); 8];
    for (v, a) in acc.iter_mut().enumerate().take(vecs) {
        // SAFETY: v < vecs, so 16 v + 16 <= out.len().
        *a = unsafe { _mm512_loadu_ps(out.as_ptr().add(v * LANES)) };
    }
    for (j, &pj) in p.iter().enumerate() {
        let a = _mm512_set1_ps(pj * inv);
        let r = &rows[j * stride..j * stride + out.len()];
        for (v, acc) in acc.iter_mut().enumerate().take(vecs) {
            // SAFETY: as above, inside the row's out.len() elements.
            *acc = _mm512_fmadd_ps(a, unsafe { _mm512_loadu_ps(r.as_ptr().add(v * LANES)) }, *acc);
        }
    }
    for (v, a) in acc.iter().enumerate().take(vecs) {
        // SAFETY: as for the loads.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(v * LANES), *a) };
    }
}
