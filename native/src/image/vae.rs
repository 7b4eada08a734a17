//! The image autoencoder of a published pipeline folder, and pictures in and out.
//!
//! [`Vae::load`] reads a `vae/` folder as diffusers saves it (`AutoencoderKL` or FLUX.2's
//! `AutoencoderKLFlux2`; `config.json` and
//! `diffusion_pytorch_model.safetensors`, single or sharded, F32/BF16/F16) into
//! `AutoencoderKL` (core's [`AutoencoderKl`], on the CPU backend, in f32 whatever the stored
//! dtype: the fp16 trap `force_upcast` guards against cannot happen). Every shape comes
//! from `config.json`.
//!
//! `save_png` and `load_image` (feature `images`) move between files and [`Image`]s,
//! three channels in [-1, 1], the range the autoencoder works in.

use std::path::Path;

use rusting_brain_core::backend::Unary;
use rusting_brain_core::models::vae::{AutoencoderKl, LatentBatchNorm, LatentDist, VaeConfig};
use serde_json::Value;

use crate::io::config::Config;

use crate::backend::cpu::CpuBackend;
use crate::{NetworkError, Result};

/// The blocks an `AutoencoderKL` is built of; any other name is refused by name.
const DOWN: &str = "DownEncoderBlock2D";
const UP: &str = "UpDecoderBlock2D";

/// An autoencoder's `config.json` (`AutoencoderKL`, `AutoencoderKLFlux2`); no weights read.
pub fn vae_config(path: &Path) -> Result<VaeConfig> {
    parse_config(&Config::read(path)?)
}

/// An image autoencoder (`AutoencoderKL`) on the CPU.
pub struct Vae {
    model: AutoencoderKl<CpuBackend>,
}

impl Vae {
    /// The autoencoder in `dir` (a pipeline's `vae/` folder).
    pub fn load(dir: impl AsRef<Path>) -> Result<Vae> {
        let dir = dir.as_ref();
        let config_path = dir.join("config.json");
        let config = parse_config(&Config::read(&config_path)?)?;
        let layout = config.layout();
        let (weights, _) = crate::image::encoders::read_weights(
            dir,
            &["diffusion_pytorch_model", "model"],
            &layout,
            |n| n.to_string(),
            // BatchNorm's step counter (an int64): training state, not a weight.
            |n| n == "bn.num_batches_tracked",
            |_, _| None,
        )?;
        Ok(Vae { model: AutoencoderKl::new(CpuBackend::new(), config, weights)? })
    }

    /// Mixed precision: the convolutions, the f32 matrices and the attention multiply
    /// bf16-rounded operands and sum in f32 (on CPUs with AVX512_BF16 at about twice the
    /// f32 rate; elsewhere the same numbers at f32's speed). Off when loaded.
    pub fn set_mixed_precision(&mut self, on: bool) {
        self.model.set_mixed_precision(on);
    }

    /// Bytes the weights hold.
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    /// The architecture read from the folder.
    pub fn config(&self) -> &VaeConfig {
        self.model.config()
    }

    /// Number of learned weights (from the configuration, as loaded): FLUX.2's latent
    /// statistics are buffers, not parameters, and are not counted (as in PyTorch).
    pub fn parameter_count(&self) -> usize {
        let layout = self.config().layout();
        let stats: usize = layout
            .tensors
            .iter()
            .filter(|(n, _)| n.starts_with("bn.running_"))
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        layout.parameter_count() - stats
    }

    /// The latent distribution of `pixels` (`batch` images of `(channels, height, width)`
    /// in [-1, 1]); the sides must be multiples of [`VaeConfig::downscale`].
    pub fn encode(&self, pixels: &[f32], batch: usize, height: usize, width: usize) -> Result<LatentDist> {
        Ok(self.model.encode(pixels, batch, height, width)?)
    }

    /// Pixels from latents `(batch, latent_channels, h, w)`, in the autoencoder's range
    /// (about [-1, 1], not clamped).
    pub fn decode(&self, latent: &[f32], batch: usize, h: usize, w: usize) -> Result<Vec<f32>> {
        Ok(self.model.decode(latent, batch, h, w)?)
    }

    /// The autoencoder's latents `(batch, latent_channels, h, w)` as a denoiser sees them,
    /// with their `(channels, h, w)`: shifted and scaled, or for FLUX.2 patchified 2x2 and
    /// normalized by the stored statistics.
    pub fn to_denoiser(
        &self, z: &[f32], batch: usize, h: usize, w: usize,
    ) -> Result<(Vec<f32>, usize, usize, usize)> {
        Ok(self.model.to_denoiser(z, batch, h, w)?)
    }

    /// A denoiser's latents back to the autoencoder's, with their `(h, w)`.
    pub fn from_denoiser(
        &self, z: &[f32], batch: usize, h: usize, w: usize,
    ) -> Result<(Vec<f32>, usize, usize)> {
        Ok(self.model.from_denoiser(z, batch, h, w)?)
    }

    /// One [`Image`] to its latent mean (`sample_mode="argmax"`, what img2img pipelines
    /// start from before their noise).
    pub fn encode_image(&self, image: &Image) -> Result<LatentDist> {
        if image.channels != self.config().in_channels {
            return Err(NetworkError::InvalidInput(format!(
                "the image has {} channels; the autoencoder takes {}",
                image.channels,
                self.config().in_channels
            )));
        }
        self.encode(&image.data, 1, image.height, image.width)
    }

    /// Latents of one image `(latent_channels, h, w)` to an [`Image`], clamped to [-1, 1].
    pub fn decode_image(&self, latent: &[f32], h: usize, w: usize) -> Result<Image> {
        let f = self.config().downscale();
        let mut data = self.decode(latent, 1, h, w)?;
        data.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0));
        Ok(Image { width: w * f, height: h * f, channels: self.config().out_channels, data })
    }
}

/// `AutoencoderKL`'s `config.json`: every key that decides a shape, read and checked;
/// anything the definition does not compute is refused by name.
fn parse_config(c: &Config<'_>) -> Result<VaeConfig> {
    let err = |key: &str, msg: String| c.err(key, msg);
    let class = c.str("_class_name").unwrap_or("AutoencoderKL");
    let flux2 = match class {
        "AutoencoderKL" => false,
        "AutoencoderKLFlux2" => true,
        _ => {
            return Err(err(
                "_class_name",
                format!("{class}: this loader reads AutoencoderKL and AutoencoderKLFlux2 folders"),
            ))
        }
    };
    let int = |key: &str, default: usize| c.count(key, Some(default));
    let block_out_channels = c.counts("block_out_channels", &[64])?;
    let decoder_block_out_channels = c.counts("decoder_block_out_channels", &block_out_channels)?;
    for (key, want) in [("down_block_types", DOWN), ("up_block_types", UP)] {
        let types: Vec<&str> = match c.get(key) {
            Some(Value::Array(a)) => a.iter().map(|t| t.as_str().unwrap_or("?")).collect(),
            None => vec![want; block_out_channels.len()],
            Some(x) => return Err(err(key, format!("{x} is not a list"))),
        };
        if types.len() != block_out_channels.len() {
            return Err(err(
                key,
                format!("{} blocks, but block_out_channels has {}", types.len(), block_out_channels.len()),
            ));
        }
        if let Some(t) = types.iter().find(|t| **t != want) {
            return Err(err(key, format!("{t}: an AutoencoderKL is built of {want}s")));
        }
    }
    let act_name = c.str("act_fn").unwrap_or("silu");
    let act =
        Unary::from_hf(act_name).ok_or_else(|| err("act_fn", format!("{act_name} is not supported")))?;
    for key in ["latents_mean", "latents_std"] {
        if c.get(key).is_some() {
            return Err(err(
                key,
                "per-channel latent statistics are not supported by this loader yet".into(),
            ));
        }
    }
    let latent_bn = if flux2 {
        let patch = match c.get("patch_size") {
            None => 2,
            Some(Value::Array(a)) if a.len() == 2 && a[0] == a[1] => {
                a[0].as_u64().and_then(|n| usize::try_from(n).ok()).unwrap_or(0)
            }
            Some(x) => return Err(err("patch_size", format!("{x}: square patches only"))),
        };
        Some(LatentBatchNorm { patch, eps: c.float("batch_norm_eps", 1e-4)? })
    } else {
        None
    };
    let config = VaeConfig {
        in_channels: int("in_channels", 3)?,
        out_channels: int("out_channels", 3)?,
        latent_channels: int("latent_channels", 4)?,
        block_out_channels,
        decoder_block_out_channels,
        layers_per_block: int("layers_per_block", 1)?,
        norm_num_groups: int("norm_num_groups", 32)?,
        act,
        scaling_factor: c.float("scaling_factor", 0.18215)?,
        shift_factor: c.float("shift_factor", 0.0)?,
        use_quant_conv: c.flag("use_quant_conv", true)?,
        use_post_quant_conv: c.flag("use_post_quant_conv", true)?,
        mid_block_add_attention: c.flag("mid_block_add_attention", true)?,
        latent_bn,
    };
    config.validate().map_err(|e| err("config", format!("describes no valid autoencoder: {e}")))?;
    Ok(config)
}

/// A picture, channels first, values in [-1, 1]: `data[(c * height + y) * width + x]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    /// Columns.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Channels (3 for RGB).
    pub channels: usize,
    /// `channels x height x width` values in [-1, 1].
    pub data: Vec<f32>,
}

/// Writes a 3-channel [`Image`] as an 8-bit RGB PNG, atomically (a crash leaves the old
/// file or the new one). Values are clamped to [-1, 1] and mapped to 0..=255 by rounding.
#[cfg(feature = "images")]
pub fn save_png(image: &Image, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let bytes =
        encode_png(image).map_err(|e| NetworkError::InvalidInput(format!("{}: {e}", path.display())))?;
    crate::io::files::write_atomic(path, &bytes)
}

/// The bytes of the PNG [`save_png`] writes: 8-bit RGB, values clamped to [-1, 1] and
/// mapped to 0..=255 by rounding (what a server sends as `b64_json`).
#[cfg(feature = "images")]
pub fn encode_png(image: &Image) -> Result<Vec<u8>> {
    let n = image
        .width
        .checked_mul(image.height)
        .ok_or_else(|| NetworkError::InvalidInput("image size overflows".into()))?;
    if image.channels != 3 || image.data.len() != 3 * n || n == 0 {
        return Err(NetworkError::InvalidInput(format!(
            "a PNG takes 3 channels of {} x {} values; the image has {} channels and {} values",
            image.width,
            image.height,
            image.channels,
            image.data.len()
        )));
    }
    if let Some(i) = image.data.iter().position(|v| !v.is_finite()) {
        return Err(NetworkError::InvalidInput(format!(
            "pixel value {i} is {}: nothing to write",
            image.data[i]
        )));
    }
    let mut rgb = vec![0u8; 3 * n];
    for c in 0..3 {
        for p in 0..n {
            let v = image.data[c * n + p].clamp(-1.0, 1.0);
            rgb[3 * p + c] = ((v + 1.0) * 127.5).round() as u8;
        }
    }
    let (w, h) = (
        u32::try_from(image.width).map_err(|_| NetworkError::InvalidInput("image too wide".into()))?,
        u32::try_from(image.height).map_err(|_| NetworkError::InvalidInput("image too tall".into()))?,
    );
    let mut bytes = Vec::new();
    image::codecs::png::PngEncoder::new(&mut bytes)
        .write_image(&rgb, w, h, image::ExtendedColorType::Rgb8)
        .map_err(|e| NetworkError::InvalidInput(format!("encoding a PNG: {e}")))?;
    Ok(bytes)
}

/// Reads a PNG, JPEG or BMP as a 3-channel [`Image`] in [-1, 1] (alpha dropped, grey
/// repeated), at its own size.
#[cfg(feature = "images")]
pub fn load_image(path: impl AsRef<Path>) -> Result<Image> {
    let path = path.as_ref();
    let img = image::open(path).map_err(|e| NetworkError::parse(path, "image", e.to_string()))?;
    let rgb = img.to_rgb8();
    let (width, height) = (rgb.width() as usize, rgb.height() as usize);
    let n = width * height;
    let mut data = vec![0f32; 3 * n];
    for (p, px) in rgb.pixels().enumerate() {
        for c in 0..3 {
            data[c * n + p] = px.0[c] as f32 / 127.5 - 1.0;
        }
    }
    Ok(Image { width, height, channels: 3, data })
}

#[cfg(feature = "images")]
use image::ImageEncoder;
