//! Sums of squares for the global gradient norm used by clipping.

use crate::backend::Memory;
use crate::reference::ReferenceBackend;
use crate::Result;
use alloc::vec::Vec;

/// `sum(x^2)`, accumulated in f64 so a norm over 10^8 gradients keeps its digits.
/// NaN or Inf in `x` makes the result NaN/Inf, which the clipping caller reports.
pub fn sum_of_squares<T: crate::Real>(x: &[T]) -> f64 {
    x.iter()
        .map(|v| {
            let v = v.to_f64();
            v * v
        })
        .sum()
}

/// `sqrt(sum over all slices of sum(x^2))`.
pub fn global_l2_norm<T: crate::Real>(slices: &[&[T]]) -> f64 {
    libm::sqrt(slices.iter().map(|s| sum_of_squares(s)).sum())
}

/// Sums of squares (gradient norms, clipping): see [`crate::ops::l2norm`].
pub trait L2normOps: Memory {
    /// sum(x^2), accumulated in f64 where the backend can.
    fn sum_of_squares(&self, x: &Self::Buffer) -> Result<f64>;
    /// The sum of `sum_of_squares` over several buffers (a global gradient norm). A device
    /// backend overrides it to read back one total instead of one value per buffer.
    fn sum_of_squares_many(&self, xs: &[&Self::Buffer]) -> Result<f64> {
        let mut total = 0.0;
        for x in xs {
            total += self.sum_of_squares(x)?;
        }
        Ok(total)
    }
}

impl L2normOps for ReferenceBackend {
    fn sum_of_squares(&self, x: &Vec<f32>) -> Result<f64> {
        Ok(sum_of_squares(x))
    }
}
