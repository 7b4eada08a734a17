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
use crate::models::layers::{
    conv, group_norm, resnet, spatial_attention, upsample2x, Image, Layout, Weights,
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
        for (what, v) in [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("latent_channels", self.latent_channels),
            ("layers_per_block", self.layers_per_block),
            ("norm_num_groups", self.norm_num_groups),
        ] {
            if v == 0 {
                return bad(format!("{what} must be at least 1"));
            }
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

    /// Every tensor, under diffusers' names, in definition order.
    pub fn layout(&self) -> Layout {
        let mut l = Layout::default();
        let bo = &self.block_out_channels;
        let (n, top) = (bo.len(), bo[bo.len() - 1]);
        // Encoder
        l.conv("encoder.conv_in", self.in_channels, bo[0], 3);
        let mut c = bo[0];
        for (i, &out) in bo.iter().enumerate() {
            for j in 0..self.layers_per_block {
                l.resnet(&format!("encoder.down_blocks.{i}.resnets.{j}"), c, out);
                c = out;
            }
            if i + 1 < n {
                l.conv(&format!("encoder.down_blocks.{i}.downsamplers.0.conv"), c, c, 3);
            }
        }
        self.mid_layout(&mut l, "encoder", top);
        l.norm("encoder.conv_norm_out", top);
        l.conv("encoder.conv_out", top, 2 * self.latent_channels, 3);
        if self.use_quant_conv {
            l.conv("quant_conv", 2 * self.latent_channels, 2 * self.latent_channels, 1);
        }
        // Decoder
        if self.use_post_quant_conv {
            l.conv("post_quant_conv", self.latent_channels, self.latent_channels, 1);
        }
        let bo = &self.decoder_block_out_channels;
        let top = bo[n - 1];
        l.conv("decoder.conv_in", self.latent_channels, top, 3);
        self.mid_layout(&mut l, "decoder", top);
        let mut c = top;
        for (i, &out) in bo.iter().rev().enumerate() {
            for j in 0..=self.layers_per_block {
                l.resnet(&format!("decoder.up_blocks.{i}.resnets.{j}"), c, out);
                c = out;
            }
            if i + 1 < n {
                l.conv(&format!("decoder.up_blocks.{i}.upsamplers.0.conv"), c, c, 3);
            }
        }
        l.norm("decoder.conv_norm_out", bo[0]);
        l.conv("decoder.conv_out", bo[0], self.out_channels, 3);
        if let Some(bn) = self.latent_bn {
            let c = self.latent_channels * bn.patch * bn.patch;
            l.push("bn.running_mean".into(), alloc::vec![c]);
            l.push("bn.running_var".into(), alloc::vec![c]);
        }
        l
    }

    fn mid_layout(&self, l: &mut Layout, part: &str, c: usize) {
        l.resnet(&format!("{part}.mid_block.resnets.0"), c, c);
        if self.mid_block_add_attention {
            l.spatial_attention(&format!("{part}.mid_block.attentions.0"), c);
        }
        l.resnet(&format!("{part}.mid_block.resnets.1"), c, c);
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

/// A variational autoencoder (diffusers' `AutoencoderKL`, and FLUX.2's) over backend `B`, with its weights.
pub struct AutoencoderKl<B: Backend> {
    backend: B,
    config: VaeConfig,
    weights: Weights<B>,
}

impl<B: Backend> AutoencoderKl<B> {
    /// Bytes the weights hold (see [`Weights::bytes`]).
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes(&self.backend)
    }

    /// The model over `weights` (every tensor of [`VaeConfig::layout`], nothing else).
    pub fn new(backend: B, config: VaeConfig, weights: BTreeMap<String, B::Buffer>) -> Result<Self> {
        config.validate()?;
        let weights = Weights::new(&backend, &config.layout(), weights)?;
        Ok(AutoencoderKl { backend, config, weights })
    }

    /// The architecture.
    pub fn config(&self) -> &VaeConfig {
        &self.config
    }
    /// The backend it runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    fn image_in(&self, data: &[f32], batch: usize, channels: usize, h: usize, w: usize) -> Result<Image<B>> {
        let want = crate::error::product("vae", &[batch, channels, h, w])?;
        crate::error::check_len("vae", "input", data.len(), want)?;
        Ok(Image { data: self.backend.upload(data)?, batch, channels, h, w })
    }

    fn mid(&self, part: &str, x: &Image<B>) -> Result<Image<B>> {
        let (be, w, g, act) = (&self.backend, &self.weights, self.config.norm_num_groups, self.config.act);
        let c = x.channels;
        let mut x = resnet(be, w, &format!("{part}.mid_block.resnets.0"), x, c, g, EPS, act)?;
        if self.config.mid_block_add_attention {
            x = spatial_attention(be, w, &format!("{part}.mid_block.attentions.0"), &x, g, EPS)?;
        }
        resnet(be, w, &format!("{part}.mid_block.resnets.1"), &x, c, g, EPS, act)
    }

    /// Encodes `image (batch, in_channels, h, w)`; `h` and `w` multiples of
    /// [`VaeConfig::downscale`].
    pub fn encode(&self, image: &[f32], batch: usize, h: usize, w: usize) -> Result<LatentDist> {
        let cfg = &self.config;
        let f = cfg.downscale();
        if h == 0 || w == 0 || !h.is_multiple_of(f) || !w.is_multiple_of(f) {
            return Err(CoreError::InvalidDimension {
                op: "vae encode",
                message: format!("the image is {h} x {w}; both sides must be positive multiples of {f}"),
            });
        }
        let (be, wt, g, act) = (&self.backend, &self.weights, cfg.norm_num_groups, cfg.act);
        let bo = &cfg.block_out_channels;
        let x = self.image_in(image, batch, cfg.in_channels, h, w)?;
        let mut x = conv(be, wt, "encoder.conv_in", &x, bo[0], 3, 1, 1, 0)?;
        for (i, &out) in bo.iter().enumerate() {
            for j in 0..cfg.layers_per_block {
                x = resnet(be, wt, &format!("encoder.down_blocks.{i}.resnets.{j}"), &x, out, g, EPS, act)?;
            }
            if i + 1 < bo.len() {
                // F.pad(x, (0, 1, 0, 1)), then 3x3 with stride 2: exactly half the size.
                let c = x.channels;
                x = conv(be, wt, &format!("encoder.down_blocks.{i}.downsamplers.0.conv"), &x, c, 3, 2, 0, 1)?;
            }
        }
        let x = self.mid("encoder", &x)?;
        let x = group_norm(be, wt, "encoder.conv_norm_out", &x, g, EPS, Some(act))?;
        let mut x = conv(be, wt, "encoder.conv_out", &x, 2 * cfg.latent_channels, 3, 1, 1, 0)?;
        if cfg.use_quant_conv {
            x = conv(be, wt, "quant_conv", &x, 2 * cfg.latent_channels, 1, 1, 0, 0)?;
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
        let cfg = &self.config;
        if h == 0 || w == 0 {
            return Err(CoreError::InvalidDimension {
                op: "vae decode",
                message: format!("the latent is {h} x {w}"),
            });
        }
        let (be, wt, g, act) = (&self.backend, &self.weights, cfg.norm_num_groups, cfg.act);
        let bo = &cfg.decoder_block_out_channels;
        let mut x = self.image_in(latent, batch, cfg.latent_channels, h, w)?;
        if cfg.use_post_quant_conv {
            x = conv(be, wt, "post_quant_conv", &x, cfg.latent_channels, 1, 1, 0, 0)?;
        }
        let x = conv(be, wt, "decoder.conv_in", &x, bo[bo.len() - 1], 3, 1, 1, 0)?;
        let mut x = self.mid("decoder", &x)?;
        for (i, &out) in bo.iter().rev().enumerate() {
            for j in 0..=cfg.layers_per_block {
                x = resnet(be, wt, &format!("decoder.up_blocks.{i}.resnets.{j}"), &x, out, g, EPS, act)?;
            }
            if i + 1 < bo.len() {
                let up = upsample2x(be, &x)?;
                x = conv(be, wt, &format!("decoder.up_blocks.{i}.upsamplers.0.conv"), &up, out, 3, 1, 1, 0)?;
            }
        }
        let x = group_norm(be, wt, "decoder.conv_norm_out", &x, g, EPS, Some(act))?;
        let x = conv(be, wt, "decoder.conv_out", &x, cfg.out_channels, 3, 1, 1, 0)?;
        be.download(&x.data)
    }
}

impl<B: Backend> AutoencoderKl<B> {
    /// The statistics of FLUX.2's patchified latents: `(mean, sqrt(var + eps))` per channel.
    fn latent_stats(&self, bn: LatentBatchNorm) -> Result<(Vec<f32>, Vec<f32>)> {
        let mean = self.backend.download(self.weights.get("bn.running_mean")?)?;
        let var = self.backend.download(self.weights.get("bn.running_var")?)?;
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
