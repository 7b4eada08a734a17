//! Rotary position embedding, "rotate-half" layout (Llama / GPT-NeoX / Hugging Face).
//!
//! For head size `D` and `i < D/2`, feature pair `(i, i + D/2)` of the vector at absolute
//! position `p` is rotated by the angle `p * theta^(-2i/D)`:
//! `x1' = x1 cos - x2 sin`, `x2' = x2 cos + x1 sin`.
//! The backward pass is the rotation by the opposite angle (a rotation's transpose).

use crate::error::{check_len, nonzero, product};
use crate::{CoreError, Real, Result};

/// Where the vectors sit: `x` is `(batch, seq, heads, head_dim)` and row `t` of the sequence
/// is at absolute position `pos_offset + t` (non-zero when decoding after a KV cache).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub pos_offset: usize,
    pub theta: f32,
}

impl RopeSpec {
    pub fn check(&self, op: &'static str, len: usize) -> Result<()> {
        nonzero(op, "head_dim", self.head_dim)?;
        if !self.head_dim.is_multiple_of(2) {
            return Err(CoreError::InvalidDimension {
                op,
                message: alloc::format!("head_dim must be even for RoPE, got {}", self.head_dim),
            });
        }
        if self.theta.is_nan() || self.theta <= 1.0 || self.theta.is_infinite() {
            return Err(CoreError::InvalidArgument {
                op,
                message: alloc::format!("rope theta must be a finite number above 1, got {}", self.theta),
            });
        }
        check_len(
            op,
            "x",
            len,
            product(op, &[self.batch, self.seq, self.heads, self.head_dim])?,
        )
    }
}

/// The inverse frequency of pair `i`: `theta^(-2i/D)`, computed in f32 like PyTorch does.
pub fn inv_freq(i: usize, head_dim: usize, theta: f32) -> f32 {
    1.0 / libm::powf(theta, (2 * i) as f32 / head_dim as f32)
}

fn rotate<T: Real>(x: &mut [T], spec: &RopeSpec, sign: T) {
    let d = spec.head_dim;
    let half = d / 2;
    // The angles of one position serve every head: computed once per position (the same
    // values as per element, at a fraction of the sin/cos calls).
    let inv: alloc::vec::Vec<f32> = (0..half).map(|i| inv_freq(i, d, spec.theta)).collect();
    let mut sin_cos = alloc::vec![(T::ZERO, T::ZERO); half];
    for b in 0..spec.batch {
        for t in 0..spec.seq {
            let pos = (spec.pos_offset + t) as f32;
            for (sc, &f) in sin_cos.iter_mut().zip(&inv) {
                // The angle itself is formed in f32 as in PyTorch, so positions agree
                // exactly; the rotation then runs in T.
                let angle = T::from_f32(pos * f);
                *sc = (angle.sin() * sign, angle.cos());
            }
            for h in 0..spec.heads {
                let base = ((b * spec.seq + t) * spec.heads + h) * d;
                for (i, &(s, c)) in sin_cos.iter().enumerate() {
                    let x1 = x[base + i];
                    let x2 = x[base + i + half];
                    x[base + i] = x1 * c - x2 * s;
                    x[base + i + half] = x2 * c + x1 * s;
                }
            }
        }
    }
}

/// Rotates `x` in place.
pub fn rope_forward<T: Real>(x: &mut [T], spec: &RopeSpec) -> Result<()> {
    spec.check("rope_forward", x.len())?;
    rotate(x, spec, T::ONE);
    Ok(())
}

/// Turns the gradient with respect to the rotated values into the gradient with respect to
/// the inputs, in place.
pub fn rope_backward<T: Real>(dx: &mut [T], spec: &RopeSpec) -> Result<()> {
    spec.check("rope_backward", dx.len())?;
    rotate(dx, spec, -T::ONE);
    Ok(())
}
