//! Row-wise softmax on the CPU: rows in parallel, vectorized max / exp / sum.
//! Twin of `rusting_brain_core::ops::softmax`.

use rayon::prelude::*;
use rusting_brain_core::ops::softmax::{check_softmax_backward, check_softmax_forward};
use rusting_brain_core::Result;

use super::{rows_per_task, simd};
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::SoftmaxOps;

/// One row: out = softmax(x). Shared with attention and the losses.
pub fn softmax_row(out: &mut [f32], x: &[f32]) {
    let max = simd::max(x);
    out.copy_from_slice(x);
    let sum = simd::exp_sub_sum(out, max);
    simd::scale(out, 1.0 / sum);
}

pub fn softmax_forward(out: &mut [f32], inp: &[f32], rows: usize, cols: usize) -> Result<()> {
    check_softmax_forward(out.len(), inp.len(), rows, cols)?;
    let per = rows_per_task(cols) * cols;
    out.par_chunks_mut(per).zip(inp.par_chunks(per)).for_each(|(o, x)| {
        for (o, x) in o.chunks_exact_mut(cols).zip(x.chunks_exact(cols)) {
            softmax_row(o, x);
        }
    });
    Ok(())
}

pub fn softmax_backward(dinp: &mut [f32], dout: &[f32], out: &[f32], rows: usize, cols: usize) -> Result<()> {
    check_softmax_backward(dinp.len(), dout.len(), out.len(), rows, cols)?;
    let per = rows_per_task(cols) * cols;
    dinp.par_chunks_mut(per).zip(dout.par_chunks(per)).zip(out.par_chunks(per)).for_each(|((dx, dy), y)| {
        for ((dx, dy), y) in dx.chunks_exact_mut(cols).zip(dy.chunks_exact(cols)).zip(y.chunks_exact(cols)) {
            let dot = simd::dot(dy, y);
            for i in 0..cols {
                dx[i] = y[i] * (dy[i] - dot);
            }
        }
    });
    Ok(())
}

impl SoftmaxOps for CpuBackend {
    fn softmax_forward(&self, out: &mut Vec<f32>, inp: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        softmax_forward(out, inp, rows, cols)
    }
    fn softmax_backward(
        &self, dinp: &mut Vec<f32>, dout: &Vec<f32>, out: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        softmax_backward(dinp, dout, out, rows, cols)
    }
}
