//! AdamW and SGD updates on CUDA (`kernels/cu/optim.cu`); twins in
//! `rusting_brain_core::ops::optim`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::AdamParams;
use rusting_brain_core::backend::OptimOps;
use rusting_brain_core::backend::SgdParams;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/optim.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) = ("optim", &["adam_update", "sgd_update"]);

pub(super) fn adam_update(
    be: &CudaBackend, param: &mut CudaBuffer, grad: &CudaBuffer, m: &mut CudaBuffer, v: &mut CudaBuffer,
    hp: &AdamParams, step: u64,
) -> Result<()> {
    ops::optim::check_adam(param.len, grad.len, m.len, v.len, hp, step)?;
    let n = param.len;
    if n == 0 {
        return Ok(());
    }
    let c = ops::optim::AdamConstants::<f32>::new(hp, step);
    launch!(be, "adam_update", grid(n);
        &mut param.data, &grad.data, &mut m.data, &mut v.data, &(n as i64),
        &hp.lr, &hp.beta1, &hp.beta2, &c.one_minus_beta1, &c.one_minus_beta2, &hp.eps,
        &hp.weight_decay, &(hp.decoupled as i32), &hp.grad_scale, &0u64, &c.step_size, &c.bias_correction2_sqrt)
}

pub(super) fn sgd_update(
    be: &CudaBackend, param: &mut CudaBuffer, grad: &CudaBuffer, velocity: Option<&mut CudaBuffer>,
    hp: &SgdParams,
) -> Result<()> {
    ops::optim::check_sgd(param.len, grad.len, velocity.as_ref().map(|v| v.len), hp)?;
    let n = param.len;
    if n == 0 {
        return Ok(());
    }
    let nesterov = hp.nesterov as i32;
    match velocity {
        Some(vel) => launch!(be, "sgd_update", grid(n);
            &mut param.data, &grad.data, &mut vel.data, &(n as i64), &hp.lr, &hp.momentum,
            &hp.weight_decay, &hp.grad_scale, &nesterov),
        None => launch!(be, "sgd_update", grid(n);
            &mut param.data, &grad.data, &0u64, &(n as i64), &hp.lr, &hp.momentum,
            &hp.weight_decay, &hp.grad_scale, &nesterov),
    }
}

impl OptimOps for CudaBackend {
    fn adam_update(
        &self, param: &mut CudaBuffer, grad: &CudaBuffer, m: &mut CudaBuffer, v: &mut CudaBuffer,
        hp: &AdamParams, step: u64,
    ) -> Result<()> {
        adam_update(self, param, grad, m, v, hp, step)
    }
    fn sgd_update(
        &self, param: &mut CudaBuffer, grad: &CudaBuffer, velocity: Option<&mut CudaBuffer>, hp: &SgdParams,
    ) -> Result<()> {
        sgd_update(self, param, grad, velocity, hp)
    }
}
