//! The tokenizer a GGUF file carries (`tokenizer.ggml.*`), rebuilt as the Hugging Face
//! `tokenizer.json` the `tokenizers` crate loads, and its chat template. Byte-level BPE
//! (`tokenizer.ggml.model` `gpt2`) with the pre-tokenizer the file names
//! (`tokenizer.ggml.pre`): GPT-2's split, SmolLM's (single digits first), Llama 3's and
//! Qwen2's regular expressions, as llama.cpp's `llama-vocab.cpp` splits them.

use serde_json::{json, Map, Value};

use super::{Gguf, Meta};
use crate::FormatError;
use crate::Result;

/// llama.cpp's token type of a control token (`<|im_end|>`, `<|begin_of_text|>`):
/// matched whole before the text is split, never split itself.
pub const CONTROL: u64 = 3;
/// A user-defined token, matched whole as well.
pub const USER_DEFINED: u64 = 4;

/// Llama 3's split (`llama-bpe`): contractions, letters with one leading non-letter,
/// numbers of up to three digits, punctuation runs, newlines, spaces.
pub const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: Llama 3's with single digits.
pub const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The file's tokenizer as `tokenizer.json` text.
pub fn tokenizer_json<D: AsRef<[u8]>>(file: &Gguf<D>) -> Result<String> {
    let str_of = |key: &str| -> Result<&str> {
        file.get(key)
            .ok_or_else(|| FormatError::new(key, "missing: the file carries no tokenizer"))?
            .as_str()
            .ok_or_else(|| FormatError::new(key, "is not a string"))
    };
    let model = str_of("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(FormatError::new(
            "tokenizer.ggml.model",
            format!("{model}: only byte-level BPE (gpt2) tokenizers are rebuilt (SentencePiece's llama is not yet)"),
        ));
    }
    let strings = |key: &str| -> Result<Vec<&str>> {
        let items = file
            .get(key)
            .ok_or_else(|| FormatError::new(key, "missing"))?
            .as_array()
            .ok_or_else(|| FormatError::new(key, "is not an array"))?;
        items
            .iter()
            .map(|m| m.as_str().ok_or_else(|| FormatError::new(key, "holds a value that is not a string")))
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    let types: Vec<u64> = match file.get("tokenizer.ggml.token_type").and_then(Meta::as_array) {
        Some(t) => t
            .iter()
            .map(|m| {
                m.as_u64().ok_or_else(|| FormatError::new("tokenizer.ggml.token_type", "holds a non-integer"))
            })
            .collect::<Result<_>>()?,
        None => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        return Err(FormatError::new(
            "tokenizer.ggml.token_type",
            format!("{} types for {} tokens", types.len(), tokens.len()),
        ));
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
            return Err(FormatError::new(
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
            return Err(FormatError::new("tokenizer.ggml.tokens", format!("{t:?} is listed twice")));
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
