//! Int8 products and lookups on CUDA (`kernels/cu/q8.cu`); twin of
//! `rusting_brain_core::ops::q8`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::MatmulSpec;
use rusting_brain_core::backend::Q8Ops;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/q8.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) =
    ("q8", &["quantize_activations", "quantize_activations_wide", "q8_matmul", "q8_embedding"]);

pub(super) fn q8_matmul(
    be: &CudaBackend, out: &mut CudaBuffer, x: &CudaBuffer, packed: &CudaBuffer, scales: &CudaBuffer,
    spec: &MatmulSpec,
) -> Result<()> {
    const OP: &str = "q8_matmul";
    let (m, n, k) = (spec.m, spec.n, spec.k);
    // The same contract as the host backends: check it on lengths, then on the window.
    let block = ops::q8::check_q8(OP, packed.len, scales.len, n, k)?;
    let blocks = k.div_ceil(block);
    let (wx, wo) = match spec.window {
        None => {
            ops::q8::check_q8_matmul(out.len, x.len, packed.len, scales.len, m, n, k)?;
            (0, 0)
        }
        Some(w) => {
            let (lx, lo) = (m * k, m * n);
            check_range(OP, "x", x.len, w.a, lx)?;
            check_range(OP, "out", out.len, w.c, lo)?;
            (w.a, w.c)
        }
    };
    if !spec.trans_b
        || spec.trans_a
        || spec.alpha != 1.0
        || spec.batch != 1
        || spec.window.is_some_and(|w| w.b != 0)
    {
        return Err(CoreError::InvalidArgument {
            op: OP,
            message: format!("the int8 product is out = x W^T + beta * out (trans_b, alpha 1, one problem, unwindowed weight); got {spec:?}"),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let words = ops::q8::packed_cols(k);
    // int8 activations for one block a row, 13-bit shorts for blocks.
    let wide = blocks > 1;
    let xq_bytes = m * words * 4 * if wide { 2 } else { 1 };
    be.check_room(xq_bytes, "int8 activation scratch")?;
    let mut xq = be
        .dev
        .stream
        .alloc_zeros::<i8>(xq_bytes.max(1))
        .map_err(drv("allocating int8 activation scratch"))?;
    let mut xs = be.alloc(m * blocks)?;
    let xv = x.data.slice(wx..wx + m * k);
    let (mi, ki, kp) = (i32_of("m", m)?, i32_of("k", k)?, i32_of("k", words * 4)?);
    let (bi, bs) = (i32_of("blocks", blocks)?, i32_of("block", block)?);
    let grid = rows_grid(m * blocks, 256)?;
    if wide {
        launch!(be, "quantize_activations_wide", grid; &mut xq, &mut xs.data, &xv, &mi, &ki, &kp, &bs)?;
    } else {
        launch!(be, "quantize_activations", grid; &mut xq, &mut xs.data, &xv, &mi, &ki, &kp, &bs)?;
    }
    let mut ov = out.data.slice_mut(wo..wo + m * n);
    let (ni, wi) = (i32_of("n", n)?, i32_of("k", words)?);
    launch!(be, "q8_matmul", CudaBackend::warps_cfg(m * n)?;
        &mut ov, &xq, &xs.data, &packed.data, &scales.data, &mi, &ni, &wi, &spec.beta, &bi, &bs)
}

pub(super) fn q8_embedding(
    be: &CudaBackend, out: &mut CudaBuffer, packed: &CudaBuffer, scales: &CudaBuffer, ids: &[u32],
    vocab: usize, dim: usize,
) -> Result<()> {
    const OP: &str = "q8_embedding";
    let block = ops::q8::check_q8(OP, packed.len, scales.len, vocab, dim)?;
    check_len(OP, "out", out.len, ids.len() * dim)?;
    ops::embedding::check_ids(OP, ids, vocab)?;
    if ids.is_empty() {
        return Ok(());
    }
    let idg = be.upload_u32(ids)?;
    let (r, d, w) =
        (i32_of("rows", ids.len())?, i32_of("dim", dim)?, i32_of("dim", ops::q8::packed_cols(dim))?);
    let (bi, bs) = (i32_of("blocks", dim.div_ceil(block))?, i32_of("block", block)?);
    launch!(be, "q8_embedding", grid(ids.len() * dim); &mut out.data, &packed.data, &scales.data, &idg, &r, &d, &w, &bi, &bs)
}

impl Q8Ops for CudaBackend {
    fn q8_matmul(
        &self, out: &mut CudaBuffer, x: &CudaBuffer, packed: &CudaBuffer, scales: &CudaBuffer,
        spec: &MatmulSpec,
    ) -> Result<()> {
        q8_matmul(self, out, x, packed, scales, spec)
    }
    fn q8_embedding(
        &self, out: &mut CudaBuffer, packed: &CudaBuffer, scales: &CudaBuffer, ids: &[u32], vocab: usize,
        dim: usize,
    ) -> Result<()> {
        q8_embedding(self, out, packed, scales, ids, vocab, dim)
    }
}
