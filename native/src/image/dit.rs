//! The diffusion transformers of the image pipelines (core's [`Dit`](DitModel) on the CPU),
//! loaded from a pipeline's `transformer/` folder: `config.json` for every shape, and the
//! weights in either published spelling, told apart by the tensor names alone:
//!
//! - diffusers' (`x_embedder`, `transformer_blocks.N.attn.to_q`, ...), as
//!   `save_pretrained` writes them (`diffusion_pytorch_model.safetensors`, single or
//!   sharded);
//! - the original one of the releases, in one file of any name, with no, one or a doubled
//!   `model.diffusion_model.` prefix: Black Forest Labs' for FLUX (`img_in`,
//!   `double_blocks.N.img_attn.qkv`, ...), Stability AI's for SD3 (`x_embedder.proj`,
//!   `joint_blocks.N.x_block.attn.qkv`, ...). Fused q/k/v (and FLUX.1's fused
//!   single-block input projection) are read as row ranges, and the continuous adaLN
//!   weights' halves are swapped (the originals store shift then scale, diffusers scale
//!   then shift). An SD3 file that also carries its text encoders and autoencoder
//!   (`text_encoders.*`, `first_stage_model.*`) loads its transformer.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use rusting_brain_core::models::dit::{DitConfig, DitInput, DitKind, DitModel};
use rusting_brain_core::models::image::blocks::Layout;

use crate::backend::cpu::CpuBackend;
use crate::io::config::Config;
use crate::io::weights::{Files, Prefetch, Tensors};
use crate::{NetworkError, Precision, Result};

/// The file stems diffusers writes a denoiser under.
const STEMS: &[&str] = &["diffusion_pytorch_model", "model"];

/// The prefix ComfyUI exports put on every name, sometimes twice.
const COMFY_PREFIX: &str = "model.diffusion_model.";

/// Reads a transformer's `config.json` (`FluxTransformer2DModel`,
/// `Flux2Transformer2DModel` or `SD3Transformer2DModel`), with diffusers' defaults for
/// absent keys. No weights are touched: [`DitConfig::layout`] then counts parameters.
pub fn dit_config(path: &Path) -> Result<DitConfig> {
    let c = Config::read(path)?;
    let class = c.str("_class_name").unwrap_or("");
    let kind = match class {
        "FluxTransformer2DModel" => DitKind::Flux,
        "Flux2Transformer2DModel" => DitKind::Flux2,
        "SD3Transformer2DModel" => DitKind::Sd3,
        other => {
            return Err(c.err(
                "_class_name",
                format!(
                    "{other:?}: this loader reads FluxTransformer2DModel, Flux2Transformer2DModel and SD3Transformer2DModel"
                ),
            ))
        }
    };
    let config = match kind {
        DitKind::Flux => {
            let in_channels = c.count("in_channels", Some(64))?;
            DitConfig {
                kind,
                patch_size: c.count("patch_size", Some(1))?,
                in_channels,
                out_channels: c.count("out_channels", Some(in_channels))?,
                num_layers: c.count("num_layers", Some(19))?,
                num_single_layers: c.count("num_single_layers", Some(38))?,
                attention_head_dim: c.count("attention_head_dim", Some(128))?,
                num_attention_heads: c.count("num_attention_heads", Some(24))?,
                joint_attention_dim: c.count("joint_attention_dim", Some(4096))?,
                pooled_projection_dim: c.count("pooled_projection_dim", Some(768))?,
                guidance_embeds: c.flag("guidance_embeds", false)?,
                axes_dims_rope: c.counts("axes_dims_rope", &[16, 56, 56])?,
                rope_theta: 10000.0,
                mlp_ratio: 4.0,
                timestep_channels: 256,
                eps: 1e-6,
                pos_embed_max_size: 0,
                dual_attention_layers: Vec::new(),
                qk_norm: true,
            }
        }
        DitKind::Flux2 => {
            let in_channels = c.count("in_channels", Some(128))?;
            DitConfig {
                kind,
                patch_size: c.count("patch_size", Some(1))?,
                in_channels,
                out_channels: c.count("out_channels", Some(in_channels))?,
                num_layers: c.count("num_layers", Some(8))?,
                num_single_layers: c.count("num_single_layers", Some(48))?,
                attention_head_dim: c.count("attention_head_dim", Some(128))?,
                num_attention_heads: c.count("num_attention_heads", Some(48))?,
                joint_attention_dim: c.count("joint_attention_dim", Some(15360))?,
                pooled_projection_dim: 0,
                guidance_embeds: c.flag("guidance_embeds", true)?,
                axes_dims_rope: c.counts("axes_dims_rope", &[32, 32, 32, 32])?,
                rope_theta: c.float("rope_theta", 2000.0)? as f64,
                mlp_ratio: c.float("mlp_ratio", 3.0)?,
                timestep_channels: c.count("timestep_guidance_channels", Some(256))?,
                eps: c.float("eps", 1e-6)?,
                pos_embed_max_size: 0,
                dual_attention_layers: Vec::new(),
                qk_norm: true,
            }
        }
        DitKind::Sd3 => {
            let heads = c.count("num_attention_heads", Some(18))?;
            let head_dim = c.count("attention_head_dim", Some(64))?;
            let caption = c.count("caption_projection_dim", Some(1152))?;
            if caption != heads * head_dim {
                return Err(c.err(
                    "caption_projection_dim",
                    format!(
                        "{caption}: the joint attention needs it equal to the model width ({heads} x {head_dim})"
                    ),
                ));
            }
            let qk_norm = match c.str("qk_norm") {
                None => false,
                Some("rms_norm") => true,
                Some(other) => {
                    return Err(c.err("qk_norm", format!("{other:?}: only \"rms_norm\" is computed")))
                }
            };
            let in_channels = c.count("in_channels", Some(16))?;
            DitConfig {
                kind,
                patch_size: c.count("patch_size", Some(2))?,
                in_channels,
                out_channels: c.count("out_channels", Some(in_channels))?,
                num_layers: c.count("num_layers", Some(18))?,
                num_single_layers: 0,
                attention_head_dim: head_dim,
                num_attention_heads: heads,
                joint_attention_dim: c.count("joint_attention_dim", Some(4096))?,
                pooled_projection_dim: c.count("pooled_projection_dim", Some(2048))?,
                guidance_embeds: false,
                axes_dims_rope: Vec::new(),
                rope_theta: 0.0,
                mlp_ratio: 4.0,
                timestep_channels: 256,
                eps: 1e-6,
                pos_embed_max_size: c.count("pos_embed_max_size", Some(96))?,
                dual_attention_layers: c.counts("dual_attention_layers", &[])?,
                qk_norm,
            }
        }
    };
    config.validate().map_err(|e| c.err("config", format!("describes no valid transformer: {e}")))?;
    Ok(config)
}

/// How a checkpoint names its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spelling {
    /// diffusers' module names.
    Diffusers,
    /// The original release's names (BFL for FLUX), after `prefix` (empty, or
    /// `model.diffusion_model.` once or more).
    Original {
        /// What comes before each original name.
        prefix: String,
    },
}

/// Where one of diffusers' tensors lies in a stored file: a name, a row range of it, and
/// whether its two halves are to be swapped.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Source {
    name: String,
    /// `(rows, of)`: rows of a fused tensor of `of` rows; `None` for all of it.
    rows: Option<(Range<usize>, usize)>,
    swap_halves: bool,
}

impl Source {
    fn whole(name: String) -> Source {
        Source { name, rows: None, swap_halves: false }
    }
    fn part(name: String, rows: Range<usize>, of: usize) -> Source {
        Source { name, rows: Some((rows, of)), swap_halves: false }
    }
}

/// Tells the spelling from the names in a header.
pub fn detect_spelling<'a>(names: impl IntoIterator<Item = &'a str>) -> Spelling {
    for name in names {
        let mut rest = name;
        let mut prefix = String::new();
        while let Some(r) = rest.strip_prefix(COMFY_PREFIX) {
            rest = r;
            prefix.push_str(COMFY_PREFIX);
        }
        let original = [
            "double_blocks.",
            "single_blocks.",
            "img_in.",
            "final_layer.",
            "joint_blocks.",
            "x_embedder.proj.",
        ];
        if original.iter().any(|o| rest.starts_with(o)) {
            return Spelling::Original { prefix };
        }
        let diffusers =
            ["transformer_blocks.", "single_transformer_blocks.", "x_embedder.weight", "proj_out."];
        if diffusers.iter().any(|d| rest.starts_with(d)) {
            return Spelling::Diffusers;
        }
    }
    Spelling::Diffusers
}

/// The BFL name of a diffusers tensor of FLUX.1 or FLUX.2 (`d` the model width, `m` the
/// MLP width), without the prefix.
fn bfl_source(kind: DitKind, name: &str, d: usize, m: usize) -> Option<Source> {
    let (stem, param) = name.rsplit_once('.')?;
    let whole = |s: &str| Some(Source::whole(format!("{s}.{param}")));
    let top = match (kind, stem) {
        (DitKind::Flux, "time_text_embed.timestep_embedder.linear_1")
        | (DitKind::Flux2, "time_guidance_embed.timestep_embedder.linear_1") => Some("time_in.in_layer"),
        (DitKind::Flux, "time_text_embed.timestep_embedder.linear_2")
        | (DitKind::Flux2, "time_guidance_embed.timestep_embedder.linear_2") => Some("time_in.out_layer"),
        (DitKind::Flux, "time_text_embed.guidance_embedder.linear_1")
        | (DitKind::Flux2, "time_guidance_embed.guidance_embedder.linear_1") => Some("guidance_in.in_layer"),
        (DitKind::Flux, "time_text_embed.guidance_embedder.linear_2")
        | (DitKind::Flux2, "time_guidance_embed.guidance_embedder.linear_2") => Some("guidance_in.out_layer"),
        (DitKind::Flux, "time_text_embed.text_embedder.linear_1") => Some("vector_in.in_layer"),
        (DitKind::Flux, "time_text_embed.text_embedder.linear_2") => Some("vector_in.out_layer"),
        (_, "double_stream_modulation_img.linear") => Some("double_stream_modulation_img.lin"),
        (_, "double_stream_modulation_txt.linear") => Some("double_stream_modulation_txt.lin"),
        (_, "single_stream_modulation.linear") => Some("single_stream_modulation.lin"),
        (_, "context_embedder") => Some("txt_in"),
        (_, "x_embedder") => Some("img_in"),
        (_, "proj_out") => Some("final_layer.linear"),
        _ => None,
    };
    if let Some(t) = top {
        return whole(t);
    }
    if stem == "norm_out.linear" {
        return Some(Source {
            swap_halves: true,
            ..Source::whole(format!("final_layer.adaLN_modulation.1.{param}"))
        });
    }
    // Norm weights are `scale` in the original.
    let norm = |s: &str| Some(Source::whole(format!("{s}.scale")));
    if let Some(rest) = stem.strip_prefix("transformer_blocks.") {
        let (n, part) = rest.split_once('.')?;
        let b = format!("double_blocks.{n}");
        let qkv = |stream: &str, i: usize| {
            Some(Source::part(format!("{b}.{stream}_attn.qkv.{param}"), i * d..(i + 1) * d, 3 * d))
        };
        return match part {
            "norm1.linear" => whole(&format!("{b}.img_mod.lin")),
            "norm1_context.linear" => whole(&format!("{b}.txt_mod.lin")),
            "attn.to_q" => qkv("img", 0),
            "attn.to_k" => qkv("img", 1),
            "attn.to_v" => qkv("img", 2),
            "attn.add_q_proj" => qkv("txt", 0),
            "attn.add_k_proj" => qkv("txt", 1),
            "attn.add_v_proj" => qkv("txt", 2),
            "attn.norm_q" => norm(&format!("{b}.img_attn.norm.query_norm")),
            "attn.norm_k" => norm(&format!("{b}.img_attn.norm.key_norm")),
            "attn.norm_added_q" => norm(&format!("{b}.txt_attn.norm.query_norm")),
            "attn.norm_added_k" => norm(&format!("{b}.txt_attn.norm.key_norm")),
            "attn.to_out.0" => whole(&format!("{b}.img_attn.proj")),
            "attn.to_add_out" => whole(&format!("{b}.txt_attn.proj")),
            "ff.net.0.proj" | "ff.linear_in" => whole(&format!("{b}.img_mlp.0")),
            "ff.net.2" | "ff.linear_out" => whole(&format!("{b}.img_mlp.2")),
            "ff_context.net.0.proj" | "ff_context.linear_in" => whole(&format!("{b}.txt_mlp.0")),
            "ff_context.net.2" | "ff_context.linear_out" => whole(&format!("{b}.txt_mlp.2")),
            _ => None,
        };
    }
    if let Some(rest) = stem.strip_prefix("single_transformer_blocks.") {
        let (n, part) = rest.split_once('.')?;
        let b = format!("single_blocks.{n}");
        // FLUX.1 fuses q, k, v and the MLP input into `linear1` (3d + m rows); FLUX.2
        // keeps that fusion in diffusers too.
        let linear1 =
            |rows: Range<usize>| Some(Source::part(format!("{b}.linear1.{param}"), rows, 3 * d + m));
        return match (kind, part) {
            (DitKind::Flux, "attn.to_q") => linear1(0..d),
            (DitKind::Flux, "attn.to_k") => linear1(d..2 * d),
            (DitKind::Flux, "attn.to_v") => linear1(2 * d..3 * d),
            (DitKind::Flux, "proj_mlp") => linear1(3 * d..3 * d + m),
            (DitKind::Flux, "proj_out") | (DitKind::Flux2, "attn.to_out") => whole(&format!("{b}.linear2")),
            (DitKind::Flux, "norm.linear") => whole(&format!("{b}.modulation.lin")),
            (DitKind::Flux2, "attn.to_qkv_mlp_proj") => whole(&format!("{b}.linear1")),
            (_, "attn.norm_q") => norm(&format!("{b}.norm.query_norm")),
            (_, "attn.norm_k") => norm(&format!("{b}.norm.key_norm")),
            _ => None,
        };
    }
    None
}

/// The original (Stability AI) name of a diffusers tensor of SD3 (`d` the model width;
/// `last` the index of the last block, whose prompt adaLN has swapped halves too), without
/// the prefix.
fn sai_source(name: &str, d: usize, last: usize) -> Option<Source> {
    if name == "pos_embed.pos_embed" {
        return Some(Source::whole("pos_embed".into()));
    }
    let (stem, param) = name.rsplit_once('.')?;
    let whole = |s: &str| Some(Source::whole(format!("{s}.{param}")));
    let swapped = |s: &str| Some(Source { swap_halves: true, ..Source::whole(format!("{s}.{param}")) });
    match stem {
        "pos_embed.proj" => return whole("x_embedder.proj"),
        "time_text_embed.timestep_embedder.linear_1" => return whole("t_embedder.mlp.0"),
        "time_text_embed.timestep_embedder.linear_2" => return whole("t_embedder.mlp.2"),
        "time_text_embed.text_embedder.linear_1" => return whole("y_embedder.mlp.0"),
        "time_text_embed.text_embedder.linear_2" => return whole("y_embedder.mlp.2"),
        "context_embedder" => return whole("context_embedder"),
        "proj_out" => return whole("final_layer.linear"),
        "norm_out.linear" => return swapped("final_layer.adaLN_modulation.1"),
        _ => {}
    }
    let rest = stem.strip_prefix("transformer_blocks.")?;
    let (n, part) = rest.split_once('.')?;
    let b = format!("joint_blocks.{n}");
    let qkv =
        |at: &str, i: usize| Some(Source::part(format!("{b}.{at}.qkv.{param}"), i * d..(i + 1) * d, 3 * d));
    match part {
        "attn.to_q" => qkv("x_block.attn", 0),
        "attn.to_k" => qkv("x_block.attn", 1),
        "attn.to_v" => qkv("x_block.attn", 2),
        "attn.add_q_proj" => qkv("context_block.attn", 0),
        "attn.add_k_proj" => qkv("context_block.attn", 1),
        "attn.add_v_proj" => qkv("context_block.attn", 2),
        "attn2.to_q" => qkv("x_block.attn2", 0),
        "attn2.to_k" => qkv("x_block.attn2", 1),
        "attn2.to_v" => qkv("x_block.attn2", 2),
        "attn.norm_q" => whole(&format!("{b}.x_block.attn.ln_q")),
        "attn.norm_k" => whole(&format!("{b}.x_block.attn.ln_k")),
        "attn.norm_added_q" => whole(&format!("{b}.context_block.attn.ln_q")),
        "attn.norm_added_k" => whole(&format!("{b}.context_block.attn.ln_k")),
        "attn2.norm_q" => whole(&format!("{b}.x_block.attn2.ln_q")),
        "attn2.norm_k" => whole(&format!("{b}.x_block.attn2.ln_k")),
        "attn.to_out.0" => whole(&format!("{b}.x_block.attn.proj")),
        "attn.to_add_out" => whole(&format!("{b}.context_block.attn.proj")),
        "attn2.to_out.0" => whole(&format!("{b}.x_block.attn2.proj")),
        "norm1.linear" => whole(&format!("{b}.x_block.adaLN_modulation.1")),
        // The last block's prompt norm is an AdaLayerNormContinuous: (shift, scale) in
        // the original, (scale, shift) in diffusers.
        "norm1_context.linear" if n.parse::<usize>().ok() == Some(last) => {
            swapped(&format!("{b}.context_block.adaLN_modulation.1"))
        }
        "norm1_context.linear" => whole(&format!("{b}.context_block.adaLN_modulation.1")),
        "ff.net.0.proj" => whole(&format!("{b}.x_block.mlp.fc1")),
        "ff.net.2" => whole(&format!("{b}.x_block.mlp.fc2")),
        "ff_context.net.0.proj" => whole(&format!("{b}.context_block.mlp.fc1")),
        "ff_context.net.2" => whole(&format!("{b}.context_block.mlp.fc2")),
        _ => None,
    }
}

/// The stored shape of a source whose diffusers shape is `shape`.
fn stored_shape(source: &Source, shape: &[usize]) -> Vec<usize> {
    let mut s = shape.to_vec();
    if let (Some((_, of)), Some(first)) = (&source.rows, s.first_mut()) {
        *first = *of;
    }
    s
}

/// A diffusion transformer on the CPU, as a pipeline folder stores it.
pub struct Dit {
    model: DitModel<CpuBackend>,
    spelling: Spelling,
}

impl Dit {
    /// The transformer in `dir` (a pipeline's `transformer/`) in f32.
    pub fn load(dir: impl AsRef<Path>) -> Result<Dit> {
        Dit::load_at(dir, Precision::F32)
    }

    /// [`Dit::load`] at `precision`: at [`Precision::Q8`] every `Linear` matrix is int8
    /// (one scale a row), rounded as it is read; norms, biases, the patch convolution and
    /// SD3's position table stay f32.
    pub fn load_at(dir: impl AsRef<Path>, precision: Precision) -> Result<Dit> {
        let dir = dir.as_ref();
        let config = dit_config(&dir.join("config.json"))?;
        let layout = config.layout();
        let files = Files::open_or_single(dir, STEMS)?;
        let _prefetch = Prefetch::start(&files.paths);
        let tensors = Tensors::new(&files)?;
        let names: Vec<String> = tensors.names().map(|(_, n)| n).collect();
        let spelling = detect_spelling(names.iter().map(String::as_str));
        let sources = sources(&config, &layout, &spelling)?;
        // Every stored tensor must be one the model reads.
        let used: std::collections::HashSet<&str> = sources.iter().map(|s| s.name.as_str()).collect();
        // A single-file release may carry its text encoders and autoencoder too.
        let other_part = |n: &str| {
            let rest = n.trim_start_matches(COMFY_PREFIX);
            rest.starts_with("text_encoders.")
                || rest.starts_with("first_stage_model.")
                || n.starts_with("text_encoders.")
        };
        if let Some(extra) = names.iter().find(|n| !used.contains(n.as_str()) && !other_part(n)) {
            let i = tensors.names().find(|(_, n)| n == extra).map(|(i, _)| i).unwrap_or(0);
            return Err(NetworkError::parse(
                &files.paths[i],
                extra,
                "this tensor is not part of the transformer config.json describes",
            ));
        }
        let (mut weights, mut q8) = (BTreeMap::new(), BTreeMap::new());
        for ((name, shape), source) in layout.tensors.iter().zip(&sources) {
            let stored = stored_shape(source, shape);
            let rows = match &source.rows {
                Some((r, _)) => r.clone(),
                None => 0..stored.first().copied().unwrap_or(1),
            };
            // Swapped halves are read as two row ranges, second first.
            let ranges = if source.swap_halves {
                let half = rows.len() / 2;
                vec![rows.start + half..rows.end, rows.start..rows.start + half]
            } else {
                vec![rows]
            };
            let format = crate::io::precision::denoiser_format(precision)
                .filter(|_| shape.len() == 2 && name.ends_with(".weight"));
            if let Some(format) = format {
                let (mut packed, mut scales) = (Vec::new(), Vec::new());
                for r in ranges {
                    let (p, s) = tensors.read_quant_rows(&source.name, &stored, r, format)?;
                    packed.extend_from_slice(&p);
                    scales.extend_from_slice(&s);
                }
                q8.insert(name.clone(), (packed, scales));
            } else {
                let mut data = Vec::new();
                for r in ranges {
                    data.extend_from_slice(&tensors.read_rows(&source.name, &stored, r)?);
                }
                weights.insert(name.clone(), data);
            }
        }
        Ok(Dit { model: DitModel::with_q8(CpuBackend::new(), config, weights, q8)?, spelling })
    }

    /// Mixed precision: the convolutions, the f32 matrices and the attention multiply
    /// bf16-rounded operands and sum in f32 (on CPUs with AVX512_BF16 at about twice the
    /// f32 rate; elsewhere the same numbers at f32's speed). Off when loaded.
    pub fn set_mixed_precision(&mut self, on: bool) {
        self.model.set_mixed_precision(on);
    }

    /// The architecture read from the folder.
    pub fn config(&self) -> &DitConfig {
        self.model.config()
    }

    /// Which spelling the checkpoint used.
    pub fn spelling(&self) -> &Spelling {
        &self.spelling
    }

    /// Bytes the weights hold (int8 matrices at about one a weight).
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    /// Values held (int8 matrices count one a weight).
    pub fn parameter_count(&self) -> usize {
        self.config().layout().parameter_count()
    }

    /// The denoiser's prediction; see [`DitInput`].
    pub fn forward(&self, input: &DitInput<'_>) -> Result<Vec<f32>> {
        Ok(self.model.forward(input)?)
    }
}

/// Where each tensor of `layout` is stored under `spelling`.
fn sources(config: &DitConfig, layout: &Layout, spelling: &Spelling) -> Result<Vec<Source>> {
    let prefix = match spelling {
        Spelling::Diffusers => {
            return Ok(layout.tensors.iter().map(|(n, _)| Source::whole(n.clone())).collect())
        }
        Spelling::Original { prefix } => prefix,
    };
    let (d, m) = (config.dim(), config.mlp_dim());
    layout
        .tensors
        .iter()
        .map(|(n, _)| {
            let source = match config.kind {
                DitKind::Sd3 => sai_source(n, d, config.num_layers.saturating_sub(1)),
                kind => bfl_source(kind, n, d, m),
            };
            let mut s = source.ok_or_else(|| {
                NetworkError::InvalidInput(format!("{n}: no original name is known for this tensor"))
            })?;
            s.name = format!("{prefix}{}", s.name);
            Ok(s)
        })
        .collect()
}
