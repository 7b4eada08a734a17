//! The primitives this backend runs with its own loops instead of core's: the products
//! and attention, where core's reference order (one running sum per output) cannot
//! vectorize. Each has the same contract as its twin in `rusting_brain_core::ops` (checked
//! by the same functions) and is compared with it by the backend sweep.

use alloc::vec;
use alloc::vec::Vec;

use rusting_brain_core::backend::{AttentionSpec, MatmulSpec, OperandPrecision, Q8Product};
use rusting_brain_core::ops::matmul::round_bf16;
use rusting_brain_core::ops::{q4, q8, swiglu};
use rusting_brain_core::Result;

use crate::dot::{
    as_i8, as_u8, dot4_f32, dot_f32, dot_i8_i16, dot_nibbles_i16, dot_row_block_i8, max_f32, weighted_rows,
};
use crate::exp::exp_f32;

/// Twin of `ops::matmul::matmul`. Each problem's A is laid out as rows of k and B as
/// columns of k (copied only where the spec's transposes or BF16 rounding ask for it), so
/// every output is one contiguous dot product.
pub(crate) fn matmul(c: &mut [f32], a: &[f32], b: &[f32], spec: &MatmulSpec) -> Result<()> {
    let (a, b, c, spec) = spec.operands("matmul", a, b, c)?;
    let (la, lb, lc) = spec.check("matmul", a.len(), b.len(), c.len())?;
    let MatmulSpec { m, n, k, .. } = spec;
    let bf16 = spec.precision == OperandPrecision::Bf16;
    let round = |v: f32| if bf16 { round_bf16(v) } else { v };
    let mut a_rows: Vec<f32> = Vec::new();
    let mut b_cols: Vec<f32> = Vec::new();
    for batch in 0..spec.batch {
        let a = &a[batch * la..(batch + 1) * la];
        let b = &b[batch * lb..(batch + 1) * lb];
        let c = &mut c[batch * lc..(batch + 1) * lc];
        // A as (m, k) rows.
        let a = if spec.trans_a || bf16 {
            a_rows.clear();
            a_rows.extend((0..m * k).map(|e| {
                let (i, p) = (e / k, e % k);
                round(if spec.trans_a { a[p * m + i] } else { a[e] })
            }));
            &a_rows[..]
        } else {
            a
        };
        // B as (n, k) rows: B^T.
        let b = if !spec.trans_b || bf16 {
            b_cols.clear();
            b_cols.extend((0..n * k).map(|e| {
                let (j, p) = (e / k, e % k);
                round(if spec.trans_b { b[e] } else { b[p * n + j] })
            }));
            &b_cols[..]
        } else {
            b
        };
        for i in 0..m {
            let arow = &a[i * k..(i + 1) * k];
            for j in 0..n {
                let acc = dot_f32(arow, &b[j * k..(j + 1) * k]);
                let old = if spec.beta == 0.0 { 0.0 } else { spec.beta * c[i * n + j] };
                c[i * n + j] = spec.alpha * acc + old;
            }
        }
    }
    Ok(())
}

/// Twin of `ops::q8::quantize_activations`, bit for bit, written so it vectorizes: the
/// absolute maximum by comparison (wasm's `f32.max` differs from Rust's `f32::max` on NaN,
/// so `f32::max` is a library call there; a NaN is skipped by both forms) and rounding half
/// away from zero by truncation (`libm::roundf` is a library call too). Writes `q` and
/// returns the row's scale. On wasm32 with SIMD128 the same steps run four lanes at a time
/// (a decode step quantizes every product's input row; the scalar loop was one or two
/// percent of the demo model's decode under Node).
pub(crate) fn quantize_row(x: &[f32], q: &mut Vec<i8>) -> f32 {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    let (absmax, done) = simd128::absmax(x);
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    let (absmax, done) = (0.0f32, 0);
    let absmax = x[done..].iter().fold(absmax, |m, v| if v.abs() > m { v.abs() } else { m });
    let scale = absmax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    q.clear();
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    simd128::round_into(x, inv, q);
    let done = q.len();
    q.extend(x[done..].iter().map(|&v| {
        // Clamping first gives the same result as rounding first (127 rounds to itself)
        // and keeps the truncation in range; a NaN stays NaN and becomes 0, as in core.
        let y = (v * inv).clamp(-127.0, 127.0);
        let t = y as i32;
        // Exact: y and its truncation are within 1 of each other below 2^23.
        let frac = y - t as f32;
        (t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32) as i8
    }));
    scale
}

/// [`quantize_row`]'s two loops in SIMD128, each step the scalar form's operations lane by
/// lane, so the results are the same bits.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128 {
    use alloc::vec::Vec;
    use core::arch::wasm32::*;

    /// The largest `|x[i]|` over the first multiple of 4 elements (NaN skipped: `pmax(m, a)`
    /// is `m < a ? a : m`, the scalar fold's comparison), and how many elements it covered.
    pub(super) fn absmax(x: &[f32]) -> (f32, usize) {
        let chunks = x.chunks_exact(4);
        let done = x.len() - chunks.remainder().len();
        let mut m = f32x4_splat(0.0);
        for c in chunks {
            // SAFETY: `c` is four f32s; v128_load has no alignment requirement.
            let v = unsafe { v128_load(c.as_ptr().cast::<v128>()) };
            m = f32x4_pmax(m, f32x4_abs(v));
        }
        let lanes = [
            f32x4_extract_lane::<0>(m),
            f32x4_extract_lane::<1>(m),
            f32x4_extract_lane::<2>(m),
            f32x4_extract_lane::<3>(m),
        ];
        (lanes.iter().fold(0.0f32, |m, &v| if v > m { v } else { m }), done)
    }

    /// Appends the rounded values of the first multiple of 16 elements of `x` to `q`
    /// (empty on entry).
    pub(super) fn round_into(x: &[f32], inv: f32, q: &mut Vec<i8>) {
        let chunks = x.chunks_exact(16);
        q.reserve(x.len());
        let (inv, hi, lo) = (f32x4_splat(inv), f32x4_splat(127.0), f32x4_splat(-127.0));
        let (half, minus_half) = (f32x4_splat(0.5), f32x4_splat(-0.5));
        let round = |v: v128| {
            // pmin(y, 127) is `127 < y ? 127 : y` and pmax(y, -127) is `y < -127 ? -127 :
            // y`: a NaN passes through both, as through `clamp`.
            let y = f32x4_pmax(f32x4_pmin(f32x4_mul(v, inv), hi), lo);
            // Truncation saturates and sends NaN to 0, as `as i32` does.
            let t = i32x4_trunc_sat_f32x4(y);
            let frac = f32x4_sub(y, f32x4_convert_i32x4(t));
            // The comparisons are -1 where true: t + [frac >= 0.5] - [frac <= -0.5].
            i32x4_add(i32x4_sub(t, f32x4_ge(frac, half)), f32x4_le(frac, minus_half))
        };
        for c in chunks {
            let r = core::array::from_fn::<v128, 4, _>(|i| {
                // SAFETY: 4 * i + 4 <= 16 floats are in `c`.
                round(unsafe { v128_load(c.as_ptr().add(4 * i).cast::<v128>()) })
            });
            // Every value is within +-127: the saturating narrowings are exact.
            let bytes = i8x16_narrow_i16x8(i16x8_narrow_i32x4(r[0], r[1]), i16x8_narrow_i32x4(r[2], r[3]));
            let at = q.len();
            // SAFETY: `reserve` above made room for x.len() >= at + 16 bytes; the 16
            // written are then counted in the length.
            unsafe {
                v128_store(q.as_mut_ptr().add(at).cast::<v128>(), bytes);
                q.set_len(at + 16);
            }
        }
    }
}

/// An activation row rounded for an int8 weight: one block a row, int8 with one scale
/// ([`quantize_row`], core's `quantize_activations` to the bit); several blocks, 13-bit
/// values a scale a block (core's `quantize_activations_wide` itself).
pub(crate) struct Rounded {
    q: Vec<i8>,
    wide: Vec<i16>,
    scales: Vec<f32>,
    block: usize,
}

impl Rounded {
    pub(crate) fn of(x: &[f32], block: usize) -> Self {
        let block = block.clamp(1, x.len().max(1));
        if x.len().div_ceil(block) > 1 {
            let (wide, scales) = q8::quantize_activations_wide(x, block);
            return Rounded { q: Vec::new(), wide, scales, block };
        }
        let mut q = Vec::with_capacity(x.len());
        let scale = quantize_row(x, &mut q);
        Rounded { q, wide: Vec::new(), scales: vec![scale], block }
    }

    fn len(&self) -> usize {
        self.q.len().max(self.wide.len())
    }
}

/// Twin of `ops::q8::q8_matmul` (the spec already cut to its operands): each activation
/// row rounded once in the weight's blocks (bit-identical to core's quantizer), then exact
/// int8 dots, added up and scaled as core does, so the result is bit-identical to core's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn q8_matmul(
    out: &mut [f32], x: &[f32], packed: &[f32], scales: &[f32], m: usize, n: usize, k: usize, beta: f32,
) -> Result<()> {
    if q4::is_q4(n, k, packed.len(), scales.len()) {
        q4::check_q4_matmul(out.len(), x.len(), packed.len(), scales.len(), m, n, k)?;
        for i in 0..m {
            q4_row(&mut out[i * n..(i + 1) * n], &Wide4::of(&x[i * k..(i + 1) * k]), packed, scales, beta);
        }
        return Ok(());
    }
    let block = q8::check_q8_matmul(out.len(), x.len(), packed.len(), scales.len(), m, n, k)?;
    for i in 0..m {
        let q = Rounded::of(&x[i * k..(i + 1) * k], block);
        q8_row(&mut out[i * n..(i + 1) * n], &q, packed, scales, beta);
    }
    Ok(())
}

/// An activation row rounded for 4-bit weights: 13-bit values in blocks of 32 (core's
/// `quantize_activations_wide`), a scale and a sum a block.
struct Wide4 {
    wide: Vec<i16>,
    scales: Vec<f32>,
    sums: Vec<i32>,
}

impl Wide4 {
    fn of(x: &[f32]) -> Self {
        let (wide, scales) = q8::quantize_activations_wide(x, q4::Q4_BLOCK);
        let sums = wide.chunks(q4::Q4_BLOCK).map(|b| b.iter().map(|&v| v as i32).sum()).collect();
        Wide4 { wide, scales, sums }
    }
}

/// Twin of `ops::q4::q4_matmul` at one rounded activation row `q` against every row of a 4-bit
/// weight: `x` rounded to 13-bit values in blocks of 32 (core's quantizer), each 64-value
/// group's nibbles met with its activations by [`dot_nibbles_i16`] (wasm SIMD where built
/// with it), each block's scale and offset applied in block order as core does: the same
/// bits.
fn q4_row(out: &mut [f32], q: &Wide4, packed: &[f32], scales: &[f32], beta: f32) {
    let (wide, sx, sums) = (&q.wide, &q.scales, &q.sums);
    let k = wide.len();
    let (stride, rs) = (4 * q4::q4_packed_cols(k), q4::q4_row_scales(k));
    let bytes = as_u8(packed);
    for (j, o) in out.iter_mut().enumerate() {
        let (row, sc) = (&bytes[j * stride..(j + 1) * stride], &scales[j * rs..(j + 1) * rs]);
        let mut acc = 0.0f32;
        for (g, group) in row.chunks_exact(32).enumerate() {
            let xs = &wide[64 * g..k.min(64 * g + 64)];
            let (x0, x1) = xs.split_at(xs.len().min(32));
            let (s_low, s_high) = dot_nibbles_i16(group, x0, x1);
            for (b, s1) in [(2 * g, s_low), (2 * g + 1, s_high)] {
                if b < sx.len() {
                    acc += (s1 as f32 * sx[b]) * sc[2 + 2 * b];
                    acc -= (sums[b] as f32 * sx[b]) * sc[3 + 2 * b];
                }
            }
        }
        *o = if beta == 0.0 { acc } else { acc + beta * *o };
    }
}

/// One rounded activation row `q` against every weight row: per-row weights as
/// `out[j] = (q . w_j) * sx * scales[j]`, blocked ones as core's block-ordered sum of
/// 13-bit activations against int8 weights (`+ beta * out[j]`).
fn q8_row(out: &mut [f32], q: &Rounded, packed: &[f32], scales: &[f32], beta: f32) {
    let row_bytes = 4 * q8::packed_cols(q.len());
    let weights = as_i8(packed);
    let nb = q.scales.len();
    if nb > 1 {
        for (j, o) in out.iter_mut().enumerate() {
            let row = &weights[j * row_bytes..j * row_bytes + q.len()];
            let ws = &scales[j * nb..(j + 1) * nb];
            let mut acc = 0.0f32;
            for (b, (wb, xb)) in row.chunks(q.block).zip(q.wide.chunks(q.block)).enumerate() {
                acc += dot_i8_i16(wb, xb) as f32 * q.scales[b] * ws[b];
            }
            *o = if beta == 0.0 { acc } else { acc + beta * *o };
        }
        return;
    }
    let sx = q.scales.first().copied().unwrap_or(0.0);
    // The rows' integer sums, a block of output columns at a time (on the stack).
    let mut acc = [0i32; BLOCK];
    for (b, (out, scales)) in out.chunks_mut(BLOCK).zip(scales.chunks(BLOCK)).enumerate() {
        let acc = &mut acc[..out.len()];
        dot_row_block_i8(acc, &weights[b * BLOCK * row_bytes..], row_bytes, &q.q);
        // out[j] = acc * x_scale * w_scale (+ beta * out[j]), the branch on beta
        // outside the loop so the common case vectorizes.
        let values = out.iter_mut().zip(acc.iter()).zip(scales);
        if beta == 0.0 {
            values.for_each(|((o, &a), &w)| *o = a as f32 * sx * w);
        } else {
            values.for_each(|((o, &a), &w)| *o = a as f32 * sx * w + beta * *o);
        }
    }
}

/// Several int8 products of one activation row `x` (every spec `m = 1`, no window,
/// `k = x.len()`: the caller's condition): `x` rounded once for all of them (once per
/// block size among them), each product then as [`q8_matmul`] computes it, so the same
/// bits as one call each. At decode, attention's q, k and v round their shared input once
/// instead of three times.
pub(crate) fn q8_matmul_many(x: &[f32], products: &mut [Q8Product<'_, Vec<f32>>]) -> Result<()> {
    let four = |p: &Q8Product<'_, Vec<f32>>| q4::is_q4(p.spec.n, p.spec.k, p.packed.len(), p.scales.len());
    if !products.is_empty() && products.iter().all(four) {
        // 4-bit weights (attention's q, k and v at decode): `x` rounded once for all.
        let q = Wide4::of(x);
        for p in products.iter_mut() {
            let s = &p.spec;
            let (_, out) = q8::q8_operands(s, x, p.out)?;
            q4::check_q4_matmul(out.len(), x.len(), p.packed.len(), p.scales.len(), 1, s.n, s.k)?;
            q4_row(out, &q, p.packed, p.scales, s.beta);
        }
        return Ok(());
    }
    if products.iter().any(four) {
        // 4-bit beside int8 weights: each product rounds its own row (the same bits).
        for p in products.iter_mut() {
            let s = &p.spec;
            let (xs, out) = q8::q8_operands(s, x, p.out)?;
            q8_matmul(out, xs, p.packed, p.scales, s.m, s.n, s.k, s.beta)?;
        }
        return Ok(());
    }
    let mut blocks = Vec::with_capacity(products.len());
    for p in products.iter_mut() {
        let s = &p.spec;
        let (_, out) = q8::q8_operands(s, x, p.out)?;
        blocks.push(q8::check_q8_matmul(out.len(), x.len(), p.packed.len(), p.scales.len(), 1, s.n, s.k)?);
    }
    let mut q: Option<Rounded> = None;
    for (p, &block) in products.iter_mut().zip(&blocks) {
        if q.as_ref().is_none_or(|q| q.block != block) {
            q = Some(Rounded::of(x, block));
        }
        if let Some(q) = &q {
            q8_row(p.out, q, p.packed, p.scales, p.spec.beta);
        }
    }
    Ok(())
}

/// A SwiGLU's two int8 products of one activation row `x` and the gating (the caller's
/// condition as for [`q8_matmul_many`]): `x` rounded once, then `gate` and `up` as
/// [`q8_matmul`] computes them and `out` as [`swiglu_forward`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn q8_swiglu(
    out: &mut [f32], gate: &mut [f32], up: &mut [f32], x: &[f32], gate_w: (&[f32], &[f32]),
    up_w: (&[f32], &[f32]), spec: &MatmulSpec,
) -> Result<()> {
    let (n, k) = (spec.n, spec.k);
    let four = [gate_w, up_w].map(|w| q4::is_q4(n, k, w.0.len(), w.1.len()));
    if four == [true, true] && spec.m == 1 && spec.window.is_none() && k == x.len() {
        // Both 4-bit at one row (a decode step): `x` rounded once for both products.
        let q = Wide4::of(x);
        for (o, w) in [(&mut *gate, gate_w), (&mut *up, up_w)] {
            let (_, o) = q8::q8_operands(spec, x, o)?;
            q4::check_q4_matmul(o.len(), x.len(), w.0.len(), w.1.len(), 1, n, k)?;
            q4_row(o, &q, w.0, w.1, spec.beta);
        }
        return swiglu_forward(out, gate, up);
    }
    if four.contains(&true) {
        // 4-bit weights: the two products one by one, then the gating.
        for (o, w) in [(&mut *gate, gate_w), (&mut *up, up_w)] {
            let (xs, o) = q8::q8_operands(spec, x, o)?;
            q8_matmul(o, xs, w.0, w.1, spec.m, n, k, spec.beta)?;
        }
        return swiglu_forward(out, gate, up);
    }
    let (block_g, block_u) = {
        let (_, g) = q8::q8_operands(spec, x, gate)?;
        let bg = q8::check_q8_matmul(g.len(), x.len(), gate_w.0.len(), gate_w.1.len(), 1, n, k)?;
        let (_, u) = q8::q8_operands(spec, x, up)?;
        (bg, q8::check_q8_matmul(u.len(), x.len(), up_w.0.len(), up_w.1.len(), 1, n, k)?)
    };
    swiglu::check_swiglu_forward(out.len(), gate.len(), up.len())?;
    let q = Rounded::of(x, block_g);
    q8_row(gate, &q, gate_w.0, gate_w.1, spec.beta);
    let q = if block_u == block_g { q } else { Rounded::of(x, block_u) };
    q8_row(up, &q, up_w.0, up_w.1, spec.beta);
    swiglu_forward(out, gate, up)
}

/// Output columns of [`q8_matmul`] a block.
const BLOCK: usize = 256;

/// Twin of `ops::swiglu::swiglu_forward`: `out = silu(gate) * up` with core's form of the
/// sigmoid (exp of minus the magnitude, so nothing overflows) and the branch-free exp, so
/// the loop vectorizes.
pub(crate) fn swiglu_forward(out: &mut [f32], gate: &[f32], up: &[f32]) -> Result<()> {
    swiglu::check_swiglu_forward(out.len(), gate.len(), up.len())?;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let e = exp_f32(-g.abs());
        let s = if g >= 0.0 { 1.0 / (1.0 + e) } else { e / (1.0 + e) };
        *o = g * s * u;
    }
    Ok(())
}

/// Twin of `ops::attention::attention_forward`, in f32: the same scores, max, log-sum-exp
/// and weighted sum, with the scores' dot products on eight lanes (four keys a pass), the
/// weighted sum's outputs held in registers over every key, and one exp per score (core
/// takes a second, `exp(s - lse)`, for the weight; here it is `exp(s - max) / sum`, the
/// same number up to rounding).
pub(crate) fn attention_forward(
    out: &mut [f32], lse: &mut [f32], q: &[f32], k: &[f32], v: &[f32], spec: &AttentionSpec,
) -> Result<()> {
    spec.check_forward(out.len(), lse.len(), q.len(), k.len(), v.len())?;
    let d = spec.head_dim;
    let scale = 1.0 / libm::sqrtf(d as f32);
    let mut scores = vec![0.0f32; spec.kv_len];
    for b in 0..spec.batch {
        for t in 0..spec.q_len {
            for h in 0..spec.q_heads {
                let kvh = h / spec.group();
                let qi = spec.q_index(b, t, h);
                let qrow = &q[qi..qi + d];
                let n = spec.visible(t);
                // Key j of this head starts `stride` after key j - 1.
                let (base, stride) = (spec.kv_index(b, 0, kvh), spec.kv_heads * d);
                let key = |j: usize| &k[base + j * stride..][..d];
                let mut j = 0;
                while j + 4 <= n {
                    let dots = dot4_f32(qrow, [key(j), key(j + 1), key(j + 2), key(j + 3)]);
                    for (s, dot) in scores[j..j + 4].iter_mut().zip(dots) {
                        *s = scale * dot;
                    }
                    j += 4;
                }
                for (j, s) in scores[..n].iter_mut().enumerate().skip(j) {
                    *s = scale * dot_f32(qrow, key(j));
                }
                let max = max_f32(&scores[..n]);
                // The exps on their own (a loop that vectorizes), then their running sum.
                for s in &mut scores[..n] {
                    *s = exp_f32(*s - max);
                }
                let sum: f32 = scores[..n].iter().sum();
                lse[(b * spec.q_len + t) * spec.q_heads + h] = max + libm::logf(sum);
                let inv = 1.0 / sum;
                for s in &mut scores[..n] {
                    *s *= inv;
                }
                weighted_rows(&mut out[qi..qi + d], &scores[..n], v, base, stride);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusting_brain_core::Rng;

    /// Bit-identical to core's quantizer on random rows and on the values where rounding
    /// can go wrong: exact halves, the floats either side of them, values past the clamp,
    /// NaN, infinities, zeros of both signs and an all-zero row.
    #[test]
    fn quantize_row_is_cores_quantizer_bit_for_bit() {
        let mut rng = Rng::new(9);
        let mut rows: Vec<Vec<f32>> = (0..50).map(|i| rng.normal_vec(1 + 7 * i, 1.0 + i as f32)).collect();
        let mut tricky = Vec::new();
        for h in 0..127 {
            let half = h as f32 + 0.5;
            for v in [half, f32::from_bits(half.to_bits() - 1), f32::from_bits(half.to_bits() + 1)] {
                tricky.extend([v, -v]);
            }
        }
        // absmax 127 makes the scale 1, so each value above is its own rounding case.
        tricky.extend([127.0, -0.0, 0.0, 0.49999997, -0.49999997]);
        rows.push(tricky);
        rows.push(vec![0.0; 9]);
        rows.push(vec![1.0, f32::NAN, -3.0, 2.5]);
        rows.push(vec![1.0, f32::INFINITY, -3.0]);
        rows.push(vec![1e-40, -3e-39, 2e-45]);
        let mut q = Vec::new();
        for row in &rows {
            let (want, want_scale) = q8::quantize_activations(row);
            let scale = quantize_row(row, &mut q);
            assert_eq!(scale.to_bits(), want_scale.to_bits(), "scale of {row:?}");
            assert_eq!(q, want, "values of a row of {}", row.len());
        }
    }
}
