//! The `tokenizer.*` keys of a GGUF file from a Hugging Face folder (its `tokenizer.json`,
//! generation settings and chat template): what `save_gguf` writes for a model that came
//! from a folder.

use serde_json::Value;

use super::Meta;
use crate::Result;
use rusting_brain_formats::gguf::tokenizer::{CONTROL, LLAMA3_SPLIT, QWEN2_SPLIT, USER_DEFINED};

/// The `tokenizer.*` keys llama.cpp reads, from a Hugging Face folder's `tokenizer.json`
/// (byte-level BPE), its end and start ids (`generation_config.json`, `config.json`) and
/// its chat template: the inverse of `Gguf::tokenizer_json` for the pre-tokenizers it builds.
pub(crate) fn from_folder(dir: &std::path::Path) -> Result<Vec<(String, Meta)>> {
    use crate::NetworkError;
    let path = dir.join("tokenizer.json");
    let v: Value = serde_json::from_slice(&crate::io::files::read(&path)?)
        .map_err(|e| NetworkError::parse(&path, "json", e.to_string()))?;
    let err = |key: &str, m: &str| NetworkError::parse(&path, key, m.to_string());
    let model = v.get("model").ok_or_else(|| err("model", "missing"))?;
    if model.get("type").and_then(Value::as_str) != Some("BPE") {
        return Err(err("model.type", "only byte-level BPE tokenizers are written to GGUF"));
    }
    let mut by_id: Vec<Option<String>> = Vec::new();
    let mut put = |id: usize, text: &str| {
        if by_id.len() <= id {
            by_id.resize(id + 1, None);
        }
        by_id[id] = Some(text.to_string());
    };
    let vocab = model.get("vocab").and_then(Value::as_object).ok_or_else(|| err("model.vocab", "missing"))?;
    for (text, id) in vocab {
        let id = id.as_u64().ok_or_else(|| err("model.vocab", "an id that is not a number"))? as usize;
        put(id, text);
    }
    let mut types = Vec::new();
    let added = v.get("added_tokens").and_then(Value::as_array).cloned().unwrap_or_default();
    for t in &added {
        let (Some(id), Some(text)) =
            (t.get("id").and_then(Value::as_u64), t.get("content").and_then(Value::as_str))
        else {
            return Err(err("added_tokens", "an entry without an id or content"));
        };
        put(id as usize, text);
        let special = t.get("special").and_then(Value::as_bool).unwrap_or(false);
        types.push((id as usize, if special { CONTROL } else { USER_DEFINED }));
    }
    let tokens: Vec<String> = by_id
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| err("model.vocab", &format!("no token has id {i}"))))
        .collect::<Result<_>>()?;
    let mut token_types = vec![1u64; tokens.len()];
    for (id, t) in types {
        token_types[id] = t;
    }
    let merges: Vec<Meta> = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| err("model.merges", "missing"))?
        .iter()
        .map(|m| match m {
            Value::String(s) => Ok(Meta::Str(s.clone())),
            Value::Array(p) => match (p.first().and_then(Value::as_str), p.get(1).and_then(Value::as_str)) {
                (Some(a), Some(b)) => Ok(Meta::Str(format!("{a} {b}"))),
                _ => Err(err("model.merges", "a pair that is not two strings")),
            },
            _ => Err(err("model.merges", "an entry that is neither \"a b\" nor [a, b]")),
        })
        .collect::<Result<_>>()?;
    let pre = pre_name(v.get("pre_tokenizer").unwrap_or(&Value::Null)).ok_or_else(|| {
        err(
            "pre_tokenizer",
            "not one of GPT-2's, SmolLM's, Llama 3's or Qwen2's splits, which llama.cpp names",
        )
    })?;
    let add_bos = v.get("post_processor").and_then(|p| p.get("type")).and_then(Value::as_str)
        == Some("TemplateProcessing");
    let mut keys = vec![
        ("tokenizer.ggml.model".to_string(), Meta::Str("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Meta::Str(pre.into())),
        ("tokenizer.ggml.tokens".to_string(), Meta::Array(tokens.into_iter().map(Meta::Str).collect())),
        (
            "tokenizer.ggml.token_type".to_string(),
            Meta::Array(token_types.into_iter().map(|t| Meta::I32(t as i32)).collect()),
        ),
        ("tokenizer.ggml.merges".to_string(), Meta::Array(merges)),
        ("tokenizer.ggml.add_bos_token".to_string(), Meta::Bool(add_bos)),
    ];
    if let Ok(gen) = crate::GenerationConfig::from_pretrained(dir) {
        if let Some(&eos) = gen.eos_token_ids.first() {
            keys.push(("tokenizer.ggml.eos_token_id".into(), Meta::U32(eos)));
        }
        if let Some(bos) = gen.bos_token_id {
            keys.push(("tokenizer.ggml.bos_token_id".into(), Meta::U32(bos)));
        }
        if let Some(pad) = gen.pad_token_id {
            keys.push(("tokenizer.ggml.padding_token_id".into(), Meta::U32(pad)));
        }
    }
    if let Ok(t) = crate::ChatTemplate::from_pretrained(dir) {
        keys.push(("tokenizer.chat_template".into(), Meta::Str(t.source().to_string())));
    }
    Ok(keys)
}

/// llama.cpp's name of a `tokenizer.json` pre-tokenizer this module builds.
fn pre_name(pre: &Value) -> Option<&'static str> {
    let byte_level = |v: &Value, regex: bool| {
        v.get("type").and_then(Value::as_str) == Some("ByteLevel")
            && v.get("use_regex").and_then(Value::as_bool).unwrap_or(true) == regex
            && !v.get("add_prefix_space").and_then(Value::as_bool).unwrap_or(false)
    };
    if byte_level(pre, true) {
        return Some("gpt-2");
    }
    let list = pre.get("pretokenizers").and_then(Value::as_array)?;
    match list.as_slice() {
        [d, b]
            if d.get("type").and_then(Value::as_str) == Some("Digits")
                && d.get("individual_digits").and_then(Value::as_bool) == Some(true)
                && byte_level(b, true) =>
        {
            Some("smollm")
        }
        [s, b] if s.get("type").and_then(Value::as_str) == Some("Split") && byte_level(b, false) => {
            match s.get("pattern").and_then(|p| p.get("Regex")).and_then(Value::as_str)? {
                LLAMA3_SPLIT => Some("llama-bpe"),
                QWEN2_SPLIT => Some("qwen2"),
                _ => None,
            }
        }
        _ => None,
    }
}
