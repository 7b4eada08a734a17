//! RMSNorm forward and backward on CUDA (`kernels/cu/rmsnorm.cu`, whose `column_sum` also
//! sums bias gradients); twin of `rusting_brain_core::ops::rmsnorm`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::RmsnormOps;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/rmsnorm.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) =
    ("rmsnorm", &["rmsnorm_forward", "rmsnorm_backward", "column_sum", "column_sum_chunks"]);

impl CudaBackend {
    /// `acc[c] += sum over rows of m[r][c]` for an (rows, cols) matrix, in two fixed stages
    /// (chunks of rows, then the chunks in order): deterministic, and parallel over rows.
    pub(super) fn column_sum(
        &self, acc: &mut CudaSlice<f32>, m: &CudaSlice<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let col_blocks = cols.div_ceil(THREADS as usize);
        if col_blocks > 65_535 {
            return Err(dev_err(format!("{cols} columns is more than the column-sum kernels take")));
        }
        let chunk_rows = rows.div_ceil(65_535).max(256);
        let chunks = rows.div_ceil(chunk_rows);
        let mut guard = self.dev.col_partials.lock().map_err(|_| dev_err("scratch lock poisoned"))?;
        let partial = self.scratch(&mut guard, chunks * cols, "column-sum scratch")?;
        let (r, c, cr, ch) = (
            i32_of("rows", rows)?,
            i32_of("cols", cols)?,
            i32_of("rows", chunk_rows)?,
            i32_of("rows", chunks)?,
        );
        let cfg = LaunchConfig {
            grid_dim: (col_blocks as u32, chunks as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, "column_sum_chunks", cfg; &mut *partial, m, &r, &c, &cr)?;
        let cfg = LaunchConfig {
            grid_dim: (col_blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, "column_sum", cfg; acc, &*partial, &ch, &c)
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn rmsnorm_forward(
    be: &CudaBackend, out: &mut CudaBuffer, rstd: &mut CudaBuffer, inp: &CudaBuffer, weight: &CudaBuffer,
    rows: usize, dim: usize, eps: f32,
) -> Result<()> {
    ops::rmsnorm::check_rmsnorm_forward(out.len, rstd.len, inp.len, weight.len, rows, dim)?;
    if rows == 0 {
        return Ok(());
    }
    let (r, d) = (i32_of("rows", rows)?, i32_of("dim", dim)?);
    launch!(be, "rmsnorm_forward", rows_grid(rows, 256)?;
        &mut out.data, &mut rstd.data, &inp.data, &weight.data, &r, &d, &eps)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn rmsnorm_backward(
    be: &CudaBackend, dinp: &mut CudaBuffer, dweight: &mut CudaBuffer, dout: &CudaBuffer, inp: &CudaBuffer,
    weight: &CudaBuffer, rstd: &CudaBuffer, rows: usize, dim: usize,
) -> Result<()> {
    ops::rmsnorm::check_rmsnorm_backward(
        [&*dinp, &*dweight, dout, inp, weight, rstd].map(|b| b.len),
        rows,
        dim,
    )?;
    if rows == 0 {
        return Ok(());
    }
    let (r, d) = (i32_of("rows", rows)?, i32_of("dim", dim)?);
    // Per-row weight gradients (scratch kept between calls), then a column sum in row
    // order: no atomics.
    let mut guard = be.dev.rows_dw.lock().map_err(|_| dev_err("scratch lock poisoned"))?;
    let rows_dw = be.scratch(&mut guard, rows * dim, "RMSNorm weight-gradient scratch")?;
    launch!(be, "rmsnorm_backward", rows_grid(rows, 256)?;
        &mut dinp.data, &mut *rows_dw, &dout.data, &inp.data, &weight.data, &rstd.data, &r, &d)?;
    be.column_sum(&mut dweight.data, rows_dw, rows, dim)
}

impl RmsnormOps for CudaBackend {
    fn rmsnorm_forward(
        &self, out: &mut CudaBuffer, rstd: &mut CudaBuffer, inp: &CudaBuffer, weight: &CudaBuffer,
        rows: usize, dim: usize, eps: f32,
    ) -> Result<()> {
        rmsnorm_forward(self, out, rstd, inp, weight, rows, dim, eps)
    }
    fn rmsnorm_backward(
        &self, dinp: &mut CudaBuffer, dweight: &mut CudaBuffer, dout: &CudaBuffer, inp: &CudaBuffer,
        weight: &CudaBuffer, rstd: &CudaBuffer, rows: usize, dim: usize,
    ) -> Result<()> {
        rmsnorm_backward(self, dinp, dweight, dout, inp, weight, rstd, rows, dim)
    }
}
