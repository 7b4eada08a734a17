//! SwiGLU (`swiglu.wgsl`, `swiglu_backward.wgsl`); twin of `rusting_brain_core::ops::swiglu`.

use super::*;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::SwigluOps;
use rusting_brain_core::Result;

const SWIGLU: Kernel = kernel!(
    "swiglu",
    { len: u32, pad0: u32, pad1: u32, pad2: u32 },
    [read gate: f32, read up: f32, read_write out: f32]
);
const SWIGLU_BACKWARD: Kernel = kernel!(
    "swiglu_backward",
    { len: u32, pad0: u32, pad1: u32, pad2: u32 },
    [read dout: f32, read gate: f32, read up: f32, read_write dgate: f32, read_write dup: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[SWIGLU, SWIGLU_BACKWARD];

impl Batch<'_> {
    /// Backward of [`Batch::swiglu`] over `len` values: `dgate`, `dup` overwritten.
    pub fn swiglu_backward(
        &mut self, dgate: &GpuBuffer, dup: &GpuBuffer, dout: &GpuBuffer, gate: &GpuBuffer, up: &GpuBuffer,
        len: usize,
    ) -> Result<(), ShaderError> {
        for (name, b) in [("dgate", dgate), ("dup", dup), ("dout", dout), ("gate", gate), ("up", up)] {
            need("swiglu_backward", name, b, len)?;
        }
        if len == 0 {
            return Ok(());
        }
        self.dispatch(
            &SWIGLU_BACKWARD,
            &[u(len, "len")?],
            &[dout, gate, up, dgate, dup],
            grid(len.div_ceil(WG)),
        )?;
        Ok(())
    }

    /// `out = silu(gate) * up` over `len` values.
    pub fn swiglu(
        &mut self, out: &GpuBuffer, gate: &GpuBuffer, up: &GpuBuffer, len: usize,
    ) -> Result<(), ShaderError> {
        for (name, b) in [("out", out), ("gate", gate), ("up", up)] {
            need("swiglu", name, b, len)?;
        }
        if len == 0 {
            return Ok(());
        }
        self.dispatch(&SWIGLU, &[u(len, "len")?], &[gate, up, out], grid(len.div_ceil(WG)))?;
        Ok(())
    }
}

impl SwigluOps for WgpuBackend {
    fn swiglu_forward(&self, out: &mut GpuBuffer, gate: &GpuBuffer, up: &GpuBuffer) -> Result<()> {
        rusting_brain_core::ops::swiglu::check_swiglu_forward(out.len(), gate.len(), up.len())?;
        let n = out.len();
        self.record(|b, _| b.swiglu(out, gate, up, n))
    }
    fn swiglu_backward(
        &self, dgate: &mut GpuBuffer, dup: &mut GpuBuffer, dout: &GpuBuffer, gate: &GpuBuffer, up: &GpuBuffer,
    ) -> Result<()> {
        rusting_brain_core::ops::swiglu::check_swiglu_backward(
            dgate.len(),
            dup.len(),
            dout.len(),
            gate.len(),
            up.len(),
        )?;
        let n = gate.len();
        self.record(|b, _| b.swiglu_backward(dgate, dup, dout, gate, up, n))
    }
}
