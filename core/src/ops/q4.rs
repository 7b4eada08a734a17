//! Four-bit weights: blocks of [`Q4_BLOCK`] values along each row, each value an unsigned
//! 4-bit integer `q` standing for `d q - m`, the block's scale `d` and offset `m` both
//! 6-bit codes of two scales the row shares (`d = row_d * code_d`, `m = row_m * code_m`):
//! llama.cpp's Q4_K with the whole row as its super-block, so a row of any length fits
//! (SmolLM2's 576 is not a multiple of Q4_K's 256, which is why llama.cpp's Q4_K_M falls
//! back to Q5_0 on most of that model's matrices; a short last block is padded). Each
//! block's scale and offset come from llama.cpp's weighted least-squares search
//! (`make_qkx2_quants`: importance `sqrt(mean x^2) + |x|`, twenty trial scales), then the
//! row's codes, then the values again against the coded scales.
//!
//! Why this format (measured on SmolLM2-135M-Instruct over the Rust book, every block
//! matrix at 4 bits, the tied embedding int8, weights alone rounded): mean KL to f32
//! 0.0148 nats, against 0.239 for Q4_0's symmetric blocks with one f16 scale (llama.cpp's
//! Q4_0 measures 0.238 on the same text), at 4.4 bits a weight against Q4_0's 4.5. The
//! embedding at 4 bits too moves KL to 0.065, so models keep their embedding and head
//! int8 (llama.cpp's 4-bit files of this model keep `token_embd` at Q8_0 as well).
//!
//! In memory a row's scales are `[row_d, row_m, d_0, m_0, d_1, m_1, ...]` (`2 + 2 nb`
//! floats; `d_b` and `m_b` are the products above, computed once, so a kernel reads them
//! directly and a writer recovers the codes exactly), and its values are packed as Q4_K
//! packs them: each 64 values are 32 bytes, byte `l` holding value `l` in its low nibble
//! and value `32 + l` in its high one (a short last group leaves the rest zero). A
//! product rounds each activation row in the same blocks to 13-bit integers
//! ([`quantize_activations_wide`]), takes per block the exact i32 sums `s1 = sum(x q)`
//! and `s2 = sum(x)`, and adds the blocks up in order,
//! `acc = acc + (s1 as f32 * x_scale) * d; acc = acc - (s2 as f32 * x_scale) * m`: every
//! step unfused, so every backend gets the same bits. `s1` stays under 2^24 (32 x 4095 x
//! 15), exact in an f32.
//!
//! The layouts tell themselves apart by length: a 4-bit weight's packed row is
//! `8 * k.div_ceil(64)` slots and its scales `2 + 2 nb` a row, which no int8 layout has
//! for the same shape ([`crate::ops::q8::quant_layout`]).

use alloc::vec::Vec;

use crate::error::{check_len, nonzero, product};
use crate::ops::q8::{blocks_of, quantize_activations_wide};
use crate::{CoreError, Real, Result};

/// Values per block (a scale and an offset each).
pub const Q4_BLOCK: usize = 32;

/// The largest 6-bit code of a block's scale or offset.
const CODE_MAX: f32 = 63.0;

/// f32 slots per packed row of `cols` 4-bit values: 32 bytes (8 slots) per 64 values.
pub fn q4_packed_cols(cols: usize) -> usize {
    8 * cols.div_ceil(64)
}

/// Scales per row of `cols` values: the row's two, then a scale and an offset a block.
pub fn q4_row_scales(cols: usize) -> usize {
    2 + 2 * blocks_of(cols, Q4_BLOCK)
}

/// Whether a weight of `n` rows of `k` with these buffer lengths is laid out as 4 bits.
pub fn is_q4(n: usize, k: usize, packed: usize, scales: usize) -> bool {
    k > 0
        && n.checked_mul(q4_packed_cols(k)) == Some(packed)
        && n.checked_mul(q4_row_scales(k)) == Some(scales)
}

/// Bytes of a `(rows, cols)` matrix held at 4 bits in memory: half a byte a value and
/// the f32 scales.
pub fn q4_bytes(rows: usize, cols: usize) -> usize {
    4 * rows * (q4_packed_cols(cols) + q4_row_scales(cols))
}

/// The 4-bit value at column `c` of packed row `row`.
pub fn q4_at(row: &[f32], c: usize) -> u8 {
    let byte = c / 64 * 32 + c % 32;
    let b = row[byte / 4].to_ne_bytes()[byte % 4];
    if c % 64 < 32 {
        b & 15
    } else {
        b >> 4
    }
}

/// llama.cpp's `nearest_int`: round half to even.
fn nearest(v: f32) -> f32 {
    libm::rintf(v)
}

/// One block's scale and offset (`x ~ scale * q - offset`, q in 0..=15) by llama.cpp's
/// `make_qkx2_quants` (weighted squared error, importance `sqrt(mean x^2) + |x|`, the
/// min/max scale and twenty trial scales around it); the offset is never negative (the
/// block's minimum is taken at or below zero). One difference from llama.cpp's: every trial
/// levels the values from the block's own minimum, where llama.cpp's levels them from the
/// best offset found so far (the GGUF writer's Q4_K encoder, which must give llama.cpp's
/// bytes, does that; this format's measured quality is this search's).
fn block_scale(x: &[f32]) -> (f32, f32) {
    let n = x.len() as f32;
    let av = libm::sqrtf(x.iter().map(|v| v * v).sum::<f32>() / n);
    let w = |v: f32| av + v.abs();
    let mut min = x.iter().fold(f32::INFINITY, |a, &v| a.min(v)).min(0.0);
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    if max <= min {
        return (0.0, 0.0 - min);
    }
    let (sum_w, sum_x) = x.iter().fold((0.0f32, 0.0f32), |(a, b), &v| (a + w(v), b + w(v) * v));
    // The weighted squared error of scale `s` and offset `m` at the levels `iscale` picks.
    let first_min = min;
    let err = |s: f32, m: f32, iscale: f32| -> f32 {
        x.iter()
            .map(|&v| {
                let d = s * nearest(iscale * (v - first_min)).clamp(0.0, 15.0) + m - v;
                w(v) * d * d
            })
            .sum()
    };
    let iscale = 15.0 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = err(scale, min, iscale);
    for step in 0..=20 {
        let iscale = (-1.0 + 0.1 * step as f32 + 15.0) / (max - first_min);
        let lv = |v: f32| nearest(iscale * (v - first_min)).clamp(0.0, 15.0);
        let (mut sl, mut sl2, mut sxl) = (0.0f32, 0.0f32, 0.0f32);
        for &v in x {
            let (l, wv) = (lv(v), w(v));
            sl += wv * l;
            sl2 += wv * l * l;
            sxl += wv * l * v;
        }
        let det = sum_w * sl2 - sl * sl;
        if det > 0.0 {
            let mut s = (sum_w * sxl - sum_x * sl) / det;
            let mut m = (sl2 * sum_x - sl * sxl) / det;
            if m > 0.0 {
                m = 0.0;
                s = sxl / sl2;
            }
            let e = err(s, m, iscale);
            if e < best {
                best = e;
                scale = s;
                min = m;
            }
        }
    }
    // `0 - min`, not `-min`: an all-zero block gets offset +0, which a file round-trips.
    (scale.max(0.0), 0.0 - min)
}

/// Rounds `w` (rows x cols) to 4 bits (see the module docs): the packed values (rows x
/// [`q4_packed_cols`] slots) and the scales (rows x [`q4_row_scales`]). A non-finite value
/// is refused.
pub fn quantize_q4(w: &[f32], rows: usize, cols: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    const OP: &str = "quantize";
    check_len(OP, "w", w.len(), product(OP, &[rows, cols])?)?;
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(CoreError::NonFinite { op: OP, value: w[i] as f64 });
    }
    let (pc, rs) = (q4_packed_cols(cols), q4_row_scales(cols));
    let mut packed = alloc::vec![0.0f32; rows * pc];
    let mut scales = alloc::vec![0.0f32; rows * rs];
    for r in 0..rows {
        let row = &w[r * cols..(r + 1) * cols];
        let found: Vec<(f32, f32)> = row.chunks(Q4_BLOCK).map(block_scale).collect();
        let max_d = found.iter().fold(0.0f32, |a, b| a.max(b.0));
        let max_m = found.iter().fold(0.0f32, |a, b| a.max(b.1));
        let code =
            |v: f32, max: f32| if max > 0.0 { nearest(CODE_MAX / max * v).clamp(0.0, CODE_MAX) } else { 0.0 };
        let (row_d, row_m) = (max_d / CODE_MAX, max_m / CODE_MAX);
        let sc = &mut scales[r * rs..(r + 1) * rs];
        sc[0] = row_d;
        sc[1] = row_m;
        let mut bytes = alloc::vec![0u8; pc * 4];
        for (b, (chunk, &(d0, m0))) in row.chunks(Q4_BLOCK).zip(&found).enumerate() {
            let (d, m) = (row_d * code(d0, max_d), row_m * code(m0, max_m));
            sc[2 + 2 * b] = d;
            sc[3 + 2 * b] = m;
            for (t, &v) in chunk.iter().enumerate() {
                let q = if d > 0.0 { nearest((v + m) / d).clamp(0.0, 15.0) as u8 } else { 0 };
                let c = b * Q4_BLOCK + t;
                let byte = c / 64 * 32 + c % 32;
                bytes[byte] |= if c % 64 < 32 { q } else { q << 4 };
            }
        }
        for (slot, four) in packed[r * pc..(r + 1) * pc].iter_mut().zip(bytes.chunks_exact(4)) {
            *slot = f32::from_ne_bytes([four[0], four[1], four[2], four[3]]);
        }
    }
    Ok((packed, scales))
}

/// A 4-bit weight's scales as a file keeps them: each row's two scales (`rows x 2`) and
/// its blocks' 6-bit codes (`rows x nb x 2`: scale code, offset code). Exact: every
/// block's scale is its row's times a whole code.
pub fn q4_codes(scales: &[f32], rows: usize, cols: usize) -> Result<(Vec<f32>, Vec<u8>)> {
    let rs = q4_row_scales(cols);
    check_len("q4_codes", "scales", scales.len(), product("q4_codes", &[rows, rs])?)?;
    let (mut row, mut codes) = (Vec::with_capacity(2 * rows), Vec::with_capacity(rows * (rs - 2)));
    for sc in scales.chunks_exact(rs) {
        row.extend_from_slice(&sc[..2]);
        for pair in sc[2..].chunks_exact(2) {
            for (v, base) in pair.iter().zip(&sc[..2]) {
                codes.push(if *base > 0.0 { nearest(v / base).clamp(0.0, CODE_MAX) as u8 } else { 0 });
            }
        }
    }
    Ok((row, codes))
}

/// The in-memory scales of a 4-bit weight from a file's row scales and codes
/// ([`q4_codes`]' inverse): every code at most 63 and every row scale finite and not
/// negative, else an error naming what is wrong.
pub fn q4_scales_from_codes(row: &[f32], codes: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>> {
    const OP: &str = "4-bit scales";
    let nb = blocks_of(cols, Q4_BLOCK);
    check_len(OP, "row scales", row.len(), product(OP, &[rows, 2])?)?;
    check_len(OP, "codes", codes.len(), product(OP, &[rows, nb, 2])?)?;
    if let Some(v) = row.iter().find(|v| !v.is_finite() || **v < 0.0) {
        return Err(CoreError::InvalidArgument {
            op: OP,
            message: alloc::format!("a row scale is {v}; they are finite and not negative"),
        });
    }
    if let Some(c) = codes.iter().find(|&&c| c as f32 > CODE_MAX) {
        return Err(CoreError::InvalidArgument {
            op: OP,
            message: alloc::format!("a code is {c}; they are 0..=63"),
        });
    }
    let mut out = Vec::with_capacity(rows * q4_row_scales(cols));
    for (base, c) in row.chunks_exact(2).zip(codes.chunks_exact(2 * nb)) {
        out.extend_from_slice(base);
        for pair in c.chunks_exact(2) {
            out.push(base[0] * pair[0] as f32);
            out.push(base[1] * pair[1] as f32);
        }
    }
    Ok(out)
}

/// Checks a 4-bit weight of `n` rows of `k` columns.
pub fn check_q4(op: &'static str, packed: usize, scales: usize, n: usize, k: usize) -> Result<()> {
    nonzero(op, "k", k)?;
    check_len(op, "packed 4-bit weights", packed, product(op, &[n, q4_packed_cols(k)])?)?;
    check_len(op, "4-bit scales", scales, product(op, &[n, q4_row_scales(k)])?)
}

/// The contract of a 4-bit `q8_matmul`, shared by every backend (buffer lengths).
pub fn check_q4_matmul(
    out: usize, x: usize, packed: usize, scales: usize, m: usize, n: usize, k: usize,
) -> Result<()> {
    const OP: &str = "q8_matmul";
    check_q4(OP, packed, scales, n, k)?;
    check_len(OP, "x", x, product(OP, &[m, k])?)?;
    check_len(OP, "out", out, product(OP, &[m, n])?)
}

/// `out (m x n) = x (m x k) W^T + beta * out`, W the (n x k) 4-bit weight: each row of `x`
/// rounded in blocks of [`Q4_BLOCK`] ([`quantize_activations_wide`]), each block's `s1`
/// and `s2` exact, the blocks added in order (see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn q4_matmul(
    out: &mut [f32], x: &[f32], packed: &[f32], scales: &[f32], m: usize, n: usize, k: usize, beta: f32,
) -> Result<()> {
    check_q4_matmul(out.len(), x.len(), packed.len(), scales.len(), m, n, k)?;
    let (pc, rs) = (q4_packed_cols(k), q4_row_scales(k));
    for i in 0..m {
        let (xq, sx) = quantize_activations_wide(&x[i * k..(i + 1) * k], Q4_BLOCK);
        for j in 0..n {
            let (row, sc) = (&packed[j * pc..(j + 1) * pc], &scales[j * rs..(j + 1) * rs]);
            let mut acc = 0.0f32;
            for (b, (xb, &s)) in xq.chunks(Q4_BLOCK).zip(&sx).enumerate() {
                let (mut s1, mut s2) = (0i32, 0i32);
                for (t, &v) in xb.iter().enumerate() {
                    s1 += v as i32 * q4_at(row, b * Q4_BLOCK + t) as i32;
                    s2 += v as i32;
                }
                acc += (s1 as f32 * s) * sc[2 + 2 * b];
                acc -= (s2 as f32 * s) * sc[3 + 2 * b];
            }
            out[i * n + j] = if beta == 0.0 { acc } else { acc + beta * out[i * n + j] };
        }
    }
    Ok(())
}

/// Row `r` of a 4-bit weight of `cols` columns as f32: `d q - m`.
pub fn q4_dequantize_row(packed: &[f32], scales: &[f32], r: usize, cols: usize) -> Vec<f32> {
    let (pc, rs) = (q4_packed_cols(cols), q4_row_scales(cols));
    let (row, sc) = (&packed[r * pc..(r + 1) * pc], &scales[r * rs..(r + 1) * rs]);
    (0..cols)
        .map(|c| {
            let b = c / Q4_BLOCK;
            sc[2 + 2 * b] * q4_at(row, c) as f32 - sc[3 + 2 * b]
        })
        .collect()
}

/// Embedding lookup from a 4-bit table (vocab x dim): `out[r] = dequantize(table[ids[r]])`.
pub fn q4_embedding<T: Real>(
    out: &mut [T], packed: &[f32], scales: &[f32], ids: &[u32], vocab: usize, dim: usize,
) -> Result<()> {
    const OP: &str = "q8_embedding";
    check_q4(OP, packed.len(), scales.len(), vocab, dim)?;
    check_len(OP, "out", out.len(), product(OP, &[ids.len(), dim])?)?;
    crate::ops::embedding::check_ids(OP, ids, vocab)?;
    for (r, &id) in ids.iter().enumerate() {
        let row = q4_dequantize_row(packed, scales, id as usize, dim);
        for (o, v) in out[r * dim..(r + 1) * dim].iter_mut().zip(row) {
            *o = T::from_f32(v);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value within half its block's step of the original, plus what coding the
    /// block's scale and offset in sixths of the row's can cost (a scale half a code short
    /// leaves 15 x half a code uncovered); the whole near 4-bit rounding's error; the codes
    /// recovered exactly.
    #[test]
    fn rounds_within_a_step_and_round_trips_its_codes() {
        let mut rng = crate::Rng::new(4);
        for (rows, cols) in [(1, 1), (3, 31), (2, 32), (4, 33), (2, 64), (3, 100), (2, 576)] {
            let mut w = rng.normal_vec(rows * cols, 1.0);
            if cols > 3 {
                w[1] = 9.0; // an outlier
                w[cols..cols + cols.min(32)].fill(0.0); // a zero block
            }
            let (p, s) = quantize_q4(&w, rows, cols).unwrap();
            assert!(is_q4(rows, cols, p.len(), s.len()));
            let rs = q4_row_scales(cols);
            let (mut err2, mut norm2) = (0.0f64, 0.0f64);
            for r in 0..rows {
                let deq = q4_dequantize_row(&p, &s, r, cols);
                let (row_d, row_m) = (s[r * rs], s[r * rs + 1]);
                for (c, (a, b)) in deq.iter().zip(&w[r * cols..]).enumerate() {
                    let d = s[r * rs + 2 + 2 * (c / Q4_BLOCK)];
                    let bound = 0.5 * d + 7.5 * row_d + 0.5 * row_m;
                    assert!((a - b).abs() <= bound * 1.001 + 1e-6, "{rows}x{cols} ({r}, {c}): {a} vs {b}");
                    err2 += ((a - b) as f64).powi(2);
                    norm2 += (*b as f64).powi(2);
                }
            }
            // Gaussian values at 4 bits: about 10% relative error (RMS).
            assert!(
                err2 <= 0.15f64.powi(2) * norm2,
                "{rows}x{cols}: relative error {}",
                (err2 / norm2).sqrt()
            );
            let (row, codes) = q4_codes(&s, rows, cols).unwrap();
            let back = q4_scales_from_codes(&row, &codes, rows, cols).unwrap();
            assert_eq!(
                back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                s.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        assert!(quantize_q4(&[1.0, f32::NAN], 1, 2).is_err());
        assert!(q4_scales_from_codes(&[1.0, 1.0], &[64, 0], 1, 2).is_err());
        assert!(q4_scales_from_codes(&[f32::NAN, 1.0], &[1, 0], 1, 2).is_err());
    }
}
