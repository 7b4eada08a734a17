//! The activation family on the CPU: the reference functions run on blocks of rows in
//! parallel (they are element- or row-wise, so a block is a valid problem of its own).
//! Twin of `rusting_brain_core::ops::activation`.

use rayon::prelude::*;
use rusting_brain_core::backend::ActivationOps;
use rusting_brain_core::ops::activation as act_ref;
use rusting_brain_core::ops::activation::{check_activation_backward, check_activation_forward};
use rusting_brain_core::{Activation, Result};

use super::rows_per_task;
use crate::backend::cpu::CpuBackend;

impl ActivationOps for CpuBackend {
    fn activation_forward(
        &self, act: Activation, out: &mut Vec<f32>, inp: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        check_activation_forward(out.len(), inp.len(), rows, cols)?;
        let per = rows_per_task(cols) * cols;
        out.par_chunks_mut(per)
            .zip(inp.par_chunks(per))
            .try_for_each(|(o, x)| act_ref::activation_forward(act, o, x, x.len() / cols, cols))
    }
    fn activation_backward(
        &self, act: Activation, dinp: &mut Vec<f32>, dout: &Vec<f32>, inp: &Vec<f32>, out: &Vec<f32>,
        rows: usize, cols: usize,
    ) -> Result<()> {
        check_activation_backward(dinp.len(), dout.len(), inp.len(), out.len(), rows, cols)?;
        let per = rows_per_task(cols) * cols;
        dinp.par_chunks_mut(per)
            .zip(dout.par_chunks(per))
            .zip(inp.par_chunks(per).zip(out.par_chunks(per)))
            .try_for_each(|((dx, dy), (x, y))| {
                act_ref::activation_backward(act, dx, dy, x, y, x.len() / cols, cols)
            })
    }
}
