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

use crate::backend::{AttentionSpec, MatmulSpec, Precision, RopeSpec};
use crate::{Backend, CoreError, Optimizer, Result, Rng};

/// The architecture of a [`TransformerModel`].
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    pub vocab_size: usize,
    pub d_model: usize,
    pub n_layers: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub d_ff: usize,
    pub max_seq_len: usize,
    pub rope_theta: f32,
    pub norm_eps: f32,
}

fn invalid(message: String) -> CoreError {
    CoreError::InvalidArgument {
        op: "transformer config",
        message,
    }
}

impl TransformerConfig {
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
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return Err(invalid(format!(
                "norm_eps {} must be finite and >= 0",
                self.norm_eps
            )));
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
        };
        (
            q,
            RopeSpec {
                heads: self.kv_heads,
                ..q
            },
        )
    }
    pub fn q_dim(&self) -> usize {
        self.q_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
    /// Parameters of one block: two norms, four attention projections, three FFN ones.
    pub fn layer_parameters(&self) -> usize {
        let (d, q, kv, f) = (self.d_model, self.q_dim(), self.kv_dim(), self.d_ff);
        2 * d + d * q + 2 * d * kv + q * d + 3 * d * f
    }
    /// Every parameter, the tied embedding counted once, norms included.
    pub fn parameter_count(&self) -> usize {
        self.vocab_size * self.d_model + self.n_layers * self.layer_parameters() + self.d_model
    }
    /// f32 values in the activation arena for one (batch, seq) shape: what the forward pass
    /// keeps for the backward pass, the logits, and the backward scratch.
    pub fn activation_floats(&self, batch: usize, seq: usize) -> usize {
        let n = batch * seq;
        let (d, q, kv, f, h) = (self.d_model, self.q_dim(), self.kv_dim(), self.d_ff, self.q_heads);
        let per_layer = 4 * d + 2 + 2 * q + 2 * kv + h + 3 * f;
        let tail = 2 * d + 1 + self.vocab_size;
        let scratch = 3 * d + 3 * f + 2 * q + 2 * kv;
        n * (self.n_layers * per_layer + tail + scratch)
    }

    /// Multiply-adds per token of the forward pass in the matrix products (projections,
    /// FFN, output head) and in attention at sequence length `seq` (causal average).
    pub fn forward_macs_per_token(&self, seq: usize) -> f64 {
        let (d, q, kv, f) = (
            self.d_model as f64,
            self.q_dim() as f64,
            self.kv_dim() as f64,
            self.d_ff as f64,
        );
        let dense = d * q + 2.0 * d * kv + q * d + 3.0 * d * f;
        let attn = 2.0 * q * (seq as f64 + 1.0) / 2.0;
        self.n_layers as f64 * (dense + attn) + d * self.vocab_size as f64
    }
}

/// Token ids of a training or evaluation batch: `inputs[b][t]` predicts `targets[b][t]`,
/// and `mask[b][t]` says whether that prediction counts in the loss. Row-major, `batch` rows
/// of `seq` positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    pub batch: usize,
    pub seq: usize,
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
    pub mask: Vec<bool>,
}

impl TokenBatch {
    /// Next-token batches from equal-length sequences of at least two ids: inputs are
    /// `seq[..n-1]`, targets `seq[1..]`, every position counts.
    pub fn new(seqs: &[Vec<u32>]) -> Result<TokenBatch> {
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

/// One block's parameters (or gradients, or optimizer moments: the same layout).
pub struct LayerParams<B: Backend> {
    pub attn_norm: B::Buffer,
    pub wq: B::Buffer,
    pub wk: B::Buffer,
    pub wv: B::Buffer,
    pub wo: B::Buffer,
    pub ffn_norm: B::Buffer,
    pub w_gate: B::Buffer,
    pub w_up: B::Buffer,
    pub w_down: B::Buffer,
}

impl<B: Backend> LayerParams<B> {
    fn zeros(b: &B, c: &TransformerConfig) -> Result<Self> {
        let (d, q, kv, f) = (c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
        Ok(LayerParams {
            attn_norm: b.zeros(d)?,
            wq: b.zeros(q * d)?,
            wk: b.zeros(kv * d)?,
            wv: b.zeros(kv * d)?,
            wo: b.zeros(d * q)?,
            ffn_norm: b.zeros(d)?,
            w_gate: b.zeros(f * d)?,
            w_up: b.zeros(f * d)?,
            w_down: b.zeros(d * f)?,
        })
    }
    /// (Hugging Face name suffix, buffer, whether weight decay applies).
    pub fn named(&self) -> [(&'static str, &B::Buffer, bool); 9] {
        [
            ("input_layernorm.weight", &self.attn_norm, false),
            ("self_attn.q_proj.weight", &self.wq, true),
            ("self_attn.k_proj.weight", &self.wk, true),
            ("self_attn.v_proj.weight", &self.wv, true),
            ("self_attn.o_proj.weight", &self.wo, true),
            ("post_attention_layernorm.weight", &self.ffn_norm, false),
            ("mlp.gate_proj.weight", &self.w_gate, true),
            ("mlp.up_proj.weight", &self.w_up, true),
            ("mlp.down_proj.weight", &self.w_down, true),
        ]
    }
    fn all_mut(&mut self) -> [&mut B::Buffer; 9] {
        [
            &mut self.attn_norm,
            &mut self.wq,
            &mut self.wk,
            &mut self.wv,
            &mut self.wo,
            &mut self.ffn_norm,
            &mut self.w_gate,
            &mut self.w_up,
            &mut self.w_down,
        ]
    }
}

/// All parameters (or gradients, or moments) of the model.
pub struct Params<B: Backend> {
    /// `(vocab, d_model)`, also the output head.
    pub embed: B::Buffer,
    pub layers: Vec<LayerParams<B>>,
    pub final_norm: B::Buffer,
}

impl<B: Backend> Params<B> {
    pub fn zeros(b: &B, c: &TransformerConfig) -> Result<Self> {
        Ok(Params {
            embed: b.zeros(c.vocab_size * c.d_model)?,
            layers: (0..c.n_layers)
                .map(|_| LayerParams::zeros(b, c))
                .collect::<Result<_>>()?,
            final_norm: b.zeros(c.d_model)?,
        })
    }
    /// A set of zero-length buffers in the layout of `n_layers` blocks: what an int8 model
    /// keeps in place of gradients and optimizer moments it does not have.
    pub fn hollow(b: &B, n_layers: usize) -> Result<Self> {
        let e = || b.zeros(0);
        Ok(Params {
            embed: e()?,
            layers: (0..n_layers)
                .map(|_| {
                    Ok(LayerParams {
                        attn_norm: e()?,
                        wq: e()?,
                        wk: e()?,
                        wv: e()?,
                        wo: e()?,
                        ffn_norm: e()?,
                        w_gate: e()?,
                        w_up: e()?,
                        w_down: e()?,
                    })
                })
                .collect::<Result<_>>()?,
            final_norm: e()?,
        })
    }
    /// Every tensor with its Hugging Face name and whether weight decay applies.
    pub fn named(&self) -> Vec<(String, &B::Buffer, bool)> {
        let mut out = alloc::vec![(String::from("model.embed_tokens.weight"), &self.embed, true)];
        for (i, l) in self.layers.iter().enumerate() {
            for (name, buf, decay) in l.named() {
                out.push((format!("model.layers.{i}.{name}"), buf, decay));
            }
        }
        out.push((String::from("model.norm.weight"), &self.final_norm, false));
        out
    }
    /// Every tensor, mutably, in the order of [`Params::named`].
    pub fn all_mut(&mut self) -> Vec<&mut B::Buffer> {
        let mut out = alloc::vec![&mut self.embed];
        for l in &mut self.layers {
            out.extend(l.all_mut());
        }
        out.push(&mut self.final_norm);
        out
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
    att: B::Buffer,
    lse: B::Buffer,
    x_mid: B::Buffer,
    h2: B::Buffer,
    rstd2: B::Buffer,
    gate: B::Buffer,
    up: B::Buffer,
    s: B::Buffer,
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
    dgate: B::Buffer,
    dup: B::Buffer,
    ds: B::Buffer,
    datt: B::Buffer,
    dq: B::Buffer,
    dk: B::Buffer,
    dv: B::Buffer,
}

impl<B: Backend> Arena<B> {
    fn new(b: &B, c: &TransformerConfig, batch: usize, seq: usize) -> Result<Self> {
        let n = batch * seq;
        let (d, q, kv, f) = (c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
        let mut layers = Vec::new();
        for _ in 0..c.n_layers {
            layers.push(LayerActs {
                x_in: b.zeros(n * d)?,
                h: b.zeros(n * d)?,
                rstd1: b.zeros(n)?,
                q: b.zeros(n * q)?,
                k: b.zeros(n * kv)?,
                v: b.zeros(n * kv)?,
                att: b.zeros(n * q)?,
                lse: b.zeros(n * c.q_heads)?,
                x_mid: b.zeros(n * d)?,
                h2: b.zeros(n * d)?,
                rstd2: b.zeros(n)?,
                gate: b.zeros(n * f)?,
                up: b.zeros(n * f)?,
                s: b.zeros(n * f)?,
            });
        }
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
            dgate: b.zeros(n * f)?,
            dup: b.zeros(n * f)?,
            ds: b.zeros(n * f)?,
            datt: b.zeros(n * q)?,
            dq: b.zeros(n * q)?,
            dk: b.zeros(n * kv)?,
            dv: b.zeros(n * kv)?,
        })
    }
}

/// The seven projections of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

/// A block's matrices at one byte per weight: (packed int8, per-row scales) each.
pub struct QuantLayer<B: Backend> {
    pub wq: (B::Buffer, B::Buffer),
    pub wk: (B::Buffer, B::Buffer),
    pub wv: (B::Buffer, B::Buffer),
    pub wo: (B::Buffer, B::Buffer),
    pub w_gate: (B::Buffer, B::Buffer),
    pub w_up: (B::Buffer, B::Buffer),
    pub w_down: (B::Buffer, B::Buffer),
}

impl<B: Backend> QuantLayer<B> {
    fn get(&self, p: Proj) -> &(B::Buffer, B::Buffer) {
        match p {
            Proj::Q => &self.wq,
            Proj::K => &self.wk,
            Proj::V => &self.wv,
            Proj::O => &self.wo,
            Proj::Gate => &self.w_gate,
            Proj::Up => &self.w_up,
            Proj::Down => &self.w_down,
        }
    }
}

/// Every matrix of the model in int8 (the embedding doubles as the head, as in f32).
pub struct QuantParams<B: Backend> {
    pub embed: (B::Buffer, B::Buffer),
    pub layers: Vec<QuantLayer<B>>,
}

/// A block's projections, from the f32 weights or their int8 copies.
struct Lin<'a, B: Backend> {
    f: &'a LayerParams<B>,
    q: Option<&'a QuantLayer<B>>,
}

impl<B: Backend> Lin<'_, B> {
    /// `out (m x n) = x (m x k) W^T + beta * out` for projection `proj`.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        b: &B,
        proj: Proj,
        out: &mut B::Buffer,
        x: &B::Buffer,
        m: usize,
        n: usize,
        k: usize,
        beta: f32,
        prec: Precision,
    ) -> Result<()> {
        match self.q {
            Some(q) => {
                let (packed, scales) = q.get(proj);
                b.q8_matmul(out, x, packed, scales, m, n, k, beta)
            }
            None => {
                let w = match proj {
                    Proj::Q => &self.f.wq,
                    Proj::K => &self.f.wk,
                    Proj::V => &self.f.wv,
                    Proj::O => &self.f.wo,
                    Proj::Gate => &self.f.w_gate,
                    Proj::Up => &self.f.w_up,
                    Proj::Down => &self.f.w_down,
                };
                b.matmul(
                    out,
                    x,
                    w,
                    &MatmulSpec::new(m, n, k).trans_b(true).beta(beta).precision(prec),
                )
            }
        }
    }
}

/// The feed-forward of a block, `out += down(silu(gate(h2)) * up(h2))`: the residual add
/// is the down projection's `beta = 1`. This pair of functions is the slot a
/// mixture-of-experts layer takes over; everything it needs is its input `h2`, the block's
/// activations, and the output stream.
#[allow(clippy::too_many_arguments)]
fn ffn_forward<B: Backend>(
    b: &B,
    w: &Lin<'_, B>,
    a: &mut LayerActs<B>,
    out: &mut B::Buffer,
    n: usize,
    d: usize,
    f: usize,
    prec: Precision,
) -> Result<()> {
    // gate, up = h2 W^T   h2: (n, d), W: (f, d)
    w.apply(b, Proj::Gate, &mut a.gate, &a.h2, n, f, d, 0.0, prec)?;
    w.apply(b, Proj::Up, &mut a.up, &a.h2, n, f, d, 0.0, prec)?;
    b.swiglu_forward(&mut a.s, &a.gate, &a.up)?;
    w.apply(b, Proj::Down, out, &a.s, n, d, f, 1.0, prec)
}

/// Backward of [`ffn_forward`]: from `dout` (n, d), accumulates the three weight gradients
/// into `g` and writes `dh2` (n, d). `scratch` is (ds, dgate, dup), each (n, f).
#[allow(clippy::too_many_arguments)]
fn ffn_backward<B: Backend>(
    b: &B,
    p: &LayerParams<B>,
    g: &mut LayerParams<B>,
    a: &LayerActs<B>,
    dout: &B::Buffer,
    dh2: &mut B::Buffer,
    scratch: [&mut B::Buffer; 3],
    n: usize,
    d: usize,
    f: usize,
    prec: Precision,
) -> Result<()> {
    let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
    let [ds, dgate, dup] = scratch;
    // dWd += dout^T s; ds = dout Wd
    b.matmul(&mut g.w_down, dout, &a.s, &mm(d, f, n).trans_a(true).accumulate())?;
    b.matmul(ds, dout, &p.w_down, &mm(n, f, d))?;
    b.swiglu_backward(dgate, dup, ds, &a.gate, &a.up)?;
    b.matmul(
        &mut g.w_gate,
        dgate,
        &a.h2,
        &mm(f, d, n).trans_a(true).accumulate(),
    )?;
    b.matmul(&mut g.w_up, dup, &a.h2, &mm(f, d, n).trans_a(true).accumulate())?;
    b.matmul(dh2, dgate, &p.w_gate, &mm(n, d, f))?;
    b.matmul(dh2, dup, &p.w_up, &mm(n, d, f).accumulate())
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
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    att: B::Buffer,
    lse: B::Buffer,
    gate: B::Buffer,
    up: B::Buffer,
    s: B::Buffer,
    last: B::Buffer,
    logits: B::Buffer,
}

/// The loss of one batch: summed over the counted positions, and their number.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LossSum {
    pub sum: f64,
    pub count: usize,
}

/// A transformer LM living on backend `B`.
pub struct TransformerModel<B: Backend> {
    pub backend: B,
    pub config: TransformerConfig,
    pub params: Params<B>,
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
}

impl<B: Backend> TransformerModel<B> {
    /// Initialization (GPT-2 / Llama practice): every matrix normal(0, 0.02), the two
    /// output projections of each block (`o_proj`, `down_proj`) scaled by
    /// `1 / sqrt(2 * n_layers)` so the residual stream's variance does not grow with depth;
    /// norm weights one.
    pub fn new(backend: B, config: TransformerConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let mut rng = Rng::new(seed);
        let std = 0.02f32;
        let out_std = std / libm::sqrtf(2.0 * config.n_layers as f32);
        let (d, q, kv, f) = (config.d_model, config.q_dim(), config.kv_dim(), config.d_ff);
        let b = &backend;
        let ones = |n: usize| b.upload(&alloc::vec![1.0f32; n]);
        let embed = b.upload(&rng.normal_vec(config.vocab_size * d, std))?;
        let mut layers = Vec::new();
        for _ in 0..config.n_layers {
            layers.push(LayerParams {
                attn_norm: ones(d)?,
                wq: b.upload(&rng.normal_vec(q * d, std))?,
                wk: b.upload(&rng.normal_vec(kv * d, std))?,
                wv: b.upload(&rng.normal_vec(kv * d, std))?,
                wo: b.upload(&rng.normal_vec(d * q, out_std))?,
                ffn_norm: ones(d)?,
                w_gate: b.upload(&rng.normal_vec(f * d, std))?,
                w_up: b.upload(&rng.normal_vec(f * d, std))?,
                w_down: b.upload(&rng.normal_vec(d * f, out_std))?,
            });
        }
        let params = Params {
            embed,
            layers,
            final_norm: ones(d)?,
        };
        Self::from_params(backend, config, params)
    }

    /// A model around given parameters (a checkpoint, a test fixture).
    pub fn from_params(backend: B, config: TransformerConfig, params: Params<B>) -> Result<Self> {
        config.validate()?;
        let shapes = Params::<B>::zeros(&backend, &config)?;
        let want = shapes.named();
        let have = params.named();
        if want.len() != have.len() {
            return Err(invalid(format!(
                "{} parameter tensors, the configuration has {}",
                have.len(),
                want.len()
            )));
        }
        for ((name, w, _), (_, h, _)) in want.iter().zip(&have) {
            let (lw, lh) = (backend.len(w), backend.len(h));
            if lw != lh {
                return Err(CoreError::InvalidArgument {
                    op: "transformer parameters",
                    message: format!("{name} has {lh} values, the configuration needs {lw}"),
                });
            }
        }
        let grads = shapes;
        let m = Params::zeros(&backend, &config)?;
        let v = Params::zeros(&backend, &config)?;
        Ok(TransformerModel {
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
            quantized: None,
        })
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
            self.arena = Some(Arena::new(&self.backend, &self.config, batch, seq)?);
        }
        Ok(())
    }

    /// Forward pass of a batch up to the logits (kept in the arena).
    fn forward(&mut self, tb: &TokenBatch) -> Result<()> {
        tb.check(self.config.vocab_size)?;
        self.ensure_arena(tb.batch, tb.seq)?;
        let c = &self.config;
        let (n, d, q, kv, f) = (tb.batch * tb.seq, c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
        let b = &self.backend;
        let arena = self.arena.as_mut().expect("ensured above");
        let (rope_q, rope_k) = c.rope_specs(tb.batch, tb.seq, 0);
        let att_spec = AttentionSpec::causal(tb.batch, tb.seq, c.q_heads, c.kv_heads, c.head_dim);
        let prec = self.precision;
        let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
        let first = &mut arena.layers[0].x_in;
        match &self.quantized {
            Some(qp) => b.q8_embedding(first, &qp.embed.0, &qp.embed.1, &tb.inputs, c.vocab_size, d)?,
            None => b.embedding_forward(first, &self.params.embed, &tb.inputs, c.vocab_size, d)?,
        }
        for l in 0..c.n_layers {
            let p = &self.params.layers[l];
            let w = Lin {
                f: p,
                q: self.quantized.as_ref().map(|q| &q.layers[l]),
            };
            if l > 0 {
                // This block's input is the previous block's output.
                b.copy(&mut arena.layers[l].x_in, &arena.x_out)?;
            }
            let a = &mut arena.layers[l];
            // h = rmsnorm(x_in)
            b.rmsnorm_forward(&mut a.h, &mut a.rstd1, &a.x_in, &p.attn_norm, n, d, c.norm_eps)?;
            // q, k, v = h W^T   h: (n, d), Wq: (q, d)
            w.apply(b, Proj::Q, &mut a.q, &a.h, n, q, d, 0.0, prec)?;
            w.apply(b, Proj::K, &mut a.k, &a.h, n, kv, d, 0.0, prec)?;
            w.apply(b, Proj::V, &mut a.v, &a.h, n, kv, d, 0.0, prec)?;
            b.rope_forward(&mut a.q, &rope_q)?;
            b.rope_forward(&mut a.k, &rope_k)?;
            b.attention_forward(&mut a.att, &mut a.lse, &a.q, &a.k, &a.v, &att_spec)?;
            // x_mid = x_in + att Wo^T
            b.copy(&mut a.x_mid, &a.x_in)?;
            w.apply(b, Proj::O, &mut a.x_mid, &a.att, n, d, q, 1.0, prec)?;
            // FFN
            b.rmsnorm_forward(&mut a.h2, &mut a.rstd2, &a.x_mid, &p.ffn_norm, n, d, c.norm_eps)?;
            // x_out = x_mid + FFN(h2)
            b.copy(&mut arena.x_out, &a.x_mid)?;
            ffn_forward(b, &w, a, &mut arena.x_out, n, d, f, prec)?;
        }
        b.rmsnorm_forward(
            &mut arena.hf,
            &mut arena.rstd_f,
            &arena.x_out,
            &self.params.final_norm,
            n,
            d,
            c.norm_eps,
        )?;
        // logits = hf E^T   (n, d) x (vocab, d)^T
        match &self.quantized {
            Some(qp) => b.q8_matmul(
                &mut arena.logits,
                &arena.hf,
                &qp.embed.0,
                &qp.embed.1,
                n,
                c.vocab_size,
                d,
                0.0,
            )?,
            None => b.matmul(
                &mut arena.logits,
                &arena.hf,
                &self.params.embed,
                &mm(n, c.vocab_size, d).trans_b(true),
            )?,
        }
        Ok(())
    }

    /// An int8 model from its parts (a Q8 checkpoint): norm weights in f32 (`attn_norms`,
    /// `ffn_norms` per block, `final_norm`) and the int8 matrices.
    pub fn from_quantized(
        backend: B,
        config: TransformerConfig,
        norms: Vec<(B::Buffer, B::Buffer)>,
        final_norm: B::Buffer,
        quantized: QuantParams<B>,
    ) -> Result<Self> {
        config.validate()?;
        let (d, q, kv, f) = (config.d_model, config.q_dim(), config.kv_dim(), config.d_ff);
        let pc = crate::ops::q8::packed_cols;
        if norms.len() != config.n_layers || quantized.layers.len() != config.n_layers {
            return Err(invalid(format!(
                "{} blocks of norms and {} of int8 weights for {} layers",
                norms.len(),
                quantized.layers.len(),
                config.n_layers
            )));
        }
        let b = &backend;
        let check = |name: &str, (p, s): &(B::Buffer, B::Buffer), rows: usize, cols: usize| -> Result<()> {
            if b.len(p) != rows * pc(cols) || b.len(s) != rows {
                return Err(CoreError::InvalidArgument {
                    op: "transformer parameters",
                    message: format!("int8 {name} does not have {rows} rows of {cols}"),
                });
            }
            Ok(())
        };
        check("embedding", &quantized.embed, config.vocab_size, d)?;
        for (l, ql) in quantized.layers.iter().enumerate() {
            for (name, t, rows, cols) in [
                ("q_proj", &ql.wq, q, d),
                ("k_proj", &ql.wk, kv, d),
                ("v_proj", &ql.wv, kv, d),
                ("o_proj", &ql.wo, d, q),
                ("gate_proj", &ql.w_gate, f, d),
                ("up_proj", &ql.w_up, f, d),
                ("down_proj", &ql.w_down, d, f),
            ] {
                check(&format!("layer {l} {name}"), t, rows, cols)?;
            }
        }
        for (a, m) in &norms {
            if b.len(a) != d || b.len(m) != d {
                return Err(invalid(format!("a norm weight does not have {d} values")));
            }
        }
        if b.len(&final_norm) != d {
            return Err(invalid(format!("the final norm does not have {d} values")));
        }
        let empty = || b.zeros(0);
        let mut layers = Vec::new();
        for (attn_norm, ffn_norm) in norms {
            layers.push(LayerParams {
                attn_norm,
                wq: empty()?,
                wk: empty()?,
                wv: empty()?,
                wo: empty()?,
                ffn_norm,
                w_gate: empty()?,
                w_up: empty()?,
                w_down: empty()?,
            });
        }
        let params = Params {
            embed: empty()?,
            layers,
            final_norm,
        };
        let (grads, m, v) = (
            Params::hollow(b, config.n_layers)?,
            Params::hollow(b, config.n_layers)?,
            Params::hollow(b, config.n_layers)?,
        );
        Ok(TransformerModel {
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
            quantized: Some(quantized),
        })
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
        let c = self.config.clone();
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
        let (d, q, kv, f) = (c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
        let b = &self.backend;
        if self.decode.as_ref().is_none_or(|a| a.rows != r) {
            self.decode = None;
            self.decode = Some(DecodeArena {
                rows: r,
                x: b.zeros(r * d)?,
                h: b.zeros(r * d)?,
                rstd: b.zeros(r)?,
                q: b.zeros(r * q)?,
                k: b.zeros(r * kv)?,
                v: b.zeros(r * kv)?,
                att: b.zeros(r * q)?,
                lse: b.zeros(r * c.q_heads)?,
                gate: b.zeros(r * f)?,
                up: b.zeros(r * f)?,
                s: b.zeros(r * f)?,
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
        match &self.quantized {
            Some(qp) => b.q8_embedding(&mut a.x, &qp.embed.0, &qp.embed.1, ids, c.vocab_size, d)?,
            None => b.embedding_forward(&mut a.x, &self.params.embed, ids, c.vocab_size, d)?,
        }
        for l in 0..c.n_layers {
            let p = &self.params.layers[l];
            let w = Lin {
                f: p,
                q: self.quantized.as_ref().map(|q| &q.layers[l]),
            };
            b.rmsnorm_forward(&mut a.h, &mut a.rstd, &a.x, &p.attn_norm, r, d, c.norm_eps)?;
            w.apply(b, Proj::Q, &mut a.q, &a.h, r, q, d, 0.0, prec)?;
            w.apply(b, Proj::K, &mut a.k, &a.h, r, kv, d, 0.0, prec)?;
            w.apply(b, Proj::V, &mut a.v, &a.h, r, kv, d, 0.0, prec)?;
            b.rope_forward(&mut a.q, &rope_q)?;
            b.rope_forward(&mut a.k, &rope_k)?;
            b.copy_range(&mut cache.k[l], pos * kv, &a.k, 0, r * kv)?;
            b.copy_range(&mut cache.v[l], pos * kv, &a.v, 0, r * kv)?;
            b.attention_forward(&mut a.att, &mut a.lse, &a.q, &cache.k[l], &cache.v[l], &spec)?;
            w.apply(b, Proj::O, &mut a.x, &a.att, r, d, q, 1.0, prec)?;
            b.rmsnorm_forward(&mut a.h, &mut a.rstd, &a.x, &p.ffn_norm, r, d, c.norm_eps)?;
            w.apply(b, Proj::Gate, &mut a.gate, &a.h, r, f, d, 0.0, prec)?;
            w.apply(b, Proj::Up, &mut a.up, &a.h, r, f, d, 0.0, prec)?;
            b.swiglu_forward(&mut a.s, &a.gate, &a.up)?;
            w.apply(b, Proj::Down, &mut a.x, &a.s, r, d, f, 1.0, prec)?;
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
        match &self.quantized {
            Some(qp) => b.q8_matmul(
                &mut a.logits,
                &a.last,
                &qp.embed.0,
                &qp.embed.1,
                1,
                c.vocab_size,
                d,
                0.0,
            )?,
            None => b.matmul(
                &mut a.logits,
                &a.last,
                &self.params.embed,
                &mm(1, c.vocab_size, d).trans_b(true),
            )?,
        }
        cache.len += r;
        b.download(&a.logits)
    }

    /// Logits of the last forward pass, on the host, `(batch * seq, vocab)`.
    pub fn forward_logits(&mut self, tb: &TokenBatch) -> Result<Vec<f32>> {
        self.forward(tb)?;
        self.backend
            .download(&self.arena.as_ref().expect("forward made it").logits)
    }

    /// Forward and loss, no gradients.
    pub fn evaluate(&mut self, tb: &TokenBatch) -> Result<LossSum> {
        self.forward(tb)?;
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
        })
    }

    /// Forward and backward: adds the gradient of this batch's mean loss (over its counted
    /// positions) to `grads`, and returns the loss.
    pub fn accumulate(&mut self, tb: &TokenBatch) -> Result<LossSum> {
        self.refuse_if_quantized("training")?;
        let count = tb.counted();
        if count == 0 {
            return Err(batch_err(
                "no position of the batch counts in the loss (the mask is all false)".into(),
            ));
        }
        self.forward(tb)?;
        let c = self.config.clone();
        let (n, d, q, kv, f) = (tb.batch * tb.seq, c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
        let prec = self.precision;
        let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
        let b = &self.backend;
        let arena = self.arena.as_mut().expect("forward made it");
        let (params, grads) = (&self.params, &mut self.grads);
        // Loss and dlogits (in place), for the mean over counted positions.
        let s = b.cross_entropy(
            &mut arena.logits,
            &tb.targets,
            Some(&tb.mask),
            n,
            c.vocab_size,
            Some(1.0 / count as f32),
        )?;
        // Tied head: dE += dlogits^T hf, dhf = dlogits E
        b.matmul(
            &mut grads.embed,
            &arena.logits,
            &arena.hf,
            &mm(c.vocab_size, d, n).trans_a(true).accumulate(),
        )?;
        b.matmul(
            &mut arena.dh,
            &arena.logits,
            &params.embed,
            &mm(n, d, c.vocab_size),
        )?;
        b.rmsnorm_backward(
            &mut arena.dx,
            &mut grads.final_norm,
            &arena.dh,
            &arena.x_out,
            &params.final_norm,
            &arena.rstd_f,
            n,
            d,
        )?;
        let (rope_q, rope_k) = c.rope_specs(tb.batch, tb.seq, 0);
        let att_spec = AttentionSpec::causal(tb.batch, tb.seq, c.q_heads, c.kv_heads, c.head_dim);
        for l in (0..c.n_layers).rev() {
            let (p, g, a) = (&params.layers[l], &mut grads.layers[l], &arena.layers[l]);
            // --- FFN: x_out = x_mid + FFN(h2); dx holds d x_out, dh gets d h2.
            ffn_backward(
                b,
                p,
                g,
                a,
                &arena.dx,
                &mut arena.dh,
                [&mut arena.ds, &mut arena.dgate, &mut arena.dup],
                n,
                d,
                f,
                prec,
            )?;
            // d x_mid = dx (residual) + rmsnorm backward of dh
            b.rmsnorm_backward(
                &mut arena.dx2,
                &mut g.ffn_norm,
                &arena.dh,
                &a.x_mid,
                &p.ffn_norm,
                &a.rstd2,
                n,
                d,
            )?;
            b.axpy(&mut arena.dx2, 1.0, &arena.dx)?;
            // --- attention: x_mid = x_in + att Wo^T; dx2 holds d x_mid.
            b.matmul(
                &mut g.wo,
                &arena.dx2,
                &a.att,
                &mm(d, q, n).trans_a(true).accumulate(),
            )?;
            b.matmul(&mut arena.datt, &arena.dx2, &p.wo, &mm(n, q, d))?;
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
            b.matmul(&mut arena.dh, &arena.dq, &p.wq, &mm(n, d, q))?;
            b.matmul(&mut arena.dh, &arena.dk, &p.wk, &mm(n, d, kv).accumulate())?;
            b.matmul(&mut arena.dh, &arena.dv, &p.wv, &mm(n, d, kv).accumulate())?;
            // d x_in = dx2 (residual) + rmsnorm backward of dh, into dx for the block below.
            b.rmsnorm_backward(
                &mut arena.dx,
                &mut g.attn_norm,
                &arena.dh,
                &a.x_in,
                &p.attn_norm,
                &a.rstd1,
                n,
                d,
            )?;
            b.axpy(&mut arena.dx, 1.0, &arena.dx2)?;
        }
        b.embedding_backward(&mut grads.embed, &arena.dx, &tb.inputs, c.vocab_size, d)?;
        Ok(LossSum {
            sum: s.loss_sum,
            count: s.count,
        })
    }

    /// Rounds every matrix to int8 with per-row absmax scales (the norm weights stay f32),
    /// then frees the f32 matrices, the gradients and the optimizer state: one-way,
    /// inference only. Calling it again does nothing.
    pub fn quantize(&mut self) -> Result<()> {
        if self.quantized.is_some() {
            return Ok(());
        }
        let c = self.config.clone();
        let (d, q, kv, f) = (c.d_model, c.q_dim(), c.kv_dim(), c.d_ff);
        let b = &self.backend;
        let quant = |buf: &B::Buffer, rows: usize, cols: usize| -> Result<(B::Buffer, B::Buffer)> {
            let host = b.download(buf)?;
            let (packed, scales) = crate::ops::q8::quantize_rows(&host, rows, cols)?;
            Ok((b.upload(&packed)?, b.upload(&scales)?))
        };
        let mut layers = Vec::new();
        for p in &self.params.layers {
            layers.push(QuantLayer {
                wq: quant(&p.wq, q, d)?,
                wk: quant(&p.wk, kv, d)?,
                wv: quant(&p.wv, kv, d)?,
                wo: quant(&p.wo, d, q)?,
                w_gate: quant(&p.w_gate, f, d)?,
                w_up: quant(&p.w_up, f, d)?,
                w_down: quant(&p.w_down, d, f)?,
            });
        }
        let embed = quant(&self.params.embed, c.vocab_size, d)?;
        self.quantized = Some(QuantParams { embed, layers });
        // Free what an int8 model no longer has: f32 matrices, gradients, moments, arenas.
        let empty = |b: &B| b.zeros(0);
        self.params.embed = empty(b)?;
        for p in &mut self.params.layers {
            for m in [
                &mut p.wq,
                &mut p.wk,
                &mut p.wv,
                &mut p.wo,
                &mut p.w_gate,
                &mut p.w_up,
                &mut p.w_down,
            ] {
                *m = empty(b)?;
            }
        }
        for set in [&mut self.grads, &mut self.m, &mut self.v] {
            for buf in set.all_mut() {
                *buf = empty(b)?;
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

    pub fn zero_grad(&mut self) -> Result<()> {
        self.refuse_if_quantized("zero_grad")?;
        for g in self.grads.all_mut() {
            self.backend.fill(g, 0.0)?;
        }
        Ok(())
    }

    /// The global L2 norm of the accumulated gradients times `scale`.
    pub fn grad_norm(&self, scale: f32) -> Result<f64> {
        let mut total = 0.0;
        for (_, g, _) in self.grads.named() {
            total += self.backend.sum_of_squares(g)?;
        }
        Ok(libm::sqrt(total) * scale.abs() as f64)
    }

    /// One AdamW (or SGD) step with the accumulated gradients times `grad_scale`; weight
    /// decay applies to the embedding and the projections, never to norm weights.
    pub fn step(&mut self, optimizer: &Optimizer, grad_scale: f32) -> Result<()> {
        self.refuse_if_quantized("step")?;
        optimizer.validate()?;
        self.step += 1;
        let decays: Vec<bool> = self.params.named().iter().map(|(_, _, d)| *d).collect();
        let b = &self.backend;
        let params = self.params.all_mut();
        let grads: Vec<&B::Buffer> = self.grads.named().into_iter().map(|(_, g, _)| g).collect();
        let ms = self.m.all_mut();
        let vs = self.v.all_mut();
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

    /// Every parameter on the host with its Hugging Face name.
    pub fn named_parameters(&self) -> Result<Vec<(String, Vec<f32>)>> {
        self.params
            .named()
            .into_iter()
            .map(|(n, p, _)| Ok((n, self.backend.download(p)?)))
            .collect()
    }
    /// Every gradient on the host, named like its parameter.
    pub fn named_gradients(&self) -> Result<Vec<(String, Vec<f32>)>> {
        self.grads
            .named()
            .into_iter()
            .map(|(n, g, _)| Ok((n, self.backend.download(g)?)))
            .collect()
    }
}
