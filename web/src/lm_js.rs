//! The JS `Tokenizer` (byte-level BPE: trained from text in the page, or read from a
//! `tokenizer.json`) and `TransformerLm` (a small language model trained in the page, step by
//! step, exported as the `.rbw` bytes native `load_bin` reads). Bad input (ids outside the
//! vocabulary, ragged batches, a sequence longer than the model's context, bad settings) is
//! an `Error` naming what to change.

use js_sys::{Array, Object, Uint32Array, Uint8Array};
use rusting_brain_core::models::transformer::TransformerConfig;
use rusting_brain_core::Optimizer;
use wasm_bindgen::prelude::*;

use crate::lm::{train_tokenizer, LmTrainer, END};
use crate::network_js::{count, field, number};
use crate::{js_err, set, WebError};

fn invalid(message: impl Into<String>) -> JsError {
    js_err(WebError::Invalid(message.into()))
}

/// A byte-level BPE tokenizer.
#[wasm_bindgen(js_name = Tokenizer)]
pub struct JsTokenizer {
    inner: tokenizers::Tokenizer,
}

#[wasm_bindgen(js_class = Tokenizer)]
impl JsTokenizer {
    /// A vocabulary of `options.vocabSize` (default 512) entries trained on `text`: the 256
    /// byte symbols, `<|end|>` and the most frequent merges.
    pub fn train(text: &str, options: JsValue) -> Result<JsTokenizer, JsError> {
        let vocab = count(&options, "vocabSize", "options", 65_536.0)
            .map_err(js_err)?
            .unwrap_or(512) as usize;
        Ok(JsTokenizer {
            inner: train_tokenizer(text, vocab).map_err(js_err)?,
        })
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
        let inner = text
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| js_err(WebError::Tokenizer(e.to_string())))?;
        Ok(JsTokenizer { inner })
    }

    pub fn encode(&self, text: &str) -> Result<Uint32Array, JsError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| js_err(WebError::Tokenizer(e.to_string())))?;
        Ok(Uint32Array::from(enc.get_ids()))
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, JsError> {
        let n = self.vocab_size();
        if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= n) {
            return Err(invalid(format!(
                "id {id} at position {i} is outside the vocabulary ({n})"
            )));
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| js_err(WebError::Tokenizer(e.to_string())))
    }

    /// Entries, added tokens included.
    #[wasm_bindgen(js_name = vocabSize)]
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of `<|end|>`, where the vocabulary has it.
    #[wasm_bindgen(js_name = endId)]
    pub fn end_id(&self) -> Option<u32> {
        self.inner.token_to_id(END)
    }

    /// The `tokenizer.json` file as an object: `JSON.stringify(tokenizer)` writes it.
    #[wasm_bindgen(js_name = toJSON)]
    pub fn to_json(&self) -> Result<JsValue, JsError> {
        let text = self
            .inner
            .to_string(false)
            .map_err(|e| js_err(WebError::Tokenizer(e.to_string())))?;
        js_sys::JSON::parse(&text).map_err(|_| invalid("the tokenizer file did not parse"))
    }
}

/// Equal-length id sequences from JS: an array of arrays or `Uint32Array`s.
fn sequences(batch: &JsValue) -> Result<Vec<Vec<u32>>, JsError> {
    if !Array::is_array(batch) {
        return Err(invalid(
            "a batch is an array of id sequences (arrays or Uint32Arrays)",
        ));
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
                    _ => Err(invalid(format!(
                        "batch[{r}][{i}] is not a token id (a whole number)"
                    ))),
                })
                .collect()
        })
        .collect()
}

/// A small decoder-only transformer trained in the page (on the wasm CPU path).
#[wasm_bindgen(js_name = TransformerLm)]
pub struct JsTransformerLm {
    inner: Option<LmTrainer>,
}

fn disposed() -> JsError {
    invalid("this model was disposed; create it again")
}

impl JsTransformerLm {
    fn trainer(&mut self) -> Result<&mut LmTrainer, JsError> {
        self.inner.as_mut().ok_or_else(disposed)
    }
    fn trainer_ref(&self) -> Result<&LmTrainer, JsError> {
        self.inner.as_ref().ok_or_else(disposed)
    }
}

#[wasm_bindgen(js_class = TransformerLm)]
impl JsTransformerLm {
    /// A new model from `{ vocabSize, dModel, nLayers, heads, kvHeads, headDim, dFF,
    /// maxSeqLen, seed, optimizer }`: the native builder's model for the same settings and
    /// seed (RoPE theta 10000, RMSNorm eps 1e-5, tied embeddings).
    pub fn create(config: JsValue) -> Result<JsTransformerLm, JsError> {
        let what = "config";
        let n = |key: &str| -> Result<usize, JsError> {
            count(&config, key, what, 1e9)
                .map_err(js_err)?
                .map(|v| v as usize)
                .ok_or_else(|| invalid(format!("config.{key} is missing")))
        };
        let heads = n("heads")?;
        let c = TransformerConfig {
            vocab_size: n("vocabSize")?,
            d_model: n("dModel")?,
            n_layers: n("nLayers")?,
            q_heads: heads,
            kv_heads: count(&config, "kvHeads", what, 1e9)
                .map_err(js_err)?
                .map_or(heads, |v| v as usize),
            head_dim: n("headDim")?,
            d_ff: n("dFF")?,
            max_seq_len: n("maxSeqLen")?,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            tie_embeddings: true,
            qkv_bias: false,
            qk_norm: false,
            rope_scaling: Default::default(),
            moe: None,
        };
        let seed = count(&config, "seed", what, 9_007_199_254_740_991.0)
            .map_err(js_err)?
            .unwrap_or(0);
        let optimizer = match field(&config, "optimizer").map_err(js_err)? {
            None => Optimizer::adam(1e-3),
            Some(o) => {
                let lr = number(&o, "learningRate", "optimizer")
                    .map_err(js_err)?
                    .unwrap_or(1e-3) as f32;
                let wd = number(&o, "weightDecay", "optimizer")
                    .map_err(js_err)?
                    .unwrap_or(0.0) as f32;
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
        Ok(JsTransformerLm {
            inner: Some(LmTrainer::new(c, optimizer, seed).map_err(js_err)?),
        })
    }

    /// One optimizer step on a batch of equal-length id sequences (at most `maxSeqLen + 1`
    /// ids each; each position predicts the next). `options.clip`: clip the gradients to
    /// this global norm. Returns `{ loss, tokens, gradNorm, ms }`.
    #[wasm_bindgen(js_name = trainStep)]
    pub fn train_step(&mut self, batch: JsValue, options: JsValue) -> Result<Object, JsError> {
        let seqs = sequences(&batch)?;
        let clip = number(&options, "clip", "options")
            .map_err(js_err)?
            .map(|c| c as f32);
        let t0 = crate::now_ms();
        let s = self.trainer()?.train_step(&seqs, clip).map_err(js_err)?;
        let out = Object::new();
        set(&out, "loss", s.loss);
        set(&out, "tokens", s.tokens as f64);
        set(&out, "gradNorm", s.grad_norm);
        set(&out, "ms", crate::now_ms() - t0);
        Ok(out)
    }

    /// The mean loss per token of a batch, forward only: `{ loss, tokens }`.
    pub fn evaluate(&mut self, batch: JsValue) -> Result<Object, JsError> {
        let seqs = sequences(&batch)?;
        let (loss, tokens) = self.trainer()?.evaluate(&seqs).map_err(js_err)?;
        let out = Object::new();
        set(&out, "loss", loss);
        set(&out, "tokens", tokens as f64);
        Ok(out)
    }

    #[wasm_bindgen(js_name = setLearningRate)]
    pub fn set_learning_rate(&mut self, learning_rate: f64) -> Result<(), JsError> {
        let t = self.trainer()?;
        let mut opt = t.optimizer;
        opt.set_learning_rate(learning_rate as f32);
        opt.validate().map_err(|e| js_err(e.into()))?;
        t.optimizer = opt;
        Ok(())
    }

    /// The F32 `.rbw` file: native `TransformerLm::load_bin` reads it, `loadModel` too.
    #[wasm_bindgen(js_name = toBytes)]
    pub fn to_bytes(&self) -> Result<Uint8Array, JsError> {
        let bytes = self.trainer_ref()?.to_bytes().map_err(js_err)?;
        Ok(Uint8Array::from(bytes.as_slice()))
    }

    /// `{ vocabSize, dModel, nLayers, maxSeqLen, parameters, steps }`.
    pub fn info(&self) -> Result<Object, JsError> {
        let t = self.trainer_ref()?;
        let c = t.config();
        let out = Object::new();
        set(&out, "vocabSize", c.vocab_size as f64);
        set(&out, "dModel", c.d_model as f64);
        set(&out, "nLayers", c.n_layers as f64);
        set(&out, "maxSeqLen", c.max_seq_len as f64);
        set(&out, "parameters", c.parameter_count() as f64);
        set(&out, "steps", t.steps() as f64);
        Ok(out)
    }

    /// "cpu": language models train on the wasm CPU path.
    pub fn device(&self) -> String {
        "cpu".into()
    }

    pub fn dispose(&mut self) {
        self.inner = None;
    }
}
