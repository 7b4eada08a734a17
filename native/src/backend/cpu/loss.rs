//! The loss family on this backend.

use crate::backend::cpu::dense;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::LossOps;
use rusting_brain_core::Loss;
use rusting_brain_core::Result;

impl LossOps for CpuBackend {
    fn loss_forward(
        &self, l: Loss, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<f64> {
        dense::loss_forward(l, pred, target, rows, cols)
    }
    fn loss_backward(
        &self, l: Loss, dpred: &mut Vec<f32>, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        dense::loss_backward(l, dpred, pred, target, rows, cols)
    }
    fn fused_output_backward(
        &self, l: Loss, dlogits: &mut Vec<f32>, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        dense::fused_output_backward(l, dlogits, pred, target, rows, cols)
    }
}
