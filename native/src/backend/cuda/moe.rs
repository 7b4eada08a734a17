//! The mixture-of-experts combine and its backward on CUDA (`kernels/cu/moe.cu`); twin of
//! `rusting_brain_core::ops::moe`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::MoeOps;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/moe.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) = ("moe", &["moe_combine", "moe_combine_backward"]);

pub(super) fn moe_combine(
    be: &CudaBackend, out: &mut CudaBuffer, y: &CudaBuffer, row_of_slot: &[u32], weight: &[f32],
    top_k: usize, dim: usize,
) -> Result<()> {
    let n = ops::moe::check_combine("moe_combine", out.len, y.len, row_of_slot, weight, top_k, dim)?;
    if n == 0 {
        return Ok(());
    }
    let rows = be.upload_u32(row_of_slot)?;
    let w = be.upload_any(weight)?;
    let (nn, kk, d) = (i32_of("n", n)?, i32_of("top_k", top_k)?, i32_of("dim", dim)?);
    launch!(be, "moe_combine", grid(n * dim); &mut out.data, &y.data, &rows, &w, &nn, &kk, &d)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn moe_combine_backward(
    be: &CudaBackend, dy: &mut CudaBuffer, dout: &CudaBuffer, y: &CudaBuffer, row_of_slot: &[u32],
    weight: &[f32], top_k: usize, dim: usize,
) -> Result<Vec<f32>> {
    const OP: &str = "moe_combine_backward";
    let n = ops::moe::check_combine(OP, dout.len, y.len, row_of_slot, weight, top_k, dim)?;
    check_len(OP, "dy", dy.len, y.len)?;
    let slots = n * top_k;
    if slots == 0 {
        return Ok(Vec::new());
    }
    let rows = be.upload_u32(row_of_slot)?;
    let w = be.upload_any(weight)?;
    let mut dweight = be.alloc(slots)?;
    let (s, kk, d) = (i32_of("slots", slots)?, i32_of("top_k", top_k)?, i32_of("dim", dim)?);
    launch!(be, "moe_combine_backward", rows_grid(slots, 128)?;
        &mut dy.data, &mut dweight.data, &dout.data, &y.data, &rows, &w, &s, &kk, &d)?;
    be.download(&dweight)
}

impl MoeOps for CudaBackend {
    fn moe_combine(
        &self, out: &mut CudaBuffer, y: &CudaBuffer, row_of_slot: &[u32], weight: &[f32], top_k: usize,
        dim: usize,
    ) -> Result<()> {
        moe_combine(self, out, y, row_of_slot, weight, top_k, dim)
    }
    fn moe_combine_backward(
        &self, dy: &mut CudaBuffer, dout: &CudaBuffer, y: &CudaBuffer, row_of_slot: &[u32], weight: &[f32],
        top_k: usize, dim: usize,
    ) -> Result<Vec<f32>> {
        moe_combine_backward(self, dy, dout, y, row_of_slot, weight, top_k, dim)
    }
}
