//! Layer and group normalization with a mean (PyTorch's `LayerNorm` and `GroupNorm`), for
//! inference: `out = (x - mean) / sqrt(var + eps) * weight + bias`, the variance biased
//! (divided by the count, as PyTorch normalizes). Weight and bias are optional (an
//! `elementwise_affine=False` layer norm, FLUX's; a `GroupNorm(affine=False)`).
//!
//! Statistics are accumulated in f64 whatever the element type: a VAE's group holds up to
//! hundreds of thousands of values, where an f32 running sum would lose the low digits
//! the variance is made of.

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};

/// `(mean, 1 / sqrt(var + eps))` of `x`, two passes in f64.
pub fn mean_rstd<T: Real>(x: &[T], eps: f32) -> (f64, f64) {
    let n = x.len().max(1) as f64;
    let mean = x.iter().map(|v| v.to_f64()).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|v| {
            let d = v.to_f64() - mean;
            d * d
        })
        .sum::<f64>()
        / n;
    (mean, 1.0 / libm::sqrt(var + eps as f64))
}

/// The shape contract of `layer_norm` (buffer lengths).
pub fn check_layer_norm(
    out: usize, inp: usize, weight: Option<usize>, bias: Option<usize>, rows: usize, dim: usize,
) -> Result<()> {
    const OP: &str = "layer_norm";
    nonzero(OP, "dim", dim)?;
    let n = product(OP, &[rows, dim])?;
    check_len(OP, "inp", inp, n)?;
    check_len(OP, "out", out, n)?;
    if let Some(w) = weight {
        check_len(OP, "weight", w, dim)?;
    }
    if let Some(b) = bias {
        check_len(OP, "bias", b, dim)?;
    }
    Ok(())
}

/// inp, out: (rows, dim); weight, bias: (dim), each optional.
pub fn layer_norm<T: Real>(
    out: &mut [T], inp: &[T], weight: Option<&[T]>, bias: Option<&[T]>, rows: usize, dim: usize, eps: f32,
) -> Result<()> {
    check_layer_norm(out.len(), inp.len(), weight.map(|w| w.len()), bias.map(|b| b.len()), rows, dim)?;
    for r in 0..rows {
        let x = &inp[r * dim..(r + 1) * dim];
        let (mean, rstd) = mean_rstd(x, eps);
        for (i, o) in out[r * dim..(r + 1) * dim].iter_mut().enumerate() {
            let mut y = T::from_f64((x[i].to_f64() - mean) * rstd);
            if let Some(w) = weight {
                y *= w[i];
            }
            if let Some(b) = bias {
                y += b[i];
            }
            *o = y;
        }
    }
    Ok(())
}

/// `GroupNorm` over `(batch, channels, spatial)` (spatial = height * width, or 1), and the
/// activation that follows it in a ResNet block, applied in the same pass when given
/// (the VAEs' and UNets' `norm -> SiLU`: one read and one write of the activations instead
/// of two of each).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupNormSpec {
    /// Images (or sequences).
    pub batch: usize,
    /// Channels (a multiple of `groups`).
    pub channels: usize,
    /// Elements of a channel (height * width, or 1).
    pub spatial: usize,
    /// Groups normalized together.
    pub groups: usize,
    /// Added to the variance.
    pub eps: f32,
    /// The activation applied in the same pass, when given.
    pub act: Option<crate::ops::unary::Unary>,
}

impl GroupNormSpec {
    /// The shape contract of `group_norm` (buffer lengths), shared by every backend.
    pub fn check(&self, out: usize, inp: usize, weight: Option<usize>, bias: Option<usize>) -> Result<()> {
        const OP: &str = "group_norm";
        nonzero(OP, "groups", self.groups)?;
        nonzero(OP, "channels", self.channels)?;
        if !self.channels.is_multiple_of(self.groups) {
            return Err(CoreError::InvalidDimension {
                op: OP,
                message: alloc::format!(
                    "channels ({}) must be a multiple of groups ({})",
                    self.channels,
                    self.groups
                ),
            });
        }
        let n = product(OP, &[self.batch, self.channels, self.spatial])?;
        check_len(OP, "inp", inp, n)?;
        check_len(OP, "out", out, n)?;
        if let Some(w) = weight {
            check_len(OP, "weight", w, self.channels)?;
        }
        if let Some(b) = bias {
            check_len(OP, "bias", b, self.channels)?;
        }
        Ok(())
    }
    /// Values in one (batch, group) slice: its channels' spatial planes, contiguous.
    pub fn group_len(&self) -> usize {
        self.channels / self.groups * self.spatial
    }
}

/// inp, out: (batch, channels, spatial); weight, bias: (channels), each optional.
/// Statistics per (batch, group) over the group's channels and positions; then
/// `spec.act`, when given.
pub fn group_norm<T: Real>(
    out: &mut [T], inp: &[T], weight: Option<&[T]>, bias: Option<&[T]>, spec: &GroupNormSpec,
) -> Result<()> {
    spec.check(out.len(), inp.len(), weight.map(|w| w.len()), bias.map(|b| b.len()))?;
    let (per, len) = (spec.channels / spec.groups, spec.group_len());
    for bg in 0..spec.batch * spec.groups {
        let x = &inp[bg * len..(bg + 1) * len];
        let (mean, rstd) = mean_rstd(x, spec.eps);
        let g = bg % spec.groups;
        for (i, o) in out[bg * len..(bg + 1) * len].iter_mut().enumerate() {
            let c = g * per + i / spec.spatial.max(1);
            let mut y = T::from_f64((x[i].to_f64() - mean) * rstd);
            if let Some(w) = weight {
                y *= w[c];
            }
            if let Some(b) = bias {
                y += b[c];
            }
            *o = match spec.act {
                Some(act) => act.apply(y),
                None => y,
            };
        }
    }
    Ok(())
}

/// Group and layer norms (image models, text encoders): see [`crate::ops::norm`].
pub trait NormOps: Memory {
    /// See [`crate::ops::norm::group_norm`].
    fn group_norm(
        &self, out: &mut Self::Buffer, inp: &Self::Buffer, weight: Option<&Self::Buffer>,
        bias: Option<&Self::Buffer>, spec: &GroupNormSpec,
    ) -> Result<()> {
        let weight = weight.map(|w| self.download(w)).transpose()?;
        let bias = bias.map(|b| self.download(b)).transpose()?;
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::norm::group_norm(&mut o, &self.download(inp)?, weight.as_deref(), bias.as_deref(), spec)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::norm::layer_norm`].
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self, out: &mut Self::Buffer, inp: &Self::Buffer, weight: Option<&Self::Buffer>,
        bias: Option<&Self::Buffer>, rows: usize, dim: usize, eps: f32,
    ) -> Result<()> {
        let weight = weight.map(|w| self.download(w)).transpose()?;
        let bias = bias.map(|b| self.download(b)).transpose()?;
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::norm::layer_norm(
            &mut o,
            &self.download(inp)?,
            weight.as_deref(),
            bias.as_deref(),
            rows,
            dim,
            eps,
        )?;
        self.write(out, &o)
    }
}

impl NormOps for ReferenceBackend {}
