//! Transformer checkpoints (`.rbw`) and optimizer state (`.opt`): safetensors files, the
//! configuration as JSON in `__metadata__`, tensors under Hugging Face names, so Python reads
//! them with `safetensors.numpy.load_file`. Writes are atomic.

use std::collections::HashMap;
use std::path::Path;

use rusting_brain_core::models::transformer::{
    MoeConfig, Params, QuantParams, TensorKind, TensorSpec, TransformerConfig, TransformerModel,
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
        "moe": moe,
    })
}

fn usize_of(v: &Value, k: &str, what: &str) -> std::result::Result<usize, String> {
    v.get(k)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or(format!("{what} has no integer `{k}`"))
}

fn f32_of(v: &Value, k: &str, what: &str) -> std::result::Result<f32, String> {
    v.get(k)
        .and_then(Value::as_f64)
        .map(|x| x as f32)
        .ok_or(format!("{what} has no number `{k}`"))
}

fn bool_of(v: &Value, k: &str, what: &str) -> std::result::Result<bool, String> {
    v.get(k)
        .and_then(Value::as_bool)
        .ok_or(format!("{what} has no boolean `{k}`"))
}

fn moe_from_json(v: &Value) -> std::result::Result<MoeConfig, String> {
    let w = "config.moe";
    let layers = v
        .get("layers")
        .and_then(Value::as_array)
        .ok_or(format!("{w} has no array `layers`"))?
        .iter()
        .map(|l| {
            l.as_u64()
                .map(|x| x as usize)
                .ok_or(format!("{w}.layers holds a non-integer"))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
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

fn config_from_json(v: &Value) -> std::result::Result<TransformerConfig, String> {
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
        moe,
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

fn host_tensors(
    b: &CpuBackend,
    c: &TransformerConfig,
    p: &Params<CpuBackend>,
    prefix: &str,
) -> Result<Vec<HostTensor>> {
    c.layout()
        .into_named()
        .into_iter()
        .zip(p.as_ref().into_leaves())
        .map(|((name, t), buf)| Ok((format!("{prefix}{name}"), t.shape, b.download(buf)?)))
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

fn save_q8(model: &TransformerModel<CpuBackend>, path: &Path) -> Result<()> {
    let c = &model.config;
    let b = &model.backend;
    let meta = HashMap::from([
        ("format".to_string(), WEIGHTS_FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
        ("precision".to_string(), "Q8".to_string()),
        ("config".to_string(), config_json(c).to_string()),
    ]);
    let quantized: Vec<Option<&(Vec<f32>, Vec<f32>)>> = match &model.quantized {
        Some(qp) => qp
            .as_ref()
            .into_leaves()
            .into_iter()
            .map(Option::as_ref)
            .collect(),
        None => Vec::new(),
    };
    let mut out: Vec<RawTensor> = Vec::new();
    let leaves = model.params.as_ref().into_leaves();
    for (i, (name, t)) in c.layout().into_named().into_iter().enumerate() {
        if t.kind != TensorKind::Matrix {
            out.push((name, Dtype::F32, t.shape, le_bytes(&b.download(leaves[i])?)));
            continue;
        }
        let (rows, cols) = t.rows_cols();
        let (packed, scales) = match quantized.get(i) {
            Some(Some((p, s))) => (b.download(p)?, b.download(s)?),
            _ => q8::quantize_rows(&b.download(leaves[i])?, rows, cols)?,
        };
        out.push((format!("{name}.scale"), Dtype::F32, vec![rows], le_bytes(&scales)));
        out.push((name, Dtype::I8, t.shape, packed_to_i8(&packed, rows, cols)));
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
        c.layout().try_map(|name, t| {
            let data = read_f32(&st, path, &format!("{prefix}{name}"), &t)?;
            b.upload(&data).map_err(NetworkError::from)
        })
    }
}

/// The F32 tensor `name`, checked against `t`'s shape and for finite values.
fn read_f32(st: &SafeTensors<'_>, path: &Path, name: &str, t: &TensorSpec) -> Result<Vec<f32>> {
    let tensor = st
        .tensor(name)
        .map_err(|_| NetworkError::parse(path, name, "missing tensor"))?;
    if tensor.dtype() != Dtype::F32 {
        return Err(NetworkError::parse(
            path,
            name,
            format!("dtype {:?}, expected F32", tensor.dtype()),
        ));
    }
    if tensor.shape() != t.shape.as_slice() {
        return Err(NetworkError::parse(
            path,
            name,
            format!("shape {:?}, the config needs {:?}", tensor.shape(), t.shape),
        ));
    }
    let data: Vec<f32> = tensor
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if data.iter().any(|v| !v.is_finite()) {
        return Err(NetworkError::parse(path, name, "holds NaN or infinite values"));
    }
    Ok(data)
}

fn load_q8(file: &File, path: &Path) -> Result<TransformerModel<CpuBackend>> {
    let config = file.config(path)?;
    let b = CpuBackend::new();
    let st = SafeTensors::deserialize(&file.bytes)
        .map_err(|e| NetworkError::parse(path, "header", e.to_string()))?;
    let layout = config.layout();
    // Norms and routers in f32; an int8 model keeps no f32 matrices.
    let params = layout.as_ref().try_map(|name, t| match t.kind {
        TensorKind::Matrix => b.zeros(0).map_err(NetworkError::from),
        _ => b
            .upload(&read_f32(&st, path, name, t)?)
            .map_err(NetworkError::from),
    })?;
    let quantized: QuantParams<CpuBackend> = layout.as_ref().try_map(|name, t| {
        if t.kind != TensorKind::Matrix {
            return Ok(None);
        }
        let (rows, cols) = t.rows_cols();
        let tensor = st
            .tensor(name)
            .map_err(|_| NetworkError::parse(path, name, "missing tensor"))?;
        if tensor.dtype() != Dtype::I8 || tensor.shape() != t.shape.as_slice() {
            return Err(NetworkError::parse(
                path,
                name,
                format!(
                    "{:?} {:?}, expected I8 {:?}",
                    tensor.dtype(),
                    tensor.shape(),
                    t.shape
                ),
            ));
        }
        let scale = TensorSpec {
            shape: vec![rows],
            kind: TensorKind::Norm,
        };
        let scale_name = format!("{name}.scale");
        let s = read_f32(&st, path, &scale_name, &scale)?;
        if s.iter().any(|x| *x < 0.0) {
            return Err(NetworkError::parse(path, &scale_name, "scales must be >= 0"));
        }
        Ok(Some((
            b.upload(&i8_to_packed(tensor.data(), rows, cols))?,
            b.upload(&s)?,
        )))
    })?;
    Ok(TransformerModel::from_quantized(b, config, params, quantized)?)
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
