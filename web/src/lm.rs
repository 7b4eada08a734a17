//! A small language model trained in the page, in plain Rust so native tests run it: core's
//! `TransformerModel` on the portable backend (the wasm CPU path), stepped the way native
//! `TransformerLm` steps (gradients zeroed, one batch's mean loss accumulated, the global
//! gradient norm checked and optionally clipped, the optimizer), and written as the F32
//! `.rbw` file native `load_bin` reads. Plus the byte-level BPE tokenizer the
//! `language_model` example trains, trained here from a page's text.

use rusting_brain_core::checkpoint::f32_file_bytes;
use rusting_brain_core::models::transformer::{TokenBatch, TransformerConfig, TransformerModel};
use rusting_brain_core::{CoreError, Optimizer};
use rusting_brain_portable::PortableBackend;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, Tokenizer,
    TokenizerBuilder,
};

use crate::WebError;

/// The token that ends a reply, as in the `language_model` example's vocabulary.
pub const END: &str = "<|end|>";

/// A byte-level BPE vocabulary of `vocab_size` entries (the 256 byte symbols, `<|end|>` and
/// the merges) trained on `text`, as the `language_model` example trains its own.
pub fn train_tokenizer(text: &str, vocab_size: usize) -> Result<Tokenizer, WebError> {
    if !(258..=65_536).contains(&vocab_size) {
        return Err(WebError::Invalid(format!(
            "vocabSize is {vocab_size}; a byte-level vocabulary needs 258 to 65536 entries (256 bytes, <|end|>, a merge)"
        )));
    }
    if text.trim().is_empty() {
        return Err(WebError::Invalid(
            "the text to train the tokenizer on is empty".into(),
        ));
    }
    let tok_err = |e: tokenizers::Error| WebError::Tokenizer(e.to_string());
    let mut trainer = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from(END, true)])
        .build();
    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::default()
    .with_model(BPE::default())
    .with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(
        ByteLevel::default().add_prefix_space(false),
    )))
    .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())))
    .build()
    .map_err(tok_err)?;
    // Line by line with their breaks, as training from a file reads it.
    tokenizer
        .train(&mut trainer, text.split_inclusive('\n'))
        .map_err(tok_err)?;
    Ok(tokenizer.into())
}

/// What one training step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// The batch's mean loss per counted token, in nats.
    pub loss: f64,
    pub tokens: usize,
    /// The global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
}

/// A language model being trained.
pub struct LmTrainer {
    model: TransformerModel<PortableBackend>,
    /// Read again at every step: a schedule is `set_learning_rate` between steps.
    pub optimizer: Optimizer,
    steps: u64,
}

fn batch_of(seqs: &[Vec<u32>], vocab: usize) -> Result<TokenBatch, WebError> {
    let tb = TokenBatch::new(seqs)?;
    tb.check(vocab)?;
    Ok(tb)
}

impl LmTrainer {
    /// A new model, weights drawn from `seed` as native `TransformerLm::builder().seed(seed)`
    /// draws them.
    pub fn new(config: TransformerConfig, optimizer: Optimizer, seed: u64) -> Result<LmTrainer, WebError> {
        config.validate()?;
        optimizer.validate()?;
        Ok(LmTrainer {
            model: TransformerModel::new(PortableBackend, config, seed)?,
            optimizer,
            steps: 0,
        })
    }

    pub fn config(&self) -> &TransformerConfig {
        &self.model.config
    }

    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One optimizer step on a batch of equal-length id sequences (each predicts its own
    /// next ids), the gradients clipped to a global norm of `clip` when given. A batch
    /// whose loss or gradient is not finite is refused before the weights change.
    pub fn train_step(&mut self, seqs: &[Vec<u32>], clip: Option<f32>) -> Result<Step, WebError> {
        let tb = batch_of(seqs, self.model.config.vocab_size)?;
        if let Some(c) = clip {
            if !(c.is_finite() && c > 0.0) {
                return Err(WebError::Invalid(format!(
                    "clip is {c}; it must be finite and above 0"
                )));
            }
        }
        let m = &mut self.model;
        m.zero_grad()?;
        let s = m.accumulate(&tb)?;
        let loss = s.sum / s.count.max(1) as f64;
        if !loss.is_finite() {
            return Err(CoreError::NonFinite {
                op: "training loss",
                value: loss,
            }
            .into());
        }
        let norm = m.grad_norm(1.0)?;
        if !norm.is_finite() {
            return Err(CoreError::NonFinite {
                op: "gradient norm",
                value: norm,
            }
            .into());
        }
        let scale = match clip {
            Some(c) if norm > c as f64 => (c as f64 / norm) as f32,
            _ => 1.0,
        };
        m.step(&self.optimizer, scale)?;
        self.steps += 1;
        Ok(Step {
            loss,
            tokens: s.count,
            grad_norm: norm,
        })
    }

    /// The mean loss per token of a batch, forward only.
    pub fn evaluate(&mut self, seqs: &[Vec<u32>]) -> Result<(f64, usize), WebError> {
        let tb = batch_of(seqs, self.model.config.vocab_size)?;
        let s = self.model.evaluate(&tb)?;
        Ok((s.sum / s.count.max(1) as f64, s.count))
    }

    /// The F32 `.rbw` file's bytes (native `load_bin` reads them; so does the page's
    /// `loadModel`, which quantizes them to int8).
    pub fn to_bytes(&self) -> Result<Vec<u8>, WebError> {
        Ok(f32_file_bytes(&self.model)?)
    }
}
