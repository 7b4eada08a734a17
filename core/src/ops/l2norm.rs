//! Sums of squares for the global gradient norm used by clipping.

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
