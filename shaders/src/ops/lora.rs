//! The adapter product (`lora.wgsl`); twin of `rusting_brain_core::ops::lora::lora_forward`.

use rusting_brain_core::ops::lora::LoraSpec;

use super::*;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::LoraOps;
use rusting_brain_core::backend::OperandPrecision;
use rusting_brain_core::Result;

const LORA: Kernel = kernel!(
    "lora",
    { rows: u32, d_in: u32, d_out: u32, rank: u32, x_off: u32, y_off: u32, t_off: u32, scale_bits: u32 },
    [read x: f32, read a: f32, read b: f32, read_write t: f32, read_write y: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[LORA];

/// The largest rank `lora.wgsl` holds in its workgroup memory.
pub const LORA_MAX_RANK: usize = 32;

impl Batch<'_> {
    /// `t = x A^T` (kept), `y += scale * t B^T`, one workgroup per row, on the windows of
    /// `s`; ranks up to `LORA_MAX_RANK`.
    pub fn lora_forward(
        &mut self, y: &GpuBuffer, t: &GpuBuffer, x: &GpuBuffer, a: &GpuBuffer, b: &GpuBuffer, s: &LoraSpec,
    ) -> Result<(), ShaderError> {
        if s.rank == 0 || s.rank > LORA_MAX_RANK {
            return Err(ShaderError::Invalid(format!(
                "lora_forward: rank {} is outside 1..={LORA_MAX_RANK}",
                s.rank
            )));
        }
        need("lora_forward", "x", x, s.x_offset + s.rows * s.d_in)?;
        need("lora_forward", "y", y, s.y_offset + s.rows * s.d_out)?;
        need("lora_forward", "t", t, s.t_offset + s.rows * s.rank)?;
        need("lora_forward", "A", a, s.rank * s.d_in)?;
        need("lora_forward", "B", b, s.d_out * s.rank)?;
        if s.rows == 0 {
            return Ok(());
        }
        self.dispatch(
            &LORA,
            &[
                u(s.rows, "rows")?,
                u(s.d_in, "d_in")?,
                u(s.d_out, "d_out")?,
                u(s.rank, "rank")?,
                u(s.x_offset, "x offset")?,
                u(s.y_offset, "y offset")?,
                u(s.t_offset, "t offset")?,
                s.scale.to_bits(),
            ],
            &[x, a, b, t, y],
            grid(s.rows),
        )?;
        Ok(())
    }
}

impl LoraOps for WgpuBackend {
    fn lora_forward(
        &self, y: &mut GpuBuffer, t: &mut GpuBuffer, x: &GpuBuffer, a: &GpuBuffer, b: &GpuBuffer,
        s: &LoraSpec,
    ) -> Result<()> {
        s.check("lora_forward", x.len(), y.len(), t.len(), a.len(), b.len())?;
        // One pass for f32 adapters of the usual ranks (a decode step's one dispatch per
        // projection instead of two); bf16 operands and larger ranks take the two GEMMs.
        if s.rank > crate::ops::LORA_MAX_RANK || s.precision != OperandPrecision::F32 {
            return rusting_brain_core::backend::lora_forward_by_gemm(self, y, t, x, a, b, s);
        }
        self.record(|batch, _| batch.lora_forward(y, t, x, a, b, s))
    }
}
