//! What a Hugging Face directory says about talking to its model: the chat template
//! (`chat_template.jinja`, or `tokenizer_config.json`'s `chat_template`) and the generation
//! settings (`generation_config.json`: end ids, sampling defaults).
//!
//! Templates render as transformers' `apply_chat_template` renders them: Jinja with
//! `trim_blocks` and `lstrip_blocks`, loop controls, the tokenizer's special tokens
//! (`bos_token`, `eos_token`, ...), `raise_exception`, `strftime_now`, Python's string
//! and dict methods, and a `tojson` that writes what Python's `json.dumps` writes.

use std::path::{Path, PathBuf};

use rusting_brain_formats::chat::Template;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::{NetworkError, Result, Sampler};

/// One turn of a conversation, as chat templates read it (`message.role`,
/// `message['content']`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// Who speaks: "system", "user" or "assistant" (or a template's own roles).
    pub role: String,
    /// What they say.
    pub content: String,
}

impl ChatMessage {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
    /// The system prompt.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    /// What the user says.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    /// What the model said before (a reply kept in the history).
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A model's chat template with the special tokens it refers to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    template: Template,
    /// Where the template came from, for errors.
    origin: PathBuf,
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|e| NetworkError::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| NetworkError::parse(path, "json", e.to_string()))
}

/// A special token as tokenizer_config.json spells it: a string, or an AddedToken object
/// with `content`.
fn token_text(v: &Value) -> Option<&str> {
    v.as_str().or_else(|| v.get("content").and_then(Value::as_str))
}

impl ChatTemplate {
    /// The template in `dir`: `chat_template.jinja` (transformers 5's file), else
    /// `chat_template.json`'s or `tokenizer_config.json`'s `chat_template` (a string, or a
    /// list of named templates, of which `default` is taken). Special tokens come from
    /// `tokenizer_config.json`.
    pub fn from_pretrained(dir: impl AsRef<Path>) -> Result<ChatTemplate> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() { Some(read_json(&config_path)?) } else { None };
        let mut specials = Map::new();
        if let Some(c) = &config {
            for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
                if let Some(t) = c.get(key).and_then(token_text) {
                    specials.insert(key.into(), Value::String(t.into()));
                }
            }
        }
        let jinja = dir.join("chat_template.jinja");
        let (source, origin) = if jinja.is_file() {
            let s = std::fs::read_to_string(&jinja).map_err(|e| NetworkError::io(&jinja, e))?;
            (s, jinja)
        } else {
            let json_path = dir.join("chat_template.json");
            let (holder, path) = if json_path.is_file() {
                (Some(read_json(&json_path)?), json_path)
            } else {
                (config, config_path)
            };
            let found = holder.as_ref().and_then(|h| h.get("chat_template"));
            let source = match found {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        NetworkError::parse(
                            &path,
                            "chat_template",
                            "a list of named templates without one named \"default\"",
                        )
                    })?
                    .to_string(),
                Some(other) => {
                    return Err(NetworkError::parse(
                        &path,
                        "chat_template",
                        format!("{other} is neither a template nor a list of named ones"),
                    ))
                }
                None => {
                    return Err(NetworkError::InvalidInput(format!(
                        "{}: no chat template (looked for chat_template.jinja, chat_template.json and tokenizer_config.json's chat_template); a base model continues text instead",
                        dir.display()
                    )))
                }
            };
            (source, path)
        };
        ChatTemplate::checked(source, specials, origin)
    }

    /// The chat template a GGUF file carries (`tokenizer.chat_template`), with its
    /// special tokens' texts; a file without one is an error naming the key.
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<ChatTemplate> {
        let path = path.as_ref();
        let (source, specials) = crate::io::gguf::chat_template(path)?;
        let source = source.ok_or_else(|| {
            NetworkError::parse(path, "tokenizer.chat_template", "missing: the file carries no chat template")
        })?;
        let specials = specials.into_iter().map(|(k, v)| (k.to_string(), Value::String(v))).collect();
        Self::checked(source, specials, path.to_path_buf())
    }

    /// A template from its source; a syntax error is reported here, with its line.
    pub fn new(source: impl Into<String>) -> Result<ChatTemplate> {
        Self::checked(source.into(), Map::new(), PathBuf::from("chat template"))
    }

    fn checked(source: String, specials: Map<String, Value>, origin: PathBuf) -> Result<ChatTemplate> {
        let name =
            origin.file_name().map_or_else(|| "chat template".into(), |n| n.to_string_lossy().into_owned());
        let template = Template::new(source, specials, name).map_err(|m| error(&origin, m))?;
        Ok(ChatTemplate { template, origin })
    }

    /// Sets a special token the template may name (`bos_token`, `eos_token`, ...).
    pub fn special_token(mut self, name: &str, text: &str) -> Self {
        self.template.set_special(name, text);
        self
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        self.template.source()
    }

    /// The prompt for `messages`; with `add_generation_prompt` it ends where the
    /// assistant's reply begins. A template's own refusal (`raise_exception`) is an error
    /// with its message.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &Map::new())
    }

    /// [`ChatTemplate::render`] with more variables for the template, as transformers'
    /// `apply_chat_template(..., **kwargs)` passes them (`{"enable_thinking": false}` for
    /// Qwen3, `{"date_string": "..."}` for Llama 3). They are set after the special tokens,
    /// so they may override one.
    pub fn render_with(
        &self, messages: &[ChatMessage], add_generation_prompt: bool, vars: &Map<String, Value>,
    ) -> Result<String> {
        self.template
            .render(messages, add_generation_prompt, vars, now_utc())
            .map_err(|m| error(&self.origin, m))
    }
}

/// A template's error, naming its file (a template given as a string has none to name).
fn error(origin: &Path, message: String) -> NetworkError {
    if origin.as_os_str() == "chat template" {
        return NetworkError::InvalidInput(format!("chat template: {message}"));
    }
    NetworkError::parse(origin, "chat template", message)
}

/// Seconds since the Unix epoch, UTC.
fn now_utc() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// `generation_config.json` (falling back to `config.json` for the token ids): what ends a
/// reply and how the model's authors sample it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// Ids that end a reply (`eos_token_id`, one or a list).
    pub eos_token_ids: Vec<u32>,
    /// The id a prompt starts with, where the model has one.
    pub bos_token_id: Option<u32>,
    /// The padding id, where the model has one.
    pub pad_token_id: Option<u32>,
    /// Whether the authors sample (`true`) or decode greedily.
    pub do_sample: bool,
    /// Their sampling temperature.
    pub temperature: Option<f32>,
    /// Their top-k.
    pub top_k: Option<usize>,
    /// Their top-p.
    pub top_p: Option<f32>,
    /// Their repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Their limit on new tokens.
    pub max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    /// Reads `dir`'s `generation_config.json` where there is one; ids it lacks come from
    /// `config.json`. A directory with neither file is an error.
    pub fn from_pretrained(dir: impl AsRef<Path>) -> Result<GenerationConfig> {
        let dir = dir.as_ref();
        let gen_path = dir.join("generation_config.json");
        let cfg_path = dir.join("config.json");
        let gen = if gen_path.is_file() { Some(read_json(&gen_path)?) } else { None };
        let cfg = if cfg_path.is_file() { Some(read_json(&cfg_path)?) } else { None };
        if gen.is_none() && cfg.is_none() {
            return Err(NetworkError::InvalidInput(format!(
                "{}: neither generation_config.json nor config.json is there",
                dir.display()
            )));
        }
        // The first file that has the key, with the path for errors.
        let find = |key: &str| -> Option<(&Path, &Value)> {
            [(gen_path.as_path(), gen.as_ref()), (cfg_path.as_path(), cfg.as_ref())]
                .into_iter()
                .find_map(|(p, v)| v.and_then(|v| v.get(key)).filter(|v| !v.is_null()).map(|v| (p, v)))
        };
        let id = |path: &Path, key: &str, v: &Value| -> Result<u32> {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| NetworkError::parse(path, key, format!("{v} is not a token id")))
        };
        let one_id = |key: &str| -> Result<Option<u32>> { find(key).map(|(p, v)| id(p, key, v)).transpose() };
        let eos_token_ids = match find("eos_token_id") {
            None => Vec::new(),
            Some((p, Value::Array(ids))) => {
                ids.iter().map(|v| id(p, "eos_token_id", v)).collect::<Result<_>>()?
            }
            Some((p, v)) => vec![id(p, "eos_token_id", v)?],
        };
        let sampling =
            |key: &str| -> Result<Option<f64>> {
                match gen.as_ref().and_then(|g| g.get(key)) {
                    None | Some(Value::Null) => Ok(None),
                    Some(v) => v.as_f64().filter(|x| x.is_finite() && *x >= 0.0).map(Some).ok_or_else(|| {
                        NetworkError::parse(&gen_path, key, format!("{v} is not a number >= 0"))
                    }),
                }
            };
        let do_sample = match gen.as_ref().and_then(|g| g.get("do_sample")) {
            None | Some(Value::Null) => false,
            Some(v) => v.as_bool().ok_or_else(|| {
                NetworkError::parse(&gen_path, "do_sample", format!("{v} is not true or false"))
            })?,
        };
        Ok(GenerationConfig {
            eos_token_ids,
            bos_token_id: one_id("bos_token_id")?,
            pad_token_id: one_id("pad_token_id")?,
            do_sample,
            temperature: sampling("temperature")?.map(|x| x as f32),
            // transformers reads top_k 0 as no top-k filter.
            top_k: sampling("top_k")?.map(|x| x as usize).filter(|&k| k > 0),
            top_p: sampling("top_p")?.map(|x| x as f32),
            repetition_penalty: sampling("repetition_penalty")?.map(|x| x as f32),
            max_new_tokens: sampling("max_new_tokens")?.map(|x| x as usize),
        })
    }

    /// The ids a GGUF file names (end of text, of turn and of message; start; padding),
    /// with greedy decoding: GGUF files carry no sampling settings.
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<GenerationConfig> {
        let (eos_token_ids, bos_token_id, pad_token_id) = crate::io::gguf::special_ids(path.as_ref())?;
        Ok(GenerationConfig { eos_token_ids, bos_token_id, pad_token_id, ..Default::default() })
    }

    /// Whether `id` ends a reply.
    pub fn is_end(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    /// The sampler the authors' settings describe: greedy unless `do_sample`, else
    /// temperature, top-k and top-p as given (transformers' defaults 1.0, 50 and 1.0 where
    /// absent); the repetition penalty either way.
    pub fn sampler(&self, seed: Option<u64>) -> Sampler {
        let penalty = self.repetition_penalty.unwrap_or(1.0);
        if !self.do_sample {
            return Sampler::greedy().repetition_penalty(penalty);
        }
        Sampler::temperature(self.temperature.unwrap_or(1.0), seed)
            .top_k(self.top_k.unwrap_or(50))
            .top_p(self.top_p.unwrap_or(1.0))
            .repetition_penalty(penalty)
    }
}
