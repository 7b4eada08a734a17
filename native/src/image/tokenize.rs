//! The prompt tokenizers of the image pipelines, read from their `tokenizer*/` folders
//! through the `tokenizers` crate.
//!
//! CLIP ([`ClipTokenizer`]): `tokenizer.json` when the folder has one; otherwise (most
//! published diffusers folders) the byte-level BPE is assembled from `vocab.json` and
//! `merges.txt` the way CLIP defines it: whitespace collapsed and lowercased, words split by
//! CLIP's pattern, `</w>` closing each word, `<|startoftext|>` and `<|endoftext|>` around
//! the ids, padded to `model_max_length` (77) with the pad token `special_tokens_map.json`
//! names (`<|endoftext|>` for SD 1.x and FLUX.1, `!` for SD 2.x and SD-XL's second tower).
//! The original's optional `ftfy` repair of mojibake is not applied.
//!
//! T5 and Qwen ([`PromptTokenizer`]): `tokenizer.json` (T5's Unigram with its `</s>`,
//! Qwen's byte-level BPE with its special tokens). A T5 folder with only `spiece.model` is
//! an error that says how to convert it: the `tokenizers` crate cannot read SentencePiece's
//! protobuf. [`klein_prompt`] is FLUX.2-klein's chat template applied to a prompt.

use std::path::Path;

use serde_json::Value;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::ReplacePattern;
use tokenizers::normalizers::{Lowercase, Replace, Sequence as Normalizers, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizers;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    PaddingDirection, PaddingParams, PaddingStrategy, SplitDelimiterBehavior, Tokenizer, TruncationDirection,
    TruncationParams, TruncationStrategy,
};

use crate::{NetworkError, Result};

/// CLIP's word pattern (OpenAI's `simple_tokenizer`, as transformers' `CLIPTokenizer`).
const CLIP_PATTERN: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";

/// A CLIP tokenizer: prompts to `max_length` ids and the attention mask.
pub struct ClipTokenizer {
    tokenizer: Tokenizer,
    bos: u32,
    eos: u32,
    pad: u32,
    max_length: usize,
}

fn tok_err(path: &Path, what: &str, e: impl std::fmt::Display) -> NetworkError {
    NetworkError::parse(path, what, e.to_string())
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let bytes = crate::io::files::read(path)?;
    serde_json::from_slice(&bytes).map(Some).map_err(|e| NetworkError::parse(path, "json", e.to_string()))
}

/// A special token's text from `special_tokens_map.json` / `tokenizer_config.json`: a
/// string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl ClipTokenizer {
    /// The tokenizer in `dir` (a pipeline's `tokenizer/` or `tokenizer_2/`).
    pub fn load(dir: impl AsRef<Path>) -> Result<ClipTokenizer> {
        let dir = dir.as_ref();
        let json = dir.join("tokenizer.json");
        let tokenizer = if json.is_file() {
            Tokenizer::from_file(&json).map_err(|e| tok_err(&json, "tokenizer", e))?
        } else {
            let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
            for p in [&vocab, &merges] {
                if !p.is_file() {
                    return Err(NetworkError::InvalidInput(format!(
                        "{}: no tokenizer.json, and no {} to build CLIP's BPE from",
                        dir.display(),
                        p.file_name().and_then(|n| n.to_str()).unwrap_or("?")
                    )));
                }
            }
            let path_str = |p: &Path| {
                p.to_str()
                    .map(str::to_string)
                    .ok_or_else(|| NetworkError::InvalidInput(format!("{}: not UTF-8", p.display())))
            };
            let bpe = BPE::from_file(&path_str(&vocab)?, &path_str(&merges)?)
                .end_of_word_suffix("</w>".into())
                .unk_token("<|endoftext|>".into())
                .build()
                .map_err(|e| tok_err(&vocab, "vocab.json / merges.txt", e))?;
            let mut t = Tokenizer::new(bpe);
            let collapse = Replace::new(ReplacePattern::Regex(r"\s+".into()), " ")
                .map_err(|e| tok_err(&vocab, "normalizer", e))?;
            t.with_normalizer(Some(Normalizers::new(vec![NFC.into(), collapse.into(), Lowercase.into()])));
            let words =
                Split::new(SplitPattern::Regex(CLIP_PATTERN.into()), SplitDelimiterBehavior::Removed, true)
                    .map_err(|e| tok_err(&vocab, "pre-tokenizer", e))?;
            t.with_pre_tokenizer(Some(PreTokenizers::new(vec![
                words.into(),
                ByteLevel::new(false, true, false).into(),
            ])));
            t
        };
        let mut tokenizer = tokenizer;
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let special = read_json(&dir.join("special_tokens_map.json"))?;
        let text_of = |key: &str, default: &str| -> String {
            token_text(special.as_ref().and_then(|s| s.get(key)))
                .or_else(|| token_text(config.as_ref().and_then(|c| c.get(key))))
                .unwrap_or_else(|| default.to_string())
        };
        // The special tokens match literally wherever they appear in a prompt, as in
        // transformers: SD 2.x's pad token "!" is id 0 even inside the text.
        let specials: Vec<tokenizers::AddedToken> = [
            ("bos_token", "<|startoftext|>"),
            ("eos_token", "<|endoftext|>"),
            ("unk_token", "<|endoftext|>"),
            ("pad_token", "<|endoftext|>"),
        ]
        .iter()
        .map(|(k, d)| tokenizers::AddedToken::from(text_of(k, d), true))
        .collect();
        tokenizer.add_special_tokens(&specials);
        let lookup = |key: &str, default: &str| -> Result<u32> {
            let text = text_of(key, default);
            tokenizer.token_to_id(&text).ok_or_else(|| {
                NetworkError::InvalidInput(format!(
                    "{}: the {key} {text:?} is not in the vocabulary",
                    dir.display()
                ))
            })
        };
        let (bos, eos) = (lookup("bos_token", "<|startoftext|>")?, lookup("eos_token", "<|endoftext|>")?);
        let pad = lookup("pad_token", "<|endoftext|>")?;
        let max_length = config
            .as_ref()
            .and_then(|c| c.get("model_max_length"))
            .and_then(Value::as_u64)
            .filter(|&n| (2..=4096).contains(&n))
            .unwrap_or(77) as usize;
        Ok(ClipTokenizer { tokenizer, bos, eos, pad, max_length })
    }

    /// The ids of `prompt` between the start and end tokens, unpadded and untruncated.
    pub fn ids(&self, prompt: &str) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(prompt, false)
            .map_err(|e| NetworkError::InvalidInput(format!("tokenizing the prompt: {e}")))?;
        let mut ids = Vec::with_capacity(enc.len() + 2);
        ids.push(self.bos);
        ids.extend_from_slice(enc.get_ids());
        ids.push(self.eos);
        Ok(ids)
    }

    /// `max_length` ids (start, the prompt's tokens cut to fit, end, then padding) and the
    /// mask (`true` up to and including the end token), as CLIP pipelines call
    /// `tokenizer(prompt, padding="max_length", truncation=True)`.
    pub fn encode(&self, prompt: &str) -> Result<(Vec<u32>, Vec<bool>)> {
        let mut ids = self.ids(prompt)?;
        if ids.len() > self.max_length {
            ids.truncate(self.max_length - 1);
            ids.push(self.eos);
        }
        let real = ids.len();
        ids.resize(self.max_length, self.pad);
        let mask = (0..self.max_length).map(|i| i < real).collect();
        Ok((ids, mask))
    }

    /// The padded length (`model_max_length`, 77 for CLIP).
    pub fn max_length(&self) -> usize {
        self.max_length
    }
}

/// FLUX.2-klein's prompt as its pipeline builds it: the Qwen3 chat template for one user
/// turn with the generation prompt and thinking disabled
/// (`apply_chat_template(..., add_generation_prompt=True, enable_thinking=False)`).
pub fn klein_prompt(prompt: &str) -> String {
    format!("<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
}

/// A prompt tokenizer read from a folder's `tokenizer.json`: T5's Unigram (FLUX.1's
/// `tokenizer_2/`, SD3's `tokenizer_3/`) or a byte-level BPE (FLUX.2-klein's Qwen).
pub struct PromptTokenizer {
    tokenizer: Tokenizer,
    pad: u32,
}

impl PromptTokenizer {
    /// Reads `tokenizer.json` (and its `tokenizer_config.json` where present) from `dir`.
    pub fn load(dir: impl AsRef<Path>) -> Result<PromptTokenizer> {
        let dir = dir.as_ref();
        let json = dir.join("tokenizer.json");
        if !json.is_file() {
            let hint = if dir.join("spiece.model").is_file() {
                "; it has only spiece.model, which the tokenizers library cannot read: convert it \
                 once with transformers (`T5TokenizerFast.from_pretrained(dir).save_pretrained(dir)` \
                 writes tokenizer.json)"
            } else {
                ""
            };
            return Err(NetworkError::InvalidInput(format!("{}: no tokenizer.json{hint}", dir.display())));
        }
        let tokenizer = Tokenizer::from_file(&json).map_err(|e| tok_err(&json, "tokenizer", e))?;
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let special = read_json(&dir.join("special_tokens_map.json"))?;
        let pad_text = token_text(special.as_ref().and_then(|s| s.get("pad_token")))
            .or_else(|| token_text(config.as_ref().and_then(|c| c.get("pad_token"))))
            .ok_or_else(|| {
                NetworkError::InvalidInput(format!(
                    "{}: no pad_token in tokenizer_config.json or special_tokens_map.json",
                    dir.display()
                ))
            })?;
        let pad = tokenizer.token_to_id(&pad_text).ok_or_else(|| {
            NetworkError::InvalidInput(format!(
                "{}: the pad_token {pad_text:?} is not in the vocabulary",
                dir.display()
            ))
        })?;
        if let Some(side) = config.as_ref().and_then(|c| c.get("padding_side")).and_then(Value::as_str) {
            if side != "right" {
                return Err(NetworkError::InvalidInput(format!(
                    "{}: padding_side {side:?}; the pipelines here pad on the right",
                    dir.display()
                )));
            }
        }
        Ok(PromptTokenizer { tokenizer, pad })
    }

    /// `max_length` ids of `text` with the tokenizer's own special tokens (T5's `</s>`),
    /// cut to fit and padded on the right, and the mask (`true` for real tokens): as
    /// `tokenizer(text, padding="max_length", max_length=n, truncation=True)`.
    pub fn encode(&mut self, text: &str, max_length: usize) -> Result<(Vec<u32>, Vec<bool>)> {
        if max_length == 0 {
            return Err(NetworkError::InvalidInput("max_length must be at least 1".into()));
        }
        let pad_token = self.tokenizer.id_to_token(self.pad).unwrap_or_default();
        self.tokenizer
            .with_truncation(Some(TruncationParams {
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                direction: TruncationDirection::Right,
                stride: 0,
            }))
            .map_err(|e| NetworkError::InvalidInput(format!("truncation: {e}")))?;
        self.tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(max_length),
            direction: PaddingDirection::Right,
            pad_to_multiple_of: None,
            pad_id: self.pad,
            pad_type_id: 0,
            pad_token,
        }));
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| NetworkError::InvalidInput(format!("tokenizing the prompt: {e}")))?;
        let mask = enc.get_attention_mask().iter().map(|&m| m == 1).collect();
        Ok((enc.get_ids().to_vec(), mask))
    }
}
