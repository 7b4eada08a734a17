//! The optim family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::AdamParams;
use rusting_brain_core::backend::OptimOps;
use rusting_brain_core::backend::SgdParams;
use rusting_brain_core::ops::optim;
use rusting_brain_core::Result;

impl OptimOps for PortableBackend {
    fn adam_update(
        &self, param: &mut Vec<f32>, grad: &Vec<f32>, m: &mut Vec<f32>, v: &mut Vec<f32>, hp: &AdamParams,
        step: u64,
    ) -> Result<()> {
        optim::adam_update(param, grad, m, v, hp, step)
    }
    fn sgd_update(
        &self, param: &mut Vec<f32>, grad: &Vec<f32>, velocity: Option<&mut Vec<f32>>, hp: &SgdParams,
    ) -> Result<()> {
        optim::sgd_update(param, grad, velocity.map(|v| v.as_mut_slice()), hp)
    }
}
