//! Transformer checkpoints (`.rbw`) and optimizer state (`.opt`): safetensors files, the
//! configuration as JSON in `__metadata__`, tensors under Hugging Face names, so Python reads
//! them with `safetensors.numpy.load_file`. Writes are atomic.

use std::collections::HashMap;
use std::path::Path;

use rusting_brain_core::models::transformer::{
    Params, QuantLayer, QuantParams, TransformerConfig, TransformerModel,
};
use rusting_brain_core::ops::q8;
use rusting_brain_core::{Backend, Optimizer, OptimizerKind};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::{json, Value};

use crate::cpu::CpuBackend;
use crate::{NetworkError, Result};

pub const WEIGHTS_FORMAT: &str = "rusting_brain.transformer";
pub const OPTIMIZER_FORMAT: &str = "rusting_brain.optimizer";
pub const VERSION: u64 = 1;

/// How weights are stored in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// 4 bytes per weight, exact: what to resume training from.
    F32,
    /// 1 byte per weight (int8, one f32 scale per row; norm weights stay f32): for
    /// shipping a model that will only be run. Loads as a quantized model.
    Q8,
}

pub fn config_json(c: &TransformerConfig) -> Value {
    json!({
        "vocab_size": c.vocab_size, "d_model": c.d_model, "n_layers": c.n_layers,
        "q_heads": c.q_heads, "kv_heads": c.kv_heads, "head_dim": c.head_dim, "d_ff": c.d_ff,
        "max_seq_len": c.max_seq_len, "rope_theta": c.rope_theta, "norm_eps": c.norm_eps,
    })
}

fn config_from_json(v: &Value) -> std::result::Result<TransformerConfig, String> {
    let u = |k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .map(|x| x as usize)
            .ok_or(format!("config has no integer `{k}`"))
    };
    let f = |k: &str| {
        v.get(k)
            .and_then(Value::as_f64)
            .map(|x| x as f32)
            .ok_or(format!("config has no number `{k}`"))
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
    })
}

fn optimizer_json(o: &Optimizer) -> Value {
    match o.kind {
        OptimizerKind::Adam {
            beta1,
            beta2,
            epsilon,
        } => json!({
            "kind": "adam", "learning_rate": o.learning_rate(), "weight_decay": o.decay(),
            "betas": [beta1, beta2], "epsilon": epsilon,
        }),
        OptimizerKind::Sgd { momentum, nesterov } => json!({
            "kind": "sgd", "learning_rate": o.learning_rate(), "weight_decay": o.decay(),
            "momentum": momentum, "nesterov": nesterov,
        }),
    }
}

fn optimizer_from_json(v: &Value) -> std::result::Result<Optimizer, String> {
    let f = |k: &str| {
        v.get(k)
            .and_then(Value::as_f64)
            .map(|x| x as f32)
            .ok_or(format!("optimizer has no number `{k}`"))
    };
    let o = match v.get("kind").and_then(Value::as_str) {
        Some("adam") => {
            let betas = v
                .get("betas")
                .and_then(Value::as_array)
                .ok_or("optimizer has no betas")?;
            let b = |i: usize| {
                betas
                    .get(i)
                    .and_then(Value::as_f64)
                    .map(|x| x as f32)
                    .ok_or("bad betas")
            };
            Optimizer::adam(f("learning_rate")?)
                .betas(b(0)?, b(1)?)
                .epsilon(f("epsilon")?)
        }
        Some("sgd") => Optimizer::sgd_momentum(f("learning_rate")?, f("momentum")?)
            .nesterov(v.get("nesterov").and_then(Value::as_bool).unwrap_or(false)),
        other => return Err(format!("unknown optimizer kind {other:?}")),
    };
    Ok(o.weight_decay(f("weight_decay")?))
}

/// A tensor on the host: name, shape, values.
type HostTensor = (String, Vec<usize>, Vec<f32>);

fn le_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Serializes named f32 tensors with their shapes and metadata, then writes atomically.
fn write(path: &Path, tensors: Vec<HostTensor>, meta: HashMap<String, String>) -> Result<()> {
    write_raw(
        path,
        tensors
            .into_iter()
            .map(|(n, s, d)| (n, Dtype::F32, s, le_bytes(&d)))
            .collect(),
        meta,
    )
}

/// A tensor as stored: name, dtype, shape, little-endian bytes.
type RawTensor = (String, Dtype, Vec<usize>, Vec<u8>);

fn write_raw(path: &Path, bytes: Vec<RawTensor>, meta: HashMap<String, String>) -> Result<()> {
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(n, dt, s, b)| TensorView::new(*dt, s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| NetworkError::InvalidInput(format!("{}: {e}", path.display())))?;
    let data = safetensors::tensor::serialize(views, Some(meta))
        .map_err(|e| NetworkError::InvalidInput(format!("{}: {e}", path.display())))?;
    crate::files::write_atomic(path, &data)
}

/// Shape of each named tensor of a config, in `Params::named` order.
fn shapes(c: &TransformerConfig) -> Vec<(String, Vec<usize>)> {
    let (d, q, kv, f) = (c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![c.vocab_size, d])];
    for i in 0..c.n_layers {
        for (name, shape) in [
            ("input_layernorm.weight", vec![d]),
            ("self_attn.q_proj.weight", vec![q, d]),
            ("self_attn.k_proj.weight", vec![kv, d]),
            ("self_attn.v_proj.weight", vec![kv, d]),
            ("self_attn.o_proj.weight", vec![d, q]),
            ("post_attention_layernorm.weight", vec![d]),
            ("mlp.gate_proj.weight", vec![f, d]),
            ("mlp.up_proj.weight", vec![f, d]),
            ("mlp.down_proj.weight", vec![d, f]),
        ] {
            out.push((format!("model.layers.{i}.{name}"), shape));
        }
    }
    out.push(("model.norm.weight".to_string(), vec![d]));
    out
}

fn host_tensors(
    b: &CpuBackend,
    c: &TransformerConfig,
    p: &Params<CpuBackend>,
    prefix: &str,
) -> Result<Vec<HostTensor>> {
    shapes(c)
        .into_iter()
        .zip(p.named())
        .map(|((name, shape), (_, buf, _))| Ok((format!("{prefix}{name}"), shape, b.download(buf)?)))
        .collect()
}

/// The int8 bytes (rows x cols) of a packed weight.
fn packed_to_i8(packed: &[f32], rows: usize, cols: usize) -> Vec<u8> {
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
fn i8_to_packed(bytes: &[u8], rows: usize, cols: usize) -> Vec<f32> {
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

/// The int8 tensor at position `i` of `shapes(c)` (a matrix, not a norm).
fn quantized_tensor(qp: &QuantParams<CpuBackend>, i: usize) -> &(Vec<f32>, Vec<f32>) {
    if i == 0 {
        return &qp.embed;
    }
    let ql = &qp.layers[(i - 1) / 9];
    match (i - 1) % 9 {
        1 => &ql.wq,
        2 => &ql.wk,
        3 => &ql.wv,
        4 => &ql.wo,
        6 => &ql.w_gate,
        7 => &ql.w_up,
        _ => &ql.w_down,
    }
}

fn save_q8(model: &TransformerModel<CpuBackend>, path: &Path) -> Result<()> {
    let c = &model.config;
    let b = &model.backend;
    let meta = HashMap::from([
        ("format".to_string(), WEIGHTS_FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
        ("precision".to_string(), "Q8".to_string()),
        ("config".to_string(), config_json(c).to_string()),
    ]);
    let mut out: Vec<RawTensor> = Vec::new();
    let named = model.params.named();
    for (i, (name, shape)) in shapes(c).into_iter().enumerate() {
        if shape.len() == 1 {
            out.push((name, Dtype::F32, shape, le_bytes(&b.download(named[i].1)?)));
            continue;
        }
        let (rows, cols) = (shape[0], shape[1]);
        let (packed, scales) = match &model.quantized {
            Some(qp) => {
                let (p, s) = quantized_tensor(qp, i);
                (b.download(p)?, b.download(s)?)
            }
            None => q8::quantize_rows(&b.download(named[i].1)?, rows, cols)?,
        };
        out.push((format!("{name}.scale"), Dtype::F32, vec![rows], le_bytes(&scales)));
        out.push((name, Dtype::I8, shape, packed_to_i8(&packed, rows, cols)));
    }
    write_raw(path, out, meta)
}

pub fn save_weights(model: &TransformerModel<CpuBackend>, path: &Path, precision: Precision) -> Result<()> {
    if precision == Precision::Q8 {
        return save_q8(model, path);
    }
    let meta = HashMap::from([
        ("format".to_string(), WEIGHTS_FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
        ("precision".to_string(), "F32".to_string()),
        ("config".to_string(), config_json(&model.config).to_string()),
    ]);
    write(
        path,
        host_tensors(&model.backend, &model.config, &model.params, "")?,
        meta,
    )
}

pub fn save_optimizer(
    model: &TransformerModel<CpuBackend>,
    optimizer: &Optimizer,
    path: &Path,
) -> Result<()> {
    let meta = HashMap::from([
        ("format".to_string(), OPTIMIZER_FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
        ("step".to_string(), model.step.to_string()),
        ("config".to_string(), config_json(&model.config).to_string()),
        ("optimizer".to_string(), optimizer_json(optimizer).to_string()),
    ]);
    let mut tensors = host_tensors(&model.backend, &model.config, &model.m, "m.")?;
    tensors.extend(host_tensors(&model.backend, &model.config, &model.v, "v.")?);
    write(path, tensors, meta)
}

/// A parsed safetensors file: its metadata checked against `format`.
struct File {
    bytes: Vec<u8>,
    meta: HashMap<String, String>,
}

fn open(path: &Path, format: &str) -> Result<File> {
    let bytes = crate::files::read(path)?;
    let bad = |location: &str, message: String| NetworkError::parse(path, location, message);
    // The crate checks the header's length, its JSON, and that every tensor's offsets lie
    // inside the file and cover it exactly, before anything is allocated from the header.
    let (_, metadata) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| bad("header", format!("not a valid safetensors file: {e}")))?;
    SafeTensors::deserialize(&bytes)
        .map_err(|e| bad("header", format!("not a valid safetensors file: {e}")))?;
    let meta = metadata.metadata().clone().unwrap_or_default();
    match meta.get("format").map(String::as_str) {
        Some(f) if f == format => {}
        other => {
            return Err(bad(
                "metadata",
                format!("format {other:?}, expected \"{format}\""),
            ))
        }
    }
    match meta.get("version").and_then(|v| v.parse::<u64>().ok()) {
        Some(VERSION) => {}
        Some(v) if v > VERSION => {
            return Err(bad(
                "metadata",
                format!("written by a newer rusting_brain (version {v}); this build reads {VERSION}"),
            ))
        }
        other => return Err(bad("metadata", format!("unsupported version {other:?}"))),
    }
    Ok(File { bytes, meta })
}

impl File {
    fn config(&self, path: &Path) -> Result<TransformerConfig> {
        let text = self
            .meta
            .get("config")
            .ok_or_else(|| NetworkError::parse(path, "metadata", "no config"))?;
        let v: Value = serde_json::from_str(text)
            .map_err(|e| NetworkError::parse(path, "metadata.config", e.to_string()))?;
        let c = config_from_json(&v).map_err(|e| NetworkError::parse(path, "metadata.config", e))?;
        c.validate()
            .map_err(|e| NetworkError::parse(path, "metadata.config", e.to_string()))?;
        Ok(c)
    }

    /// Reads every tensor of `c` (under `prefix`) into backend buffers, checking dtype and
    /// shape against the configuration.
    fn params(
        &self,
        path: &Path,
        c: &TransformerConfig,
        prefix: &str,
        b: &CpuBackend,
    ) -> Result<Params<CpuBackend>> {
        let st = SafeTensors::deserialize(&self.bytes)
            .map_err(|e| NetworkError::parse(path, "header", e.to_string()))?;
        let mut bufs = Vec::new();
        for (name, shape) in shapes(c) {
            let full = format!("{prefix}{name}");
            let t = st
                .tensor(&full)
                .map_err(|_| NetworkError::parse(path, &full, "missing tensor"))?;
            if t.dtype() != Dtype::F32 {
                return Err(NetworkError::parse(
                    path,
                    &full,
                    format!("dtype {:?}, expected F32", t.dtype()),
                ));
            }
            if t.shape() != shape.as_slice() {
                return Err(NetworkError::parse(
                    path,
                    &full,
                    format!("shape {:?}, the config needs {shape:?}", t.shape()),
                ));
            }
            let data: Vec<f32> = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            if data.iter().any(|v| !v.is_finite()) {
                return Err(NetworkError::parse(path, &full, "holds NaN or infinite values"));
            }
            bufs.push(b.upload(&data)?);
        }
        let mut it = bufs.into_iter();
        let mut next = || it.next().expect("one buffer per shape");
        let embed = next();
        let layers = (0..c.n_layers)
            .map(|_| rusting_brain_core::models::transformer::LayerParams {
                attn_norm: next(),
                wq: next(),
                wk: next(),
                wv: next(),
                wo: next(),
                ffn_norm: next(),
                w_gate: next(),
                w_up: next(),
                w_down: next(),
            })
            .collect();
        Ok(Params {
            embed,
            layers,
            final_norm: next(),
        })
    }
}

fn load_q8(file: &File, path: &Path) -> Result<TransformerModel<CpuBackend>> {
    let config = file.config(path)?;
    let b = CpuBackend::new();
    let st = SafeTensors::deserialize(&file.bytes)
        .map_err(|e| NetworkError::parse(path, "header", e.to_string()))?;
    let get = |name: &str, dtype: Dtype, shape: &[usize]| -> Result<Vec<u8>> {
        let t = st
            .tensor(name)
            .map_err(|_| NetworkError::parse(path, name, "missing tensor"))?;
        if t.dtype() != dtype || t.shape() != shape {
            return Err(NetworkError::parse(
                path,
                name,
                format!("{:?} {:?}, expected {dtype:?} {shape:?}", t.dtype(), t.shape()),
            ));
        }
        Ok(t.data().to_vec())
    };
    let f32s = |bytes: Vec<u8>| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let mut norms_flat = Vec::new();
    let mut mats = Vec::new();
    for (name, shape) in shapes(&config) {
        if shape.len() == 1 {
            let v = f32s(get(&name, Dtype::F32, &shape)?);
            if v.iter().any(|x| !x.is_finite()) {
                return Err(NetworkError::parse(path, &name, "holds NaN or infinite values"));
            }
            norms_flat.push(b.upload(&v)?);
        } else {
            let (rows, cols) = (shape[0], shape[1]);
            let q = get(&name, Dtype::I8, &shape)?;
            let scale_name = format!("{name}.scale");
            let s = f32s(get(&scale_name, Dtype::F32, &[rows])?);
            if s.iter().any(|x| !x.is_finite() || *x < 0.0) {
                return Err(NetworkError::parse(
                    path,
                    &scale_name,
                    "scales must be finite and >= 0",
                ));
            }
            mats.push((b.upload(&i8_to_packed(&q, rows, cols))?, b.upload(&s)?));
        }
    }
    // shapes() lists, per block, [attn_norm, q, k, v, o, ffn_norm, gate, up, down], the
    // embedding first and the final norm last.
    let final_norm = norms_flat.pop().expect("the final norm is listed last");
    let mut norm_it = norms_flat.into_iter();
    let mut norms = Vec::new();
    for _ in 0..config.n_layers {
        norms.push((
            norm_it.next().expect("two norms a block"),
            norm_it.next().expect("two norms a block"),
        ));
    }
    let mut mat_it = mats.into_iter();
    let embed = mat_it.next().expect("the embedding is listed first");
    let mut layers = Vec::new();
    for _ in 0..config.n_layers {
        let mut n = || mat_it.next().expect("seven matrices a block");
        layers.push(QuantLayer {
            wq: n(),
            wk: n(),
            wv: n(),
            wo: n(),
            w_gate: n(),
            w_up: n(),
            w_down: n(),
        });
    }
    Ok(TransformerModel::from_quantized(
        b,
        config,
        norms,
        final_norm,
        QuantParams { embed, layers },
    )?)
}

pub fn load_weights(path: &Path) -> Result<TransformerModel<CpuBackend>> {
    let file = open(path, WEIGHTS_FORMAT)?;
    match file.meta.get("precision").map(String::as_str) {
        Some("F32") => {}
        Some("Q8") => return load_q8(&file, path),
        other => {
            return Err(NetworkError::parse(
                path,
                "metadata",
                format!("precision {other:?} is not one this build reads (F32, Q8)"),
            ))
        }
    }
    let config = file.config(path)?;
    let b = CpuBackend::new();
    let params = file.params(path, &config, "", &b)?;
    Ok(TransformerModel::from_params(b, config, params)?)
}

/// Loads moments, step count and optimizer settings into `model`; the file must have been
/// written for a model of the same configuration. Nothing changes on error.
pub fn load_optimizer(model: &mut TransformerModel<CpuBackend>, path: &Path) -> Result<Optimizer> {
    let file = open(path, OPTIMIZER_FORMAT)?;
    let config = file.config(path)?;
    if config != model.config {
        return Err(NetworkError::parse(
            path,
            "metadata.config",
            "this optimizer state belongs to a model of another configuration",
        ));
    }
    let step = file
        .meta
        .get("step")
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| NetworkError::parse(path, "metadata", "no step count"))?;
    let opt_v: Value = serde_json::from_str(file.meta.get("optimizer").map_or("", String::as_str))
        .map_err(|e| NetworkError::parse(path, "metadata.optimizer", e.to_string()))?;
    let optimizer =
        optimizer_from_json(&opt_v).map_err(|e| NetworkError::parse(path, "metadata.optimizer", e))?;
    let m = file.params(path, &config, "m.", &model.backend)?;
    let v = file.params(path, &config, "v.", &model.backend)?;
    model.m = m;
    model.v = v;
    model.step = step;
    Ok(optimizer)
}
