//! The elementwise family on this backend.

use crate::backend::WgpuBackend;
use crate::DenseOp;
use crate::GpuBuffer;
use rusting_brain_core::backend::ElementwiseOps;
use rusting_brain_core::error::check_len;
use rusting_brain_core::ops::elementwise::check_bias;
use rusting_brain_core::Result;

impl ElementwiseOps for WgpuBackend {
    fn axpy(&self, y: &mut GpuBuffer, alpha: f32, x: &GpuBuffer) -> Result<()> {
        check_len("axpy", "x", x.len(), y.len())?;
        let n = y.len();
        self.dense(DenseOp::Axpy(alpha), [Some(x), None, None], y, 1, n)
    }
    fn scale(&self, x: &mut GpuBuffer, alpha: f32) -> Result<()> {
        let n = x.len();
        self.dense(DenseOp::Scale(alpha), [None; 3], x, 1, n)
    }
    fn add_bias(&self, out: &mut GpuBuffer, bias: &GpuBuffer, rows: usize, cols: usize) -> Result<()> {
        check_bias("add_bias", ["out", "bias"], out.len(), bias.len(), rows, cols)?;
        self.dense(DenseOp::AddBias, [Some(bias), None, None], out, rows, cols)
    }
    fn bias_backward(&self, dbias: &mut GpuBuffer, dout: &GpuBuffer, rows: usize, cols: usize) -> Result<()> {
        check_bias("bias_backward", ["dout", "dbias"], dout.len(), dbias.len(), rows, cols)?;
        self.dense(DenseOp::BiasBackward, [Some(dout), None, None], dbias, rows, cols)
    }
}
