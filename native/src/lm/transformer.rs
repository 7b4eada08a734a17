//! `TransformerLm`: a decoder-only language model — build, train, evaluate.

use std::fmt;

use rusting_brain_core::models::transformer::{
    Conversation, KvCache, LoraConfig, LossSum, MoeConfig, Reply, TokenBatch, TransformerConfig,
    TransformerModel, Turn,
};
use rusting_brain_core::{CoreError, OperandPrecision, Optimizer, RopeScaling, Sampler};

use crate::backend::cpu::CpuBackend;
#[cfg(any(feature = "gpu", feature = "cuda-backend"))]
use crate::lm::device::{DeviceLm, OnDevice};
use crate::{NetworkError, Result};

// The model's parts by job: building it, generating with it, its files, its adapters.
mod adapters;
mod builder;
mod files;
mod generate;

pub use builder::*;
pub use generate::*;

/// The model on its device; one arm per backend, picked at run time. One per model, so
/// the arms' size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum LmEngine {
    Cpu(TransformerModel<CpuBackend>),
    /// On wgpu: an f32 model trains there (the host copy is brought up to date by
    /// `sync_from_device`), an int8 one decodes there (the host copy stays current).
    #[cfg(feature = "gpu")]
    Wgpu(Box<DeviceLm<rusting_brain_shaders::WgpuBackend>>),
    /// Training on an NVIDIA GPU; the host copy is brought up to date by `sync_from_device`.
    #[cfg(feature = "cuda-backend")]
    Cuda(Box<DeviceLm<crate::backend::cuda::CudaBackend>>),
}

/// A minimal valid model that holds the engine's place while a model moves between
/// devices (nothing can observe it: the move replaces it before returning).
#[cfg(any(feature = "gpu", feature = "cuda-backend"))]
fn placeholder() -> Result<LmEngine> {
    let config = TransformerConfig::llama(1, 2, 1, (1, 1, 2), 1, 1);
    Ok(LmEngine::Cpu(TransformerModel::new(CpuBackend::new(), config, 0)?))
}

/// A decoder-only transformer language model. Build one with [`TransformerLm::builder`].
///
/// ```
/// use rusting_brain::{Optimizer, Schedule, TokenBatch, TransformerLm};
///
/// let mut model = TransformerLm::builder()
///     .vocab_size(64)
///     .d_model(32)
///     .n_layers(2)
///     .heads(4, 2, 8) // 4 query heads, 2 key/value heads, head size 8
///     .d_ff(64)
///     .max_seq_len(16)
///     .optimizer(Optimizer::adam(3e-3).betas(0.9, 0.95).weight_decay(0.1))
///     .seed(42)
///     .build()?;
/// println!("{}", model.parameter_counts());
///
/// let loss = model.train_step(&[vec![1, 2, 3, 4], vec![5, 6, 7, 8]])?;
/// assert!((loss.lm_loss - 64f32.ln()).abs() < 0.5);
///
/// let schedule = Schedule::warmup_cosine(3e-3, 10, 100);
/// model.optimizer.set_learning_rate(schedule.rate(10));
/// model.zero_grad()?;
/// for micro in [&[vec![1, 2, 3, 4]][..], &[vec![4, 3, 2, 1]][..]] {
///     model.accumulate_step(&TokenBatch::new(micro)?)?;
/// }
/// let norm = model.step_clipped(0.5, 1.0)?;
/// assert!(norm > 0.0);
///
/// let held_out = TokenBatch::new(&[vec![9, 8, 7, 6]])?;
/// let val = model.evaluate(&held_out)?;
/// assert!(val.perplexity() > 1.0);
/// let sft = TokenBatch::supervised(&[(vec![1, 2, 3], vec![4, 5])])?;
/// assert_eq!(model.train_step_batch(&sft)?.tokens, 2);
/// # Ok::<(), rusting_brain::NetworkError>(())
/// ```
pub struct TransformerLm {
    engine: LmEngine,
    /// Read again at every step: `model.optimizer.set_learning_rate(schedule.rate(step))`.
    pub optimizer: Optimizer,
    /// The `config.json` a Hugging Face directory was loaded from, for `save_pretrained`.
    origin: Option<crate::io::hf::Origin>,
    /// This model's decode steps on the CPU, timed split over the thread team and alone.
    decode_steps: crate::backend::cpu::team::DecodeSteps,
}

impl TransformerLm {
    /// A builder: the sizes (`vocab_size`, `d_model`, `n_layers`, `heads`, `d_ff`, `max_seq_len`), then `build()`.
    pub fn builder() -> TransformerLmBuilder {
        TransformerLmBuilder {
            config: TransformerConfig::llama(0, 0, 0, (0, 0, 0), 0, 0),
            optimizer: Optimizer::adam(3e-4),
            seed: 0,
            moe: MoeOptions::default(),
        }
    }
    /// The host copy: the model itself on the CPU, the copy `sync_from_device` updates on
    /// a training device, the configuration's holder beside an int8 GPU decoder.
    fn model(&self) -> &TransformerModel<CpuBackend> {
        match &self.engine {
            LmEngine::Cpu(m) => m,
            #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
            _ => self.on_device().expect("the other arms are on a device").host(),
        }
    }
    fn model_mut(&mut self) -> &mut TransformerModel<CpuBackend> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if self.on_device().is_some() {
            return self.on_device_mut().expect("checked").host_mut();
        }
        match &mut self.engine {
            LmEngine::Cpu(m) => m,
            #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
            _ => unreachable!("the device arms returned above"),
        }
    }
    /// The model when it trains on a device (CUDA, wgpu).
    #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
    fn on_device(&self) -> Option<&dyn OnDevice> {
        match &self.engine {
            #[cfg(feature = "gpu")]
            LmEngine::Wgpu(w) => Some(&**w),
            #[cfg(feature = "cuda-backend")]
            LmEngine::Cuda(c) => Some(&**c),
            _ => None,
        }
    }
    #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
    fn on_device_mut(&mut self) -> Option<&mut dyn OnDevice> {
        match &mut self.engine {
            #[cfg(feature = "gpu")]
            LmEngine::Wgpu(w) => Some(&mut **w),
            #[cfg(feature = "cuda-backend")]
            LmEngine::Cuda(c) => Some(&mut **c),
            _ => None,
        }
    }
    /// Errors while the model trains on a device and the host copy is behind it.
    fn host_current(&self, what: &str) -> Result<()> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            if !d.synced() {
                return Err(d.stale(what));
            }
        }
        let _ = what;
        Ok(())
    }
    /// An error for `what` while the model trains on a device.
    fn refuse_on_device(&self, what: &str, advice: &str) -> Result<()> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return Err(NetworkError::InvalidInput(format!(
                "{what}: the model trains on {}; {advice}",
                d.kind()
            )));
        }
        let _ = (what, advice);
        Ok(())
    }
    /// Moves the model to CUDA device `ordinal` for training (feature `cuda`): weights,
    /// gradients, Adam moments, step count and mixed-precision setting. `budget_mib` caps
    /// the device memory it may hold (a 12 GiB card: about 9,000); the weights, gradients and
    /// moments are counted against it before anything is allocated, activations when a
    /// batch shape is first seen, and going over is an error, not an allocation.
    ///
    /// Afterwards `train_step`, `accumulate_step`, `step`, `step_clipped`, `evaluate`,
    /// `forward_batch` and decoding run on the device; a driver, cuBLAS, kernel,
    /// allocation or numerical failure is an error, never a silent CPU run. Call
    /// [`TransformerLm::sync_from_device`] before `save_bin`, or [`TransformerLm::to_cpu`]
    /// to come back. An int8 model cannot move (its f32 weights are gone).
    #[cfg(feature = "cuda-backend")]
    pub fn to_cuda(&mut self, ordinal: usize, budget_mib: usize) -> Result<()> {
        match &self.engine {
            LmEngine::Cuda(_) => return Ok(()),
            #[cfg(feature = "gpu")]
            LmEngine::Wgpu(_) => {
                return Err(NetworkError::InvalidInput(
                    "to_cuda: the model trains on wgpu; call to_cpu() first".into(),
                ))
            }
            LmEngine::Cpu(_) => {}
        }
        self.refuse_q4("to_cuda")?;
        let device = crate::lm::cuda::device_copy(self.model(), ordinal, budget_mib)?;
        let LmEngine::Cpu(host) = std::mem::replace(&mut self.engine, placeholder()?) else {
            unreachable!("checked above")
        };
        self.engine = LmEngine::Cuda(Box::new(DeviceLm { host, device, synced: true }));
        Ok(())
    }
    /// Copies the weights, gradients, moments and step count from the training device
    /// (CUDA, wgpu) to the host copy, which `save_bin`, `save_optimizer_state` and
    /// `named_parameters` read. A no-op on the CPU.
    pub fn sync_from_device(&mut self) -> Result<()> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device_mut() {
            if !d.synced() {
                d.sync()?;
            }
        }
        Ok(())
    }
    /// Brings a model that trains on a device back to the CPU (everything
    /// `sync_from_device` copies), and frees its device memory. A no-op on the CPU; an
    /// int8 model on wgpu stays there.
    pub fn to_cpu(&mut self) -> Result<()> {
        self.sync_from_device()?;
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if self.on_device().is_some() {
            let host = match std::mem::replace(&mut self.engine, placeholder()?) {
                #[cfg(feature = "gpu")]
                LmEngine::Wgpu(w) => w.host,
                #[cfg(feature = "cuda-backend")]
                LmEngine::Cuda(c) => c.host,
                _ => unreachable!("checked above"),
            };
            self.engine = LmEngine::Cpu(host);
        }
        Ok(())
    }
    /// Moves the model to the default GPU (feature `gpu`): Metal on a Mac, Vulkan or DX12
    /// elsewhere, WebGPU in a browser. Errors (no adapter, a model over the adapter's
    /// limits) never fall back to the CPU.
    ///
    /// An f32 model trains there: weights, gradients, optimizer moments and the step count
    /// move, and `train_step`, `accumulate_step`, `step`, `step_clipped`, `evaluate`,
    /// `forward_batch` and decoding run on the device, through the same model code as on
    /// the CPU. Call [`TransformerLm::sync_from_device`] before `save_bin`, or
    /// [`TransformerLm::to_cpu`] to come back. Mixed precision rounds the GEMMs' operands
    /// to bf16 in the WGSL kernels, as on the CPU.
    ///
    /// An int8 model (after [`TransformerLm::quantize`] or a Q8 `load_bin`) is decoded
    /// there: `generate`, `generate_with`, `decoder` and `forward_cached` run on the
    /// device, through the same model code, its experts routed on the device; greedy
    /// decoding reads back one id per token. An int8 weight larger than one storage
    /// binding (`max_binding`; 128 MiB on WebGPU, more natively) is bound in row slabs;
    /// an f32 tensor, a KV-cache layer or one position's logits or scores over it is an
    /// error naming it before anything is copied, and the model stays usable on the CPU.
    #[cfg(feature = "gpu")]
    pub fn to_gpu(&mut self) -> Result<()> {
        self.to_gpu_with(&crate::GpuOptions { high_performance: true, ..Default::default() })
    }
    /// [`TransformerLm::to_gpu`] with adapter options: `software` asks for the fallback
    /// adapter (Mesa's lavapipe on Linux, what the tests run on), `max_binding` caps the
    /// bytes per storage binding.
    #[cfg(feature = "gpu")]
    pub fn to_gpu_with(&mut self, options: &crate::GpuOptions) -> Result<()> {
        match self.engine {
            LmEngine::Wgpu(_) => return Ok(()),
            #[cfg(feature = "cuda-backend")]
            LmEngine::Cuda(_) => {
                return Err(NetworkError::InvalidInput(
                    "to_gpu: the model trains on CUDA; call to_cpu() first".into(),
                ))
            }
            LmEngine::Cpu(_) => {}
        }
        let device = DeviceLm::copy_of(self.model(), crate::backend::gpu::open(options)?)?;
        let LmEngine::Cpu(host) = std::mem::replace(&mut self.engine, placeholder()?) else {
            unreachable!("checked above")
        };
        self.engine = LmEngine::Wgpu(Box::new(DeviceLm { host, device, synced: true }));
        Ok(())
    }
    /// The copy bandwidth (GB/s) of the adapter the model runs on, over a buffer of
    /// `bytes`: the bound a decode step's weight reads are measured against. `None` on
    /// the CPU.
    #[cfg(feature = "gpu")]
    pub fn device_bandwidth(&self, bytes: usize) -> Result<Option<f64>> {
        match &self.engine {
            LmEngine::Wgpu(w) => Ok(Some(w.device.backend.gpu().copy_bandwidth(bytes, 20)?)),
            _ => Ok(None),
        }
    }
    /// What the wgpu device has been asked for since it opened (buffers, bind groups,
    /// submissions, dispatches), or `None` off wgpu: the difference over a decode step or
    /// a training step shows what the step records and whether it allocates.
    #[cfg(feature = "gpu")]
    pub fn gpu_counters(&self) -> Option<rusting_brain_shaders::GpuCounters> {
        match &self.engine {
            LmEngine::Wgpu(w) => Some(w.device.backend.counters()),
            _ => None,
        }
    }
    /// The adapter the model runs on, or `None` on the CPU.
    pub fn device(&self) -> Option<String> {
        match &self.engine {
            LmEngine::Cpu(_) => None,
            #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
            _ => self.on_device().map(|d| d.device_name()),
        }
    }
    /// The architecture.
    pub fn config(&self) -> &TransformerConfig {
        &self.model().config
    }
    /// Sets the longest sequence the model takes (training windows, and what a KV cache
    /// holds). A published model's context can be far more than a machine's memory wants:
    /// Llama 3.1's 131,072 positions make 8.6 GB of KV cache at 1B parameters and 34 GB at
    /// 8B (`n_layers x 2 x max_seq_len x kv_dim x 4 bytes`), allocated at the first
    /// `forward_cached`. `save_pretrained` still writes the context the directory had.
    /// Set it on the CPU, before `to_gpu` / `to_cuda`; caches and decoders made before are
    /// refused afterwards.
    pub fn set_max_seq_len(&mut self, n: usize) -> Result<()> {
        if self.device().is_some() {
            return Err(NetworkError::InvalidInput(
                "set_max_seq_len: the model is on a device; set it on the CPU, before to_gpu or to_cuda"
                    .into(),
            ));
        }
        Ok(self.model_mut().set_max_seq_len(n)?)
    }
    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u64 {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return d.steps();
        }
        self.model().step
    }
    /// Parameters in all, and those a token uses (they differ with experts).
    pub fn parameter_counts(&self) -> ParameterCounts {
        let c = self.config();
        let dense = TransformerConfig { moe: None, ..c.clone() };
        let sparse = c.moe.as_ref().and_then(|m| m.layers.first()).map_or((0, 0), |&l| c.layer_parameters(l));
        ParameterCounts {
            total: c.parameter_count(),
            active: c.active_parameter_count(),
            embedding: c.vocab_size * c.d_model,
            per_layer: dense.layer_parameters(0).0,
            per_sparse_layer: sparse.0,
            per_sparse_layer_active: sparse.1,
        }
    }
    /// Expert usage of the last forward pass: per sparse layer, the fraction of routed
    /// token slots each expert received (1 / n_experts each when perfectly balanced).
    /// Empty for a dense model.
    pub fn expert_usage(&self) -> Vec<Vec<f64>> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return d.expert_usage();
        }
        self.model().expert_usage().to_vec()
    }
    /// With `true`, every GEMM rounds its operands to bfloat16 and accumulates in f32; the
    /// master weights, gradients and optimizer state stay f32. On a CPU with AVX512_BF16
    /// (Zen 4 and later, Sapphire Rapids and later) the GEMMs run on its bf16 dot-product
    /// instruction, twice the f32 multiply-adds an instruction; on other CPUs this changes
    /// the numerics to match a BF16 GPU run but not the speed. On CUDA the GEMMs run on BF16
    /// tensor cores and attention takes the BF16 flash kernels (head size 64 or 128).
    pub fn set_mixed_precision(&mut self, on: bool) {
        let p = if on { OperandPrecision::Bf16 } else { OperandPrecision::F32 };
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device_mut() {
            d.set_precision(p);
            return;
        }
        self.model_mut().precision = p;
    }
    fn step_error(&self, source: CoreError) -> NetworkError {
        NetworkError::Step { step: self.steps() + 1, source }
    }
    /// One step on equal-length sequences: zero the gradients, forward, backward, update.
    pub fn train_step(&mut self, seqs: &[Vec<u32>]) -> Result<StepLoss> {
        let batch = TokenBatch::new(seqs)?;
        self.train_step_batch(&batch)
    }
    /// [`TransformerLm::train_step`] on a prepared batch.
    pub fn train_step_batch(&mut self, batch: &TokenBatch) -> Result<StepLoss> {
        self.zero_grad()?;
        let loss = self.accumulate_step(batch)?;
        self.step(1.0)?;
        Ok(loss)
    }
    /// Forward and loss only: no gradients, no step.
    pub fn evaluate(&mut self, batch: &TokenBatch) -> Result<StepLoss> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device_mut() {
            return Ok(StepLoss::from_sum(d.evaluate(batch)?));
        }
        let s = self.model_mut().evaluate(batch).map_err(NetworkError::from)?;
        Ok(StepLoss::from_sum(s))
    }
    /// Zeroes the accumulated gradients (`accumulate_step` adds to them).
    pub fn zero_grad(&mut self) -> Result<()> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device_mut() {
            return Ok(d.zero_grad()?);
        }
        Ok(self.model_mut().zero_grad()?)
    }
    /// Adds this micro-batch's gradients (of its mean loss) to the accumulated ones.
    pub fn accumulate_step(&mut self, batch: &TokenBatch) -> Result<StepLoss> {
        let r = self.accumulate_where_it_is(batch);
        let s = r.map_err(|e| match e {
            e @ CoreError::NonFinite { .. } => self.step_error(e),
            e => NetworkError::from(e),
        })?;
        Ok(StepLoss::from_sum(s))
    }
    /// Updates the weights with the accumulated gradients times `scale` (`1 / micro-batches`
    /// for their mean). Refuses, changing nothing, when a gradient is NaN or infinite.
    pub fn step(&mut self, scale: f32) -> Result<()> {
        let norm = self.grad_norm(scale)?;
        if !norm.is_finite() {
            return Err(self.step_error(CoreError::NonFinite { op: "gradient norm", value: norm }));
        }
        self.apply_step(scale)
    }
    /// The global L2 norm of the accumulated gradients times `scale`, on the device the
    /// model is on (on CUDA: one read-back for all tensors).
    fn grad_norm(&self, scale: f32) -> Result<f64> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return Ok(d.grad_norm(scale)?);
        }
        Ok(self.model().grad_norm(scale)?)
    }
    /// Forward and backward of a micro-batch on whichever device holds the model.
    fn accumulate_where_it_is(&mut self, batch: &TokenBatch) -> Result<LossSum, CoreError> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device_mut() {
            return d.accumulate(batch);
        }
        self.model_mut().accumulate(batch)
    }
    /// One optimizer step with the gradients times `scale`, where the model is.
    fn apply_step(&mut self, scale: f32) -> Result<()> {
        let opt = self.optimizer;
        let r = self.step_where_it_is(&opt, scale);
        r.map_err(|e| self.step_error(e))
    }
    fn step_where_it_is(&mut self, opt: &Optimizer, scale: f32) -> Result<(), CoreError> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device_mut() {
            return d.step(opt, scale);
        }
        self.model_mut().step(opt, scale)
    }
    /// [`TransformerLm::step`] with the (scaled) gradients clipped to a global L2 norm of
    /// `max_norm` first; returns the norm before clipping.
    pub fn step_clipped(&mut self, scale: f32, max_norm: f32) -> Result<f32> {
        if !(max_norm.is_finite() && max_norm > 0.0) {
            return Err(NetworkError::InvalidInput(format!(
                "step_clipped: max_norm {max_norm} must be finite and > 0"
            )));
        }
        let norm = self.grad_norm(scale)?;
        if !norm.is_finite() {
            return Err(self.step_error(CoreError::NonFinite { op: "gradient norm", value: norm }));
        }
        let clip = if norm > max_norm as f64 { (max_norm as f64 / norm) as f32 } else { 1.0 };
        self.apply_step(scale * clip)?;
        Ok(norm as f32)
    }
    /// Logits of a batch on the host, `(batch * seq, vocab)` row-major.
    pub fn forward_batch(&mut self, batch: &TokenBatch) -> Result<Vec<f32>> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device_mut() {
            return Ok(d.forward_logits(batch)?);
        }
        Ok(self.model_mut().forward_logits(batch)?)
    }
    /// Rounds the weights to int8 (blocks of 32 values, a scale each; norms stay f32): about
    /// a quarter of the memory traffic per decoded token. One-way: training, `save_bin(Precision::F32)` and
    /// device moves return an error afterwards.
    pub fn quantize(&mut self) -> Result<()> {
        self.quantize_to(crate::Precision::Q8)
    }
    /// [`TransformerLm::quantize`] to a precision: `Precision::Q8` is `quantize()`,
    /// `Precision::Q4` rounds each block's matrices to 4 bits (the embedding and output head
    /// stay int8; 4-bit models run on the CPU and wgpu). `Precision::F32` is an error: rounding is
    /// one-way. A model already quantized is left as it is.
    pub fn quantize_to(&mut self, precision: crate::Precision) -> Result<()> {
        let format = precision.format().ok_or_else(|| {
            NetworkError::InvalidInput(
                "quantize_to(F32): an f32 model is not quantized; pass Q8 or Q4".into(),
            )
        })?;
        self.refuse_on_device("quantize", "call to_cpu() first")?;
        self.model_mut().quantize_as(format)?;
        // An int8 step takes a fraction of an f32 one: time the ways afresh.
        self.decode_steps = Default::default();
        Ok(())
    }
    /// Bytes the host copy's weights and training state hold: f32 parameters, gradients and
    /// optimizer moments where there are any, int8 matrices and their scales after
    /// [`TransformerLm::quantize`]. KV caches and a forward pass's scratch are not counted.
    pub fn weight_bytes(&self) -> usize {
        self.model().weight_bytes()
    }
    /// A 4-bit model stays off CUDA: its kernels read int8 weights only (the CPU and wgpu
    /// run 4-bit weights).
    #[allow(dead_code)] // without the CUDA feature nothing moves there
    fn refuse_q4(&self, what: &str) -> Result<()> {
        if self.model().has_q4() {
            return Err(NetworkError::InvalidInput(format!(
                "{what}: the model is 4-bit (Precision::Q4), which runs on the CPU and wgpu; load it at Precision::Q8 to move it to CUDA"
            )));
        }
        Ok(())
    }
    /// The precision the weights are held at: F32, Q8 after [`TransformerLm::quantize`] or
    /// an int8 load, Q4 after `quantize_to(Precision::Q4)` or a 4-bit load.
    pub fn precision(&self) -> crate::Precision {
        match (self.is_quantized(), self.model().has_q4()) {
            (false, _) => crate::Precision::F32,
            (true, false) => crate::Precision::Q8,
            (true, true) => crate::Precision::Q4,
        }
    }
    /// Whether [`TransformerLm::quantize`] has run.
    pub fn is_quantized(&self) -> bool {
        self.model().quantized.is_some()
    }
}
