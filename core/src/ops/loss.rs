//! The losses of a dense network, on predictions after the output activation.
//!
//! Means follow PyTorch: MSE and binary cross-entropy average over every element,
//! categorical cross-entropy sums over classes and averages over rows. Logarithms are
//! clamped at -100 and gradient denominators at 1e-12, as `torch.nn.BCELoss` does, so a
//! saturated prediction gives a large finite loss instead of Inf.

use crate::backend::Memory;
use crate::error::{check_len, check_rows};
use crate::ops::activation::Activation;
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};
use alloc::vec::Vec;

/// What a dense network minimizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Mean of `(pred - target)^2` over every element.
    MeanSquaredError,
    /// Binary cross-entropy of probabilities (after a sigmoid), averaged over every element.
    BinaryCrossEntropy,
    /// Cross-entropy of a row of probabilities (after a softmax) against a one-hot (or soft) row, averaged over rows.
    CategoricalCrossEntropy,
}

const LOG_FLOOR: f64 = -100.0;
const GRAD_EPS: f64 = 1e-12;

fn clamped_ln<T: Real>(x: T) -> T {
    x.ln().max(T::from_f64(LOG_FLOOR))
}

impl Loss {
    /// The code the GPU kernels (WGSL and CUDA) switch on: MSE 0, binary cross-entropy 1,
    /// categorical cross-entropy 2.
    pub fn kernel_code(self) -> u32 {
        match self {
            Loss::MeanSquaredError => 0,
            Loss::BinaryCrossEntropy => 1,
            Loss::CategoricalCrossEntropy => 2,
        }
    }

    /// The divisor of the mean: element count or row count.
    pub fn divisor(self, rows: usize, cols: usize) -> usize {
        match self {
            Loss::CategoricalCrossEntropy => rows,
            _ => rows * cols,
        }
    }

    /// Whether this loss after `act` has the fused, stable gradient
    /// `d loss / d logits = (prediction - target) / divisor` (softmax + categorical
    /// cross-entropy, sigmoid + binary cross-entropy).
    pub fn fuses_with(self, act: Activation) -> bool {
        matches!(
            (self, act),
            (Loss::CategoricalCrossEntropy, Activation::Softmax)
                | (Loss::BinaryCrossEntropy, Activation::Sigmoid)
        )
    }
}

/// The losses' shape check, which every backend calls: `pred` and `target` hold
/// `rows x cols` (`cols` at least 1), and so does the gradient when there is one (its name
/// and length). Returns `rows * cols`.
pub fn check_loss(
    op: &'static str, pred: usize, target: usize, grad: Option<(&'static str, usize)>, rows: usize,
    cols: usize,
) -> Result<usize> {
    let n = check_rows(op, rows, cols, &[("pred", pred), ("target", target)])?;
    if let Some((name, len)) = grad {
        check_len(op, name, len, n)?;
    }
    Ok(n)
}

/// The mean loss of `pred` against `target`, both (rows, cols). Zero rows give 0.
pub fn loss_forward<T: Real>(loss: Loss, pred: &[T], target: &[T], rows: usize, cols: usize) -> Result<f64> {
    const OP: &str = "loss_forward";
    check_loss(OP, pred.len(), target.len(), None, rows, cols)?;
    if rows == 0 {
        return Ok(0.0);
    }
    // Accumulated in f64: a batch's loss sums rows * cols terms, too many for f32.
    let mut sum = 0.0f64;
    for (&p, &y) in pred.iter().zip(target) {
        sum += match loss {
            Loss::MeanSquaredError => (p - y) * (p - y),
            Loss::BinaryCrossEntropy => -(y * clamped_ln(p) + (T::ONE - y) * clamped_ln(T::ONE - p)),
            Loss::CategoricalCrossEntropy => -(y * clamped_ln(p)),
        }
        .to_f64();
    }
    let value = sum / loss.divisor(rows, cols) as f64;
    if !value.is_finite() {
        return Err(CoreError::NonFinite { op: OP, value });
    }
    Ok(value)
}

/// dpred = d(mean loss) / d pred (overwritten).
pub fn loss_backward<T: Real>(
    loss: Loss, dpred: &mut [T], pred: &[T], target: &[T], rows: usize, cols: usize,
) -> Result<()> {
    const OP: &str = "loss_backward";
    let n = check_loss(OP, pred.len(), target.len(), Some(("dpred", dpred.len())), rows, cols)?;
    if rows == 0 {
        return Ok(());
    }
    let inv = T::ONE / T::from_usize(loss.divisor(rows, cols));
    let eps = T::from_f64(GRAD_EPS);
    for i in 0..n {
        let (p, y) = (pred[i], target[i]);
        dpred[i] = inv
            * match loss {
                Loss::MeanSquaredError => (T::ONE + T::ONE) * (p - y),
                Loss::BinaryCrossEntropy => (p - y) / (p * (T::ONE - p)).max(eps),
                Loss::CategoricalCrossEntropy => -y / p.max(eps),
            };
    }
    Ok(())
}

/// The fused gradient with respect to the logits for a pairing where
/// [`Loss::fuses_with`] holds: `dlogits = (pred - target) / divisor`. `pred` is the output
/// of the softmax or sigmoid.
pub fn fused_output_backward<T: Real>(
    loss: Loss, dlogits: &mut [T], pred: &[T], target: &[T], rows: usize, cols: usize,
) -> Result<()> {
    const OP: &str = "fused_output_backward";
    let n = check_loss(OP, pred.len(), target.len(), Some(("dlogits", dlogits.len())), rows, cols)?;
    if rows == 0 {
        return Ok(());
    }
    let inv = T::ONE / T::from_usize(loss.divisor(rows, cols));
    for i in 0..n {
        dlogits[i] = (pred[i] - target[i]) * inv;
    }
    Ok(())
}

/// The dense networks' losses: see [`crate::ops::loss`].
pub trait LossOps: Memory {
    /// The mean loss of `rows x cols` predictions against their targets, on the host.
    fn loss_forward(
        &self, loss: Loss, pred: &Self::Buffer, target: &Self::Buffer, rows: usize, cols: usize,
    ) -> Result<f64>;
    /// The gradient of the mean loss with respect to the predictions (overwrites `dpred`).
    fn loss_backward(
        &self, loss: Loss, dpred: &mut Self::Buffer, pred: &Self::Buffer, target: &Self::Buffer, rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// Softmax + categorical cross-entropy or sigmoid + binary cross-entropy back to the logits at once: `(pred - target) / rows`, stable where the two steps apart would saturate.
    fn fused_output_backward(
        &self, loss: Loss, dlogits: &mut Self::Buffer, pred: &Self::Buffer, target: &Self::Buffer,
        rows: usize, cols: usize,
    ) -> Result<()>;
}

impl LossOps for ReferenceBackend {
    fn loss_forward(
        &self, l: Loss, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<f64> {
        loss_forward(l, &wide(pred), &wide(target), rows, cols)
    }
    fn loss_backward(
        &self, l: Loss, dpred: &mut Vec<f32>, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        in_f64([dpred], |[d]| loss_backward(l, d, &wide(pred), &wide(target), rows, cols))
    }
    fn fused_output_backward(
        &self, l: Loss, dlogits: &mut Vec<f32>, pred: &Vec<f32>, target: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        in_f64([dlogits], |[d]| fused_output_backward(l, d, &wide(pred), &wide(target), rows, cols))
    }
}
