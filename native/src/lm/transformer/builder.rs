//! `TransformerLm::builder()`: the architecture, the experts and the optimizer, checked when
//! built; the step losses and parameter counts a model reports.

use super::*;

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
    pub(super) fn from_sum(s: LossSum) -> StepLoss {
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

pub(super) fn human(n: usize) -> String {
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
    pub(super) config: TransformerConfig,
    pub(super) optimizer: Optimizer,
    pub(super) seed: u64,
    pub(super) moe: MoeOptions,
}

/// The mixture-of-experts settings as given to the builder, resolved at `build`.
#[derive(Debug, Clone, Default)]
pub(super) struct MoeOptions {
    pub(super) experts: Option<(usize, usize)>,
    pub(super) layers: Option<Vec<usize>>,
    pub(super) shared_expert: Option<bool>,
    pub(super) expert_d_ff: Option<usize>,
    pub(super) load_balance_coef: Option<f32>,
    pub(super) router_z_coef: Option<f32>,
    pub(super) renormalize: Option<bool>,
}

impl MoeOptions {
    pub(super) fn resolve(&self, config: &TransformerConfig) -> Result<Option<MoeConfig>> {
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
    /// The six sizes at once, in [`TransformerConfig::llama`]'s order: vocabulary, width,
    /// blocks, `(query heads, key/value heads, head width)`, feed-forward width, context.
    /// The same as the six calls below.
    pub fn shape(
        self, vocab_size: usize, d_model: usize, n_layers: usize, heads: (usize, usize, usize), d_ff: usize,
        max_seq_len: usize,
    ) -> Self {
        let (q_heads, kv_heads, head_dim) = heads;
        self.vocab_size(vocab_size)
            .d_model(d_model)
            .n_layers(n_layers)
            .heads(q_heads, kv_heads, head_dim)
            .d_ff(d_ff)
            .max_seq_len(max_seq_len)
    }
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
