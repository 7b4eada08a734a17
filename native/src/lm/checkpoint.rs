//! Transformer checkpoints (`.rbw`) and optimizer state (`.opt`): safetensors files, the
//! configuration as JSON in `__metadata__`, tensors under Hugging Face names, so Python reads
//! them with `safetensors.numpy.load_file`. Writes are atomic.

use std::collections::HashMap;
use std::path::Path;

use rusting_brain_core::checkpoint::{
    config_json, packed_to_i8, q4_packed_bytes, Checkpoint, OPTIMIZER_FORMAT, VERSION, WEIGHTS_FORMAT,
};
use rusting_brain_core::models::transformer::{
    format_of, Params, QuantFormat, TensorKind, TransformerConfig, TransformerModel,
};
use rusting_brain_core::ops::{q4, q8};
use rusting_brain_core::{CoreError, Optimizer, OptimizerKind};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};

use crate::backend::cpu::CpuBackend;
use crate::io::precision::Precision;
use crate::{NetworkError, Result};
use rusting_brain_core::backend::Memory;

fn optimizer_json(o: &Optimizer) -> Value {
    match o.kind {
        OptimizerKind::Adam { beta1, beta2, epsilon } => json!({
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
        v.get(k).and_then(Value::as_f64).map(|x| x as f32).ok_or(format!("optimizer has no number `{k}`"))
    };
    let o = match v.get("kind").and_then(Value::as_str) {
        Some("adam") => {
            let betas = v.get("betas").and_then(Value::as_array).ok_or("optimizer has no betas")?;
            let b = |i: usize| betas.get(i).and_then(Value::as_f64).map(|x| x as f32).ok_or("bad betas");
            Optimizer::adam(f("learning_rate")?).betas(b(0)?, b(1)?).epsilon(f("epsilon")?)
        }
        Some("sgd") => Optimizer::sgd_momentum(f("learning_rate")?, f("momentum")?)
            .nesterov(v.get("nesterov").and_then(Value::as_bool).unwrap_or(false)),
        other => return Err(format!("unknown optimizer kind {other:?}")),
    };
    Ok(o.weight_decay(f("weight_decay")?))
}

/// A tensor on the host: name, shape, values.
pub(crate) type HostTensor = (String, Vec<usize>, Vec<f32>);

pub(crate) fn le_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Serializes named f32 tensors with their shapes and metadata, then writes atomically.
pub(crate) fn write(path: &Path, tensors: Vec<HostTensor>, meta: HashMap<String, String>) -> Result<()> {
    write_raw(path, tensors.into_iter().map(|(n, s, d)| (n, Dtype::F32, s, le_bytes(&d))).collect(), meta)
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
    crate::io::files::write_atomic(path, &rusting_brain_core::checkpoint::sorted_header(data)?)
}

fn host_tensors(
    b: &CpuBackend, c: &TransformerConfig, p: &Params<CpuBackend>, prefix: &str,
) -> Result<Vec<HostTensor>> {
    c.layout()
        .into_named()
        .into_iter()
        .zip(p.as_ref().into_leaves())
        .map(|((name, t), buf)| Ok((format!("{prefix}{name}"), t.shape, b.download(buf)?)))
        .collect()
}

/// A Q8 or Q4 checkpoint: an f32 model's matrices rounded now, a quantized model's
/// written as they are (its precision must be the one asked for: rounding int8 to 4 bits,
/// or back, would round twice). A 4-bit matrix is its packed bytes (U8), its row scales
/// (`.q4_scale`) and its blocks' 6-bit codes (`.q4_codes`), or where the blocks are not
/// such codes (taken from a GGUF file) each block's scale and offset (`.q4_blocks`, F16
/// where every one is an f16, else F32); an
/// int8 one its values (I8) and block scales (`.scale`).
fn save_quantized(model: &TransformerModel<CpuBackend>, path: &Path, format: QuantFormat) -> Result<()> {
    let c = &model.config;
    let b = &model.backend;
    let (held, name) = match format {
        QuantFormat::Q4 => (model.has_q4(), "Q4"),
        // A file says Q8 for int8 in blocks and in rows alike: the scales' count tells them
        // apart when it is read.
        QuantFormat::Q8 | QuantFormat::Q8Rows => (!model.has_q4(), "Q8"),
    };
    if model.quantized.is_some() && !held {
        return Err(NetworkError::InvalidInput(format!(
            "save_bin({name}): the model is already quantized to another precision; save it at that one, \
             or load the f32 weights and save those at {name}"
        )));
    }
    let meta = HashMap::from([
        ("format".to_string(), WEIGHTS_FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
        ("precision".to_string(), name.to_string()),
        ("config".to_string(), config_json(c).to_string()),
    ]);
    let quantized: Vec<Option<&(Vec<f32>, Vec<f32>)>> = match &model.quantized {
        Some(qp) => qp.as_ref().into_leaves().into_iter().map(Option::as_ref).collect(),
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
        let (packed, scales) = match (quantized.get(i), format_of(format, &name)) {
            (Some(Some((p, s))), _) => (b.download(p)?, b.download(s)?),
            (_, QuantFormat::Q4) => q4::quantize_q4(&b.download(leaves[i])?, rows, cols)?,
            (_, QuantFormat::Q8) => q8::quantize_blocks(&b.download(leaves[i])?, rows, cols)?,
            (_, QuantFormat::Q8Rows) => q8::quantize_rows(&b.download(leaves[i])?, rows, cols)?,
        };
        if q4::is_q4(rows, cols, packed.len(), scales.len()) {
            let (row, codes) = q4::q4_codes(&scales, rows, cols)?;
            let nb = codes.len() / (2 * rows.max(1));
            out.push((format!("{name}.q4_scale"), Dtype::F32, vec![rows, 2], le_bytes(&row)));
            // Blocks taken from a GGUF file as they were are not codes of the row scales:
            // those keep each block's scale and offset (checked by coding them back).
            let coded = q4::q4_scales_from_codes(&row, &codes, rows, cols)?;
            if coded.iter().zip(&scales).all(|(a, b)| a.to_bits() == b.to_bits()) {
                out.push((format!("{name}.q4_codes"), Dtype::U8, vec![rows, nb, 2], codes));
            } else {
                let rs = q4::q4_row_scales(cols);
                let blocks: Vec<f32> = scales.chunks_exact(rs).flat_map(|r| r[2..].iter().copied()).collect();
                // F16 where every value is one (a Q4_0 or Q4_1 file's scales are): half the
                // bytes, the same values.
                let half: Vec<half::f16> = blocks.iter().map(|&v| half::f16::from_f32(v)).collect();
                let (dtype, bytes) =
                    if half.iter().zip(&blocks).all(|(h, v)| h.to_f32().to_bits() == v.to_bits()) {
                        (Dtype::F16, half.iter().flat_map(|h| h.to_le_bytes()).collect())
                    } else {
                        (Dtype::F32, le_bytes(&blocks))
                    };
                out.push((format!("{name}.q4_blocks"), dtype, vec![rows, nb, 2], bytes));
            }
            let width = 4 * q4::q4_packed_cols(cols);
            out.push((name, Dtype::U8, vec![rows, width], q4_packed_bytes(&packed)));
            continue;
        }
        // One scale a block; a model read from a version-1 file keeps its one a row.
        let shape = if scales.len() == rows { vec![rows] } else { vec![rows, scales.len() / rows.max(1)] };
        out.push((format!("{name}.scale"), Dtype::F32, shape, le_bytes(&scales)));
        out.push((name, Dtype::I8, t.shape, packed_to_i8(&packed, rows, cols)));
    }
    write_raw(path, out, meta)
}

pub fn save_weights(model: &TransformerModel<CpuBackend>, path: &Path, precision: Precision) -> Result<()> {
    if let Some(format) = precision.format() {
        return save_quantized(model, path, format);
    }
    let bytes = rusting_brain_core::checkpoint::f32_file_bytes(model)?;
    crate::io::files::write_atomic(path, &bytes)
}

pub fn save_optimizer(
    model: &TransformerModel<CpuBackend>, optimizer: &Optimizer, path: &Path,
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

/// A checkpoint's complaint about its bytes, as an error naming the file.
fn in_file(path: &Path) -> impl Fn(CoreError) -> NetworkError + '_ {
    move |e| match e {
        CoreError::Checkpoint { location, message } => NetworkError::parse(path, location, message),
        other => NetworkError::Core(other),
    }
}

/// The model in a `.rbw` file (F32 as saved, Q8 as a quantized model); the format checks
/// are core's, shared with the browser's loader.
pub fn load_weights(path: &Path) -> Result<TransformerModel<CpuBackend>> {
    let bytes = crate::io::files::read(path)?;
    rusting_brain_core::checkpoint::read_model(&bytes, CpuBackend::new()).map_err(in_file(path))
}

/// Loads moments, step count and optimizer settings into `model`; the file must have been
/// written for a model of the same configuration. Nothing changes on error.
pub fn load_optimizer(model: &mut TransformerModel<CpuBackend>, path: &Path) -> Result<Optimizer> {
    let bytes = crate::io::files::read(path)?;
    let file = Checkpoint::parse(&bytes, OPTIMIZER_FORMAT).map_err(in_file(path))?;
    let config = file.config().map_err(in_file(path))?;
    if config != model.config {
        return Err(NetworkError::parse(
            path,
            "metadata.config",
            "this optimizer state belongs to a model of another configuration",
        ));
    }
    let step = file
        .meta("step")
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| NetworkError::parse(path, "metadata", "no step count"))?;
    let opt_v: Value = serde_json::from_str(file.meta("optimizer").unwrap_or(""))
        .map_err(|e| NetworkError::parse(path, "metadata.optimizer", e.to_string()))?;
    let optimizer =
        optimizer_from_json(&opt_v).map_err(|e| NetworkError::parse(path, "metadata.optimizer", e))?;
    let m = file.params(&config, "m.", &model.backend).map_err(in_file(path))?;
    let v = file.params(&config, "v.", &model.backend).map_err(in_file(path))?;
    model.m = m;
    model.v = v;
    model.step = step;
    Ok(optimizer)
}
