//! The loss family on this backend.

use crate::backend::cuda::dense;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::LossOps;
use rusting_brain_core::Loss;
use rusting_brain_core::Result;

impl LossOps for CudaBackend {
    fn loss_forward(
        &self, loss: Loss, pred: &CudaBuffer, target: &CudaBuffer, rows: usize, cols: usize,
    ) -> Result<f64> {
        dense::loss_forward(self, loss, pred, target, rows, cols)
    }
    fn loss_backward(
        &self, loss: Loss, dpred: &mut CudaBuffer, pred: &CudaBuffer, target: &CudaBuffer, rows: usize,
        cols: usize,
    ) -> Result<()> {
        dense::loss_backward(self, loss, dpred, pred, target, rows, cols)
    }
    fn fused_output_backward(
        &self, loss: Loss, dlogits: &mut CudaBuffer, pred: &CudaBuffer, target: &CudaBuffer, rows: usize,
        cols: usize,
    ) -> Result<()> {
        dense::fused_output_backward(self, loss, dlogits, pred, target, rows, cols)
    }
}
