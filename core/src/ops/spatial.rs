//! Moving image tensors between layouts: nearest-neighbour upsampling (the VAE and UNet
//! up blocks), patches to tokens and back (the DiTs' input and output, the FLUX.2 VAE's
//! 2x2 latent packing), and the sinusoidal timestep embedding.

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};

/// `out (planes, h * s, w * s)` from `inp (planes, h, w)` by repeating each value in an
/// `s x s` square (`planes` = batch x channels): PyTorch's `interpolate(mode="nearest")`
/// with an integer `scale_factor`.
pub fn upsample_nearest2d<T: Real>(
    out: &mut [T], inp: &[T], planes: usize, h: usize, w: usize, s: usize,
) -> Result<()> {
    check_upsample(out.len(), inp.len(), planes, h, w, s)?;
    let (oh, ow) = (h * s, w * s);
    for p in 0..planes {
        for y in 0..oh {
            for x in 0..ow {
                out[(p * oh + y) * ow + x] = inp[(p * h + y / s) * w + x / s];
            }
        }
    }
    Ok(())
}

/// The shape contract of `upsample_nearest2d` (buffer lengths).
pub fn check_upsample(out: usize, inp: usize, planes: usize, h: usize, w: usize, s: usize) -> Result<()> {
    const OP: &str = "upsample_nearest2d";
    nonzero(OP, "scale", s)?;
    check_len(OP, "inp", inp, product(OP, &[planes, h, w])?)?;
    check_len(OP, "out", out, product(OP, &[planes, h, s, w, s])?)
}

/// The order of the values inside one patch's feature vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchOrder {
    /// `(channel, py, px)`: FLUX's latent packing (`view(B, C, H/2, 2, W/2, 2)
    /// .permute(0, 2, 4, 1, 3, 5)`) and the FLUX.2 VAE's patchify.
    ChannelFirst,
    /// `(py, px, channel)`: SD3's unpatchify (`einsum("nhwpqc->nchpwq")`).
    ChannelLast,
}

/// `(batch, channels, height, width)` images cut into `patch x patch` squares; each square
/// becomes a token of `channels * patch^2` features, tokens row by row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchSpec {
    /// Images.
    pub batch: usize,
    /// Channels.
    pub channels: usize,
    /// Rows (a multiple of `patch`).
    pub height: usize,
    /// Columns (a multiple of `patch`).
    pub width: usize,
    /// The squares' side.
    pub patch: usize,
    /// How a token's features are ordered.
    pub order: PatchOrder,
}

impl PatchSpec {
    /// Validates the spec; returns the number of values (the same in both layouts).
    pub fn check(&self, op: &'static str, a: usize, b: usize) -> Result<usize> {
        nonzero(op, "patch", self.patch)?;
        if !self.height.is_multiple_of(self.patch) || !self.width.is_multiple_of(self.patch) {
            return Err(CoreError::InvalidDimension {
                op,
                message: alloc::format!(
                    "the image ({} x {}) is not a whole number of {}x{} patches",
                    self.height,
                    self.width,
                    self.patch,
                    self.patch
                ),
            });
        }
        let n = product(op, &[self.batch, self.channels, self.height, self.width])?;
        check_len(op, "inp", a, n)?;
        check_len(op, "out", b, n)?;
        Ok(n)
    }
    /// Tokens per image.
    pub fn tokens(&self) -> usize {
        (self.height / self.patch.max(1)) * (self.width / self.patch.max(1))
    }
    /// Features per token.
    pub fn features(&self) -> usize {
        self.channels * self.patch * self.patch
    }
    /// `(index in the image layout, index in the token layout)` of every value, in image
    /// order: the one map both directions share.
    fn pairs(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let (c, h, w, p) = (self.channels, self.height, self.width, self.patch);
        let (pw, f, tokens) = (w / p, self.features(), self.tokens());
        (0..self.batch * c * h * w).map(move |i| {
            let (x, y) = (i % w, (i / w) % h);
            let (ch, b) = ((i / (w * h)) % c, i / (w * h * c));
            let token = (y / p) * pw + x / p;
            let (py, px) = (y % p, x % p);
            let feature = match self.order {
                PatchOrder::ChannelFirst => (ch * p + py) * p + px,
                PatchOrder::ChannelLast => (py * p + px) * c + ch,
            };
            (i, (b * tokens + token) * f + feature)
        })
    }
}

/// `out (batch, tokens, channels * patch^2)` from `inp (batch, channels, height, width)`.
/// With `patch` 1 it is the transpose `(B, C, HW) -> (B, HW, C)`.
pub fn patchify<T: Real>(out: &mut [T], inp: &[T], spec: &PatchSpec) -> Result<()> {
    spec.check("patchify", inp.len(), out.len())?;
    for (img, tok) in spec.pairs() {
        out[tok] = inp[img];
    }
    Ok(())
}

/// The inverse of [`patchify`]: `out (batch, channels, height, width)` from
/// `inp (batch, tokens, channels * patch^2)`.
pub fn unpatchify<T: Real>(out: &mut [T], inp: &[T], spec: &PatchSpec) -> Result<()> {
    spec.check("unpatchify", inp.len(), out.len())?;
    for (img, tok) in spec.pairs() {
        out[img] = inp[tok];
    }
    Ok(())
}

/// How a model turns a timestep into sinusoidal features (diffusers'
/// `get_timestep_embedding`, with the arguments its `Timesteps` modules pass).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimestepSpec {
    /// Output features; an odd count ends with a zero.
    pub dim: usize,
    /// `[cos | sin]` instead of `[sin | cos]` (diffusers' `flip_sin_to_cos`; true for the
    /// UNets and DiTs of Stable Diffusion and FLUX).
    pub flip_sin_to_cos: bool,
    /// Subtracted from half the dimension in the frequency exponent (1 in the original
    /// DDPM code, 0 in SD's and FLUX's configs).
    pub downscale_freq_shift: f32,
    /// Multiplies the angles (1 unless a model says otherwise).
    pub scale: f32,
    /// The longest period of the sinusoids (10,000).
    pub max_period: f32,
}

impl TimestepSpec {
    /// An embedding of `dim` features with diffusers' defaults.
    pub fn new(dim: usize) -> Self {
        TimestepSpec {
            dim,
            flip_sin_to_cos: true,
            downscale_freq_shift: 0.0,
            scale: 1.0,
            max_period: 10000.0,
        }
    }
}

/// `out (timesteps.len(), dim)`: for frequency `f_i = exp(-ln(max_period) i / (half -
/// shift))`, `i < half = dim / 2`, the features `sin(scale t f_i)` and `cos(scale t f_i)`.
/// Computed in f32 in PyTorch's order of operations, so the angles round as diffusers'
/// do (at t = 999 one ulp of the angle is 6e-5, which would show in a 1e-5 comparison).
pub fn timestep_embedding(out: &mut [f32], timesteps: &[f32], spec: &TimestepSpec) -> Result<()> {
    const OP: &str = "timestep_embedding";
    nonzero(OP, "dim", spec.dim)?;
    check_len(OP, "out", out.len(), product(OP, &[timesteps.len(), spec.dim])?)?;
    let half = spec.dim / 2;
    let denom = half as f32 - spec.downscale_freq_shift;
    if half > 0 && (denom == 0.0 || !denom.is_finite()) {
        return Err(CoreError::InvalidArgument {
            op: OP,
            message: alloc::format!(
                "half the dimension ({half}) minus downscale_freq_shift ({}) must not be zero",
                spec.downscale_freq_shift
            ),
        });
    }
    // PyTorch multiplies by `math.log(max_period)`, a double rounded once to f32.
    let log_period = libm::log(spec.max_period as f64) as f32;
    for (row, &t) in out.chunks_mut(spec.dim).zip(timesteps) {
        for i in 0..half {
            let freq = libm::expf(-log_period * i as f32 / denom);
            let angle = spec.scale * (t * freq);
            let (sin, cos) = (libm::sinf(angle), libm::cosf(angle));
            let (first, second) = if spec.flip_sin_to_cos { (cos, sin) } else { (sin, cos) };
            row[i] = first;
            row[half + i] = second;
        }
        if spec.dim % 2 == 1 {
            row[spec.dim - 1] = 0.0;
        }
    }
    Ok(())
}

/// Upsampling and patching of feature maps: see [`crate::ops::spatial`].
pub trait SpatialOps: Memory {
    /// See [`crate::ops::spatial::upsample_nearest2d`].
    fn upsample_nearest2d(
        &self, out: &mut Self::Buffer, inp: &Self::Buffer, planes: usize, h: usize, w: usize, scale: usize,
    ) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::spatial::upsample_nearest2d(&mut o, &self.download(inp)?, planes, h, w, scale)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::spatial::patchify`].
    fn patchify(&self, out: &mut Self::Buffer, inp: &Self::Buffer, spec: &PatchSpec) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::spatial::patchify(&mut o, &self.download(inp)?, spec)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::spatial::unpatchify`].
    fn unpatchify(&self, out: &mut Self::Buffer, inp: &Self::Buffer, spec: &PatchSpec) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::spatial::unpatchify(&mut o, &self.download(inp)?, spec)?;
        self.write(out, &o)
    }
}

impl SpatialOps for ReferenceBackend {}
