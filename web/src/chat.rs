//! Chat turns through a model's chat template, in plain Rust so native tests run them: the
//! whole conversation is rendered each turn, as transformers and llama.cpp's server render
//! it, and only the ids past what the model has already read are fed. The reply the model
//! drew stays in the KV cache; where the rendering no longer starts with the ids read
//! (a template that rewrites earlier turns, a reply that tokenizes differently as text),
//! the conversation is read again from the start.

use rusting_brain_formats::chat::Template;
use serde_json::Map;
use tokenizers::Tokenizer;

use crate::{text, WebError};

/// One turn of a conversation, as chat templates read it (`message.role`,
/// `message['content']`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    /// "system", "user" or "assistant".
    pub role: String,
    /// What was said.
    pub content: String,
}

impl Message {
    /// A message from `role`.
    pub fn new(role: &str, content: impl Into<String>) -> Message {
        Message { role: role.into(), content: content.into() }
    }
}

/// What a turn feeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// The ids to feed.
    pub ids: Vec<u32>,
    /// The ids of the context kept (the rest of the rendering follows them); 0 when the
    /// conversation is read again from a fresh cache.
    pub reused: usize,
    /// The conversation with the user's message, which the reply is added to.
    pub messages: Vec<Message>,
}

/// The turn that answers `text` after `messages`, the model having read `context`:
/// `system` is the system prompt of a first turn; `now` (seconds since the Unix epoch) is
/// what the template's `strftime_now` formats.
pub fn turn(
    template: &Template, tokenizer: &Tokenizer, messages: &[Message], context: &[u32], text: String,
    system: Option<String>, now: i64,
) -> Result<Turn, WebError> {
    let mut messages = messages.to_vec();
    if messages.is_empty() {
        if let Some(system) = system {
            messages.push(Message::new("system", system));
        }
    }
    messages.push(Message::new("user", text));
    let prompt = template
        .render(&messages, true, &Map::new(), now)
        .map_err(|m| WebError::Invalid(format!("the chat template: {m}")))?;
    let ids = text::encode(tokenizer, &prompt)?;
    Ok(match ids.strip_prefix(context) {
        Some(rest) if !context.is_empty() && !rest.is_empty() => {
            Turn { ids: rest.to_vec(), reused: context.len(), messages }
        }
        _ => Turn { ids, reused: 0, messages },
    })
}
