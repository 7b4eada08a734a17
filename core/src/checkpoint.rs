//! Reading `.rbw` transformer checkpoints (feature `checkpoint`): safetensors files with the
//! configuration as JSON in `__metadata__` and tensors under Hugging Face names. The reader
//! lives here, over any backend, so the native crate (from a file) and the browser (from
//! fetched bytes) accept and refuse exactly the same files. The F32 weights file is made
//! here too ([`f32_file_bytes`]: native `save_bin` writes those bytes, a page downloads
//! them); the int8 and optimizer-state writers are the native crate's.
//!
//! Nothing is allocated from a header's claims before the safetensors crate has checked
//! that every tensor's offsets lie inside the bytes and cover them exactly.

use std::collections::HashMap;
use std::format;
use std::string::{String, ToString};
use std::vec;
use std::vec::Vec;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::{json, Value};

use crate::models::transformer::{
    MoeConfig, Params, QuantParams, TensorKind, TensorSpec, TransformerConfig, TransformerModel,
};
use crate::ops::q8;
use crate::{Backend, CoreError, Result, RopeScaling};

/// `format` in the metadata of a weights file.
pub const WEIGHTS_FORMAT: &str = "rusting_brain.transformer";
/// `format` in the metadata of an optimizer-state file.
pub const OPTIMIZER_FORMAT: &str = "rusting_brain.optimizer";
/// The file-format version this build writes. Version 2 stores an int8 matrix's scales
/// per block of [`q8::Q8_BLOCK`] values (`name.scale` is `(rows, blocks)`); version 1
/// stored one per row (`(rows)`), and those files still load, as they were written.
pub const VERSION: u64 = 2;

fn bad(location: &str, message: impl Into<String>) -> CoreError {
    CoreError::Checkpoint { location: location.to_string(), message: message.into() }
}

/// The bytes of an F32 weights file: every parameter under its Hugging Face name, in the
/// layout's order, the configuration in the metadata.
pub fn f32_file_bytes<B: Backend>(model: &TransformerModel<B>) -> Result<Vec<u8>> {
    let values = model
        .params
        .as_ref()
        .into_leaves()
        .into_iter()
        .map(|buf| model.backend.download(buf))
        .collect::<Result<Vec<_>>>()?;
    f32_file_bytes_of(&model.config, &values)
}

/// [`f32_file_bytes`] from the parameters' values on the host, in the layout's order (what
/// a browser has after reading a GPU model's buffers without blocking).
pub fn f32_file_bytes_of(c: &TransformerConfig, values: &[Vec<f32>]) -> Result<Vec<u8>> {
    let meta = HashMap::from([
        ("format".to_string(), WEIGHTS_FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
        ("precision".to_string(), "F32".to_string()),
        ("config".to_string(), config_json(c).to_string()),
    ]);
    let named = c.layout().into_named();
    if named.len() != values.len() {
        return Err(bad("weights", format!("{} tensors for a layout of {}", values.len(), named.len())));
    }
    let mut tensors = Vec::new();
    for ((name, t), v) in named.into_iter().zip(values) {
        if v.len() != t.shape.iter().product::<usize>() {
            return Err(bad(&name, format!("{} values for shape {:?}", v.len(), t.shape)));
        }
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        tensors.push((name, t.shape, bytes));
    }
    let views = tensors
        .iter()
        .map(|(n, s, b)| TensorView::new(Dtype::F32, s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<core::result::Result<Vec<_>, _>>()
        .map_err(|e| bad("weights", e.to_string()))?;
    let bytes =
        safetensors::tensor::serialize(views, Some(meta)).map_err(|e| bad("weights", e.to_string()))?;
    sorted_header(bytes)
}

/// A safetensors file with its header's keys in sorted order. The safetensors crate writes
/// the metadata in a hash map's order, which changes from run to run; sorted, the same
/// tensors and metadata always give the same bytes (a file's hash means something). The
/// tensors' offsets are relative to the end of the header, so the data is kept as it is.
pub fn sorted_header(file: Vec<u8>) -> Result<Vec<u8>> {
    fn sort_keys(v: Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut entries: Vec<(String, Value)> = m.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Object(entries.into_iter().map(|(k, v)| (k, sort_keys(v))).collect())
            }
            other => other,
        }
    }
    let n = file
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("eight bytes")) as usize)
        .filter(|&n| file.len() >= 8 + n)
        .ok_or_else(|| bad("header", "the file is shorter than its header"))?;
    let header: Value = serde_json::from_slice(&file[8..8 + n]).map_err(|e| bad("header", e.to_string()))?;
    let mut text = sort_keys(header).to_string().into_bytes();
    // The data starts 8-aligned: pad the header with spaces, as the format asks.
    text.resize(text.len().div_ceil(8) * 8, b' ');
    let mut out = Vec::with_capacity(8 + text.len() + file.len() - 8 - n);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    out.extend_from_slice(&file[8 + n..]);
    Ok(out)
}

/// The configuration as the metadata's `config` JSON.
pub fn config_json(c: &TransformerConfig) -> Value {
    let moe = c.moe.as_ref().map(|m| {
        json!({
            "n_experts": m.n_experts, "top_k": m.top_k, "layers": m.layers,
            "shared_expert": m.shared_expert, "expert_d_ff": m.expert_d_ff,
            "load_balance_coef": m.load_balance_coef, "router_z_coef": m.router_z_coef,
            "renormalize": m.renormalize,
        })
    });
    json!({
        "vocab_size": c.vocab_size, "d_model": c.d_model, "n_layers": c.n_layers,
        "q_heads": c.q_heads, "kv_heads": c.kv_heads, "head_dim": c.head_dim, "d_ff": c.d_ff,
        "max_seq_len": c.max_seq_len, "rope_theta": c.rope_theta, "norm_eps": c.norm_eps,
        "tie_embeddings": c.tie_embeddings, "qkv_bias": c.qkv_bias, "qk_norm": c.qk_norm,
        "rope_scaling": rope_scaling_json(&c.rope_scaling), "moe": moe,
    })
}

fn rope_scaling_json(s: &RopeScaling) -> Value {
    match *s {
        RopeScaling::None => Value::Null,
        RopeScaling::Linear { factor } => json!({"type": "linear", "factor": factor}),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => json!({
            "type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor, "original_max_position": original_max_position,
        }),
    }
}

fn rope_scaling_from_json(v: &Value) -> Result<RopeScaling, String> {
    let w = "config.rope_scaling";
    match v.get("type").and_then(Value::as_str) {
        Some("linear") => Ok(RopeScaling::Linear { factor: f32_of(v, "factor", w)? }),
        Some("llama3") => Ok(RopeScaling::Llama3 {
            factor: f32_of(v, "factor", w)?,
            low_freq_factor: f32_of(v, "low_freq_factor", w)?,
            high_freq_factor: f32_of(v, "high_freq_factor", w)?,
            original_max_position: usize_of(v, "original_max_position", w)?,
        }),
        other => Err(format!("{w} has type {other:?}; this build reads \"linear\" and \"llama3\"")),
    }
}

fn usize_of(v: &Value, k: &str, what: &str) -> Result<usize, String> {
    v.get(k)
        .and_then(Value::as_u64)
        .and_then(|x| usize::try_from(x).ok())
        .ok_or(format!("{what} has no integer `{k}`"))
}

fn f32_of(v: &Value, k: &str, what: &str) -> Result<f32, String> {
    v.get(k).and_then(Value::as_f64).map(|x| x as f32).ok_or(format!("{what} has no number `{k}`"))
}

fn bool_of(v: &Value, k: &str, what: &str) -> Result<bool, String> {
    v.get(k).and_then(Value::as_bool).ok_or(format!("{what} has no boolean `{k}`"))
}

fn moe_from_json(v: &Value) -> Result<MoeConfig, String> {
    let w = "config.moe";
    let layers = v
        .get("layers")
        .and_then(Value::as_array)
        .ok_or(format!("{w} has no array `layers`"))?
        .iter()
        .map(|l| {
            l.as_u64().and_then(|x| usize::try_from(x).ok()).ok_or(format!("{w}.layers holds a non-integer"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(MoeConfig {
        n_experts: usize_of(v, "n_experts", w)?,
        top_k: usize_of(v, "top_k", w)?,
        layers,
        shared_expert: bool_of(v, "shared_expert", w)?,
        expert_d_ff: usize_of(v, "expert_d_ff", w)?,
        load_balance_coef: f32_of(v, "load_balance_coef", w)?,
        router_z_coef: f32_of(v, "router_z_coef", w)?,
        renormalize: bool_of(v, "renormalize", w)?,
    })
}

/// The configuration from the metadata's `config` JSON (not yet validated).
pub fn config_from_json(v: &Value) -> Result<TransformerConfig, String> {
    let u = |k: &str| usize_of(v, k, "config");
    let f = |k: &str| f32_of(v, k, "config");
    // Files written before mixture of experts have no `moe` key: dense.
    let moe = match v.get("moe") {
        None | Some(Value::Null) => None,
        Some(m) => Some(moe_from_json(m)?),
    };
    Ok(TransformerConfig {
        vocab_size: u("vocab_size")?,
        d_model: u("d_model")?,
        n_layers: u("n_layers")?,
        q_heads: u("q_heads")?,
        kv_heads: u("kv_heads")?,
        head_dim: u("head_dim")?,
        d_ff: u("d_ff")?,
        max_seq_len: u("max_seq_len")?,
        rope_theta: f("rope_theta")?,
        norm_eps: f("norm_eps")?,
        // Written since untied heads exist; every older file's head is the embedding.
        tie_embeddings: match v.get("tie_embeddings") {
            None => true,
            Some(t) => t.as_bool().ok_or("config has a non-boolean `tie_embeddings`")?,
        },
        // Written since biases and per-head norms exist; older files have neither.
        qkv_bias: match v.get("qkv_bias") {
            None => false,
            Some(t) => t.as_bool().ok_or("config has a non-boolean `qkv_bias`")?,
        },
        qk_norm: match v.get("qk_norm") {
            None => false,
            Some(t) => t.as_bool().ok_or("config has a non-boolean `qk_norm`")?,
        },
        // Written since scaled RoPE exists; older files turn by theta alone.
        rope_scaling: match v.get("rope_scaling") {
            None | Some(Value::Null) => RopeScaling::None,
            Some(s) => rope_scaling_from_json(s)?,
        },
        moe,
    })
}

/// The int8 bytes (rows x cols) of a packed weight.
pub fn packed_to_i8(packed: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    let pc = q8::packed_cols(cols);
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            out.push(q8::q8_at(&packed[r * pc..(r + 1) * pc], c) as u8);
        }
    }
    out
}

/// Packs int8 bytes (rows x cols) four to an f32 slot.
pub fn i8_to_packed(bytes: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let pc = q8::packed_cols(cols);
    let mut out = vec![0.0f32; rows * pc];
    for r in 0..rows {
        for s in 0..pc {
            let mut b4 = [0u8; 4];
            for (b, byte) in b4.iter_mut().enumerate() {
                if 4 * s + b < cols {
                    *byte = bytes[r * cols + 4 * s + b];
                }
            }
            out[r * pc + s] = f32::from_ne_bytes(b4);
        }
    }
    out
}

/// A 4-bit weight's packed bytes, `rows x 32 * cols.div_ceil(64)` (Q4_K's nibble order,
/// as held in memory: see [`crate::ops::q4`]).
pub fn q4_packed_bytes(packed: &[f32]) -> Vec<u8> {
    packed.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

/// The inverse of [`q4_packed_bytes`].
pub fn q4_bytes_to_packed(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// A checked safetensors file of ours: its tensors and its metadata.
pub struct Checkpoint<'a> {
    tensors: SafeTensors<'a>,
    meta: HashMap<String, String>,
}

impl<'a> Checkpoint<'a> {
    /// Parses `bytes` and checks the metadata's `format` and `version`.
    pub fn parse(bytes: &'a [u8], format: &str) -> Result<Checkpoint<'a>> {
        // The crate checks the header's length, its JSON, and that every tensor's offsets
        // lie inside the bytes and cover them exactly, before anything is allocated.
        let (_, metadata) = SafeTensors::read_metadata(bytes)
            .map_err(|e| bad("header", format!("not a valid safetensors file: {e}")))?;
        let tensors = SafeTensors::deserialize(bytes)
            .map_err(|e| bad("header", format!("not a valid safetensors file: {e}")))?;
        let meta = metadata.metadata().clone().unwrap_or_default();
        match meta.get("format").map(String::as_str) {
            Some(f) if f == format => {}
            other => return Err(bad("metadata", format!("format {other:?}, expected \"{format}\""))),
        }
        match meta.get("version").and_then(|v| v.parse::<u64>().ok()) {
            Some(1..=VERSION) => {}
            Some(v) if v > VERSION => {
                return Err(bad(
                    "metadata",
                    format!("written by a newer rusting_brain (version {v}); this build reads {VERSION}"),
                ))
            }
            other => return Err(bad("metadata", format!("unsupported version {other:?}"))),
        }
        Ok(Checkpoint { tensors, meta })
    }

    /// A metadata entry.
    pub fn meta(&self, key: &str) -> Option<&str> {
        self.meta.get(key).map(String::as_str)
    }

    /// The validated configuration.
    pub fn config(&self) -> Result<TransformerConfig> {
        let text = self.meta("config").ok_or_else(|| bad("metadata", "no config"))?;
        let v: Value = serde_json::from_str(text).map_err(|e| bad("metadata.config", e.to_string()))?;
        let c = config_from_json(&v).map_err(|e| bad("metadata.config", e))?;
        c.validate().map_err(|e| bad("metadata.config", e.to_string()))?;
        Ok(c)
    }

    /// The F32 tensor `name`, checked against `t`'s shape and for finite values.
    pub fn read_f32(&self, name: &str, t: &TensorSpec) -> Result<Vec<f32>> {
        let tensor = self.tensors.tensor(name).map_err(|_| bad(name, "missing tensor"))?;
        if tensor.dtype() != Dtype::F32 {
            return Err(bad(name, format!("dtype {:?}, expected F32", tensor.dtype())));
        }
        if tensor.shape() != t.shape.as_slice() {
            return Err(bad(name, format!("shape {:?}, the config needs {:?}", tensor.shape(), t.shape)));
        }
        let data: Vec<f32> =
            tensor.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        if data.iter().any(|v| !v.is_finite()) {
            return Err(bad(name, "holds NaN or infinite values"));
        }
        Ok(data)
    }

    /// Every tensor of `c` (under `prefix`) in backend buffers, checked against the
    /// configuration's dtypes and shapes.
    pub fn params<B: Backend>(&self, c: &TransformerConfig, prefix: &str, b: &B) -> Result<Params<B>> {
        c.layout().try_map(|name, t| {
            let data = self.read_f32(&format!("{prefix}{name}"), &t)?;
            b.upload(&data)
        })
    }

    /// The int8 matrix `name` (I8, `t`'s shape) and its `name.scale` scales, packed: one
    /// per block of [`q8::Q8_BLOCK`] values, `(rows, blocks)`, or one per row, `(rows)`, as
    /// version 1 wrote them.
    fn read_q8(&self, name: &str, t: &TensorSpec) -> Result<(Vec<f32>, Vec<f32>)> {
        let (rows, cols) = t.rows_cols();
        let tensor = self.tensors.tensor(name).map_err(|_| bad(name, "missing tensor"))?;
        if tensor.dtype() != Dtype::I8 || tensor.shape() != t.shape.as_slice() {
            return Err(bad(
                name,
                format!("{:?} {:?}, expected I8 {:?}", tensor.dtype(), tensor.shape(), t.shape),
            ));
        }
        let scale_name = format!("{name}.scale");
        let blocks = q8::blocks_of(cols, q8::Q8_BLOCK);
        let per_row = self.tensors.tensor(&scale_name).is_ok_and(|s| s.shape() == [rows].as_slice());
        let shape = if per_row { vec![rows] } else { vec![rows, blocks] };
        let scale = TensorSpec { shape, kind: TensorKind::Norm };
        let s = self.read_f32(&scale_name, &scale)?;
        if s.iter().any(|x| *x < 0.0) {
            return Err(bad(&scale_name, "scales must be >= 0"));
        }
        Ok((i8_to_packed(tensor.data(), rows, cols), s))
    }

    /// The 4-bit matrix `name` (U8 `(rows, 32 * cols.div_ceil(64))` packed bytes) with its
    /// row scales `name.q4_scale` (F32 `(rows, 2)`) and block codes `name.q4_codes` (U8
    /// `(rows, blocks, 2)`), as held in memory; a code past 63 or a negative or
    /// non-finite scale is an error. A matrix whose blocks are not codes of its rows'
    /// scales (a GGUF file's 4-bit blocks taken as they were) has each block's scale and
    /// offset instead, `name.q4_blocks` (F16 or F32 `(rows, blocks, 2)`, finite).
    fn read_q4(&self, name: &str, t: &TensorSpec) -> Result<(Vec<f32>, Vec<f32>)> {
        use crate::ops::q4;
        let (rows, cols) = t.rows_cols();
        let u8_tensor = |n: &str, shape: &[usize]| -> Result<&'a [u8]> {
            let tensor = self.tensors.tensor(n).map_err(|_| bad(n, "missing tensor"))?;
            if tensor.dtype() != Dtype::U8 || tensor.shape() != shape {
                return Err(bad(
                    n,
                    format!("{:?} {:?}, expected U8 {:?}", tensor.dtype(), tensor.shape(), shape),
                ));
            }
            Ok(tensor.data())
        };
        let bytes = u8_tensor(name, &[rows, 4 * q4::q4_packed_cols(cols)])?;
        let nb = q8::blocks_of(cols, q4::Q4_BLOCK);
        let scale_name = format!("{name}.q4_scale");
        let row = self.read_f32(&scale_name, &TensorSpec { shape: vec![rows, 2], kind: TensorKind::Norm })?;
        let blocks_name = format!("{name}.q4_blocks");
        if let Ok(t) = self.tensors.tensor(&blocks_name) {
            let spec = TensorSpec { shape: vec![rows, nb, 2], kind: TensorKind::Norm };
            let blocks = if t.dtype() == Dtype::F16 && t.shape() == spec.shape.as_slice() {
                let v: Vec<f32> = t
                    .data()
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect();
                if v.iter().any(|x| !x.is_finite()) {
                    return Err(bad(&blocks_name, "holds NaN or infinite values"));
                }
                v
            } else {
                self.read_f32(&blocks_name, &spec)?
            };
            let mut scales = Vec::with_capacity(rows * q4::q4_row_scales(cols));
            for (base, pairs) in row.chunks_exact(2).zip(blocks.chunks_exact(2 * nb)) {
                scales.extend_from_slice(base);
                scales.extend_from_slice(pairs);
            }
            return Ok((q4_bytes_to_packed(bytes), scales));
        }
        let codes_name = format!("{name}.q4_codes");
        let codes = u8_tensor(&codes_name, &[rows, nb, 2])?;
        let scales = q4::q4_scales_from_codes(&row, codes, rows, cols).map_err(|e| match e {
            CoreError::InvalidArgument { message, .. } => bad(&codes_name, message),
            e => e,
        })?;
        Ok((q4_bytes_to_packed(bytes), scales))
    }

    /// The model in this file on `backend`: an F32 file as it was saved, a Q8 or Q4 file
    /// as a quantized model (int8 or 4-bit matrices, each as its tensor's dtype says; f32
    /// norms and routers).
    pub fn model<B: Backend>(&self, backend: B) -> Result<TransformerModel<B>> {
        let config = self.config()?;
        match self.meta("precision") {
            Some("F32") => {
                let params = self.params(&config, "", &backend)?;
                TransformerModel::from_params(backend, config, params)
            }
            Some("Q8" | "Q4") => {
                let layout = config.layout();
                // Norms and routers in f32; an int8 model keeps no f32 matrices.
                let params = layout.as_ref().try_map(|name, t| match t.kind {
                    TensorKind::Matrix => backend.zeros(0),
                    _ => backend.upload(&self.read_f32(name, t)?),
                })?;
                let quantized: QuantParams<B> = layout.as_ref().try_map(|name, t| {
                    if t.kind != TensorKind::Matrix {
                        return Ok(None);
                    }
                    let q4 = self.tensors.tensor(name).is_ok_and(|v| v.dtype() == Dtype::U8);
                    let (w, s) = if q4 { self.read_q4(name, t)? } else { self.read_q8(name, t)? };
                    Ok(Some((backend.upload(&w)?, backend.upload(&s)?)))
                })?;
                TransformerModel::from_quantized(backend, config, params, quantized)
            }
            other => {
                Err(bad("metadata", format!("precision {other:?} is not one this build reads (F32, Q8, Q4)")))
            }
        }
    }
}

/// The model in a `.rbw` file's bytes, on `backend`.
pub fn read_model<B: Backend>(bytes: &[u8], backend: B) -> Result<TransformerModel<B>> {
    Checkpoint::parse(bytes, WEIGHTS_FORMAT)?.model(backend)
}
