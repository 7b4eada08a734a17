//! Text in and out: the tokenizer, generation options read from a JS object, and the
//! streaming of byte-level BPE tokens as text.

use js_sys::Reflect;
use rusting_brain_core::Sampler;
use tokenizers::Tokenizer;
use wasm_bindgen::JsValue;

use crate::WebError;

/// The tokens that end a reply, the first the vocabulary has: the `language_model`
/// example's `<|end|>`, ChatML's `<|im_end|>` (SmolLM2, Qwen), Llama 3's `<|eot_id|>`.
pub const END_TOKENS: [&str; 3] = ["<|end|>", "<|im_end|>", "<|eot_id|>"];

pub fn tokenizer(json: &str) -> Result<Tokenizer, WebError> {
    json.parse::<Tokenizer>()
        .map_err(|e| WebError::Tokenizer(format!("not a tokenizer.json the tokenizers library reads: {e}")))
}

pub fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, WebError> {
    Ok(tokenizer.encode(text, false).map_err(|e| WebError::Tokenizer(e.to_string()))?.get_ids().to_vec())
}

/// The text of `ids`, each checked against `vocab` (the tokenizer's size, added tokens
/// included, counted once by the caller: counting builds the whole vocabulary map).
pub fn decode(tokenizer: &Tokenizer, vocab: usize, ids: &[u32]) -> Result<String, WebError> {
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(WebError::Invalid(format!(
            "token id {id} is outside the tokenizer's vocabulary of {vocab}"
        )));
    }
    tokenizer.decode(ids, false).map_err(|e| WebError::Tokenizer(e.to_string()))
}

/// Generated ids as text, a token at a time. Byte-level BPE splits characters across
/// tokens, so a token's text is only released once its characters are complete (an
/// incomplete one decodes to U+FFFD until its last byte arrives).
///
/// Each step decodes a window of the last few ids, not the whole text: decoding everything
/// again at every token made a generation's decoding quadratic in its length (a page
/// generating thousands of tokens would spend more time there than in the model). The
/// window starts at the ids of the last released
/// piece, so a decoder's rule for the first token of a text (a stripped leading space)
/// falls on a token whose text is already out, and the new text is the window's text
/// past that piece's.
pub struct Stream<'t> {
    tokenizer: &'t Tokenizer,
    ids: Vec<u32>,
    /// The window's start: the ids of the last released piece.
    prefix: usize,
    /// The ids whose text is released: `ids[..read]`.
    read: usize,
    /// The length of `ids[prefix..read]` decoded: where a window's new text begins (kept, so
    /// a push that releases nothing decodes one window, not two).
    before: usize,
    /// The text released so far.
    text: String,
}

impl<'t> Stream<'t> {
    /// A stream that decodes with `tokenizer`, starting empty.
    pub fn new(tokenizer: &'t Tokenizer) -> Stream<'t> {
        Stream { tokenizer, ids: Vec::new(), prefix: 0, read: 0, before: 0, text: String::new() }
    }

    /// Adds `id` and returns the text it completes (often empty mid-character).
    pub fn push(&mut self, id: u32) -> String {
        self.ids.push(id);
        let Ok(window) = self.tokenizer.decode(&self.ids[self.prefix..], false) else {
            // An id the tokenizer cannot decode is left out of the text rather than
            // failing the generation (or every window after it).
            self.ids.pop();
            return String::new();
        };
        let before = self.before;
        if window.len() <= before || window.ends_with('\u{fffd}') || !window.is_char_boundary(before) {
            return String::new();
        }
        // The next window starts at this piece's ids; its released part is their text alone
        // (which a first-token rule may make differ from `piece`).
        let Ok(released) = self.tokenizer.decode(&self.ids[self.read..], false) else {
            self.ids.pop();
            return String::new();
        };
        let piece = window[before..].to_string();
        self.prefix = self.read;
        self.read = self.ids.len();
        self.before = released.len();
        self.text.push_str(&piece);
        piece
    }

    /// Everything generated, as text (an unfinished character at the end as U+FFFD).
    pub fn text(&self) -> String {
        match self.tokenizer.decode(&self.ids[self.prefix..], false) {
            Ok(window) if window.len() > self.before && window.is_char_boundary(self.before) => {
                format!("{}{}", self.text, &window[self.before..])
            }
            _ => self.text.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces, joined, are the whole decode, on text whose characters byte-level
    /// tokens split (two- to four-byte ones), with each piece whole characters.
    #[test]
    fn streamed_pieces_join_to_the_whole_decode() {
        let corpus = "fn main() { println!(\"héllo wörld\"); } // ünïcödé: 日本語のテキスト, emoji 🦀🦀, \
                      ∀x ∈ ℝ: x² ≥ 0. Rust's ownership: let s = String::from(\"ß\");\n";
        let tokenizer = crate::train_tokenizer(&corpus.repeat(20), 300).unwrap();
        for text in [
            corpus,
            "日本語 🦀 plain ascii then ünïcödé 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and  double  spaces\n\ttabs",
            " leading space, trailing space ",
        ] {
            let ids = encode(&tokenizer, text).unwrap();
            let whole = decode(&tokenizer, tokenizer.get_vocab_size(true), &ids).unwrap();
            assert_eq!(whole, text, "the tokenizer round-trips the text");
            let mut stream = Stream::new(&tokenizer);
            let mut joined = String::new();
            let mut empty = 0;
            for &id in &ids {
                let piece = stream.push(id);
                assert!(!piece.contains('\u{fffd}'), "{piece:?} holds a partial character");
                empty += piece.is_empty() as usize;
                joined.push_str(&piece);
            }
            assert_eq!(joined, whole);
            assert_eq!(stream.text(), whole);
            // Multi-byte characters were split across tokens, so some pushes waited.
            assert!(empty > 0 || text.is_ascii(), "{text:?}: no push waited for a character");
        }
        // An unfinished character at the end (one the training text never had, so its four
        // bytes are four tokens): held back from the pieces, U+FFFD in text().
        let ids = encode(&tokenizer, "ab𝔘").unwrap();
        assert!(ids.len() >= 4, "{ids:?}");
        let mut stream = Stream::new(&tokenizer);
        let mut joined = String::new();
        for &id in &ids[..ids.len() - 1] {
            joined.push_str(&stream.push(id));
        }
        assert_eq!(joined, "ab");
        assert_eq!(stream.text(), "ab\u{fffd}");
    }
}

/// `generate`'s options; every field may be absent.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// Most new tokens (`maxTokens`, default 64).
    pub max_tokens: usize,
    /// 0 is greedy; above 0, sampling from softmax(logits / temperature).
    pub temperature: f32,
    /// Keep only the k most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p.
    pub top_p: Option<f32>,
    /// Divides positive logits and multiplies negative ones of tokens already seen (1: off).
    pub repetition_penalty: f32,
    /// The sampler's seed; random when absent.
    pub seed: Option<u64>,
    /// Stop at the token that ends a reply (`END_TOKENS`: `<|end|>`, `<|im_end|>`, `<|eot_id|>`).
    pub stop_at_end: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 64,
            temperature: 0.0,
            top_k: None,
            top_p: None,
            repetition_penalty: 1.0,
            seed: None,
            stop_at_end: true,
        }
    }
}

/// `options[key]`, or None where the options or the field are absent (`undefined`, `null`).
fn field(options: &JsValue, key: &str) -> Result<Option<JsValue>, WebError> {
    if options.is_undefined() || options.is_null() {
        return Ok(None);
    }
    let v = Reflect::get(options, &key.into())
        .map_err(|_| WebError::Invalid("options must be an object".into()))?;
    Ok((!v.is_undefined() && !v.is_null()).then_some(v))
}

/// `options[key]` as a finite number, if present.
fn get_number(options: &JsValue, key: &str) -> Result<Option<f64>, WebError> {
    match field(options, key)?.map(|v| v.as_f64()) {
        None => Ok(None),
        Some(Some(x)) if x.is_finite() => Ok(Some(x)),
        Some(_) => Err(WebError::Invalid(format!("options.{key} must be a finite number"))),
    }
}

/// `options[key]` as a whole number in `0..=max`.
fn get_count(options: &JsValue, key: &str, max: f64) -> Result<Option<u64>, WebError> {
    match get_number(options, key)? {
        Some(x) if x >= 0.0 && x <= max && x.fract() == 0.0 => Ok(Some(x as u64)),
        Some(x) => {
            Err(WebError::Invalid(format!("options.{key} is {x}; it must be a whole number from 0 to {max}")))
        }
        None => Ok(None),
    }
}

pub fn get_string(options: &JsValue, key: &str) -> Result<Option<String>, WebError> {
    field(options, key)?
        .map(|v| v.as_string().ok_or_else(|| WebError::Invalid(format!("options.{key} must be a string"))))
        .transpose()
}

fn get_bool(options: &JsValue, key: &str) -> Result<Option<bool>, WebError> {
    field(options, key)?
        .map(|v| v.as_bool().ok_or_else(|| WebError::Invalid(format!("options.{key} must be true or false"))))
        .transpose()
}

impl GenerateOptions {
    /// Reads a JS options object (`maxTokens`, `temperature`, `topK`, `topP`,
    /// `repetitionPenalty`, `seed`, `stopAtEnd`), naming a field of the wrong type or range.
    pub fn from_js(options: &JsValue) -> Result<GenerateOptions, WebError> {
        if !(options.is_undefined() || options.is_null() || options.is_object()) {
            return Err(WebError::Invalid("options must be an object".into()));
        }
        let d = GenerateOptions::default();
        // 2^53 - 1: the largest integer a JS number holds exactly.
        let exact = 9007199254740991.0;
        Ok(GenerateOptions {
            max_tokens: get_count(options, "maxTokens", 1e9)?.map_or(d.max_tokens, |n| n as usize),
            temperature: get_number(options, "temperature")?.map_or(d.temperature, |t| t as f32),
            top_k: get_count(options, "topK", 1e9)?.map(|k| k as usize),
            top_p: get_number(options, "topP")?.map(|p| p as f32),
            repetition_penalty: get_number(options, "repetitionPenalty")?
                .map_or(d.repetition_penalty, |r| r as f32),
            seed: get_count(options, "seed", exact)?,
            stop_at_end: get_bool(options, "stopAtEnd")?.unwrap_or(d.stop_at_end),
        })
    }

    /// The core sampler these options describe: greedy at temperature 0, else drawn
    /// with `seed`. Checked (a negative temperature, top-p outside (0, 1], ...).
    pub fn sampler(&self, seed: u64) -> Result<Sampler, WebError> {
        // Checked here under the JS names; the core sampler's own check (below) names its
        // Rust fields.
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(WebError::Invalid(format!(
                "options.temperature is {}; it must be 0 (greedy) or more",
                self.temperature
            )));
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(WebError::Invalid(format!("options.topP is {p}; it must be in (0, 1]")));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(WebError::Invalid(format!(
                "options.repetitionPenalty is {}; it must be above 0 (1 is off)",
                self.repetition_penalty
            )));
        }
        let mut s = if self.temperature == 0.0 {
            Sampler::greedy()
        } else {
            Sampler::temperature(self.temperature, Some(seed))
        };
        if let Some(k) = self.top_k.filter(|&k| k > 0) {
            s = s.top_k(k);
        }
        if let Some(p) = self.top_p {
            s = s.top_p(p);
        }
        s = s.repetition_penalty(self.repetition_penalty);
        s.validate()?;
        Ok(s)
    }
}
