//! Optimizer updates, element-wise over a parameter buffer and its gradient. The formulas
//! follow PyTorch's `torch.optim.Adam`/`AdamW`/`SGD` (single-tensor path) term by term, so
//! f32 results agree to rounding.

use crate::backend::Memory;
use crate::error::check_len;
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};
use alloc::vec::Vec;

/// Adam hyper-parameters. `decoupled = true` is AdamW (decay applied to the weights,
/// `p *= 1 - lr * weight_decay`); `false` is Adam with L2 (`g += weight_decay * p`).
/// `grad_scale` multiplies every gradient first (micro-batch averaging, clipping).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamParams {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first moment's running mean.
    pub beta1: f32,
    /// Decay of the second moment's running mean.
    pub beta2: f32,
    /// Added to the second moment's square root.
    pub eps: f32,
    /// Weight decay.
    pub weight_decay: f32,
    /// AdamW's decoupled decay (`true`) or an L2 term in the gradient.
    pub decoupled: bool,
    /// Multiplies every gradient before the update.
    pub grad_scale: f32,
}

impl Default for AdamParams {
    /// PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay.
    fn default() -> Self {
        AdamParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: true,
            grad_scale: 1.0,
        }
    }
}

fn invalid(op: &'static str, message: alloc::string::String) -> CoreError {
    CoreError::InvalidArgument { op, message }
}

impl AdamParams {
    /// Checks the settings (finite, in range), naming the bad one.
    pub fn validate(&self, op: &'static str) -> Result<()> {
        let ok = |x: f32| x.is_finite() && x >= 0.0;
        if !ok(self.lr) {
            return Err(invalid(
                op,
                alloc::format!("learning rate must be finite and >= 0, got {}", self.lr),
            ));
        }
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(ok(b) && b < 1.0) {
                return Err(invalid(op, alloc::format!("{name} must be in [0, 1), got {b}")));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(invalid(op, alloc::format!("eps must be finite and > 0, got {}", self.eps)));
        }
        if !ok(self.weight_decay) {
            return Err(invalid(
                op,
                alloc::format!("weight decay must be finite and >= 0, got {}", self.weight_decay),
            ));
        }
        if !self.grad_scale.is_finite() {
            return Err(invalid(
                op,
                alloc::format!("gradient scale must be finite, got {}", self.grad_scale),
            ));
        }
        Ok(())
    }
}

/// The contract of `adam_update`, shared by every backend: valid hyper-parameters, a step
/// count from 1, and `grad`, `m`, `v` as long as `param`.
pub fn check_adam(param: usize, grad: usize, m: usize, v: usize, hp: &AdamParams, step: u64) -> Result<()> {
    const OP: &str = "adam_update";
    hp.validate(OP)?;
    if step == 0 {
        return Err(invalid(OP, "the step count starts at 1".into()));
    }
    check_len(OP, "grad", grad, param)?;
    check_len(OP, "m", m, param)?;
    check_len(OP, "v", v, param)
}

/// The contract of `sgd_update`: valid hyper-parameters, `grad` (and the velocity, which
/// momentum requires) as long as `param`.
pub fn check_sgd(param: usize, grad: usize, velocity: Option<usize>, hp: &SgdParams) -> Result<()> {
    const OP: &str = "sgd_update";
    hp.validate(OP)?;
    check_len(OP, "grad", grad, param)?;
    match velocity {
        None if hp.momentum != 0.0 => Err(invalid(OP, "momentum > 0 needs a velocity buffer".into())),
        None => Ok(()),
        Some(len) => check_len(OP, "velocity", len, param),
    }
}

/// One Adam/AdamW step at `step` (1 for the first update), in place on `param`, `m`, `v`.
pub fn adam_update<T: Real>(
    param: &mut [T], grad: &[T], m: &mut [T], v: &mut [T], hp: &AdamParams, step: u64,
) -> Result<()> {
    check_adam(param.len(), grad.len(), m.len(), v.len(), hp, step)?;
    let c = AdamConstants::<T>::new(hp, step);
    for i in 0..param.len() {
        adam_element(&mut param[i], grad[i], &mut m[i], &mut v[i], &c);
    }
    Ok(())
}

/// The per-step scalars of Adam, computed once per step (in f64, then rounded to T).
#[derive(Debug, Clone, Copy)]
pub struct AdamConstants<T> {
    /// Learning rate.
    pub lr: T,
    /// First moment's decay.
    pub beta1: T,
    /// Second moment's decay.
    pub beta2: T,
    /// `1 - beta1`.
    pub one_minus_beta1: T,
    /// `1 - beta2`.
    pub one_minus_beta2: T,
    /// Epsilon.
    pub eps: T,
    /// Weight decay.
    pub weight_decay: T,
    /// Decoupled decay (AdamW).
    pub decoupled: bool,
    /// The gradients' multiplier.
    pub grad_scale: T,
    /// lr / (1 - beta1^t)
    pub step_size: T,
    /// sqrt(1 - beta2^t)
    pub bias_correction2_sqrt: T,
}

impl<T: Real> AdamConstants<T> {
    /// The constants of step `step` (counted from 1) of `hp`.
    pub fn new(hp: &AdamParams, step: u64) -> AdamConstants<T> {
        let t = step.min(i32::MAX as u64) as i32;
        let bc1 = 1.0 - libm::pow(hp.beta1 as f64, t as f64);
        let bc2 = 1.0 - libm::pow(hp.beta2 as f64, t as f64);
        AdamConstants {
            lr: T::from_f32(hp.lr),
            beta1: T::from_f32(hp.beta1),
            beta2: T::from_f32(hp.beta2),
            one_minus_beta1: T::from_f32(1.0 - hp.beta1),
            one_minus_beta2: T::from_f32(1.0 - hp.beta2),
            eps: T::from_f32(hp.eps),
            weight_decay: T::from_f32(hp.weight_decay),
            decoupled: hp.decoupled,
            grad_scale: T::from_f32(hp.grad_scale),
            step_size: T::from_f64(hp.lr as f64 / bc1),
            bias_correction2_sqrt: T::from_f64(libm::sqrt(bc2)),
        }
    }
}

/// One element of Adam: shared by the reference and the CPU backend so both round alike.
#[inline(always)]
pub fn adam_element<T: Real>(p: &mut T, g: T, m: &mut T, v: &mut T, c: &AdamConstants<T>) {
    let mut g = g * c.grad_scale;
    if c.decoupled {
        *p *= T::ONE - c.lr * c.weight_decay;
    } else {
        g += c.weight_decay * *p;
    }
    *m = c.beta1 * *m + c.one_minus_beta1 * g;
    *v = c.beta2 * *v + c.one_minus_beta2 * g * g;
    let denom = v.sqrt() / c.bias_correction2_sqrt + c.eps;
    *p -= c.step_size * *m / denom;
}

/// SGD hyper-parameters, PyTorch semantics (no dampening): with momentum `mu`,
/// `buf = mu * buf + g`, and the step uses `buf` (or `g + mu * buf` when `nesterov`).
/// Weight decay is L2: `g += weight_decay * p`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdParams {
    /// Learning rate.
    pub lr: f32,
    /// Momentum `mu` (0: none).
    pub momentum: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// L2 weight decay.
    pub weight_decay: f32,
    /// Multiplies every gradient before the update.
    pub grad_scale: f32,
}

impl SgdParams {
    /// Plain SGD at `lr`.
    pub fn new(lr: f32) -> Self {
        SgdParams { lr, momentum: 0.0, nesterov: false, weight_decay: 0.0, grad_scale: 1.0 }
    }
    /// Checks the settings (finite, non-negative), naming the bad one.
    pub fn validate(&self, op: &'static str) -> Result<()> {
        let ok = |x: f32| x.is_finite() && x >= 0.0;
        if !ok(self.lr) || !ok(self.momentum) || !ok(self.weight_decay) || !self.grad_scale.is_finite() {
            return Err(invalid(
                op,
                alloc::format!("SGD needs finite lr, momentum, weight decay >= 0 and a finite gradient scale, got {self:?}"),
            ));
        }
        Ok(())
    }
}

/// One SGD step. `velocity` is required when `momentum > 0` (zero-initialised by the caller).
pub fn sgd_update<T: Real>(
    param: &mut [T], grad: &[T], velocity: Option<&mut [T]>, hp: &SgdParams,
) -> Result<()> {
    check_sgd(param.len(), grad.len(), velocity.as_ref().map(|v| v.len()), hp)?;
    sgd_span(param, grad, velocity, hp);
    Ok(())
}

/// The SGD step over one span of elements, lengths already checked by [`check_sgd`]: the
/// reference runs it over the whole tensor, the CPU backend over each parallel chunk, so
/// both give the same bits.
pub fn sgd_span<T: Real>(param: &mut [T], grad: &[T], velocity: Option<&mut [T]>, hp: &SgdParams) {
    let lr = T::from_f32(hp.lr);
    let mu = T::from_f32(hp.momentum);
    let wd = T::from_f32(hp.weight_decay);
    let scale = T::from_f32(hp.grad_scale);
    match velocity {
        None => {
            for (p, &g) in param.iter_mut().zip(grad) {
                let g = g * scale + wd * *p;
                *p -= lr * g;
            }
        }
        Some(buf) => {
            for ((p, &g), b) in param.iter_mut().zip(grad).zip(buf) {
                let g = g * scale + wd * *p;
                *b = mu * *b + g;
                let d = if hp.nesterov { g + mu * *b } else { *b };
                *p -= lr * d;
            }
        }
    }
}

/// Optimizer steps: see [`crate::ops::optim`].
pub trait OptimOps: Memory {
    /// One Adam(W) step (`step` counted from 1) of `param` with `grad`, the moments `m`, `v` updated in place.
    fn adam_update(
        &self, param: &mut Self::Buffer, grad: &Self::Buffer, m: &mut Self::Buffer, v: &mut Self::Buffer,
        hp: &AdamParams, step: u64,
    ) -> Result<()>;
    /// One SGD step of `param` with `grad`, the momentum buffer updated when there is one.
    fn sgd_update(
        &self, param: &mut Self::Buffer, grad: &Self::Buffer, velocity: Option<&mut Self::Buffer>,
        hp: &SgdParams,
    ) -> Result<()>;
}

impl OptimOps for ReferenceBackend {
    fn adam_update(
        &self, param: &mut Vec<f32>, grad: &Vec<f32>, m: &mut Vec<f32>, v: &mut Vec<f32>, hp: &AdamParams,
        step: u64,
    ) -> Result<()> {
        adam_update(param, grad, m, v, hp, step)
    }
    fn sgd_update(
        &self, param: &mut Vec<f32>, grad: &Vec<f32>, velocity: Option<&mut Vec<f32>>, hp: &SgdParams,
    ) -> Result<()> {
        sgd_update(param, grad, velocity.map(|v| v.as_mut_slice()), hp)
    }
}
