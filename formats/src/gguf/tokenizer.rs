//! The tokenizer a GGUF file carries (`tokenizer.ggml.*`), rebuilt as the Hugging Face
//! `tokenizer.json` the `tokenizers` crate loads, and its chat template. Byte-level BPE
//! (`tokenizer.ggml.model` `gpt2`) with the pre-tokenizer the file names
//! (`tokenizer.ggml.pre`): GPT-2's split, SmolLM's (single digits first), Llama 3's and
//! Qwen2's regular expressions, as llama.cpp's `llama-vocab.cpp` splits them. And
//! SentencePiece's BPE (`llama`: Llama 2, Mistral 7B, TinyLlama), as llama.cpp's SPM
//! tokenizer runs it: spaces as `▁`, one before the text and after each special token,
//! the adjacent pair whose joined piece scores highest merged first, and characters no
//! piece holds as byte tokens (`<0xE6>`).

use serde_json::{json, Map, Value};

use super::{Gguf, Meta};
use crate::FormatError;
use crate::Result;

/// llama.cpp's token type of a control token (`<|im_end|>`, `<|begin_of_text|>`):
/// matched whole before the text is split, never split itself.
pub const CONTROL: u64 = 3;
/// A user-defined token, matched whole as well.
pub const USER_DEFINED: u64 = 4;

/// Texts llama.cpp takes as control tokens whatever type the file gives them (its
/// `llama-vocab.cpp` finds end-of-turn, end-of-generation and fill-in-the-middle tokens by
/// their text and marks them control): matched whole when special tokens are parsed, left
/// as text when they are not.
pub const CONTROL_LOOKING: [&str; 57] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "<end_of_utterance>",
    "<|eom_id|>",
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<\u{ff5c}fim\u{2581}begin\u{ff5c}>",
    "<PRE>",
    "\u{2581}<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<\u{ff5c}fim\u{2581}hole\u{ff5c}>",
    "<SUF>",
    "\u{2581}<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<\u{ff5c}fim\u{2581}end\u{ff5c}>",
    "<MID>",
    "\u{2581}<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "</s>",
    "[EOS]",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "[e~[",
];

/// Whether llama.cpp treats a token of this text and stored type as control.
fn is_control(text: &str, kind: u64) -> bool {
    kind == CONTROL || CONTROL_LOOKING.contains(&text)
}

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
    if !matches!(model, "gpt2" | "llama") {
        return Err(FormatError::new(
            "tokenizer.ggml.model",
            format!(
                "{model}: the tokenizers rebuilt are byte-level BPE (gpt2) and SentencePiece's BPE (llama)"
            ),
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
    let mut vocab = Map::new();
    for (i, t) in tokens.iter().enumerate() {
        if vocab.insert(t.to_string(), json!(i)).is_some() {
            return Err(FormatError::new("tokenizer.ggml.tokens", format!("{t:?} is listed twice")));
        }
    }
    if model == "llama" {
        return sentencepiece(file, &tokens, &types, vocab);
    }
    let merges = strings("tokenizer.ggml.merges")?;
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
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (text, &t))| is_control(text, t) || t == USER_DEFINED)
        .map(|(i, (text, &t))| {
            let control = is_control(text, t);
            json!({"id": i, "content": text, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": !control, "special": control})
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

/// llama.cpp's token type of an unknown token (`<unk>`).
pub const UNKNOWN: u64 = 2;

/// A SentencePiece BPE vocabulary (`tokenizer.ggml.model` `llama`: pieces, their scores and
/// types) as `tokenizer.json`: the `tokenizers` BPE model with byte fallback over merges
/// ranked by the score of the piece each makes, which is the order llama.cpp's SPM
/// tokenizer merges in (the highest-scoring joinable pair first; at equal scores the
/// leftmost, as a merge's rank ties at its positions). The merges are every split of
/// every piece into two pieces, as transformers builds them for a GGUF file that has none
/// (its `GGUFTokenizerSkeleton`). Spaces become `▁` and one is put before the text and
/// after each special token (`tokenizer.ggml.add_space_prefix`, true unless the file
/// says otherwise: llama.cpp's rule); special and user-defined tokens are matched whole
/// on the raw text; BOS (and EOS) are added when the file says to.
fn sentencepiece<D: AsRef<[u8]>>(
    file: &Gguf<D>, tokens: &[&str], types: &[u64], vocab: Map<String, Value>,
) -> Result<String> {
    const KEY: &str = "tokenizer.ggml.scores";
    let scores: Vec<f64> = file
        .get(KEY)
        .ok_or_else(|| FormatError::new(KEY, "missing: a SentencePiece vocabulary is ranked by its scores"))?
        .as_array()
        .ok_or_else(|| FormatError::new(KEY, "is not an array"))?
        .iter()
        .map(|m| {
            m.as_f64()
                .filter(|v| v.is_finite())
                .ok_or_else(|| FormatError::new(KEY, "holds a value that is not a finite number"))
        })
        .collect::<Result<_>>()?;
    if scores.len() != tokens.len() {
        return Err(FormatError::new(KEY, format!("{} scores for {} tokens", scores.len(), tokens.len())));
    }
    let id_of = |t: &str| vocab.get(t).and_then(Value::as_u64).map(|i| i as usize);
    // Every split of a piece into two pieces; a piece's own splits best-scoring halves
    // first, then all of them by the score of the piece they make, stably.
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    for (i, piece) in tokens.iter().enumerate() {
        let mut local: Vec<(usize, usize)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| Some((id_of(&piece[..at])?, id_of(&piece[at..])?)))
            .collect();
        local.sort_by(|a, b| {
            (scores[b.0], scores[b.1])
                .partial_cmp(&(scores[a.0], scores[a.1]))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        merges.extend(local.into_iter().map(|(l, r)| (tokens[l], tokens[r], scores[i])));
    }
    merges.sort_by(|a, b| b.2.total_cmp(&a.2));
    let merges: Vec<Value> = merges.iter().map(|(l, r, _)| json!([l, r])).collect();
    let unk = types.iter().position(|&t| t == UNKNOWN).map(|i| tokens[i]);
    let added: Vec<Value> = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (text, &t))| is_control(text, t) || t == USER_DEFINED || t == UNKNOWN)
        .map(|(i, (text, &t))| {
            json!({"id": i, "content": text, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": is_control(text, t) || t == UNKNOWN})
        })
        .collect();
    let flag = |key: &str, default: bool| file.get(key).and_then(Meta::as_bool).unwrap_or(default);
    let (mut normalizers, mut decoders) = (Vec::new(), Vec::new());
    decoders.push(json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}));
    decoders.push(json!({"type": "ByteFallback"}));
    decoders.push(json!({"type": "Fuse"}));
    // The space put before the text is taken off again when decoding.
    if flag("tokenizer.ggml.add_space_prefix", true) {
        normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
    let special = |key: &str| -> Result<Option<&str>> {
        match file.get(key) {
            None => Ok(None),
            Some(m) => {
                let id = m.as_u64().ok_or_else(|| FormatError::new(key, "is not an integer"))? as usize;
                tokens.get(id).map(|t| Some(*t)).ok_or_else(|| {
                    FormatError::new(key, format!("{id} is past the vocabulary's {} tokens", tokens.len()))
                })
            }
        }
    };
    let bos = special("tokenizer.ggml.bos_token_id")?.filter(|_| flag("tokenizer.ggml.add_bos_token", true));
    let eos = special("tokenizer.ggml.eos_token_id")?.filter(|_| flag("tokenizer.ggml.add_eos_token", false));
    let piece = |t: &str| json!({"SpecialToken": {"id": t, "type_id": 0}});
    let sequence = |s: &str| json!({"Sequence": {"id": s, "type_id": 0}});
    let (mut single, mut pair, mut specials) = (Vec::new(), Vec::new(), Map::new());
    for t in [bos, eos].into_iter().flatten() {
        specials.insert(t.to_string(), json!({"id": t, "ids": [id_of(t)], "tokens": [t]}));
    }
    if let Some(b) = bos {
        single.push(piece(b));
        pair.push(piece(b));
    }
    single.push(sequence("A"));
    pair.push(sequence("A"));
    if let Some(e) = eos {
        single.push(piece(e));
        pair.push(piece(e));
    }
    if let Some(b) = bos {
        pair.push(piece(b));
    }
    pair.push(sequence("B"));
    if let Some(e) = eos {
        pair.push(piece(e));
    }
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null,
        "post_processor": {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials},
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    });
    Ok(json.to_string())
}
