//! A Hugging Face `config.json` of the decoder-only families as core's
//! [`TransformerConfig`], refusing by key whatever the model definition does not compute
//! yet rather than running something else. Native folders and GGUF files (whose metadata
//! [`crate::gguf::model`] turns into such a file) and the browser all read it here.

use rusting_brain_core::models::transformer::{MoeConfig, TransformerConfig};
use rusting_brain_core::RopeScaling;
use serde_json::Value;

use crate::json::Object;
use crate::Result;

/// The model classes this module reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Mixtral,
    Qwen3Moe,
    Qwen2Moe,
}

const FAMILIES: [(Family, &str, &str); 7] = [
    (Family::Llama, "LlamaForCausalLM", "llama"),
    (Family::Mistral, "MistralForCausalLM", "mistral"),
    (Family::Qwen2, "Qwen2ForCausalLM", "qwen2"),
    (Family::Qwen3, "Qwen3ForCausalLM", "qwen3"),
    (Family::Mixtral, "MixtralForCausalLM", "mixtral"),
    (Family::Qwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"),
    (Family::Qwen2Moe, "Qwen2MoeForCausalLM", "qwen2_moe"),
];

impl Family {
    /// The family of the class `name` (`architectures[0]` of a `config.json`).
    pub fn from_architecture(name: &str) -> Option<Family> {
        FAMILIES.iter().find(|f| f.1 == name).map(|f| f.0)
    }
    /// Its class (`LlamaForCausalLM`).
    pub fn architecture(self) -> &'static str {
        FAMILIES.iter().find(|f| f.0 == self).map_or("", |f| f.1)
    }
    /// Its `model_type` (`llama`).
    pub fn model_type(self) -> &'static str {
        FAMILIES.iter().find(|f| f.0 == self).map_or("", |f| f.2)
    }
    /// The name a tensor has in this family's files. The model's own names are Llama's
    /// for dense blocks and Qwen-MoE's for sparse ones; Mixtral spells the sparse block
    /// `block_sparse_moe` with experts `w1` (gate), `w3` (up), `w2` (down).
    pub fn file_name(self, ours: &str) -> String {
        if self != Family::Mixtral {
            return ours.to_string();
        }
        let Some((head, tail)) = ours.split_once(".mlp.") else {
            return ours.to_string();
        };
        if tail == "gate.weight" {
            return format!("{head}.block_sparse_moe.gate.weight");
        }
        if let Some((j, proj)) = tail.strip_prefix("experts.").and_then(|t| t.split_once('.')) {
            let w = match proj {
                "gate_proj.weight" => "w1.weight",
                "down_proj.weight" => "w2.weight",
                "up_proj.weight" => "w3.weight",
                _ => return ours.to_string(),
            };
            return format!("{head}.block_sparse_moe.experts.{j}.{w}");
        }
        ours.to_string()
    }
}

/// The family and the model configuration `config.json` describes.
pub fn parse_config(v: &Value) -> Result<(Family, TransformerConfig)> {
    let k = Object::view(v)?;
    let arch = k
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .ok_or_else(|| k.err("architectures", "missing: config.json must name the model class"))?;
    let family = Family::from_architecture(arch).ok_or_else(|| {
        let known: Vec<&str> = FAMILIES.iter().map(|f| f.1).collect();
        k.err(
            "architectures",
            format!("{arch} is not an architecture this build reads ({})", known.join(", ")),
        )
    })?;
    if let Some(act) = k.get("hidden_act") {
        if act.as_str() != Some("silu") {
            return Err(k.err("hidden_act", format!("{act}: the feed-forward is SwiGLU (silu) only")));
        }
    }
    let d_model = k.count("hidden_size", None)?;
    let q_heads = k.count("num_attention_heads", None)?;
    let kv_heads = k.opt_count("num_key_value_heads")?.unwrap_or(q_heads);
    if q_heads == 0 {
        return Err(k.err("num_attention_heads", "must be at least 1"));
    }
    let head_dim = k.opt_count("head_dim")?.unwrap_or(d_model / q_heads);
    let max_seq_len = k.count("max_position_embeddings", None)?;
    let norm_eps = k.opt_number("rms_norm_eps")?.unwrap_or(1e-6) as f32;

    // Rotary embeddings: transformers 4 keeps `rope_theta` at the top level and scaling in
    // `rope_scaling`; transformers 5 puts both in `rope_parameters`.
    let params = k.get("rope_parameters").and_then(Value::as_object);
    let theta = match (k.opt_number("rope_theta")?, params.and_then(|p| p.get("rope_theta"))) {
        (Some(t), _) => t,
        (None, Some(t)) => {
            t.as_f64().ok_or_else(|| k.err("rope_parameters.rope_theta", format!("{t} is not a number")))?
        }
        (None, None) => 10_000.0,
    };
    let (scaling_key, scaling) = match k.get("rope_scaling").and_then(Value::as_object) {
        Some(s) => ("rope_scaling", Some(s)),
        None => ("rope_parameters", params),
    };
    let rope_type = scaling
        .and_then(|s| s.get("rope_type").or_else(|| s.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    // A number of the scaling's, named by where it was found.
    let num = |name: &str| -> Result<f64> {
        let key = format!("{scaling_key}.{name}");
        match scaling.and_then(|s| s.get(name)) {
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| k.err(&key, format!("{v} is not a number"))),
            None => Err(k.err(&key, format!("missing: rope type `{rope_type}` needs it"))),
        }
    };
    let rope_scaling = match rope_type {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: num("factor")? as f32 },
        "llama3" => {
            let old = num("original_max_position_embeddings")?;
            if old < 1.0 || old.fract() != 0.0 {
                return Err(k.err(
                    &format!("{scaling_key}.original_max_position_embeddings"),
                    format!("{old} is not a positive whole number of positions"),
                ));
            }
            RopeScaling::Llama3 {
                factor: num("factor")? as f32,
                low_freq_factor: num("low_freq_factor")? as f32,
                high_freq_factor: num("high_freq_factor")? as f32,
                original_max_position: old as usize,
            }
        }
        other => {
            return Err(k.err(
                scaling_key,
                format!(
                    "rope type `{other}` is not supported (this build computes default, linear and llama3)"
                ),
            ))
        }
    };
    rope_scaling.check().map_err(|m| k.err(scaling_key, m))?;
    let partial = match scaling.and_then(|s| s.get("partial_rotary_factor")) {
        Some(v) => Some(v.as_f64().ok_or_else(|| {
            k.err(&format!("{scaling_key}.partial_rotary_factor"), format!("{v} is not a number"))
        })?),
        None => k.opt_number("partial_rotary_factor")?,
    };
    if let Some(p) = partial.filter(|&p| p != 1.0) {
        return Err(k.err(
            "partial_rotary_factor",
            format!("{p}: RoPE turns the whole head here; a partial rotation is not implemented"),
        ));
    }

    // Sliding-window attention: the model attends over the whole context.
    let window = k.opt_count("sliding_window")?;
    let window_on = match family {
        Family::Mistral | Family::Mixtral => window.is_some(),
        _ => k.flag("use_sliding_window", false)?,
    };
    if let (true, Some(w)) = (window_on, window) {
        if w < max_seq_len {
            return Err(k.err(
                "sliding_window",
                format!("{w} is shorter than max_position_embeddings {max_seq_len}; sliding-window attention is not implemented"),
            ));
        }
    }
    if let Some(Value::Array(types)) = k.get("layer_types") {
        if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
            return Err(k.err(
                "layer_types",
                format!("{t}: every layer attends over the whole context here; sliding-window attention is not implemented"),
            ));
        }
    }
    // Qwen2's query, key and value projections always have biases; `attention_bias`
    // (Llama, Qwen3) puts one on the output projection too, which the model does not have.
    if k.flag("attention_bias", false)? {
        return Err(k.err(
            "attention_bias",
            "true: a bias on the output projection is not part of the model definition (q/k/v biases are, as Qwen2 has them)",
        ));
    }
    if k.flag("mlp_bias", false)? {
        return Err(k.err("mlp_bias", "feed-forward biases are not part of the model definition"));
    }
    if family == Family::Qwen2Moe {
        return Err(k.err(
            "shared_expert_intermediate_size",
            "Qwen2-MoE scales its shared expert by a learned sigmoid gate (shared_expert_gate); the model's shared expert is added unweighted",
        ));
    }

    let n_layers = k.count("num_hidden_layers", None)?;
    let intermediate = k.count("intermediate_size", None)?;
    let aux_on = k.flag("output_router_logits", false)?;
    let aux_coef = k.opt_number("router_aux_loss_coef")?.unwrap_or(0.001) as f32;
    let moe = match family {
        Family::Mixtral => {
            let top_k = k.count("num_experts_per_tok", None)?;
            Some(MoeConfig {
                n_experts: k.count("num_local_experts", None)?,
                top_k,
                layers: (0..n_layers).collect(),
                shared_expert: false,
                expert_d_ff: intermediate,
                // transformers' balance loss counts each of the top_k slots of a token
                // where this one averages them, hence the factor. It also pools every
                // layer's routing into one loss where this model averages each sparse
                // layer's own: the two agree with one sparse layer and differ slightly
                // with several (the auxiliary loss only, never the logits).
                load_balance_coef: if aux_on { aux_coef * top_k as f32 } else { 0.0 },
                router_z_coef: 0.0,
                renormalize: true,
            })
        }
        Family::Qwen3Moe | Family::Qwen2Moe => {
            // transformers 5 spells it as Mixtral does.
            let n_experts = match k.opt_count("num_local_experts")? {
                Some(n) => n,
                None => k.count("num_experts", None)?,
            };
            let step = k.opt_count("decoder_sparse_step")?.unwrap_or(1).max(1);
            let dense = k.counts("mlp_only_layers", &[])?;
            let layers: Vec<usize> = (0..n_layers)
                .filter(|l| !dense.contains(l) && n_experts > 0 && (l + 1) % step == 0)
                .collect();
            let top_k = k.count("num_experts_per_tok", None)?;
            (!layers.is_empty()).then_some(MoeConfig {
                n_experts,
                top_k,
                layers,
                shared_expert: false,
                expert_d_ff: k.count("moe_intermediate_size", None)?,
                load_balance_coef: if aux_on { aux_coef * top_k as f32 } else { 0.0 },
                router_z_coef: 0.0,
                renormalize: k.flag("norm_topk_prob", false)?,
            })
        }
        _ => None,
    };
    let config = TransformerConfig {
        vocab_size: k.count("vocab_size", None)?,
        d_model,
        n_layers,
        q_heads,
        kv_heads,
        head_dim,
        d_ff: intermediate,
        max_seq_len,
        rope_theta: theta as f32,
        norm_eps,
        // Every family read here defaults to a head of its own.
        tie_embeddings: k.flag("tie_word_embeddings", false)?,
        qkv_bias: family == Family::Qwen2,
        qk_norm: matches!(family, Family::Qwen3 | Family::Qwen3Moe),
        rope_scaling,
        moe,
    };
    config.validate().map_err(|e| k.err("config", format!("describes no valid model: {e}")))?;
    Ok((family, config))
}
