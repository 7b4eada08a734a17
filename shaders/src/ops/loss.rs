//! The loss family on this backend.

use crate::backend::WgpuBackend;
use crate::DenseOp;
use crate::GpuBuffer;
use rusting_brain_core::backend::LossOps;
use rusting_brain_core::backend::Memory;
use rusting_brain_core::ops::loss::check_loss;
use rusting_brain_core::Loss;
use rusting_brain_core::Result;

impl LossOps for WgpuBackend {
    fn loss_forward(
        &self, loss: Loss, pred: &GpuBuffer, target: &GpuBuffer, rows: usize, cols: usize,
    ) -> Result<f64> {
        // A scalar for the progress report: computed by the reference on the read-back
        // values, so it means exactly what it means on the CPU.
        rusting_brain_core::ops::loss::loss_forward(
            loss,
            &self.download(pred)?,
            &self.download(target)?,
            rows,
            cols,
        )
    }
    fn loss_backward(
        &self, loss: Loss, dpred: &mut GpuBuffer, pred: &GpuBuffer, target: &GpuBuffer, rows: usize,
        cols: usize,
    ) -> Result<()> {
        check_loss("loss_backward", pred.len(), target.len(), Some(("dpred", dpred.len())), rows, cols)?;
        if rows == 0 {
            return Ok(());
        }
        let inv = 1.0 / loss.divisor(rows, cols) as f32;
        self.dense(
            DenseOp::LossBackward(loss.kernel_code(), inv),
            [Some(pred), Some(target), None],
            dpred,
            rows,
            cols,
        )
    }
    fn fused_output_backward(
        &self, loss: Loss, dlogits: &mut GpuBuffer, pred: &GpuBuffer, target: &GpuBuffer, rows: usize,
        cols: usize,
    ) -> Result<()> {
        let grad = Some(("dlogits", dlogits.len()));
        check_loss("fused_output_backward", pred.len(), target.len(), grad, rows, cols)?;
        if rows == 0 {
            return Ok(());
        }
        let inv = 1.0 / loss.divisor(rows, cols) as f32;
        self.dense(DenseOp::FusedOutputBackward(inv), [Some(pred), Some(target), None], dlogits, rows, cols)
    }
}
