//! Int8 products on the CPU: each activation row is rounded to int8 (its own scale), then
//! int8 x int8 dot products in i32 — AVX-512 VNNI `vpdpbusd` where the CPU has it, widening
//! SIMD loops elsewhere — exactly the integers the reference computes. The weights cross
//! the memory bus at one byte each, which is what decoding is bound by.
//! Twin of `rusting_brain_core::ops::q8`.

use rayon::prelude::*;
use rusting_brain_core::error::{check_len, product};
use rusting_brain_core::ops::embedding::check_ids;
use rusting_brain_core::ops::q8::{check_q8, check_q8_matmul, packed_cols};
use rusting_brain_core::Result;

use super::{simd, team};

/// int8 weights below which a decode product stays on the calling thread: handing half of
/// a 32 KiB matrix to the other core costs about what reading it does.
const TEAM_MIN_BYTES: usize = 1 << 15;

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
    // Outputs `first..first + o.len()` of one activation row: four weight rows a call.
    let outputs = |o: &mut [f32], first: usize, xq: &[i8], xsum: i32, sx: f32| {
        let done = o.len() / 4 * 4;
        let mut quads = o.chunks_exact_mut(4);
        for (q, y4) in quads.by_ref().enumerate() {
            let j = first + 4 * q;
            let acc = simd::dot4_i8(xq, xsum, [row(j), row(j + 1), row(j + 2), row(j + 3)]);
            for (u, (y, a)) in y4.iter_mut().zip(acc).enumerate() {
                store(y, a, sx, j + u);
            }
        }
        for (u, y) in quads.into_remainder().iter_mut().enumerate() {
            let j = first + done + u;
            store(y, simd::dot_i8(xq, row(j)), sx, j);
        }
    };
    if m == 1 {
        // Decode: each part of the team (both cores here) streams a contiguous block of
        // weight rows once; small matrices stay on the calling thread.
        let (xq, sx) = simd::quantize_i8(x);
        let xsum: i32 = xq.iter().map(|&v| v as i32).sum();
        let parts = team::parts();
        if parts > 1 && n * k >= TEAM_MIN_BYTES && n >= 8 * parts {
            let per = n.div_ceil(parts).div_ceil(4) * 4;
            team::run_blocks(out.chunks_mut(per).collect(), |p, o| {
                outputs(o, p * per, &xq, xsum, sx)
            });
        } else {
            outputs(out, 0, &xq, xsum, sx);
        }
    } else {
        out.par_chunks_mut(n).zip(x.par_chunks(k)).for_each(|(o, xi)| {
            let (xq, sx) = simd::quantize_i8(xi);
            let xsum: i32 = xq.iter().map(|&v| v as i32).sum();
            outputs(o, 0, &xq, xsum, sx);
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
