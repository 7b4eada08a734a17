//! The softmax family on this backend.

use crate::backend::WgpuBackend;
use crate::DenseOp;
use crate::GpuBuffer;
use rusting_brain_core::backend::ActivationOps;
use rusting_brain_core::backend::SoftmaxOps;
use rusting_brain_core::ops::softmax::check_softmax_backward;
use rusting_brain_core::Activation;
use rusting_brain_core::Result;

impl SoftmaxOps for WgpuBackend {
    fn softmax_forward(&self, out: &mut GpuBuffer, inp: &GpuBuffer, rows: usize, cols: usize) -> Result<()> {
        self.activation_forward(Activation::Softmax, out, inp, rows, cols)
    }
    fn softmax_backward(
        &self, dinp: &mut GpuBuffer, dout: &GpuBuffer, out: &GpuBuffer, rows: usize, cols: usize,
    ) -> Result<()> {
        check_softmax_backward(dinp.len(), dout.len(), out.len(), rows, cols)?;
        self.dense(DenseOp::ActivationBackward(5, 0.0), [Some(dout), Some(out), Some(out)], dinp, rows, cols)
    }
}
