//! Rotary position embedding, "rotate-half" layout (Llama / GPT-NeoX / Hugging Face).
//!
//! For head size `D` and `i < D/2`, feature pair `(i, i + D/2)` of the vector at absolute
//! position `p` is rotated by the angle `p * theta^(-2i/D)`:
//! `x1' = x1 cos - x2 sin`, `x2' = x2 cos + x1 sin`.
//! The backward pass is the rotation by the opposite angle (a rotation's transpose).
//!
//! Models trained on a long context with stretched frequencies ([`RopeScaling`]) turn by
//! `p * f_i`, with `f_i` the scaled inverse frequency of [`RopeScaling::inv_freq`].

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::reference::in_f64;
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};
use alloc::vec::Vec;

/// Where the vectors sit: `x` is `(batch, seq, heads, head_dim)` and row `t` of the sequence
/// is at absolute position `pos_offset + t` (non-zero when decoding after a KV cache).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    /// Sequences.
    pub batch: usize,
    /// Positions of each.
    pub seq: usize,
    /// Heads.
    pub heads: usize,
    /// Width of a head (even).
    pub head_dim: usize,
    /// The absolute position of row 0.
    pub pos_offset: usize,
    /// The base frequency.
    pub theta: f32,
    /// How the frequencies are stretched (none by default).
    pub scaling: RopeScaling,
}

/// How a model stretches its rotary frequencies, as Hugging Face's `rope_scaling` /
/// `rope_parameters` name them. Each formula is transformers' (`modeling_rope_utils`),
/// evaluated in f32 in the same order, so tables agree to the bit.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RopeScaling {
    /// `theta^(-2i/D)` as it is (`rope_type: "default"`).
    #[default]
    None,
    /// Position interpolation: every frequency divided by `factor` (`"linear"`).
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's: wavelengths longer than `original_max_position / low_freq_factor` are
    /// stretched by `factor`, those shorter than `original_max_position / high_freq_factor`
    /// kept, and the band between blended linearly in `original_max_position / wavelength`
    /// (`"llama3"`).
    Llama3 {
        /// The stretch of the low frequencies.
        factor: f32,
        /// Sets the long-wavelength edge of the band.
        low_freq_factor: f32,
        /// Sets the short-wavelength edge of the band.
        high_freq_factor: f32,
        /// The context the model was trained with.
        original_max_position: usize,
    },
}

impl RopeScaling {
    /// A clear message for parameters no formula can use.
    pub fn check(&self) -> core::result::Result<(), alloc::string::String> {
        let positive = |name: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(alloc::format!("rope scaling {name} must be a finite number above 0, got {v}"))
            }
        };
        match *self {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } => positive("factor", factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                positive("factor", factor)?;
                positive("low_freq_factor", low_freq_factor)?;
                positive("high_freq_factor", high_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(alloc::format!(
                        "llama3 rope scaling needs high_freq_factor ({high_freq_factor}) above low_freq_factor ({low_freq_factor})"
                    ));
                }
                if original_max_position == 0 {
                    return Err("llama3 rope scaling needs original_max_position_embeddings above 0".into());
                }
                Ok(())
            }
        }
    }

    /// The scaling as a kernel takes it: `(kind, [factor, low_wavelen, high_wavelen,
    /// old_ctx, low_freq_factor, band])`, kind 0 none, 1 linear, 2 llama3. transformers forms
    /// the bounds from Python floats (f64) and meets f32 tensors with them, so they are
    /// formed in f64 here and rounded once; everything after is f32.
    pub fn kernel_constants(&self) -> (i32, [f32; 6]) {
        match *self {
            RopeScaling::None => (0, [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]),
            RopeScaling::Linear { factor } => (1, [factor, 0.0, 0.0, 0.0, 0.0, 1.0]),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                let old = original_max_position as f64;
                let (low, high) = (low_freq_factor as f64, high_freq_factor as f64);
                (
                    2,
                    [
                        factor,
                        (old / low) as f32,
                        (old / high) as f32,
                        old as f32,
                        low_freq_factor,
                        (high - low) as f32,
                    ],
                )
            }
        }
    }

    /// The inverse frequency of pair `i` of a `head_dim` head, scaled.
    pub fn inv_freq(&self, i: usize, head_dim: usize, theta: f32) -> f32 {
        let f = inv_freq(i, head_dim, theta);
        let (kind, [factor, low_wavelen, high_wavelen, old, low, band]) = self.kernel_constants();
        match kind {
            1 => f / factor,
            2 => {
                let wavelen = (2.0 * core::f64::consts::PI) as f32 / f;
                if wavelen > low_wavelen {
                    f / factor
                } else if wavelen < high_wavelen {
                    f
                } else {
                    let smooth = (old / wavelen - low) / band;
                    (1.0 - smooth) * f / factor + smooth * f
                }
            }
            _ => f,
        }
    }
}

impl RopeSpec {
    /// `(batch, seq, heads, head_dim)` vectors from position `pos_offset`, base `theta`,
    /// frequencies not stretched.
    pub fn unscaled(
        batch: usize, seq: usize, heads: usize, head_dim: usize, pos_offset: usize, theta: f32,
    ) -> RopeSpec {
        RopeSpec { batch, seq, heads, head_dim, pos_offset, theta, scaling: RopeScaling::None }
    }

    /// Checks the shape against a buffer of `len` elements.
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
        self.scaling.check().map_err(|message| CoreError::InvalidArgument { op, message })?;
        check_len(op, "x", len, product(op, &[self.batch, self.seq, self.heads, self.head_dim])?)
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
    let inv: alloc::vec::Vec<f32> = (0..half).map(|i| spec.scaling.inv_freq(i, d, spec.theta)).collect();
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

/// Rotary position embeddings, forward and backward: see [`crate::ops::rope`].
pub trait RopeOps: Memory {
    /// In place.
    fn rope_forward(&self, x: &mut Self::Buffer, spec: &RopeSpec) -> Result<()>;
    /// In place.
    fn rope_backward(&self, dx: &mut Self::Buffer, spec: &RopeSpec) -> Result<()>;
}

impl RopeOps for ReferenceBackend {
    fn rope_forward(&self, x: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        in_f64([x], |[x]| rope_forward(x, spec))
    }
    fn rope_backward(&self, dx: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        in_f64([dx], |[dx]| rope_backward(dx, spec))
    }
}
