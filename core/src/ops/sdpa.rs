//! Scaled dot-product attention over any query and key lengths (PyTorch's
//! `scaled_dot_product_attention`), forward only: the sibling of the causal training
//! attention in [`crate::ops::attention`] for the encoders and image models, which attend
//! both ways, across two sequences, under a padding mask or with a position bias.
//!
//! Layouts (row-major), the projections' outputs without a transpose:
//! - `q`, `out`: `(batch, q_len, heads, head_dim)`
//! - `k`, `v`: `(batch, kv_len, kv_heads, head_dim)`; query head `h` reads key/value head
//!   `h / (heads / kv_heads)`
//! - `key_mask` (host, optional): `(batch, kv_len)`, `true` where a key may be attended
//!   (a tokenizer's attention mask)
//! - `bias` (optional): `(heads, q_len, kv_len)`, added to the scaled scores, the same for
//!   every batch row (T5's relative-position bias)
//!
//! `scale` multiplies `q . k` (`1 / sqrt(head_dim)` for most models, 1 for T5). With
//! `causal`, query `t` sees keys `j <= t + kv_len - q_len` (CLIP's text tower). A query
//! that sees no key at all (every key masked) gets zeros, not the NaN of an empty softmax.

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::ops::matmul::{operand, OperandPrecision};
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};

/// Attention over any query and key lengths; see the module docs for the layout, masks and bias.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SdpaSpec {
    /// Sequences.
    pub batch: usize,
    /// Query positions.
    pub q_len: usize,
    /// Key (and value) positions.
    pub kv_len: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (a divisor of `heads`).
    pub kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Multiplies `q . k`.
    pub scale: f32,
    /// Each query sees only the keys up to its own position.
    pub causal: bool,
    /// What the products' operands are rounded to (mixed precision): at bf16, `q` and `k`
    /// for the scores, the unnormalized probabilities `exp(s - max)` and `v` for the
    /// weighted sum, which is then divided by the probabilities' (unrounded) sum.
    pub precision: OperandPrecision,
}

impl SdpaSpec {
    /// Self-attention over `seq` positions, every head its own keys, scale `1 / sqrt(d)`,
    /// not causal.
    pub fn new(batch: usize, seq: usize, heads: usize, head_dim: usize) -> Self {
        SdpaSpec {
            batch,
            q_len: seq,
            kv_len: seq,
            heads,
            kv_heads: heads,
            head_dim,
            scale: 1.0 / libm::sqrtf(head_dim.max(1) as f32),
            causal: false,
            precision: OperandPrecision::F32,
        }
    }
    /// The products' operands rounded to `p`.
    pub fn precision(mut self, p: OperandPrecision) -> Self {
        self.precision = p;
        self
    }
    /// Keys and values of another length (cross-attention).
    pub fn kv_len(mut self, kv_len: usize) -> Self {
        self.kv_len = kv_len;
        self
    }
    /// Key/value heads.
    pub fn kv_heads(mut self, kv_heads: usize) -> Self {
        self.kv_heads = kv_heads;
        self
    }
    /// The factor on `q . k`.
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = scale;
        self
    }
    /// Causal masking.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// The shape contract shared by every backend; returns the lengths `(q/out, k/v)`.
    pub fn check(
        &self, out: usize, q: usize, k: usize, v: usize, key_mask: Option<usize>, bias: Option<usize>,
    ) -> Result<(usize, usize)> {
        const OP: &str = "sdpa";
        nonzero(OP, "head_dim", self.head_dim)?;
        nonzero(OP, "kv_heads", self.kv_heads)?;
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(CoreError::InvalidDimension {
                op: OP,
                message: alloc::format!(
                    "heads ({}) must be a multiple of kv_heads ({})",
                    self.heads,
                    self.kv_heads
                ),
            });
        }
        if self.causal && self.q_len > self.kv_len {
            return Err(CoreError::InvalidDimension {
                op: OP,
                message: alloc::format!(
                    "causal attention needs q_len ({}) <= kv_len ({})",
                    self.q_len,
                    self.kv_len
                ),
            });
        }
        if !self.scale.is_finite() {
            return Err(CoreError::InvalidArgument {
                op: OP,
                message: alloc::format!("scale is {}", self.scale),
            });
        }
        let nq = product(OP, &[self.batch, self.q_len, self.heads, self.head_dim])?;
        let nkv = product(OP, &[self.batch, self.kv_len, self.kv_heads, self.head_dim])?;
        check_len(OP, "q", q, nq)?;
        check_len(OP, "out", out, nq)?;
        check_len(OP, "k", k, nkv)?;
        check_len(OP, "v", v, nkv)?;
        if let Some(m) = key_mask {
            check_len(OP, "key_mask", m, product(OP, &[self.batch, self.kv_len])?)?;
        }
        if let Some(b) = bias {
            check_len(OP, "bias", b, product(OP, &[self.heads, self.q_len, self.kv_len])?)?;
        }
        Ok((nq, nkv))
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
    /// Offset of query row `(b, t, h)` in `q`/`out`.
    pub fn q_index(&self, b: usize, t: usize, h: usize) -> usize {
        ((b * self.q_len + t) * self.heads + h) * self.head_dim
    }
    /// Offset of key/value row `(b, j, kvh)` in `k`/`v`.
    pub fn kv_index(&self, b: usize, j: usize, kvh: usize) -> usize {
        ((b * self.kv_len + j) * self.kv_heads + kvh) * self.head_dim
    }
    /// Keys `0..visible(t)` are the ones query `t` may see before the mask.
    pub fn visible(&self, t: usize) -> usize {
        if self.causal {
            t + self.kv_len - self.q_len + 1
        } else {
            self.kv_len
        }
    }
    /// Multiply-adds of QK^T and PV, times two (causal counted as full).
    pub fn flops(&self) -> f64 {
        4.0 * (self.batch * self.heads * self.head_dim) as f64 * self.q_len as f64 * self.kv_len as f64
    }
}

/// `out = softmax(scale * q k^T + bias, masked) v`; see the module docs.
pub fn sdpa<T: Real>(
    out: &mut [T], q: &[T], k: &[T], v: &[T], key_mask: Option<&[bool]>, bias: Option<&[T]>, spec: &SdpaSpec,
) -> Result<()> {
    spec.check(out.len(), q.len(), k.len(), v.len(), key_mask.map(|m| m.len()), bias.map(|b| b.len()))?;
    let d = spec.head_dim;
    let scale = T::from_f32(spec.scale);
    let mut p = alloc::vec![T::ZERO; spec.kv_len];
    for b in 0..spec.batch {
        for t in 0..spec.q_len {
            for h in 0..spec.heads {
                let kvh = h / spec.group();
                let qi = spec.q_index(b, t, h);
                let qrow = &q[qi..qi + d];
                let mut max = T::NEG_INFINITY;
                let mut seen = false;
                for (j, pj) in p.iter_mut().enumerate() {
                    let open = j < spec.visible(t) && key_mask.is_none_or(|m| m[b * spec.kv_len + j]);
                    if !open {
                        *pj = T::NEG_INFINITY;
                        continue;
                    }
                    let ki = spec.kv_index(b, j, kvh);
                    let mut s = T::ZERO;
                    for (a, c) in qrow.iter().zip(&k[ki..ki + d]) {
                        s += operand(*a, spec.precision) * operand(*c, spec.precision);
                    }
                    s *= scale;
                    if let Some(bias) = bias {
                        s += bias[(h * spec.q_len + t) * spec.kv_len + j];
                    }
                    *pj = s;
                    max = max.max(s);
                    seen = true;
                }
                let o = &mut out[qi..qi + d];
                o.fill(T::ZERO);
                if !seen {
                    continue;
                }
                let mut sum = T::ZERO;
                for pj in p.iter_mut() {
                    *pj = if *pj == T::NEG_INFINITY { T::ZERO } else { (*pj - max).exp() };
                    sum += *pj;
                }
                for (j, &pj) in p.iter().enumerate() {
                    if pj == T::ZERO {
                        continue;
                    }
                    let vi = spec.kv_index(b, j, kvh);
                    let pj = operand(pj, spec.precision);
                    for (oc, &vc) in o.iter_mut().zip(&v[vi..vi + d]) {
                        *oc += pj * operand(vc, spec.precision) / sum;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Scaled dot-product attention with masks and biases (image models, text encoders): see [`crate::ops::sdpa`].
pub trait SdpaOps: Memory {
    /// See [`crate::ops::sdpa::sdpa`]. The key mask is a host slice, like token ids.
    #[allow(clippy::too_many_arguments)]
    fn sdpa(
        &self, out: &mut Self::Buffer, q: &Self::Buffer, k: &Self::Buffer, v: &Self::Buffer,
        key_mask: Option<&[bool]>, bias: Option<&Self::Buffer>, spec: &SdpaSpec,
    ) -> Result<()> {
        let bias = bias.map(|b| self.download(b)).transpose()?;
        let mut o = alloc::vec![0.0; self.len(out)];
        let (q, k, v) = (self.download(q)?, self.download(k)?, self.download(v)?);
        crate::ops::sdpa::sdpa(&mut o, &q, &k, &v, key_mask, bias.as_deref(), spec)?;
        self.write(out, &o)
    }
}

impl SdpaOps for ReferenceBackend {}
