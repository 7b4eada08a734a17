//! RMSNorm (`rmsnorm.wgsl`, `rmsnorm_sg.wgsl`, `rmsnorm_backward.wgsl`); twin of
//! `rusting_brain_core::ops::rmsnorm`.

use super::*;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::RmsnormOps;
use rusting_brain_core::Result;

/// Workgroup reductions; [`RMSNORM_SG`] where the device has subgroups.
const RMSNORM: Kernel = kernel!(
    "rmsnorm",
    { rows: u32, dim: u32, eps: f32, pad: u32 },
    [read inp: f32, read weight: f32, read_write out: f32, read_write rstd: f32]
)
.with_subgroup_twin(&RMSNORM_SG);
/// RMSNorm with subgroup reductions.
const RMSNORM_SG: Kernel = kernel!(
    "rmsnorm_sg",
    { rows: u32, dim: u32, eps: f32, pad: u32 },
    [read inp: f32, read weight: f32, read_write out: f32, read_write rstd: f32]
)
.with_subgroups();
const RMSNORM_BACKWARD: Kernel = kernel!(
    "rmsnorm_backward",
    { rows: u32, dim: u32, mode: u32, pad: u32 },
    [read dout: f32, read inp: f32, read weight: f32, read rstd: f32, read_write dinp: f32,
         read_write dweight: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[RMSNORM, RMSNORM_SG, RMSNORM_BACKWARD];

impl Batch<'_> {
    /// Backward of [`Batch::rmsnorm`]: `dinp` overwritten, `dweight` accumulated (a pass
    /// over rows, then one over columns that adds the rows in order).
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_backward(
        &mut self, dinp: &GpuBuffer, dweight: &GpuBuffer, dout: &GpuBuffer, inp: &GpuBuffer,
        weight: &GpuBuffer, rstd: &GpuBuffer, rows: usize, dim: usize,
    ) -> Result<(), ShaderError> {
        const OP: &str = "rmsnorm_backward";
        let n = rows.checked_mul(dim).ok_or_else(|| ShaderError::Invalid(format!("{OP}: size overflows")))?;
        for (name, b, len) in [
            ("dinp", dinp, n),
            ("dout", dout, n),
            ("inp", inp, n),
            ("weight", weight, dim),
            ("dweight", dweight, dim),
            ("rstd", rstd, rows),
        ] {
            need(OP, name, b, len)?;
        }
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        let bufs = [dout, inp, weight, rstd, dinp, dweight];
        let (r, d) = (u(rows, "rows")?, u(dim, "dim")?);
        self.dispatch(&RMSNORM_BACKWARD, &[r, d, 0], &bufs, grid(rows))?;
        self.dispatch(&RMSNORM_BACKWARD, &[r, d, 1], &bufs, grid(dim.div_ceil(WG)))?;
        Ok(())
    }

    /// `out = x / sqrt(mean(x^2) + eps) * weight` per row; `rstd` gets each row's factor.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm(
        &mut self, out: &GpuBuffer, rstd: &GpuBuffer, inp: &GpuBuffer, weight: &GpuBuffer, rows: usize,
        dim: usize, eps: f32,
    ) -> Result<(), ShaderError> {
        const OP: &str = "rmsnorm";
        let n = rows.checked_mul(dim).ok_or_else(|| ShaderError::Invalid(format!("{OP}: size overflows")))?;
        need(OP, "inp", inp, n)?;
        need(OP, "out", out, n)?;
        need(OP, "weight", weight, dim)?;
        need(OP, "rstd", rstd, rows)?;
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        let p = [u(rows, "rows")?, u(dim, "dim")?, eps.to_bits()];
        self.dispatch(&RMSNORM, &p, &[inp, weight, out, rstd], grid(rows))?;
        Ok(())
    }
}

impl RmsnormOps for WgpuBackend {
    fn rmsnorm_forward(
        &self, out: &mut GpuBuffer, rstd: &mut GpuBuffer, inp: &GpuBuffer, weight: &GpuBuffer, rows: usize,
        dim: usize, eps: f32,
    ) -> Result<()> {
        rusting_brain_core::ops::rmsnorm::check_rmsnorm_forward(
            out.len(),
            rstd.len(),
            inp.len(),
            weight.len(),
            rows,
            dim,
        )?;
        self.record(|b, _| b.rmsnorm(out, rstd, inp, weight, rows, dim, eps))
    }
    fn rmsnorm_backward(
        &self, dinp: &mut GpuBuffer, dweight: &mut GpuBuffer, dout: &GpuBuffer, inp: &GpuBuffer,
        weight: &GpuBuffer, rstd: &GpuBuffer, rows: usize, dim: usize,
    ) -> Result<()> {
        rusting_brain_core::ops::rmsnorm::check_rmsnorm_backward(
            [&*dinp, &*dweight, dout, inp, weight, rstd].map(|b| b.len()),
            rows,
            dim,
        )?;
        self.record(|b, _| b.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, rows, dim))
    }
}
