//! The JS `Tokenizer` (byte-level BPE: trained from text in the page, or read from a
//! `tokenizer.json`) and `TransformerLm` (a small language model trained in the page, step by
//! step, on WebGPU or the CPU path, exported as the `.rbw` bytes native `load_bin` reads). Bad input (ids outside the
//! vocabulary, ragged batches, a sequence longer than the model's context, bad settings) is
//! an `Error` naming what to change.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Object, Uint32Array, Uint8Array};
use rusting_brain_core::models::transformer::TransformerConfig;
use rusting_brain_core::Optimizer;
use wasm_bindgen::prelude::*;

use crate::engine::DeviceChoice;
use crate::lm::{train_tokenizer, LmTrainer, END};
use crate::network_js::{count, field, number, text};
use crate::{js_err, set, shape_info, WebError};

pub(crate) fn invalid(message: impl Into<String>) -> JsError {
    js_err(WebError::Invalid(message.into()))
}

/// A byte-level BPE tokenizer.
#[wasm_bindgen(js_name = Tokenizer)]
pub struct JsTokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner.get_vocab_size(true)`, counted once: the library builds the whole vocabulary
    /// map to count it (about 140 us in a page at 2,048 entries), and `decode` checks ids
    /// against it at every call.
    vocab: usize,
}

impl JsTokenizer {
    fn new(inner: tokenizers::Tokenizer) -> JsTokenizer {
        let vocab = inner.get_vocab_size(true);
        JsTokenizer { inner, vocab }
    }
}

#[wasm_bindgen(js_class = Tokenizer)]
impl JsTokenizer {
    /// A vocabulary of `options.vocabSize` (default 512) entries trained on `text`: the 256
    /// byte symbols, `<|end|>` and the most frequent merges.
    pub fn train(text: &str, options: JsValue) -> Result<JsTokenizer, JsError> {
        let vocab =
            count(&options, "vocabSize", "options", 65_536.0).map_err(js_err)?.unwrap_or(512) as usize;
        Ok(JsTokenizer::new(train_tokenizer(text, vocab).map_err(js_err)?))
    }

    /// From the text of a `tokenizer.json` (or its parsed object).
    #[wasm_bindgen(js_name = fromJSON)]
    pub fn from_json(file: JsValue) -> Result<JsTokenizer, JsError> {
        let text = match file.as_string() {
            Some(t) => t,
            None if file.is_object() => js_sys::JSON::stringify(&file)
                .map_err(|_| invalid("the tokenizer object cannot be written as JSON"))?
                .into(),
            None => {
                return Err(invalid(
                    "Tokenizer.fromJSON takes the text of tokenizer.json or its parsed object",
                ))
            }
        };
        let inner =
            text.parse::<tokenizers::Tokenizer>().map_err(|e| js_err(WebError::Tokenizer(e.to_string())))?;
        Ok(JsTokenizer::new(inner))
    }

    pub fn encode(&self, text: &str) -> Result<Uint32Array, JsError> {
        let enc = self.inner.encode(text, false).map_err(|e| js_err(WebError::Tokenizer(e.to_string())))?;
        Ok(Uint32Array::from(enc.get_ids()))
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, JsError> {
        let n = self.vocab_size();
        if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= n) {
            return Err(invalid(format!("id {id} at position {i} is outside the vocabulary ({n})")));
        }
        self.inner.decode(ids, false).map_err(|e| js_err(WebError::Tokenizer(e.to_string())))
    }

    /// Entries, added tokens included.
    #[wasm_bindgen(js_name = vocabSize)]
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The id of `<|end|>`, where the vocabulary has it.
    #[wasm_bindgen(js_name = endId)]
    pub fn end_id(&self) -> Option<u32> {
        self.inner.token_to_id(END)
    }

    /// The `tokenizer.json` file as an object: `JSON.stringify(tokenizer)` writes it.
    #[wasm_bindgen(js_name = toJSON)]
    pub fn to_json(&self) -> Result<JsValue, JsError> {
        let text = self.inner.to_string(false).map_err(|e| js_err(WebError::Tokenizer(e.to_string())))?;
        js_sys::JSON::parse(&text).map_err(|_| invalid("the tokenizer file did not parse"))
    }
}

/// Equal-length id sequences from JS: an array of arrays or `Uint32Array`s.
fn sequences(batch: &JsValue) -> Result<Vec<Vec<u32>>, JsError> {
    if !Array::is_array(batch) {
        return Err(invalid("a batch is an array of id sequences (arrays or Uint32Arrays)"));
    }
    Array::from(batch)
        .iter()
        .enumerate()
        .map(|(r, row)| {
            if row.is_instance_of::<Uint32Array>() {
                return Ok(Uint32Array::from(row).to_vec());
            }
            if !Array::is_array(&row) {
                return Err(invalid(format!("batch[{r}] is not an array of ids")));
            }
            Array::from(&row)
                .iter()
                .enumerate()
                .map(|(i, v)| match v.as_f64() {
                    Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= u32::MAX as f64 => Ok(x as u32),
                    _ => Err(invalid(format!("batch[{r}][{i}] is not a token id (a whole number)"))),
                })
                .collect()
        })
        .collect()
}

struct LmState {
    lm: Option<LmTrainer>,
    busy: bool,
    disposed: bool,
}

/// A small decoder-only transformer trained in the page, on WebGPU or the wasm CPU path.
#[wasm_bindgen(js_name = TransformerLm)]
pub struct JsTransformerLm {
    state: Rc<RefCell<LmState>>,
    device: &'static str,
    reason: String,
}

impl JsTransformerLm {
    /// Takes the model out for the length of a call (a second call meanwhile is told the
    /// model is busy, never handed an aliased one).
    fn take(&self) -> Result<LmTrainer, JsError> {
        let mut s = self.state.borrow_mut();
        if s.disposed {
            return Err(invalid("this model was disposed; create it again"));
        }
        if s.busy {
            return Err(invalid(
                "another call (trainStep, evaluate, toBytes) is running on this model; await it first",
            ));
        }
        let lm = s.lm.take().ok_or_else(|| invalid("this model was disposed; create it again"))?;
        s.busy = true;
        Ok(lm)
    }

    fn give_back(&self, lm: LmTrainer) {
        let mut s = self.state.borrow_mut();
        s.busy = false;
        if !s.disposed {
            s.lm = Some(lm);
        }
    }

    /// Runs `f` on the model, handing it back whatever `f` returns.
    fn with<T>(&self, f: impl FnOnce(&mut LmTrainer) -> Result<T, JsError>) -> Result<T, JsError> {
        let mut lm = self.take()?;
        let r = f(&mut lm);
        self.give_back(lm);
        r
    }
}

#[wasm_bindgen(js_class = TransformerLm)]
impl JsTransformerLm {
    /// A new model from `{ vocabSize, dModel, nLayers, heads, kvHeads, headDim, dFF,
    /// maxSeqLen, seed, optimizer, device }`: the native builder's model for the same
    /// settings and seed (RoPE theta 10000, RMSNorm eps 1e-5, tied embeddings), on WebGPU
    /// where there is a hardware adapter (`device`: "auto", the default; a software one is
    /// left for the CPU path) or the CPU.
    pub async fn create(config: JsValue) -> Result<JsTransformerLm, JsError> {
        let what = "config";
        let n = |key: &str| -> Result<usize, JsError> {
            count(&config, key, what, 1e9)
                .map_err(js_err)?
                .map(|v| v as usize)
                .ok_or_else(|| invalid(format!("config.{key} is missing")))
        };
        let heads = n("heads")?;
        let c = TransformerConfig::llama(
            n("vocabSize")?,
            n("dModel")?,
            n("nLayers")?,
            (
                heads,
                count(&config, "kvHeads", what, 1e9).map_err(js_err)?.map_or(heads, |v| v as usize),
                n("headDim")?,
            ),
            n("dFF")?,
            n("maxSeqLen")?,
        );
        let seed = count(&config, "seed", what, 9_007_199_254_740_991.0).map_err(js_err)?.unwrap_or(0);
        let optimizer = match field(&config, "optimizer").map_err(js_err)? {
            None => Optimizer::adam(1e-3),
            Some(o) => {
                let lr = number(&o, "learningRate", "optimizer").map_err(js_err)?.unwrap_or(1e-3) as f32;
                let wd = number(&o, "weightDecay", "optimizer").map_err(js_err)?.unwrap_or(0.0) as f32;
                let mut opt = Optimizer::adam(lr).weight_decay(wd);
                if let (Some(b1), Some(b2)) = (
                    number(&o, "beta1", "optimizer").map_err(js_err)?,
                    number(&o, "beta2", "optimizer").map_err(js_err)?,
                ) {
                    opt = opt.betas(b1 as f32, b2 as f32);
                }
                opt
            }
        };
        let choice = match text(&config, "device", what).map_err(js_err)? {
            None => DeviceChoice::Auto,
            Some(d) => DeviceChoice::parse(&d).map_err(js_err)?,
        };
        let lm = LmTrainer::new(c, optimizer, seed, choice).await.map_err(js_err)?;
        Ok(JsTransformerLm {
            device: lm.device(),
            reason: lm.reason().to_string(),
            state: Rc::new(RefCell::new(LmState { lm: Some(lm), busy: false, disposed: false })),
        })
    }

    /// One optimizer step on a batch of equal-length id sequences (at most `maxSeqLen + 1`
    /// ids each; each position predicts the next). `options.clip`: clip the gradients to
    /// this global norm. Resolves to `{ loss, tokens, gradNorm, ms }`.
    #[wasm_bindgen(js_name = trainStep)]
    pub async fn train_step(&self, batch: JsValue, options: JsValue) -> Result<Object, JsError> {
        let seqs = sequences(&batch)?;
        let clip = number(&options, "clip", "options").map_err(js_err)?.map(|c| c as f32);
        let mut lm = self.take()?;
        let t0 = crate::now_ms();
        let r = lm.train_step(&seqs, clip).await;
        let ms = crate::now_ms() - t0;
        self.give_back(lm);
        let s = r.map_err(js_err)?;
        let out = Object::new();
        set(&out, "loss", s.loss);
        set(&out, "tokens", s.tokens as f64);
        set(&out, "gradNorm", s.grad_norm);
        set(&out, "ms", ms);
        Ok(out)
    }

    /// The mean loss per token of a batch, forward only: `{ loss, tokens }`.
    pub async fn evaluate(&self, batch: JsValue) -> Result<Object, JsError> {
        let seqs = sequences(&batch)?;
        let mut lm = self.take()?;
        let r = lm.evaluate(&seqs).await;
        self.give_back(lm);
        let (loss, tokens) = r.map_err(js_err)?;
        let out = Object::new();
        set(&out, "loss", loss);
        set(&out, "tokens", tokens as f64);
        Ok(out)
    }

    #[wasm_bindgen(js_name = setLearningRate)]
    pub fn set_learning_rate(&self, learning_rate: f64) -> Result<(), JsError> {
        self.with(|t| {
            let mut opt = t.optimizer;
            opt.set_learning_rate(learning_rate as f32);
            opt.validate().map_err(|e| js_err(e.into()))?;
            t.optimizer = opt;
            Ok(())
        })
    }

    /// The F32 `.rbw` file: native `TransformerLm::load_bin` reads it, `loadModel` too.
    #[wasm_bindgen(js_name = toBytes)]
    pub async fn to_bytes(&self) -> Result<Uint8Array, JsError> {
        let lm = self.take()?;
        let r = lm.to_bytes().await;
        self.give_back(lm);
        Ok(Uint8Array::from(r.map_err(js_err)?.as_slice()))
    }

    /// `{ vocabSize, dModel, nLayers, maxSeqLen, parameters, steps }`.
    pub fn info(&self) -> Result<Object, JsError> {
        self.with(|t| {
            let out = shape_info(t.config());
            set(&out, "steps", t.steps() as f64);
            Ok(out)
        })
    }

    /// "webgpu" or "cpu".
    pub fn device(&self) -> String {
        self.device.into()
    }

    /// Why that device ("WebGPU adapter ...", or why not).
    #[wasm_bindgen(js_name = deviceReason)]
    pub fn device_reason(&self) -> String {
        self.reason.clone()
    }

    /// Frees the model's memory (GPU buffers included); later calls are errors.
    pub fn dispose(&self) {
        let mut s = self.state.borrow_mut();
        s.disposed = true;
        s.lm = None;
    }
}
