//! Softmax + cross-entropy over a vocabulary, fused so the (rows, vocab) probabilities are
//! never stored: the logits buffer is overwritten in place with the gradient.

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::reference::in_f64;
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};
use alloc::vec::Vec;

/// The summed loss over the rows that count, and how many rows counted. The mean is
/// `loss_sum / count`; keeping the sum lets micro-batches combine exactly.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CrossEntropySum {
    /// Losses summed over the counted rows.
    pub loss_sum: f64,
    /// Rows counted.
    pub count: usize,
}

impl CrossEntropySum {
    /// The mean loss (0 when nothing counted).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.loss_sum / self.count as f64
        }
    }
}

/// The contract of `cross_entropy`, shared by every backend: logits `(rows, vocab)`,
/// one target and (optionally) one mask flag per row, every counted target below `vocab`.
pub fn check_cross_entropy(
    logits: usize, targets: &[u32], mask: Option<&[bool]>, rows: usize, vocab: usize,
) -> Result<()> {
    const OP: &str = "cross_entropy";
    nonzero(OP, "vocab", vocab)?;
    check_len(OP, "logits", logits, product(OP, &[rows, vocab])?)?;
    check_len(OP, "targets", targets.len(), rows)?;
    if let Some(mask) = mask {
        check_len(OP, "mask", mask.len(), rows)?;
    }
    let counted = |r: usize| mask.is_none_or(|m| m[r]);
    match (0..rows).find(|&r| counted(r) && targets[r] as usize >= vocab) {
        Some(r) => Err(CoreError::IdOutOfRange { op: OP, id: targets[r], index: r, vocab }),
        None => Ok(()),
    }
}

/// logits: (rows, vocab); targets: (rows); mask: (rows), `false` = ignored row.
///
/// Loss of row r: `logsumexp(logits[r]) - logits[r][targets[r]]`.
/// With `grad_scale = Some(s)`, `logits` is overwritten with `s * (softmax - onehot)` on the
/// counted rows and zero on ignored ones (pass `s = 1 / count` for the mean loss's gradient).
/// With `None`, `logits` is left as it was (evaluation).
///
/// Targets of ignored rows are not read, so padding may hold any id. A non-finite loss is
/// [`CoreError::NonFinite`]; the logits may then be partly overwritten.
pub fn cross_entropy<T: Real>(
    logits: &mut [T], targets: &[u32], mask: Option<&[bool]>, rows: usize, vocab: usize,
    grad_scale: Option<f32>,
) -> Result<CrossEntropySum> {
    const OP: &str = "cross_entropy";
    check_cross_entropy(logits.len(), targets, mask, rows, vocab)?;
    let counted = |r: usize| mask.is_none_or(|m| m[r]);
    let mut total = CrossEntropySum::default();
    for r in 0..rows {
        let row = &mut logits[r * vocab..(r + 1) * vocab];
        if !counted(r) {
            if grad_scale.is_some() {
                row.iter_mut().for_each(|x| *x = T::ZERO);
            }
            continue;
        }
        let target = targets[r] as usize;
        let mut max = T::NEG_INFINITY;
        for &x in row.iter() {
            max = max.max(x);
        }
        let mut sum = T::ZERO;
        for &x in row.iter() {
            sum += (x - max).exp();
        }
        let lse = max + sum.ln();
        let loss = (lse - row[target]).to_f64();
        if !loss.is_finite() {
            return Err(CoreError::NonFinite { op: OP, value: loss });
        }
        total.loss_sum += loss;
        total.count += 1;
        if let Some(s) = grad_scale {
            let s = T::from_f32(s);
            for (i, x) in row.iter_mut().enumerate() {
                let p = (*x - lse).exp();
                let y = if i == target { T::ONE } else { T::ZERO };
                *x = s * (p - y);
            }
        }
    }
    Ok(total)
}

/// Softmax cross-entropy over logits, loss and gradient in one pass: see [`crate::ops::cross_entropy`].
pub trait CrossEntropyOps: Memory {
    /// See [`crate::ops::cross_entropy::cross_entropy`]: logits overwritten by their
    /// gradient when `grad_scale` is given.
    fn cross_entropy(
        &self, logits: &mut Self::Buffer, targets: &[u32], mask: Option<&[bool]>, rows: usize, vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum>;
}

impl CrossEntropyOps for ReferenceBackend {
    fn cross_entropy(
        &self, logits: &mut Vec<f32>, targets: &[u32], mask: Option<&[bool]>, rows: usize, vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum> {
        in_f64([logits], |[l]| cross_entropy(l, targets, mask, rows, vocab, grad_scale))
    }
}
