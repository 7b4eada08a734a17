//! `axpy` and `scale` on CUDA (`kernels/cu/elementwise.cu`); twins in
//! `rusting_brain_core::ops::elementwise`.

use super::*;
use crate::backend::cuda::dense;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::ElementwiseOps;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/elementwise.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) = (
    "elementwise",
    &[
        "fill",
        "axpy",
        "scale",
        "add_bias",
        "partial_sums",
        "activation_forward",
        "activation_backward",
        "loss_terms",
        "loss_backward",
        "to_bf16",
    ],
);

pub(super) fn axpy(be: &CudaBackend, y: &mut CudaBuffer, alpha: f32, x: &CudaBuffer) -> Result<()> {
    check_len("axpy", "x", x.len, y.len)?;
    let n = y.len;
    if n == 0 {
        return Ok(());
    }
    launch!(be, "axpy", grid(n); &mut y.data, &alpha, &x.data, &(n as i64))
}

pub(super) fn scale(be: &CudaBackend, x: &mut CudaBuffer, alpha: f32) -> Result<()> {
    let n = x.len;
    if n == 0 {
        return Ok(());
    }
    launch!(be, "scale", grid(n); &mut x.data, &alpha, &(n as i64))
}

impl ElementwiseOps for CudaBackend {
    fn axpy(&self, y: &mut CudaBuffer, alpha: f32, x: &CudaBuffer) -> Result<()> {
        axpy(self, y, alpha, x)
    }
    fn scale(&self, x: &mut CudaBuffer, alpha: f32) -> Result<()> {
        scale(self, x, alpha)
    }
    fn add_bias(&self, out: &mut CudaBuffer, bias: &CudaBuffer, rows: usize, cols: usize) -> Result<()> {
        dense::add_bias(self, out, bias, rows, cols)
    }
    fn bias_backward(
        &self, dbias: &mut CudaBuffer, dout: &CudaBuffer, rows: usize, cols: usize,
    ) -> Result<()> {
        dense::bias_backward(self, dbias, dout, rows, cols)
    }
}
