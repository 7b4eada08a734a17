//! Adapter files: `.rbl` (safetensors, PEFT's tensor names, the adapter settings in the
//! metadata) and PEFT's own directory (`adapter_config.json` + `adapter_model.safetensors`),
//! written and read. Every tensor is checked against the model before anything changes.

use std::collections::HashMap;
use std::path::Path;

use rusting_brain_core::models::transformer::{
    adapted_shapes, adapter_buffers_mut, peft_names, LoraConfig, LoraPair, TransformerModel, LORA_TARGETS,
};
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;
use serde_json::{json, Value};

use crate::backend::cpu::CpuBackend;
use crate::{NetworkError, Result};
use rusting_brain_core::backend::Memory;

/// The `format` of an `.rbl` file's metadata.
pub const ADAPTER_FORMAT: &str = "rusting_brain.lora";
/// PEFT's weights file in an adapter directory.
const PEFT_WEIGHTS: &str = "adapter_model.safetensors";
const PEFT_CONFIG: &str = "adapter_config.json";

fn bad(path: &Path, message: impl std::fmt::Display) -> NetworkError {
    NetworkError::InvalidInput(format!("{}: {message}", path.display()))
}

/// The adapters of `model` as (PEFT name, shape, values).
fn tensors(model: &TransformerModel<CpuBackend>) -> Result<Vec<crate::lm::checkpoint::HostTensor>> {
    let st = model
        .lora
        .as_ref()
        .ok_or_else(|| NetworkError::InvalidInput("no adapters are attached: add_lora first".into()))?;
    let r = st.config.rank;
    let b = &model.backend;
    let mut out = Vec::new();
    for (name, pair) in st.weights.as_ref().into_named() {
        if let Some(p) = pair {
            let (na, nb) = peft_names(&name);
            let (a, bm) = (b.download(&p.a)?, b.download(&p.b)?);
            out.push((na, vec![r, a.len() / r], a));
            out.push((nb, vec![bm.len() / r, r], bm));
        }
    }
    Ok(out)
}

/// PEFT's `adapter_config.json` for `c` (the keys `peft.LoraConfig` reads).
fn peft_config(c: &LoraConfig, base: Option<&str>) -> Value {
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": c.rank,
        "lora_alpha": c.alpha,
        "target_modules": c.targets,
        "use_rslora": c.rslora,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "layers_to_transform": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_dora": false,
    })
}

/// Writes the adapters alone to an `.rbl` file (atomically).
pub(crate) fn save(model: &TransformerModel<CpuBackend>, path: &Path) -> Result<()> {
    let t = tensors(model)?;
    let c = &model.lora.as_ref().expect("tensors checked").config;
    let meta = HashMap::from([
        ("format".to_string(), ADAPTER_FORMAT.to_string()),
        ("version".to_string(), "1".to_string()),
        ("adapter_config".to_string(), peft_config(c, None).to_string()),
    ]);
    crate::lm::checkpoint::write(path, t, meta)
}

/// Writes a PEFT adapter directory: `adapter_config.json` and `adapter_model.safetensors`.
/// Other files in `dir` stay.
pub(crate) fn save_peft(model: &TransformerModel<CpuBackend>, dir: &Path, base: Option<&str>) -> Result<()> {
    let t = tensors(model)?;
    let c = &model.lora.as_ref().expect("tensors checked").config;
    std::fs::create_dir_all(dir).map_err(|e| NetworkError::io(dir, e))?;
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    crate::lm::checkpoint::write(&dir.join(PEFT_WEIGHTS), t, meta)?;
    let text = serde_json::to_string_pretty(&peft_config(c, base))
        .map_err(|e| NetworkError::InvalidInput(format!("adapter config: {e}")))?;
    crate::io::files::write_atomic(&dir.join(PEFT_CONFIG), text.as_bytes())
}

/// The adapter settings of a PEFT config, refusing what this library does not compute.
fn parse_config(v: &Value, path: &Path) -> Result<LoraConfig> {
    let key = |k: &str| v.get(k).filter(|x| !x.is_null());
    if let Some(t) = key("peft_type").and_then(Value::as_str) {
        if t != "LORA" {
            return Err(bad(path, format!("peft_type is {t}; only LORA adapters load here")));
        }
    }
    let rank = key("r")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad(path, "`r` (the rank) is missing or not a positive integer"))?
        as usize;
    let alpha = key("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or_else(|| bad(path, "`lora_alpha` is missing or not a number"))? as f32;
    let rslora = key("use_rslora").and_then(Value::as_bool).unwrap_or(false);
    let targets: Vec<String> = match key("target_modules") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_str().map(str::to_string).ok_or_else(|| bad(path, "target_modules holds a non-string"))
            })
            .collect::<Result<_>>()?,
        Some(Value::String(s)) if s == "all-linear" => LORA_TARGETS.iter().map(|s| s.to_string()).collect(),
        Some(Value::String(s)) if LORA_TARGETS.contains(&s.as_str()) => vec![s.clone()],
        Some(other) => {
            return Err(bad(
                path,
                format!(
                    "target_modules {other} is a pattern; name the modules ({})",
                    LORA_TARGETS.join(", ")
                ),
            ))
        }
        None => return Err(bad(path, "target_modules is missing")),
    };
    // Settings that change what the adapter computes, which this library does not do.
    type Refusal = (&'static str, fn(&Value) -> bool, &'static str);
    let refusals: [Refusal; 8] = [
        ("lora_bias", |x| x.as_bool() == Some(true), "a bias on lora_B"),
        ("target_parameters", |x| x.as_array().is_some_and(|a| !a.is_empty()), "adapters on raw parameters"),
        ("bias", |x| x.as_str().is_some_and(|s| s != "none"), "trained biases"),
        ("fan_in_fan_out", |x| x.as_bool() == Some(true), "transposed (Conv1D) weights"),
        ("use_dora", |x| x.as_bool() == Some(true), "DoRA"),
        ("modules_to_save", |x| x.as_array().is_some_and(|a| !a.is_empty()), "fully trained extra modules"),
        ("rank_pattern", |x| x.as_object().is_some_and(|o| !o.is_empty()), "per-module ranks"),
        ("alpha_pattern", |x| x.as_object().is_some_and(|o| !o.is_empty()), "per-module alphas"),
    ];
    for (k, refused, what) in refusals {
        if let Some(x) = key(k) {
            if refused(x) {
                return Err(bad(
                    path,
                    format!("`{k}`: {x} asks for {what}, which this library does not compute"),
                ));
            }
        }
    }
    if key("layers_to_transform").is_some() {
        return Err(bad(
            path,
            "`layers_to_transform` adapts some layers only; this library adapts every layer",
        ));
    }
    let c = LoraConfig::new(rank).alpha(alpha).rslora(rslora).targets(&targets);
    c.validate().map_err(|e| bad(path, e))?;
    Ok(c)
}

/// Reads `.rbl` or a PEFT directory onto `model`: attaches adapters of the file's settings
/// when none are attached, else requires the same rank, alpha, scaling and targets. Every
/// tensor is read and checked first, so a refused file changes nothing.
pub(crate) fn load(model: &mut TransformerModel<CpuBackend>, path: &Path) -> Result<()> {
    let (config, values) = read(model, path, model.lora.as_ref().map(|l| &l.config))?;
    // Everything checked: attach if needed, then write.
    if model.lora.is_none() {
        model.add_lora(config, 0)?;
    }
    let b = model.backend;
    let state = model.lora.as_mut().expect("attached above");
    for (name, pair) in state.weights.as_mut().into_named() {
        if let Some(p) = pair {
            let (na, nb) = peft_names(&name);
            b.write(&mut p.a, &values[&na])?;
            b.write(&mut p.b, &values[&nb])?;
        }
    }
    // Fresh gradients and optimizer moments for the loaded values.
    for tree in [&mut state.grads, &mut state.m, &mut state.v] {
        for t in adapter_buffers_mut(tree) {
            b.fill(t, 0.0)?;
        }
    }
    Ok(())
}

/// Reads `.rbl` or a PEFT directory beside `model` under `name` (its own settings), for
/// the cached passes to pick per sequence. A refused file or name changes nothing.
pub(crate) fn load_named(model: &mut TransformerModel<CpuBackend>, name: &str, path: &Path) -> Result<()> {
    if model.lora.is_some() {
        return Err(bad(path, "the model has adapters attached; named adapters load on a base with none"));
    }
    if name.is_empty() || model.named_lora.iter().any(|n| n.name == name) {
        return Err(bad(path, format!("adapter name `{name}` is empty or already loaded")));
    }
    let (config, values) = read(model, path, None)?;
    let b = model.backend;
    let weights = adapted_shapes(&config, &model.config.layout()).as_ref().try_map(|tensor, s| match s {
        Some(_) => {
            let (na, nb) = peft_names(tensor);
            Ok::<_, NetworkError>(Some(LoraPair { a: b.upload(&values[&na])?, b: b.upload(&values[&nb])? }))
        }
        None => Ok(None),
    })?;
    model.add_named_lora(name, config, weights)?;
    Ok(())
}

/// The settings and checked values (by PEFT name) of `.rbl` or a PEFT directory for
/// `model`; `want`, when given, are the settings the file must have.
fn read(
    model: &TransformerModel<CpuBackend>, path: &Path, want: Option<&LoraConfig>,
) -> Result<(LoraConfig, HashMap<String, Vec<f32>>)> {
    let (bytes, config, file) = if path.is_dir() {
        let cpath = path.join(PEFT_CONFIG);
        let text = std::fs::read_to_string(&cpath).map_err(|e| NetworkError::io(&cpath, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| bad(&cpath, format!("not JSON: {e}")))?;
        let config = parse_config(&v, &cpath)?;
        let wpath = path.join(PEFT_WEIGHTS);
        (crate::io::files::read(&wpath)?, config, wpath)
    } else {
        let bytes = crate::io::files::read(path)?;
        let (_, meta) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(path, format!("not a safetensors file: {e}")))?;
        let meta = meta.metadata().clone().unwrap_or_default();
        if meta.get("format").map(String::as_str) != Some(ADAPTER_FORMAT) {
            return Err(bad(path, format!("not an adapter file (metadata format is not {ADAPTER_FORMAT}); a PEFT adapter is a directory")));
        }
        let v: Value = meta
            .get("adapter_config")
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| bad(path, "the adapter settings in the metadata are missing or not JSON"))?;
        let config = parse_config(&v, path)?;
        (bytes, config, path.to_path_buf())
    };
    if let Some(have) = want {
        let mismatch = |what: &str, file: String, model: String| {
            bad(&file_of(path), format!("the file's adapters have {what} {file}, the model's {model}"))
        };
        if have.rank != config.rank {
            return Err(mismatch("rank", config.rank.to_string(), have.rank.to_string()));
        }
        if have.alpha != config.alpha {
            return Err(mismatch("alpha", config.alpha.to_string(), have.alpha.to_string()));
        }
        if have.rslora != config.rslora {
            return Err(mismatch("use_rslora", config.rslora.to_string(), have.rslora.to_string()));
        }
        if have.targets != config.targets {
            return Err(mismatch("targets", config.targets.join(","), have.targets.join(",")));
        }
    }
    let st =
        SafeTensors::deserialize(&bytes).map_err(|e| bad(&file, format!("not a safetensors file: {e}")))?;
    let r = config.rank;
    let shapes = adapted_shapes(&config, &model.config.layout());
    // In the model's order, so the first problem reported is the first in the model.
    let mut expected: Vec<(String, Vec<usize>)> = Vec::new();
    for (name, s) in shapes.as_ref().into_named() {
        if let Some((d_out, d_in)) = *s {
            let (na, nb) = peft_names(&name);
            expected.push((na, vec![r, d_in]));
            expected.push((nb, vec![d_out, r]));
        }
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let mut names = st.names();
    names.sort();
    if let Some(extra) = names.into_iter().find(|n| !known.contains(*n)) {
        return Err(bad(
            &file,
            format!("{extra} adapts nothing in this model with targets {}", config.targets.join(",")),
        ));
    }
    let mut values: HashMap<String, Vec<f32>> = HashMap::new();
    for (name, shape) in &expected {
        let view = st.tensor(name).map_err(|_| bad(&file, format!("{name} is missing")))?;
        if view.shape() != shape.as_slice() {
            return Err(bad(
                &file,
                format!("{name} has shape {:?}; this model needs {shape:?}", view.shape()),
            ));
        }
        if !matches!(view.dtype(), Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            return Err(bad(&file, format!("{name} is {:?}; adapters are F32, BF16 or F16", view.dtype())));
        }
        let mut out = vec![0.0f32; shape.iter().product()];
        crate::io::weights::widen(&view, 0, &mut out);
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(bad(&file, format!("{name}: value {i} is {}", out[i])));
        }
        values.insert(name.clone(), out);
    }
    Ok((config, values))
}

/// The file a PEFT directory's settings come from, or the `.rbl` itself.
fn file_of(path: &Path) -> std::path::PathBuf {
    if path.is_dir() {
        path.join(PEFT_CONFIG)
    } else {
        path.to_path_buf()
    }
}
