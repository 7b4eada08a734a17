//! The routes: `/health`, `/v1/models`, `/v1/chat/completions`, `/v1/completions`, in
//! OpenAI's shapes, streamed as server-sent events when asked.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use rusting_brain::ChatTemplate;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::api::{self, ApiError, Kind, Request};
use crate::engine::{Engine, Event, Finish, Job};
use crate::images::{ImageJob, Painter, Refused};

/// What every handler reads.
pub struct Served {
    /// The decoding thread.
    pub engine: Engine,
    /// The model's tokenizer.
    pub tokenizer: tokenizers::Tokenizer,
    /// Its chat template, where the folder has one.
    pub template: Option<ChatTemplate>,
    /// The name clients use for the model (`/v1/models`).
    pub model_id: String,
    /// The names of the adapters loaded beside it (`--lora NAME=DIR`): `"model": NAME`
    /// picks one.
    pub adapters: Vec<String>,
    /// Positions the model takes (prompt and reply).
    pub context: usize,
    /// The picture thread and the name of its pipeline, with `--image`.
    pub painter: Option<(Painter, String)>,
    /// Requests must carry `Authorization: Bearer KEY` when set.
    pub api_key: Option<String>,
    /// When the server started (Unix seconds), the model's `created`.
    pub created: u64,
    /// Requests so far, for the response ids.
    pub served: AtomicU64,
}

/// The router over `served`, refusing bodies over `max_body` bytes.
pub fn router(served: Arc<Served>, max_body: usize) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/images/generations", post(images))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(served)
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, Json(self.body())).into_response();
        if self.status == 503 {
            r.headers_mut().insert("retry-after", HeaderValue::from_static("1"));
        }
        r
    }
}

fn authorized(headers: &HeaderMap, s: &Served) -> Result<(), ApiError> {
    let Some(key) = &s.api_key else { return Ok(()) };
    let given =
        headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if g == key => Ok(()),
        Some(_) => {
            Err(ApiError::new(401, "authentication_error", "incorrect API key").code("invalid_api_key"))
        }
        None => Err(ApiError::new(
            401,
            "authentication_error",
            "missing API key: send `Authorization: Bearer KEY`",
        )
        .code("invalid_api_key")),
    }
}

/// Up, and what the decoding thread is doing: requests decoding and waiting, steps run,
/// rows decoded, steps shared by requests for different adapters, prompt positions taken
/// from earlier requests' caches.
async fn health(State(s): State<Arc<Served>>) -> Json<Value> {
    let st = s.engine.stats();
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    Json(json!({
        "status": "ok",
        "active": st.active.load(Ordering::Relaxed),
        "queued": s.engine.queued(),
        "decode_steps": n(&st.steps),
        "decoded_rows": n(&st.rows),
        "mixed_adapter_steps": n(&st.mixed_steps),
        "reused_prompt_positions": n(&st.reused_positions),
    }))
}

async fn not_found() -> ApiError {
    ApiError::new(
        404,
        "invalid_request_error",
        "no such route; this server has /v1/models, /v1/chat/completions, /v1/completions, /v1/images/generations and /health",
    )
}

async fn models(State(s): State<Arc<Served>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    authorized(&headers, &s)?;
    let entry = |id: &str, parent: Option<&str>| json!({"id": id, "object": "model", "created": s.created, "owned_by": "rusting_brain", "parent": parent});
    let mut data = vec![entry(&s.model_id, None)];
    data.extend(s.adapters.iter().map(|a| entry(a, Some(&s.model_id))));
    Ok(Json(json!({"object": "list", "data": data})))
}

async fn chat(
    State(s): State<Arc<Served>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    serve(s, headers, body, Kind::Chat).await
}

async fn completions(
    State(s): State<Arc<Served>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    serve(s, headers, body, Kind::Completion).await
}

/// A picture: the prompt through the `--image` pipeline, the PNG in `b64_json`.
async fn images(
    State(s): State<Arc<Served>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    authorized(&headers, &s)?;
    let body =
        body.map_err(|r| ApiError::new(r.status().as_u16(), "invalid_request_error", r.body_text()))?;
    let Some((painter, name)) = &s.painter else {
        return Err(ApiError::new(
            404,
            "invalid_request_error",
            "this server paints no pictures; start it with --image DIR",
        )
        .code("model_not_found"));
    };
    let req = api::parse_image(&body)?;
    if let Some(m) = req.model.as_ref().filter(|m| *m != name) {
        return Err(ApiError::new(
            404,
            "invalid_request_error",
            format!("the model `{m}` does not exist; this server paints with `{name}`"),
        )
        .code("model_not_found"));
    }
    let (width, height) = req.size.unwrap_or(painter.default_size);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job = ImageJob { prompt: req.prompt, width, height, seed: req.seed, reply: tx };
    painter.submit(job).map_err(|_| {
        ApiError::new(503, "server_error", "the picture queue is full; try again shortly").code("overloaded")
    })?;
    match rx.await {
        Ok(Ok(png)) => Ok(Json(json!({"created": now(), "data": [{"b64_json": api::base64(&png)}]}))),
        Ok(Err(Refused::Size(e))) => Err(ApiError::invalid("size", e)),
        Ok(Err(Refused::Failed(e))) => Err(ApiError::new(500, "server_error", e)),
        Err(_) => Err(ApiError::new(500, "server_error", "the picture thread stopped")),
    }
}

/// The prompt's ids for `req`: the messages through the chat template, or the prompt as
/// it is, checked against the context with the reply's room.
fn prompt_ids(s: &Served, req: &Request, kind: Kind) -> Result<(Vec<u32>, usize), ApiError> {
    let text = match kind {
        Kind::Chat => {
            let Some(t) = &s.template else {
                return Err(ApiError::invalid(
                    "messages",
                    "this model has no chat template; use /v1/completions",
                ));
            };
            t.render(&req.messages, true).map_err(|e| ApiError::invalid("messages", e.to_string()))?
        }
        Kind::Completion => req.prompt.clone(),
    };
    let ids = s
        .tokenizer
        .encode(text.as_str(), false)
        .map_err(|e| {
            ApiError::new(400, "invalid_request_error", format!("the prompt could not be tokenized: {e}"))
        })?
        .get_ids()
        .to_vec();
    let param = if kind == Kind::Chat { "messages" } else { "prompt" };
    if ids.is_empty() {
        return Err(ApiError::invalid(param, "the prompt is empty"));
    }
    let room = s.context.saturating_sub(ids.len());
    if room == 0 {
        return Err(ApiError::invalid(
            param,
            format!("the prompt is {} tokens; this model's context is {}", ids.len(), s.context),
        )
        .code("context_length_exceeded"));
    }
    let max = match req.max_tokens {
        Some(m) if m > room => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!(
                    "the prompt's {} tokens and max_tokens {m} are over this model's context of {}",
                    ids.len(),
                    s.context
                ),
            )
            .code("context_length_exceeded"))
        }
        Some(m) => m,
        None => room,
    };
    Ok((ids, max))
}

async fn serve(
    s: Arc<Served>, headers: HeaderMap, body: Result<Bytes, BytesRejection>, kind: Kind,
) -> Result<Response, ApiError> {
    authorized(&headers, &s)?;
    let body =
        body.map_err(|r| ApiError::new(r.status().as_u16(), "invalid_request_error", r.body_text()))?;
    let req = api::parse(&body, kind)?;
    // The base by its name, or an adapter loaded beside it by its own.
    let adapter = match s.adapters.iter().find(|a| **a == req.model) {
        Some(a) => Some(a.clone()),
        None if req.model == s.model_id => None,
        None => {
            let names: Vec<String> =
                std::iter::once(&s.model_id).chain(&s.adapters).map(|n| format!("`{n}`")).collect();
            return Err(ApiError::new(
                404,
                "invalid_request_error",
                format!("the model `{}` does not exist; this server has {}", req.model, names.join(", ")),
            )
            .code("model_not_found"));
        }
    };
    let (prompt, max_tokens) = prompt_ids(&s, &req, kind)?;
    let prompt_tokens = prompt.len();
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt,
        adapter,
        max_tokens,
        sampler: req.sampler.clone(),
        stops: req.stops.clone(),
        events: tx,
    };
    s.engine.submit(job).map_err(|_| {
        ApiError::new(503, "server_error", "the server's queue is full; try again shortly").code("overloaded")
    })?;
    let n = s.served.fetch_add(1, Ordering::Relaxed);
    let head = Head {
        id: match kind {
            Kind::Chat => format!("chatcmpl-{n}"),
            Kind::Completion => format!("cmpl-{n}"),
        },
        created: now(),
        model: req.model.clone(),
        kind,
        prompt_tokens,
    };
    if req.stream {
        Ok(Sse::new(events(rx, head, req.include_usage)).into_response())
    } else {
        whole(rx, head).await.map(IntoResponse::into_response)
    }
}

/// What every response and chunk of one request repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    prompt_tokens: usize,
}

impl Head {
    fn usage(&self, completion: usize) -> Value {
        json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": completion, "total_tokens": self.prompt_tokens + completion})
    }
    /// A chunk of the stream: `delta` (chat) or `text` (completions).
    fn chunk(&self, text: Option<&str>, role: bool, finish: Option<Finish>) -> Value {
        let finish = finish.map(Finish::as_str);
        match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                       "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
            }
            Kind::Completion => json!({"id": self.id, "object": "text_completion", "created": self.created,
                       "model": self.model,
                       "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}]}),
        }
    }
}

fn failed(message: String) -> ApiError {
    ApiError::new(500, "server_error", message)
}

/// The whole reply as one response.
async fn whole(mut rx: UnboundedReceiver<Event>, head: Head) -> Result<Json<Value>, ApiError> {
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done { finish, completion_tokens }) => {
                let choice = match head.kind {
                    Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                                         "logprobs": null, "finish_reason": finish.as_str()}),
                    Kind::Completion => {
                        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish.as_str()})
                    }
                };
                let object = if head.kind == Kind::Chat { "chat.completion" } else { "text_completion" };
                return Ok(Json(
                    json!({"id": head.id, "object": object, "created": head.created, "model": head.model,
                                      "choices": [choice], "usage": head.usage(completion_tokens)}),
                ));
            }
            Some(Event::Failed(m)) => return Err(failed(m)),
            None => return Err(failed("the decoding thread stopped".into())),
        }
    }
}

/// Where a stream is.
enum Phase {
    Start,
    Body,
    Usage(usize),
    Done,
    Over,
}

/// The reply as server-sent events: a first chunk with the role, one a piece of text, one
/// with the finish reason, the usage where asked, then `[DONE]`. A failure after the
/// status was sent is an `{"error": ...}` event, which OpenAI's clients raise.
fn events(
    rx: UnboundedReceiver<Event>, head: Head, include_usage: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let data = |v: Value| SseEvent::default().data(v.to_string());
    stream::unfold((rx, head, Phase::Start), move |(mut rx, head, phase)| async move {
        match phase {
            Phase::Start => {
                // The role goes in chat's first chunk only.
                let first = head.chunk(Some(""), head.kind == Kind::Chat, None);
                Some((Ok(data(first)), (rx, head, Phase::Body)))
            }
            Phase::Body => loop {
                match rx.recv().await {
                    Some(Event::Text(t)) if t.is_empty() => continue,
                    Some(Event::Text(t)) => {
                        let c = head.chunk(Some(&t), false, None);
                        return Some((Ok(data(c)), (rx, head, Phase::Body)));
                    }
                    Some(Event::Done { finish, completion_tokens }) => {
                        let c = match head.kind {
                            Kind::Chat => head.chunk(None, false, Some(finish)),
                            Kind::Completion => head.chunk(Some(""), false, Some(finish)),
                        };
                        let next = if include_usage { Phase::Usage(completion_tokens) } else { Phase::Done };
                        return Some((Ok(data(c)), (rx, head, next)));
                    }
                    Some(Event::Failed(m)) => {
                        return Some((Ok(data(failed(m).body())), (rx, head, Phase::Over)));
                    }
                    None => {
                        let e = failed("the decoding thread stopped".into());
                        return Some((Ok(data(e.body())), (rx, head, Phase::Over)));
                    }
                }
            },
            Phase::Usage(n) => {
                let object =
                    if head.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
                let c = json!({"id": head.id, "object": object, "created": head.created, "model": head.model,
                               "choices": [], "usage": head.usage(n)});
                Some((Ok(data(c)), (rx, head, Phase::Done)))
            }
            Phase::Done => Some((Ok(SseEvent::default().data("[DONE]")), (rx, head, Phase::Over))),
            Phase::Over => None,
        }
    })
}
