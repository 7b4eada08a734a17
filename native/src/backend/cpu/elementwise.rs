//! Element-wise helpers on the CPU. Twin of `rusting_brain_core::ops::elementwise` and
//! `ops::l2norm`.

use rayon::prelude::*;
use rusting_brain_core::error::check_len;
use rusting_brain_core::ops::elementwise::check_bias;
use rusting_brain_core::ops::unary::Unary;
use rusting_brain_core::Result;

use super::{rows_per_task, simd, ELEMENTS_PER_TASK};
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::ElementwiseOps;

/// Per-chunk f32 SIMD sums promoted to f64 and added in chunk order: deterministic, and
/// the f32 part only ever sums `ELEMENTS_PER_TASK` terms.
pub fn sum_of_squares(x: &[f32]) -> f64 {
    let partials: Vec<f64> = x.par_chunks(ELEMENTS_PER_TASK).map(|c| simd::sum_sq(c) as f64).collect();
    partials.iter().sum()
}

/// Twin of `rusting_brain_core::ops::unary::unary`.
pub fn unary(op: Unary, out: &mut [f32], inp: &[f32]) -> Result<()> {
    check_len("unary", "out", out.len(), inp.len())?;
    out.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(inp.par_chunks(ELEMENTS_PER_TASK))
        .for_each(|(o, x)| simd::unary(o, x, op));
    Ok(())
}

/// Twin of `rusting_brain_core::ops::unary::gated`.
pub fn gated(op: Unary, out: &mut [f32], gate: &[f32], up: &[f32]) -> Result<()> {
    check_len("gated", "gate", gate.len(), out.len())?;
    check_len("gated", "up", up.len(), out.len())?;
    out.par_chunks_mut(ELEMENTS_PER_TASK)
        .zip(gate.par_chunks(ELEMENTS_PER_TASK))
        .zip(up.par_chunks(ELEMENTS_PER_TASK))
        .for_each(|((o, g), u)| {
            simd::unary(o, g, op);
            for (o, &u) in o.iter_mut().zip(u) {
                *o *= u;
            }
        });
    Ok(())
}

impl ElementwiseOps for CpuBackend {
    fn axpy(&self, y: &mut Vec<f32>, alpha: f32, x: &Vec<f32>) -> Result<()> {
        check_len("axpy", "x", x.len(), y.len())?;
        y.par_chunks_mut(ELEMENTS_PER_TASK)
            .zip(x.par_chunks(ELEMENTS_PER_TASK))
            .for_each(|(y, x)| simd::axpy(y, alpha, x));
        Ok(())
    }
    fn scale(&self, x: &mut Vec<f32>, alpha: f32) -> Result<()> {
        x.par_chunks_mut(ELEMENTS_PER_TASK).for_each(|x| simd::scale(x, alpha));
        Ok(())
    }
    fn add_bias(&self, out: &mut Vec<f32>, bias: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        check_bias("add_bias", ["out", "bias"], out.len(), bias.len(), rows, cols)?;
        out.par_chunks_mut(rows_per_task(cols) * cols).for_each(|block| {
            for row in block.chunks_exact_mut(cols) {
                simd::axpy(row, 1.0, bias);
            }
        });
        Ok(())
    }
    /// Per-block f32 partial sums added in block order: deterministic whatever the threads.
    fn bias_backward(&self, dbias: &mut Vec<f32>, dout: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        check_bias("bias_backward", ["dout", "dbias"], dout.len(), dbias.len(), rows, cols)?;
        let partials: Vec<Vec<f32>> = dout
            .par_chunks(rows_per_task(cols) * cols)
            .map(|block| {
                let mut acc = vec![0.0f32; cols];
                for row in block.chunks_exact(cols) {
                    simd::axpy(&mut acc, 1.0, row);
                }
                acc
            })
            .collect();
        for p in &partials {
            simd::axpy(dbias, 1.0, p);
        }
        Ok(())
    }
}
