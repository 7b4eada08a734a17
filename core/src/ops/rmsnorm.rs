//! RMSNorm: `out = x / sqrt(mean(x^2) + eps) * weight`, over the last dimension.

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{Real, Result};
use alloc::vec::Vec;

/// The shape contract of `rmsnorm_forward`, shared by every backend (buffer lengths).
pub fn check_rmsnorm_forward(
    out: usize, rstd: usize, inp: usize, weight: usize, rows: usize, dim: usize,
) -> Result<()> {
    const OP: &str = "rmsnorm_forward";
    nonzero(OP, "dim", dim)?;
    let n = product(OP, &[rows, dim])?;
    check_len(OP, "inp", inp, n)?;
    check_len(OP, "out", out, n)?;
    check_len(OP, "weight", weight, dim)?;
    check_len(OP, "rstd", rstd, rows)
}

/// The shape contract of `rmsnorm_backward`: the lengths of `[dinp, dweight, dout, inp,
/// weight, rstd]`.
pub fn check_rmsnorm_backward(lens: [usize; 6], rows: usize, dim: usize) -> Result<()> {
    const OP: &str = "rmsnorm_backward";
    nonzero(OP, "dim", dim)?;
    let n = product(OP, &[rows, dim])?;
    let [dinp, dweight, dout, inp, weight, rstd] = lens;
    check_len(OP, "dinp", dinp, n)?;
    check_len(OP, "dout", dout, n)?;
    check_len(OP, "inp", inp, n)?;
    check_len(OP, "weight", weight, dim)?;
    check_len(OP, "dweight", dweight, dim)?;
    check_len(OP, "rstd", rstd, rows)
}

/// inp, out: (rows, dim); weight: (dim); rstd: (rows), saved for the backward pass.
pub fn rmsnorm_forward<T: Real>(
    out: &mut [T], rstd: &mut [T], inp: &[T], weight: &[T], rows: usize, dim: usize, eps: f32,
) -> Result<()> {
    check_rmsnorm_forward(out.len(), rstd.len(), inp.len(), weight.len(), rows, dim)?;
    let eps = T::from_f32(eps);
    for r in 0..rows {
        let x = &inp[r * dim..(r + 1) * dim];
        let mut ss = T::ZERO;
        for &v in x {
            ss += v * v;
        }
        let s = T::ONE / (ss / T::from_usize(dim) + eps).sqrt();
        rstd[r] = s;
        let o = &mut out[r * dim..(r + 1) * dim];
        for i in 0..dim {
            o[i] = x[i] * s * weight[i];
        }
    }
    Ok(())
}

/// dinp (overwritten), dweight (accumulated): gradients given dout, with `rstd` from forward.
///
/// With `g = weight * dout` and `xhat = x * rstd`:
/// `dx = rstd * (g - xhat * mean(g * xhat))`, `dweight += sum_rows(dout * xhat)`.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_backward<T: Real>(
    dinp: &mut [T], dweight: &mut [T], dout: &[T], inp: &[T], weight: &[T], rstd: &[T], rows: usize,
    dim: usize,
) -> Result<()> {
    check_rmsnorm_backward([&*dinp, &*dweight, dout, inp, weight, rstd].map(|b| b.len()), rows, dim)?;
    for r in 0..rows {
        let x = &inp[r * dim..(r + 1) * dim];
        let dy = &dout[r * dim..(r + 1) * dim];
        let s = rstd[r];
        let mut dot = T::ZERO;
        for i in 0..dim {
            dot += weight[i] * dy[i] * x[i] * s;
        }
        let mean = dot / T::from_usize(dim);
        let dx = &mut dinp[r * dim..(r + 1) * dim];
        for i in 0..dim {
            let xhat = x[i] * s;
            dx[i] = s * (weight[i] * dy[i] - xhat * mean);
            dweight[i] += dy[i] * xhat;
        }
    }
    Ok(())
}

/// RMSNorm forward and backward: see [`crate::ops::rmsnorm`].
pub trait RmsnormOps: Memory {
    /// RMSNorm of each `dim`-wide row times `weight`, keeping each row's 1/rms in `rstd` for the backward.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_forward(
        &self, out: &mut Self::Buffer, rstd: &mut Self::Buffer, inp: &Self::Buffer, weight: &Self::Buffer,
        rows: usize, dim: usize, eps: f32,
    ) -> Result<()>;
    /// dinp overwritten, dweight accumulated.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward(
        &self, dinp: &mut Self::Buffer, dweight: &mut Self::Buffer, dout: &Self::Buffer, inp: &Self::Buffer,
        weight: &Self::Buffer, rstd: &Self::Buffer, rows: usize, dim: usize,
    ) -> Result<()>;
}

impl RmsnormOps for ReferenceBackend {
    fn rmsnorm_forward(
        &self, out: &mut Vec<f32>, rstd: &mut Vec<f32>, inp: &Vec<f32>, weight: &Vec<f32>, rows: usize,
        dim: usize, eps: f32,
    ) -> Result<()> {
        in_f64([out, rstd], |[o, r]| rmsnorm_forward(o, r, &wide(inp), &wide(weight), rows, dim, eps))
    }
    fn rmsnorm_backward(
        &self, dinp: &mut Vec<f32>, dweight: &mut Vec<f32>, dout: &Vec<f32>, inp: &Vec<f32>,
        weight: &Vec<f32>, rstd: &Vec<f32>, rows: usize, dim: usize,
    ) -> Result<()> {
        in_f64([dinp, dweight], |[dx, dw]| {
            rmsnorm_backward(dx, dw, &wide(dout), &wide(inp), &wide(weight), &wide(rstd), rows, dim)
        })
    }
}
