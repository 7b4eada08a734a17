//! Products on 4-bit weights on the CPU (core's `ops::q4`): each activation row rounded
//! to 13-bit integers in blocks of 32, then the 4-bit products of `simd::q4_rows` (VNNI
//! where the CPU has it), exactly the integers and float steps the reference takes.
//! Decode splits the weight rows over the team; prompts split the activation rows into
//! bands, each running sixteen weight rows at a time past its rows so the weights (half a
//! byte a value) stay in L1.

use rayon::prelude::*;
use rusting_brain_core::error::{check_len, product};
use rusting_brain_core::ops::q4::{check_q4, check_q4_matmul, q4_packed_cols, q4_row_scales, Q4_BLOCK};
use rusting_brain_core::Result;

use super::q8::TEAM_MIN_BYTES;
use super::{simd, team};

/// The bytes packed in `x` (four per slot, memory order).
pub(super) fn as_u8(x: &[f32]) -> &[u8] {
    // SAFETY: `u8` has alignment 1 and every bit pattern is a valid `u8`; the new slice
    // covers exactly the `4 * x.len()` bytes of `x` and borrows it for the same lifetime.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, x.len() * 4) }
}

/// `out (m x n) = x (m x k) W^T + beta * out`, W the (n x k) 4-bit weight.
#[allow(clippy::too_many_arguments)]
pub fn q4_matmul(
    out: &mut [f32], x: &[f32], packed: &[f32], scales: &[f32], m: usize, n: usize, k: usize, beta: f32,
) -> Result<()> {
    check_q4_matmul(out.len(), x.len(), packed.len(), scales.len(), m, n, k)?;
    let (stride, rs) = (4 * q4_packed_cols(k), q4_row_scales(k));
    let w = as_u8(packed);
    if m == 1 {
        let mut xq = simd::QuantRow::default();
        xq.fill_wide(x, Q4_BLOCK);
        let act = xq.row();
        let rows = |o: &mut [f32], first: usize| {
            simd::q4_rows(o, &act, &w[first * stride..], stride, &scales[first * rs..], beta)
        };
        let parts = team::parts();
        if parts > 1 && n * k / 2 >= TEAM_MIN_BYTES && n >= 16 * parts {
            let per = n.div_ceil(parts).div_ceil(16) * 16;
            team::run_blocks(out.chunks_mut(per), |p, o| rows(o, p * per));
        } else {
            rows(out, 0);
        }
        return Ok(());
    }
    // A prompt: each band of activation rows rounded once, then sixteen weight rows at a
    // time (a few KiB, in L1) against every row of the band.
    let band = |o: &mut [f32], first: usize| {
        let rows = o.len() / n;
        let acts: Vec<simd::QuantRow> = x[first * k..(first + rows) * k]
            .chunks_exact(k)
            .map(|xi| {
                let mut q = simd::QuantRow::default();
                q.fill_wide(xi, Q4_BLOCK);
                q
            })
            .collect();
        let rounded = acts;
        let acts: Vec<simd::Int8Row<'_>> = rounded.iter().map(|q| q.row()).collect();
        // Sixteen weight rows unpacked and laid across the vector lanes once a band
        // (VNNI): each activation row meets them with broadcast pairs, as the int8 GEMM's
        // panels do. The rest (and CPUs without VNNI) run the decode kernel row by row.
        let mut done = 0;
        if rows >= super::q8::PANEL_MIN_ROWS && simd::has_vnni() {
            let nb = k.div_ceil(Q4_BLOCK);
            let padded: Vec<Vec<i16>> = rounded
                .iter()
                .map(|q| {
                    let mut p = q.wide.clone();
                    p.resize(nb * Q4_BLOCK, 0);
                    p
                })
                .collect();
            let padded: Vec<&[i16]> = padded.iter().map(|p| p.as_slice()).collect();
            let mut panel = simd::Panel16::default();
            for j in (0..n / 16).map(|p| 16 * p) {
                panel.fill_q4(&w[j * stride..], stride, k, &scales[j * rs..(j + 16) * rs]);
                simd::panel16_rows(&mut o[j..], n, &acts, &padded, &panel, beta);
            }
            done = n / 16 * 16;
        }
        for j in (done..n).step_by(16) {
            let end = (j + 16).min(n);
            for (i, a) in acts.iter().enumerate() {
                simd::q4_rows(
                    &mut o[i * n + j..i * n + end],
                    a,
                    &w[j * stride..],
                    stride,
                    &scales[j * rs..],
                    beta,
                );
            }
        }
    };
    super::q8::run_bands(out, (m, n, k / 2), band);
    Ok(())
}

/// Rows of a 4-bit table, dequantized (core's `q4_embedding`, rows in parallel).
pub fn q4_embedding(
    out: &mut [f32], packed: &[f32], scales: &[f32], ids: &[u32], vocab: usize, dim: usize,
) -> Result<()> {
    const OP: &str = "q8_embedding";
    check_q4(OP, packed.len(), scales.len(), vocab, dim)?;
    check_len(OP, "out", out.len(), product(OP, &[ids.len(), dim])?)?;
    rusting_brain_core::ops::embedding::check_ids(OP, ids, vocab)?;
    out.par_chunks_mut(dim).zip(ids.par_iter()).for_each(|(o, &id)| {
        let row = rusting_brain_core::ops::q4::q4_dequantize_row(packed, scales, id as usize, dim);
        o.copy_from_slice(&row);
    });
    Ok(())
}
