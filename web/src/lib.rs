//! `rusting_brain_web`: rusting_brain in the browser, the `rusting-brain` npm package.
//!
//! An int8 language model (an `.rbw` checkpoint: Q8, or F32 quantized on load, with its
//! `tokenizer.json`; or a GGUF file, llama.cpp's format, with the tokenizer and chat
//! template it carries), generating text through WebGPU compute shaders (the
//! `rusting_brain_shaders` runner, the same kernels as the native `to_gpu`) where the
//! browser has an adapter, and through the portable backend (`rusting_brain_portable`:
//! core's math in f32 with SIMD128 kernels) compiled to wasm where it has none. Both run core's model definition and core's sampler, so a seed
//! gives the same ids in a page (either device) as natively.
//!
//! JS errors are `Error`s with a message saying what to change: a bad file, an id outside
//! the vocabulary, a model too large for the device, a call on a disposed model.
//!
//! The crate's Rust side runs natively too (its tests do, on lavapipe and on the CPU path):
//! the page's dense network, on the CPU path, trained for a few epochs:
//!
//! ```
//! use rusting_brain_web::core::models::dense::{DenseConfig, DenseLayer};
//! use rusting_brain_web::core::{Activation, Loss, Optimizer};
//! use rusting_brain_web::{DenseNet, DeviceChoice, Rows};
//!
//! # rusting_brain_shaders::block_on(async {
//! let config = DenseConfig {
//!     input_size: 2,
//!     layers: vec![
//!         DenseLayer { units: 8, activation: Activation::Tanh },
//!         DenseLayer { units: 1, activation: Activation::Sigmoid },
//!     ],
//!     loss: Loss::BinaryCrossEntropy,
//! };
//! let mut net = DenseNet::new(config, Optimizer::adam(0.05), 42, DeviceChoice::Cpu).await?;
//! let (x, y) = ([0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]);
//! let data = Rows { x: &x, y: &y, rows: 4 };
//! let first = net.train_epoch(&data, &[0, 1, 2, 3], 4).await?;
//! for _ in 0..500 {
//!     net.train_epoch(&data, &[0, 1, 2, 3], 4).await?;
//! }
//! assert!(net.loss(&data).await? < first);
//! assert_eq!(net.accuracy(&data).await?, 1.0);
//! # Ok::<(), rusting_brain_web::WebError>(())
//! # }).unwrap();
//! ```

#![warn(missing_docs)]

pub mod chat;
mod engine;
pub mod gguf;
mod lm;
mod lm_js;
mod network;
mod network_js;
mod text;

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Function, Object, Reflect, Uint32Array};
use rusting_brain_core::models::transformer::{QuantFormat, TransformerConfig};
use rusting_brain_core::CoreError;
use rusting_brain_formats::chat::Template;
use rusting_brain_shaders::ShaderError;
use wasm_bindgen::prelude::*;

pub use engine::{DeviceChoice, Engine};
pub use lm::{train_tokenizer, LmTrainer, Step};
pub use network::{DenseNet, Rows};
pub use network_js::Network;
pub use rusting_brain_core as core;
pub use text::{GenerateOptions, Stream};

/// Everything a call can fail with; each becomes a JS `Error` with this message.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// A bad argument or option from the caller; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// The model would not fit in the device's (or the wasm heap's) memory.
    #[error("out of memory: {0}; use a smaller model")]
    OutOfMemory(String),
    /// A model or network file that is truncated, corrupt or of another kind.
    #[error("bad model file: {0}")]
    File(String),
    /// An error from core's checks (shapes, ids, non-finite values).
    #[error(transparent)]
    Core(CoreError),
    /// No usable WebGPU adapter, or the device failed.
    #[error("WebGPU: {0}")]
    Gpu(String),
    /// The tokenizer could not be read, trained or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A second generation on a model while one runs.
    #[error("a generation is already running on this model; wait for it or call stop()")]
    Busy,
    /// A second call on a network while one runs.
    #[error("another call (fit, predict, evaluate, accuracy) is running on this network; await it first, or call stop()")]
    NetworkBusy,
    /// A call on a network after `dispose()`.
    #[error("this network was disposed; build or load it again")]
    NetworkDisposed,
    /// A call on a model after `dispose()`.
    #[error("this model was disposed; load it again")]
    Disposed,
}

impl From<CoreError> for WebError {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::Checkpoint { location, message } => WebError::File(format!("{location}: {message}")),
            other => WebError::Core(other),
        }
    }
}

impl WebError {
    /// Whether this says the machine has no GPU adapter at all (what "auto" falls back to
    /// the CPU on, and the GPU tests skip on), rather than a device that failed.
    pub fn is_no_adapter(&self) -> bool {
        matches!(self, WebError::Gpu(m) if m.starts_with("no GPU adapter"))
    }
}

impl From<ShaderError> for WebError {
    fn from(e: ShaderError) -> Self {
        match e {
            ShaderError::Core(c) => c.into(),
            ShaderError::Invalid(m) => WebError::Invalid(m),
            other => WebError::Gpu(other.to_string()),
        }
    }
}

fn js_err(e: WebError) -> JsError {
    JsError::new(&e.to_string())
}

/// What a `Model` holds between calls. The engine is taken out for the length of a
/// generation (so a second call finds it busy instead of aliasing it).
struct State {
    engine: Option<Engine>,
    /// Shared with a running generation, which decodes while the state stays borrowable.
    tokenizer: Rc<tokenizers::Tokenizer>,
    /// The tokenizer's size with added tokens, counted once (`decode` checks ids with it).
    vocab: usize,
    /// The id that ends a reply: a GGUF file's end-of-sequence id, else the first of
    /// `text::END_TOKENS` the vocabulary has (`<|end|>` in the language_model example's,
    /// `<|im_end|>` in SmolLM2's and Qwen's, `<|eot_id|>` in Llama 3's).
    end: Option<u32>,
    /// The chat template a GGUF file carried, which `chatTurn` renders.
    template: Option<Template>,
    /// The conversation `chatTurn` has held so far, as the template reads it.
    messages: Vec<chat::Message>,
    busy: bool,
    stop: bool,
    disposed: bool,
}

/// What a generation starts from.
enum Input {
    /// Text fed as it is: from a fresh conversation (`generate`) or after the last (`chat`).
    Text { text: String, fresh: bool },
    /// The user's next message, through the chat template, with a system prompt for the
    /// first turn.
    Turn { text: String, system: Option<String> },
}

/// A transformer's shape as `info()` gives it: `{vocabSize, dModel, nLayers, maxSeqLen,
/// parameters}`.
fn shape_info(c: &TransformerConfig) -> Object {
    let o = Object::new();
    set(&o, "vocabSize", c.vocab_size as f64);
    set(&o, "dModel", c.d_model as f64);
    set(&o, "nLayers", c.n_layers as f64);
    set(&o, "maxSeqLen", c.max_seq_len as f64);
    set(&o, "parameters", c.parameter_count() as f64);
    o
}

/// A loaded language model and its conversation.
#[wasm_bindgen]
pub struct Model {
    state: Rc<RefCell<State>>,
    device: &'static str,
    reason: String,
}

/// Milliseconds from a monotonic clock where there is one (`performance.now()`).
fn now_ms() -> f64 {
    Clock::new().ms()
}

/// `performance.now`, looked up once: a generation reads the clock at every token, and
/// each lookup by name crosses into JS twice with a fresh string. `Date.now()` where there
/// is no `performance`.
struct Clock(Option<(JsValue, Function)>);

impl Clock {
    fn new() -> Clock {
        let perf = Reflect::get(&js_sys::global(), &"performance".into()).ok();
        Clock(perf.and_then(|p| {
            let now = Reflect::get(&p, &"now".into()).ok()?.dyn_into::<Function>().ok()?;
            Some((p, now))
        }))
    }

    fn ms(&self) -> f64 {
        self.0.as_ref().and_then(|(p, now)| now.call0(p).ok()?.as_f64()).unwrap_or_else(js_sys::Date::now)
    }
}

/// Lets the event loop run (one macrotask turn), so a worker sees a stop message between
/// two tokens of the CPU path, which never waits on anything else. The turn is a message
/// through a fresh `MessageChannel`, closed once it has arrived (an open port would keep
/// Node alive): `setTimeout(0)` is clamped to 4 ms once nested in browsers, a fifth of the
/// decode time at the page's yield every 20 ms. `setTimeout` where there is no channel.
async fn next_turn() {
    let global = js_sys::global();
    let get = |obj: &JsValue, key: &str| Reflect::get(obj, &key.into()).ok();
    let channel = get(&global, "MessageChannel")
        .and_then(|c| c.dyn_into::<Function>().ok())
        .and_then(|c| Reflect::construct(&c, &js_sys::Array::new()).ok());
    let ports = channel.and_then(|c| Some((get(&c, "port1")?, get(&c, "port2")?)));
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        if let Some((port1, port2)) = &ports {
            let post = get(port2, "postMessage").and_then(|f| f.dyn_into::<Function>().ok());
            if let Some(post) = post {
                // Setting onmessage starts the port; the message lands in the next turn.
                if Reflect::set(port1, &"onmessage".into(), &resolve).is_ok()
                    && post.call1(port2, &JsValue::NULL).is_ok()
                {
                    return;
                }
            }
        }
        let set_timeout = get(&global, "setTimeout").and_then(|f| f.dyn_into::<Function>().ok());
        match set_timeout {
            Some(f) => {
                let _ = f.call2(&JsValue::NULL, &resolve, &0.into());
            }
            None => {
                let _ = resolve.call0(&JsValue::NULL);
            }
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
    if let Some((port1, port2)) = ports {
        for port in [port1, port2] {
            if let Some(close) = get(&port, "close").and_then(|f| f.dyn_into::<Function>().ok()) {
                let _ = close.call0(&port);
            }
        }
    }
}

fn set(obj: &Object, key: &str, value: impl Into<JsValue>) {
    // Setting a property on a fresh plain object cannot fail.
    let _ = Reflect::set(obj, &key.into(), &value.into());
}

#[wasm_bindgen]
impl Model {
    /// Loads a model from the bytes of an `.rbw` file and the text of its
    /// `tokenizer.json`, or from the bytes of a GGUF file alone (its tokenizer and chat
    /// template are in it; `tokenizerJson` is left out). `options.device`: "auto" (default:
    /// WebGPU where there is a hardware adapter, else the CPU, with the reason in
    /// `deviceReason()`; a software adapter such as SwiftShader is slower than the CPU
    /// path), "webgpu" or "cpu". For a GGUF file, `options.precision` ("q8", the default,
    /// or "q4") and `options.context` (positions kept for the conversation; default 2048,
    /// at most the file's own).
    pub async fn load(
        weights: Vec<u8>, tokenizer_json: Option<String>, options: JsValue,
    ) -> Result<Model, JsError> {
        let choice = match text::get_string(&options, "device").map_err(js_err)? {
            Some(s) => DeviceChoice::parse(&s).map_err(js_err)?,
            None => DeviceChoice::Auto,
        };
        let (engine, tokenizer, template, end) = if rusting_brain_formats::gguf::is_gguf(&weights) {
            let format = match text::get_string(&options, "precision").map_err(js_err)?.as_deref() {
                None | Some("q8") => QuantFormat::Q8,
                Some("q4") => QuantFormat::Q4,
                Some(other) => {
                    return Err(js_err(WebError::Invalid(format!(
                        "options.precision is \"{other}\"; expected \"q8\" or \"q4\""
                    ))))
                }
            };
            let context = network_js::count(&options, "context", "options", 1e7)
                .map_err(js_err)?
                .map_or(gguf::DEFAULT_CONTEXT, |c| c as usize);
            let file = gguf::read(&weights, format, context).map_err(js_err)?;
            let len = weights.len();
            drop(weights);
            let engine = Engine::from_model(file.model, len, choice).await.map_err(js_err)?;
            (engine, file.tokenizer, file.template, file.end)
        } else {
            let json = tokenizer_json.ok_or_else(|| {
                js_err(WebError::Invalid(
                    "an .rbw model needs the text of its tokenizer.json (a GGUF file carries its own)".into(),
                ))
            })?;
            let tokenizer = text::tokenizer(&json).map_err(js_err)?;
            let engine = Engine::load(&weights, choice).await.map_err(js_err)?;
            drop(weights);
            let end = text::END_TOKENS.iter().find_map(|t| tokenizer.token_to_id(t));
            (engine, tokenizer, None, end)
        };
        let vocab = engine.config().vocab_size;
        let tokens = tokenizer.get_vocab_size(true);
        if tokens > vocab {
            return Err(js_err(WebError::Invalid(format!(
                "the tokenizer has {tokens} tokens but the model's vocabulary is {vocab}: they do not belong together"
            ))));
        }
        Ok(Model {
            device: engine.device(),
            reason: engine.reason().to_string(),
            state: Rc::new(RefCell::new(State {
                engine: Some(engine),
                tokenizer: Rc::new(tokenizer),
                vocab: tokens,
                end,
                template,
                messages: Vec::new(),
                busy: false,
                stop: false,
                disposed: false,
            })),
        })
    }

    /// The chat template's Jinja source (a GGUF file's `tokenizer.chat_template`), or
    /// `undefined` where the model came without one.
    #[wasm_bindgen(js_name = chatTemplate)]
    pub fn chat_template(&self) -> Option<String> {
        self.state.borrow().template.as_ref().map(|t| t.source().to_string())
    }

    /// "webgpu" or "cpu".
    pub fn device(&self) -> String {
        self.device.to_string()
    }

    /// Why that device: the WebGPU adapter's name, or why WebGPU was not used.
    #[wasm_bindgen(js_name = deviceReason)]
    pub fn device_reason(&self) -> String {
        self.reason.clone()
    }

    /// The model's shape: `{vocabSize, dModel, nLayers, maxSeqLen, parameters}`.
    pub fn info(&self) -> Result<Object, JsError> {
        let s = self.state.borrow();
        let e = s.engine.as_ref().ok_or_else(|| js_err(busy_or_disposed(&s)))?;
        let c = e.config();
        let o = shape_info(c);
        set(&o, "experts", c.moe.as_ref().map_or(0.0, |m| m.n_experts as f64));
        Ok(o)
    }

    /// The token ids of `text`.
    pub fn encode(&self, text: &str) -> Result<Uint32Array, JsError> {
        let s = self.state.borrow();
        let ids = text::encode(&s.tokenizer, text).map_err(js_err)?;
        Ok(Uint32Array::from(&ids[..]))
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String, JsError> {
        let s = self.state.borrow();
        text::decode(&s.tokenizer, s.vocab, ids).map_err(js_err)
    }

    /// Generates a continuation of `prompt` from a fresh conversation (`chatTurn`'s turns are forgotten). `options`:
    /// `maxTokens` (64), `temperature` (0 = greedy), `topK`, `topP`,
    /// `repetitionPenalty` (1), `seed` (random when absent), `stopAtEnd` (true: stop
    /// at the end of a reply: a GGUF file's end-of-sequence token, else `<|end|>`, `<|im_end|>` or `<|eot_id|>`, the first the vocabulary has), `signal` (an `AbortSignal`: aborting stops like `stop()`). `onToken(text, id)` is called for each new token with the new text
    /// (possibly empty while a character's bytes are incomplete); returning `false` stops.
    /// Resolves to `{text, ids, promptTokens, tokens, firstTokenMs, totalMs,
    /// tokensPerSecond, device, finish}` (`finish`: "length", "end", "stopped",
    /// "max_seq_len").
    pub async fn generate(
        &self, prompt: String, options: JsValue, on_token: Option<Function>,
    ) -> Result<Object, JsError> {
        self.run(Input::Text { text: prompt, fresh: true }, options, on_token).await
    }

    /// `generate`, continuing the conversation: the KV cache keeps every earlier turn.
    pub async fn chat(
        &self, text: String, options: JsValue, on_token: Option<Function>,
    ) -> Result<Object, JsError> {
        self.run(Input::Text { text, fresh: false }, options, on_token).await
    }

    /// The user's next message, answered through the model's chat template: the whole
    /// conversation is rendered (`options.system`, a system prompt, on the first turn),
    /// and only the tokens past what the model has already read are fed (the reply before
    /// stays in the KV cache; where the rendered text no longer starts with it, the
    /// conversation is read again). Options and result as `generate`'s, the result with
    /// `reusedTokens`, the tokens the cache already held. The reply ends at the model's
    /// end-of-turn token.
    #[wasm_bindgen(js_name = chatTurn)]
    pub async fn chat_turn(
        &self, text: String, options: JsValue, on_token: Option<Function>,
    ) -> Result<Object, JsError> {
        let system = text::get_string(&options, "system").map_err(js_err)?;
        self.run(Input::Turn { text, system }, options, on_token).await
    }

    /// The conversation `chatTurn` has held: `[{role, content}, ...]`.
    pub fn messages(&self) -> Array {
        let out = Array::new();
        for m in &self.state.borrow().messages {
            let o = Object::new();
            set(&o, "role", m.role.clone());
            set(&o, "content", m.content.clone());
            out.push(&o);
        }
        out
    }

    /// Asks a running generation to stop after its current token.
    pub fn stop(&self) {
        self.state.borrow_mut().stop = true;
    }

    /// Forgets the conversation.
    pub fn reset(&self) -> Result<(), JsError> {
        let mut s = self.state.borrow_mut();
        match s.engine.as_mut() {
            Some(e) => {
                e.reset();
                s.messages.clear();
                Ok(())
            }
            None => Err(js_err(busy_or_disposed(&s))),
        }
    }

    /// Frees the model's memory, GPU buffers included, now rather than at garbage
    /// collection. A running generation stops after its current token and frees it then.
    pub fn dispose(&self) {
        let mut s = self.state.borrow_mut();
        s.disposed = true;
        s.stop = true;
        if let Some(e) = s.engine.take() {
            e.dispose();
        }
    }

    async fn run(
        &self, input: Input, options: JsValue, on_token: Option<Function>,
    ) -> Result<Object, JsError> {
        let clock = Clock::new();
        let t0 = clock.ms();
        let opts = GenerateOptions::from_js(&options).map_err(js_err)?;
        let seed = opts.seed.unwrap_or_else(|| (js_sys::Math::random() * 9007199254740991.0) as u64);
        let mut sampler = opts.sampler(seed).map_err(js_err)?;
        let (mut engine, ids, tokenizer, end, turn, reused) = {
            let mut s = self.state.borrow_mut();
            if s.disposed {
                return Err(js_err(WebError::Disposed));
            }
            if s.busy {
                return Err(js_err(WebError::Busy));
            }
            let context = s.engine.as_ref().map_or(&[][..], |e| e.context());
            let (ids, fresh, turn, reused) = match input {
                Input::Text { text, fresh } => {
                    (text::encode(&s.tokenizer, &text).map_err(js_err)?, fresh, None, 0)
                }
                Input::Turn { text, system } => {
                    let template = s.template.as_ref().ok_or_else(|| {
                        lm_js::invalid(
                            "this model came without a chat template (a GGUF file's tokenizer.chat_template); use generate or chat with a prompt of your own",
                        )
                    })?;
                    let now = (js_sys::Date::now() / 1000.0) as i64;
                    let t = chat::turn(template, &s.tokenizer, &s.messages, context, text, system, now)
                        .map_err(js_err)?;
                    (t.ids, t.reused == 0, Some(t.messages), t.reused)
                }
            };
            let mut engine = s.engine.take().ok_or_else(|| js_err(WebError::Disposed))?;
            if fresh {
                engine.reset();
            }
            // `generate` starts a new conversation: chatTurn's turns go with the old one.
            if fresh && turn.is_none() {
                s.messages.clear();
            }
            s.busy = true;
            s.stop = false;
            (engine, ids, s.tokenizer.clone(), s.end, turn, reused)
        };
        let state = self.state.clone();
        // An AbortSignal in options.signal stops the generation like stop().
        let signal = Reflect::get(&options, &"signal".into()).ok().filter(|s| s.is_object());
        let aborted = |signal: &Option<JsValue>| {
            signal
                .as_ref()
                .and_then(|s| Reflect::get(s, &"aborted".into()).ok())
                .is_some_and(|a| a.is_truthy())
        };
        let mut stream = Stream::new(&tokenizer);
        let last_turn = std::cell::Cell::new(clock.ms());
        let mut first_ms = None;
        let mut callback_error = None;
        let result = engine
            .generate(
                &ids,
                opts.max_tokens,
                &mut sampler,
                opts.stop_at_end.then_some(end).flatten(),
                |id| {
                    first_ms.get_or_insert_with(|| clock.ms() - t0);
                    let piece = stream.push(id);
                    if let Some(f) = &on_token {
                        match f.call2(&JsValue::NULL, &piece.into(), &id.into()) {
                            Ok(v) if v == JsValue::FALSE => return false,
                            Ok(_) => {}
                            Err(e) => {
                                callback_error = Some(e);
                                return false;
                            }
                        }
                    }
                    !state.borrow().stop && !aborted(&signal)
                },
                || {
                    // A turn of the event loop costs tens of microseconds (more where it
                    // falls back to setTimeout), so the loop takes one only once it has run
                    // 20 ms: a Stop lands within that, and the turns cost under 1%.
                    let due = clock.ms() - last_turn.get() >= 20.0;
                    let (last_turn, clock) = (&last_turn, &clock);
                    async move {
                        if due {
                            next_turn().await;
                            last_turn.set(clock.ms());
                        }
                    }
                },
            )
            .await;
        {
            let mut s = self.state.borrow_mut();
            s.busy = false;
            if !s.disposed {
                s.engine = Some(engine);
            }
        }
        if let Some(e) = callback_error {
            return Err(JsError::new(&format!(
                "onToken threw: {}",
                e.as_string()
                    .or_else(|| Reflect::get(&e, &"message".into()).ok()?.as_string())
                    .unwrap_or_else(|| "an exception".into())
            )));
        }
        let out = result.map_err(js_err)?;
        if let Some(mut messages) = turn {
            // The reply as the template will render it next turn.
            messages.push(chat::Message::new("assistant", stream.text()));
            self.state.borrow_mut().messages = messages;
        }
        let total = clock.ms() - t0;
        let o = Object::new();
        set(&o, "text", stream.text());
        set(&o, "ids", Uint32Array::from(&out.ids[..]));
        set(&o, "promptTokens", ids.len() as f64);
        set(&o, "reusedTokens", reused as f64);
        set(&o, "tokens", out.ids.len() as f64);
        set(&o, "firstTokenMs", first_ms.unwrap_or(f64::NAN));
        set(&o, "totalMs", total);
        let decode_ms = total - first_ms.unwrap_or(total);
        let rate = if out.ids.len() > 1 && decode_ms > 0.0 {
            (out.ids.len() - 1) as f64 * 1000.0 / decode_ms
        } else {
            f64::NAN
        };
        set(&o, "tokensPerSecond", rate);
        set(&o, "device", self.device);
        set(&o, "finish", out.finish);
        Ok(o)
    }
}

fn busy_or_disposed(s: &State) -> WebError {
    if s.disposed {
        WebError::Disposed
    } else {
        WebError::Busy
    }
}
