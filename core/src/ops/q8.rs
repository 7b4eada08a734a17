//! Int8 weights with one f32 scale per output row (absmax / 127), and the products that
//! read them. The product quantizes each activation row the same way (absmax / 127, so
//! a row is int8 with its own scale) and sums int8 x int8 in i32, exactly: every backend
//! gets the same integer, and the result `acc * x_scale * w_scale` is bit-identical
//! across backends — which is also what lets the CPU use VNNI's int8 dot products. Four int8 values are packed into each f32 slot of an ordinary buffer, in
//! memory order (`f32::from_ne_bytes`), so every backend stores them without a new buffer
//! type and a kernel can read the slot's bytes as `i8`s directly.

use alloc::vec::Vec;

use crate::error::{check_len, check_range, nonzero, product};
use crate::ops::matmul::MatmulSpec;
use crate::{CoreError, Real, Result};

/// f32 slots per packed row of `cols` int8 values.
pub fn packed_cols(cols: usize) -> usize {
    cols.div_ceil(4)
}

/// Rounds each row of `w` (rows x cols) to int8 with its own scale: returns the packed
/// values (rows x packed_cols(cols) slots; padding bytes are 0) and the scales (rows).
/// A row of zeros gets scale 0. Per value, |w - q * scale| <= scale / 2.
pub fn quantize_rows(w: &[f32], rows: usize, cols: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    const OP: &str = "quantize_rows";
    check_len(OP, "w", w.len(), product(OP, &[rows, cols])?)?;
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(CoreError::NonFinite {
            op: OP,
            value: w[i] as f64,
        });
    }
    let pc = packed_cols(cols);
    let mut packed = alloc::vec![0.0f32; rows * pc];
    let mut scales = alloc::vec![0.0f32; rows];
    for r in 0..rows {
        let row = &w[r * cols..(r + 1) * cols];
        let absmax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = absmax / 127.0;
        scales[r] = scale;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for s in 0..pc {
            let mut bytes = [0u8; 4];
            for (b, byte) in bytes.iter_mut().enumerate() {
                if let Some(&v) = row.get(4 * s + b) {
                    *byte = (libm::roundf(v * inv).clamp(-127.0, 127.0) as i8) as u8;
                }
            }
            packed[r * pc + s] = f32::from_ne_bytes(bytes);
        }
    }
    Ok((packed, scales))
}

/// The int8 value at column `c` of packed row `row`.
pub fn q8_at(row: &[f32], c: usize) -> i8 {
    row[c / 4].to_ne_bytes()[c % 4] as i8
}

/// Unpacks row `r` to f32: `q * scale`.
pub fn dequantize_row(packed: &[f32], scales: &[f32], r: usize, cols: usize) -> Vec<f32> {
    let pc = packed_cols(cols);
    let row = &packed[r * pc..(r + 1) * pc];
    (0..cols).map(|c| q8_at(row, c) as f32 * scales[r]).collect()
}

/// Checks a packed weight of `n` rows of `k` columns.
pub fn check_q8(op: &'static str, packed: usize, scales: usize, n: usize, k: usize) -> Result<()> {
    nonzero(op, "k", k)?;
    check_len(op, "packed weights", packed, product(op, &[n, packed_cols(k)])?)?;
    check_len(op, "scales", scales, n)
}

/// The contract of `q8_matmul`, shared by every backend (buffer lengths).
pub fn check_q8_matmul(
    out: usize,
    x: usize,
    packed: usize,
    scales: usize,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    const OP: &str = "q8_matmul";
    check_q8(OP, packed, scales, n, k)?;
    check_len(OP, "x", x, product(OP, &[m, k])?)?;
    check_len(OP, "out", out, product(OP, &[m, n])?)
}

/// The `MatmulSpec` form of `q8_matmul` on backends: `out = x W^T + beta * out`, so the
/// spec must say `trans_b` (W is stored `(n, k)` like a `Linear` weight), with no `trans_a`,
/// `alpha` 1 and one problem; a window may place `x` and `out` inside larger buffers (its `b`
/// offset must be 0: the weight is always whole). Returns the `x` and `out` operands.
pub fn q8_operands<'a>(
    spec: &MatmulSpec,
    x: &'a [f32],
    out: &'a mut [f32],
) -> Result<(&'a [f32], &'a mut [f32])> {
    const OP: &str = "q8_matmul";
    if !spec.trans_b || spec.trans_a || spec.alpha != 1.0 || spec.batch != 1 {
        return Err(CoreError::InvalidArgument {
            op: OP,
            message: alloc::format!(
                "the int8 product is out = x W^T + beta * out (trans_b, alpha 1, one problem); got {spec:?}"
            ),
        });
    }
    let (m, n, k) = (spec.m, spec.n, spec.k);
    match spec.window {
        None => Ok((x, out)),
        Some(w) => {
            if w.b != 0 {
                return Err(CoreError::InvalidArgument {
                    op: OP,
                    message: "the int8 weight cannot be windowed (window b must be 0)".into(),
                });
            }
            let (lx, lo) = (product(OP, &[m, k])?, product(OP, &[m, n])?);
            check_range(OP, "x", x.len(), w.a, lx)?;
            check_range(OP, "out", out.len(), w.c, lo)?;
            Ok((&x[w.a..w.a + lx], &mut out[w.c..w.c + lo]))
        }
    }
}

/// An activation row rounded to int8: the values and the row's scale (absmax / 127).
pub fn quantize_activations(x: &[f32]) -> (Vec<i8>, f32) {
    let absmax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = absmax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    (
        x.iter()
            .map(|&v| libm::roundf(v * inv).clamp(-127.0, 127.0) as i8)
            .collect(),
        scale,
    )
}

/// `out (m x n) = x (m x k) W^T + beta * out`, W the (n x k) int8 weight: the `Linear`
/// product at one byte per weight. Each row of `x` is quantized to int8 first (see the
/// module docs); the i32 sum is exact, then scaled by `x_scale * w_scale`.
#[allow(clippy::too_many_arguments)]
pub fn q8_matmul(
    out: &mut [f32],
    x: &[f32],
    packed: &[f32],
    scales: &[f32],
    m: usize,
    n: usize,
    k: usize,
    beta: f32,
) -> Result<()> {
    check_q8_matmul(out.len(), x.len(), packed.len(), scales.len(), m, n, k)?;
    let pc = packed_cols(k);
    // The activations split by byte lane (xt[t][s] = x[4s + t], zero past k): a packed
    // word's byte t meets xt[t][s], so the inner loop is the same shifts on every word, a
    // loop the compiler vectorizes (SIMD128 in the browser's CPU path). The sum is the
    // same exact integer in any order.
    let mut xt = [
        alloc::vec![0i16; pc],
        alloc::vec![0i16; pc],
        alloc::vec![0i16; pc],
        alloc::vec![0i16; pc],
    ];
    for i in 0..m {
        let (q, sx) = quantize_activations(&x[i * k..(i + 1) * k]);
        for (c, &v) in q.iter().enumerate() {
            xt[c % 4][c / 4] = v as i16;
        }
        for j in 0..n {
            let row = &packed[j * pc..(j + 1) * pc];
            let mut acc = 0i32;
            let lanes = xt[0].iter().zip(&xt[1]).zip(&xt[2]).zip(&xt[3]);
            for (word, (((x0, x1), x2), x3)) in row.iter().zip(lanes) {
                // Byte t of the word is bits 8t.. on a little-endian machine (to_ne_bytes).
                let bits = word.to_bits();
                let w = if cfg!(target_endian = "big") {
                    bits.swap_bytes()
                } else {
                    bits
                } as i32;
                let b = |shift: u32| ((w << shift) >> 24) as i16 as i32;
                acc += b(24) * *x0 as i32 + b(16) * *x1 as i32 + b(8) * *x2 as i32 + b(0) * *x3 as i32;
            }
            let v = acc as f32 * sx * scales[j];
            out[i * n + j] = if beta == 0.0 { v } else { v + beta * out[i * n + j] };
        }
    }
    Ok(())
}

/// Embedding lookup from an int8 table (vocab x dim): `out[r] = dequantize(table[ids[r]])`.
pub fn q8_embedding<T: Real>(
    out: &mut [T],
    packed: &[f32],
    scales: &[f32],
    ids: &[u32],
    vocab: usize,
    dim: usize,
) -> Result<()> {
    const OP: &str = "q8_embedding";
    check_q8(OP, packed.len(), scales.len(), vocab, dim)?;
    check_len(OP, "out", out.len(), product(OP, &[ids.len(), dim])?)?;
    crate::ops::embedding::check_ids(OP, ids, vocab)?;
    let pc = packed_cols(dim);
    for (r, &id) in ids.iter().enumerate() {
        let row = &packed[id as usize * pc..(id as usize + 1) * pc];
        for c in 0..dim {
            out[r * dim + c] = T::from_f32(q8_at(row, c) as f32 * scales[id as usize]);
        }
    }
    Ok(())
}
