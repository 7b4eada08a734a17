//! Products on 4-bit weights on the CPU (core's `ops::q4`): each activation row rounded
//! to 13-bit integers in blocks of 32, then the 4-bit products of `simd::q4_rows` (VNNI
//! where the CPU has it), exactly the integers and float steps the reference takes.
//! Decode splits the weight rows over the team; prompts split the activation rows into
//! bands (short prompts the weight rows: `q8::run_parts`), each running sixteen weight
//! rows at a time past its rows so the weights (half a byte a value) stay in L1.

use rusting_brain_core::ops::q4::{check_q4_matmul, q4_packed_cols, q4_row_scales, Q4_BLOCK};
use rusting_brain_core::Result;

use super::simd;

// The 4-bit GEMM rounds its activation rows as the blocked int8 one does
// (`q8::rounded_rows`, blocks of 32).
const _: () = assert!(Q4_BLOCK == rusting_brain_core::ops::q8::Q8_BLOCK);

/// The bytes packed in `x` (four per slot, memory order).
pub(super) fn as_u8(x: &[f32]) -> &[u8] {
    // SAFETY: `u8` has alignment 1 and every bit pattern is a valid `u8`; the new slice
    // covers exactly the `4 * x.len()` bytes of `x` and borrows it for the same lifetime.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, x.len() * 4) }
}

/// `out (m x n) = x (m x k) W^T + beta * out`, W the (n x k) 4-bit weight, for a prompt
/// (`m > 1`; `q8_matmul` runs one row through the decode kernel itself).
pub fn q4_gemm(
    out: &mut [f32], x: &[f32], packed: &[f32], scales: &[f32], (m, n, k): (usize, usize, usize), beta: f32,
    shared: Option<&[simd::QuantRow]>,
) -> Result<()> {
    check_q4_matmul(out.len(), x.len(), packed.len(), scales.len(), m, n, k)?;
    let (stride, rs) = (4 * q4_packed_cols(k), q4_row_scales(k));
    let w = as_u8(packed);
    // A prompt: each band of activation rows rounded once (a short one's rows once for
    // every part, `shared`: `q8::rounded_rows`), then sixteen weight rows at a time (a few
    // KiB, in L1) against every row of the band.
    // Outputs (i, j) at o[i * os + j - c0] for weight rows j in cols (see run_parts).
    let part = |o: &mut [f32], os: usize, first: usize, cols: std::ops::Range<usize>| {
        let (c0, c1) = (cols.start, cols.end);
        let rows = o.len() / os;
        super::q8::part_rows(x, k, shared, (first, rows), |rounded, panel| {
            // Sixteen weight rows unpacked and laid across the vector lanes once a band
            // (VNNI): each activation row meets them with broadcast quads, as the int8
            // GEMM's panels do. The rest (and CPUs without VNNI) run the decode kernel
            // row by row.
            let mut done = c0;
            if rows >= super::q8::PANEL_MIN_ROWS && simd::has_vnni() {
                done = c0 + (c1 - c0) / 16 * 16;
                for j in (c0..done).step_by(16) {
                    panel.fill_q4(&w[j * stride..], stride, k, &scales[j * rs..(j + 16) * rs], rows);
                    simd::panel16_rows(&mut o[j - c0..], os, rounded, panel, beta);
                }
            }
            for j in (done..c1).step_by(16) {
                let end = (j + 16).min(c1);
                for (i, a) in rounded.iter().enumerate() {
                    simd::q4_rows(
                        &mut o[i * os + j - c0..i * os + end - c0],
                        &a.row(),
                        &w[j * stride..],
                        stride,
                        &scales[j * rs..],
                        beta,
                    );
                }
            }
        })
    };
    super::q8::run_parts(out, (m, n, k / 2), beta, part);
    Ok(())
}
