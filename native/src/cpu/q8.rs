//! Int8 products on the CPU: each activation row is rounded to int8 (its own scale), then
//! int8 x int8 dot products in i32 — AVX-512 VNNI `vpdpbusd` where the CPU has it, widening
//! SIMD loops elsewhere — exactly the integers the reference computes. The weights cross
//! the memory bus at one byte each, which is what decoding is bound by.
//! Twin of `rusting_brain_core::ops::q8`.

use rayon::prelude::*;
use rusting_brain_core::error::{check_len, product};
use rusting_brain_core::ops::embedding::check_ids;
use rusting_brain_core::ops::q8::{check_q8, check_q8_matmul, packed_cols, quantize_activations};
use rusting_brain_core::Result;

use super::simd;

/// The int8 values packed in `x` (four per slot, memory order).
fn as_i8(x: &[f32]) -> &[i8] {
    // SAFETY: `i8` has alignment 1 and every bit pattern is a valid `i8`; the new slice
    // covers exactly the `4 * x.len()` bytes of `x` and borrows it for the same lifetime.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const i8, x.len() * 4) }
}

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
    let w = as_i8(packed);
    let row = |j: usize| &w[j * pc * 4..j * pc * 4 + k];
    let store = |o: &mut f32, acc: i32, sx: f32, j: usize| {
        let v = acc as f32 * sx * scales[j];
        *o = if beta == 0.0 { v } else { v + beta * *o };
    };
    if m == 1 {
        // Decode: one task per block of 64 outputs, each streaming its weight rows once;
        // one thread when the matrix is small (see matmul::PARALLEL_GEMV).
        let (xq, sx) = quantize_activations(x);
        let work = |(c, o): (usize, &mut [f32])| {
            for (u, y) in o.iter_mut().enumerate() {
                let j = c * 64 + u;
                store(y, simd::dot_i8(&xq, row(j)), sx, j);
            }
        };
        if n * k >= super::matmul::PARALLEL_GEMV {
            out.par_chunks_mut(64).enumerate().for_each(work);
        } else {
            out.chunks_mut(64).enumerate().for_each(work);
        }
    } else {
        out.par_chunks_mut(n).zip(x.par_chunks(k)).for_each(|(o, xi)| {
            let (xq, sx) = quantize_activations(xi);
            for (j, y) in o.iter_mut().enumerate() {
                store(y, simd::dot_i8(&xq, row(j)), sx, j);
            }
        });
    }
    Ok(())
}

pub fn q8_embedding(
    out: &mut [f32],
    packed: &[f32],
    scales: &[f32],
    ids: &[u32],
    vocab: usize,
    dim: usize,
) -> Result<()> {
    const OP: &str = "q8_embedding";
    check_q8(OP, packed.len(), scales.len(), vocab, dim)?;
    check_len(OP, "out", out.len(), product(OP, &[ids.len(), dim])?)?;
    check_ids(OP, ids, vocab)?;
    let pc = packed_cols(dim);
    let w = as_i8(packed);
    out.par_chunks_mut(dim).zip(ids.par_iter()).for_each(|(o, &id)| {
        let id = id as usize;
        let q = &w[id * pc * 4..id * pc * 4 + dim];
        for (v, &b) in o.iter_mut().zip(q) {
            *v = b as f32 * scales[id];
        }
    });
    Ok(())
}
