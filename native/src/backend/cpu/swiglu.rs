//! SwiGLU on the CPU: element-wise in parallel with a vectorized exp.
//! Twin of `rusting_brain_core::ops::swiglu`.

use rayon::prelude::*;
use rusting_brain_core::ops::swiglu::{check_swiglu_backward, check_swiglu_forward};
use rusting_brain_core::Result;

use super::{simd, team, ELEMENTS_PER_TASK};
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::SwigluOps;

pub fn swiglu_forward(out: &mut [f32], gate: &[f32], up: &[f32]) -> Result<()> {
    check_swiglu_forward(out.len(), gate.len(), up.len())?;
    // One band per part of the spinning team: a prompt's activations (a few hundred
    // thousand values) take tens of microseconds, what waking rayon's workers can cost.
    team::bands(out, 16, ELEMENTS_PER_TASK, |first, o| {
        let end = first + o.len();
        simd::swiglu(o, &gate[first..end], &up[first..end])
    });
    Ok(())
}

pub fn swiglu_backward(
    dgate: &mut [f32], dup: &mut [f32], dout: &[f32], gate: &[f32], up: &[f32],
) -> Result<()> {
    check_swiglu_backward(dgate.len(), dup.len(), dout.len(), gate.len(), up.len())?;
    let c = ELEMENTS_PER_TASK;
    dgate
        .par_chunks_mut(c)
        .zip(dup.par_chunks_mut(c))
        .zip(dout.par_chunks(c))
        .zip(gate.par_chunks(c))
        .zip(up.par_chunks(c))
        .for_each(|((((dg, du), dy), g), u)| simd::swiglu_backward(dg, du, dy, g, u));
    Ok(())
}

impl SwigluOps for CpuBackend {
    fn swiglu_forward(&self, out: &mut Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>) -> Result<()> {
        swiglu_forward(out, gate, up)
    }
    fn swiglu_backward(
        &self, dgate: &mut Vec<f32>, dup: &mut Vec<f32>, dout: &Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>,
    ) -> Result<()> {
        swiglu_backward(dgate, dup, dout, gate, up)
    }
}
