//! `AutoencoderKL`, the image autoencoder of Stable Diffusion 1.x/2.x/XL, SD3 and FLUX.1, as
//! diffusers defines it: an encoder of `DownEncoderBlock2D`s to the mean and log-variance
//! of a diagonal Gaussian over latents, and a decoder of `UpDecoderBlock2D`s back to pixels,
//! each with a mid block of two ResNets around one self-attention. Inference only.
//!
//! `AutoencoderKLFlux2` (FLUX.2) is the same network with its latent statistics beside it
//! (`bn.running_mean` / `bn.running_var` of the 2x2-patchified latents) and, optionally,
//! a decoder of other widths; [`VaeConfig::latent_bn`] says which kind a model is.
//!
//! Images are `(batch, in_channels, h, w)` in [-1, 1]; latents `(batch, latent_channels,
//! h / f, w / f)` with `f = 2^(blocks - 1)`. The latents here are the autoencoder's own; a
//! pipeline's denoiser sees them through [`AutoencoderKl::to_denoiser`] (shift and scale;
//! for FLUX.2, 2x2 patches normalized by the statistics) and hands them back through
//! [`AutoencoderKl::from_denoiser`].

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::backend::Unary;
use crate::error::first_zero;
use crate::models::image::blocks::{
    image_model, layout_of, optional, upsample2x, Conv2d, FeatureMap, Layout, Norm, Resnet, Source,
    SpatialAttention,
};
use crate::{Backend, CoreError, Result};

/// The ResNets', attention's and output norms' epsilon: diffusers builds every VAE with 1e-6.
const EPS: f32 = 1e-6;

/// An AutoencoderKL's shapes, from its `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct VaeConfig {
    /// Image channels in.
    pub in_channels: usize,
    /// Image channels out.
    pub out_channels: usize,
    /// Latent channels.
    pub latent_channels: usize,
    /// Channels of each resolution, finest first.
    pub block_out_channels: Vec<usize>,
    /// The decoder's (FLUX.2's `decoder_block_out_channels`; else the same as the encoder's).
    pub decoder_block_out_channels: Vec<usize>,
    /// ResNet layers per resolution.
    pub layers_per_block: usize,
    /// Groups of the group norms.
    pub norm_num_groups: usize,
    /// `act_fn` (SiLU in every published VAE).
    pub act: Unary,
    /// Multiplies the latents the denoiser sees.
    pub scaling_factor: f32,
    /// Subtracted before scaling (SD3 and FLUX.1; 0 for the SD family).
    pub shift_factor: f32,
    /// A 1x1 convolution after the encoder.
    pub use_quant_conv: bool,
    /// A 1x1 convolution before the decoder.
    pub use_post_quant_conv: bool,
    /// Attention in the middle block.
    pub mid_block_add_attention: bool,
    /// FLUX.2: latents are patchified 2x2 and normalized by stored statistics.
    pub latent_bn: Option<LatentBatchNorm>,
}

/// `AutoencoderKLFlux2`'s latent normalization: `patch x patch` patches of the latents
/// (channels `latent_channels * patch^2`), then `(z - running_mean) / sqrt(running_var + eps)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatentBatchNorm {
    /// Side of the latent patches.
    pub patch: usize,
    /// Added to the variance.
    pub eps: f32,
}

impl VaeConfig {
    /// Checks the shapes, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(CoreError::InvalidArgument { op: "vae config", message });
        if self.block_out_channels.is_empty() {
            return bad("block_out_channels is empty".into());
        }
        if self.decoder_block_out_channels.len() != self.block_out_channels.len() {
            return bad(format!(
                "decoder_block_out_channels has {} entries, block_out_channels {}",
                self.decoder_block_out_channels.len(),
                self.block_out_channels.len()
            ));
        }
        if let Some(bn) = self.latent_bn {
            if bn.patch == 0 || !(bn.eps.is_finite() && bn.eps >= 0.0) {
                return bad(format!("latent batch norm: patch {} and eps {}", bn.patch, bn.eps));
            }
        }
        if let Some(m) =
            first_zero!(self; in_channels, out_channels, latent_channels, layers_per_block, norm_num_groups)
        {
            return bad(m);
        }
        if let Some(c) = self
            .block_out_channels
            .iter()
            .chain(&self.decoder_block_out_channels)
            .find(|&&c| c == 0 || c % self.norm_num_groups != 0)
        {
            return bad(format!(
                "block_out_channels entry {c} is not a positive multiple of norm_num_groups ({})",
                self.norm_num_groups
            ));
        }
        if self.block_out_channels.len() > 16 {
            return bad(format!(
                "{} blocks: the downsampling factor overflows",
                self.block_out_channels.len()
            ));
        }
        if !(self.scaling_factor.is_finite() && self.scaling_factor != 0.0 && self.shift_factor.is_finite()) {
            return bad(format!(
                "scaling_factor {} / shift_factor {} must be finite, the scale non-zero",
                self.scaling_factor, self.shift_factor
            ));
        }
        Ok(())
    }

    /// Pixels per latent along each side: `2^(blocks - 1)`.
    pub fn downscale(&self) -> usize {
        1 << (self.block_out_channels.len() - 1)
    }

    /// `(z - shift) * scaling`: the autoencoder's latents as the denoiser sees them.
    pub fn to_denoiser(&self, z: &mut [f32]) {
        z.iter_mut().for_each(|v| *v = (*v - self.shift_factor) * self.scaling_factor);
    }
    /// `z / scaling + shift`: a denoiser's latents back for [`AutoencoderKl::decode`].
    pub fn from_denoiser(&self, z: &mut [f32]) {
        z.iter_mut().for_each(|v| *v = *v / self.scaling_factor + self.shift_factor);
    }
}

/// The diagonal Gaussian an image encodes to: `mean` and `logvar`, each `(batch,
/// latent_channels, h, w)` on the host, `logvar` clamped to [-30, 20] as diffusers does.
#[derive(Debug, Clone, PartialEq)]
pub struct LatentDist {
    /// `(batch, latent_channels, h, w)`.
    pub mean: Vec<f32>,
    /// Log-variance, in the same layout.
    pub logvar: Vec<f32>,
    /// Images.
    pub batch: usize,
    /// Latent channels.
    pub channels: usize,
    /// Latent rows.
    pub h: usize,
    /// Latent columns.
    pub w: usize,
}

impl LatentDist {
    /// `mean + exp(logvar / 2) * noise`, `noise` standard normal of the same length.
    pub fn sample(&self, noise: &[f32]) -> Result<Vec<f32>> {
        crate::error::check_len("LatentDist::sample", "noise", noise.len(), self.mean.len())?;
        Ok(self
            .mean
            .iter()
            .zip(&self.logvar)
            .zip(noise)
            .map(|((m, lv), n)| m + libm::expf(0.5 * lv) * n)
            .collect())
    }
}

/// The encoder's and decoder's mid block: two ResNets around a self-attention.
struct MidBlock<B: Backend> {
    resnet_0: Resnet<B>,
    attention: Option<SpatialAttention<B>>,
    resnet_1: Resnet<B>,
}

impl<B: Backend> MidBlock<B> {
    fn load(s: &mut impl Source<B>, cfg: &VaeConfig, part: &str, c: usize) -> Result<Self> {
        let p = format!("{part}.mid_block");
        Ok(MidBlock {
            resnet_0: Resnet::load(s, &format!("{p}.resnets.0"), c, c, None)?,
            attention: optional(cfg.mid_block_add_attention, || {
                SpatialAttention::load(s, &format!("{p}.attentions.0"), c)
            })?,
            resnet_1: Resnet::load(s, &format!("{p}.resnets.1"), c, c, None)?,
        })
    }

    fn forward(&self, be: &B, cfg: &VaeConfig, x: &FeatureMap<B>) -> Result<FeatureMap<B>> {
        let g = cfg.norm_num_groups;
        let mut x = self.resnet_0.forward(be, x, None, g, EPS, cfg.act)?;
        if let Some(a) = &self.attention {
            x = a.forward(be, &x, g, EPS)?;
        }
        self.resnet_1.forward(be, &x, None, g, EPS, cfg.act)
    }
}

/// A resolution of the encoder (`DownEncoderBlock2D`) or decoder (`UpDecoderBlock2D`):
/// ResNets, then the change of size (a strided convolution down, nearest 2x and a
/// convolution up) except at the last.
struct Stage<B: Backend> {
    resnets: Vec<Resnet<B>>,
    resample: Option<Conv2d<B>>,
}

impl<B: Backend> Stage<B> {
    fn forward(&self, be: &B, cfg: &VaeConfig, mut x: FeatureMap<B>, up: bool) -> Result<FeatureMap<B>> {
        for r in &self.resnets {
            x = r.forward(be, &x, None, cfg.norm_num_groups, EPS, cfg.act)?;
        }
        match (&self.resample, up) {
            (Some(c), true) => c.forward(be, &upsample2x(be, &x)?),
            (Some(c), false) => c.forward(be, &x),
            (None, _) => Ok(x),
        }
    }
}

/// Every layer of an autoencoder.
struct Layers<B: Backend> {
    encoder_conv_in: Conv2d<B>,
    down: Vec<Stage<B>>,
    encoder_mid: MidBlock<B>,
    encoder_norm_out: Norm<B>,
    encoder_conv_out: Conv2d<B>,
    quant_conv: Option<Conv2d<B>>,
    post_quant_conv: Option<Conv2d<B>>,
    decoder_conv_in: Conv2d<B>,
    decoder_mid: MidBlock<B>,
    up: Vec<Stage<B>>,
    decoder_norm_out: Norm<B>,
    decoder_conv_out: Conv2d<B>,
    /// FLUX.2's `bn.running_mean` and `bn.running_var`.
    latent_stats: Option<(B::Buffer, B::Buffer)>,
}

impl<B: Backend> Layers<B> {
    fn load(cfg: &VaeConfig, s: &mut impl Source<B>) -> Result<Self> {
        let (bo, n, l) = (&cfg.block_out_channels, cfg.block_out_channels.len(), cfg.latent_channels);
        let encoder_conv_in = Conv2d::load(s, "encoder.conv_in", cfg.in_channels, bo[0], 3)?;
        let mut down = Vec::with_capacity(n);
        let mut c = bo[0];
        for (i, &out) in bo.iter().enumerate() {
            let p = format!("encoder.down_blocks.{i}");
            let mut resnets = Vec::with_capacity(cfg.layers_per_block);
            for j in 0..cfg.layers_per_block {
                resnets.push(Resnet::load(s, &format!("{p}.resnets.{j}"), c, out, None)?);
                c = out;
            }
            // F.pad(x, (0, 1, 0, 1)), then 3x3 with stride 2: exactly half the size.
            let resample = optional(i + 1 < n, || {
                Ok(Conv2d::load(s, &format!("{p}.downsamplers.0.conv"), c, c, 3)?.strided(2, 0, 1))
            })?;
            down.push(Stage { resnets, resample });
        }
        let top = bo[n - 1];
        let encoder_mid = MidBlock::load(s, cfg, "encoder", top)?;
        let encoder_norm_out = Norm::load(s, "encoder.conv_norm_out", top)?;
        let encoder_conv_out = Conv2d::load(s, "encoder.conv_out", top, 2 * l, 3)?;
        let quant_conv = optional(cfg.use_quant_conv, || Conv2d::load(s, "quant_conv", 2 * l, 2 * l, 1))?;
        let post_quant_conv =
            optional(cfg.use_post_quant_conv, || Conv2d::load(s, "post_quant_conv", l, l, 1))?;
        let bo = &cfg.decoder_block_out_channels;
        let top = bo[n - 1];
        let decoder_conv_in = Conv2d::load(s, "decoder.conv_in", l, top, 3)?;
        let decoder_mid = MidBlock::load(s, cfg, "decoder", top)?;
        let mut up = Vec::with_capacity(n);
        let mut c = top;
        for (i, &out) in bo.iter().rev().enumerate() {
            let p = format!("decoder.up_blocks.{i}");
            let mut resnets = Vec::with_capacity(cfg.layers_per_block + 1);
            for j in 0..=cfg.layers_per_block {
                resnets.push(Resnet::load(s, &format!("{p}.resnets.{j}"), c, out, None)?);
                c = out;
            }
            let resample =
                optional(i + 1 < n, || Conv2d::load(s, &format!("{p}.upsamplers.0.conv"), c, c, 3))?;
            up.push(Stage { resnets, resample });
        }
        let decoder_norm_out = Norm::load(s, "decoder.conv_norm_out", bo[0])?;
        let decoder_conv_out = Conv2d::load(s, "decoder.conv_out", bo[0], cfg.out_channels, 3)?;
        let latent_stats = match cfg.latent_bn {
            Some(bn) => {
                let c = l * bn.patch * bn.patch;
                Some((s.f32("bn.running_mean".into(), &[c])?, s.f32("bn.running_var".into(), &[c])?))
            }
            None => None,
        };
        Ok(Layers {
            encoder_conv_in,
            down,
            encoder_mid,
            encoder_norm_out,
            encoder_conv_out,
            quant_conv,
            post_quant_conv,
            decoder_conv_in,
            decoder_mid,
            up,
            decoder_norm_out,
            decoder_conv_out,
            latent_stats,
        })
    }
}

image_model!(
    /// A variational autoencoder (diffusers' `AutoencoderKL`, and FLUX.2's) over backend `B`, with its weights.
    AutoencoderKl,
    VaeConfig,
    "diffusers"
);

impl<B: Backend> AutoencoderKl<B> {
    fn image_in(
        &self, data: &[f32], batch: usize, channels: usize, h: usize, w: usize,
    ) -> Result<FeatureMap<B>> {
        let want = crate::error::product("vae", &[batch, channels, h, w])?;
        crate::error::check_len("vae", "input", data.len(), want)?;
        Ok(FeatureMap { data: self.backend.upload(data)?, batch, channels, h, w })
    }

    /// Encodes `image (batch, in_channels, h, w)`; `h` and `w` multiples of
    /// [`VaeConfig::downscale`].
    pub fn encode(&self, image: &[f32], batch: usize, h: usize, w: usize) -> Result<LatentDist> {
        let (cfg, be, m) = (&self.config, &self.backend, &self.layers);
        let f = cfg.downscale();
        if h == 0 || w == 0 || !h.is_multiple_of(f) || !w.is_multiple_of(f) {
            return Err(CoreError::InvalidDimension {
                op: "vae encode",
                message: format!("the image is {h} x {w}; both sides must be positive multiples of {f}"),
            });
        }
        let x = self.image_in(image, batch, cfg.in_channels, h, w)?;
        let mut x = m.encoder_conv_in.forward(be, &x)?;
        for stage in &m.down {
            x = stage.forward(be, cfg, x, false)?;
        }
        let x = m.encoder_mid.forward(be, cfg, &x)?;
        let x = m.encoder_norm_out.group(be, &x, cfg.norm_num_groups, EPS, Some(cfg.act))?;
        let mut x = m.encoder_conv_out.forward(be, &x)?;
        if let Some(q) = &m.quant_conv {
            x = q.forward(be, &x)?;
        }
        // Channels [0, L) are the mean, [L, 2L) the log-variance, per image.
        let moments = be.download(&x.data)?;
        let (l, hw) = (cfg.latent_channels, x.h * x.w);
        let (mut mean, mut logvar) = (Vec::with_capacity(batch * l * hw), Vec::with_capacity(batch * l * hw));
        for b in 0..batch {
            let m = &moments[b * 2 * l * hw..(b + 1) * 2 * l * hw];
            mean.extend_from_slice(&m[..l * hw]);
            logvar.extend(m[l * hw..].iter().map(|v| v.clamp(-30.0, 20.0)));
        }
        Ok(LatentDist { mean, logvar, batch, channels: l, h: x.h, w: x.w })
    }

    /// Decodes `latent (batch, latent_channels, h, w)` to `(batch, out_channels, h * f, w * f)`,
    /// unclamped (a pipeline clamps to [-1, 1] when it writes pixels).
    pub fn decode(&self, latent: &[f32], batch: usize, h: usize, w: usize) -> Result<Vec<f32>> {
        let (cfg, be, m) = (&self.config, &self.backend, &self.layers);
        if h == 0 || w == 0 {
            return Err(CoreError::InvalidDimension {
                op: "vae decode",
                message: format!("the latent is {h} x {w}"),
            });
        }
        let mut x = self.image_in(latent, batch, cfg.latent_channels, h, w)?;
        if let Some(q) = &m.post_quant_conv {
            x = q.forward(be, &x)?;
        }
        let x = m.decoder_conv_in.forward(be, &x)?;
        let mut x = m.decoder_mid.forward(be, cfg, &x)?;
        for stage in &m.up {
            x = stage.forward(be, cfg, x, true)?;
        }
        let x = m.decoder_norm_out.group(be, &x, cfg.norm_num_groups, EPS, Some(cfg.act))?;
        let x = m.decoder_conv_out.forward(be, &x)?;
        be.download(&x.data)
    }
}

impl<B: Backend> AutoencoderKl<B> {
    /// The statistics of FLUX.2's patchified latents: `(mean, sqrt(var + eps))` per channel.
    fn latent_stats(&self, bn: LatentBatchNorm) -> Result<(Vec<f32>, Vec<f32>)> {
        let (mean, var) = self.layers.latent_stats.as_ref().ok_or(CoreError::InvalidArgument {
            op: "vae latents",
            message: "this autoencoder has no latent statistics".into(),
        })?;
        let (mean, var) = (self.backend.download(mean)?, self.backend.download(var)?);
        let std = var.iter().map(|v| libm::sqrtf(v + bn.eps)).collect();
        Ok((mean, std))
    }

    /// The autoencoder's latents `z (batch, latent_channels, h, w)` as the denoiser sees
    /// them, with their new `(channels, h, w)`: shifted and scaled (`AutoencoderKL`), or cut
    /// into `patch x patch` patches, channel `c * patch^2 + py * patch + px`, and normalized
    /// by the stored statistics (FLUX.2's `_patchify_latents` and batch norm).
    pub fn to_denoiser(
        &self, z: &[f32], batch: usize, h: usize, w: usize,
    ) -> Result<(Vec<f32>, usize, usize, usize)> {
        let cfg = &self.config;
        let l = cfg.latent_channels;
        crate::error::check_len(
            "to_denoiser",
            "z",
            z.len(),
            crate::error::product("to_denoiser", &[batch, l, h, w])?,
        )?;
        let Some(bn) = cfg.latent_bn else {
            let mut out = z.to_vec();
            cfg.to_denoiser(&mut out);
            return Ok((out, l, h, w));
        };
        let p = bn.patch;
        if !h.is_multiple_of(p) || !w.is_multiple_of(p) {
            return Err(CoreError::InvalidDimension {
                op: "to_denoiser",
                message: format!("the latent is {h} x {w}; both sides must be multiples of {p}"),
            });
        }
        let (mean, std) = self.latent_stats(bn)?;
        let (c2, h2, w2) = (l * p * p, h / p, w / p);
        let mut out = alloc::vec![0f32; z.len()];
        for b in 0..batch {
            for c in 0..l {
                for y in 0..h {
                    for x in 0..w {
                        let ch = (c * p + y % p) * p + x % p;
                        let v = z[((b * l + c) * h + y) * w + x];
                        out[((b * c2 + ch) * h2 + y / p) * w2 + x / p] = (v - mean[ch]) / std[ch];
                    }
                }
            }
        }
        Ok((out, c2, h2, w2))
    }

    /// The inverse of [`AutoencoderKl::to_denoiser`]: a denoiser's latents
    /// `(batch, channels, h, w)` back to `(batch, latent_channels, h', w')` for
    /// [`AutoencoderKl::decode`], with `(h', w')`.
    pub fn from_denoiser(
        &self, z: &[f32], batch: usize, h: usize, w: usize,
    ) -> Result<(Vec<f32>, usize, usize)> {
        let cfg = &self.config;
        let l = cfg.latent_channels;
        let p = cfg.latent_bn.map_or(1, |bn| bn.patch);
        let want = crate::error::product("from_denoiser", &[batch, l * p * p, h, w])?;
        crate::error::check_len("from_denoiser", "z", z.len(), want)?;
        let Some(bn) = cfg.latent_bn else {
            let mut out = z.to_vec();
            cfg.from_denoiser(&mut out);
            return Ok((out, h, w));
        };
        let (mean, std) = self.latent_stats(bn)?;
        let (c2, h1, w1) = (l * p * p, h * p, w * p);
        let mut out = alloc::vec![0f32; z.len()];
        for b in 0..batch {
            for c in 0..l {
                for y in 0..h1 {
                    for x in 0..w1 {
                        let ch = (c * p + y % p) * p + x % p;
                        let v = z[((b * c2 + ch) * h + y / p) * w + x / p];
                        out[((b * l + c) * h1 + y) * w1 + x] = v * std[ch] + mean[ch];
                    }
                }
            }
        }
        Ok((out, h1, w1))
    }
}
