//! `TransformerLm`: a decoder-only language model — build, train, evaluate.

use std::fmt;

use rusting_brain_core::models::transformer::{
    Conversation, KvCache, LoraConfig, LossSum, MoeConfig, Reply, TokenBatch, TransformerConfig,
    TransformerModel, Turn,
};
use rusting_brain_core::{CoreError, Optimizer, Precision, RopeScaling, Sampler};

use crate::backend::cpu::CpuBackend;
#[cfg(any(feature = "gpu", feature = "cuda-backend"))]
use crate::lm::device::{DeviceLm, OnDevice};
use crate::{NetworkError, Result};

/// The loss of one step or evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLoss {
    /// Mean next-token cross-entropy over the positions that count (nats).
    pub lm_loss: f32,
    /// How many positions counted.
    pub tokens: usize,
    /// Switch-Transformer load-balancing loss, averaged over the sparse layers: 1 when
    /// the experts share the routed tokens evenly, up to `n_experts / top_k`. 0 for a
    /// dense model. Enters the objective times `load_balance_coef`.
    pub load_balance_loss: f32,
    /// ST-MoE router z-loss (mean squared log-sum-exp of the router logits), averaged
    /// over the sparse layers; 0 for a dense model. Enters times `router_z_coef`.
    pub router_z_loss: f32,
}

impl StepLoss {
    /// `exp(lm_loss)`.
    pub fn perplexity(&self) -> f32 {
        self.lm_loss.exp()
    }
    fn from_sum(s: LossSum) -> StepLoss {
        StepLoss {
            lm_loss: (s.sum / s.count.max(1) as f64) as f32,
            tokens: s.count,
            load_balance_loss: s.load_balance as f32,
            router_z_loss: s.router_z as f32,
        }
    }
}

/// Parameter counts; `Display` prints like "38.9M total, 38.9M active".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParameterCounts {
    /// Every parameter, the tied embedding counted once, norms included.
    pub total: usize,
    /// Parameters a token passes through (all of them for a dense model).
    pub active: usize,
    /// The token embedding (which is also the output head).
    pub embedding: usize,
    /// One dense transformer block.
    pub per_layer: usize,
    /// One sparse block: every expert, the router, the shared expert (0 without experts).
    pub per_sparse_layer: usize,
    /// What one token passes through in a sparse block (0 without experts).
    pub per_sparse_layer_active: usize,
}

fn human(n: usize) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

impl fmt::Display for ParameterCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} total, {} active", human(self.total), human(self.active))
    }
}

/// Collects the architecture; see [`TransformerLm::builder`].
#[derive(Debug, Clone)]
pub struct TransformerLmBuilder {
    config: TransformerConfig,
    optimizer: Optimizer,
    seed: u64,
    moe: MoeOptions,
}

/// The mixture-of-experts settings as given to the builder, resolved at `build`.
#[derive(Debug, Clone, Default)]
struct MoeOptions {
    experts: Option<(usize, usize)>,
    layers: Option<Vec<usize>>,
    shared_expert: Option<bool>,
    expert_d_ff: Option<usize>,
    load_balance_coef: Option<f32>,
    router_z_coef: Option<f32>,
    renormalize: Option<bool>,
}

impl MoeOptions {
    fn resolve(&self, config: &TransformerConfig) -> Result<Option<MoeConfig>> {
        let Some((n_experts, top_k)) = self.experts else {
            let set = self.layers.is_some()
                || self.shared_expert.is_some()
                || self.expert_d_ff.is_some()
                || self.load_balance_coef.is_some()
                || self.router_z_coef.is_some()
                || self.renormalize.is_some();
            if set {
                return Err(NetworkError::InvalidConfig(
                    "mixture-of-experts options were set without .experts(n_experts, top_k)".into(),
                ));
            }
            return Ok(None);
        };
        let mut layers = self.layers.clone().unwrap_or_else(|| (0..config.n_layers).collect());
        layers.sort_unstable();
        layers.dedup();
        Ok(Some(MoeConfig {
            n_experts,
            top_k,
            layers,
            shared_expert: self.shared_expert.unwrap_or(false),
            expert_d_ff: self.expert_d_ff.unwrap_or(config.d_ff),
            load_balance_coef: self.load_balance_coef.unwrap_or(0.01),
            router_z_coef: self.router_z_coef.unwrap_or(0.001),
            renormalize: self.renormalize.unwrap_or(top_k > 1),
        }))
    }
}

impl TransformerLmBuilder {
    /// Vocabulary size (required).
    pub fn vocab_size(mut self, n: usize) -> Self {
        self.config.vocab_size = n;
        self
    }
    /// Model width (required).
    pub fn d_model(mut self, n: usize) -> Self {
        self.config.d_model = n;
        self
    }
    /// Transformer blocks (required).
    pub fn n_layers(mut self, n: usize) -> Self {
        self.config.n_layers = n;
        self
    }
    /// Query heads, key/value heads (grouped-query attention when fewer), head size.
    pub fn heads(mut self, q_heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        self.config.q_heads = q_heads;
        self.config.kv_heads = kv_heads;
        self.config.head_dim = head_dim;
        self
    }
    /// Hidden width of the SwiGLU feed-forward.
    pub fn d_ff(mut self, n: usize) -> Self {
        self.config.d_ff = n;
        self
    }
    /// The longest sequence (prompt and reply) the model takes (required).
    pub fn max_seq_len(mut self, n: usize) -> Self {
        self.config.max_seq_len = n;
        self
    }
    /// RoPE base (default 10000).
    pub fn rope_theta(mut self, theta: f32) -> Self {
        self.config.rope_theta = theta;
        self
    }
    /// Stretched rotary frequencies for a context longer than the one trained on
    /// (`RopeScaling::Linear` or Llama 3.1's `RopeScaling::Llama3`; default none).
    pub fn rope_scaling(mut self, scaling: RopeScaling) -> Self {
        self.config.rope_scaling = scaling;
        self
    }
    /// RMSNorm epsilon (default 1e-5).
    pub fn norm_eps(mut self, eps: f32) -> Self {
        self.config.norm_eps = eps;
        self
    }
    /// Whether the output head is the token embedding (the default) or a matrix of its own
    /// (`lm_head.weight`, as Llama and Mistral have it).
    pub fn tie_embeddings(mut self, tied: bool) -> Self {
        self.config.tie_embeddings = tied;
        self
    }
    /// Biases on the query, key and value projections, as Qwen2 has them (default off).
    pub fn qkv_bias(mut self, on: bool) -> Self {
        self.config.qkv_bias = on;
        self
    }
    /// RMSNorm over each query and key head before RoPE, as Qwen3 has it (default off).
    pub fn qk_norm(mut self, on: bool) -> Self {
        self.config.qk_norm = on;
        self
    }
    /// Makes feed-forward layers sparse: `n_experts` SwiGLU experts, of which each token
    /// goes to the `top_k` its router rates highest (dropless: no capacity limit, no token
    /// is ever skipped). Which layers: [`TransformerLmBuilder::moe_layers`], all by default.
    pub fn experts(mut self, n_experts: usize, top_k: usize) -> Self {
        self.moe.experts = Some((n_experts, top_k));
        self
    }
    /// The sparse layers, as a range (`2..8`) or any set of indices; the others stay
    /// dense. Default: every layer, once experts are set.
    pub fn moe_layers(mut self, layers: impl IntoIterator<Item = usize>) -> Self {
        self.moe.layers = Some(layers.into_iter().collect());
        self
    }
    /// Adds one always-active SwiGLU expert of width `expert_d_ff` to each sparse layer,
    /// its output added unweighted to the routed experts' (default off).
    pub fn shared_expert(mut self, on: bool) -> Self {
        self.moe.shared_expert = Some(on);
        self
    }
    /// Hidden width of each expert (default `d_ff`).
    pub fn expert_d_ff(mut self, n: usize) -> Self {
        self.moe.expert_d_ff = Some(n);
        self
    }
    /// Weight of the load-balancing loss in the objective (default 0.01).
    pub fn load_balance_coef(mut self, coef: f32) -> Self {
        self.moe.load_balance_coef = Some(coef);
        self
    }
    /// Weight of the router z-loss in the objective (default 0.001).
    pub fn router_z_coef(mut self, coef: f32) -> Self {
        self.moe.router_z_coef = Some(coef);
        self
    }
    /// Whether each token's `top_k` routing weights are rescaled to sum to one (Mixtral)
    /// or left as the router's probabilities (Switch). Default: on for `top_k >= 2`, off
    /// for `top_k == 1`, where renormalizing would make every weight 1 and leave the
    /// router nothing to learn from the language-model loss.
    pub fn renormalize_top_k(mut self, on: bool) -> Self {
        self.moe.renormalize = Some(on);
        self
    }
    /// Default `Optimizer::adam(3e-4)`; weight decay never applies to norm weights.
    pub fn optimizer(mut self, optimizer: Optimizer) -> Self {
        self.optimizer = optimizer;
        self
    }
    /// Seed of the initialization (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Builds the model with weights drawn from the seed, or says why the configuration is invalid.
    pub fn build(mut self) -> Result<TransformerLm> {
        self.config.moe = self.moe.resolve(&self.config)?;
        self.config.validate().map_err(|e| NetworkError::InvalidConfig(e.to_string()))?;
        self.optimizer.validate().map_err(|e| NetworkError::InvalidConfig(e.to_string()))?;
        let model = TransformerModel::new(CpuBackend::new(), self.config, self.seed)?;
        Ok(TransformerLm {
            engine: LmEngine::Cpu(model),
            optimizer: self.optimizer,
            origin: None,
            decode_steps: Default::default(),
        })
    }
}

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
    let config = TransformerConfig {
        vocab_size: 1,
        d_model: 2,
        n_layers: 1,
        q_heads: 1,
        kv_heads: 1,
        head_dim: 2,
        d_ff: 1,
        max_seq_len: 1,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        tie_embeddings: true,
        qkv_bias: false,
        qk_norm: false,
        rope_scaling: Default::default(),
        moe: None,
    };
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
            config: TransformerConfig {
                vocab_size: 0,
                d_model: 0,
                n_layers: 0,
                q_heads: 0,
                kv_heads: 0,
                head_dim: 0,
                d_ff: 0,
                max_seq_len: 0,
                rope_theta: 10_000.0,
                norm_eps: 1e-5,
                tie_embeddings: true,
                qkv_bias: false,
                qk_norm: false,
                rope_scaling: Default::default(),
                moe: None,
            },
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
        let gpu = rusting_brain_shaders::Gpu::new_blocking(options)?;
        let backend = rusting_brain_shaders::WgpuBackend::new(std::sync::Arc::new(gpu));
        let device = DeviceLm::copy_of(self.model(), backend)?;
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
        let p = if on { Precision::Bf16 } else { Precision::F32 };
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

    /// Empty key/value caches for one sequence of up to `max_seq_len` positions. They are
    /// allocated on the model's device at the first `forward_cached`, which reports a
    /// failed allocation.
    pub fn new_kv_caches(&self) -> KvCaches {
        KvCaches { inner: None }
    }

    /// The caches' buffers on the model's device.
    fn make_caches(&self) -> Result<CacheEngine> {
        Ok(match &self.engine {
            LmEngine::Cpu(m) => CacheEngine::Cpu(m.new_kv_caches()?),
            #[cfg(feature = "gpu")]
            LmEngine::Wgpu(w) => CacheEngine::Wgpu(
                w.device.new_kv_caches()?,
                Box::new(rusting_brain_shaders::DeviceSampler::new(
                    &w.device.backend,
                    w.device.config.vocab_size,
                )?),
            ),
            #[cfg(feature = "cuda-backend")]
            LmEngine::Cuda(c) => CacheEngine::Cuda(c.device.new_kv_caches()?),
        })
    }

    /// The caches' buffers, made on the model's device the first time they are used.
    fn caches<'c>(&self, caches: &'c mut KvCaches) -> Result<&'c mut CacheEngine> {
        Ok(match &mut caches.inner {
            Some(c) => c,
            empty => empty.insert(self.make_caches()?),
        })
    }

    /// Runs `ids` after what `caches` holds and returns the logits of the last new position
    /// (`vocab_size` values): prefill with the whole prompt, then one call per token.
    pub fn forward_cached(&mut self, ids: &[u32], caches: &mut KvCaches) -> Result<Vec<f32>> {
        let inner = self.caches(caches)?;
        match (&mut self.engine, inner) {
            (LmEngine::Cpu(m), CacheEngine::Cpu(c)) => Ok(m.forward_cached(ids, c)?),
            #[cfg(feature = "cuda-backend")]
            (LmEngine::Cuda(m), CacheEngine::Cuda(c)) => Ok(m.device.forward_cached(ids, c)?),
            #[cfg(feature = "gpu")]
            (LmEngine::Wgpu(m), CacheEngine::Wgpu(c, _)) => Ok(m.device.forward_cached(ids, c)?),
            #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
            _ => Err(NetworkError::InvalidInput(
                "these KV caches belong to another device; make them with new_kv_caches() after the model moved"
                    .into(),
            )),
        }
    }

    /// Runs `ids` and leaves the logits where they are: on wgpu, only the argmax is read
    /// back when the sampler is greedy.
    fn advance(&mut self, ids: &[u32], caches: &mut KvCaches) -> Result<Pending> {
        let inner = self.caches(caches)?;
        match (&mut self.engine, inner) {
            #[cfg(feature = "gpu")]
            (LmEngine::Wgpu(m), CacheEngine::Wgpu(c, _)) => {
                m.device.forward_cached_on_device(ids, c)?;
                Ok(Pending::Device)
            }
            (LmEngine::Cpu(_), _) if ids.len() == 1 => {
                // A decode step: split over the thread team or on this thread alone,
                // whichever has lately been faster for this model (cpu::team::DecodeSteps).
                let step = self.decode_steps.begin();
                let logits = self.forward_cached(ids, caches);
                self.decode_steps.end(step);
                Ok(Pending::Host(logits?))
            }
            _ => Ok(Pending::Host(self.forward_cached(ids, caches)?)),
        }
    }

    /// The next id from the pending logits.
    fn draw(
        &mut self, pending: &Pending, sampler: &mut Sampler, context: &[u32], caches: &mut KvCaches,
    ) -> Result<u32> {
        #[cfg(not(feature = "gpu"))]
        let _ = caches;
        match pending {
            Pending::Host(logits) => Ok(sampler.sample(logits, context)?),
            #[cfg(feature = "gpu")]
            Pending::Device => match (&self.engine, &mut caches.inner) {
                (LmEngine::Wgpu(m), Some(CacheEngine::Wgpu(_, draw))) => {
                    let logits = m.device.cached_logits().ok_or_else(left)?;
                    Ok(rusting_brain_shaders::block_on(draw.draw(
                        &m.device.backend,
                        logits,
                        sampler,
                        context,
                    ))?)
                }
                _ => Err(left()),
            },
        }
    }

    /// Prefills a fresh cache with `prompt`, then decodes up to `max_new` tokens; returns the
    /// new ids.
    pub fn generate(&mut self, prompt: &[u32], max_new: usize, sampler: &mut Sampler) -> Result<Vec<u32>> {
        self.generate_with(prompt, max_new, sampler, |_| true)
    }

    /// [`TransformerLm::generate`], handing each id to `on_token` as it is decoded; returning
    /// `false` stops (the id that stopped it is kept).
    pub fn generate_with(
        &mut self, prompt: &[u32], max_new: usize, sampler: &mut Sampler,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        let mut decoder = self.decoder();
        decoder.feed(prompt)?;
        // Core's reply loop (the browser engine's too); the last id is not read, as
        // nothing follows it.
        let mut reply = Reply::new(max_new, None);
        while reply.before_draw().is_none() {
            let id = decoder.draw(sampler)?;
            match reply.drawn(&mut decoder.conversation, id, &mut on_token) {
                Turn::Feed { stop: false } => decoder.feed(&[id])?,
                Turn::Feed { stop: true } | Turn::Done(_) => break,
            }
        }
        Ok(reply.into_ids())
    }

    /// A decoding session that keeps its caches between calls: feed a turn, draw tokens,
    /// feed the next turn, and only the new tokens are read.
    pub fn decoder(&mut self) -> Decoder<'_> {
        let caches = self.new_kv_caches();
        Decoder { conversation: Conversation::new(self.config()), model: self, caches, pending: None }
    }

    /// Rounds the weights to int8 (per-row absmax scales; norms stay f32): a quarter of the
    /// memory traffic per decoded token. One-way: training, `save_bin(Precision::F32)` and
    /// device moves return an error afterwards.
    pub fn quantize(&mut self) -> Result<()> {
        self.refuse_on_device("quantize", "call to_cpu() first")?;
        self.model_mut().quantize()?;
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

    /// Whether [`TransformerLm::quantize`] has run.
    pub fn is_quantized(&self) -> bool {
        self.model().quantized.is_some()
    }

    /// Writes the configuration and weights (safetensors, atomically). With adapters
    /// attached this is the frozen base alone: `save_lora` writes the adapters, or
    /// `merge_lora` first makes one checkpoint of both.
    pub fn save_bin(&self, path: impl AsRef<std::path::Path>, precision: crate::Precision) -> Result<()> {
        if self.is_quantized() && precision == crate::Precision::F32 {
            return Err(NetworkError::InvalidInput(
                "save_bin(F32): the model is quantized and its f32 weights are gone; save the f32 model before quantize()".into(),
            ));
        }
        self.host_current("save_bin")?;
        crate::lm::checkpoint::save_weights(self.model(), path.as_ref(), precision)
    }

    /// Reads a checkpoint written by [`TransformerLm::save_bin`]; the optimizer starts at
    /// the builder's default until [`TransformerLm::load_optimizer_state`].
    pub fn load_bin(path: impl AsRef<std::path::Path>) -> Result<TransformerLm> {
        let model = crate::lm::checkpoint::load_weights(path.as_ref())?;
        Ok(TransformerLm {
            engine: LmEngine::Cpu(model),
            optimizer: Optimizer::adam(3e-4),
            origin: None,
            decode_steps: Default::default(),
        })
    }

    /// Reads a Hugging Face directory (`config.json` and `model.safetensors`, or shards with
    /// `model.safetensors.index.json`) of a `LlamaForCausalLM`, `MistralForCausalLM`,
    /// `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MixtralForCausalLM` or
    /// `Qwen3MoeForCausalLM`, in f32. Tensors may be F32, BF16 or F16; RoPE may be scaled
    /// (`linear`, `llama3`). Whatever the configuration asks for that this model does not
    /// compute (a sliding window shorter than the context, an output-projection bias,
    /// another RoPE type, Qwen2-MoE's gated shared expert) is an error naming the file and
    /// the key.
    pub fn from_pretrained(dir: impl AsRef<std::path::Path>) -> Result<TransformerLm> {
        Self::from_pretrained_at(dir, crate::Precision::F32)
    }

    /// [`TransformerLm::from_pretrained`] at a precision: `Precision::Q8` rounds each
    /// matrix to int8 a slab of rows at a time as it is read, so the f32 model is never held
    /// (the peak is the int8 model plus the f32 norms and biases).
    pub fn from_pretrained_at(
        dir: impl AsRef<std::path::Path>, precision: crate::Precision,
    ) -> Result<TransformerLm> {
        let (model, origin) = crate::io::hf::load(dir.as_ref(), precision)?;
        Ok(TransformerLm {
            engine: LmEngine::Cpu(model),
            optimizer: Optimizer::adam(3e-4),
            origin: Some(origin),
            decode_steps: Default::default(),
        })
    }

    /// Writes a Hugging Face directory that `transformers`' `AutoModelForCausalLM` loads:
    /// F32 `model.safetensors` (sharded past 5 GB), `config.json` and
    /// `generation_config.json`. The class is the one the model was loaded as, else the
    /// one that computes it: `LlamaForCausalLM` (dense), `Qwen2ForCausalLM` (q/k/v biases),
    /// `Qwen3ForCausalLM` (per-head q/k norms), `MixtralForCausalLM` (every block sparse,
    /// top-k renormalized, no shared expert) or `Qwen3MoeForCausalLM` (sparse with q/k
    /// norms). Files already in `dir` (a tokenizer) stay.
    pub fn save_pretrained(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        self.save_pretrained_sharded(dir, 5_000_000_000)
    }

    /// [`TransformerLm::save_pretrained`] with shards of at most `max_shard_bytes` (one
    /// tensor larger than that gets a shard of its own).
    pub fn save_pretrained_sharded(
        &self, dir: impl AsRef<std::path::Path>, max_shard_bytes: usize,
    ) -> Result<()> {
        if self.is_quantized() {
            return Err(NetworkError::InvalidInput(
                "save_pretrained: the model is quantized and its f32 weights are gone; save before quantize()".into(),
            ));
        }
        self.host_current("save_pretrained")?;
        crate::io::hf::save(self.model(), self.origin.as_ref(), dir.as_ref(), max_shard_bytes)
    }

    /// Attaches a low-rank adapter (LoRA) to every projection `config` targets (by default
    /// all attention and feed-forward projections, a mixture-of-experts layer's experts
    /// and shared expert included) and freezes every other weight: the base keeps its
    /// values but its gradients and Adam moments are freed, so training holds the weights
    /// once plus the adapters four times. `A` starts Kaiming-uniform and `B` at zero, as
    /// PEFT makes them, so the model predicts exactly what it did; `zero_grad`,
    /// `accumulate_step`, `step` and `step_clipped` then train the adapters alone.
    ///
    /// An int8 base (after [`TransformerLm::quantize`] or a Q8 checkpoint) works too: the
    /// adapters train in f32 on it, and the backward pass dequantizes one matrix at a
    /// time. A host operation: call it before `to_cuda`/`to_gpu`, or after `to_cpu`.
    ///
    /// ```
    /// use rusting_brain::{LoraConfig, TokenBatch, TransformerLm};
    ///
    /// let mut model = TransformerLm::builder()
    ///     .vocab_size(64).d_model(32).n_layers(2).heads(4, 2, 8).d_ff(64).max_seq_len(16)
    ///     .build()?;
    /// let batch = TokenBatch::new(&[vec![1, 2, 3, 4, 5]])?;
    /// let before = model.forward_batch(&batch)?;
    /// model.add_lora(LoraConfig::new(4).alpha(8.0))?;
    /// assert_eq!(model.forward_batch(&batch)?, before); // B starts at zero
    /// assert_eq!(model.trainable_parameters(), 2 * 4 * (64 + 48 + 48 + 64 + 3 * 96));
    /// model.train_step_batch(&batch)?; // the adapters move, the base does not
    /// let path = std::env::temp_dir().join("rb-doc-adapter.rbl");
    /// model.save_lora(&path)?;
    /// model.merge_lora()?; // an ordinary model again
    /// # std::fs::remove_file(path).ok();
    /// # Ok::<(), rusting_brain::NetworkError>(())
    /// ```
    pub fn add_lora(&mut self, config: LoraConfig) -> Result<()> {
        self.refuse_on_device(
            "add_lora",
            "attach adapters on the host: call to_cpu() first, or attach before moving",
        )?;
        Ok(self.model_mut().add_lora(config, 0x10_4a)?)
    }

    /// The attached adapters' settings, if any.
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.model().lora.as_ref().map(|l| &l.config)
    }

    /// Values the optimizer updates: the adapters' when attached, else every parameter.
    pub fn trainable_parameters(&self) -> usize {
        self.model().trainable_parameters()
    }

    /// Folds the adapters into the weights they adapt (`W += alpha/r * B A`) and unfreezes
    /// the model: an ordinary model, with fresh optimizer state, that predicts what the
    /// adapted one did at no extra cost. A host operation, refused on an int8 base.
    pub fn merge_lora(&mut self) -> Result<()> {
        self.refuse_on_device("merge_lora", "merge on the host: call to_cpu() first")?;
        Ok(self.model_mut().merge_lora()?)
    }

    /// Writes the adapters alone (safetensors with PEFT's tensor names, the settings in
    /// the metadata), atomically: a few megabytes that [`TransformerLm::load_lora`] puts
    /// back on the same base.
    pub fn save_lora(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.host_current("save_lora")?;
        crate::lm::lora::save(self.model(), path.as_ref())
    }

    /// Writes a PEFT adapter directory (`adapter_config.json`, `adapter_model.safetensors`)
    /// that `peft.PeftModel.from_pretrained(base, dir)` loads onto the base in PyTorch.
    pub fn save_lora_peft(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        self.host_current("save_lora_peft")?;
        let base = self.origin.as_ref().map(|o| o.name_or_path());
        crate::lm::lora::save_peft(self.model(), dir.as_ref(), base.as_deref())
    }

    /// Reads adapters written by [`TransformerLm::save_lora`], or a PEFT adapter directory
    /// (LoRA on these projections, biases untrained). Attaches them if none are attached;
    /// otherwise the file must have the same rank, alpha, scaling and targets. A missing,
    /// extra or misshapen tensor is an error naming it, and changes nothing. A host
    /// operation.
    pub fn load_lora(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.refuse_on_device(
            "load_lora",
            "load adapters on the host: call to_cpu() first, or load before moving",
        )?;
        crate::lm::lora::load(self.model_mut(), path.as_ref())
    }

    /// The adapters under PEFT's names (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`),
    /// read from wherever the model is; empty without adapters.
    pub fn lora_parameters(&self) -> Result<Vec<(String, Vec<f32>)>> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return Ok(d.named_adapters(false)?);
        }
        Ok(self.model().named_adapters(false)?)
    }

    /// The adapters' accumulated gradients, named as in [`TransformerLm::lora_parameters`].
    pub fn lora_gradients(&self) -> Result<Vec<(String, Vec<f32>)>> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return Ok(d.named_adapters(true)?);
        }
        Ok(self.model().named_adapters(true)?)
    }

    /// Writes Adam's moments, the step count and the optimizer settings.
    pub fn save_optimizer_state(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        if self.lora_config().is_some() {
            return Err(NetworkError::InvalidInput(
                "save_optimizer_state: adapters are attached and the base has no optimizer state; save the adapters with save_lora".into(),
            ));
        }
        if self.is_quantized() {
            return Err(NetworkError::InvalidInput(
                "save_optimizer_state: a quantized model has no optimizer state".into(),
            ));
        }
        self.host_current("save_optimizer_state")?;
        crate::lm::checkpoint::save_optimizer(self.model(), &self.optimizer, path.as_ref())
    }

    /// Restores what [`TransformerLm::save_optimizer_state`] wrote, settings included.
    pub fn load_optimizer_state(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.refuse_on_device("load_optimizer_state", "load it before moving the model, or after to_cpu()")?;
        if self.lora_config().is_some() {
            return Err(NetworkError::InvalidInput(
                "load_optimizer_state: adapters are attached and the base is frozen; the state belongs to the model before add_lora".into(),
            ));
        }
        let opt = crate::lm::checkpoint::load_optimizer(self.model_mut(), path.as_ref())?;
        self.optimizer = opt;
        Ok(())
    }

    /// Overwrites one parameter by its Hugging Face name (`model.layers.2.mlp.gate.weight`):
    /// model surgery, a weight brought from elsewhere, an experiment's starting point. The
    /// values must match the tensor's size and be finite; the optimizer state is kept.
    pub fn set_parameter(&mut self, name: &str, values: &[f32]) -> Result<()> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device_mut() {
            return Ok(d.set_parameter(name, values)?);
        }
        Ok(self.model_mut().set_parameter(name, values)?)
    }

    /// Every parameter with its Hugging Face name (`LlamaForCausalLM`'s; sparse layers use
    /// the Qwen-MoE names: `mlp.gate.weight` is the router, `mlp.experts.{j}.*` the experts,
    /// `mlp.shared_expert.*` the shared expert).
    pub fn named_parameters(&self) -> Result<Vec<(String, Vec<f32>)>> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return Ok(d.named_parameters()?);
        }
        Ok(self.model().named_parameters()?)
    }

    /// Every accumulated gradient (since the last `zero_grad`) under its parameter's name,
    /// in the order of [`TransformerLm::named_parameters`]: for checking a backward pass
    /// against another framework's, or watching which weights learn. An int8 model has none.
    pub fn named_gradients(&self) -> Result<Vec<(String, Vec<f32>)>> {
        if self.is_quantized() {
            return Err(NetworkError::InvalidInput(
                "named_gradients: a quantized model has no gradients".into(),
            ));
        }
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return Ok(d.named_gradients()?);
        }
        Ok(self.model().named_gradients()?)
    }
}

enum CacheEngine {
    Cpu(KvCache<CpuBackend>),
    #[cfg(feature = "cuda-backend")]
    Cuda(KvCache<crate::backend::cuda::CudaBackend>),
    /// With the draw's buffers, which live beside the logits.
    #[cfg(feature = "gpu")]
    Wgpu(KvCache<rusting_brain_shaders::WgpuBackend>, Box<rusting_brain_shaders::DeviceSampler>),
}

/// The error for logits that are gone: the model moved while a decoder waited.
#[cfg(feature = "gpu")]
fn left() -> NetworkError {
    NetworkError::InvalidInput("the model left the GPU during decoding".into())
}

/// Logits a decoder has not drawn from yet: on the host, or still on the device.
enum Pending {
    Host(Vec<f32>),
    #[cfg(feature = "gpu")]
    Device,
}

/// Key/value caches of one sequence; see [`TransformerLm::new_kv_caches`].
pub struct KvCaches {
    /// `None` until the first use allocates them on the model's device.
    inner: Option<CacheEngine>,
}

impl KvCaches {
    /// Positions held.
    pub fn len(&self) -> usize {
        let Some(inner) = &self.inner else { return 0 };
        match inner {
            CacheEngine::Cpu(c) => c.len(),
            #[cfg(feature = "cuda-backend")]
            CacheEngine::Cuda(c) => c.len(),
            #[cfg(feature = "gpu")]
            CacheEngine::Wgpu(c, _) => c.len(),
        }
    }
    /// No messages.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A conversation's decoding state: the caches and every id fed or drawn so far.
pub struct Decoder<'a> {
    model: &'a mut TransformerLm,
    caches: KvCaches,
    /// The ids so far and the checks a feed passes (core's, as the browser engine's).
    conversation: Conversation,
    /// Logits after the last position, waiting for `next`.
    pending: Option<Pending>,
}

impl Decoder<'_> {
    /// Reads `ids` after everything so far (a prompt, a user's turn). Checked whole
    /// first (ids inside the vocabulary, room in the cache), so a refused call changes
    /// nothing.
    pub fn feed(&mut self, ids: &[u32]) -> Result<()> {
        self.conversation.check_feed(ids)?;
        self.pending = None;
        let pending = self.model.advance(ids, &mut self.caches)?;
        self.conversation.fed(ids);
        self.pending = Some(pending);
        Ok(())
    }

    /// Draws the next token and reads it, so the following call continues from it.
    pub fn next(&mut self, sampler: &mut Sampler) -> Result<u32> {
        let id = self.draw(sampler)?;
        if self.conversation.drawn(id) {
            self.feed(&[id])?;
        }
        Ok(id)
    }

    /// Draws the next token without reading it; the logits are used up only when the
    /// draw succeeds.
    fn draw(&mut self, sampler: &mut Sampler) -> Result<u32> {
        let pending = self
            .pending
            .as_ref()
            .ok_or_else(|| NetworkError::InvalidInput("Decoder::next before any feed".into()))?;
        let id = self.model.draw(pending, sampler, self.conversation.context(), &mut self.caches)?;
        self.pending = None;
        Ok(id)
    }

    /// Whether there are logits to draw from: false before the first feed, and once the
    /// cache is full (`max_seq_len` positions).
    pub fn has_next(&self) -> bool {
        self.pending.is_some()
    }

    /// Every id fed or drawn so far.
    pub fn context(&self) -> &[u32] {
        self.conversation.context()
    }
    /// Positions in the cache.
    pub fn position(&self) -> usize {
        self.caches.len()
    }
    /// The model decoding (its configuration, its device and `TransformerLm::gpu_counters`, feature `gpu`).
    pub fn model(&self) -> &TransformerLm {
        self.model
    }
    /// The most positions the cache can hold (`max_seq_len`).
    pub fn capacity(&self) -> usize {
        self.model.config().max_seq_len
    }
    /// The logits the next draw will use, if any (on a GPU this reads them back).
    pub fn logits(&mut self) -> Result<Option<&[f32]>> {
        #[cfg(feature = "gpu")]
        if let Some(Pending::Device) = self.pending {
            if let LmEngine::Wgpu(m) = &self.model.engine {
                let logits = m.device.cached_logits().ok_or_else(left)?;
                self.pending = Some(Pending::Host(rusting_brain_core::backend::Memory::download(
                    &m.device.backend,
                    logits,
                )?));
            }
        }
        Ok(match &self.pending {
            Some(Pending::Host(l)) => Some(l),
            _ => None,
        })
    }
}
