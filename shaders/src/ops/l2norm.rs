//! Sums of squares for the global gradient norm (`sum_of_squares.wgsl`); twin of
//! `rusting_brain_core::ops::l2norm`.

use super::*;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::L2normOps;
use rusting_brain_core::Result;

const SUM_OF_SQUARES: Kernel = kernel!(
    "sum_of_squares",
    { len: u32, offset: u32, pad0: u32, pad1: u32 },
    [read x: f32, read_write partials: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[SUM_OF_SQUARES];

/// Values each workgroup of `sum_of_squares.wgsl` sums.
pub const SUM_OF_SQUARES_CHUNK: usize = 4096;

impl Batch<'_> {
    /// Partial sums of `x[..len]^2` into `partials[offset..]`, one per
    /// [`SUM_OF_SQUARES_CHUNK`] values; returns how many were written.
    pub fn sum_of_squares(
        &mut self, partials: &GpuBuffer, offset: usize, x: &GpuBuffer, len: usize,
    ) -> Result<usize, ShaderError> {
        let groups = len.div_ceil(SUM_OF_SQUARES_CHUNK);
        need("sum_of_squares", "x", x, len)?;
        need("sum_of_squares", "partials", partials, offset + groups)?;
        if groups > 0 {
            self.dispatch(
                &SUM_OF_SQUARES,
                &[u(len, "len")?, u(offset, "offset")?],
                &[x, partials],
                grid(groups),
            )?;
        }
        Ok(groups)
    }
}

impl L2normOps for WgpuBackend {
    fn sum_of_squares(&self, x: &GpuBuffer) -> Result<f64> {
        self.sum_of_squares_many(&[x])
    }
    fn sum_of_squares_many(&self, xs: &[&GpuBuffer]) -> Result<f64> {
        // Partial sums in f32 over chunks of 4,096 values on the device, added in f64 here:
        // one read-back for every tensor of a global gradient norm.
        let total = self.record_sum_of_squares(xs)?;
        if total == 0 {
            return Ok(0.0);
        }
        let partials = self.read_scratch("sum of squares", total)?;
        Ok(partials.iter().map(|&v| v as f64).sum())
    }
}
