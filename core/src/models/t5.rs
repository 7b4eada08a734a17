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
use crate::models::layers::{Layout, Weights};
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
        for (what, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("d_kv", self.d_kv),
            ("d_ff", self.d_ff),
            ("num_heads", self.num_heads),
            ("relative_attention_max_distance", self.relative_attention_max_distance),
        ] {
            if v == 0 {
                return bad(format!("{what} must be at least 1"));
            }
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

    /// Every tensor, under transformers' names (`shared.weight` is the embedding).
    pub fn layout(&self) -> Layout {
        let (d, inner, ff) = (self.d_model, self.inner(), self.d_ff);
        let mut l = Layout::default();
        l.push("shared.weight".into(), vec![self.vocab_size, d]);
        for n in 0..self.num_layers {
            let p = format!("encoder.block.{n}.layer");
            for proj in ["q", "k", "v"] {
                l.push(format!("{p}.0.SelfAttention.{proj}.weight"), vec![inner, d]);
            }
            l.push(format!("{p}.0.SelfAttention.o.weight"), vec![d, inner]);
            if n == 0 {
                l.push(
                    format!("{p}.0.SelfAttention.relative_attention_bias.weight"),
                    vec![self.relative_attention_num_buckets, self.num_heads],
                );
            }
            l.push(format!("{p}.0.layer_norm.weight"), vec![d]);
            l.push(format!("{p}.1.DenseReluDense.wi_0.weight"), vec![ff, d]);
            l.push(format!("{p}.1.DenseReluDense.wi_1.weight"), vec![ff, d]);
            l.push(format!("{p}.1.DenseReluDense.wo.weight"), vec![d, ff]);
            l.push(format!("{p}.1.layer_norm.weight"), vec![d]);
        }
        l.push("encoder.final_layer_norm.weight".into(), vec![d]);
        l
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

/// A T5 encoder over backend `B`, with its weights.
pub struct T5Encoder<B: Backend> {
    backend: B,
    config: T5Config,
    weights: Weights<B>,
}

impl<B: Backend> T5Encoder<B> {
    /// Bytes the weights hold (see [`Weights::bytes`]).
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes(&self.backend)
    }

    /// The encoder from its weights by transformers' names, each checked against the configuration.
    pub fn new(backend: B, config: T5Config, weights: BTreeMap<String, B::Buffer>) -> Result<Self> {
        T5Encoder::with_q8(backend, config, weights, BTreeMap::new())
    }

    /// [`T5Encoder::new`] with the projection matrices in `q8` as int8.
    pub fn with_q8(
        backend: B, config: T5Config, weights: BTreeMap<String, B::Buffer>,
        q8: BTreeMap<String, (B::Buffer, B::Buffer)>,
    ) -> Result<Self> {
        config.validate()?;
        let weights = Weights::with_q8(&backend, &config.layout(), weights, q8)?;
        Ok(T5Encoder { backend, config, weights })
    }

    /// The architecture.
    pub fn config(&self) -> &T5Config {
        &self.config
    }

    /// `x W^T` for the bias-free projection `name`, weight `(dout, din)`.
    fn project(&self, name: &str, x: &B::Buffer, rows: usize, din: usize, dout: usize) -> Result<B::Buffer> {
        let mut y = self.backend.zeros(rows * dout)?;
        self.weights.project(&self.backend, name, &mut y, x, rows, din, dout)?;
        Ok(y)
    }

    fn norm(&self, name: &str, x: &B::Buffer, rows: usize) -> Result<B::Buffer> {
        let (be, d) = (&self.backend, self.config.d_model);
        let (mut y, mut rstd) = (be.zeros(rows * d)?, be.zeros(rows)?);
        be.rmsnorm_forward(
            &mut y,
            &mut rstd,
            x,
            self.weights.get(name)?,
            rows,
            d,
            self.config.layer_norm_epsilon,
        )?;
        Ok(y)
    }

    /// The `(heads, seq, seq)` position bias of block 0's table.
    fn position_bias(&self, seq: usize) -> Result<B::Buffer> {
        let cfg = &self.config;
        let table = self.backend.download(
            self.weights.get("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")?,
        )?;
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
        let mut x = be.zeros(rows * d)?;
        be.embedding_forward(&mut x, self.weights.get("shared.weight")?, ids, cfg.vocab_size, d)?;
        let bias = self.position_bias(seq)?;
        let spec = SdpaSpec::new(batch, seq, cfg.num_heads, cfg.d_kv).scale(1.0);
        for n in 0..cfg.num_layers {
            let p = format!("encoder.block.{n}.layer");
            let h = self.norm(&format!("{p}.0.layer_norm.weight"), &x, rows)?;
            let q = self.project(&format!("{p}.0.SelfAttention.q.weight"), &h, rows, d, inner)?;
            let k = self.project(&format!("{p}.0.SelfAttention.k.weight"), &h, rows, d, inner)?;
            let v = self.project(&format!("{p}.0.SelfAttention.v.weight"), &h, rows, d, inner)?;
            let mut att = be.zeros(rows * inner)?;
            be.sdpa(&mut att, &q, &k, &v, mask, Some(&bias), &spec)?;
            let o = self.project(&format!("{p}.0.SelfAttention.o.weight"), &att, rows, inner, d)?;
            be.axpy(&mut x, 1.0, &o)?;
            let h = self.norm(&format!("{p}.1.layer_norm.weight"), &x, rows)?;
            let gate = self.project(&format!("{p}.1.DenseReluDense.wi_0.weight"), &h, rows, d, ff)?;
            let up = self.project(&format!("{p}.1.DenseReluDense.wi_1.weight"), &h, rows, d, ff)?;
            let mut act = be.zeros(rows * ff)?;
            be.gated(cfg.act, &mut act, &gate, &up)?;
            let down = self.project(&format!("{p}.1.DenseReluDense.wo.weight"), &act, rows, ff, d)?;
            be.axpy(&mut x, 1.0, &down)?;
        }
        let out = self.norm("encoder.final_layer_norm.weight", &x, rows)?;
        be.download(&out)
    }
}
