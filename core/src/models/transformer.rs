//! A decoder-only transformer language model, Llama layout: token embedding tied with the
//! output head; pre-norm blocks of RMSNorm -> causal grouped-query attention with RoPE ->
//! residual, RMSNorm -> SwiGLU feed-forward -> residual; a final RMSNorm.
//!
//! Forward and backward are written out layer by layer over the [`Backend`] primitives, the
//! llm.c way: every activation the backward pass needs is kept in an arena sized for one
//! (batch, seq) shape and reused while that shape repeats. Parameter names and layouts
//! follow Hugging Face's `LlamaForCausalLM` (`model.layers.{i}.self_attn.q_proj.weight` is
//! `(q_heads * head_dim, d_model)`), so checkpoints map without transposes.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::backend::{
    AttentionSpec, LoraSpec, MatmulSpec, Precision, Q8Attention, Q8Product, RopeSpec, RoutedSpec, SdpaSpec,
};
use crate::{Backend, CoreError, Optimizer, Result, Rng, RopeScaling};

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

fn invalid(message: String) -> CoreError {
    CoreError::InvalidArgument {
        op: "transformer config",
        message,
    }
}

impl MoeConfig {
    fn validate(&self, n_layers: usize) -> Result<()> {
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
            return Err(invalid(
                "experts are set but no layer is sparse (moe_layers is empty)".into(),
            ));
        }
        if let Some(&l) = self.layers.iter().find(|&&l| l >= n_layers) {
            return Err(invalid(format!(
                "moe layer {l} does not exist: the model has {n_layers} layers (0..{n_layers})"
            )));
        }
        if self.layers.windows(2).any(|w| w[0] >= w[1]) {
            return Err(invalid(format!(
                "moe layers {:?} must be ascending without repeats",
                self.layers
            )));
        }
        for (name, v) in [
            ("load_balance_coef", self.load_balance_coef),
            ("router_z_coef", self.router_z_coef),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(format!("{name} {v} must be finite and >= 0")));
            }
        }
        Ok(())
    }
}

impl TransformerConfig {
    /// Checks the sizes and settings, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("q_heads", self.q_heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("d_ff", self.d_ff),
            ("max_seq_len", self.max_seq_len),
        ] {
            if v == 0 {
                return Err(invalid(format!("{name} must be at least 1")));
            }
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
        if self.vocab_size > u32::MAX as usize {
            return Err(invalid(format!(
                "vocab_size {} does not fit u32 token ids",
                self.vocab_size
            )));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(invalid(format!(
                "rope_theta {} must be a finite number above 1",
                self.rope_theta
            )));
        }
        self.rope_scaling.check().map_err(invalid)?;
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return Err(invalid(format!(
                "norm_eps {} must be finite and >= 0",
                self.norm_eps
            )));
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
        (
            q,
            RopeSpec {
                heads: self.kv_heads,
                ..q
            },
        )
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
                (
                    attn + mlp + router + m.n_experts * expert,
                    attn + mlp + router + m.top_k * expert,
                )
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
            + (0..self.n_layers)
                .map(|l| self.layer_parameters(l).0)
                .sum::<usize>()
            + self.d_model
            + self.head_parameters()
    }
    /// Parameters one token passes through: all of a dense model's; in a sparse block, the
    /// router, `top_k` experts and the shared expert.
    pub fn active_parameter_count(&self) -> usize {
        self.vocab_size * self.d_model
            + (0..self.n_layers)
                .map(|l| self.layer_parameters(l).1)
                .sum::<usize>()
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
        (0..self.n_layers)
            .map(|l| self.layer_parameters(l).1 as f64 - norms + attn)
            .sum::<f64>()
            + d * self.vocab_size as f64
    }
}

/// Token ids of a training or evaluation batch: `inputs[b][t]` predicts `targets[b][t]`,
/// and `mask[b][t]` says whether that prediction counts in the loss. Row-major, `batch` rows
/// of `seq` positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// Rows.
    pub batch: usize,
    /// Positions per row.
    pub seq: usize,
    /// `batch x seq` input ids.
    pub inputs: Vec<u32>,
    /// `batch x seq` ids each position predicts.
    pub targets: Vec<u32>,
    /// `batch x seq`: whether a position's prediction counts in the loss.
    pub mask: Vec<bool>,
}

impl TokenBatch {
    /// Next-token batches from equal-length sequences of at least two ids: inputs are
    /// `seq[..n-1]`, targets `seq[1..]`, every position counts. The rows may be owned or
    /// borrowed: `TokenBatch::new(rows)`, `TokenBatch::new(&rows)`, `TokenBatch::new(&rows[1..])`.
    pub fn new(seqs: impl AsRef<[Vec<u32>]>) -> Result<TokenBatch> {
        let seqs = seqs.as_ref();
        let first = seqs
            .first()
            .ok_or_else(|| batch_err("the batch holds no sequences".into()))?;
        let n = first.len();
        if n < 2 {
            return Err(batch_err(format!(
                "sequence 0 has {n} tokens; next-token prediction needs at least 2"
            )));
        }
        if let Some((i, s)) = seqs.iter().enumerate().find(|(_, s)| s.len() != n) {
            return Err(batch_err(format!(
                "sequence {i} has {} tokens but sequence 0 has {n}; TokenBatch::new needs equal lengths",
                s.len()
            )));
        }
        let seq = n - 1;
        let mut inputs = Vec::with_capacity(seqs.len() * seq);
        let mut targets = Vec::with_capacity(seqs.len() * seq);
        for s in seqs {
            inputs.extend_from_slice(&s[..seq]);
            targets.extend_from_slice(&s[1..]);
        }
        Ok(TokenBatch {
            batch: seqs.len(),
            seq,
            mask: alloc::vec![true; inputs.len()],
            inputs,
            targets,
        })
    }

    /// Supervised fine-tuning rows: each pair is concatenated, right-padded (id 0) to the
    /// longest, and only predictions of response tokens count in the loss.
    pub fn supervised(pairs: &[(Vec<u32>, Vec<u32>)]) -> Result<TokenBatch> {
        if pairs.is_empty() {
            return Err(batch_err("the batch holds no (prompt, response) pairs".into()));
        }
        if let Some(i) = pairs.iter().position(|(p, r)| p.is_empty() || r.is_empty()) {
            return Err(batch_err(format!("pair {i} has an empty prompt or response")));
        }
        let longest = pairs.iter().map(|(p, r)| p.len() + r.len()).max().unwrap_or(0);
        let seq = longest - 1;
        let mut batch = TokenBatch {
            batch: pairs.len(),
            seq,
            inputs: alloc::vec![0; pairs.len() * seq],
            targets: alloc::vec![0; pairs.len() * seq],
            mask: alloc::vec![false; pairs.len() * seq],
        };
        for (b, (prompt, response)) in pairs.iter().enumerate() {
            let row: Vec<u32> = prompt.iter().chain(response).copied().collect();
            for t in 0..row.len() - 1 {
                batch.inputs[b * seq + t] = row[t];
                batch.targets[b * seq + t] = row[t + 1];
                // The prediction of token t + 1 counts when that token is in the response.
                batch.mask[b * seq + t] = t + 1 >= prompt.len();
            }
        }
        Ok(batch)
    }

    /// Replaces the loss mask with `flags` (`batch * seq` of them, row-major).
    pub fn with_loss_mask(mut self, flags: Vec<bool>) -> Result<TokenBatch> {
        if flags.len() != self.inputs.len() {
            return Err(batch_err(format!(
                "{} mask flags for a batch of {} x {} = {} positions",
                flags.len(),
                self.batch,
                self.seq,
                self.inputs.len()
            )));
        }
        self.mask = flags;
        Ok(self)
    }

    /// Checks the layout and every id that is read: all inputs, and the targets of counted
    /// positions (padding may hold anything).
    pub fn check(&self, vocab: usize) -> Result<()> {
        let n = self.batch * self.seq;
        for (what, len) in [
            ("inputs", self.inputs.len()),
            ("targets", self.targets.len()),
            ("mask", self.mask.len()),
        ] {
            crate::error::check_len("token batch", what, len, n)?;
        }
        let bad = |what, i: usize, id: u32| CoreError::TokenOutOfRange {
            what,
            id,
            row: i / self.seq,
            position: i % self.seq,
            vocab,
        };
        if let Some(i) = self.inputs.iter().position(|&t| t as usize >= vocab) {
            return Err(bad("input", i, self.inputs[i]));
        }
        if let Some(i) = (0..n).find(|&i| self.mask[i] && self.targets[i] as usize >= vocab) {
            return Err(bad("target", i, self.targets[i]));
        }
        Ok(())
    }

    /// Positions whose prediction counts in the loss.
    pub fn counted(&self) -> usize {
        self.mask.iter().filter(|&&m| m).count()
    }
}

fn batch_err(message: String) -> CoreError {
    CoreError::InvalidArgument {
        op: "token batch",
        message,
    }
}

mod lora;
mod params;
mod turns;
pub use lora::{
    adapted_shapes, adapter_buffers, adapter_buffers_mut, peft_names, Adapters, LoraConfig, LoraPair,
    LoraState, LORA_TARGETS,
};
pub use params::{Block, Experts, Swiglu, TensorKind, TensorSpec, Tree};
pub use turns::{Conversation, Finish, Reply, Turn};

use crate::backend::Memory;
use crate::ops::moe::Routing;

/// Parameters, gradients or optimizer moments on backend `B`, as one [`Tree`].
pub type Params<B> = Tree<<B as Memory>::Buffer>;
/// One block of [`Params`].
pub type LayerParams<B> = Block<<B as Memory>::Buffer>;
/// An int8 model's matrices: (packed int8, per-row scales) where the layout has a
/// [`TensorKind::Matrix`], `None` for norms and routers (they stay f32 in [`Params`]).
pub type QuantParams<B> = Tree<Option<(<B as Memory>::Buffer, <B as Memory>::Buffer)>>;

/// Zeroed buffers of `layout`'s shapes.
pub fn zeros_like<B: Backend>(b: &B, layout: &Tree<TensorSpec>) -> Result<Params<B>> {
    layout.as_ref().try_map(|_, t| b.zeros(t.len()))
}

/// Zero-length buffers in `layout`'s tree: what an int8 model keeps in place of the
/// gradients and optimizer moments it does not have.
pub fn hollow<B: Backend>(b: &B, layout: &Tree<TensorSpec>) -> Result<Params<B>> {
    layout.as_ref().try_map(|_, _| b.zeros(0))
}

/// A weight as a product reads it: f32, or int8 with one scale per row.
enum Mat<'a, B: Backend> {
    F32(&'a B::Buffer),
    Q8(&'a B::Buffer, &'a B::Buffer),
}

impl<B: Backend> Mat<'_, B> {
    /// `out = x W^T + beta * out` with the spec's `m, n, k`, `beta`, precision and window
    /// (W is stored `(n, k)`, a `Linear` weight).
    fn apply(&self, b: &B, out: &mut B::Buffer, x: &B::Buffer, spec: MatmulSpec) -> Result<()> {
        match *self {
            Mat::F32(w) => b.matmul(out, x, w, &spec.trans_b(true)),
            Mat::Q8(packed, scales) => b.q8_matmul(out, x, packed, scales, &spec.trans_b(true)),
        }
    }
}

impl<B: Backend> Mat<'_, B> {
    /// `out = dy W + beta * out` with the spec's `m, n, k` (W is `(k, n)`, stored as a
    /// `Linear` weight `(n_out = k, n_in = n)`): the input gradient of [`Mat::apply`]. An
    /// int8 W (a frozen base under adapters) is dequantized into `deq` first.
    fn grad_input(
        &self, b: &B, out: &mut B::Buffer, dy: &B::Buffer, spec: MatmulSpec, deq: &mut Dequant<B>,
    ) -> Result<()> {
        match *self {
            Mat::F32(w) => b.matmul(out, dy, w, &spec),
            Mat::Q8(packed, scales) => {
                let (rows, cols) = (spec.k, spec.n);
                let w = deq.get(b, packed, scales, rows, cols)?;
                b.matmul(out, dy, w, &spec)
            }
        }
    }
}

/// f32 copies of int8 weights for the backward pass of an int8 base, one buffer per size,
/// refilled for each matrix.
struct Dequant<B: Backend> {
    by_len: Vec<(usize, B::Buffer)>,
    /// `0..rows` for the lookup that dequantizes a whole matrix, grown to the most rows seen.
    ids: Vec<u32>,
}

impl<B: Backend> Dequant<B> {
    fn new() -> Self {
        Dequant {
            by_len: Vec::new(),
            ids: Vec::new(),
        }
    }
    fn get(
        &mut self, b: &B, packed: &B::Buffer, scales: &B::Buffer, rows: usize, cols: usize,
    ) -> Result<&B::Buffer> {
        let len = rows * cols;
        let i = match self.by_len.iter().position(|(l, _)| *l == len) {
            Some(i) => i,
            None => {
                self.by_len.push((len, b.zeros(len)?));
                self.by_len.len() - 1
            }
        };
        if self.ids.len() < rows {
            self.ids = (0..rows as u32).collect();
        }
        let buf = &mut self.by_len[i].1;
        b.q8_embedding(buf, packed, scales, &self.ids[..rows], rows, cols)?;
        Ok(&self.by_len[i].1)
    }
}

/// What the adapter products of one pass share: rank, scale, GEMM precision.
#[derive(Clone, Copy)]
struct LoraCtx {
    rank: usize,
    scale: f32,
    prec: Precision,
}

impl LoraCtx {
    fn spec(&self, rows: usize, d_in: usize, d_out: usize) -> LoraSpec {
        LoraSpec::new(rows, d_in, d_out, self.rank, self.scale).precision(self.prec)
    }
}

/// `y += scale (x A^T) B^T` where the projection has an adapter (`t` keeps `x A^T`).
fn adapt<B: Backend>(
    b: &B, pair: &Option<LoraPair<B::Buffer>>, t: &mut Option<B::Buffer>, y: &mut B::Buffer, x: &B::Buffer,
    s: LoraSpec,
) -> Result<()> {
    match (pair, t) {
        (Some(p), Some(t)) => b.lora_forward(y, t, x, &p.a, &p.b, &s),
        _ => Ok(()),
    }
}

/// The backward of [`adapt`]: the adapter's gradients, and `dx += ...` when given.
#[allow(clippy::too_many_arguments)]
fn adapt_backward<B: Backend>(
    b: &B, pair: &Option<LoraPair<B::Buffer>>, grad: &mut Option<LoraPair<B::Buffer>>, t: &Option<B::Buffer>,
    dt: &mut B::Buffer, dx: Option<&mut B::Buffer>, dy: &B::Buffer, x: &B::Buffer, s: LoraSpec,
) -> Result<()> {
    match (pair, grad, t) {
        (Some(p), Some(g), Some(t)) => b.lora_backward(dx, &mut g.a, &mut g.b, dt, dy, x, t, &p.a, &p.b, &s),
        _ => Ok(()),
    }
}

/// One block's adapters in a pass: the adapters, their kept `x A^T`, and the shared settings.
struct BlockLora<'a, B: Backend> {
    w: &'a Block<Option<LoraPair<B::Buffer>>>,
    t: &'a mut Block<Option<B::Buffer>>,
    ctx: LoraCtx,
}

/// Buffers of `x A^T` for one block's adapted projections over `n` rows (`n * top_k` for
/// the experts).
fn lora_acts<B: Backend>(
    b: &B, shapes: &Block<Option<(usize, usize)>>, n: usize, top_k: usize, rank: usize,
) -> Result<Block<Option<B::Buffer>>> {
    let mut lens: Block<Option<usize>> = shapes.as_ref().map(|s| s.map(|_| n * rank));
    if let Some(e) = lens.moe.as_mut() {
        for ex in &mut e.experts {
            for leaf in [&mut ex.gate, &mut ex.up, &mut ex.down] {
                *leaf = leaf.map(|_| n * top_k * rank);
            }
        }
    }
    lens.try_map("", &mut |_, l: Option<usize>| l.map(|l| b.zeros(l)).transpose())
}

/// Block `l`'s weights as the forward pass reads them: int8 where quantized, else f32.
fn block_view<'a, B: Backend>(
    params: &'a Params<B>, quantized: Option<&'a QuantParams<B>>, l: usize,
) -> Result<Block<Mat<'a, B>>> {
    let f = params.layers[l].as_ref();
    match quantized {
        None => Ok(f.map(Mat::F32)),
        Some(q) => f
            .zip(q.layers[l].as_ref())
            .map(|pair| {
                pair.map(|(w, q)| match q {
                    Some((packed, scales)) => Mat::Q8(packed, scales),
                    None => Mat::F32(w),
                })
            })
            .ok_or_else(|| invalid(format!("the int8 weights of layer {l} do not match its layout"))),
    }
}

/// Backward-pass scratch triples `(ds, dgate, dup)` (or forward `(gate, up, s)`), one per
/// buffer length: dense blocks, shared experts and grouped experts may differ in width.
struct Triples<B: Backend> {
    by_len: Vec<(usize, [B::Buffer; 3])>,
}

impl<B: Backend> Triples<B> {
    fn new(b: &B, lens: impl IntoIterator<Item = usize>) -> Result<Self> {
        let mut by_len: Vec<(usize, [B::Buffer; 3])> = Vec::new();
        for len in lens {
            if !by_len.iter().any(|(l, _)| *l == len) {
                by_len.push((len, [b.zeros(len)?, b.zeros(len)?, b.zeros(len)?]));
            }
        }
        Ok(Triples { by_len })
    }
    fn get(&mut self, len: usize) -> Result<&mut [B::Buffer; 3]> {
        self.by_len
            .iter_mut()
            .find(|(l, _)| *l == len)
            .map(|(_, t)| t)
            .ok_or_else(|| invalid(format!("no scratch of {len} values was prepared")))
    }
}

/// What a sparse block's forward pass keeps for its backward pass (and a cached forward
/// pass uses as scratch).
struct MoeActs<B: Backend> {
    /// `(n, n_experts)` router logits.
    logits: B::Buffer,
    /// On the host.
    routing: Routing,
    /// `(n * top_k, d)`: the block's input rows, grouped by expert.
    xe: B::Buffer,
    /// `(n * top_k, expert_d_ff)` each.
    gate: B::Buffer,
    up: B::Buffer,
    s: B::Buffer,
    /// `(n * top_k, d)`: each expert's output, before its routing weight.
    y: B::Buffer,
    /// `(n, top_k)` each slot's expert (`u32` bits) and weight, when the backend routes
    /// on its own buffers (see [`MoeOps::routes_on_device`](crate::backend::MoeOps::routes_on_device)); the slot-ordered rows of
    /// `gate`, `up`, `s` and `y` then follow them instead of the grouping.
    slot_expert: B::Buffer,
    slot_weight: B::Buffer,
}

impl<B: Backend> MoeActs<B> {
    fn new(b: &B, n: usize, d: usize, m: &MoeConfig) -> Result<Self> {
        let rows = n * m.top_k;
        Ok(MoeActs {
            logits: b.zeros(n * m.n_experts)?,
            routing: Routing::default(),
            xe: b.zeros(rows * d)?,
            gate: b.zeros(rows * m.expert_d_ff)?,
            up: b.zeros(rows * m.expert_d_ff)?,
            s: b.zeros(rows * m.expert_d_ff)?,
            y: b.zeros(rows * d)?,
            slot_expert: b.zeros(rows)?,
            slot_weight: b.zeros(rows)?,
        })
    }
}

/// Activations of one block, kept for the backward pass.
struct LayerActs<B: Backend> {
    x_in: B::Buffer,
    h: B::Buffer,
    rstd1: B::Buffer,
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    /// With `qk_norm`: q and k before their norms, and the norms' `rstd` per head;
    /// empty without.
    qk: [B::Buffer; 4],
    att: B::Buffer,
    lse: B::Buffer,
    x_mid: B::Buffer,
    h2: B::Buffer,
    rstd2: B::Buffer,
    /// `(n, f)` of the dense feed-forward or the shared expert; empty without one.
    gate: B::Buffer,
    up: B::Buffer,
    s: B::Buffer,
    moe: Option<MoeActs<B>>,
}

impl<B: Backend> LayerActs<B> {
    /// The block's activations for the batch forward pass; `save` keeps the block's input
    /// and middle for the backward pass (training), off when only the states are wanted.
    fn acts(&mut self, save: bool) -> BlockActs<'_, B> {
        BlockActs {
            h: &mut self.h,
            rstd1: &mut self.rstd1,
            q: &mut self.q,
            k: &mut self.k,
            v: &mut self.v,
            qk: &mut self.qk,
            att: &mut self.att,
            lse: &mut self.lse,
            h2: &mut self.h2,
            rstd2: &mut self.rstd2,
            ffn: Some([&mut self.gate, &mut self.up, &mut self.s]),
            moe: self.moe.as_mut(),
            saved: if save {
                Some((&mut self.x_in, &mut self.x_mid))
            } else {
                None
            },
        }
    }
}

/// Everything one (batch, seq) shape needs, allocated once and reused.
struct Arena<B: Backend> {
    batch: usize,
    seq: usize,
    layers: Vec<LayerActs<B>>,
    x_out: B::Buffer,
    hf: B::Buffer,
    rstd_f: B::Buffer,
    logits: B::Buffer,
    // backward scratch
    dx: B::Buffer,
    dx2: B::Buffer,
    dh: B::Buffer,
    datt: B::Buffer,
    dq: B::Buffer,
    dk: B::Buffer,
    dv: B::Buffer,
    /// With `qk_norm`, the gradients of q and k before their norms; empty without.
    dq_raw: B::Buffer,
    dk_raw: B::Buffer,
    /// `(ds, dgate, dup)` for each feed-forward width.
    ffn: Triples<B>,
    /// `(n * top_k, d)` and `(n, n_experts)` for sparse blocks; empty without.
    dxe: B::Buffer,
    dlogits: B::Buffer,
    /// With adapters: each adapted projection's `x A^T` per block, the `dt` scratch
    /// (`(n * top_k or n, rank)`), the gradients of frozen norm weights (discarded, `(d)`
    /// and `(head_dim)`), and f32 copies of an int8 base's matrices.
    lora_t: Vec<Block<Option<B::Buffer>>>,
    lora_dt: B::Buffer,
    sink_d: B::Buffer,
    sink_hd: B::Buffer,
    deq: Dequant<B>,
}

/// `(q_raw, k_raw, rstd_q, rstd_k)` for `n` rows with `qk_norm`; empty buffers without.
fn qk_scratch<B: Backend>(b: &B, c: &TransformerConfig, n: usize) -> Result<[B::Buffer; 4]> {
    let on = usize::from(c.qk_norm);
    Ok([
        b.zeros(on * n * c.q_dim())?,
        b.zeros(on * n * c.kv_dim())?,
        b.zeros(on * n * c.q_heads)?,
        b.zeros(on * n * c.kv_heads)?,
    ])
}

/// Each block's `x A^T` buffers for `n` rows, when adapters are attached.
fn lora_t_for<B: Backend>(
    b: &B, c: &TransformerConfig, lora: Option<&LoraConfig>, n: usize,
) -> Result<Vec<Block<Option<B::Buffer>>>> {
    let Some(cfg) = lora else { return Ok(Vec::new()) };
    let shapes = adapted_shapes(cfg, &c.layout());
    let top_k = c.moe.as_ref().map_or(1, |m| m.top_k);
    shapes
        .layers
        .iter()
        .map(|s| lora_acts(b, s, n, top_k, cfg.rank))
        .collect()
}

impl<B: Backend> Arena<B> {
    /// The token embedding of `ids` into the residual stream `x_out` (the int8 table where
    /// the model is quantized).
    fn embed(
        &mut self, b: &B, c: &TransformerConfig, params: &Params<B>, quantized: Option<&QuantParams<B>>,
        ids: &[u32],
    ) -> Result<()> {
        match quantized.map(|q| &q.embed) {
            Some(Some((packed, scales))) => {
                b.q8_embedding(&mut self.x_out, packed, scales, ids, c.vocab_size, c.d_model)
            }
            _ => b.embedding_forward(&mut self.x_out, &params.embed, ids, c.vocab_size, c.d_model),
        }
    }

    /// The final RMSNorm of the residual stream's `n` rows into `hf`.
    fn final_norm(&mut self, b: &B, c: &TransformerConfig, params: &Params<B>, n: usize) -> Result<()> {
        b.rmsnorm_forward(
            &mut self.hf,
            &mut self.rstd_f,
            &self.x_out,
            &params.final_norm,
            n,
            c.d_model,
            c.norm_eps,
        )
    }

    fn new(
        b: &B, c: &TransformerConfig, batch: usize, seq: usize, lora: Option<&LoraConfig>,
    ) -> Result<Self> {
        let n = batch * seq;
        let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
        let mut layers = Vec::new();
        let mut lens = Vec::new();
        for l in 0..c.n_layers {
            let f = c.mlp_width(l).unwrap_or(0);
            if f > 0 {
                lens.push(n * f);
            }
            let moe = match c.sparse(l) {
                Some(m) => {
                    lens.push(n * m.top_k * m.expert_d_ff);
                    Some(MoeActs::new(b, n, d, m)?)
                }
                None => None,
            };
            layers.push(LayerActs {
                x_in: b.zeros(n * d)?,
                h: b.zeros(n * d)?,
                rstd1: b.zeros(n)?,
                q: b.zeros(n * q)?,
                k: b.zeros(n * kv)?,
                v: b.zeros(n * kv)?,
                qk: qk_scratch(b, c, n)?,
                att: b.zeros(n * q)?,
                lse: b.zeros(n * c.q_heads)?,
                x_mid: b.zeros(n * d)?,
                h2: b.zeros(n * d)?,
                rstd2: b.zeros(n)?,
                gate: b.zeros(n * f)?,
                up: b.zeros(n * f)?,
                s: b.zeros(n * f)?,
                moe,
            });
        }
        let (dxe, dlogits) = match &c.moe {
            Some(m) => (b.zeros(n * m.top_k * d)?, b.zeros(n * m.n_experts)?),
            None => (b.zeros(0)?, b.zeros(0)?),
        };
        Ok(Arena {
            batch,
            seq,
            layers,
            x_out: b.zeros(n * d)?,
            hf: b.zeros(n * d)?,
            rstd_f: b.zeros(n)?,
            logits: b.zeros(n * c.vocab_size)?,
            dx: b.zeros(n * d)?,
            dx2: b.zeros(n * d)?,
            dh: b.zeros(n * d)?,
            datt: b.zeros(n * q)?,
            dq: b.zeros(n * q)?,
            dk: b.zeros(n * kv)?,
            dv: b.zeros(n * kv)?,
            dq_raw: b.zeros(if c.qk_norm { n * q } else { 0 })?,
            dk_raw: b.zeros(if c.qk_norm { n * kv } else { 0 })?,
            ffn: Triples::new(b, lens)?,
            dxe,
            dlogits,
            lora_t: lora_t_for(b, c, lora, n)?,
            lora_dt: b.zeros(lora.map_or(0, |l| n * c.moe.as_ref().map_or(1, |m| m.top_k) * l.rank))?,
            sink_d: b.zeros(if lora.is_some() { d } else { 0 })?,
            sink_hd: b.zeros(if lora.is_some() { c.head_dim } else { 0 })?,
            deq: Dequant::new(),
        })
    }
}

/// A feed-forward's adapters in a forward pass: adapters, their `x A^T` buffers, settings.
type MlpLoraFwd<'a, B> = (
    &'a Swiglu<Option<LoraPair<<B as Memory>::Buffer>>>,
    Swiglu<&'a mut Option<<B as Memory>::Buffer>>,
    LoraCtx,
);
/// The routed experts' adapters in a forward pass.
type MoeLoraFwd<'a, B> = (
    &'a Experts<Option<LoraPair<<B as Memory>::Buffer>>>,
    Experts<&'a mut Option<<B as Memory>::Buffer>>,
    LoraCtx,
);

/// A SwiGLU feed-forward over `n` rows, added to the stream:
/// `out += down(silu(gate(x)) * up(x))` (the residual add is the down projection's
/// `beta = 1`). `x`, `out`: `(n, d)`; `gate`, `up`, `s`: `(n, f)`, kept for the backward pass.
#[allow(clippy::too_many_arguments)]
fn mlp_forward<B: Backend>(
    b: &B, w: &Swiglu<Mat<'_, B>>, x: &B::Buffer, out: &mut B::Buffer, [gate, up, s]: [&mut B::Buffer; 3],
    n: usize, d: usize, f: usize, prec: Precision, mut lora: Option<MlpLoraFwd<'_, B>>,
) -> Result<()> {
    let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
    if let (Mat::Q8(pg, sg), Mat::Q8(pu, su), Mat::Q8(pd, sd), None) = (&w.gate, &w.up, &w.down, &lora) {
        // Int8 without adapters: the whole feed-forward in one call, which a backend may
        // run as one job.
        let spec = mm(n, f, d).trans_b(true);
        return b.q8_mlp(out, [gate, up, s], x, (pg, sg), (pu, su), (pd, sd), &spec);
    }
    match (&w.gate, &w.up, &lora) {
        // Int8 gating products without adapters (the down product in f32): the products
        // and the gating in one call, which a backend may run as one job.
        (Mat::Q8(pg, sg), Mat::Q8(pu, su), None) => {
            b.q8_swiglu(s, gate, up, x, (pg, sg), (pu, su), &mm(n, f, d).trans_b(true))?;
        }
        _ => {
            w.gate.apply(b, gate, x, mm(n, f, d))?;
            w.up.apply(b, up, x, mm(n, f, d))?;
            if let Some((lw, lt, ctx)) = &mut lora {
                adapt(b, &lw.gate, lt.gate, gate, x, ctx.spec(n, d, f))?;
                adapt(b, &lw.up, lt.up, up, x, ctx.spec(n, d, f))?;
            }
            b.swiglu_forward(s, gate, up)?;
        }
    }
    w.down.apply(b, out, s, mm(n, d, f).beta(1.0))?;
    if let Some((lw, lt, ctx)) = lora {
        adapt(b, &lw.down, lt.down, out, s, ctx.spec(n, f, d))?;
    }
    Ok(())
}

/// The adapters of a feed-forward's backward pass: adapters, their gradients, the kept
/// `x A^T`, the `dt` scratch, and the shared settings.
type MlpLora<'a, B> = (
    &'a Swiglu<Option<LoraPair<<B as Memory>::Buffer>>>,
    Swiglu<&'a mut Option<LoraPair<<B as Memory>::Buffer>>>,
    &'a Swiglu<Option<<B as Memory>::Buffer>>,
    &'a mut <B as Memory>::Buffer,
    LoraCtx,
);

/// Backward of [`mlp_forward`]: from `dout` `(n, d)`, accumulates the three weight
/// gradients into `g` (none when the weights are frozen) and the adapters' into theirs,
/// and writes `dx` `(n, d)`. `scratch` is `(ds, dgate, dup)`, `(n, f)`.
#[allow(clippy::too_many_arguments)]
fn mlp_backward<B: Backend>(
    b: &B, p: &Swiglu<Mat<'_, B>>, g: Option<&mut Swiglu<B::Buffer>>, a: [&B::Buffer; 4], dout: &B::Buffer,
    dx: &mut B::Buffer, [ds, dgate, dup]: &mut [B::Buffer; 3], (n, d, f): (usize, usize, usize),
    prec: Precision, deq: &mut Dequant<B>, lora: Option<MlpLora<'_, B>>,
) -> Result<()> {
    let [x, gate, up, s] = a;
    let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
    let mut lora = lora;
    // dWd += dout^T s; ds = dout Wd (+ the down adapter's part)
    let mut g = g;
    if let Some(g) = g.as_deref_mut() {
        b.matmul(&mut g.down, dout, s, &mm(d, f, n).trans_a(true).accumulate())?;
    }
    p.down.grad_input(b, ds, dout, mm(n, f, d), deq)?;
    if let Some((lw, lg, lt, dt, ctx)) = lora.as_mut() {
        adapt_backward(
            b,
            &lw.down,
            lg.down,
            &lt.down,
            dt,
            Some(ds),
            dout,
            s,
            ctx.spec(n, f, d),
        )?;
    }
    b.swiglu_backward(dgate, dup, ds, gate, up)?;
    if let Some(g) = g {
        b.matmul(&mut g.gate, dgate, x, &mm(f, d, n).trans_a(true).accumulate())?;
        b.matmul(&mut g.up, dup, x, &mm(f, d, n).trans_a(true).accumulate())?;
    }
    p.gate.grad_input(b, dx, dgate, mm(n, d, f), deq)?;
    p.up.grad_input(b, dx, dup, mm(n, d, f).accumulate(), deq)?;
    if let Some((lw, lg, lt, dt, ctx)) = lora {
        adapt_backward(
            b,
            &lw.gate,
            lg.gate,
            &lt.gate,
            dt,
            Some(&mut *dx),
            dgate,
            x,
            ctx.spec(n, d, f),
        )?;
        adapt_backward(b, &lw.up, lg.up, &lt.up, dt, Some(dx), dup, x, ctx.spec(n, d, f))?;
    }
    Ok(())
}

/// The routed experts of a sparse block, added to the stream: each token's `top_k` expert
/// outputs, weighted by the router (see [`crate::ops::moe`]). Tokens are grouped by expert
/// (gather, then one product per expert over its rows, then a weighted scatter-add), so
/// an expert multiplies only the tokens routed to it and none is dropped. `x`, `out`:
/// `(n, d)`. The router runs in f32 whatever the GEMM precision: routing is a discrete
/// choice that bf16 rounding would flip.
#[allow(clippy::too_many_arguments)]
fn moe_forward<B: Backend>(
    b: &B, w: &Experts<Mat<'_, B>>, m: &MoeConfig, a: &mut MoeActs<B>, x: &B::Buffer, out: &mut B::Buffer,
    n: usize, d: usize, prec: Precision, inference: bool, mut lora: Option<MoeLoraFwd<'_, B>>,
) -> Result<()> {
    let (e_n, k, fe) = (m.n_experts, m.top_k, m.expert_d_ff);
    let mm = |rows, nn, kk| MatmulSpec::new(rows, nn, kk).precision(prec);
    w.router.apply(b, &mut a.logits, x, MatmulSpec::new(n, e_n, d))?;
    // Adapted experts need their rows grouped (an adapter's product runs on a window).
    let adapted = lora.as_ref().is_some_and(|(lw, _, _)| {
        lw.experts
            .iter()
            .any(|e| e.gate.is_some() || e.up.is_some() || e.down.is_some())
    });
    if let (true, false, Some(experts)) = (inference, adapted, routed_on_device(b, w)) {
        // Slot order throughout: nothing is counted, so nothing is read back.
        let slots = n * k;
        b.moe_route(
            &mut a.slot_expert,
            &mut a.slot_weight,
            &a.logits,
            n,
            e_n,
            k,
            m.renormalize,
        )?;
        let spec = |nn, kk, x_per_token| RoutedSpec {
            slots,
            n: nn,
            k: kk,
            top_k: k,
            x_per_token,
        };
        b.q8_matmul_routed(&mut a.gate, x, &experts[0], &a.slot_expert, &spec(fe, d, true))?;
        b.q8_matmul_routed(&mut a.up, x, &experts[1], &a.slot_expert, &spec(fe, d, true))?;
        b.swiglu_forward(&mut a.s, &a.gate, &a.up)?;
        b.q8_matmul_routed(&mut a.y, &a.s, &experts[2], &a.slot_expert, &spec(d, fe, false))?;
        return b.moe_combine_slots(out, &a.y, &a.slot_weight, k, d);
    }
    let logits = b.download(&a.logits)?;
    a.routing.route(&logits, n, e_n, k, m.renormalize)?;
    let r = &a.routing;
    // Gather: xe[row] = x[token_of_row[row]], an embedding lookup with x as the table.
    b.embedding_forward(&mut a.xe, x, &r.token_of_row, n, d)?;
    for (e, ex) in w.experts.iter().enumerate() {
        let (o, c) = r.rows(e);
        if c > 0 {
            ex.gate
                .apply(b, &mut a.gate, &a.xe, mm(c, fe, d).window(o * d, 0, o * fe))?;
            ex.up
                .apply(b, &mut a.up, &a.xe, mm(c, fe, d).window(o * d, 0, o * fe))?;
            if let Some((lw, lt, ctx)) = &mut lora {
                let spec = ctx.spec(c, d, fe).offsets(o * d, o * fe, o * ctx.rank);
                adapt(
                    b,
                    &lw.experts[e].gate,
                    lt.experts[e].gate,
                    &mut a.gate,
                    &a.xe,
                    spec,
                )?;
                adapt(b, &lw.experts[e].up, lt.experts[e].up, &mut a.up, &a.xe, spec)?;
            }
        }
    }
    b.swiglu_forward(&mut a.s, &a.gate, &a.up)?;
    for (e, ex) in w.experts.iter().enumerate() {
        let (o, c) = r.rows(e);
        if c > 0 {
            ex.down
                .apply(b, &mut a.y, &a.s, mm(c, d, fe).window(o * fe, 0, o * d))?;
            if let Some((lw, lt, ctx)) = &mut lora {
                let spec = ctx.spec(c, fe, d).offsets(o * fe, o * d, o * ctx.rank);
                adapt(b, &lw.experts[e].down, lt.experts[e].down, &mut a.y, &a.s, spec)?;
            }
        }
    }
    b.moe_combine(out, &a.y, &r.row_of_slot, &r.weight, k, d)
}

/// The experts' int8 (packed, scales) as `[gate, up, down]` lists, when an inference pass
/// routes them on the backend's buffers: the backend says it does
/// ([`MoeOps::routes_on_device`](crate::backend::MoeOps::routes_on_device)) and every expert is int8. `None`: group on the host.
#[allow(clippy::type_complexity)]
fn routed_on_device<'a, B: Backend>(
    b: &B, w: &Experts<Mat<'a, B>>,
) -> Option<[Vec<(&'a B::Buffer, &'a B::Buffer)>; 3]> {
    if !b.routes_on_device() {
        return None;
    }
    let mut lists: [Vec<(&'a B::Buffer, &'a B::Buffer)>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for ex in &w.experts {
        for (list, mat) in lists.iter_mut().zip([&ex.gate, &ex.up, &ex.down]) {
            match *mat {
                Mat::Q8(p, s) => list.push((p, s)),
                Mat::F32(_) => return None,
            }
        }
    }
    Some(lists)
}

/// The experts' adapters in a backward pass, as [`MlpLora`] is for one feed-forward.
type MoeLora<'a, B> = (
    &'a Experts<Option<LoraPair<<B as Memory>::Buffer>>>,
    Experts<&'a mut Option<LoraPair<<B as Memory>::Buffer>>>,
    &'a Experts<Option<<B as Memory>::Buffer>>,
    &'a mut <B as Memory>::Buffer,
    LoraCtx,
);

/// Backward of [`moe_forward`]: from `dout` `(n, d)`, accumulates the experts' and the
/// router's gradients into `g` (none when frozen) and the adapters' into theirs, and
/// *adds* the input gradient into `dx` `(n, d)`. The router's gradient includes
/// `lb_scale` times the load-balancing loss and `z_scale` times the z-loss. `dxe`
/// `(n * top_k, d)` and `dlogits` `(n, n_experts)` are scratch, and `ffn` is
/// `(ds, dgate, dup)` of `(n * top_k, expert_d_ff)`.
#[allow(clippy::too_many_arguments)]
fn moe_backward<B: Backend>(
    b: &B, p: &Experts<Mat<'_, B>>, g: Option<&mut Experts<B::Buffer>>, m: &MoeConfig, a: &MoeActs<B>,
    x: &B::Buffer, dout: &B::Buffer, dx: &mut B::Buffer, dxe: &mut B::Buffer, dlogits: &mut B::Buffer,
    [ds, dgate, dup]: &mut [B::Buffer; 3], (n, d): (usize, usize), prec: Precision,
    (lb_scale, z_scale): (f32, f32), deq: &mut Dequant<B>, lora: Option<MoeLora<'_, B>>,
) -> Result<()> {
    let (e_n, k, fe) = (m.n_experts, m.top_k, m.expert_d_ff);
    let mm = |rows, nn, kk| MatmulSpec::new(rows, nn, kk).precision(prec);
    let r = &a.routing;
    let mut g = g;
    let mut lora = lora;
    // dy[row] = weight * dout[token] (into dxe), and each slot's weight gradient.
    let dweight = b.moe_combine_backward(dxe, dout, &a.y, &r.row_of_slot, &r.weight, k, d)?;
    for e in 0..e_n {
        let (o, c) = r.rows(e);
        if c > 0 {
            // dWd_e += dy_e^T s_e; ds_e = dy_e Wd_e (+ the adapter's part)
            if let Some(g) = g.as_deref_mut() {
                let acc = mm(d, fe, c).trans_a(true).accumulate().window(o * d, o * fe, 0);
                b.matmul(&mut g.experts[e].down, dxe, &a.s, &acc)?;
            }
            let into = mm(c, fe, d).window(o * d, 0, o * fe);
            p.experts[e].down.grad_input(b, ds, dxe, into, deq)?;
            if let Some((lw, lg, lt, dt, ctx)) = lora.as_mut() {
                let spec = ctx.spec(c, fe, d).offsets(o * fe, o * d, o * ctx.rank);
                let (w, gr, t) = (&lw.experts[e].down, &mut *lg.experts[e].down, &lt.experts[e].down);
                adapt_backward(b, w, gr, t, dt, Some(&mut *ds), dxe, &a.s, spec)?;
            }
        }
    }
    b.swiglu_backward(dgate, dup, ds, &a.gate, &a.up)?;
    for e in 0..e_n {
        let (o, c) = r.rows(e);
        if c > 0 {
            if let Some(g) = g.as_deref_mut() {
                let acc = mm(fe, d, c).trans_a(true).accumulate().window(o * fe, o * d, 0);
                b.matmul(&mut g.experts[e].gate, dgate, &a.xe, &acc)?;
                b.matmul(&mut g.experts[e].up, dup, &a.xe, &acc)?;
            }
            // dxe_e = dgate_e Wg_e + dup_e Wu_e (dy is spent: its rows are reused)
            let into = mm(c, d, fe).window(o * fe, 0, o * d);
            p.experts[e].gate.grad_input(b, dxe, dgate, into, deq)?;
            p.experts[e].up.grad_input(b, dxe, dup, into.accumulate(), deq)?;
            if let Some((lw, lg, lt, dt, ctx)) = lora.as_mut() {
                let spec = ctx.spec(c, d, fe).offsets(o * d, o * fe, o * ctx.rank);
                let ex = &lw.experts[e];
                adapt_backward(
                    b,
                    &ex.gate,
                    lg.experts[e].gate,
                    &lt.experts[e].gate,
                    dt,
                    Some(&mut *dxe),
                    dgate,
                    &a.xe,
                    spec,
                )?;
                adapt_backward(
                    b,
                    &ex.up,
                    lg.experts[e].up,
                    &lt.experts[e].up,
                    dt,
                    Some(&mut *dxe),
                    dup,
                    &a.xe,
                    spec,
                )?;
            }
        }
    }
    // Scatter-add: dx[token_of_row[row]] += dxe[row], the embedding gradient with x as table.
    b.embedding_backward(dx, dxe, &r.token_of_row, n, d)?;
    let mut dl = alloc::vec![0.0f32; n * e_n];
    r.backward(&mut dl, &dweight, lb_scale, z_scale)?;
    b.write(dlogits, &dl)?;
    if let Some(g) = g {
        b.matmul(
            &mut g.router,
            dlogits,
            x,
            &MatmulSpec::new(e_n, d, n).trans_a(true).accumulate(),
        )?;
    }
    p.router
        .grad_input(b, dx, dlogits, MatmulSpec::new(n, d, e_n).accumulate(), deq)
}

/// Where a block's attention finds its keys and values.
enum Keys<'a, B: Backend> {
    /// This pass's own: the whole sequence (training, evaluation).
    Fresh,
    /// This pass's own under a padding mask `(batch, seq)`, `true` for real tokens: the
    /// decoder used as a prompt encoder, whose padded positions are fed on and must see
    /// the real tokens only, as transformers computes them under an attention mask.
    Masked(&'a [bool]),
    /// A KV cache, after this pass's keys and values are appended at position `pos`.
    Cache {
        k: &'a mut B::Buffer,
        v: &'a mut B::Buffer,
        pos: usize,
    },
}

/// A block's activations: kept for the backward pass by the batch forward pass, scratch
/// for the cached one. `(n, d)` for `h`, `h2`; `(n, q_dim)` for `q`, `att`; `(n, kv_dim)`
/// for `k`, `v`; `(n)` for the `rstd`s; `(n, q_heads)` for `lse`.
struct BlockActs<'a, B: Backend> {
    h: &'a mut B::Buffer,
    rstd1: &'a mut B::Buffer,
    q: &'a mut B::Buffer,
    k: &'a mut B::Buffer,
    v: &'a mut B::Buffer,
    /// `(q_raw, k_raw, rstd_q, rstd_k)`, used with `qk_norm`.
    qk: &'a mut [B::Buffer; 4],
    att: &'a mut B::Buffer,
    lse: &'a mut B::Buffer,
    h2: &'a mut B::Buffer,
    rstd2: &'a mut B::Buffer,
    /// `(gate, up, s)` of the dense feed-forward or shared expert, `(n, f)`.
    ffn: Option<[&'a mut B::Buffer; 3]>,
    moe: Option<&'a mut MoeActs<B>>,
    /// The stream before attention and before the feed-forward (`x_in`, `x_mid`), which
    /// the backward pass reads; `None` when nothing will be differentiated.
    saved: Option<(&'a mut B::Buffer, &'a mut B::Buffer)>,
}

/// One transformer block on the residual stream `x` `(n, d)`, in place:
/// `x += attn(rmsnorm(x))`, then `x += ffn(rmsnorm(x))`, the feed-forward a dense SwiGLU or
/// routed experts plus the shared one. The one block of both the batch forward pass and
/// the cached one (which passes its KV cache as `keys`).
#[allow(clippy::too_many_arguments)]
fn block_forward<B: Backend>(
    b: &B, c: &TransformerConfig, l: usize, p: &LayerParams<B>, w: &Block<Mat<'_, B>>, x: &mut B::Buffer,
    a: BlockActs<'_, B>, keys: Keys<'_, B>, (rope_q, rope_k, spec): (&RopeSpec, &RopeSpec, &AttentionSpec),
    n: usize, prec: Precision, lora: Option<BlockLora<'_, B>>,
) -> Result<()> {
    let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
    let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
    let BlockActs {
        h,
        rstd1,
        q: qb,
        k: kb,
        v: vb,
        qk,
        att,
        lse,
        h2,
        rstd2,
        ffn,
        moe,
        mut saved,
    } = a;
    if let Some((x_in, _)) = saved.as_mut() {
        b.copy(x_in, x)?;
    }
    // h = rmsnorm(x); q, k, v = h W^T (+ bias)   h: (n, d), Wq: (q, d)
    b.rmsnorm_forward(h, rstd1, x, &p.attn_norm, n, d, c.norm_eps)?;
    let (lw, mut lt, ctx) = match lora {
        Some(l) => (Some(l.w), Some(l.t), Some(l.ctx)),
        None => (None, None, None),
    };
    let mut project = |qp: &mut B::Buffer, kp: &mut B::Buffer| -> Result<()> {
        match (&w.wq, &w.wk, &w.wv) {
            // All three int8 (an int8 model): one call, which a backend may run as one job.
            (Mat::Q8(pq, sq), Mat::Q8(pk, sk), Mat::Q8(pv, sv)) => {
                let t = |spec: MatmulSpec| spec.trans_b(true);
                b.q8_matmul_many(
                    h,
                    &mut [
                        Q8Product {
                            out: &mut *qp,
                            packed: pq,
                            scales: sq,
                            spec: t(mm(n, q, d)),
                        },
                        Q8Product {
                            out: &mut *kp,
                            packed: pk,
                            scales: sk,
                            spec: t(mm(n, kv, d)),
                        },
                        Q8Product {
                            out: &mut *vb,
                            packed: pv,
                            scales: sv,
                            spec: t(mm(n, kv, d)),
                        },
                    ],
                )?;
            }
            _ => {
                w.wq.apply(b, qp, h, mm(n, q, d))?;
                w.wk.apply(b, kp, h, mm(n, kv, d))?;
                w.wv.apply(b, vb, h, mm(n, kv, d))?;
            }
        }
        if let (Some(lw), Some(lt), Some(ctx)) = (lw, lt.as_deref_mut(), ctx) {
            adapt(b, &lw.wq, &mut lt.wq, qp, h, ctx.spec(n, d, q))?;
            adapt(b, &lw.wk, &mut lt.wk, kp, h, ctx.spec(n, d, kv))?;
            adapt(b, &lw.wv, &mut lt.wv, vb, h, ctx.spec(n, d, kv))?;
        }
        for (out, bias, cols) in [(qp, &p.q_bias, q), (kp, &p.k_bias, kv), (&mut *vb, &p.v_bias, kv)] {
            if let Some(bias) = bias {
                b.add_bias(out, bias, n, cols)?;
            }
        }
        Ok(())
    };
    let inference = matches!(keys, Keys::Cache { .. } | Keys::Masked(_));
    // An int8 block decoding from its cache with nothing in between (no adapters, biases
    // or per-head norms): the projections through Wo's product in one call, which a
    // backend may run as one job.
    let plain = lw.is_none()
        && [&p.q_bias, &p.k_bias, &p.v_bias, &p.q_norm, &p.k_norm]
            .iter()
            .all(|o| o.is_none());
    match (keys, &w.wq, &w.wk, &w.wv, &w.wo) {
        (Keys::Cache { k, v, pos }, Mat::Q8(pq, sq), Mat::Q8(pk, sk), Mat::Q8(pv, sv), Mat::Q8(po, so))
            if plain =>
        {
            b.q8_attention(Q8Attention {
                x: &mut *x,
                h: &*h,
                q: qb,
                k: kb,
                v: vb,
                cache_k: k,
                cache_v: v,
                pos,
                att: &mut *att,
                lse,
                weights: [(pq, sq), (pk, sk), (pv, sv), (po, so)],
                rope_q,
                rope_k,
                spec,
            })?;
        }
        (keys, ..) => {
            match (&p.q_norm, &p.k_norm) {
                // Per-head norms: the projections land in q_raw/k_raw (kept for the backward),
                // then q = rmsnorm(q_raw) over rows (n * heads) of head_dim.
                (Some(qn), Some(kn)) => {
                    let [q_raw, k_raw, rstd_q, rstd_k] = qk;
                    project(q_raw, k_raw)?;
                    let hd = c.head_dim;
                    b.rmsnorm_forward(qb, rstd_q, q_raw, qn, n * c.q_heads, hd, c.norm_eps)?;
                    b.rmsnorm_forward(kb, rstd_k, k_raw, kn, n * c.kv_heads, hd, c.norm_eps)?;
                }
                _ => project(qb, kb)?,
            }
            b.rope_forward(qb, rope_q)?;
            b.rope_forward(kb, rope_k)?;
            match keys {
                Keys::Fresh => b.attention_forward(att, lse, qb, kb, vb, spec)?,
                Keys::Masked(mask) => {
                    let masked = SdpaSpec::new(spec.batch, spec.q_len, spec.q_heads, spec.head_dim)
                        .kv_heads(spec.kv_heads)
                        .causal(true);
                    b.sdpa(att, qb, kb, vb, Some(mask), None, &masked)?;
                }
                Keys::Cache { k, v, pos } => {
                    b.copy_range(k, pos * kv, kb, 0, n * kv)?;
                    b.copy_range(v, pos * kv, vb, 0, n * kv)?;
                    b.attention_forward(att, lse, qb, k, v, spec)?;
                }
            }
            // x += att Wo^T
            w.wo.apply(b, x, att, mm(n, d, q).beta(1.0))?;
            if let (Some(lw), Some(lt), Some(ctx)) = (lw, lt.as_deref_mut(), ctx) {
                adapt(b, &lw.wo, &mut lt.wo, x, att, ctx.spec(n, q, d))?;
            }
        }
    }
    if let Some((_, x_mid)) = saved.as_mut() {
        b.copy(x_mid, x)?;
    }
    b.rmsnorm_forward(h2, rstd2, x, &p.ffn_norm, n, d, c.norm_eps)?;
    // The feed-forward's adapters and activations, split between the dense part (or shared
    // expert) and the routed experts.
    let (mut mlp_lora, mut moe_lora) = (None, None);
    if let (Some(lw), Some(lt), Some(ctx)) = (lw, lt, ctx) {
        let Block { mlp: tm, moe: te, .. } = lt.as_mut();
        if let (Some(w), Some(t)) = (lw.mlp.as_ref(), tm) {
            mlp_lora = Some((w, t, ctx));
        }
        if let (Some(w), Some(t)) = (lw.moe.as_ref(), te) {
            moe_lora = Some((w, t, ctx));
        }
    }
    if let (Some(wm), Some(f), Some(scratch)) = (&w.mlp, c.mlp_width(l), ffn) {
        mlp_forward(b, wm, h2, x, scratch, n, d, f, prec, mlp_lora)?;
    }
    if let (Some(we), Some(m), Some(acts)) = (&w.moe, c.sparse(l), moe) {
        moe_forward(b, we, m, acts, h2, x, n, d, prec, inference, moe_lora)?;
    }
    Ok(())
}

/// Keys and values of every block for one sequence being decoded, with room for
/// `max_seq_len` positions; `len` are filled. Made by
/// [`TransformerModel::new_kv_caches`].
pub struct KvCache<B: Backend> {
    k: Vec<B::Buffer>,
    v: Vec<B::Buffer>,
    len: usize,
}

impl<B: Backend> KvCache<B> {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// No positions held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Forgets every position (the buffers stay allocated).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

/// Scratch of a cached forward pass over `rows` new positions.
struct DecodeArena<B: Backend> {
    rows: usize,
    x: B::Buffer,
    h: B::Buffer,
    rstd: B::Buffer,
    h2: B::Buffer,
    rstd2: B::Buffer,
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    qk: [B::Buffer; 4],
    att: B::Buffer,
    lse: B::Buffer,
    /// `(gate, up, s)` per feed-forward width.
    ffn: Triples<B>,
    /// Shared by every sparse block (they route one after another).
    moe: Option<MoeActs<B>>,
    /// Each block's `x A^T` with adapters attached (scratch here, not kept).
    lora_t: Vec<Block<Option<B::Buffer>>>,
    last: B::Buffer,
    logits: B::Buffer,
}

/// The loss of one batch: the LM loss summed over the counted positions, and their
/// number; the auxiliary losses of the sparse blocks, averaged over those blocks (0 for a
/// dense model).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LossSum {
    /// The LM loss summed over the counted positions.
    pub sum: f64,
    /// Counted positions.
    pub count: usize,
    /// The load-balancing loss (0 for a dense model).
    pub load_balance: f64,
    /// The router z-loss (0 for a dense model).
    pub router_z: f64,
}

/// Auxiliary losses of a forward pass, averaged over the sparse blocks.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct AuxLoss {
    load_balance: f64,
    router_z: f64,
}

/// A transformer LM living on backend `B`.
pub struct TransformerModel<B: Backend> {
    /// Where the buffers live and the math runs.
    pub backend: B,
    /// The architecture.
    pub config: TransformerConfig,
    /// The weights, laid out as [`TransformerConfig::layout`].
    pub params: Params<B>,
    /// The accumulated gradients, laid out like `params`.
    pub grads: Params<B>,
    /// Adam's first moments (SGD's velocity), laid out like `params`.
    pub m: Params<B>,
    /// Adam's second moments.
    pub v: Params<B>,
    /// Optimizer steps taken.
    pub step: u64,
    /// Operand precision of every GEMM (BF16 operands, f32 accumulation, when mixed).
    pub precision: Precision,
    arena: Option<Arena<B>>,
    decode: Option<DecodeArena<B>>,
    /// Set by [`TransformerModel::quantize`]: the int8 matrices. The f32 matrices, the
    /// gradients and the optimizer state are then gone.
    pub quantized: Option<QuantParams<B>>,
    /// Expert usage of the last forward pass: per sparse block, the fraction of routed
    /// slots each expert received.
    expert_usage: Vec<Vec<f64>>,
    /// Low-rank adapters ([`TransformerModel::add_lora`]); while attached, every parameter
    /// is frozen and `grads`, `m`, `v` are empty.
    pub lora: Option<LoraState<B>>,
}

impl<B: Backend> TransformerModel<B> {
    /// Initialization (GPT-2 / Llama practice): every matrix and router normal(0, 0.02),
    /// the two output projections of each block and expert (`o_proj`, `down_proj`) scaled
    /// by `1 / sqrt(2 * n_layers)` so the residual stream's variance does not grow with
    /// depth; norm weights one. Tensors are drawn in [`Tree::into_leaves`] order.
    pub fn new(backend: B, config: TransformerConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let mut rng = Rng::new(seed);
        let std = 0.02f32;
        let out_std = std / libm::sqrtf(2.0 * config.n_layers as f32);
        let b = &backend;
        let params = config.layout().try_map(|name, t| match t.kind {
            TensorKind::Norm => b.upload(&alloc::vec![1.0f32; t.len()]),
            TensorKind::Bias => b.zeros(t.len()),
            TensorKind::Matrix | TensorKind::Router => {
                let out_proj = name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight");
                b.upload(&rng.normal_vec(t.len(), if out_proj { out_std } else { std }))
            }
        })?;
        Self::from_params(backend, config, params)
    }

    /// A model around given parameters (a checkpoint, a test fixture).
    pub fn from_params(backend: B, config: TransformerConfig, params: Params<B>) -> Result<Self> {
        Self::from_params_with(backend, config, params, false)
    }

    /// [`TransformerModel::from_params`]; `frozen` leaves the gradients and moments empty
    /// (a copy of a model with adapters attached).
    fn from_params_with(
        backend: B, config: TransformerConfig, params: Params<B>, frozen: bool,
    ) -> Result<Self> {
        config.validate()?;
        let layout = config.layout();
        let named = params.as_ref().into_named();
        let want = layout.as_ref().into_named();
        if named.len() != want.len() || params.as_ref().zip(layout.as_ref()).is_none() {
            return Err(CoreError::InvalidArgument {
                op: "transformer parameters",
                message: format!(
                    "{} parameter tensors laid out differently from the configuration's {}",
                    named.len(),
                    want.len()
                ),
            });
        }
        for ((name, buf), (_, t)) in named.iter().zip(&want) {
            let (have, need) = (backend.len(buf), t.len());
            if have != need {
                return Err(CoreError::InvalidArgument {
                    op: "transformer parameters",
                    message: format!("{name} has {have} values, the configuration needs {need}"),
                });
            }
        }
        let state = |b: &B| {
            if frozen {
                hollow(b, &layout)
            } else {
                zeros_like(b, &layout)
            }
        };
        let (grads, m, v) = (state(&backend)?, state(&backend)?, state(&backend)?);
        Ok(Self::assemble(backend, config, params, [grads, m, v], None))
    }

    /// An int8 model from its parts (a Q8 checkpoint): `params` holds the f32 norms and
    /// routers (its matrices may be empty: they are dropped), `quantized` the int8
    /// matrices, both in the configuration's layout.
    pub fn from_quantized(
        backend: B, config: TransformerConfig, params: Params<B>, quantized: QuantParams<B>,
    ) -> Result<Self> {
        config.validate()?;
        let layout = config.layout();
        let b = &backend;
        let pc = crate::ops::q8::packed_cols;
        let bad = |message: String| CoreError::InvalidArgument {
            op: "transformer parameters",
            message,
        };
        let mismatch = || bad("the tensors are laid out differently from the configuration".into());
        let pairs = params
            .as_ref()
            .zip(quantized.as_ref())
            .and_then(|t| t.zip(layout.as_ref()))
            .ok_or_else(mismatch)?;
        for (name, ((f, q), t)) in pairs.into_named() {
            let (rows, cols) = t.rows_cols();
            match (t.kind, q) {
                (TensorKind::Matrix, Some((p, s))) => {
                    if b.len(p) != rows * pc(cols) || b.len(s) != rows {
                        return Err(bad(format!("int8 {name} does not have {rows} rows of {cols}")));
                    }
                }
                (TensorKind::Matrix, None) => return Err(bad(format!("{name} has no int8 weights"))),
                (_, Some(_)) => return Err(bad(format!("{name} stays f32 in an int8 model"))),
                (_, None) => {
                    if b.len(f) != t.len() {
                        return Err(bad(format!("{name} does not have {} values", t.len())));
                    }
                }
            }
        }
        // The f32 matrices an int8 model does not keep.
        let mut params = params;
        for (buf, t) in params
            .as_mut()
            .into_leaves()
            .into_iter()
            .zip(layout.as_ref().into_leaves())
        {
            if t.kind == TensorKind::Matrix {
                *buf = b.zeros(0)?;
            }
        }
        let state = [hollow(b, &layout)?, hollow(b, &layout)?, hollow(b, &layout)?];
        Ok(Self::assemble(backend, config, params, state, Some(quantized)))
    }

    /// The same model on another backend (a device, or back to the host): its weights,
    /// f32 or int8, and for an f32 model the gradients, optimizer moments, step count and
    /// GEMM precision. `self` is not changed.
    pub fn copy_to<C: Backend>(&self, backend: C) -> Result<TransformerModel<C>> {
        self.check_fits(&backend)?;
        let b = &self.backend;
        let copy = |c: &C, buf: &B::Buffer| c.upload(&b.download(buf)?);
        let tree = |c: &C, t: &Params<B>| t.as_ref().try_map(|_, h| copy(c, h));
        let params = tree(&backend, &self.params)?;
        let config = self.config.clone();
        let mut to = match &self.quantized {
            Some(q) => {
                let quantized = q.as_ref().try_map(|_, leaf| match leaf {
                    Some((packed, scales)) => Ok(Some((copy(&backend, packed)?, copy(&backend, scales)?))),
                    None => Ok(None),
                })?;
                TransformerModel::from_quantized(backend, config, params, quantized)?
            }
            None => {
                let state = [
                    tree(&backend, &self.grads)?,
                    tree(&backend, &self.m)?,
                    tree(&backend, &self.v)?,
                ];
                let mut to =
                    TransformerModel::from_params_with(backend, config, params, self.lora.is_some())?;
                [to.grads, to.m, to.v] = state;
                to
            }
        };
        if let Some(st) = &self.lora {
            to.lora = Some(st.copy_to(&self.backend, &to.backend)?);
        }
        to.step = self.step;
        to.precision = self.precision;
        Ok(to)
    }

    /// Refuses a backend whose one-buffer bound ([`Memory::max_binding_len`](crate::backend::Memory::max_binding_len)) is below
    /// what this model's f32 tensors or one position's scratch need, before anything is
    /// copied. int8 matrices are not bounded here: a backend binds them in row slabs.
    fn check_fits<C: Backend>(&self, to: &C) -> Result<()> {
        let limit = to.max_binding_len();
        if limit == usize::MAX {
            return Ok(());
        }
        let c = &self.config;
        let mut needs: Vec<(String, usize)> = alloc::vec![
            ("the logits of one position".into(), c.vocab_size),
            ("one layer's KV cache".into(), c.max_seq_len * c.kv_dim()),
            (
                "one position's attention scores".into(),
                c.q_heads * c.max_seq_len
            ),
            ("the RoPE table".into(), c.max_seq_len * c.head_dim),
        ];
        if let Some(f) = (0..c.n_layers).filter_map(|l| c.mlp_width(l)).max() {
            needs.push(("one position's feed-forward".into(), f));
        }
        for (name, buf) in self.params.as_ref().into_named() {
            needs.push((name, self.backend.len(buf)));
        }
        match needs.into_iter().find(|(_, n)| *n > limit) {
            Some((what, n)) => Err(CoreError::Device {
                backend: to.name(),
                message: format!(
                    "{what} needs {n} values in one buffer, over this adapter's limit of {limit} \
                     values per binding: use a smaller model or max_seq_len, or the CPU"
                ),
            }),
            None => Ok(()),
        }
    }

    /// A model at step 0 around checked parts: `[grads, m, v]` laid out like `params`.
    fn assemble(
        backend: B, config: TransformerConfig, params: Params<B>, [grads, m, v]: [Params<B>; 3],
        quantized: Option<QuantParams<B>>,
    ) -> Self {
        TransformerModel {
            backend,
            config,
            params,
            grads,
            m,
            v,
            step: 0,
            precision: Precision::F32,
            arena: None,
            decode: None,
            quantized,
            expert_usage: Vec::new(),
            lora: None,
        }
    }

    fn ensure_arena(&mut self, batch: usize, seq: usize) -> Result<()> {
        if seq > self.config.max_seq_len {
            return Err(CoreError::InvalidDimension {
                op: "transformer forward",
                message: format!(
                    "sequence length {seq} is over max_seq_len {}",
                    self.config.max_seq_len
                ),
            });
        }
        if self
            .arena
            .as_ref()
            .is_none_or(|a| a.batch != batch || a.seq != seq)
        {
            // Drop the old arena first so peak memory holds one, not two.
            self.arena = None;
            let lora = self.lora.as_ref().map(|l| &l.config);
            self.arena = Some(Arena::new(&self.backend, &self.config, batch, seq, lora)?);
        }
        Ok(())
    }

    /// Expert usage of the last forward pass (training, evaluation or decoding): one row
    /// per sparse block, the fraction of routed slots each expert received. Empty for a
    /// dense model or before any forward pass.
    pub fn expert_usage(&self) -> &[Vec<f64>] {
        &self.expert_usage
    }

    /// Forward pass of a batch up to the logits (kept in the arena); returns the sparse
    /// blocks' auxiliary losses.
    fn forward(&mut self, tb: &TokenBatch) -> Result<AuxLoss> {
        tb.check(self.config.vocab_size)?;
        self.ensure_arena(tb.batch, tb.seq)?;
        let c = &self.config;
        let (n, d) = (tb.batch * tb.seq, c.d_model);
        let b = &self.backend;
        let arena = self.arena.as_mut().expect("ensured above");
        let (rope_q, rope_k) = c.rope_specs(tb.batch, tb.seq, 0);
        let att_spec = AttentionSpec::causal(tb.batch, tb.seq, c.q_heads, c.kv_heads, c.head_dim);
        let prec = self.precision;
        let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
        let quantized = self.quantized.as_ref();
        // The residual stream runs through x_out; each block saves its input and middle.
        arena.embed(b, c, &self.params, quantized, &tb.inputs)?;
        let mut aux = AuxLoss::default();
        self.expert_usage.clear();
        let lora_ctx = self.lora.as_ref().map(|st| LoraCtx {
            rank: st.config.rank,
            scale: st.config.scale(),
            prec,
        });
        for l in 0..c.n_layers {
            let w = block_view(&self.params, quantized, l)?;
            let lora = match (&self.lora, lora_ctx) {
                (Some(st), Some(ctx)) => Some(BlockLora {
                    w: &st.weights.layers[l],
                    t: &mut arena.lora_t[l],
                    ctx,
                }),
                _ => None,
            };
            let a = &mut arena.layers[l];
            let acts = a.acts(true);
            let specs = (&rope_q, &rope_k, &att_spec);
            let p = &self.params.layers[l];
            block_forward(
                b,
                c,
                l,
                p,
                &w,
                &mut arena.x_out,
                acts,
                Keys::Fresh,
                specs,
                n,
                prec,
                lora,
            )?;
            if let Some(acts) = &a.moe {
                aux.load_balance += acts.routing.load_balance;
                aux.router_z += acts.routing.z_loss;
                self.expert_usage.push(acts.routing.usage());
            }
        }
        let sparse = c.sparse_layers().max(1) as f64;
        aux.load_balance /= sparse;
        aux.router_z /= sparse;
        arena.final_norm(b, c, &self.params, n)?;
        // logits = hf E^T   (n, d) x (vocab, d)^T
        let head = match quantized.map(|q| q.head()) {
            Some(Some((packed, scales))) => Mat::Q8(packed, scales),
            _ => Mat::F32(self.params.head()),
        };
        head.apply(b, &mut arena.logits, &arena.hf, mm(n, c.vocab_size, d))?;
        Ok(aux)
    }

    /// The residual stream after each decoder layer in `layers` (1-based: layer `k`'s
    /// output is transformers' `hidden_states[k]`: before the final norm, except after the
    /// last layer, where transformers records the normed stream), for `ids`
    /// (`batch` rows of equal length) under `mask` (`true` for real tokens; padded
    /// positions see the real tokens only). Layers past the last one asked for are not
    /// run. Each entry is `(batch, seq, d_model)`.
    pub fn hidden_states(
        &mut self, ids: &[u32], batch: usize, mask: Option<&[bool]>, layers: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        let err = |message: String| CoreError::InvalidDimension {
            op: "hidden_states",
            message,
        };
        if batch == 0 || ids.is_empty() || !ids.len().is_multiple_of(batch) {
            return Err(err(format!("{} ids do not make {batch} rows", ids.len())));
        }
        if let Some(&bad) = layers.iter().find(|&&l| l == 0 || l > c.n_layers) {
            return Err(err(format!(
                "layer {bad}: the model's layers are 1..={}",
                c.n_layers
            )));
        }
        let seq = ids.len() / batch;
        let tb = TokenBatch {
            batch,
            seq,
            inputs: ids.to_vec(),
            targets: alloc::vec![0; ids.len()],
            mask: alloc::vec![true; ids.len()],
        };
        tb.check(c.vocab_size)?;
        let all_open;
        let mask = match mask {
            Some(m) => {
                crate::error::check_len("hidden_states", "mask", m.len(), ids.len())?;
                m
            }
            None => {
                all_open = alloc::vec![true; ids.len()];
                &all_open
            }
        };
        self.ensure_arena(batch, seq)?;
        let c = &self.config;
        let n = batch * seq;
        let b = &self.backend;
        let arena = self.arena.as_mut().expect("ensured above");
        let (rope_q, rope_k) = c.rope_specs(batch, seq, 0);
        let att_spec = AttentionSpec::causal(batch, seq, c.q_heads, c.kv_heads, c.head_dim);
        let quantized = self.quantized.as_ref();
        arena.embed(b, c, &self.params, quantized, ids)?;
        let last = layers.iter().copied().max().unwrap_or(0);
        let mut out = alloc::vec![Vec::new(); layers.len()];
        for l in 0..last {
            let w = block_view(&self.params, quantized, l)?;
            let acts = arena.layers[l].acts(false);
            let specs = (&rope_q, &rope_k, &att_spec);
            let p = &self.params.layers[l];
            block_forward(
                b,
                c,
                l,
                p,
                &w,
                &mut arena.x_out,
                acts,
                Keys::Masked(mask),
                specs,
                n,
                self.precision,
                None,
            )?;
            // transformers' last entry is the final-normed stream, not the residual.
            let state = if l + 1 == c.n_layers {
                arena.final_norm(b, c, &self.params, n)?;
                &arena.hf
            } else {
                &arena.x_out
            };
            for (slot, _) in layers.iter().enumerate().filter(|(_, &k)| k == l + 1) {
                out[slot] = b.download(state)?;
            }
        }
        Ok(out)
    }

    /// Bytes the weights and any training state hold (parameters, gradients, optimizer
    /// moments, int8 matrices and their scales); activations are not counted.
    pub fn weight_bytes(&self) -> usize {
        let b = &self.backend;
        let tree = |t: &Params<B>| -> usize { t.as_ref().into_leaves().into_iter().map(|x| b.len(x)).sum() };
        let q8: usize = match &self.quantized {
            Some(q) => q
                .as_ref()
                .into_leaves()
                .into_iter()
                .flatten()
                .map(|(p, s)| b.len(p) + b.len(s))
                .sum(),
            None => 0,
        };
        4 * (tree(&self.params) + tree(&self.grads) + tree(&self.m) + tree(&self.v) + q8)
    }

    /// Sets the longest sequence the model takes, for a published model whose context
    /// (131,072 positions for Llama 3.1) would make KV caches of many gigabytes: the caches
    /// are `n_layers x 2 x max_seq_len x kv_dim` values. Nothing learned depends on it; RoPE
    /// positions are absolute. Caches made before are refused afterwards (their shape no
    /// longer matches), so a conversation starts again.
    pub fn set_max_seq_len(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Err(invalid("max_seq_len must be at least 1".into()));
        }
        self.config.max_seq_len = n;
        Ok(())
    }

    /// Empty key/value caches for one sequence of up to `max_seq_len` positions.
    pub fn new_kv_caches(&self) -> Result<KvCache<B>> {
        let n = self.config.max_seq_len * self.config.kv_dim();
        let b = &self.backend;
        Ok(KvCache {
            k: (0..self.config.n_layers)
                .map(|_| b.zeros(n))
                .collect::<Result<_>>()?,
            v: (0..self.config.n_layers)
                .map(|_| b.zeros(n))
                .collect::<Result<_>>()?,
            len: 0,
        })
    }

    /// Runs `ids` (one sequence, any number of new positions) after the `cache.len()`
    /// positions already in `cache`, appends their keys and values, and returns the logits
    /// of the last new position (`vocab_size` values). Prefill is one call with the whole
    /// prompt; decoding, one call per token.
    pub fn forward_cached(&mut self, ids: &[u32], cache: &mut KvCache<B>) -> Result<Vec<f32>> {
        self.forward_cached_on_device(ids, cache)?;
        let a = self.decode.as_ref().expect("the pass made it");
        self.backend.download(&a.logits)
    }

    /// [`TransformerModel::forward_cached`], leaving the logits in the backend's buffer
    /// (`vocab_size` values) for a sampler that runs where they are: on a GPU, a greedy
    /// token then reads back one id, and nothing in the pass waits for the device (an
    /// int8 model's experts are routed there too, see [`MoeOps::routes_on_device`](crate::backend::MoeOps::routes_on_device)).
    /// Refused input changes nothing: every id and the cache's room are checked first.
    pub fn forward_cached_on_device(&mut self, ids: &[u32], cache: &mut KvCache<B>) -> Result<&B::Buffer> {
        self.check_cached(ids, cache)?;
        // A long prompt in pieces, so a piece's attention scores over the whole cache
        // (rows x q_heads x max_seq_len) stay within 2^25 values (128 MiB, the storage
        // binding every WebGPU adapter offers) and within the backend's binding. The
        // pieces give the same values.
        let c = &self.config;
        let room = (1usize << 25).min(self.backend.max_binding_len());
        let most = (room / (c.q_heads * c.max_seq_len).max(1)).clamp(1, 256);
        for piece in ids.chunks(most) {
            self.forward_cached_piece(piece, cache)?;
        }
        Ok(&self.decode.as_ref().expect("the pass made it").logits)
    }

    /// The logits the last cached forward pass left in the backend's buffer, if any.
    pub fn cached_logits(&self) -> Option<&B::Buffer> {
        self.decode.as_ref().map(|a| &a.logits)
    }

    /// What [`TransformerModel::forward_cached`] refuses.
    fn check_cached(&self, ids: &[u32], cache: &KvCache<B>) -> Result<()> {
        let c = &self.config;
        let r = ids.len();
        if r == 0 {
            return Err(batch_err("forward_cached needs at least one token id".into()));
        }
        if let Some(i) = ids.iter().position(|&t| t as usize >= c.vocab_size) {
            return Err(CoreError::TokenOutOfRange {
                what: "input",
                id: ids[i],
                row: 0,
                position: cache.len + i,
                vocab: c.vocab_size,
            });
        }
        let want = c.max_seq_len * c.kv_dim();
        if cache.k.len() != c.n_layers
            || cache
                .k
                .iter()
                .chain(&cache.v)
                .any(|buf| self.backend.len(buf) != want)
        {
            return Err(invalid(
                "this KV cache was made for a model of another shape".into(),
            ));
        }
        if cache.len + r > c.max_seq_len {
            return Err(CoreError::InvalidDimension {
                op: "forward_cached",
                message: format!(
                    "{} cached + {r} new positions is over max_seq_len {}",
                    cache.len, c.max_seq_len
                ),
            });
        }
        Ok(())
    }

    /// One piece of a cached forward pass, checked by the caller; the logits of its last
    /// position are left in the decode arena.
    fn forward_cached_piece(&mut self, ids: &[u32], cache: &mut KvCache<B>) -> Result<()> {
        let c = &self.config;
        let r = ids.len();
        let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
        let b = &self.backend;
        if self.decode.as_ref().is_none_or(|a| a.rows != r) {
            self.decode = None;
            let mut lens: Vec<usize> = (0..c.n_layers)
                .filter_map(|l| c.mlp_width(l))
                .map(|f| r * f)
                .collect();
            lens.dedup();
            self.decode = Some(DecodeArena {
                rows: r,
                x: b.zeros(r * d)?,
                h: b.zeros(r * d)?,
                rstd: b.zeros(r)?,
                h2: b.zeros(r * d)?,
                rstd2: b.zeros(r)?,
                q: b.zeros(r * q)?,
                k: b.zeros(r * kv)?,
                v: b.zeros(r * kv)?,
                qk: qk_scratch(b, c, r)?,
                att: b.zeros(r * q)?,
                lse: b.zeros(r * c.q_heads)?,
                ffn: Triples::new(b, lens)?,
                moe: match &c.moe {
                    Some(m) => Some(MoeActs::new(b, r, d, m)?),
                    None => None,
                },
                lora_t: lora_t_for(b, c, self.lora.as_ref().map(|l| &l.config), r)?,
                last: b.zeros(d)?,
                logits: b.zeros(c.vocab_size)?,
            });
        }
        let a = self.decode.as_mut().expect("made above");
        let prec = self.precision;
        let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
        let pos = cache.len;
        let (rope_q, rope_k) = c.rope_specs(1, r, pos);
        let spec = AttentionSpec {
            batch: 1,
            q_len: r,
            kv_len: pos + r,
            kv_capacity: c.max_seq_len,
            q_heads: c.q_heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        };
        let quantized = self.quantized.as_ref();
        let experts_adapted = self.lora.as_ref().is_some_and(|l| {
            l.config
                .targets
                .iter()
                .any(|t| ["gate_proj", "up_proj", "down_proj"].contains(&t.as_str()))
        });
        let routed_here = quantized.is_some() && b.routes_on_device() && !experts_adapted;
        match quantized.map(|q| &q.embed) {
            Some(Some((packed, scales))) => b.q8_embedding(&mut a.x, packed, scales, ids, c.vocab_size, d)?,
            _ => b.embedding_forward(&mut a.x, &self.params.embed, ids, c.vocab_size, d)?,
        }
        self.expert_usage.clear();
        let lora_ctx = self.lora.as_ref().map(|st| LoraCtx {
            rank: st.config.rank,
            scale: st.config.scale(),
            prec,
        });
        for l in 0..c.n_layers {
            let w = block_view(&self.params, quantized, l)?;
            let lora = match (&self.lora, lora_ctx) {
                (Some(st), Some(ctx)) => Some(BlockLora {
                    w: &st.weights.layers[l],
                    t: &mut a.lora_t[l],
                    ctx,
                }),
                _ => None,
            };
            let ffn = match c.mlp_width(l) {
                Some(f) => {
                    let [gate, up, s] = a.ffn.get(r * f)?;
                    Some([gate, up, s])
                }
                None => None,
            };
            let acts = BlockActs {
                h: &mut a.h,
                rstd1: &mut a.rstd,
                q: &mut a.q,
                k: &mut a.k,
                v: &mut a.v,
                qk: &mut a.qk,
                att: &mut a.att,
                lse: &mut a.lse,
                h2: &mut a.h2,
                rstd2: &mut a.rstd2,
                ffn,
                moe: a.moe.as_mut(),
                saved: None,
            };
            let keys = Keys::Cache {
                k: &mut cache.k[l],
                v: &mut cache.v[l],
                pos,
            };
            let p = &self.params.layers[l];
            block_forward(
                b,
                c,
                l,
                p,
                &w,
                &mut a.x,
                acts,
                keys,
                (&rope_q, &rope_k, &spec),
                r,
                prec,
                lora,
            )?;
            // Routed on the device, the counts stay there: no usage is reported.
            if let (Some(_), Some(acts), false) = (c.sparse(l), &a.moe, routed_here) {
                self.expert_usage.push(acts.routing.usage());
            }
        }
        b.rmsnorm_forward(
            &mut a.h,
            &mut a.rstd,
            &a.x,
            &self.params.final_norm,
            r,
            d,
            c.norm_eps,
        )?;
        b.copy_range(&mut a.last, 0, &a.h, (r - 1) * d, d)?;
        // Only the last position's logits: one (1, d) x (d, vocab) product.
        let head = match quantized.map(|q| q.head()) {
            Some(Some((packed, scales))) => Mat::Q8(packed, scales),
            _ => Mat::F32(self.params.head()),
        };
        head.apply(b, &mut a.logits, &a.last, mm(1, c.vocab_size, d))?;
        cache.len += r;
        Ok(())
    }

    /// Logits of the last forward pass, on the host, `(batch * seq, vocab)`.
    pub fn forward_logits(&mut self, tb: &TokenBatch) -> Result<Vec<f32>> {
        self.forward(tb)?;
        self.backend
            .download(&self.arena.as_ref().expect("forward made it").logits)
    }

    /// Forward and loss, no gradients.
    pub fn evaluate(&mut self, tb: &TokenBatch) -> Result<LossSum> {
        let aux = self.forward(tb)?;
        let arena = self.arena.as_mut().expect("forward made it");
        let n = tb.batch * tb.seq;
        let s = self.backend.cross_entropy(
            &mut arena.logits,
            &tb.targets,
            Some(&tb.mask),
            n,
            self.config.vocab_size,
            None,
        )?;
        Ok(LossSum {
            sum: s.loss_sum,
            count: s.count,
            load_balance: aux.load_balance,
            router_z: aux.router_z,
        })
    }

    /// Forward and backward: adds the gradient of this batch's objective — the mean LM
    /// loss over its counted positions, plus the sparse blocks' auxiliary losses times
    /// their coefficients — to `grads`, and returns the losses. With adapters attached only
    /// the adapters' gradients are computed: no frozen weight's gradient is formed, the
    /// backward pass only carries the input gradients through the frozen (f32 or int8)
    /// weights.
    pub fn accumulate(&mut self, tb: &TokenBatch) -> Result<LossSum> {
        if self.lora.is_none() {
            self.refuse_if_quantized("training")?;
        }
        let count = tb.counted();
        if count == 0 {
            return Err(batch_err(
                "no position of the batch counts in the loss (the mask is all false)".into(),
            ));
        }
        let aux = self.forward(tb)?;
        let c = &self.config;
        let (n, d, q, kv) = (tb.batch * tb.seq, c.d_model, c.q_dim(), c.kv_dim());
        let prec = self.precision;
        let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
        let b = &self.backend;
        let arena = self.arena.as_mut().expect("forward made it");
        let quantized = self.quantized.as_ref();
        let params = &self.params;
        // Frozen under adapters: `grads` is empty, and the adapters' gradients are formed.
        let mut lora = self.lora.as_mut();
        let frozen = lora.is_some();
        let lora_ctx = lora.as_ref().map(|st| LoraCtx {
            rank: st.config.rank,
            scale: st.config.scale(),
            prec,
        });
        let grads = &mut self.grads;
        // Each sparse block's share of the auxiliary losses' weights.
        let aux_scales = match &c.moe {
            Some(m) => {
                let sparse = m.layers.len() as f32;
                (m.load_balance_coef / sparse, m.router_z_coef / sparse)
            }
            None => (0.0, 0.0),
        };
        // Loss and dlogits (in place), for the mean over counted positions.
        let s = b.cross_entropy(
            &mut arena.logits,
            &tb.targets,
            Some(&tb.mask),
            n,
            c.vocab_size,
            Some(1.0 / count as f32),
        )?;
        // Head W (the embedding when tied): dW += dlogits^T hf, dhf = dlogits W
        if !frozen {
            let head_grad = match grads.lm_head.as_mut() {
                Some(g) => g,
                None => &mut grads.embed,
            };
            b.matmul(
                head_grad,
                &arena.logits,
                &arena.hf,
                &mm(c.vocab_size, d, n).trans_a(true).accumulate(),
            )?;
        }
        let head = match quantized.map(|q| q.head()) {
            Some(Some((packed, scales))) => Mat::Q8(packed, scales),
            _ => Mat::F32(params.head()),
        };
        head.grad_input(
            b,
            &mut arena.dh,
            &arena.logits,
            mm(n, d, c.vocab_size),
            &mut arena.deq,
        )?;
        b.rmsnorm_backward(
            &mut arena.dx,
            if frozen {
                &mut arena.sink_d
            } else {
                &mut grads.final_norm
            },
            &arena.dh,
            &arena.x_out,
            &params.final_norm,
            &arena.rstd_f,
            n,
            d,
        )?;
        let (rope_q, rope_k) = c.rope_specs(tb.batch, tb.seq, 0);
        let att_spec = AttentionSpec::causal(tb.batch, tb.seq, c.q_heads, c.kv_heads, c.head_dim);
        let layout_err = || invalid("gradients laid out differently from the parameters".into());
        for l in (0..c.n_layers).rev() {
            let (p, a) = (&params.layers[l], &arena.layers[l]);
            let w = block_view(params, quantized, l)?;
            let mut g = (!frozen).then(|| &mut grads.layers[l]);
            // The adapters of this block: weights, gradients (split by part), kept x A^T.
            let (lw, mut lg, lt) = match lora.as_deref_mut() {
                Some(st) => (
                    Some(&st.weights.layers[l]),
                    Some(st.grads.layers[l].as_mut()),
                    Some(&arena.lora_t[l]),
                ),
                None => (None, None, None),
            };
            let (lg_mlp, lg_moe) = match lg.as_mut() {
                Some(lg) => (lg.mlp.take(), lg.moe.take()),
                None => (None, None),
            };
            // --- FFN: x_out = x_mid + mlp(h2) + experts(h2); dx holds d x_out, dh gets d h2.
            match (&w.mlp, c.mlp_width(l)) {
                (Some(pm), Some(f)) => {
                    let gm = match g.as_deref_mut() {
                        Some(g) => Some(g.mlp.as_mut().ok_or_else(layout_err)?),
                        None => None,
                    };
                    let ml = match (
                        lw.and_then(|w| w.mlp.as_ref()),
                        lg_mlp,
                        lt.and_then(|t| t.mlp.as_ref()),
                        lora_ctx,
                    ) {
                        (Some(w), Some(g), Some(t), Some(ctx)) => Some((w, g, t, &mut arena.lora_dt, ctx)),
                        _ => None,
                    };
                    mlp_backward(
                        b,
                        pm,
                        gm,
                        [&a.h2, &a.gate, &a.up, &a.s],
                        &arena.dx,
                        &mut arena.dh,
                        arena.ffn.get(n * f)?,
                        (n, d, f),
                        prec,
                        &mut arena.deq,
                        ml,
                    )?
                }
                (None, None) => b.fill(&mut arena.dh, 0.0)?,
                _ => return Err(layout_err()),
            }
            match (&w.moe, c.sparse(l), &a.moe) {
                (Some(pe), Some(m), Some(acts)) => {
                    let ge = match g.as_deref_mut() {
                        Some(g) => Some(g.moe.as_mut().ok_or_else(layout_err)?),
                        None => None,
                    };
                    let ml = match (
                        lw.and_then(|w| w.moe.as_ref()),
                        lg_moe,
                        lt.and_then(|t| t.moe.as_ref()),
                        lora_ctx,
                    ) {
                        (Some(w), Some(g), Some(t), Some(ctx)) => Some((w, g, t, &mut arena.lora_dt, ctx)),
                        _ => None,
                    };
                    moe_backward(
                        b,
                        pe,
                        ge,
                        m,
                        acts,
                        &a.h2,
                        &arena.dx,
                        &mut arena.dh,
                        &mut arena.dxe,
                        &mut arena.dlogits,
                        arena.ffn.get(n * m.top_k * m.expert_d_ff)?,
                        (n, d),
                        prec,
                        aux_scales,
                        &mut arena.deq,
                        ml,
                    )?
                }
                (None, None, None) => {}
                _ => return Err(layout_err()),
            }
            // d x_mid = dx (residual) + rmsnorm backward of dh
            b.rmsnorm_backward(
                &mut arena.dx2,
                match g.as_deref_mut() {
                    Some(g) => &mut g.ffn_norm,
                    None => &mut arena.sink_d,
                },
                &arena.dh,
                &a.x_mid,
                &p.ffn_norm,
                &a.rstd2,
                n,
                d,
            )?;
            b.axpy(&mut arena.dx2, 1.0, &arena.dx)?;
            // --- attention: x_mid = x_in + att Wo^T; dx2 holds d x_mid.
            if let Some(g) = g.as_deref_mut() {
                b.matmul(
                    &mut g.wo,
                    &arena.dx2,
                    &a.att,
                    &mm(d, q, n).trans_a(true).accumulate(),
                )?;
            }
            w.wo.grad_input(b, &mut arena.datt, &arena.dx2, mm(n, q, d), &mut arena.deq)?;
            if let (Some(lw), Some(lg), Some(lt), Some(ctx)) = (lw, lg.as_mut(), lt, lora_ctx) {
                let spec = ctx.spec(n, q, d);
                adapt_backward(
                    b,
                    &lw.wo,
                    lg.wo,
                    &lt.wo,
                    &mut arena.lora_dt,
                    Some(&mut arena.datt),
                    &arena.dx2,
                    &a.att,
                    spec,
                )?;
            }
            b.attention_backward(
                &mut arena.dq,
                &mut arena.dk,
                &mut arena.dv,
                &arena.datt,
                &a.q,
                &a.k,
                &a.v,
                &a.att,
                &a.lse,
                &att_spec,
            )?;
            b.rope_backward(&mut arena.dq, &rope_q)?;
            b.rope_backward(&mut arena.dk, &rope_k)?;
            // Through the per-head norms: dq then holds the gradient of q before them.
            if let (Some(qn), Some(kn)) = (&p.q_norm, &p.k_norm) {
                let [q_raw, k_raw, rstd_q, rstd_k] = &a.qk;
                let hd = c.head_dim;
                let rows = [n * c.q_heads, n * c.kv_heads];
                let ins = [(q_raw, qn, rstd_q), (k_raw, kn, rstd_k)];
                let mut outs = [(&mut arena.dq_raw, &arena.dq), (&mut arena.dk_raw, &arena.dk)];
                for (i, (dst, dy)) in outs.iter_mut().enumerate() {
                    let (x, wn, rstd) = ins[i];
                    let dweight = match g.as_deref_mut() {
                        Some(g) => if i == 0 {
                            g.q_norm.as_mut()
                        } else {
                            g.k_norm.as_mut()
                        }
                        .ok_or_else(layout_err)?,
                        None => &mut arena.sink_hd,
                    };
                    b.rmsnorm_backward(dst, dweight, dy, x, wn, rstd, rows[i], hd)?;
                }
                core::mem::swap(&mut arena.dq, &mut arena.dq_raw);
                core::mem::swap(&mut arena.dk, &mut arena.dk_raw);
            }
            if let Some(g) = g.as_deref_mut() {
                for (gb, dout, cols) in [
                    (g.q_bias.as_mut(), &arena.dq, q),
                    (g.k_bias.as_mut(), &arena.dk, kv),
                    (g.v_bias.as_mut(), &arena.dv, kv),
                ] {
                    if let Some(gb) = gb {
                        b.bias_backward(gb, dout, n, cols)?;
                    }
                }
                b.matmul(
                    &mut g.wq,
                    &arena.dq,
                    &a.h,
                    &mm(q, d, n).trans_a(true).accumulate(),
                )?;
                b.matmul(
                    &mut g.wk,
                    &arena.dk,
                    &a.h,
                    &mm(kv, d, n).trans_a(true).accumulate(),
                )?;
                b.matmul(
                    &mut g.wv,
                    &arena.dv,
                    &a.h,
                    &mm(kv, d, n).trans_a(true).accumulate(),
                )?;
            }
            w.wq.grad_input(b, &mut arena.dh, &arena.dq, mm(n, d, q), &mut arena.deq)?;
            w.wk.grad_input(
                b,
                &mut arena.dh,
                &arena.dk,
                mm(n, d, kv).accumulate(),
                &mut arena.deq,
            )?;
            w.wv.grad_input(
                b,
                &mut arena.dh,
                &arena.dv,
                mm(n, d, kv).accumulate(),
                &mut arena.deq,
            )?;
            if let (Some(lw), Some(lg), Some(lt), Some(ctx)) = (lw, lg, lt, lora_ctx) {
                let dt = &mut arena.lora_dt;
                for (pair, grad, t, dy, cols) in [
                    (&lw.wq, lg.wq, &lt.wq, &arena.dq, q),
                    (&lw.wk, lg.wk, &lt.wk, &arena.dk, kv),
                    (&lw.wv, lg.wv, &lt.wv, &arena.dv, kv),
                ] {
                    adapt_backward(
                        b,
                        pair,
                        grad,
                        t,
                        dt,
                        Some(&mut arena.dh),
                        dy,
                        &a.h,
                        ctx.spec(n, d, cols),
                    )?;
                }
            }
            // d x_in = dx2 (residual) + rmsnorm backward of dh, into dx for the block below.
            b.rmsnorm_backward(
                &mut arena.dx,
                match g {
                    Some(g) => &mut g.attn_norm,
                    None => &mut arena.sink_d,
                },
                &arena.dh,
                &a.x_in,
                &p.attn_norm,
                &a.rstd1,
                n,
                d,
            )?;
            b.axpy(&mut arena.dx, 1.0, &arena.dx2)?;
        }
        if !frozen {
            b.embedding_backward(&mut grads.embed, &arena.dx, &tb.inputs, c.vocab_size, d)?;
        }
        Ok(LossSum {
            sum: s.loss_sum,
            count: s.count,
            load_balance: aux.load_balance,
            router_z: aux.router_z,
        })
    }

    /// Rounds every matrix to int8 with per-row absmax scales (norm weights and routers
    /// stay f32), then frees the f32 matrices, the gradients and the optimizer state:
    /// one-way, inference only. Calling it again does nothing.
    pub fn quantize(&mut self) -> Result<()> {
        if self.quantized.is_some() {
            return Ok(());
        }
        let layout = self.config.layout();
        let b = &self.backend;
        let pairs = self
            .params
            .as_ref()
            .zip(layout.as_ref())
            .ok_or_else(|| invalid("parameters laid out differently from the configuration".into()))?;
        let quantized = pairs.try_map(|_, (buf, t)| match t.kind {
            TensorKind::Matrix => {
                let (rows, cols) = t.rows_cols();
                let host = b.download(buf)?;
                let (packed, scales) = crate::ops::q8::quantize_rows(&host, rows, cols)?;
                Ok(Some((b.upload(&packed)?, b.upload(&scales)?)))
            }
            TensorKind::Norm | TensorKind::Bias | TensorKind::Router => Ok(None),
        })?;
        self.quantized = Some(quantized);
        // Free what an int8 model no longer has: f32 matrices, gradients, moments, arenas.
        for (buf, t) in self
            .params
            .as_mut()
            .into_leaves()
            .into_iter()
            .zip(layout.as_ref().into_leaves())
        {
            if t.kind == TensorKind::Matrix {
                *buf = b.zeros(0)?;
            }
        }
        for set in [&mut self.grads, &mut self.m, &mut self.v] {
            for buf in set.as_mut().into_leaves() {
                *buf = b.zeros(0)?;
            }
        }
        self.arena = None;
        self.decode = None;
        Ok(())
    }

    fn refuse_if_quantized(&self, what: &str) -> Result<()> {
        if self.quantized.is_some() {
            return Err(CoreError::InvalidArgument {
                op: "transformer",
                message: format!("{what}: the model is quantized (int8, inference only); reload the f32 checkpoint to train"),
            });
        }
        Ok(())
    }

    /// Zeroes the accumulated gradients (the adapters' while adapters are attached).
    pub fn zero_grad(&mut self) -> Result<()> {
        if let Some(st) = self.lora.as_mut() {
            for g in adapter_buffers_mut(&mut st.grads) {
                self.backend.fill(g, 0.0)?;
            }
            return Ok(());
        }
        self.refuse_if_quantized("zero_grad")?;
        for g in self.grads.as_mut().into_leaves() {
            self.backend.fill(g, 0.0)?;
        }
        Ok(())
    }

    /// The global L2 norm of the accumulated gradients (the adapters' while attached)
    /// times `scale`.
    pub fn grad_norm(&self, scale: f32) -> Result<f64> {
        let total = match &self.lora {
            Some(st) => self.backend.sum_of_squares_many(&adapter_buffers(&st.grads))?,
            None => self
                .backend
                .sum_of_squares_many(&self.grads.as_ref().into_leaves())?,
        };
        Ok(libm::sqrt(total) * scale.abs() as f64)
    }

    /// Attaches fresh adapters ([`LoraState::new`], drawn from `seed`) to the projections
    /// `config` targets and freezes every parameter: the gradients and optimizer moments of
    /// the base are freed, and `accumulate`/`step` train the adapters alone. The model's
    /// predictions are unchanged (every `B` starts at zero). The base may be int8.
    pub fn add_lora(&mut self, config: LoraConfig, seed: u64) -> Result<()> {
        if self.lora.is_some() {
            return Err(invalid(
                "adapters are attached already: merge_lora() first, or start again from the base".into(),
            ));
        }
        let state = LoraState::new(&self.backend, config, &self.config.layout(), seed)?;
        let layout = self.config.layout();
        let b = &self.backend;
        for set in [&mut self.grads, &mut self.m, &mut self.v] {
            *set = hollow(b, &layout)?;
        }
        self.lora = Some(state);
        self.arena = None;
        self.decode = None;
        Ok(())
    }

    /// Folds the adapters into the weights they adapt (`W += scale * B A`) and unfreezes
    /// the model, with fresh gradients and optimizer moments: an ordinary model that
    /// predicts what the adapted one did. Refused on an int8 base (its f32 weights are gone).
    pub fn merge_lora(&mut self) -> Result<()> {
        let Some(st) = self.lora.as_ref() else {
            return Err(invalid("merge_lora: no adapters are attached".into()));
        };
        if self.quantized.is_some() {
            return Err(invalid(
                "merge_lora: the base is int8 and its f32 weights are gone; attach and load the adapters on the f32 base to merge".into(),
            ));
        }
        lora::merge_into(&self.backend, &mut self.params, st)?;
        let layout = self.config.layout();
        self.grads = zeros_like(&self.backend, &layout)?;
        self.m = zeros_like(&self.backend, &layout)?;
        self.v = zeros_like(&self.backend, &layout)?;
        self.lora = None;
        self.arena = None;
        self.decode = None;
        Ok(())
    }

    /// Values the optimizer updates: the adapters' while attached, else every parameter.
    pub fn trainable_parameters(&self) -> usize {
        match &self.lora {
            Some(st) => st.parameter_count(&self.backend),
            None => self.config.parameter_count(),
        }
    }

    /// One AdamW (or SGD) step with the accumulated gradients times `grad_scale`; weight
    /// decay applies to the embedding, the projections and the routers, never to norm
    /// weights.
    pub fn step(&mut self, optimizer: &Optimizer, grad_scale: f32) -> Result<()> {
        if let Some(st) = self.lora.as_mut() {
            // Adapters alone, every one decayed (as AdamW over PEFT's trainable parameters).
            optimizer.validate()?;
            self.step += 1;
            let b = &self.backend;
            let ps = adapter_buffers_mut(&mut st.weights);
            let gs = adapter_buffers(&st.grads);
            let ms = adapter_buffers_mut(&mut st.m);
            let vs = adapter_buffers_mut(&mut st.v);
            for (((p, g), m), v) in ps.into_iter().zip(gs).zip(ms).zip(vs) {
                if let Some(hp) = optimizer.adam_params(grad_scale) {
                    b.adam_update(p, g, m, v, &hp, self.step)?;
                } else if let Some(hp) = optimizer.sgd_params(grad_scale) {
                    let velocity = if hp.momentum != 0.0 { Some(m) } else { None };
                    b.sgd_update(p, g, velocity, &hp)?;
                }
            }
            return Ok(());
        }
        self.refuse_if_quantized("step")?;
        optimizer.validate()?;
        self.step += 1;
        let decays: Vec<bool> = self
            .config
            .layout()
            .into_leaves()
            .iter()
            .map(|t| !matches!(t.kind, TensorKind::Norm | TensorKind::Bias))
            .collect();
        let b = &self.backend;
        let params = self.params.as_mut().into_leaves();
        let grads = self.grads.as_ref().into_leaves();
        let ms = self.m.as_mut().into_leaves();
        let vs = self.v.as_mut().into_leaves();
        for ((((p, g), m), v), decay) in params.into_iter().zip(grads).zip(ms).zip(vs).zip(decays) {
            let opt = if decay {
                *optimizer
            } else {
                optimizer.weight_decay(0.0)
            };
            if let Some(hp) = opt.adam_params(grad_scale) {
                b.adam_update(p, g, m, v, &hp, self.step)?;
            } else if let Some(hp) = opt.sgd_params(grad_scale) {
                let velocity = if hp.momentum != 0.0 { Some(m) } else { None };
                b.sgd_update(p, g, velocity, &hp)?;
            }
        }
        Ok(())
    }

    /// Overwrites the parameter called `name` (a Hugging Face name, as listed by
    /// [`TransformerModel::named_parameters`]) with `values`, which must hold exactly its
    /// number of elements, all finite. On an int8 model only the f32 tensors (norms,
    /// routers) can be set.
    pub fn set_parameter(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let bad = |message: String| CoreError::InvalidArgument {
            op: "set_parameter",
            message,
        };
        let layout = self.config.layout();
        let pairs = self
            .params
            .as_mut()
            .zip(layout.as_ref())
            .ok_or_else(|| bad("parameters laid out differently from the configuration".into()))?;
        let (buf, spec) = pairs
            .into_named()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, pair)| pair)
            .ok_or_else(|| bad(format!("the model has no parameter named `{name}`")))?;
        if self.quantized.is_some() && spec.kind == TensorKind::Matrix {
            return Err(bad(format!(
                "{name} is int8 in a quantized model; set it before quantize()"
            )));
        }
        if values.len() != spec.len() {
            return Err(bad(format!(
                "{name} has shape {:?} ({} values); got {}",
                spec.shape,
                spec.len(),
                values.len()
            )));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(bad(format!("{name}: value {i} is {}", values[i])));
        }
        self.backend.write(buf, values)
    }

    /// Every parameter on the host with its Hugging Face name.
    pub fn named_parameters(&self) -> Result<Vec<(String, Vec<f32>)>> {
        self.params
            .as_ref()
            .into_named()
            .into_iter()
            .map(|(n, p)| Ok((n, self.backend.download(p)?)))
            .collect()
    }
    /// The adapters (`grads: false`) or their accumulated gradients (`true`) on the host,
    /// under PEFT's names, `lora_A` then `lora_B` per projection; empty without adapters.
    pub fn named_adapters(&self, grads: bool) -> Result<Vec<(String, Vec<f32>)>> {
        let Some(st) = &self.lora else {
            return Ok(Vec::new());
        };
        st.named(if grads { &st.grads } else { &st.weights })
            .into_iter()
            .map(|(n, buf)| Ok((n, self.backend.download(buf)?)))
            .collect()
    }
    /// Every gradient on the host, named like its parameter.
    pub fn named_gradients(&self) -> Result<Vec<(String, Vec<f32>)>> {
        self.grads
            .as_ref()
            .into_named()
            .into_iter()
            .map(|(n, g)| Ok((n, self.backend.download(g)?)))
            .collect()
    }
}
