//! T5's encoder (`T5EncoderModel` in transformers), the per-token prompt encoder of FLUX.1
//! and SD3. Run in f32: T5 v1.1's activations overflow fp16 (the reason FLUX pipelines in
//! half precision produce NaN), and f32 is what every backend here computes in anyway.
//!
//! Pre-norm blocks with T5's RMS-style LayerNorm (no mean, no bias), attention without the
//! `1 / sqrt(d)` scale and with a learned bias per head and relative-position bucket
//! (computed once, from block 0's table, and shared by every block), and the gated-GELU
//! feed-forward of v1.1 (`wo(gelu_tanh(wi_0 x) * wi_1 x)`).

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::backend::{SdpaSpec, Unary};
use crate::error::first_zero;
use crate::models::image::blocks::{image_model, layout_of, Layout, Linear, Norm, Source};
use crate::{Backend, CoreError, Result};

/// A T5 encoder's shapes (v1.1: gated GELU), from its `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct T5Config {
    /// Token ids run from 0 to `vocab_size - 1`.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Width of a head.
    pub d_kv: usize,
    /// Hidden width of the feed-forward.
    pub d_ff: usize,
    /// Encoder layers.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Buckets of the relative position bias.
    pub relative_attention_num_buckets: usize,
    /// The distance past which every position shares the last bucket.
    pub relative_attention_max_distance: usize,
    /// RMSNorm's epsilon.
    pub layer_norm_epsilon: f32,
    /// The gate's activation (`gelu_new`, the tanh form, for "gated-gelu").
    pub act: Unary,
}

impl T5Config {
    /// Checks the shapes, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(CoreError::InvalidArgument { op: "t5 config", message });
        if let Some(m) =
            first_zero!(self; vocab_size, d_model, d_kv, d_ff, num_heads, relative_attention_max_distance)
        {
            return bad(m);
        }
        // Bidirectional buckets: half for each direction, half of those exact.
        if self.relative_attention_num_buckets < 4 {
            return bad(format!(
                "relative_attention_num_buckets is {}; at least 4",
                self.relative_attention_num_buckets
            ));
        }
        if !(self.layer_norm_epsilon.is_finite() && self.layer_norm_epsilon >= 0.0) {
            return bad(format!("layer_norm_epsilon is {}", self.layer_norm_epsilon));
        }
        Ok(())
    }

    fn inner(&self) -> usize {
        self.num_heads * self.d_kv
    }

    /// The bucket of key `k` seen from query `q` (transformers' bidirectional
    /// `_relative_position_bucket`): distances below a quarter of the buckets each their own,
    /// farther ones on a log scale up to `max_distance`, keys after the query in the upper
    /// half. The log is taken in f32 in PyTorch's order, as the buckets were trained with.
    pub fn bucket(&self, q: usize, k: usize) -> usize {
        let half = self.relative_attention_num_buckets / 2;
        let exact = half / 2;
        let base = if k > q { half } else { 0 };
        let dist = k.abs_diff(q);
        if dist < exact {
            return base + dist;
        }
        let ratio = libm::logf(dist as f32 / exact as f32)
            / (libm::log(self.relative_attention_max_distance as f64 / exact as f64) as f32);
        let large = exact + (ratio * (half - exact) as f32) as usize;
        base + large.min(half - 1)
    }
}

/// One encoder block: pre-norm self-attention and gated-GELU feed-forward, each residual.
struct Block<B: Backend> {
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    o: Linear<B>,
    attention_norm: Norm<B>,
    wi_0: Linear<B>,
    wi_1: Linear<B>,
    wo: Linear<B>,
    ff_norm: Norm<B>,
}

/// Every layer of a T5 encoder.
struct Layers<B: Backend> {
    shared: B::Buffer,
    /// Block 0's relative-position bias table `(buckets, heads)`, shared by every block
    /// (absent without blocks).
    relative_attention_bias: Option<B::Buffer>,
    blocks: Vec<Block<B>>,
    final_layer_norm: Norm<B>,
}

impl<B: Backend> Layers<B> {
    fn load(cfg: &T5Config, s: &mut impl Source<B>) -> Result<Self> {
        let (d, inner, ff) = (cfg.d_model, cfg.inner(), cfg.d_ff);
        let shared = s.f32("shared.weight".into(), &[cfg.vocab_size, d])?;
        let mut relative_attention_bias = None;
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for n in 0..cfg.num_layers {
            let (a, f) = (format!("encoder.block.{n}.layer.0"), format!("encoder.block.{n}.layer.1"));
            let q = Linear::load(s, &format!("{a}.SelfAttention.q"), d, inner, false)?;
            let k = Linear::load(s, &format!("{a}.SelfAttention.k"), d, inner, false)?;
            let v = Linear::load(s, &format!("{a}.SelfAttention.v"), d, inner, false)?;
            let o = Linear::load(s, &format!("{a}.SelfAttention.o"), inner, d, false)?;
            if n == 0 {
                let shape = [cfg.relative_attention_num_buckets, cfg.num_heads];
                relative_attention_bias =
                    Some(s.f32(format!("{a}.SelfAttention.relative_attention_bias.weight"), &shape)?);
            }
            blocks.push(Block {
                q,
                k,
                v,
                o,
                attention_norm: Norm::load_weight(s, &format!("{a}.layer_norm"), d)?,
                wi_0: Linear::load(s, &format!("{f}.DenseReluDense.wi_0"), d, ff, false)?,
                wi_1: Linear::load(s, &format!("{f}.DenseReluDense.wi_1"), d, ff, false)?,
                wo: Linear::load(s, &format!("{f}.DenseReluDense.wo"), ff, d, false)?,
                ff_norm: Norm::load_weight(s, &format!("{f}.layer_norm"), d)?,
            });
        }
        let final_layer_norm = Norm::load_weight(s, "encoder.final_layer_norm", d)?;
        Ok(Layers { shared, relative_attention_bias, blocks, final_layer_norm })
    }
}

image_model!(
    /// A T5 encoder over backend `B`, with its weights.
    T5Model,
    T5Config,
    "transformers"
);

impl<B: Backend> T5Model<B> {
    /// The attention bias `(heads, seq, seq)` every block adds, from block 0's table.
    fn position_bias(&self, table: &B::Buffer, seq: usize) -> Result<B::Buffer> {
        let cfg = &self.config;
        let table = self.backend.download(table)?;
        let mut bias = vec![0.0f32; cfg.num_heads * seq * seq];
        for q in 0..seq {
            for k in 0..seq {
                let b = cfg.bucket(q, k);
                for h in 0..cfg.num_heads {
                    bias[(h * seq + q) * seq + k] = table[b * cfg.num_heads + h];
                }
            }
        }
        self.backend.upload(&bias)
    }

    /// `(batch, seq, d_model)` states after the final norm, from `ids (batch, seq)`; `mask`
    /// (same length, `true` for real tokens) hides padding keys.
    pub fn forward(&self, ids: &[u32], batch: usize, mask: Option<&[bool]>) -> Result<Vec<f32>> {
        let cfg = &self.config;
        let be = &self.backend;
        if batch == 0 || ids.is_empty() || !ids.len().is_multiple_of(batch) {
            return Err(CoreError::InvalidDimension {
                op: "t5 forward",
                message: format!("{} ids do not make {batch} rows", ids.len()),
            });
        }
        if let Some(m) = mask {
            crate::error::check_len("t5 forward", "mask", m.len(), ids.len())?;
        }
        let (seq, d, inner, ff) = (ids.len() / batch, cfg.d_model, cfg.inner(), cfg.d_ff);
        let rows = batch * seq;
        let (m, eps) = (&self.layers, cfg.layer_norm_epsilon);
        let mut x = be.zeros(rows * d)?;
        be.embedding_forward(&mut x, &m.shared, ids, cfg.vocab_size, d)?;
        let spec = SdpaSpec::new(batch, seq, cfg.num_heads, cfg.d_kv).scale(1.0);
        if let Some(table) = &m.relative_attention_bias {
            let bias = self.position_bias(table, seq)?;
            for b in &m.blocks {
                let h = b.attention_norm.rms(be, &x, rows, eps)?;
                let (q, k, v) =
                    (b.q.forward(be, &h, rows)?, b.k.forward(be, &h, rows)?, b.v.forward(be, &h, rows)?);
                let mut att = be.zeros(rows * inner)?;
                be.sdpa(&mut att, &q, &k, &v, mask, Some(&bias), &spec)?;
                be.axpy(&mut x, 1.0, &b.o.forward(be, &att, rows)?)?;
                let h = b.ff_norm.rms(be, &x, rows, eps)?;
                let (gate, up) = (b.wi_0.forward(be, &h, rows)?, b.wi_1.forward(be, &h, rows)?);
                let mut act = be.zeros(rows * ff)?;
                be.gated(cfg.act, &mut act, &gate, &up)?;
                be.axpy(&mut x, 1.0, &b.wo.forward(be, &act, rows)?)?;
            }
        }
        let out = m.final_layer_norm.rms(be, &x, rows, eps)?;
        be.download(&out)
    }
}
