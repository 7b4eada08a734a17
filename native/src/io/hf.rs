//! Hugging Face model directories, in and out: `config.json` plus `model.safetensors` or a
//! sharded `model.safetensors.index.json`, as `transformers`' `save_pretrained` writes them
//! for the decoder-only families.
//!
//! Loading reads `config.json` into a [`TransformerConfig`] (refusing, by name, whatever the
//! model definition does not compute yet rather than running something else), maps every
//! shard, and converts each tensor from F32, BF16 or F16 as it is reached. At
//! [`Precision::Q8`] each matrix is converted and rounded to int8 a slab of rows at a time,
//! so the f32 model never exists: the peak is the int8 model, the f32 norms and biases,
//! and the slabs in flight. The pages of a tensor already read are handed back, and the
//! shards are read ahead on a thread of their own.
//!
//! Saving writes F32 tensors under the family's names, `config.json` for the architecture
//! that matches (the one the model was loaded from, when it was), and
//! `generation_config.json` (the one loaded, when there was one, else the token ids).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use rusting_brain_core::models::transformer::{QuantFormat, TransformerConfig, TransformerModel};
use rusting_brain_core::RopeScaling;
use safetensors::tensor::{Dtype, View};
use serde_json::{json, Map, Value};

use crate::backend::cpu::CpuBackend;
use crate::io::weights::{Files, Prefetch, Tensors};
use crate::{NetworkError, Precision, Result};
pub(crate) use rusting_brain_formats::hf::Family;

/// What a loaded directory's `config.json` said: `save_pretrained` writes the same class and
/// keeps the keys the model does not use (token ids, the tokenizer's settings).
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    family: Family,
    config: Map<String, Value>,
    /// The directory's `generation_config.json` (end ids, sampling defaults), written back
    /// as it was by `save_pretrained`.
    generation: Option<Map<String, Value>>,
    /// The directory it was read from.
    source: PathBuf,
}

impl Origin {
    /// The class the model was read as.
    pub(crate) fn family(&self) -> Family {
        self.family
    }
    /// The folder or file it was read from.
    pub(crate) fn source(&self) -> &Path {
        &self.source
    }
    /// Where a model came from other than a folder (a GGUF file): its family, the
    /// `config.json` that describes it, and the file.
    pub(crate) fn new(family: Family, config: Map<String, Value>, source: PathBuf) -> Origin {
        Origin { family, config, generation: None, source }
    }
    /// What `config.json` says the model is called (`_name_or_path`), else the directory
    /// it was read from: an adapter's `base_model_name_or_path`.
    pub(crate) fn name_or_path(&self) -> String {
        self.config
            .get("_name_or_path")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| self.source.to_string_lossy().into_owned())
    }
}

/// The family and the model configuration `config.json` (read from `path`) describes.
pub(crate) fn parse_config(path: &Path, v: &Value) -> Result<(Family, TransformerConfig)> {
    rusting_brain_formats::hf::parse_config(v).map_err(crate::io::config::lift(path))
}

/// Names in the files that a loader may pass over: rotary tables some exports keep, and
/// the head of a tied model (it is the embedding).
fn ignorable(name: &str, tied: bool) -> bool {
    name.ends_with(".rotary_emb.inv_freq") || (tied && name == "lm_head.weight")
}

/// The model in `dir`, in f32 or (converted tensor by tensor) in int8.
/// The model `dir/config.json` describes, without reading any weights.
pub(crate) fn read_config(dir: &Path) -> Result<TransformerConfig> {
    let config_path = dir.join("config.json");
    let text = crate::io::files::read(&config_path)?;
    let v: Value = serde_json::from_slice(&text)
        .map_err(|e| NetworkError::parse(&config_path, "json", e.to_string()))?;
    Ok(parse_config(&config_path, &v)?.1)
}

pub(crate) fn load(dir: &Path, precision: Precision) -> Result<(TransformerModel<CpuBackend>, Origin)> {
    let config_path = dir.join("config.json");
    let text = crate::io::files::read(&config_path)?;
    let v: Value = serde_json::from_slice(&text)
        .map_err(|e| NetworkError::parse(&config_path, "json", e.to_string()))?;
    let (family, config) = parse_config(&config_path, &v)?;
    let files = Files::open(dir, &["model"])?;
    let _prefetch = Prefetch::start(&files.paths);
    let tensors = Tensors::new(&files)?;
    let layout = config.layout();

    // Every tensor in the files must be one the configuration has: an extra one is a
    // feature (a bias, a norm) that would otherwise be dropped without a word.
    let wanted: HashSet<String> =
        layout.as_ref().into_named().into_iter().map(|(n, _)| family.file_name(&n)).collect();
    if let Some((i, extra)) =
        tensors.names().find(|(_, n)| !wanted.contains(n) && !ignorable(n, config.tie_embeddings))
    {
        return Err(NetworkError::parse(
            &files.paths[i],
            extra,
            "this tensor is not part of the model config.json describes; the model definition has no place for it",
        ));
    }

    let model = build_model(
        config,
        precision,
        |name, shape| tensors.read(&family.file_name(name), shape),
        |name, shape, format| tensors.read_quant(&family.file_name(name), shape, format),
    )?;
    // Kept to be written back; a file that is not a JSON object is the generation
    // settings' problem (GenerationConfig reports it), not the weights'.
    let gen_path = dir.join("generation_config.json");
    let generation = if gen_path.is_file() {
        let text = crate::io::files::read(&gen_path)?;
        serde_json::from_slice::<Value>(&text)
            .map_err(|e| NetworkError::parse(&gen_path, "json", e.to_string()))?
            .as_object()
            .cloned()
    } else {
        None
    };
    let origin = Origin {
        family,
        config: v.as_object().cloned().unwrap_or_default(),
        generation,
        source: dir.to_path_buf(),
    };
    Ok((model, origin))
}

/// The model `config` describes from its tensors, read by our names (`read` gives a
/// tensor in f32, `read_quant` a matrix rounded to a format): in f32, or with every
/// matrix rounded as soon as it is read, its f32 values dropped before the next one is
/// converted (norms, biases and routers stay f32).
pub(crate) fn build_model(
    config: TransformerConfig, precision: Precision, read: impl Fn(&str, &[usize]) -> Result<Vec<f32>>,
    read_quant: impl Fn(&str, &[usize], QuantFormat) -> Result<(Vec<f32>, Vec<f32>)>,
) -> Result<TransformerModel<CpuBackend>> {
    TransformerModel::from_tensors(CpuBackend::new(), config, precision.format(), read, read_quant)
}

/// The family a model of ours is written as: the one it came from, else Llama for a dense
/// model and Mixtral for one whose every block routes to experts the way Mixtral does.
fn family_for(config: &TransformerConfig, origin: Option<&Origin>) -> Result<Family> {
    if let Some(o) = origin {
        return Ok(o.family);
    }
    let refuse = |what: &str| {
        Err(NetworkError::InvalidInput(format!("save_pretrained: no Hugging Face class computes {what}")))
    };
    match (&config.moe, config.qkv_bias, config.qk_norm) {
        (_, true, true) => refuse("both q/k/v biases and per-head q/k norms"),
        (None, false, false) => Ok(Family::Llama),
        (None, true, false) => Ok(Family::Qwen2),
        (None, false, true) => Ok(Family::Qwen3),
        (Some(m), _, _) if m.shared_expert => refuse("an unweighted shared expert"),
        (Some(m), false, false) if m.renormalize && m.layers.len() == config.n_layers => Ok(Family::Mixtral),
        (Some(_), false, false) => refuse(
            "a mixture of experts with dense blocks or top-k weights not renormalized, without per-head q/k norms (Qwen3-MoE has them)",
        ),
        (Some(_), false, true) => Ok(Family::Qwen3Moe),
        (Some(_), true, false) => refuse("a mixture of experts with q/k/v biases"),
    }
}

/// An f32 as the shortest decimal that reads back as it (`1e-5`, not the f64 widening
/// `9.999999747378752e-6`), so the file says what the model was given.
fn short(x: f32) -> Value {
    x.to_string().parse::<f64>().map_or_else(|_| json!(x), |v| json!(v))
}

/// `config.json` for `config` as `family`, over the keys `origin` kept.
fn config_for(config: &TransformerConfig, family: Family, origin: Option<&Origin>) -> Value {
    let mut out = origin.map(|o| o.config.clone()).unwrap_or_default();
    // Keys this writer sets in another spelling or that would contradict the model.
    for key in
        ["rope_scaling", "rope_parameters", "partial_rotary_factor", "torch_dtype", "dtype", "head_dim"]
    {
        out.remove(key);
    }
    let c = config;
    let mut set = |k: &str, v: Value| {
        out.insert(k.to_string(), v);
    };
    set("architectures", json!([family.architecture()]));
    set("model_type", json!(family.model_type()));
    set("vocab_size", json!(c.vocab_size));
    set("hidden_size", json!(c.d_model));
    set("num_hidden_layers", json!(c.n_layers));
    set("num_attention_heads", json!(c.q_heads));
    set("num_key_value_heads", json!(c.kv_heads));
    set("head_dim", json!(c.head_dim));
    set("intermediate_size", json!(c.d_ff));
    // A context shortened here for memory (set_max_seq_len) is not the model's: the
    // directory's own stays.
    let loaded = origin
        .and_then(|o| o.config.get("max_position_embeddings"))
        .and_then(Value::as_u64)
        .map_or(0, |n| n as usize);
    set("max_position_embeddings", json!(c.max_seq_len.max(loaded)));
    set("rope_theta", short(c.rope_theta));
    // transformers 4 reads `rope_scaling`; 5 takes it as `rope_parameters` when given.
    match c.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            set("rope_scaling", json!({"rope_type": "linear", "factor": short(factor)}))
        }
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => set(
            "rope_scaling",
            json!({
                "rope_type": "llama3",
                "factor": short(factor),
                "low_freq_factor": short(low_freq_factor),
                "high_freq_factor": short(high_freq_factor),
                "original_max_position_embeddings": original_max_position,
            }),
        ),
    }
    set("rms_norm_eps", short(c.norm_eps));
    set("tie_word_embeddings", json!(c.tie_embeddings));
    set("hidden_act", json!("silu"));
    // transformers 5 reads `dtype`, 4 `torch_dtype`.
    set("dtype", json!("float32"));
    set("torch_dtype", json!("float32"));
    if let Some(m) = &c.moe {
        match family {
            Family::Mixtral => {
                set("num_local_experts", json!(m.n_experts));
                set("intermediate_size", json!(m.expert_d_ff));
            }
            _ => {
                // transformers 4 reads the first, 5 the second.
                set("num_experts", json!(m.n_experts));
                set("num_local_experts", json!(m.n_experts));
                set("moe_intermediate_size", json!(m.expert_d_ff));
                set("norm_topk_prob", json!(m.renormalize));
                set("decoder_sparse_step", json!(1));
                let dense: Vec<usize> = (0..c.n_layers).filter(|l| !m.layers.contains(l)).collect();
                set("mlp_only_layers", json!(dense));
            }
        }
        set("num_experts_per_tok", json!(m.top_k));
        let on = m.load_balance_coef > 0.0;
        set("output_router_logits", json!(on));
        if on {
            set("router_aux_loss_coef", short(m.load_balance_coef / m.top_k as f32));
        }
    }
    if matches!(family, Family::Mistral | Family::Mixtral) {
        set("sliding_window", Value::Null);
    }
    if matches!(family, Family::Llama | Family::Qwen3 | Family::Qwen3Moe) {
        set("attention_bias", json!(false));
    }
    Value::Object(out)
}

/// An f32 tensor handed to the safetensors writer, converted to bytes only as it is written.
struct F32View<'a> {
    shape: Vec<usize>,
    data: &'a [f32],
}

impl View for &F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.data.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
    fn data_len(&self) -> usize {
        4 * self.data.len()
    }
}

fn shard_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
}

/// Writes the weights (sharded past `max_shard_bytes`), `config.json` and
/// `generation_config.json` into `tmp`.
fn write_files(
    model: &TransformerModel<CpuBackend>, origin: Option<&Origin>, tmp: &Path, max_shard_bytes: usize,
) -> Result<Vec<String>> {
    let c = &model.config;
    let family = family_for(c, origin)?;
    let tensors: Vec<(String, F32View<'_>)> = c
        .layout()
        .into_named()
        .into_iter()
        .zip(model.params.as_ref().into_leaves())
        .map(|((name, t), buf)| (family.file_name(&name), F32View { shape: t.shape, data: buf.as_slice() }))
        .collect();
    // Shards in layout order, a new one when the next tensor would pass the limit (a
    // tensor larger than the limit gets a shard of its own), as transformers splits.
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut size = 0usize;
    for (i, (_, t)) in tensors.iter().enumerate() {
        let bytes = t.data_len();
        if size > 0 && size + bytes > max_shard_bytes {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes;
        if let Some(s) = shards.last_mut() {
            s.push(i);
        }
    }
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let n = shards.len();
    let mut written = Vec::new();
    let mut weight_map = BTreeMap::new();
    for (s, members) in shards.iter().enumerate() {
        let file = if n == 1 { "model.safetensors".to_string() } else { shard_name(s, n) };
        let path = tmp.join(&file);
        let views = members.iter().map(|&i| (tensors[i].0.as_str(), &tensors[i].1));
        safetensors::tensor::serialize_to_file(views, Some(meta.clone()), &path)
            .map_err(|e| NetworkError::InvalidInput(format!("{}: {e}", path.display())))?;
        for &i in members {
            weight_map.insert(tensors[i].0.clone(), file.clone());
        }
        written.push(file);
    }
    let write_json = |name: &str, v: &Value| -> Result<()> {
        let text = serde_json::to_string_pretty(v).map_err(|e| NetworkError::InvalidInput(e.to_string()))?;
        crate::io::files::write_atomic(&tmp.join(name), format!("{text}\n").as_bytes())
    };
    if n > 1 {
        let total: usize = tensors.iter().map(|(_, t)| t.data_len()).sum();
        write_json(
            "model.safetensors.index.json",
            &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
        )?;
        written.push("model.safetensors.index.json".into());
    }
    let config = config_for(c, family, origin);
    // The loaded directory's settings as they were (its end ids may be more than
    // config.json's, as an instruct model's are); else the ids config.json has.
    let mut generation = origin.and_then(|o| o.generation.clone()).unwrap_or_default();
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        if let Some(id) = config.get(key).filter(|x| !x.is_null()) {
            generation.entry(key.to_string()).or_insert_with(|| id.clone());
        }
    }
    write_json("generation_config.json", &Value::Object(generation))?;
    written.push("generation_config.json".into());
    // config.json last: a reader that finds it finds the weights it describes.
    write_json("config.json", &config)?;
    // safetensors stages its file with owner-only permissions (0600) and keeps them; give the
    // weights the permissions a file created here gets (the umask's), as the JSON files have,
    // so a directory saved for others to read is readable by them.
    let config_path = tmp.join("config.json");
    let permissions =
        std::fs::metadata(&config_path).map_err(|e| NetworkError::io(&config_path, e))?.permissions();
    for file in written.iter().filter(|f| f.ends_with(".safetensors")) {
        let path = tmp.join(file);
        std::fs::set_permissions(&path, permissions.clone()).map_err(|e| NetworkError::io(&path, e))?;
    }
    written.push("config.json".into());
    Ok(written)
}

/// Writes `model` into `dir` as a Hugging Face directory. A new directory is built beside
/// it and renamed into place; into an existing one (which may hold a tokenizer) each file
/// is moved in whole, `config.json` last, and the shards of an earlier save that the new
/// index does not name are removed.
pub(crate) fn save(
    model: &TransformerModel<CpuBackend>, origin: Option<&Origin>, dir: &Path, max_shard_bytes: usize,
) -> Result<()> {
    if max_shard_bytes == 0 {
        return Err(NetworkError::InvalidInput("save_pretrained: max_shard_bytes must be at least 1".into()));
    }
    let name = dir
        .file_name()
        .ok_or_else(|| NetworkError::InvalidInput(format!("{} is not a directory path", dir.display())))?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = crate::io::files::temporary(&parent, &name.to_string_lossy());
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| NetworkError::io(&tmp, e))?;
    let result = (|| -> Result<()> {
        let written = write_files(model, origin, &tmp, max_shard_bytes)?;
        if !dir.exists() {
            return std::fs::rename(&tmp, dir).map_err(|e| NetworkError::io(dir, e));
        }
        if !dir.is_dir() {
            return Err(NetworkError::InvalidInput(format!(
                "{} exists and is not a directory",
                dir.display()
            )));
        }
        // Weights first, so the old config.json never describes a half-written set.
        for file in &written {
            std::fs::rename(tmp.join(file), dir.join(file))
                .map_err(|e| NetworkError::io(dir.join(file), e))?;
        }
        let stale = |f: &str| {
            (f == "model.safetensors"
                || f == "model.safetensors.index.json"
                || (f.starts_with("model-") && f.ends_with(".safetensors")))
                && !written.iter().any(|w| w == f)
        };
        for entry in std::fs::read_dir(dir).map_err(|e| NetworkError::io(dir, e))?.flatten() {
            if let Some(f) = entry.file_name().to_str() {
                if stale(f) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}
