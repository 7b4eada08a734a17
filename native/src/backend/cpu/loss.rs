//! The loss family on the CPU: the reference functions run on blocks of rows in parallel;
//! loss sums come back per block and are added in block order. Twin of
//! `rusting_brain_core::ops::loss`.

use rayon::prelude::*;
use rusting_brain_core::backend::LossOps;
use rusting_brain_core::ops::loss as loss_ref;
use rusting_brain_core::ops::loss::check_loss;
use rusting_brain_core::{Loss, Result};

use super::rows_per_task;
use crate::backend::cpu::CpuBackend;

/// `f` (a reference gradient) on each block of rows, rescaled from the block's own row count
/// (which the reference divides by) to the whole batch's.
fn scaled_blocks(
    dpred: &mut [f32], pred: &[f32], target: &[f32], rows: usize, cols: usize,
    f: impl Fn(&mut [f32], &[f32], &[f32], usize) -> Result<()> + Sync,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let per = rows_per_task(cols) * cols;
    dpred.par_chunks_mut(per).zip(pred.par_chunks(per).zip(target.par_chunks(per))).try_for_each(
        |(d, (p, y))| {
            let r = p.len() / cols;
            f(d, p, y, r)?;
            let s = r as f32 / rows as f32;
            d.iter_mut().for_each(|v| *v *= s);
            Ok(())
        },
    )
}

impl LossOps for CpuBackend {
    fn loss_forward(
        &self, loss: Loss, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<f64> {
        check_loss("loss_forward", pred.len(), target.len(), None, rows, cols)?;
        if rows == 0 {
            return Ok(0.0);
        }
        // Each block's mean times its row count is its share of the total (all three losses
        // divide by a multiple of the row count), so sum(share) / rows is the overall mean.
        let per = rows_per_task(cols) * cols;
        let shares: Vec<Result<f64>> = pred
            .par_chunks(per)
            .zip(target.par_chunks(per))
            .map(|(p, y)| {
                let r = p.len() / cols;
                loss_ref::loss_forward(loss, p, y, r, cols).map(|m| m * r as f64)
            })
            .collect();
        let mut total = 0.0;
        for s in shares {
            total += s?;
        }
        Ok(total / rows as f64)
    }
    fn loss_backward(
        &self, loss: Loss, dpred: &mut Vec<f32>, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        check_loss("loss_backward", pred.len(), target.len(), Some(("dpred", dpred.len())), rows, cols)?;
        scaled_blocks(dpred, pred, target, rows, cols, |d, p, y, r| {
            loss_ref::loss_backward(loss, d, p, y, r, cols)
        })
    }
    fn fused_output_backward(
        &self, loss: Loss, dlogits: &mut Vec<f32>, pred: &Vec<f32>, target: &Vec<f32>, rows: usize,
        cols: usize,
    ) -> Result<()> {
        let grad = Some(("dlogits", dlogits.len()));
        check_loss("fused_output_backward", pred.len(), target.len(), grad, rows, cols)?;
        scaled_blocks(dlogits, pred, target, rows, cols, |d, p, y, r| {
            loss_ref::fused_output_backward(loss, d, p, y, r, cols)
        })
    }
}
