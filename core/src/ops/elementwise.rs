//! Small element-wise helpers a model needs between the big primitives: residual adds,
//! gradient scaling, and the bias of a dense layer.

use crate::error::{check_len, nonzero, product};
use crate::{Real, Result};

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

/// out[r] += bias for every row r; out: (rows, cols), bias: (cols).
pub fn add_bias<T: Real>(out: &mut [T], bias: &[T], rows: usize, cols: usize) -> Result<()> {
    const OP: &str = "add_bias";
    nonzero(OP, "cols", cols)?;
    check_len(OP, "out", out.len(), product(OP, &[rows, cols])?)?;
    check_len(OP, "bias", bias.len(), cols)?;
    for row in out.chunks_exact_mut(cols) {
        for (o, &b) in row.iter_mut().zip(bias) {
            *o += b;
        }
    }
    Ok(())
}

/// dbias += sum over rows of dout (accumulated); dout: (rows, cols).
pub fn bias_backward<T: Real>(dbias: &mut [T], dout: &[T], rows: usize, cols: usize) -> Result<()> {
    const OP: &str = "bias_backward";
    nonzero(OP, "cols", cols)?;
    check_len(OP, "dout", dout.len(), product(OP, &[rows, cols])?)?;
    check_len(OP, "dbias", dbias.len(), cols)?;
    for row in dout.chunks_exact(cols) {
        for (d, &g) in dbias.iter_mut().zip(row) {
            *d += g;
        }
    }
    Ok(())
}
