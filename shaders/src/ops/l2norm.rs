//! Sums of squares for the global gradient norm (`sum_of_squares.wgsl`); twin of
//! `rusting_brain_core::ops::l2norm`.

use super::*;

/// Values each workgroup of `sum_of_squares.wgsl` sums.
pub const SUM_OF_SQUARES_CHUNK: usize = 4096;

impl Batch<'_> {
    /// Partial sums of `x[..len]^2` into `partials[offset..]`, one per
    /// [`SUM_OF_SQUARES_CHUNK`] values; returns how many were written.
    pub fn sum_of_squares(
        &mut self,
        partials: &GpuBuffer,
        offset: usize,
        x: &GpuBuffer,
        len: usize,
    ) -> Result<usize, ShaderError> {
        let groups = len.div_ceil(SUM_OF_SQUARES_CHUNK);
        need("sum_of_squares", "x", x, len)?;
        need("sum_of_squares", "partials", partials, offset + groups)?;
        if groups > 0 {
            self.dispatch(
                Kernel::SumOfSquares,
                &[u(len, "len")?, u(offset, "offset")?],
                &[x, partials],
                grid(groups),
            )?;
        }
        Ok(groups)
    }
}
