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

use std::path::Path;

use serde_json::Value;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::ReplacePattern;
use tokenizers::normalizers::{Lowercase, Replace, Sequence as Normalizers, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizers;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

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
    let bytes = crate::files::read(path)?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| NetworkError::parse(path, "json", e.to_string()))
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
            t.with_normalizer(Some(Normalizers::new(vec![
                NFC.into(),
                collapse.into(),
                Lowercase.into(),
            ])));
            let words = Split::new(
                SplitPattern::Regex(CLIP_PATTERN.into()),
                SplitDelimiterBehavior::Removed,
                true,
            )
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
        let (bos, eos) = (
            lookup("bos_token", "<|startoftext|>")?,
            lookup("eos_token", "<|endoftext|>")?,
        );
        let pad = lookup("pad_token", "<|endoftext|>")?;
        let max_length = config
            .as_ref()
            .and_then(|c| c.get("model_max_length"))
            .and_then(Value::as_u64)
            .filter(|&n| (2..=4096).contains(&n))
            .unwrap_or(77) as usize;
        Ok(ClipTokenizer {
            tokenizer,
            bos,
            eos,
            pad,
            max_length,
        })
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
