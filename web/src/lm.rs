//! A small language model trained in the page, in plain Rust so native tests run it: core's
//! `TransformerModel` on WebGPU (`WgpuBackend`, its losses and gradient norms read back
//! without blocking) or on the portable backend (the wasm CPU path), stepped the way native
//! `TransformerLm` steps (gradients zeroed, one batch's mean loss accumulated, the global
//! gradient norm checked and optionally clipped, the optimizer), and written as the F32
//! `.rbw` file native `load_bin` reads. Plus the byte-level BPE tokenizer the
//! `language_model` example trains, trained here from a page's text.

use rusting_brain_core::checkpoint::{f32_file_bytes, f32_file_bytes_of};
use rusting_brain_core::models::transformer::{TokenBatch, TransformerConfig, TransformerModel};
use rusting_brain_core::{Backend, CoreError, Optimizer};
use rusting_brain_portable::PortableBackend;
use rusting_brain_shaders::WgpuBackend;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, Tokenizer,
    TokenizerBuilder,
};

use crate::engine::{webgpu_for, DeviceChoice, OnDevice};
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
        return Err(WebError::Invalid("the text to train the tokenizer on is empty".into()));
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
    .with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::default().add_prefix_space(false))))
    .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())))
    .build()
    .map_err(tok_err)?;
    // Line by line with their breaks, as training from a file reads it.
    tokenizer.train(&mut trainer, text.split_inclusive('\n')).map_err(tok_err)?;
    Ok(tokenizer.into())
}

/// What one training step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// The batch's mean loss per counted token, in nats.
    pub loss: f64,
    /// Positions counted in the loss.
    pub tokens: usize,
    /// The global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
}

/// Boxed: a model's fields are kilobytes, and the two differ in size.
type Device = OnDevice<Box<TransformerModel<PortableBackend>>, Box<TransformerModel<WgpuBackend>>>;

/// A language model being trained.
pub struct LmTrainer {
    device: Device,
    /// Read again at every step: a schedule is `set_learning_rate` between steps.
    pub optimizer: Optimizer,
    steps: u64,
    reason: String,
}

fn batch_of(seqs: &[Vec<u32>], vocab: usize) -> Result<TokenBatch, WebError> {
    let tb = TokenBatch::new(seqs)?;
    tb.check(vocab)?;
    Ok(tb)
}

/// The loss, the norm and the clip checked, then the optimizer: a refused step changes
/// nothing.
fn finish<B: Backend>(
    m: &mut TransformerModel<B>, optimizer: &Optimizer, (sum, count): (f64, usize), norm: f64,
    clip: Option<f32>,
) -> Result<Step, WebError> {
    let loss = sum / count.max(1) as f64;
    if !loss.is_finite() {
        return Err(CoreError::NonFinite { op: "training loss", value: loss }.into());
    }
    if !norm.is_finite() {
        return Err(CoreError::NonFinite { op: "gradient norm", value: norm }.into());
    }
    let scale = match clip {
        Some(c) if norm > c as f64 => (c as f64 / norm) as f32,
        _ => 1.0,
    };
    m.step(optimizer, scale)?;
    Ok(Step { loss, tokens: count, grad_norm: norm })
}

/// The last deferred cross-entropy's (sum, count), read back without blocking.
async fn deferred(b: &WgpuBackend) -> Result<(f64, usize), WebError> {
    let s = b
        .deferred_loss()
        .await?
        .ok_or_else(|| WebError::Gpu("no loss was left on the device by the pass".into()))?;
    Ok((s.loss_sum, s.count))
}

impl LmTrainer {
    /// A new model on the chosen device, weights drawn from `seed` as native
    /// `TransformerLm::builder().seed(seed)` draws them (on the host, then uploaded).
    pub async fn new(
        config: TransformerConfig, optimizer: Optimizer, seed: u64, choice: DeviceChoice,
    ) -> Result<LmTrainer, WebError> {
        config.validate()?;
        optimizer.validate()?;
        let (device, reason) = match webgpu_for(choice).await? {
            Ok((backend, reason)) => {
                backend.defer_losses(true);
                (Device::Gpu(Box::new(TransformerModel::new(backend, config, seed)?)), reason)
            }
            Err(reason) => {
                (Device::Cpu(Box::new(TransformerModel::new(PortableBackend, config, seed)?)), reason)
            }
        };
        Ok(LmTrainer { device, optimizer, steps: 0, reason })
    }

    /// The model's architecture.
    pub fn config(&self) -> &TransformerConfig {
        match &self.device {
            Device::Cpu(m) => &m.config,
            Device::Gpu(m) => &m.config,
        }
    }

    /// "webgpu" or "cpu".
    pub fn device(&self) -> &'static str {
        self.device.name()
    }

    /// Why the device in use was chosen.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One optimizer step on a batch of equal-length id sequences (each predicts its own
    /// next ids), the gradients clipped to a global norm of `clip` when given. A batch
    /// whose loss or gradient is not finite is refused before the weights change.
    pub async fn train_step(&mut self, seqs: &[Vec<u32>], clip: Option<f32>) -> Result<Step, WebError> {
        let tb = batch_of(seqs, self.config().vocab_size)?;
        if let Some(c) = clip {
            if !(c.is_finite() && c > 0.0) {
                return Err(WebError::Invalid(format!("clip is {c}; it must be finite and above 0")));
            }
        }
        let optimizer = self.optimizer;
        let step = match &mut self.device {
            Device::Cpu(m) => {
                m.zero_grad()?;
                let s = m.accumulate(&tb)?;
                let norm = m.grad_norm(1.0)?;
                finish(m, &optimizer, (s.sum, s.count), norm, clip)?
            }
            Device::Gpu(m) => {
                m.zero_grad()?;
                m.accumulate(&tb)?;
                let loss = deferred(&m.backend).await?;
                let leaves = m.grads.as_ref().into_leaves();
                let norm = m.backend.sum_of_squares_many_async(&leaves).await?.sqrt();
                finish(m, &optimizer, loss, norm, clip)?
            }
        };
        self.steps += 1;
        Ok(step)
    }

    /// The mean loss per token of a batch, forward only.
    pub async fn evaluate(&mut self, seqs: &[Vec<u32>]) -> Result<(f64, usize), WebError> {
        let tb = batch_of(seqs, self.config().vocab_size)?;
        let (sum, count) = match &mut self.device {
            Device::Cpu(m) => {
                let s = m.evaluate(&tb)?;
                (s.sum, s.count)
            }
            Device::Gpu(m) => {
                m.evaluate(&tb)?;
                deferred(&m.backend).await?
            }
        };
        Ok((sum / count.max(1) as f64, count))
    }

    /// The F32 `.rbw` file's bytes (native `load_bin` reads them; so does the page's
    /// `loadModel`, which quantizes them to int8).
    pub async fn to_bytes(&self) -> Result<Vec<u8>, WebError> {
        match &self.device {
            Device::Cpu(m) => Ok(f32_file_bytes(m)?),
            Device::Gpu(m) => {
                m.backend.flush()?;
                let mut values = Vec::new();
                for buf in m.params.as_ref().into_leaves() {
                    values.push(m.backend.gpu().read(buf).await?);
                }
                Ok(f32_file_bytes_of(&m.config, &values)?)
            }
        }
    }
}
