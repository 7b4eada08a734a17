//! Row softmax and its backward on CUDA (`kernels/cu/softmax.cu`); twin of
//! `rusting_brain_core::ops::softmax`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::SoftmaxOps;
use rusting_brain_core::ops::softmax::{check_softmax_backward, check_softmax_forward};
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/softmax.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) = ("softmax", &["softmax_forward", "softmax_backward"]);

pub(super) fn softmax_forward(
    be: &CudaBackend, out: &mut CudaBuffer, inp: &CudaBuffer, rows: usize, cols: usize,
) -> Result<()> {
    check_softmax_forward(out.len, inp.len, rows, cols)?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let (r, c) = (i32_of("rows", rows)?, i32_of("cols", cols)?);
    launch!(be, "softmax_forward", rows_grid(rows, 256)?; &mut out.data, &inp.data, &r, &c)
}

pub(super) fn softmax_backward(
    be: &CudaBackend, dinp: &mut CudaBuffer, dout: &CudaBuffer, out: &CudaBuffer, rows: usize, cols: usize,
) -> Result<()> {
    check_softmax_backward(dinp.len, dout.len, out.len, rows, cols)?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let (r, c) = (i32_of("rows", rows)?, i32_of("cols", cols)?);
    launch!(be, "softmax_backward", rows_grid(rows, 256)?; &mut dinp.data, &dout.data, &out.data, &r, &c)
}

impl SoftmaxOps for CudaBackend {
    fn softmax_forward(
        &self, out: &mut CudaBuffer, inp: &CudaBuffer, rows: usize, cols: usize,
    ) -> Result<()> {
        softmax_forward(self, out, inp, rows, cols)
    }
    fn softmax_backward(
        &self, dinp: &mut CudaBuffer, dout: &CudaBuffer, out: &CudaBuffer, rows: usize, cols: usize,
    ) -> Result<()> {
        softmax_backward(self, dinp, dout, out, rows, cols)
    }
}
