//! The UNet of Stable Diffusion 1.x, 2.x and XL (core's [`Unet`](UnetModel) on the CPU),
//! loaded from a pipeline's `unet/` folder: `config.json` for every shape and diffusers'
//! `diffusion_pytorch_model.safetensors` (single or sharded, F32/BF16/F16). The options
//! of `UNet2DConditionModel` no Stable Diffusion release uses (class embeddings, LCM's
//! condition projection, scale-shift ResNets, ...) are refused by key.

use std::path::Path;

use rusting_brain_core::models::unet::{UnetConfig, UnetInput, UnetModel};
use rusting_brain_core::ops::q8::QuantFormat;

use crate::backend::cpu::CpuBackend;
use crate::io::config::Config;
use crate::{Precision, Result};

/// Reads a `UNet2DConditionModel`'s `config.json`, with diffusers' defaults for absent
/// keys. No weights are touched.
pub fn unet_config(path: &Path) -> Result<UnetConfig> {
    let c = Config::read(path)?;
    match c.str("_class_name") {
        Some("UNet2DConditionModel") | None => {}
        Some(other) => {
            return Err(c.err("_class_name", format!("{other:?}: this loader reads UNet2DConditionModel")))
        }
    }
    let names = |key: &str, default: &[&str]| -> Result<Vec<String>> {
        match c.get(key) {
            None => Ok(default.iter().map(|s| s.to_string()).collect()),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| c.err(key, format!("{x} is not a block name")))
                })
                .collect(),
            Some(x) => Err(c.err(key, format!("{x} is not a list of block names"))),
        }
    };
    let down = names(
        "down_block_types",
        &["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    )?;
    let up = names(
        "up_block_types",
        &["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    )?;
    let kinds = |key: &str, list: &[String], cross: &str, plain: &str| -> Result<Vec<bool>> {
        list.iter()
            .map(|b| match b.as_str() {
                x if x == cross => Ok(true),
                x if x == plain => Ok(false),
                other => Err(c.err(key, format!("{other}: only {cross} and {plain} are computed"))),
            })
            .collect()
    };
    let down_cross = kinds("down_block_types", &down, "CrossAttnDownBlock2D", "DownBlock2D")?;
    let up_cross = kinds("up_block_types", &up, "CrossAttnUpBlock2D", "UpBlock2D")?;
    let mid_block = match c.get("mid_block_type") {
        None => true,
        Some(v) => match v.as_str() {
            Some("UNetMidBlock2DCrossAttn") => true,
            _ => {
                return Err(c.err("mid_block_type", format!("{v}: only UNetMidBlock2DCrossAttn is computed")))
            }
        },
    };
    let block_out_channels = c.counts("block_out_channels", &[320, 640, 1280, 1280])?;
    let n = block_out_channels.len();
    if c.get("num_attention_heads").is_some() {
        return Err(
            c.err("num_attention_heads", "diffusers refuses it too: the heads are attention_head_dim")
        );
    }
    let cross_attention_dim = {
        let v = c.per_block("cross_attention_dim", 1280, n)?;
        if v.iter().any(|&x| x != v[0]) {
            return Err(c.err("cross_attention_dim", "one width per block is not computed"));
        }
        v[0]
    };
    // Options no Stable Diffusion release sets, refused rather than ignored.
    for key in [
        "class_embed_type",
        "time_cond_proj_dim",
        "encoder_hid_dim_type",
        "time_embedding_act_fn",
        "timestep_post_act",
        "reverse_transformer_layers_per_block",
        "num_class_embeds",
    ] {
        if c.get(key).is_some() {
            return Err(c.err(key, "set: this option of UNet2DConditionModel is not computed"));
        }
    }
    for (key, want) in [
        ("resnet_time_scale_shift", "default"),
        ("act_fn", "silu"),
        ("time_embedding_type", "positional"),
        ("attention_type", "default"),
    ] {
        if let Some(v) = c.str(key).filter(|v| *v != want) {
            return Err(c.err(key, format!("{v:?}: only {want:?} is computed")));
        }
    }
    for key in ["dual_cross_attention", "center_input_sample", "resnet_skip_time_act"] {
        if c.flag(key, false)? {
            return Err(c.err(key, "true: not computed"));
        }
    }
    if c.get("only_cross_attention").is_some_and(|v| v != &serde_json::Value::Bool(false)) {
        return Err(c.err("only_cross_attention", "only false is computed"));
    }
    for key in ["conv_in_kernel", "conv_out_kernel"] {
        if c.count(key, Some(3))? != 3 {
            return Err(c.err(key, "only 3 is computed"));
        }
    }
    for key in ["mid_block_scale_factor", "resnet_out_scale_factor"] {
        if c.float(key, 1.0)? != 1.0 {
            return Err(c.err(key, "only 1 is computed"));
        }
    }
    let addition_time_embed_dim = match c.str("addition_embed_type") {
        None => None,
        Some("text_time") => Some(c.count("addition_time_embed_dim", None)?),
        Some(other) => {
            return Err(c.err("addition_embed_type", format!("{other:?}: only \"text_time\" is computed")))
        }
    };
    let config = UnetConfig {
        in_channels: c.count("in_channels", Some(4))?,
        out_channels: c.count("out_channels", Some(4))?,
        down_cross,
        up_cross,
        layers_per_block: c.per_block("layers_per_block", 2, n)?,
        transformer_layers_per_block: c.per_block("transformer_layers_per_block", 1, n)?,
        heads: c.per_block("attention_head_dim", 8, n)?,
        cross_attention_dim,
        norm_num_groups: c.count("norm_num_groups", Some(32))?,
        norm_eps: c.float("norm_eps", 1e-5)?,
        use_linear_projection: c.flag("use_linear_projection", false)?,
        flip_sin_to_cos: c.flag("flip_sin_to_cos", true)?,
        freq_shift: c.float("freq_shift", 0.0)?,
        mid_block,
        addition_time_embed_dim,
        projection_class_embeddings_input_dim: match addition_time_embed_dim {
            Some(_) => c.count("projection_class_embeddings_input_dim", None)?,
            None => 0,
        },
        downsample_padding: c.count("downsample_padding", Some(1))?,
        block_out_channels,
    };
    config.validate().map_err(|e| c.err("config", format!("describes no valid UNet: {e}")))?;
    Ok(config)
}

/// A Stable Diffusion UNet on the CPU.
pub struct Unet {
    model: UnetModel<CpuBackend>,
}

impl Unet {
    /// The UNet in `dir` (a pipeline's `unet/`) in f32.
    pub fn load(dir: impl AsRef<Path>) -> Result<Unet> {
        Unet::load_at(dir, Precision::F32)
    }

    /// [`Unet::load`] at `precision`: at [`Precision::Q8`] every `Linear` matrix and every
    /// convolution's weight is int8 with one scale a row (an output channel), each
    /// activation row (a convolution's: each pixel's patch) rounded to int8 to meet it
    /// (W8A8: on CPUs with AVX-512 VNNI the fastest path); norms and biases stay f32. At
    /// [`Precision::Q4`] the `Linear` matrices are 4-bit and the convolutions int8 as at Q8.
    pub fn load_at(dir: impl AsRef<Path>, precision: Precision) -> Result<Unet> {
        let dir = dir.as_ref();
        let config = unet_config(&dir.join("config.json"))?;
        let (weights, q8) = crate::image::encoders::read_weights(
            dir,
            &["diffusion_pytorch_model", "model"],
            &config.layout(),
            |n| n.to_string(),
            |_| false,
            |n, s| {
                // The convolutions' weights as int8 rows, one an output channel (reordered
                // channels last when the layers are built), at Q8 and at Q4 alike: there
                // is no 4-bit convolution, and f32 ones would leave a 4-bit UNet larger
                // and slower than an int8 one.
                let format = crate::io::precision::denoiser_format(precision)?;
                match s.len() {
                    2 if n.ends_with(".weight") => Some(format),
                    4 if n.ends_with(".weight") => Some(QuantFormat::Q8Rows),
                    _ => None,
                }
            },
        )?;
        Ok(Unet { model: UnetModel::with_q8(CpuBackend::new(), config, weights, q8)? })
    }

    /// Mixed precision: the convolutions, the f32 matrices and the attention multiply
    /// bf16-rounded operands and sum in f32 (on CPUs with AVX512_BF16 at about twice the
    /// f32 rate; elsewhere the same numbers at f32's speed). Off when loaded.
    pub fn set_mixed_precision(&mut self, on: bool) {
        self.model.set_mixed_precision(on);
    }

    /// The architecture read from the folder.
    pub fn config(&self) -> &UnetConfig {
        self.model.config()
    }

    /// Weights and biases.
    pub fn parameter_count(&self) -> usize {
        self.config().layout().parameter_count()
    }

    /// Bytes the weights hold.
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    /// The predicted noise (or velocity) for `input`, `(batch, out_channels, h, w)`.
    pub fn forward(&self, input: &UnetInput<'_>) -> Result<Vec<f32>> {
        Ok(self.model.forward(input)?)
    }
}
