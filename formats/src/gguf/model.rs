//! A language model's GGUF file as the Hugging Face folder it would be: llama.cpp's
//! metadata as a `config.json` (so one parser, [`crate::hf`], checks both), and its tensors
//! found by our names (transformers') under llama.cpp's. Architectures `llama` (Llama,
//! Mistral, SmolLM; Mixtral when it has experts), `qwen2` (q/k/v biases), `qwen3` (per-head
//! q/k norms) and `qwen3moe`. llama.cpp stacks a block's experts into one
//! `[experts, rows, cols]` tensor per projection; each expert is read as its own slab.

use std::collections::HashSet;

use rusting_brain_core::models::transformer::{QuantFormat, TransformerConfig};
use serde_json::{json, Map, Value};

use super::blocks::GgmlType;
use super::{Gguf, Meta};
use crate::hf::{self, Family};
use crate::{FormatError, Result};

/// The architectures read, each with the Hugging Face class it is loaded as.
/// `llama` with experts is Mixtral.
const ARCHITECTURES: [(&str, &str); 4] = [
    ("llama", "LlamaForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "Qwen3ForCausalLM"),
    ("qwen3moe", "Qwen3MoeForCausalLM"),
];

/// What the file holds, as a Hugging Face folder of the model would say it: the family,
/// the model's configuration and the `config.json` it was read from. Every tensor in the
/// file must be one the configuration has.
pub fn describe<D: AsRef<[u8]>>(file: &Gguf<D>) -> Result<(Family, TransformerConfig, Map<String, Value>)> {
    let config = config_json(file)?;
    // Each block has at least nine tensors (two norms, four attention projections, three
    // feed-forward ones, stacked or not): a block count the file cannot hold is refused
    // before the layout of that many blocks is built (a fuzzed count of millions would take
    // gigabytes).
    let blocks = config.get("num_hidden_layers").and_then(Value::as_u64).unwrap_or(0);
    if blocks.saturating_mul(9) > file.tensors.len() as u64 {
        let arch = config.get("model_type").and_then(Value::as_str).unwrap_or("llama");
        return Err(FormatError::new(
            format!("{arch}.block_count"),
            format!(
                "{blocks} blocks need at least {} tensors; the file has {}",
                blocks.saturating_mul(9),
                file.tensors.len()
            ),
        ));
    }
    let (family, parsed) = hf::parse_config(&config)?;
    let layout = parsed.layout();
    let wanted: HashSet<String> =
        layout.as_ref().into_named().into_iter().map(|(n, _)| gguf_name(&n)).collect();
    if let Some(extra) = file.tensors.iter().find(|t| !wanted.contains(&t.name)) {
        let why = if extra.name == "rope_freqs.weight" {
            "per-frequency RoPE factors (Llama 3's scaling as llama.cpp stores it) are not read yet"
        } else {
            "this tensor is not part of the model the metadata describes; the model definition has no place for it"
        };
        return Err(FormatError::new(&extra.name, why));
    }
    Ok((family, parsed, config.as_object().cloned().unwrap_or_default()))
}

/// Our tensor `name` of shape `shape` (transformers' name and layout) from the file, in f32:
/// found under llama.cpp's name (one expert's slab of a stacked tensor), its shape checked,
/// and for `llama` files the query and key rows put back in transformers' order.
pub fn read_tensor<D: AsRef<[u8]>>(
    file: &Gguf<D>, config: &TransformerConfig, name: &str, shape: &[usize],
) -> Result<Vec<f32>> {
    let (g, _, expert) = place(file, config, name, shape)?;
    let experts = config.moe.as_ref().map_or(0, |m| m.n_experts);
    let w = match expert {
        Some(j) => file.read_f32_part(&g, j, experts)?,
        None => file.read_f32(&g)?,
    };
    Ok(transformers_rows(file, config, name, shape, w, shape[1..].iter().product()))
}

/// How our matrix `name` comes out of a file for a model loaded at a quantized format.
pub enum QuantRead {
    /// The file's blocks in our layout, exactly (packed values, scales).
    Exact(Vec<f32>, Vec<f32>),
    /// Stored in a type no layout of ours holds exactly: decode it ([`read_tensor`]) and
    /// round it to this format.
    Round(QuantFormat),
}

/// Our matrix `name` of shape `shape` at `format` (the one core's `format_of` picks for
/// it): the file's blocks as they are where our layout holds them exactly (Q4_0, Q4_1 and
/// Q4_K at 4 bits; Q8_0, Q4_0 and Q5_0 in int8: [`GgmlType::to_q4`],
/// [`GgmlType::to_int8`]), else what to round the decoded values to. At 4 bits, in a file
/// that holds 4-bit matrices (a Q4_0, Q4_1 or Q4_K_M file), the matrices it keeps wider
/// (Q5_0, Q6_K, Q8_0: llama.cpp's Q4_K_M gives them to the matrices that matter most, and
/// Q5_0 where rows are not whole 256-value super-blocks) are held in int8: rounding them to
/// 4 bits would undo what the file paid for (SmolLM2's Q4_K_M file: KL to llama.cpp's
/// reading 0.0060 with its Q8_0 `attn_v` rounded to 4 bits). A file with no 4-bit matrix
/// (Q8_0, F16, F32) is rounded to 4 bits, which is what asking for 4 bits of it means.
pub fn read_quant<D: AsRef<[u8]>>(
    file: &Gguf<D>, config: &TransformerConfig, name: &str, shape: &[usize], format: QuantFormat,
) -> Result<QuantRead> {
    use GgmlType::*;
    let (_, kind, _) = place(file, config, name, shape)?;
    let four_bit = |k: GgmlType| matches!(k, Q4_0 | Q4_1 | Q4K);
    let held = match format {
        QuantFormat::Q4 if !four_bit(kind) && file.tensors.iter().any(|t| four_bit(t.kind)) => {
            QuantFormat::Q8
        }
        f => f,
    };
    let (rows, cols) = (shape[0], shape[1..].iter().product::<usize>());
    let bytes = stored_bytes(file, config, name)?;
    let exact = match held {
        QuantFormat::Q4 => kind.to_q4(bytes, rows, cols),
        QuantFormat::Q8 => kind.to_int8(bytes, rows, cols),
        // No GGUF type holds one scale a row: decoded and rounded.
        QuantFormat::Q8Rows => None,
    };
    Ok(match exact {
        Some((packed, scales)) => {
            let (pc, rs) = (packed.len() / rows.max(1), scales.len() / rows.max(1));
            QuantRead::Exact(
                transformers_rows(file, config, name, shape, packed, pc),
                transformers_rows(file, config, name, shape, scales, rs),
            )
        }
        None => QuantRead::Round(held),
    })
}

/// Where our tensor `name` lives: llama.cpp's name, its stored type and the expert slab,
/// the stored shape checked against `shape` (with the experts in front for a slab).
fn place<D: AsRef<[u8]>>(
    file: &Gguf<D>, config: &TransformerConfig, name: &str, shape: &[usize],
) -> Result<(String, GgmlType, Option<usize>)> {
    let experts = config.moe.as_ref().map_or(0, |m| m.n_experts);
    let (g, expert) = gguf_place(name);
    let t = file
        .tensor(&g)
        .ok_or_else(|| FormatError::new(&g, format!("missing: the model needs it ({name})")))?;
    let want: Vec<usize> = match expert {
        Some(_) => std::iter::once(experts).chain(shape.iter().copied()).collect(),
        None => shape.to_vec(),
    };
    if t.shape() != want {
        return Err(FormatError::new(
            &g,
            format!("shape {:?}, where the metadata makes it {want:?}", t.shape()),
        ));
    }
    Ok((g, t.kind, expert))
}

/// Rows of `width` values (f32 values, or a quantized layout's slots or scales) of our
/// tensor `name` in transformers' order: llama.cpp's converter interleaves each head's
/// rotary halves of the query and key rows for Llama-family models (its RoPE turns
/// adjacent pairs); the model here, as transformers, turns the halves.
fn transformers_rows<D: AsRef<[u8]>>(
    file: &Gguf<D>, config: &TransformerConfig, name: &str, shape: &[usize], rows: Vec<f32>, width: usize,
) -> Vec<f32> {
    let permuted = file.get("general.architecture").and_then(Meta::as_str) == Some("llama");
    debug_assert_eq!(rows.len(), shape[0] * width);
    match rotary_heads(name, config.q_heads, config.kv_heads).filter(|_| permuted) {
        Some(heads) => rotary_rows(&rows, heads, width, false),
        None => rows,
    }
}

/// The stored bytes that hold our tensor `name`: the whole tensor, or one expert's slab.
pub fn stored_bytes<'a, D: AsRef<[u8]>>(
    file: &'a Gguf<D>, config: &TransformerConfig, name: &str,
) -> Result<&'a [u8]> {
    let experts = config.moe.as_ref().map_or(0, |m| m.n_experts);
    match gguf_place(name) {
        (g, Some(j)) => file.part_bytes(&g, j, experts),
        (g, None) => file.part_bytes(&g, 0, 1),
    }
}

/// The `config.json` a Hugging Face folder of this model would have, from the file's
/// metadata (`{arch}.*` keys; the vocabulary from the embedding's shape, checked against
/// the tokenizer's when the file has one).
pub fn config_json<D: AsRef<[u8]>>(file: &Gguf<D>) -> Result<Value> {
    let arch = file.get("general.architecture").and_then(Meta::as_str).ok_or_else(|| {
        FormatError::new("general.architecture", "missing: the file must name its architecture")
    })?;
    let mut class = ARCHITECTURES.iter().find(|(a, _)| *a == arch).map(|(_, c)| *c).ok_or_else(|| {
        let known: Vec<&str> = ARCHITECTURES.iter().map(|(a, _)| *a).collect();
        FormatError::new(
            "general.architecture",
            format!("{arch} is not an architecture this reader maps ({})", known.join(", ")),
        )
    })?;
    let key = |k: &str| format!("{arch}.{k}");
    let count = |k: &str| -> Result<Option<u64>> {
        let k = key(k);
        match file.get(&k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| FormatError::new(&k, format!("{v:?} is not a whole number"))),
        }
    };
    let need = |k: &str| -> Result<u64> { count(k)?.ok_or_else(|| FormatError::new(key(k), "missing")) };
    let number = |k: &str| -> Result<Option<f64>> {
        let k = key(k);
        match file.get(&k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| FormatError::new(&k, format!("{v:?} is not a number"))),
        }
    };
    let experts = count("expert_count")?.unwrap_or(0);
    if experts == 0 && arch == "qwen3moe" {
        return Err(FormatError::new(key("expert_count"), "missing or 0: qwen3moe needs experts"));
    }
    let d_model = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let kv_heads = count("attention.head_count_kv")?.unwrap_or(heads);
    let head_dim = match (count("attention.key_length")?, count("attention.value_length")?) {
        (Some(k), Some(v)) if k != v => {
            return Err(FormatError::new(
                key("attention.value_length"),
                format!("{v}, where the key length is {k}"),
            ))
        }
        (Some(k), _) => k,
        (None, _) => d_model / heads.max(1),
    };
    if let Some(r) = count("rope.dimension_count")?.filter(|&r| r != head_dim) {
        return Err(FormatError::new(
            key("rope.dimension_count"),
            format!("{r}, where heads are {head_dim} wide: a partial rotation is not implemented"),
        ));
    }
    let embed = file
        .tensor("token_embd.weight")
        .ok_or_else(|| FormatError::new("token_embd.weight", "missing: the model needs its embedding"))?;
    let vocab = *embed.dims.get(1).ok_or_else(|| FormatError::new("token_embd.weight", "is not a matrix"))?;
    if let Some(tokens) = file.get("tokenizer.ggml.tokens").and_then(Meta::as_array) {
        if tokens.len() != vocab {
            return Err(FormatError::new(
                "tokenizer.ggml.tokens",
                format!("{} tokens, where the embedding has {vocab} rows", tokens.len()),
            ));
        }
    }
    let mut c = Map::new();
    let d_ff = need("feed_forward_length")?;
    c.insert("intermediate_size".into(), json!(d_ff));
    if experts > 0 {
        class = moe_keys(file, arch, experts, d_ff, &mut c)?;
    }
    let model_type = match class {
        "MixtralForCausalLM" => "mixtral",
        "Qwen3MoeForCausalLM" => "qwen3_moe",
        _ => arch,
    };
    c.insert("architectures".into(), json!([class]));
    c.insert("model_type".into(), json!(model_type));
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("hidden_size".into(), json!(d_model));
    c.insert("num_hidden_layers".into(), json!(need("block_count")?));
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    c.insert("head_dim".into(), json!(head_dim));
    c.insert("max_position_embeddings".into(), json!(need("context_length")?));
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("tie_word_embeddings".into(), json!(file.tensor("output.weight").is_none()));
    if let Some(eps) = number("attention.layer_norm_rms_epsilon")? {
        c.insert("rms_norm_eps".into(), json!(eps));
    }
    if let Some(theta) = number("rope.freq_base")? {
        c.insert("rope_theta".into(), json!(theta));
    }
    match file.get(&key("rope.scaling.type")).map(|v| (v.as_str(), v)) {
        None | Some((Some("none"), _)) => {}
        Some((Some("linear"), _)) => {
            let factor = number("rope.scaling.factor")?.ok_or_else(|| {
                FormatError::new(key("rope.scaling.factor"), "missing: linear scaling needs it")
            })?;
            c.insert("rope_scaling".into(), json!({"type": "linear", "factor": factor}));
        }
        Some((_, v)) => {
            return Err(FormatError::new(
                key("rope.scaling.type"),
                format!("{v:?}: this reader maps no RoPE scaling but none and linear"),
            ))
        }
    }
    for (k, name) in [("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")] {
        if let Some(id) = file.get(&format!("tokenizer.ggml.{k}")).and_then(Meta::as_u64) {
            c.insert(name.into(), json!(id));
        }
    }
    Ok(Value::Object(c))
}

/// The `config.json` keys of a mixture of experts (`{arch}.expert_*`), as llama.cpp runs
/// it: softmax over the router's logits, the top `expert_used_count` renormalized to sum
/// to one (llama.cpp does so for Mixtral and Qwen3-MoE alike), no shared expert; and the
/// class that computes it.
fn moe_keys<D: AsRef<[u8]>>(
    file: &Gguf<D>, arch: &str, experts: u64, d_ff: u64, c: &mut Map<String, Value>,
) -> Result<&'static str> {
    let key = |k: &str| format!("{arch}.{k}");
    let get = |k: &str| file.get(&key(k));
    // The count sizes the layout (three matrices an expert a block): it must be the one the
    // stacked tensors hold, so a fuzzed count of millions is refused before anything is built.
    let stacked = "blk.0.ffn_gate_exps.weight";
    match file.tensor(stacked).map(|t| t.dims.get(2).copied()) {
        Some(Some(n)) if n as u64 == experts => {}
        Some(held) => {
            return Err(FormatError::new(
                key("expert_count"),
                format!(
                    "{experts}, where {stacked} holds {}",
                    held.map_or("no".to_string(), |n| n.to_string())
                ),
            ))
        }
        None => return Err(FormatError::new(stacked, "missing: the experts' stacked gate projections")),
    }
    let used = get("expert_used_count")
        .and_then(Meta::as_u64)
        .filter(|&u| u > 0 && u <= experts)
        .ok_or_else(|| {
            FormatError::new(key("expert_used_count"), format!("missing, 0 or over the {experts} experts"))
        })?;
    for k in ["expert_shared_count", "expert_shared_feed_forward_length"] {
        if get(k).and_then(Meta::as_u64).is_some_and(|n| n > 0) {
            return Err(FormatError::new(
                key(k),
                "a shared expert is not read: no architecture mapped here has one",
            ));
        }
    }
    // llama.cpp's gating function 1 is softmax; 2 (sigmoid) and others route differently.
    if let Some(g) = get("expert_gating_func").filter(|g| g.as_u64() != Some(1)) {
        return Err(FormatError::new(
            key("expert_gating_func"),
            format!("{g:?}: only softmax routing (1) is read"),
        ));
    }
    if let Some(w) =
        get("expert_weights_scale").filter(|w| !matches!(w.as_f64(), Some(x) if x == 0.0 || x == 1.0))
    {
        return Err(FormatError::new(
            key("expert_weights_scale"),
            format!("{w:?}: routing weights are not scaled here"),
        ));
    }
    if get("expert_weights_norm").is_some_and(|n| matches!(n, Meta::Bool(false))) {
        return Err(FormatError::new(
            key("expert_weights_norm"),
            "false: the top-k weights are always renormalized here",
        ));
    }
    let expert_ff = match get("expert_feed_forward_length") {
        None => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            FormatError::new(key("expert_feed_forward_length"), format!("{v:?} is not a whole number"))
        })?),
    };
    c.insert("num_experts_per_tok".into(), json!(used));
    Ok(match arch {
        "llama" => {
            // Mixtral's experts are `feed_forward_length` wide.
            if let Some(f) = expert_ff.filter(|&f| f != d_ff) {
                return Err(FormatError::new(
                    key("expert_feed_forward_length"),
                    format!("{f}, where the feed-forward length is {d_ff}: Mixtral's experts are as wide"),
                ));
            }
            c.insert("num_local_experts".into(), json!(experts));
            "MixtralForCausalLM"
        }
        "qwen3moe" => {
            // llama.cpp's default when the file does not say: the dense width over the experts used.
            let f = expert_ff.unwrap_or(d_ff / used);
            c.insert("num_experts".into(), json!(experts));
            c.insert("moe_intermediate_size".into(), json!(f));
            c.insert("norm_topk_prob".into(), json!(true));
            c.insert("decoder_sparse_step".into(), json!(1));
            "Qwen3MoeForCausalLM"
        }
        _ => {
            return Err(FormatError::new(
                key("expert_count"),
                format!(
                "{arch} with experts is not an architecture this reader maps (llama as Mixtral, qwen3moe)"
            ),
            ))
        }
    })
}

/// llama.cpp's name of the tensor we call `ours` (transformers' names).
pub fn gguf_name(ours: &str) -> String {
    gguf_place(ours).0
}

/// llama.cpp's name of the tensor that holds `ours`, and for one expert's projection,
/// which expert's slab of the stacked tensor it is.
pub fn gguf_place(ours: &str) -> (String, Option<usize>) {
    if let Some((head, tail)) = ours.strip_prefix("model.layers.").and_then(|r| r.split_once(".mlp.")) {
        if tail == "gate.weight" {
            return (format!("blk.{head}.ffn_gate_inp.weight"), None);
        }
        if let Some((j, proj)) = tail.strip_prefix("experts.").and_then(|t| t.split_once('.')) {
            let part = match proj {
                "gate_proj.weight" => Some("ffn_gate_exps"),
                "up_proj.weight" => Some("ffn_up_exps"),
                "down_proj.weight" => Some("ffn_down_exps"),
                _ => None,
            };
            if let (Some(part), Ok(j)) = (part, j.parse()) {
                return (format!("blk.{head}.{part}.weight"), Some(j));
            }
        }
    }
    (dense_name(ours), None)
}

fn dense_name(ours: &str) -> String {
    match ours {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let Some(rest) = ours.strip_prefix("model.layers.") else { return ours.into() };
    let Some((layer, rest)) = rest.split_once('.') else { return ours.into() };
    let Some((module, kind)) = rest.rsplit_once('.') else { return ours.into() };
    let part = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return ours.into(),
    };
    format!("blk.{layer}.{part}.{kind}")
}

/// The heads of `name` when it is a query or key projection's weight, whose rows llama.cpp
/// interleaves for Llama-family models (see [`rotary_rows`]).
pub fn rotary_heads(name: &str, q_heads: usize, kv_heads: usize) -> Option<usize> {
    match name.strip_suffix(".weight")?.rsplit('.').next()? {
        "q_proj" => Some(q_heads),
        "k_proj" => Some(kv_heads),
        _ => None,
    }
}

/// llama.cpp's `permute` of a `(heads * head_dim, cols)` projection, or (`into_gguf`
/// false) its inverse: its row `2 i + j` of a head is transformers' row
/// `j * head_dim / 2 + i`.
pub fn rotary_rows(w: &[f32], heads: usize, cols: usize, into_gguf: bool) -> Vec<f32> {
    let rows = w.len() / cols.max(1);
    let hd = rows / heads.max(1);
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let (gguf, ours) = (h * hd + 2 * i + j, h * hd + j * (hd / 2) + i);
                let (to, from) = if into_gguf { (gguf, ours) } else { (ours, gguf) };
                out[to * cols..(to + 1) * cols].copy_from_slice(&w[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}
