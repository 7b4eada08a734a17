//! Row-wise softmax, stabilised by subtracting the row maximum.

use crate::backend::Memory;
use crate::error::check_rows;
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{Real, Result};
use alloc::vec::Vec;

/// The forward's shape check, which every backend calls: `inp` and `out` hold `rows x cols`.
pub fn check_softmax_forward(out: usize, inp: usize, rows: usize, cols: usize) -> Result<()> {
    check_rows("softmax_forward", rows, cols, &[("inp", inp), ("out", out)]).map(drop)
}

/// The backward's shape check, which every backend calls: `dinp`, `dout` and the forward's
/// `out` each hold `rows x cols`.
pub fn check_softmax_backward(dinp: usize, dout: usize, out: usize, rows: usize, cols: usize) -> Result<()> {
    check_rows("softmax_backward", rows, cols, &[("dinp", dinp), ("dout", dout), ("out", out)]).map(drop)
}

/// out, inp: (rows, cols). A row of all `-inf` gives NaN (0/0), as in PyTorch.
pub fn softmax_forward<T: Real>(out: &mut [T], inp: &[T], rows: usize, cols: usize) -> Result<()> {
    check_softmax_forward(out.len(), inp.len(), rows, cols)?;
    for r in 0..rows {
        softmax_row(&mut out[r * cols..(r + 1) * cols], &inp[r * cols..(r + 1) * cols]);
    }
    Ok(())
}

/// One row of softmax; shared with the losses and attention.
pub fn softmax_row<T: Real>(out: &mut [T], x: &[T]) {
    let mut max = T::NEG_INFINITY;
    for &v in x {
        // `v != v` keeps a NaN input visible instead of silently dropping it.
        #[allow(clippy::eq_op)]
        if v > max || v != v {
            max = v;
        }
    }
    let mut sum = T::ZERO;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max).exp();
        sum += *o;
    }
    let inv = T::ONE / sum;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// dinp = out * (dout - sum(dout * out)), per row. `out` is the forward result.
pub fn softmax_backward<T: Real>(
    dinp: &mut [T], dout: &[T], out: &[T], rows: usize, cols: usize,
) -> Result<()> {
    check_softmax_backward(dinp.len(), dout.len(), out.len(), rows, cols)?;
    for r in 0..rows {
        let y = &out[r * cols..(r + 1) * cols];
        let dy = &dout[r * cols..(r + 1) * cols];
        let mut dot = T::ZERO;
        for i in 0..cols {
            dot += dy[i] * y[i];
        }
        for i in 0..cols {
            dinp[r * cols + i] = y[i] * (dy[i] - dot);
        }
    }
    Ok(())
}

/// Row-wise softmax, forward and backward: see [`crate::ops::softmax`].
pub trait SoftmaxOps: Memory {
    /// Softmax over each row of `cols`.
    fn softmax_forward(
        &self, out: &mut Self::Buffer, inp: &Self::Buffer, rows: usize, cols: usize,
    ) -> Result<()>;
    /// Softmax's backward from its output (overwrites `dinp`).
    fn softmax_backward(
        &self, dinp: &mut Self::Buffer, dout: &Self::Buffer, out: &Self::Buffer, rows: usize, cols: usize,
    ) -> Result<()>;
}

impl SoftmaxOps for ReferenceBackend {
    fn softmax_forward(&self, out: &mut Vec<f32>, inp: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        in_f64([out], |[o]| softmax_forward(o, &wide(inp), rows, cols))
    }
    fn softmax_backward(
        &self, dinp: &mut Vec<f32>, dout: &Vec<f32>, out: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        in_f64([dinp], |[d]| softmax_backward(d, &wide(dout), &wide(out), rows, cols))
    }
}
