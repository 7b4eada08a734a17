//! The architecture: [`TransformerConfig`] and [`MoeConfig`], their checks and the sizes they imply.

use super::*;
use crate::error::first_zero;

/// The architecture of a [`TransformerModel`].
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    /// Token ids run from 0 to `vocab_size - 1`.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `q_heads`).
    pub kv_heads: usize,
    /// Width of each head.
    pub head_dim: usize,
    /// Hidden width of the SwiGLU feed-forward.
    pub d_ff: usize,
    /// The longest sequence the model (and its KV cache) takes.
    pub max_seq_len: usize,
    /// RoPE's base frequency (10,000 for most models).
    pub rope_theta: f32,
    /// How the rotary frequencies are stretched for a long context (Llama 3.1's `llama3`,
    /// position interpolation's `linear`); `RopeScaling::None` for most models.
    pub rope_scaling: RopeScaling,
    /// RMSNorm's epsilon.
    pub norm_eps: f32,
    /// Whether the output head is the token embedding (`true`, as in GPT-2, Gemma and the
    /// small Qwen models) or a matrix of its own, `lm_head.weight` (Llama, Mistral).
    pub tie_embeddings: bool,
    /// Biases on the query, key and value projections (Qwen2); the output projection has
    /// none.
    pub qkv_bias: bool,
    /// RMSNorm over each query and key head before RoPE, one `head_dim` weight for all
    /// query heads and one for all key heads (Qwen3).
    pub qk_norm: bool,
    /// Sparse feed-forward layers, when some are.
    pub moe: Option<MoeConfig>,
}

/// The mixture-of-experts part of a [`TransformerConfig`]: which blocks have a sparse
/// feed-forward, and how it routes. See [`crate::ops::moe`] for the routing and the losses.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Routed experts per sparse block.
    pub n_experts: usize,
    /// Experts each token goes to.
    pub top_k: usize,
    /// Indices of the sparse blocks, ascending; the others keep a dense feed-forward.
    pub layers: Vec<usize>,
    /// One always-active SwiGLU expert of width `expert_d_ff`, added unweighted.
    pub shared_expert: bool,
    /// Hidden width of each expert.
    pub expert_d_ff: usize,
    /// Weight of the load-balancing loss in the objective (averaged over sparse blocks).
    pub load_balance_coef: f32,
    /// Weight of the router z-loss in the objective (averaged over sparse blocks).
    pub router_z_coef: f32,
    /// Whether the `top_k` routing weights are rescaled to sum to one.
    pub renormalize: bool,
}

pub(super) fn invalid(message: String) -> CoreError {
    CoreError::InvalidArgument { op: "transformer config", message }
}

impl MoeConfig {
    pub(super) fn validate(&self, n_layers: usize) -> Result<()> {
        if self.n_experts == 0 {
            return Err(invalid("a mixture of experts needs at least 1 expert".into()));
        }
        if self.top_k == 0 || self.top_k > self.n_experts {
            return Err(invalid(format!(
                "top_k {} must be between 1 and the number of experts ({})",
                self.top_k, self.n_experts
            )));
        }
        if self.expert_d_ff == 0 {
            return Err(invalid("expert_d_ff must be at least 1".into()));
        }
        if self.layers.is_empty() {
            return Err(invalid("experts are set but no layer is sparse (moe_layers is empty)".into()));
        }
        if let Some(&l) = self.layers.iter().find(|&&l| l >= n_layers) {
            return Err(invalid(format!(
                "moe layer {l} does not exist: the model has {n_layers} layers (0..{n_layers})"
            )));
        }
        if self.layers.windows(2).any(|w| w[0] >= w[1]) {
            return Err(invalid(format!("moe layers {:?} must be ascending without repeats", self.layers)));
        }
        for (name, v) in
            [("load_balance_coef", self.load_balance_coef), ("router_z_coef", self.router_z_coef)]
        {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(format!("{name} {v} must be finite and >= 0")));
            }
        }
        Ok(())
    }
}

impl TransformerConfig {
    /// A LLaMA-style decoder of these shapes, `heads` as `(query heads, key/value heads,
    /// head width)`: RoPE base 10,000 unscaled, RMSNorm's epsilon 1e-5, the head tied to the
    /// embedding, no biases, no q/k norms, dense feed-forwards. Change the rest with struct
    /// update syntax: `TransformerConfig { qk_norm: true, ..TransformerConfig::llama(..) }`.
    pub fn llama(
        vocab_size: usize, d_model: usize, n_layers: usize,
        (q_heads, kv_heads, head_dim): (usize, usize, usize), d_ff: usize, max_seq_len: usize,
    ) -> TransformerConfig {
        TransformerConfig {
            vocab_size,
            d_model,
            n_layers,
            q_heads,
            kv_heads,
            head_dim,
            d_ff,
            max_seq_len,
            rope_theta: 10_000.0,
            rope_scaling: RopeScaling::None,
            norm_eps: 1e-5,
            tie_embeddings: true,
            qkv_bias: false,
            qk_norm: false,
            moe: None,
        }
    }

    /// Checks the sizes and settings, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        if let Some(m) =
            first_zero!(self; vocab_size, d_model, n_layers, q_heads, kv_heads, head_dim, d_ff, max_seq_len)
        {
            return Err(invalid(m));
        }
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return Err(invalid(format!(
                "{} query heads are not a multiple of {} key/value heads",
                self.q_heads, self.kv_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(invalid(format!(
                "head_dim {} is odd; rotary embeddings rotate pairs",
                self.head_dim
            )));
        }
        // The buffers a context sizes (KV caches, attention scores, the RoPE table) must be
        // countable: a context of trillions of positions in a file's metadata is refused
        // here, not an overflow later.
        let per_position = self.q_heads.max(self.kv_heads).checked_mul(self.head_dim);
        if per_position
            .and_then(|d| d.checked_mul(self.max_seq_len))
            .is_none_or(|n| n > isize::MAX as usize / 4)
        {
            return Err(invalid(format!(
                "max_seq_len {} x {} heads x head_dim {} values do not fit in memory",
                self.max_seq_len,
                self.q_heads.max(self.kv_heads),
                self.head_dim
            )));
        }
        if self.vocab_size > u32::MAX as usize {
            return Err(invalid(format!("vocab_size {} does not fit u32 token ids", self.vocab_size)));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(invalid(format!("rope_theta {} must be a finite number above 1", self.rope_theta)));
        }
        self.rope_scaling.check().map_err(invalid)?;
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return Err(invalid(format!("norm_eps {} must be finite and >= 0", self.norm_eps)));
        }
        if let Some(moe) = &self.moe {
            moe.validate(self.n_layers)?;
        }
        Ok(())
    }
    /// RoPE over the query and the key heads of `batch` x `seq` positions from `pos_offset`.
    pub fn rope_specs(&self, batch: usize, seq: usize, pos_offset: usize) -> (RopeSpec, RopeSpec) {
        let q = RopeSpec {
            batch,
            seq,
            heads: self.q_heads,
            head_dim: self.head_dim,
            pos_offset,
            theta: self.rope_theta,
            scaling: self.rope_scaling,
        };
        (q, RopeSpec { heads: self.kv_heads, ..q })
    }
    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.q_heads * self.head_dim
    }
    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
    /// The mixture-of-experts settings of block `layer`, when it is sparse.
    pub fn sparse(&self, layer: usize) -> Option<&MoeConfig> {
        self.moe.as_ref().filter(|m| m.layers.contains(&layer))
    }
    /// Blocks with a sparse feed-forward.
    pub fn sparse_layers(&self) -> usize {
        self.moe.as_ref().map_or(0, |m| m.layers.len())
    }
    /// Hidden width of block `layer`'s dense feed-forward (or of its shared expert), if it
    /// has one.
    pub fn mlp_width(&self, layer: usize) -> Option<usize> {
        match self.sparse(layer) {
            None => Some(self.d_ff),
            Some(m) => m.shared_expert.then_some(m.expert_d_ff),
        }
    }
    /// Parameters of block `layer`: `(total, active per token)`. Two norms and four
    /// attention projections; a dense SwiGLU, or a router, the experts (of which a token
    /// passes through `top_k`) and the shared expert.
    pub fn layer_parameters(&self, layer: usize) -> (usize, usize) {
        let (d, q, kv) = (self.d_model, self.q_dim(), self.kv_dim());
        let attn = 2 * d
            + d * q
            + 2 * d * kv
            + q * d
            + if self.qkv_bias { q + 2 * kv } else { 0 }
            + if self.qk_norm { 2 * self.head_dim } else { 0 };
        let mlp = self.mlp_width(layer).map_or(0, |f| 3 * d * f);
        match self.sparse(layer) {
            None => (attn + mlp, attn + mlp),
            Some(m) => {
                let expert = 3 * d * m.expert_d_ff;
                let router = m.n_experts * d;
                (attn + mlp + router + m.n_experts * expert, attn + mlp + router + m.top_k * expert)
            }
        }
    }
    /// The untied output head's parameters (none when the head is the embedding).
    pub fn head_parameters(&self) -> usize {
        if self.tie_embeddings {
            0
        } else {
            self.vocab_size * self.d_model
        }
    }
    /// Every parameter, the tied embedding counted once, norms and routers included.
    pub fn parameter_count(&self) -> usize {
        self.vocab_size * self.d_model
            + (0..self.n_layers).map(|l| self.layer_parameters(l).0).sum::<usize>()
            + self.d_model
            + self.head_parameters()
    }
    /// Parameters one token passes through: all of a dense model's; in a sparse block, the
    /// router, `top_k` experts and the shared expert.
    pub fn active_parameter_count(&self) -> usize {
        self.vocab_size * self.d_model
            + (0..self.n_layers).map(|l| self.layer_parameters(l).1).sum::<usize>()
            + self.d_model
            + self.head_parameters()
    }
    /// f32 values in the activation arena for one (batch, seq) shape: what the forward pass
    /// keeps for the backward pass, the logits, and the backward scratch.
    pub fn activation_floats(&self, batch: usize, seq: usize) -> usize {
        let n = batch * seq;
        let (d, q, kv, h) = (self.d_model, self.q_dim(), self.kv_dim(), self.q_heads);
        let mut total = 0;
        let mut widths = Vec::new();
        for l in 0..self.n_layers {
            let f = self.mlp_width(l).unwrap_or(0);
            total += n * (4 * d + 2 + 2 * q + 2 * kv + h + 3 * f);
            if self.qk_norm {
                total += n * (q + kv + h + self.kv_heads);
            }
            if f > 0 && !widths.contains(&(n * f)) {
                widths.push(n * f);
            }
            if let Some(m) = self.sparse(l) {
                let rows = n * m.top_k;
                total += n * m.n_experts + rows * (2 * d + 3 * m.expert_d_ff);
                if !widths.contains(&(rows * m.expert_d_ff)) {
                    widths.push(rows * m.expert_d_ff);
                }
            }
        }
        let tail = n * (2 * d + 1 + self.vocab_size);
        let mut scratch = n * (3 * d + 2 * q + 2 * kv) + 3 * widths.iter().sum::<usize>();
        if self.qk_norm {
            scratch += n * (q + kv);
        }
        if let Some(m) = &self.moe {
            scratch += n * m.top_k * d + n * m.n_experts;
        }
        total + tail + scratch
    }

    /// Multiply-adds per token of the forward pass in the matrix products (projections,
    /// active FFN weights and routers, output head) and in attention at sequence length
    /// `seq` (causal average).
    pub fn forward_macs_per_token(&self, seq: usize) -> f64 {
        let (d, q) = (self.d_model as f64, self.q_dim() as f64);
        let attn = 2.0 * q * (seq as f64 + 1.0) / 2.0;
        let norms = 2.0 * d;
        (0..self.n_layers).map(|l| self.layer_parameters(l).1 as f64 - norms + attn).sum::<f64>()
            + d * self.vocab_size as f64
    }
}
