//! The files models are published in, read from bytes so the native crate (through a
//! memory map) and the browser (from a dropped file) share one reader of each:
//!
//! - [`gguf`]: llama.cpp's GGUF (the header, every size and offset checked before anything
//!   is allocated; ggml's blocks decoded and encoded; the metadata as the `config.json` and
//!   `tokenizer.json` a Hugging Face folder would have; llama.cpp's tensor names).
//! - [`hf`]: a Hugging Face `config.json` as core's `TransformerConfig`, refusing by key
//!   what the model definition does not compute.
//! - [`json`]: typed lookups in a JSON object whose errors name the key.
//! - [`chat`]: Jinja chat templates rendered as transformers renders them.
//!
//! Errors are [`FormatError`]s naming the key or tensor; the caller adds the file.

#![warn(missing_docs)]

pub mod chat;
pub mod gguf;
pub mod hf;
pub mod json;

/// What is wrong with a file: the key, tensor or part (`what`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {message}")]
pub struct FormatError {
    /// The key, tensor or part of the file (`llama.block_count`, `token_embd.weight`,
    /// `magic`).
    pub what: String,
    /// What is wrong with it, in words a user can act on.
    pub message: String,
}

impl FormatError {
    /// An error about `what`.
    pub fn new(what: impl Into<String>, message: impl Into<String>) -> FormatError {
        FormatError { what: what.into(), message: message.into() }
    }
}

/// This crate's results.
pub type Result<T> = std::result::Result<T, FormatError>;
