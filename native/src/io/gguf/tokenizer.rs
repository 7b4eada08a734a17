//! The tokenizer a GGUF file carries (`tokenizer.ggml.*`), rebuilt as the Hugging Face
//! `tokenizer.json` the `tokenizers` crate loads, and its chat template. Byte-level BPE
//! (`tokenizer.ggml.model` `gpt2`) with the pre-tokenizer the file names
//! (`tokenizer.ggml.pre`): GPT-2's split, SmolLM's (single digits first), Llama 3's and
//! Qwen2's regular expressions, as llama.cpp's `llama-vocab.cpp` splits them.

use serde_json::{json, Map, Value};

use super::{Gguf, Meta};
use crate::Result;

/// llama.cpp's token type of a control token (`<|im_end|>`, `<|begin_of_text|>`):
/// matched whole before the text is split, never split itself.
const CONTROL: u64 = 3;
/// A user-defined token, matched whole as well.
const USER_DEFINED: u64 = 4;

/// Llama 3's split (`llama-bpe`): contractions, letters with one leading non-letter,
/// numbers of up to three digits, punctuation runs, newlines, spaces.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: Llama 3's with single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The file's tokenizer as `tokenizer.json` text.
pub(crate) fn tokenizer_json(file: &Gguf) -> Result<String> {
    let str_of = |key: &str| -> Result<&str> {
        file.get(key)
            .ok_or_else(|| file.err(key, "missing: the file carries no tokenizer"))?
            .as_str()
            .ok_or_else(|| file.err(key, "is not a string"))
    };
    let model = str_of("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(file.err(
            "tokenizer.ggml.model",
            format!("{model}: only byte-level BPE (gpt2) tokenizers are rebuilt (SentencePiece's llama is not yet)"),
        ));
    }
    let strings = |key: &str| -> Result<Vec<&str>> {
        let items = file
            .get(key)
            .ok_or_else(|| file.err(key, "missing"))?
            .as_array()
            .ok_or_else(|| file.err(key, "is not an array"))?;
        items
            .iter()
            .map(|m| m.as_str().ok_or_else(|| file.err(key, "holds a value that is not a string")))
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    let types: Vec<u64> = match file.get("tokenizer.ggml.token_type").and_then(Meta::as_array) {
        Some(t) => t
            .iter()
            .map(|m| m.as_u64().ok_or_else(|| file.err("tokenizer.ggml.token_type", "holds a non-integer")))
            .collect::<Result<_>>()?,
        None => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(file
            .err("tokenizer.ggml.token_type", format!("{} types for {} tokens", types.len(), tokens.len())));
    }
    let pre = file.get("tokenizer.ggml.pre").and_then(Meta::as_str).unwrap_or("default");
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    let pre_tokenizer = match pre {
        "default" | "gpt-2" | "gpt2" => byte_level(true),
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        "llama-bpe" | "llama3" => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]})
        }
        "qwen2" => json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]}),
        other => {
            return Err(file.err(
                "tokenizer.ggml.pre",
                format!(
                    "{other}: the pre-tokenizers rebuilt are default, gpt-2, smollm, llama-bpe and qwen2"
                ),
            ))
        }
    };
    // Llama 3's tokenizer takes a piece that is itself a token whole, before any merge
    // (`ignore_merges`), and llama.cpp does so for `llama-bpe`.
    let ignore_merges = matches!(pre, "llama-bpe" | "llama3");
    let mut vocab = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        if vocab.insert(t.to_string(), json!(i)).is_some() {
            return Err(file.err("tokenizer.ggml.tokens", format!("{t:?} is listed twice")));
        }
    }
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, &t))| t == CONTROL || t == USER_DEFINED)
        .map(|(i, (text, &t))| {
            json!({"id": i, "content": text, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": t == USER_DEFINED, "special": t == CONTROL})
        })
        .collect();
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
            "vocab": vocab, "merges": merges,
        },
    });
    Ok(json.to_string())
}

/// The file's chat template (`tokenizer.chat_template`), if it has one.
pub(crate) fn chat_template(file: &Gguf) -> Result<Option<String>> {
    match file.get("tokenizer.chat_template") {
        None => Ok(None),
        Some(Meta::Str(s)) => Ok(Some(s.clone())),
        Some(_) => Err(file.err("tokenizer.chat_template", "is not a string")),
    }
}

/// The text of token `key` (`tokenizer.ggml.eos_token_id` and the like), if the file names one.
pub(crate) fn special_text(file: &Gguf, key: &str) -> Option<String> {
    let id = usize::try_from(file.get(key)?.as_u64()?).ok()?;
    file.get("tokenizer.ggml.tokens")?.as_array()?.get(id)?.as_str().map(str::to_string)
}

/// The `tokenizer.*` keys llama.cpp reads, from a Hugging Face folder's `tokenizer.json`
/// (byte-level BPE), its end and start ids (`generation_config.json`, `config.json`) and
/// its chat template: the inverse of [`tokenizer_json`] for the pre-tokenizers it builds.
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
