//! The activation family on this backend.

use crate::backend::WgpuBackend;
use crate::DenseOp;
use crate::GpuBuffer;
use rusting_brain_core::backend::ActivationOps;
use rusting_brain_core::ops::activation::{check_activation_backward, check_activation_forward};
use rusting_brain_core::Activation;
use rusting_brain_core::Result;

impl ActivationOps for WgpuBackend {
    fn activation_forward(
        &self, act: Activation, out: &mut GpuBuffer, inp: &GpuBuffer, rows: usize, cols: usize,
    ) -> Result<()> {
        check_activation_forward(out.len(), inp.len(), rows, cols)?;
        let (code, slope) = act.kernel_code();
        self.dense(DenseOp::ActivationForward(code, slope), [Some(inp), None, None], out, rows, cols)
    }
    fn activation_backward(
        &self, act: Activation, dinp: &mut GpuBuffer, dout: &GpuBuffer, inp: &GpuBuffer, out: &GpuBuffer,
        rows: usize, cols: usize,
    ) -> Result<()> {
        check_activation_backward(dinp.len(), dout.len(), inp.len(), out.len(), rows, cols)?;
        let (code, slope) = act.kernel_code();
        self.dense(
            DenseOp::ActivationBackward(code, slope),
            [Some(dout), Some(inp), Some(out)],
            dinp,
            rows,
            cols,
        )
    }
}
