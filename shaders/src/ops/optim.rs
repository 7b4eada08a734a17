//! The optim family on this backend.

use crate::backend::unsupported;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::AdamParams;
use rusting_brain_core::backend::OptimOps;
use rusting_brain_core::backend::SgdParams;
use rusting_brain_core::ops::optim::check_adam;
use rusting_brain_core::ops::optim::check_sgd;
use rusting_brain_core::ops::optim::AdamConstants;
use rusting_brain_core::Result;

impl OptimOps for WgpuBackend {
    fn adam_update(
        &self, param: &mut GpuBuffer, grad: &GpuBuffer, m: &mut GpuBuffer, v: &mut GpuBuffer,
        hp: &AdamParams, step: u64,
    ) -> Result<()> {
        check_adam(param.len(), grad.len(), m.len(), v.len(), hp, step)?;
        let c = AdamConstants::<f32>::new(hp, step);
        let words = [
            0,
            u32::try_from(param.len()).map_err(|_| unsupported("a parameter over 2^32 values"))?,
            c.decoupled as u32,
            0,
            c.lr.to_bits(),
            c.beta1.to_bits(),
            c.beta2.to_bits(),
            c.one_minus_beta1.to_bits(),
            c.one_minus_beta2.to_bits(),
            c.eps.to_bits(),
            c.weight_decay.to_bits(),
            c.grad_scale.to_bits(),
            c.step_size.to_bits(),
            c.bias_correction2_sqrt.to_bits(),
            0,
            0,
        ];
        self.record(|b, _| b.optim(&words, param, grad, Some(m), Some(v)))
    }
    fn sgd_update(
        &self, param: &mut GpuBuffer, grad: &GpuBuffer, velocity: Option<&mut GpuBuffer>, hp: &SgdParams,
    ) -> Result<()> {
        check_sgd(param.len(), grad.len(), velocity.as_ref().map(|v| v.len()), hp)?;
        let momentum = if velocity.is_some() { hp.momentum } else { 0.0 };
        let words = [
            1,
            u32::try_from(param.len()).map_err(|_| unsupported("a parameter over 2^32 values"))?,
            0,
            hp.nesterov as u32,
            hp.lr.to_bits(),
            0,
            0,
            0,
            0,
            0,
            hp.weight_decay.to_bits(),
            hp.grad_scale.to_bits(),
            0,
            0,
            momentum.to_bits(),
            0,
        ];
        let vel = velocity.map(|v| &*v);
        self.record(|b, _| b.optim(&words, param, grad, vel, None))
    }
}
