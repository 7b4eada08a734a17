//! OpenAI's request and error shapes: a request body read into what the decoding thread
//! needs, every field checked with an error that names it.

use rusting_brain::{ChatMessage, Sampler};
use serde_json::{json, Map, Value};

/// An error as OpenAI's clients read it: `{"error": {"message", "type", "param", "code"}}`
/// with its HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, where there is one.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }
    /// An error without a field.
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }
    /// With a code.
    pub fn code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }
    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`: messages through the chat template.
    Chat,
    /// `/v1/completions`: a prompt as it is.
    Completion,
}

/// A request, read and checked.
#[derive(Debug)]
pub struct Request {
    /// The model the client named (echoed back).
    pub model: String,
    /// The chat's messages (chat requests).
    pub messages: Vec<ChatMessage>,
    /// The prompt (completion requests).
    pub prompt: String,
    /// The most tokens to draw (`max_completion_tokens`, or `max_tokens`).
    pub max_tokens: Option<usize>,
    /// How tokens are drawn.
    pub sampler: Sampler,
    /// Strings that end the reply.
    pub stops: Vec<String>,
    /// Server-sent events instead of one response.
    pub stream: bool,
    /// A last chunk with the token counts (`stream_options.include_usage`).
    pub include_usage: bool,
}

fn number(o: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(ApiError::invalid(key, format!("`{key}` must be a number"))),
    }
}

fn count(o: &Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) => Ok(Some(v)),
            None => Err(ApiError::invalid(key, format!("`{key}` must be a whole number of at least 0"))),
        },
        Some(_) => Err(ApiError::invalid(key, format!("`{key}` must be an integer"))),
    }
}

fn flag(o: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(key, format!("`{key}` must be true or false"))),
    }
}

fn in_range(key: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => {
            Err(ApiError::invalid(key, format!("`{key}` must be between {lo} and {hi}, got {x}")))
        }
        v => Ok(v),
    }
}

/// A message's text: a string, or an array of `{type: "text", text}` parts joined.
fn content(v: Option<&Value>, i: usize) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Null) | None => Ok(String::new()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some(other), _) if other != "text" => {
                        return Err(ApiError::invalid(
                            &param,
                            format!(
                                "content parts of type `{other}` are not supported; this model reads text"
                            ),
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &param,
                            "a content part must be {\"type\": \"text\", \"text\": \"...\"}",
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => {
            Err(ApiError::invalid(&param, format!("`{param}` must be a string or an array of text parts")))
        }
    }
}

/// Reads a request body for `kind`.
pub fn parse(body: &[u8], kind: Kind) -> Result<Request, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(400, "invalid_request_error", format!("the body is not valid JSON: {e}"))
    })?;
    let Value::Object(o) = v else {
        return Err(ApiError::new(400, "invalid_request_error", "the body must be a JSON object"));
    };
    let model = match o.get("model") {
        Some(Value::String(s)) => s.clone(),
        None => return Err(ApiError::invalid("model", "`model` is required")),
        Some(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
    };
    let (mut messages, mut prompt) = (Vec::new(), String::new());
    match kind {
        Kind::Chat => {
            let Some(list) = o.get("messages") else {
                return Err(ApiError::invalid("messages", "`messages` is required"));
            };
            let Value::Array(list) = list else {
                return Err(ApiError::invalid("messages", "`messages` must be an array"));
            };
            if list.is_empty() {
                return Err(ApiError::invalid("messages", "`messages` must hold at least one message"));
            }
            for (i, m) in list.iter().enumerate() {
                let Some(m) = m.as_object() else {
                    return Err(ApiError::invalid(&format!("messages[{i}]"), "a message must be an object"));
                };
                let role = match m.get("role") {
                    Some(Value::String(r))
                        if ["system", "developer", "user", "assistant", "tool"].contains(&r.as_str()) =>
                    {
                        // `developer` is the newer name of `system`; templates know `system`.
                        if r == "developer" {
                            "system".to_string()
                        } else {
                            r.clone()
                        }
                    }
                    Some(Value::String(r)) => {
                        return Err(ApiError::invalid(
                            &format!("messages[{i}].role"),
                            format!("unknown role `{r}`"),
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("messages[{i}].role"),
                            "`role` must be a string",
                        ))
                    }
                };
                messages.push(ChatMessage::new(role, content(m.get("content"), i)?));
            }
        }
        Kind::Completion => match o.get("prompt") {
            Some(Value::String(s)) => prompt = s.clone(),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                prompt = a[0].as_str().unwrap_or("").to_string()
            }
            Some(Value::Array(_)) => {
                return Err(ApiError::invalid("prompt", "one prompt a request: `prompt` must be a string"))
            }
            None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
            Some(_) => return Err(ApiError::invalid("prompt", "`prompt` must be a string")),
        },
    }
    if let Some(n) = count(&o, "n")? {
        if n != 1 {
            return Err(ApiError::invalid("n", format!("one choice a request: `n` must be 1, got {n}")));
        }
    }
    let max_tokens = match (count(&o, "max_completion_tokens")?, count(&o, "max_tokens")?) {
        (Some(m), _) | (None, Some(m)) => {
            if m == 0 {
                let key = if o.contains_key("max_completion_tokens") {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                };
                return Err(ApiError::invalid(key, format!("`{key}` must be at least 1")));
            }
            Some(m.min(usize::MAX as u64) as usize)
        }
        (None, None) => None,
    };
    let temperature = in_range("temperature", number(&o, "temperature")?, 0.0, 2.0)?;
    let top_p = in_range("top_p", number(&o, "top_p")?, 0.0, 1.0)?;
    let top_k = count(&o, "top_k")?;
    let seed = match o.get("seed") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(s), _) => Some(s),
            (None, Some(s)) => Some(s as u64),
            _ => return Err(ApiError::invalid("seed", "`seed` must be an integer")),
        },
        Some(_) => return Err(ApiError::invalid("seed", "`seed` must be an integer")),
    };
    for key in ["frequency_penalty", "presence_penalty"] {
        if let Some(p) = in_range(key, number(&o, key)?, -2.0, 2.0)? {
            if p != 0.0 {
                return Err(ApiError::invalid(
                    key,
                    format!("`{key}` is not supported; use `repetition_penalty` (the sampler's, 1 is off)"),
                ));
            }
        }
    }
    let repetition = in_range("repetition_penalty", number(&o, "repetition_penalty")?, 0.0, 10.0)?;
    let stops = match o.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 && a.iter().all(Value::is_string) => {
            a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()
        }
        Some(_) => {
            return Err(ApiError::invalid("stop", "`stop` must be a string or an array of at most 4 strings"))
        }
    };
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop string must not be empty"));
    }
    let stream = flag(&o, "stream")?;
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) if stream => flag(so, "include_usage").map_err(|mut e| {
            e.param = Some("stream_options.include_usage".into());
            e
        })?,
        Some(Value::Object(_)) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` is only allowed with `stream: true`",
            ))
        }
        Some(_) => return Err(ApiError::invalid("stream_options", "`stream_options` must be an object")),
    };
    // Temperature 0 (or none given) is greedy; otherwise the seeded sampler.
    let mut sampler = match temperature {
        Some(t) if t > 0.0 => Sampler::temperature(t as f32, seed),
        _ => Sampler::greedy(),
    };
    if let Some(k) = top_k {
        if k > 0 {
            sampler = sampler.top_k(k as usize);
        }
    }
    if let Some(p) = top_p {
        if p <= 0.0 {
            return Err(ApiError::invalid("top_p", "`top_p` must be above 0"));
        }
        sampler = sampler.top_p(p as f32);
    }
    if let Some(r) = repetition {
        sampler = sampler.repetition_penalty(r as f32);
    }
    sampler.validate().map_err(|e| ApiError::new(400, "invalid_request_error", e.to_string()))?;
    Ok(Request { model, messages, prompt, max_tokens, sampler, stops, stream, include_usage })
}

/// The most pixels a picture may have (2048 x 2048): a larger request is refused before
/// any memory is taken for it.
pub const MAX_IMAGE_PIXELS: usize = 2048 * 2048;

/// An image request (`/v1/images/generations`), read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageRequest {
    /// The model the client named, if it named one.
    pub model: Option<String>,
    /// What to paint.
    pub prompt: String,
    /// `(width, height)` from `size` (`"512x512"`); `None` for the pipeline's own.
    pub size: Option<(usize, usize)>,
    /// The starting noise's seed (an extension of OpenAI's API); `None` draws one.
    pub seed: Option<u64>,
}

/// Reads an image request body: `prompt`, `size`, `n` (1), `response_format`
/// (`b64_json`), `output_format` (`png`), `seed`.
pub fn parse_image(body: &[u8]) -> Result<ImageRequest, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(400, "invalid_request_error", format!("the body is not valid JSON: {e}"))
    })?;
    let Value::Object(o) = v else {
        return Err(ApiError::new(400, "invalid_request_error", "the body must be a JSON object"));
    };
    let model = match o.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
    };
    let prompt = match o.get("prompt") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) => return Err(ApiError::invalid("prompt", "the prompt is empty")),
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(_) => return Err(ApiError::invalid("prompt", "`prompt` must be a string")),
    };
    if let Some(n) = count(&o, "n")? {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("`n` is {n}; this server paints one picture a request"),
            ));
        }
    }
    let size = match o.get("size") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "auto" => None,
        Some(Value::String(s)) => {
            let parsed = s
                .split_once('x')
                .and_then(|(w, h)| Some((w.parse::<usize>().ok()?, h.parse::<usize>().ok()?)));
            match parsed {
                Some((w, h)) if w > 0 && h > 0 && w.saturating_mul(h) <= MAX_IMAGE_PIXELS => Some((w, h)),
                Some((w, h)) if w > 0 && h > 0 => {
                    return Err(ApiError::invalid(
                        "size",
                        format!("{w}x{h} is over this server's {MAX_IMAGE_PIXELS} pixels"),
                    ))
                }
                _ => {
                    return Err(ApiError::invalid(
                        "size",
                        format!("`size` `{s}` is not WIDTHxHEIGHT (`512x512`) or `auto`"),
                    ))
                }
            }
        }
        Some(_) => return Err(ApiError::invalid("size", "`size` must be a string such as `512x512`")),
    };
    only(&o, "response_format", "b64_json", "this server returns the picture itself")?;
    only(&o, "output_format", "png", "this server writes PNG")?;
    let seed = count(&o, "seed")?;
    Ok(ImageRequest { model, prompt, size, seed })
}

/// `key` absent, null or `value`, the one choice this server has (`why` says so).
fn only(o: &Map<String, Value>, key: &str, value: &str, why: &str) -> Result<(), ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(v)) if v == value => Ok(()),
        Some(v) => Err(ApiError::invalid(key, format!("`{key}` is {v}; {why}: `{value}`"))),
    }
}

/// `bytes` in standard base64 with padding (RFC 4648), as `b64_json` carries a picture.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4648's test vectors.
    #[test]
    fn base64_is_rfc_4648() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded, "{plain}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn image_requests_are_read_and_checked() {
        let r = parse_image(br#"{"prompt": "a red square", "size": "64x32", "seed": 7, "n": 1}"#).unwrap();
        assert_eq!(
            r,
            ImageRequest { model: None, prompt: "a red square".into(), size: Some((64, 32)), seed: Some(7) }
        );
        for (body, param) in [
            (&br#"{"size": "64x64"}"#[..], "prompt"),
            (br#"{"prompt": "  "}"#, "prompt"),
            (br#"{"prompt": "x", "n": 2}"#, "n"),
            (br#"{"prompt": "x", "size": "64"}"#, "size"),
            (br#"{"prompt": "x", "size": "0x64"}"#, "size"),
            (br#"{"prompt": "x", "size": "99999x99999"}"#, "size"),
            (br#"{"prompt": "x", "response_format": "url"}"#, "response_format"),
            (br#"{"prompt": "x", "output_format": "jpeg"}"#, "output_format"),
            (br#"{"prompt": "x", "seed": -1}"#, "seed"),
            (br#"{"prompt": 3}"#, "prompt"),
        ] {
            let e = parse_image(body).unwrap_err();
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some(param)),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
