//! Optimizer updates on the CPU: element-wise in parallel, each element through the very
//! function the reference uses (`adam_element`), so results match it bit for bit.
//! Twin of `rusting_brain_core::ops::optim`.

use rayon::prelude::*;
use rusting_brain_core::error::check_len;
use rusting_brain_core::ops::optim::{adam_element, AdamConstants, AdamParams, SgdParams};
use rusting_brain_core::{CoreError, Result};

use super::ELEMENTS_PER_TASK;

pub fn adam_update(
    param: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    hp: &AdamParams,
    step: u64,
) -> Result<()> {
    const OP: &str = "adam_update";
    hp.validate(OP)?;
    if step == 0 {
        return Err(CoreError::InvalidArgument {
            op: OP,
            message: "the step count starts at 1".into(),
        });
    }
    let n = param.len();
    check_len(OP, "grad", grad.len(), n)?;
    check_len(OP, "m", m.len(), n)?;
    check_len(OP, "v", v.len(), n)?;
    let c = AdamConstants::<f32>::new(hp, step);
    let e = ELEMENTS_PER_TASK;
    param
        .par_chunks_mut(e)
        .zip(grad.par_chunks(e))
        .zip(m.par_chunks_mut(e))
        .zip(v.par_chunks_mut(e))
        .for_each(|(((p, g), m), v)| {
            for i in 0..p.len() {
                adam_element(&mut p[i], g[i], &mut m[i], &mut v[i], &c);
            }
        });
    Ok(())
}

pub fn sgd_update(
    param: &mut [f32],
    grad: &[f32],
    velocity: Option<&mut [f32]>,
    hp: &SgdParams,
) -> Result<()> {
    const OP: &str = "sgd_update";
    hp.validate(OP)?;
    let n = param.len();
    check_len(OP, "grad", grad.len(), n)?;
    let (lr, mu, wd, s) = (hp.lr, hp.momentum, hp.weight_decay, hp.grad_scale);
    let e = ELEMENTS_PER_TASK;
    match velocity {
        None if hp.momentum != 0.0 => Err(CoreError::InvalidArgument {
            op: OP,
            message: "momentum > 0 needs a velocity buffer".into(),
        }),
        None => {
            param
                .par_chunks_mut(e)
                .zip(grad.par_chunks(e))
                .for_each(|(p, g)| {
                    for i in 0..p.len() {
                        let gi = g[i] * s + wd * p[i];
                        p[i] -= lr * gi;
                    }
                });
            Ok(())
        }
        Some(buf) => {
            check_len(OP, "velocity", buf.len(), n)?;
            param
                .par_chunks_mut(e)
                .zip(grad.par_chunks(e))
                .zip(buf.par_chunks_mut(e))
                .for_each(|((p, g), b)| {
                    for i in 0..p.len() {
                        let gi = g[i] * s + wd * p[i];
                        b[i] = mu * b[i] + gi;
                        let d = if hp.nesterov { gi + mu * b[i] } else { b[i] };
                        p[i] -= lr * d;
                    }
                });
            Ok(())
        }
    }
}
