//! The prompt encoders of the image pipelines, loaded from the `text_encoder*/` folders
//! transformers writes (`config.json` and `model.safetensors`, single or sharded,
//! F32/BF16/F16, converted to f32 as read). Every shape comes from `config.json`; a model
//! class the definition does not compute is refused by name.

use std::collections::BTreeMap;
use std::path::Path;

use rusting_brain_core::backend::Unary;
use rusting_brain_core::models::clip::{ClipTextConfig, ClipTextModel, ClipTextOutput};
use rusting_brain_core::models::image::blocks::Layout;
use rusting_brain_core::models::t5::{T5Config, T5Model};
use rusting_brain_core::models::transformer::TransformerModel;

use crate::backend::cpu::CpuBackend;
use crate::io::config::Config;
use crate::io::precision::image_format;
use crate::io::weights::{Files, Prefetch, Tensors};
use crate::{NetworkError, Precision, Result};
use rusting_brain_core::ops::q8::QuantFormat;

/// Weights read from a folder: f32 tensors, and the matrices read quantized (int8 or 4-bit
/// buffers, core's layouts).
pub(crate) type ReadWeights = (BTreeMap<String, Vec<f32>>, BTreeMap<String, (Vec<f32>, Vec<f32>)>);

/// Reads every tensor of `layout` from the weight files of `dir`, the layout's name
/// `n` stored as `file_name(n)`; a tensor in the files that the layout lacks is an error
/// unless `ignorable` says it may be passed over. The matrices `quantized` gives a format
/// are rounded to it as they are read (the f32 matrix never exists whole).
pub(crate) fn read_weights(
    dir: &Path, stems: &[&str], layout: &Layout, file_name: impl Fn(&str) -> String,
    ignorable: impl Fn(&str) -> bool, quantized: impl Fn(&str, &[usize]) -> Option<QuantFormat>,
) -> Result<ReadWeights> {
    let files = Files::open(dir, stems)?;
    let _prefetch = Prefetch::start(&files.paths);
    let tensors = Tensors::new(&files)?;
    let stored: std::collections::HashSet<String> =
        layout.tensors.iter().map(|(n, _)| file_name(n)).collect();
    if let Some((i, extra)) = tensors.names().find(|(_, n)| !ignorable(n) && !stored.contains(n)) {
        return Err(NetworkError::parse(
            &files.paths[i],
            extra,
            "this tensor is not part of the model config.json describes",
        ));
    }
    let (mut weights, mut q8) = (BTreeMap::new(), BTreeMap::new());
    for (name, shape) in &layout.tensors {
        // Matrices, and at Q8 a UNet's convolutions (int8 rows, one an output channel).
        if let Some(format) = quantized(name, shape).filter(|_| shape.len() == 2 || shape.len() == 4) {
            q8.insert(name.clone(), tensors.read_quant(&file_name(name), shape, format)?);
        } else {
            weights.insert(name.clone(), tensors.read(&file_name(name), shape)?);
        }
    }
    Ok((weights, q8))
}

/// The matrices an int8 encoder holds as int8: every `Linear` weight (the projections and
/// the feed-forward), not the embedding tables or T5's position-bias table.
fn linear_matrix(name: &str, precision: Precision) -> Option<QuantFormat> {
    image_format(precision).filter(|_| {
        name.ends_with(".weight")
            && !name.contains("embedding")
            && !name.contains("relative_attention_bias")
            && name != "shared.weight"
    })
}

/// Whether the weights in `dir` carry `prefix` on their names (the first file's header is
/// enough: a model is saved with one spelling).
fn has_prefix(dir: &Path, stems: &[&str], prefix: &str) -> Result<bool> {
    let files = Files::open(dir, stems)?;
    let tensors = Tensors::new(&files)?;
    let mut names = tensors.names();
    Ok(names.any(|(_, n)| n.starts_with(prefix)))
}

/// A CLIP text tower's `config.json` (`CLIPTextModel` or `CLIPTextModelWithProjection`),
/// with transformers' defaults for absent keys. No weights are read.
pub fn clip_config(path: &Path) -> Result<ClipTextConfig> {
    let c = Config::read(path)?;
    let projection = match c.architecture() {
        Some("CLIPTextModel") => false,
        Some("CLIPTextModelWithProjection") => true,
        Some(other) => {
            return Err(c.err(
                "architectures",
                format!("{other}: this loader reads CLIPTextModel and CLIPTextModelWithProjection"),
            ))
        }
        None => return Err(c.err("architectures", "missing: which CLIP tower is this?")),
    };
    if let Some(t) = c.str("model_type").filter(|t| *t != "clip_text_model") {
        return Err(c.err("model_type", format!("{t}, not clip_text_model")));
    }
    let act_name = c.str("hidden_act").unwrap_or("quick_gelu");
    let hidden_act = Unary::from_hf(act_name)
        .ok_or_else(|| c.err("hidden_act", format!("{act_name} is not supported")))?;
    let eos = c.count("eos_token_id", Some(2))?;
    let config = ClipTextConfig {
        vocab_size: c.count("vocab_size", Some(49408))?,
        hidden_size: c.count("hidden_size", Some(512))?,
        intermediate_size: c.count("intermediate_size", Some(2048))?,
        num_hidden_layers: c.count("num_hidden_layers", Some(12))?,
        num_attention_heads: c.count("num_attention_heads", Some(8))?,
        max_position_embeddings: c.count("max_position_embeddings", Some(77))?,
        hidden_act,
        layer_norm_eps: c.float("layer_norm_eps", 1e-5)?,
        eos_token_id: u32::try_from(eos).map_err(|_| c.err("eos_token_id", "too large"))?,
        projection_dim: if projection { Some(c.count("projection_dim", Some(512))?) } else { None },
    };
    config.validate().map_err(|e| c.err("config", format!("describes no valid CLIP tower: {e}")))?;
    Ok(config)
}

/// A `T5EncoderModel`'s `config.json`, with transformers' defaults for absent keys. No
/// weights are read.
pub fn t5_config(path: &Path) -> Result<T5Config> {
    let c = Config::read(path)?;
    match c.architecture() {
        Some("T5EncoderModel") | None => {}
        Some(other) => {
            return Err(c.err(
                "architectures",
                format!("{other}: this loader reads T5EncoderModel (the encoder alone)"),
            ))
        }
    }
    let proj = c.str("feed_forward_proj").unwrap_or("gated-gelu");
    if proj != "gated-gelu" {
        return Err(c.err("feed_forward_proj", format!("{proj}: only T5 v1.1's gated-gelu is supported")));
    }
    let act_name = c.str("dense_act_fn").unwrap_or("gelu_new");
    let act = Unary::from_hf(act_name)
        .ok_or_else(|| c.err("dense_act_fn", format!("{act_name} is not supported")))?;
    let num_heads = c.count("num_heads", Some(8))?;
    let config = T5Config {
        vocab_size: c.count("vocab_size", Some(32128))?,
        d_model: c.count("d_model", Some(512))?,
        d_kv: c.count("d_kv", Some(64))?,
        d_ff: c.count("d_ff", Some(2048))?,
        num_layers: c.count("num_layers", Some(6))?,
        num_heads,
        relative_attention_num_buckets: c.count("relative_attention_num_buckets", Some(32))?,
        relative_attention_max_distance: c.count("relative_attention_max_distance", Some(128))?,
        layer_norm_epsilon: c.float("layer_norm_epsilon", 1e-6)?,
        act,
    };
    config.validate().map_err(|e| c.err("config", format!("describes no valid T5 encoder: {e}")))?;
    Ok(config)
}

/// A CLIP text tower (`CLIPTextModel` or `CLIPTextModelWithProjection`) on the CPU.
pub struct ClipTextEncoder {
    model: ClipTextModel<CpuBackend>,
}

impl ClipTextEncoder {
    /// The tower in `dir` (a pipeline's `text_encoder/` or `text_encoder_2/`).
    pub fn load(dir: impl AsRef<Path>) -> Result<ClipTextEncoder> {
        ClipTextEncoder::load_at(dir, Precision::F32)
    }

    /// [`ClipTextEncoder::load`] at `precision`: at [`Precision::Q8`] every projection
    /// and feed-forward matrix is int8 (one scale a row), rounded as it is read.
    pub fn load_at(dir: impl AsRef<Path>, precision: Precision) -> Result<ClipTextEncoder> {
        let dir = dir.as_ref();
        let config = clip_config(&dir.join("config.json"))?;
        // transformers 4 wrote the tower's names under `text_model.` (the published
        // pipelines' spelling), transformers 5 writes a `CLIPTextModel` without it; older
        // versions also saved the position ids as a buffer.
        let prefixed = has_prefix(dir, &["model"], "text_model.")?;
        let file_name = |n: &str| -> String {
            match n.strip_prefix("text_model.") {
                Some(rest) if !prefixed => rest.to_string(),
                _ => n.to_string(),
            }
        };
        let (weights, q8) = read_weights(
            dir,
            &["model"],
            &config.layout(),
            file_name,
            |n| n.ends_with("embeddings.position_ids"),
            |n, _| linear_matrix(n, precision),
        )?;
        Ok(ClipTextEncoder { model: ClipTextModel::with_q8(CpuBackend::new(), config, weights, q8)? })
    }

    /// Bytes the weights hold.
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    /// The architecture read from the folder.
    pub fn config(&self) -> &ClipTextConfig {
        self.model.config()
    }

    /// Encodes `ids` (`batch` rows of equal length, at most `max_position_embeddings`);
    /// `mask` (same length, `true` for real tokens) hides padding keys.
    pub fn encode(&self, ids: &[u32], batch: usize, mask: Option<&[bool]>) -> Result<ClipTextOutput> {
        Ok(self.model.forward(ids, batch, mask)?)
    }

    /// The final LayerNorm over `(rows, hidden)` states (for a penultimate-layer prompt).
    pub fn final_norm(&self, states: &[f32]) -> Result<Vec<f32>> {
        Ok(self.model.final_norm(states)?)
    }
}

/// T5's encoder (`T5EncoderModel`, v1.1's gated GELU) on the CPU, in f32.
pub struct T5Encoder {
    model: T5Model<CpuBackend>,
}

impl T5Encoder {
    /// The encoder in `dir` (FLUX.1's `text_encoder_2/`, SD3's `text_encoder_3/`).
    pub fn load(dir: impl AsRef<Path>) -> Result<T5Encoder> {
        T5Encoder::load_at(dir, Precision::F32)
    }

    /// [`T5Encoder::load`] at `precision`: at [`Precision::Q8`] the attention and
    /// feed-forward matrices are int8 (T5-XXL's 4.7 billion weights in a quarter of the
    /// memory); activations stay f32.
    pub fn load_at(dir: impl AsRef<Path>, precision: Precision) -> Result<T5Encoder> {
        let dir = dir.as_ref();
        let config = t5_config(&dir.join("config.json"))?;
        // The embedding is tied: stored as `shared.weight`, as `encoder.embed_tokens.weight`,
        // or both.
        let shared = has_prefix(dir, &["model"], "shared.weight")?;
        let file_name = |n: &str| -> String {
            if n == "shared.weight" && !shared {
                "encoder.embed_tokens.weight".to_string()
            } else {
                n.to_string()
            }
        };
        let (weights, q8) = read_weights(
            dir,
            &["model"],
            &config.layout(),
            file_name,
            |n| n == "encoder.embed_tokens.weight",
            |n, _| linear_matrix(n, precision),
        )?;
        Ok(T5Encoder { model: T5Model::with_q8(CpuBackend::new(), config, weights, q8)? })
    }

    /// Bytes the weights hold.
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    /// The architecture read from the folder.
    pub fn config(&self) -> &T5Config {
        self.model.config()
    }

    /// `(batch, seq, d_model)` states of `ids (batch, seq)`; `mask` (`true` for real
    /// tokens) hides padding keys.
    pub fn encode(&self, ids: &[u32], batch: usize, mask: Option<&[bool]>) -> Result<Vec<f32>> {
        Ok(self.model.forward(ids, batch, mask)?)
    }
}

/// A LLaMA-family decoder read as a prompt encoder (FLUX.2-klein's Qwen3): the residual
/// stream after chosen layers, side by side per token. The model is the language model's
/// own definition and Hugging Face loader (`TransformerLm::from_pretrained`'s), run with
/// the prompt's padding mask.
pub struct TextEncoder {
    model: TransformerModel<CpuBackend>,
    layers: Vec<usize>,
}

impl TextEncoder {
    /// The decoder in `dir` (a Hugging Face folder), reading the outputs of `layers`
    /// (1-based, as transformers' `hidden_states[k]`; FLUX.2-klein uses 9, 18 and 27).
    pub fn load(dir: impl AsRef<Path>, layers: &[usize]) -> Result<TextEncoder> {
        TextEncoder::load_at(dir, Precision::F32, layers)
    }

    /// [`TextEncoder::load`] at `precision` (int8 weights at [`Precision::Q8`]).
    pub fn load_at(dir: impl AsRef<Path>, precision: Precision, layers: &[usize]) -> Result<TextEncoder> {
        let (model, _) = crate::io::hf::load(dir.as_ref(), precision)?;
        let mut encoder = TextEncoder { model, layers: Vec::new() };
        encoder.set_layers(layers)?;
        Ok(encoder)
    }

    /// Reads the outputs of `layers` from now on (1-based; the whole decoder is held, so
    /// any of its layers can be chosen).
    pub fn set_layers(&mut self, layers: &[usize]) -> Result<()> {
        let n = self.model.config.n_layers;
        if layers.is_empty() {
            return Err(NetworkError::InvalidInput("no layers to read the states of".into()));
        }
        if let Some(bad) = layers.iter().find(|&&l| l == 0 || l > n) {
            return Err(NetworkError::InvalidInput(format!(
                "text encoder layer {bad}: the decoder has layers 1..={n}"
            )));
        }
        self.layers = layers.to_vec();
        Ok(())
    }

    /// The layers read.
    pub fn layers(&self) -> &[usize] {
        &self.layers
    }

    /// Bytes the weights hold.
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    /// Features per token: `layers.len() * hidden_size`.
    pub fn width(&self) -> usize {
        self.layers.len() * self.model.config.d_model
    }

    /// `(batch, seq, width)`: for each token the chosen layers' states `[h_a | h_b | ...]`
    /// (diffusers' `stack(dim=1).permute(0, 2, 1, 3).reshape(B, L, n * H)`), of `ids`
    /// (`batch` rows of equal length) under `mask` (`true` for real tokens).
    pub fn encode(&mut self, ids: &[u32], batch: usize, mask: Option<&[bool]>) -> Result<Vec<f32>> {
        let states = self.model.hidden_states(ids, batch, mask, &self.layers)?;
        let d = self.model.config.d_model;
        let tokens = ids.len();
        let mut out = vec![0f32; tokens * self.width()];
        for (j, s) in states.iter().enumerate() {
            for t in 0..tokens {
                let dst = (t * self.layers.len() + j) * d;
                out[dst..dst + d].copy_from_slice(&s[t * d..(t + 1) * d]);
            }
        }
        Ok(out)
    }
}
