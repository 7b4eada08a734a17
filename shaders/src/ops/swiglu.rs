//! SwiGLU (`swiglu.wgsl`, `swiglu_backward.wgsl`); twin of `rusting_brain_core::ops::swiglu`.

use super::*;

impl Batch<'_> {
    /// Backward of [`Batch::swiglu`] over `len` values: `dgate`, `dup` overwritten.
    pub fn swiglu_backward(
        &mut self,
        dgate: &GpuBuffer,
        dup: &GpuBuffer,
        dout: &GpuBuffer,
        gate: &GpuBuffer,
        up: &GpuBuffer,
        len: usize,
    ) -> Result<(), ShaderError> {
        for (name, b) in [
            ("dgate", dgate),
            ("dup", dup),
            ("dout", dout),
            ("gate", gate),
            ("up", up),
        ] {
            need("swiglu_backward", name, b, len)?;
        }
        if len == 0 {
            return Ok(());
        }
        self.dispatch(
            Kernel::SwigluBackward,
            &[u(len, "len")?],
            &[dout, gate, up, dgate, dup],
            grid(len.div_ceil(WG)),
        )?;
        Ok(())
    }

    /// `out = silu(gate) * up` over `len` values.
    pub fn swiglu(
        &mut self,
        out: &GpuBuffer,
        gate: &GpuBuffer,
        up: &GpuBuffer,
        len: usize,
    ) -> Result<(), ShaderError> {
        for (name, b) in [("out", out), ("gate", gate), ("up", up)] {
            need("swiglu", name, b, len)?;
        }
        if len == 0 {
            return Ok(());
        }
        self.dispatch(
            Kernel::Swiglu,
            &[u(len, "len")?],
            &[gate, up, out],
            grid(len.div_ceil(WG)),
        )?;
        Ok(())
    }
}
