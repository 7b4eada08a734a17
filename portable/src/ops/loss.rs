//! The loss family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::LossOps;
use rusting_brain_core::ops::loss;
use rusting_brain_core::Loss;
use rusting_brain_core::Result;

impl LossOps for PortableBackend {
    fn loss_forward(
        &self, l: Loss, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<f64> {
        loss::loss_forward(l, pred, target, rows, cols)
    }
    fn loss_backward(
        &self, l: Loss, dpred: &mut Vec<f32>, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        loss::loss_backward(l, dpred, pred, target, rows, cols)
    }
    fn fused_output_backward(
        &self, l: Loss, dlogits: &mut Vec<f32>, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        loss::fused_output_backward(l, dlogits, pred, target, rows, cols)
    }
}
