//! The activation family on this backend.

use crate::backend::rows_check;
use crate::backend::WgpuBackend;
use crate::DenseOp;
use crate::GpuBuffer;
use rusting_brain_core::backend::ActivationOps;
use rusting_brain_core::Activation;
use rusting_brain_core::Result;

impl ActivationOps for WgpuBackend {
    fn activation_forward(
        &self, act: Activation, out: &mut GpuBuffer, inp: &GpuBuffer, rows: usize, cols: usize,
    ) -> Result<()> {
        rows_check("activation_forward", rows, cols, &[("inp", inp.len()), ("out", out.len())])?;
        let (code, slope) = act.kernel_code();
        self.dense(DenseOp::ActivationForward(code, slope), [Some(inp), None, None], out, rows, cols)
    }
    fn activation_backward(
        &self, act: Activation, dinp: &mut GpuBuffer, dout: &GpuBuffer, inp: &GpuBuffer, out: &GpuBuffer,
        rows: usize, cols: usize,
    ) -> Result<()> {
        rows_check(
            "activation_backward",
            rows,
            cols,
            &[("dinp", dinp.len()), ("dout", dout.len()), ("inp", inp.len()), ("out", out.len())],
        )?;
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
