//! An OpenAI-compatible HTTP server for a rusting_brain language model: `GET /v1/models`,
//! `POST /v1/chat/completions` (the messages through the model's chat template) and
//! `POST /v1/completions`, each streamed as server-sent events when asked, and
//! `POST /v1/images/generations` over a text-to-image pipeline, with OpenAI's JSON errors. Every active request decodes in one batched step (`engine`); a request's
//! tokens do not depend on what else shares its steps.

pub mod api;
#[cfg(feature = "http")]
pub mod engine;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
pub mod images;
#[cfg(feature = "http")]
pub mod queue;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A bad command-line argument; the message names it.
    #[error("{0}")]
    Usage(String),
    /// The model, its tokenizer or its chat files could not be read.
    #[error("loading the model: {0}")]
    Model(String),
    /// The address could not be bound or served.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
