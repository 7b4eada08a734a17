//! SwiGLU on the CPU: element-wise in parallel with a vectorized exp.
//! Twin of `rusting_brain_core::ops::swiglu`.

use rayon::prelude::*;
use rusting_brain_core::ops::swiglu::{check_swiglu_backward, check_swiglu_forward};
use rusting_brain_core::Result;

use super::{simd, ELEMENTS_PER_TASK};

pub fn swiglu_forward(out: &mut [f32], gate: &[f32], up: &[f32]) -> Result<()> {
    check_swiglu_forward(out.len(), gate.len(), up.len())?;
    out.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(gate.par_chunks(ELEMENTS_PER_TASK))
        .zip(up.par_chunks(ELEMENTS_PER_TASK))
        .for_each(|((o, g), u)| simd::swiglu(o, g, u));
    Ok(())
}

pub fn swiglu_backward(
    dgate: &mut [f32],
    dup: &mut [f32],
    dout: &[f32],
    gate: &[f32],
    up: &[f32],
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
