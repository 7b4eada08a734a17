//! The activation family on this backend.

use crate::backend::cuda::dense;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::ActivationOps;
use rusting_brain_core::Activation;
use rusting_brain_core::Result;

impl ActivationOps for CudaBackend {
    fn activation_forward(
        &self, act: Activation, out: &mut CudaBuffer, inp: &CudaBuffer, rows: usize, cols: usize,
    ) -> Result<()> {
        dense::activation_forward(self, act, out, inp, rows, cols)
    }
    fn activation_backward(
        &self, act: Activation, dinp: &mut CudaBuffer, dout: &CudaBuffer, inp: &CudaBuffer, out: &CudaBuffer,
        rows: usize, cols: usize,
    ) -> Result<()> {
        dense::activation_backward(self, act, dinp, dout, inp, out, rows, cols)
    }
}
