//! Fused softmax + cross-entropy on the CPU: rows in parallel, one vectorized exp per
//! logit, the gradient written over the logits in place. Per-row losses are summed in row
//! order afterwards, so the loss does not depend on the thread count.
//! Twin of `rusting_brain_core::ops::cross_entropy`.

use rayon::prelude::*;
use rusting_brain_core::ops::cross_entropy::{check_cross_entropy, CrossEntropySum};
use rusting_brain_core::{CoreError, Result};

use super::simd;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::CrossEntropyOps;

pub fn cross_entropy(
    logits: &mut [f32], targets: &[u32], mask: Option<&[bool]>, rows: usize, vocab: usize,
    grad_scale: Option<f32>,
) -> Result<CrossEntropySum> {
    const OP: &str = "cross_entropy";
    check_cross_entropy(logits.len(), targets, mask, rows, vocab)?;
    let counted = |r: usize| mask.is_none_or(|m| m[r]);
    let mut losses = vec![0.0f64; rows];
    logits.par_chunks_mut(vocab).zip(losses.par_iter_mut()).enumerate().for_each_init(
        || {
            if grad_scale.is_none() {
                vec![0.0f32; vocab]
            } else {
                Vec::new()
            }
        },
        |scratch, (r, (row, loss))| {
            if !counted(r) {
                if grad_scale.is_some() {
                    row.fill(0.0);
                }
                return;
            }
            let target = targets[r] as usize;
            let max = simd::max(row);
            let picked = row[target];
            // With a gradient to write, the row itself holds exp(x - max); otherwise a copy.
            let e: &mut [f32] = if grad_scale.is_some() {
                row
            } else {
                scratch.copy_from_slice(row);
                scratch
            };
            let sum = simd::exp_sub_sum(e, max);
            *loss = (max as f64 + (sum as f64).ln()) - picked as f64;
            if let Some(s) = grad_scale {
                simd::scale(e, s / sum);
                e[target] -= s;
            }
        },
    );
    let mut total = CrossEntropySum::default();
    for (r, &l) in losses.iter().enumerate() {
        if counted(r) {
            if !l.is_finite() {
                return Err(CoreError::NonFinite { op: OP, value: l });
            }
            total.loss_sum += l;
            total.count += 1;
        }
    }
    Ok(total)
}

impl CrossEntropyOps for CpuBackend {
    fn cross_entropy(
        &self, logits: &mut Vec<f32>, targets: &[u32], mask: Option<&[bool]>, rows: usize, vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum> {
        cross_entropy(logits, targets, mask, rows, vocab, grad_scale)
    }
}
