//! Small element-wise helpers a model needs between the big primitives: residual adds,
//! gradient scaling, and the bias of a dense layer.

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{Real, Result};
use alloc::vec::Vec;

/// y += alpha * x.
pub fn axpy<T: Real>(y: &mut [T], alpha: f32, x: &[T]) -> Result<()> {
    check_len("axpy", "x", x.len(), y.len())?;
    let a = T::from_f32(alpha);
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
    Ok(())
}

/// x *= alpha.
pub fn scale<T: Real>(x: &mut [T], alpha: f32) {
    let a = T::from_f32(alpha);
    x.iter_mut().for_each(|v| *v *= a);
}

/// The contract of `add_bias` and `bias_backward`, shared by every backend: a
/// `(rows, cols)` matrix and a `(cols)` bias; `names` are their argument names.
pub fn check_bias(
    op: &'static str, names: [&'static str; 2], matrix: usize, bias: usize, rows: usize, cols: usize,
) -> Result<()> {
    nonzero(op, "cols", cols)?;
    check_len(op, names[0], matrix, product(op, &[rows, cols])?)?;
    check_len(op, names[1], bias, cols)
}

/// `out[r] += bias` for every row `r`; `out: (rows, cols)`, `bias: (cols)`.
pub fn add_bias<T: Real>(out: &mut [T], bias: &[T], rows: usize, cols: usize) -> Result<()> {
    check_bias("add_bias", ["out", "bias"], out.len(), bias.len(), rows, cols)?;
    for row in out.chunks_exact_mut(cols) {
        for (o, &b) in row.iter_mut().zip(bias) {
            *o += b;
        }
    }
    Ok(())
}

/// dbias += sum over rows of dout (accumulated); dout: (rows, cols).
pub fn bias_backward<T: Real>(dbias: &mut [T], dout: &[T], rows: usize, cols: usize) -> Result<()> {
    check_bias("bias_backward", ["dout", "dbias"], dout.len(), dbias.len(), rows, cols)?;
    for row in dout.chunks_exact(cols) {
        for (d, &g) in dbias.iter_mut().zip(row) {
            *d += g;
        }
    }
    Ok(())
}

/// Element-wise updates and the dense layer's bias: see [`crate::ops::elementwise`].
pub trait ElementwiseOps: Memory {
    /// y += alpha * x.
    fn axpy(&self, y: &mut Self::Buffer, alpha: f32, x: &Self::Buffer) -> Result<()>;
    /// x *= alpha.
    fn scale(&self, x: &mut Self::Buffer, alpha: f32) -> Result<()>;
    /// `out[r][c] += bias[c]` over `rows x cols`.
    fn add_bias(&self, out: &mut Self::Buffer, bias: &Self::Buffer, rows: usize, cols: usize) -> Result<()>;
    /// Accumulates.
    fn bias_backward(
        &self, dbias: &mut Self::Buffer, dout: &Self::Buffer, rows: usize, cols: usize,
    ) -> Result<()>;
}

impl ElementwiseOps for ReferenceBackend {
    fn axpy(&self, y: &mut Vec<f32>, alpha: f32, x: &Vec<f32>) -> Result<()> {
        axpy(y, alpha, x)
    }
    fn scale(&self, x: &mut Vec<f32>, alpha: f32) -> Result<()> {
        scale(x, alpha);
        Ok(())
    }
    fn add_bias(&self, out: &mut Vec<f32>, bias: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        add_bias(out, bias, rows, cols)
    }
    fn bias_backward(&self, dbias: &mut Vec<f32>, dout: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        in_f64([dbias], |[d]| bias_backward(d, &wide(dout), rows, cols))
    }
}
