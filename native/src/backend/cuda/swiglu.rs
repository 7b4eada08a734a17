//! SwiGLU forward and backward on CUDA (`kernels/cu/swiglu.cu`); twin of
//! `rusting_brain_core::ops::swiglu`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::SwigluOps;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/swiglu.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) = ("swiglu", &["swiglu_forward", "swiglu_backward"]);

pub(super) fn swiglu_forward(
    be: &CudaBackend, out: &mut CudaBuffer, gate: &CudaBuffer, up: &CudaBuffer,
) -> Result<()> {
    ops::swiglu::check_swiglu_forward(out.len, gate.len, up.len)?;
    let n = out.len;
    if n == 0 {
        return Ok(());
    }
    launch!(be, "swiglu_forward", grid(n); &mut out.data, &gate.data, &up.data, &(n as i64))
}

pub(super) fn swiglu_backward(
    be: &CudaBackend, dgate: &mut CudaBuffer, dup: &mut CudaBuffer, dout: &CudaBuffer, gate: &CudaBuffer,
    up: &CudaBuffer,
) -> Result<()> {
    ops::swiglu::check_swiglu_backward(dgate.len, dup.len, dout.len, gate.len, up.len)?;
    let n = dout.len;
    if n == 0 {
        return Ok(());
    }
    launch!(be, "swiglu_backward", grid(n);
        &mut dgate.data, &mut dup.data, &dout.data, &gate.data, &up.data, &(n as i64))
}

impl SwigluOps for CudaBackend {
    fn swiglu_forward(&self, out: &mut CudaBuffer, gate: &CudaBuffer, up: &CudaBuffer) -> Result<()> {
        swiglu_forward(self, out, gate, up)
    }
    fn swiglu_backward(
        &self, dgate: &mut CudaBuffer, dup: &mut CudaBuffer, dout: &CudaBuffer, gate: &CudaBuffer,
        up: &CudaBuffer,
    ) -> Result<()> {
        swiglu_backward(self, dgate, dup, dout, gate, up)
    }
}
