//! The softmax family on this backend.

use crate::backend::rows_check;
use crate::backend::WgpuBackend;
use crate::DenseOp;
use crate::GpuBuffer;
use rusting_brain_core::backend::ActivationOps;
use rusting_brain_core::backend::SoftmaxOps;
use rusting_brain_core::Activation;
use rusting_brain_core::Result;

impl SoftmaxOps for WgpuBackend {
    fn softmax_forward(&self, out: &mut GpuBuffer, inp: &GpuBuffer, rows: usize, cols: usize) -> Result<()> {
        self.activation_forward(Activation::Softmax, out, inp, rows, cols)
    }
    fn softmax_backward(
        &self, dinp: &mut GpuBuffer, dout: &GpuBuffer, out: &GpuBuffer, rows: usize, cols: usize,
    ) -> Result<()> {
        rows_check(
            "softmax_backward",
            rows,
            cols,
            &[("dinp", dinp.len()), ("dout", dout.len()), ("out", out.len())],
        )?;
        self.dense(DenseOp::ActivationBackward(5, 0.0), [Some(dout), Some(out), Some(out)], dinp, rows, cols)
    }
}
