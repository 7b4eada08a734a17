//! Optimizer updates on the CPU: element-wise in parallel, each element through the very
//! function the reference uses (`adam_element`), so results match it bit for bit.
//! Twin of `rusting_brain_core::ops::optim`.

use rayon::prelude::*;
use rusting_brain_core::ops::optim::{check_adam, check_sgd, sgd_span, AdamConstants, AdamParams, SgdParams};
use rusting_brain_core::Result;

use super::{simd, ELEMENTS_PER_TASK};
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::OptimOps;

impl OptimOps for CpuBackend {
    fn adam_update(
        &self, param: &mut Vec<f32>, grad: &Vec<f32>, m: &mut Vec<f32>, v: &mut Vec<f32>, hp: &AdamParams,
        step: u64,
    ) -> Result<()> {
        check_adam(param.len(), grad.len(), m.len(), v.len(), hp, step)?;
        let c = AdamConstants::<f32>::new(hp, step);
        let e = ELEMENTS_PER_TASK;
        param
            .par_chunks_mut(e)
            .zip(grad.par_chunks(e))
            .zip(m.par_chunks_mut(e))
            .zip(v.par_chunks_mut(e))
            .for_each(|(((p, g), m), v)| simd::adam(p, g, m, v, &c));
        Ok(())
    }
    fn sgd_update(
        &self, param: &mut Vec<f32>, grad: &Vec<f32>, velocity: Option<&mut Vec<f32>>, hp: &SgdParams,
    ) -> Result<()> {
        let velocity = velocity.map(|v| v.as_mut_slice());
        check_sgd(param.len(), grad.len(), velocity.as_ref().map(|v| v.len()), hp)?;
        let e = ELEMENTS_PER_TASK;
        match velocity {
            None => {
                param.par_chunks_mut(e).zip(grad.par_chunks(e)).for_each(|(p, g)| sgd_span(p, g, None, hp))
            }
            Some(buf) => param
                .par_chunks_mut(e)
                .zip(grad.par_chunks(e))
                .zip(buf.par_chunks_mut(e))
                .for_each(|((p, g), b)| sgd_span(p, g, Some(b), hp)),
        }
        Ok(())
    }
}
