//! A GGUF file (llama.cpp's format: a model with its tokenizer and chat template) read in
//! the page, through the formats crate the native loader uses: the header checked, the
//! metadata mapped to the model's configuration, each matrix decoded and rounded to int8
//! (or four bits) one at a time, so the f32 model never exists in the wasm heap.

use rusting_brain_core::models::transformer::{QuantFormat, TransformerModel};
use rusting_brain_formats::chat::Template;
use rusting_brain_formats::gguf::{model, Gguf};
use rusting_brain_formats::FormatError;
use rusting_brain_portable::PortableBackend;
use serde_json::{Map, Value};
use tokenizers::Tokenizer;

use crate::{text, WebError};

/// The context a GGUF model is given when the caller names none: a model's declared
/// context (SmolLM2's 8,192, Llama 3's 131,072) sizes a KV cache the wasm heap may not
/// hold, and a page's conversations are short.
pub const DEFAULT_CONTEXT: usize = 2048;

/// What a GGUF file gives the page.
pub struct GgufModel {
    /// Int8 or four-bit, on the portable backend (moved to WebGPU by the engine).
    pub model: TransformerModel<PortableBackend>,
    /// The file's tokenizer (`tokenizer.ggml.*`) as a `tokenizers` tokenizer.
    pub tokenizer: Tokenizer,
    /// `tokenizer.chat_template`, where the file has one.
    pub template: Option<Template>,
    /// The id that ends a reply: the file's `tokenizer.ggml.eos_token_id` (or end-of-turn).
    pub end: Option<u32>,
}

fn file_err(e: FormatError) -> WebError {
    WebError::File(e.to_string())
}

/// Reads a GGUF file: its model rounded to `format`, its context cut to `context` positions
/// (the file's own when shorter), its tokenizer and chat template.
pub fn read(bytes: &[u8], format: QuantFormat, context: usize) -> Result<GgufModel, WebError> {
    if context == 0 {
        return Err(WebError::Invalid("options.context is 0; a model needs at least one position".into()));
    }
    let file = Gguf::parse(bytes).map_err(file_err)?;
    let (_, mut config, _) = model::describe(&file).map_err(file_err)?;
    config.max_seq_len = config.max_seq_len.min(context);
    // `describe` has checked the token count against the embedding's rows.
    let tokenizer = text::tokenizer(&file.tokenizer_json().map_err(file_err)?)?;
    let template = match file.chat_template().map_err(file_err)? {
        None => None,
        Some(source) => {
            let specials: Map<String, Value> =
                file.special_texts().into_iter().map(|(k, v)| (k.to_string(), Value::String(v))).collect();
            Some(
                Template::new(source, specials, "tokenizer.chat_template".into())
                    .map_err(|m| WebError::File(format!("tokenizer.chat_template: {m}")))?,
            )
        }
    };
    let (eos, _, _) = file.special_ids().map_err(file_err)?;
    let end = eos.first().copied().or_else(|| text::END_TOKENS.iter().find_map(|t| tokenizer.token_to_id(t)));
    let read =
        |name: &str, shape: &[usize]| model::read_tensor(&file, &config, name, shape).map_err(file_err);
    let model = TransformerModel::from_tensors(
        PortableBackend,
        config.clone(),
        Some(format),
        read,
        |name: &str, shape: &[usize], format: QuantFormat| -> Result<(Vec<f32>, Vec<f32>), WebError> {
            // The file's blocks as they are where our layout holds them (a Q4_0, Q4_1 or
            // Q4_K file at "q4", a Q8_0 one at "q8"), else decoded and rounded.
            let format = match model::read_quant(&file, &config, name, shape, format).map_err(file_err)? {
                model::QuantRead::Exact(packed, scales) => return Ok((packed, scales)),
                model::QuantRead::Round(format) => format,
            };
            let w = read(name, shape)?;
            let cols: usize = shape[1..].iter().product();
            let rows = w.len() / cols.max(1);
            Ok(match format {
                QuantFormat::Q8 => rusting_brain_core::ops::q8::quantize_blocks(&w, rows, cols)?,
                QuantFormat::Q8Rows => rusting_brain_core::ops::q8::quantize_rows(&w, rows, cols)?,
                QuantFormat::Q4 => rusting_brain_core::ops::q4::quantize_q4(&w, rows, cols)?,
            })
        },
    )?;
    Ok(GgufModel { model, tokenizer, template, end })
}
