//! Scaled dot-product attention on the CPU, any lengths, masks and bias. Twin of
//! `rusting_brain_core::ops::sdpa::sdpa`.
//!
//! One task per (batch, head, block of `Q_BLOCK` queries): the block's scores against
//! every key (`Q_BLOCK x kv_len`, one GEMM), masked, biased and soft-maxed in place, then
//! times V (a second GEMM). The scratch is that one tile per thread, never the whole
//! `(q_len, kv_len)` matrix of a head: at 4,608 tokens (FLUX at 1024 x 1024) a head's
//! matrix is 85 MB, a tile 4.7 MB.

use rayon::prelude::*;
use rusting_brain_core::ops::sdpa::SdpaSpec;
use rusting_brain_core::Result;

use super::attention::{gemm_views, with_tiles, View};
use super::simd;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::SdpaOps;

/// Queries per task: enough rows for the GEMMs to run at speed (at 4,608 tokens, 24 heads
/// of 128: 64 rows ran at 123 GFLOP/s on 2 Xeon cores, 128 at 149, 256 at 159; see
/// bench_image), few enough that the tile stays in the last-level cache.
pub(crate) const Q_BLOCK: usize = 256;

/// The scratch one task holds, in floats (for the memory report of the benchmarks).
pub fn tile_floats(spec: &SdpaSpec) -> usize {
    Q_BLOCK.min(spec.q_len) * (spec.kv_len + spec.head_dim)
}

/// Scaled dot-product attention on the CPU, blocked over queries (see [`SdpaSpec`] for the
/// layout, masks and bias): the fused kernel whose reference twin is core's `ops::sdpa`.
#[allow(clippy::too_many_arguments)]
pub fn sdpa(
    out: &mut [f32], q: &[f32], k: &[f32], v: &[f32], key_mask: Option<&[bool]>, bias: Option<&[f32]>,
    spec: &SdpaSpec,
) -> Result<()> {
    spec.check(out.len(), q.len(), k.len(), v.len(), key_mask.map(|m| m.len()), bias.map(|b| b.len()))?;
    let (d, hq, tk) = (spec.head_dim, spec.heads, spec.kv_len);
    if out.is_empty() {
        return Ok(());
    }
    let blocks = spec.q_len.div_ceil(Q_BLOCK);
    let tasks: Vec<(usize, usize, usize)> = (0..spec.batch)
        .flat_map(|b| (0..hq).flat_map(move |h| (0..blocks).map(move |blk| (b, h, blk))))
        .collect();
    // Each task's output rows (strided over the heads in `out`) come back as a block, to be
    // placed afterwards: tasks never share a write.
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(b, h, blk)| {
            let t0 = blk * Q_BLOCK;
            let rows = Q_BLOCK.min(spec.q_len - t0);
            let kvh = h / spec.group();
            let mut o = vec![0.0f32; rows * d];
            if tk == 0 {
                return o;
            }
            let qv = View { data: &q[spec.q_index(b, t0, h)..], rs: hq * d, cs: 1 };
            let kv0 = spec.kv_index(b, 0, kvh);
            let stride = spec.kv_heads * d;
            // K^T: (d, kv_len) read from the (kv_len, d) rows.
            let kt = View { data: &k[kv0..], rs: 1, cs: stride };
            with_tiles(rows * tk, |s, _| {
                gemm_views(s, rows, tk, d, qv, kt, 0.0);
                for (r, row) in s.chunks_mut(tk).enumerate() {
                    let t = t0 + r;
                    simd::scale(row, spec.scale);
                    if let Some(bias) = bias {
                        let bi = (h * spec.q_len + t) * tk;
                        simd::axpy(row, 1.0, &bias[bi..bi + tk]);
                    }
                    row[spec.visible(t)..].fill(f32::NEG_INFINITY);
                    if let Some(mask) = key_mask {
                        for (x, &open) in row.iter_mut().zip(&mask[b * tk..(b + 1) * tk]) {
                            if !open {
                                *x = f32::NEG_INFINITY;
                            }
                        }
                    }
                    let max = simd::max(row);
                    if max == f32::NEG_INFINITY {
                        // No key visible: a zero row of P, so zeros out, as the reference.
                        row.fill(0.0);
                        continue;
                    }
                    let sum = simd::exp_sub_sum(row, max);
                    simd::scale(row, 1.0 / sum);
                }
                let vv = View { data: &v[kv0..], rs: stride, cs: 1 };
                gemm_views(&mut o, rows, d, tk, View { data: s, rs: tk, cs: 1 }, vv, 0.0);
            });
            o
        })
        .collect();
    for (&(b, h, blk), o) in tasks.iter().zip(&results) {
        for (r, src) in o.chunks(d).enumerate() {
            let i = spec.q_index(b, blk * Q_BLOCK + r, h);
            out[i..i + d].copy_from_slice(src);
        }
    }
    Ok(())
}

impl SdpaOps for CpuBackend {
    fn sdpa(
        &self, out: &mut Vec<f32>, q: &Vec<f32>, k: &Vec<f32>, v: &Vec<f32>, key_mask: Option<&[bool]>,
        bias: Option<&Vec<f32>>, spec: &SdpaSpec,
    ) -> Result<()> {
        sdpa(out, q, k, v, key_mask, bias.map(|b| &b[..]), spec)
    }
}
