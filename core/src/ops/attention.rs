//! Causal grouped-query attention, flash style: the forward saves one log-sum-exp per query
//! row instead of the (T, T) probabilities, and the backward recomputes them.
//!
//! Layouts (row-major), matching the output of the Q/K/V projections without a transpose:
//! - `q`, `out`: `(batch, q_len, q_heads, head_dim)`
//! - `k`, `v`: `(batch, kv_capacity, kv_heads, head_dim)`, of which the first `kv_len`
//!   positions are valid (a KV cache is allocated at capacity and filled as decoding goes)
//! - `lse`: `(batch, q_len, q_heads)`
//!
//! Query row `t` sits at absolute position `kv_len - q_len + t` and attends to keys
//! `0..=position`. Query head `h` reads key/value head `h / (q_heads / kv_heads)`.
//! Scores are scaled by `1 / sqrt(head_dim)`.

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};
use alloc::vec::Vec;

/// Causal grouped-query attention over a KV cache: `q (batch, q_len, q_heads, head_dim)`, keys and values `(batch, kv_capacity, kv_heads, head_dim)` of which the first `kv_len` are filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionSpec {
    /// Sequences.
    pub batch: usize,
    /// New query positions (the last `q_len` of `kv_len`).
    pub q_len: usize,
    /// Filled key positions.
    pub kv_len: usize,
    /// Positions the key/value buffers hold.
    pub kv_capacity: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (a divisor of `q_heads`).
    pub kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
}

impl AttentionSpec {
    /// Self-attention over a full sequence (training): `kv_len == kv_capacity == q_len`.
    pub fn causal(batch: usize, seq: usize, q_heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        AttentionSpec { batch, q_len: seq, kv_len: seq, kv_capacity: seq, q_heads, kv_heads, head_dim }
    }

    /// Validates the spec; returns `(len of q/out, len of k/v, len of lse)`.
    pub fn check(&self, op: &'static str) -> Result<(usize, usize, usize)> {
        nonzero(op, "head_dim", self.head_dim)?;
        nonzero(op, "kv_heads", self.kv_heads)?;
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return Err(CoreError::InvalidDimension {
                op,
                message: alloc::format!(
                    "q_heads ({}) must be a multiple of kv_heads ({})",
                    self.q_heads,
                    self.kv_heads
                ),
            });
        }
        if self.q_len > self.kv_len || self.kv_len > self.kv_capacity {
            return Err(CoreError::InvalidDimension {
                op,
                message: alloc::format!(
                    "need q_len ({}) <= kv_len ({}) <= kv_capacity ({})",
                    self.q_len,
                    self.kv_len,
                    self.kv_capacity
                ),
            });
        }
        let q = product(op, &[self.batch, self.q_len, self.q_heads, self.head_dim])?;
        let kv = product(op, &[self.batch, self.kv_capacity, self.kv_heads, self.head_dim])?;
        let lse = product(op, &[self.batch, self.q_len, self.q_heads])?;
        Ok((q, kv, lse))
    }

    /// The shape contract of `attention_forward`, shared by every backend (buffer lengths).
    pub fn check_forward(&self, out: usize, lse: usize, q: usize, k: usize, v: usize) -> Result<()> {
        const OP: &str = "attention_forward";
        let (nq, nkv, nl) = self.check(OP)?;
        check_len(OP, "q", q, nq)?;
        check_len(OP, "out", out, nq)?;
        check_len(OP, "k", k, nkv)?;
        check_len(OP, "v", v, nkv)?;
        check_len(OP, "lse", lse, nl)
    }

    /// The shape contract of `attention_backward`: the lengths of
    /// `[dq, dk, dv, dout, q, k, v, out, lse]`, in the function's argument order.
    pub fn check_backward(&self, lens: [usize; 9]) -> Result<()> {
        const OP: &str = "attention_backward";
        let (nq, nkv, nl) = self.check(OP)?;
        let names = ["dq", "dk", "dv", "dout", "q", "k", "v", "out", "lse"];
        let wants = [nq, nkv, nkv, nq, nq, nkv, nkv, nq, nl];
        for i in 0..9 {
            check_len(OP, names[i], lens[i], wants[i])?;
        }
        Ok(())
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }
    /// Offset of query row `(b, t, h)` in `q`/`out`.
    pub fn q_index(&self, b: usize, t: usize, h: usize) -> usize {
        ((b * self.q_len + t) * self.q_heads + h) * self.head_dim
    }
    /// Offset of key/value row `(b, j, kvh)` in `k`/`v`.
    pub fn kv_index(&self, b: usize, j: usize, kvh: usize) -> usize {
        ((b * self.kv_capacity + j) * self.kv_heads + kvh) * self.head_dim
    }
    /// Number of keys query row `t` sees.
    pub fn visible(&self, t: usize) -> usize {
        self.kv_len - self.q_len + t + 1
    }
    /// Multiply-adds of the forward pass (QK^T and PV, causal), times two.
    pub fn flops(&self) -> f64 {
        let mut pairs = 0.0;
        for t in 0..self.q_len {
            pairs += self.visible(t) as f64;
        }
        4.0 * self.batch as f64 * self.q_heads as f64 * self.head_dim as f64 * pairs
    }
}

fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut acc = T::ZERO;
    for i in 0..a.len() {
        acc += a[i] * b[i];
    }
    acc
}

/// Forward: writes `out` and `lse`.
pub fn attention_forward<T: Real>(
    out: &mut [T], lse: &mut [T], q: &[T], k: &[T], v: &[T], spec: &AttentionSpec,
) -> Result<()> {
    spec.check_forward(out.len(), lse.len(), q.len(), k.len(), v.len())?;
    let d = spec.head_dim;
    let scale = T::ONE / T::from_usize(d).sqrt();
    let mut scores = alloc::vec![T::ZERO; spec.kv_len];
    for b in 0..spec.batch {
        for t in 0..spec.q_len {
            for h in 0..spec.q_heads {
                let kvh = h / spec.group();
                let qi = spec.q_index(b, t, h);
                let qrow = &q[qi..qi + d];
                let n = spec.visible(t);
                let mut max = T::NEG_INFINITY;
                for (j, s) in scores[..n].iter_mut().enumerate() {
                    let ki = spec.kv_index(b, j, kvh);
                    *s = scale * dot(qrow, &k[ki..ki + d]);
                    max = max.max(*s);
                }
                let mut sum = T::ZERO;
                for s in &scores[..n] {
                    sum += (*s - max).exp();
                }
                let l = max + sum.ln();
                lse[(b * spec.q_len + t) * spec.q_heads + h] = l;
                let o = &mut out[qi..qi + d];
                o.iter_mut().for_each(|x| *x = T::ZERO);
                for (j, s) in scores[..n].iter().enumerate() {
                    let p = (*s - l).exp();
                    let vi = spec.kv_index(b, j, kvh);
                    for i in 0..d {
                        o[i] += p * v[vi + i];
                    }
                }
            }
        }
    }
    Ok(())
}

/// Backward: writes `dq`, `dk`, `dv` (same shapes as `q`, `k`, `v`; cache rows past `kv_len`
/// get zero) from `dout`, the forward inputs, and the forward's `out` and `lse`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: Real>(
    dq: &mut [T], dk: &mut [T], dv: &mut [T], dout: &[T], q: &[T], k: &[T], v: &[T], out: &[T], lse: &[T],
    spec: &AttentionSpec,
) -> Result<()> {
    spec.check_backward([&*dq, &*dk, &*dv, dout, q, k, v, out, lse].map(|b| b.len()))?;
    let d = spec.head_dim;
    let scale = T::ONE / T::from_usize(d).sqrt();
    dq.iter_mut().for_each(|x| *x = T::ZERO);
    dk.iter_mut().for_each(|x| *x = T::ZERO);
    dv.iter_mut().for_each(|x| *x = T::ZERO);
    for b in 0..spec.batch {
        for t in 0..spec.q_len {
            for h in 0..spec.q_heads {
                let kvh = h / spec.group();
                let qi = spec.q_index(b, t, h);
                let l = lse[(b * spec.q_len + t) * spec.q_heads + h];
                // D = rowsum(dout * out) = sum_j P_j dP_j
                let delta = dot(&dout[qi..qi + d], &out[qi..qi + d]);
                for j in 0..spec.visible(t) {
                    let ki = spec.kv_index(b, j, kvh);
                    let p = (scale * dot(&q[qi..qi + d], &k[ki..ki + d]) - l).exp();
                    let dp = dot(&dout[qi..qi + d], &v[ki..ki + d]);
                    let ds = p * (dp - delta) * scale;
                    for i in 0..d {
                        dq[qi + i] += ds * k[ki + i];
                        dk[ki + i] += ds * q[qi + i];
                        dv[ki + i] += p * dout[qi + i];
                    }
                }
            }
        }
    }
    Ok(())
}

/// Causal grouped-query attention, forward and backward: see [`crate::ops::attention`].
pub trait AttentionOps: Memory {
    /// Causal grouped-query attention (see [`AttentionSpec`] for the layout), keeping each row's log-sum-exp in `lse` for the backward.
    fn attention_forward(
        &self, out: &mut Self::Buffer, lse: &mut Self::Buffer, q: &Self::Buffer, k: &Self::Buffer,
        v: &Self::Buffer, spec: &AttentionSpec,
    ) -> Result<()>;
    /// One query row each of several sequences over their own caches ([`AttentionRows`]):
    /// a decode step over several requests. Defined as [`attention_rows_each`] (a row at a
    /// time through `attention_forward`); a backend may run the rows as one job with the
    /// same numbers.
    fn attention_rows(&self, a: AttentionRows<'_, Self::Buffer>) -> Result<()> {
        attention_rows_each(self, a)
    }
    /// Attention's backward: `dq`, `dk`, `dv` (overwritten) from the forward's output and `lse`.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self, dq: &mut Self::Buffer, dk: &mut Self::Buffer, dv: &mut Self::Buffer, dout: &Self::Buffer,
        q: &Self::Buffer, k: &Self::Buffer, v: &Self::Buffer, out: &Self::Buffer, lse: &Self::Buffer,
        spec: &AttentionSpec,
    ) -> Result<()>;
}

/// The operands of [`AttentionOps::attention_rows`]: query rows of several sequences, row
/// `i` attending over the caches of sequence `rows[i].0` up to `rows[i].1` positions, as
/// `attention_forward` of that one query over those caches would.
pub struct AttentionRows<'a, T> {
    /// The outputs `(rows, q_heads * head_dim)`.
    pub out: &'a mut T,
    /// The queries, rotated: at least `(rows, q_heads * head_dim)`.
    pub q: &'a T,
    /// Each sequence's key and value caches (`spec.kv_capacity` positions of
    /// `kv_heads * head_dim`).
    pub caches: &'a [(&'a T, &'a T)],
    /// Each query row's sequence (an index into `caches`) and how many of its cache's
    /// positions it sees.
    pub rows: &'a [(usize, usize)],
    /// Heads, head size and the caches' capacity (`batch` and `q_len` 1; each row's
    /// `kv_len` is its own).
    pub spec: AttentionSpec,
    /// One query `(q_heads * head_dim)`, its output (the same) and log-sum-exps
    /// (`q_heads`): the definition's scratch.
    pub scratch: [&'a mut T; 3],
}

impl<'a, T> AttentionRows<'a, T> {
    /// Row `i`'s spec and its sequence's caches: a sequence past `caches`, or a row seeing
    /// no position or more than the capacity, is an error.
    pub fn row_spec(&self, i: usize) -> Result<(AttentionSpec, &'a T, &'a T)> {
        const OP: &str = "attention_rows";
        let (s, kv_len) = self.rows[i];
        let &(k, v) = self.caches.get(s).ok_or_else(|| CoreError::InvalidArgument {
            op: OP,
            message: alloc::format!("row {i} names sequence {s} of {}", self.caches.len()),
        })?;
        let spec = AttentionSpec { batch: 1, q_len: 1, kv_len, ..self.spec };
        spec.check(OP)?;
        Ok((spec, k, v))
    }
}

impl<'a> AttentionRows<'a, Vec<f32>> {
    /// [`AttentionRows::row_spec`] with the buffers' lengths checked as `attention_forward`
    /// checks one query's.
    pub fn row(&self, i: usize) -> Result<(AttentionSpec, &'a Vec<f32>, &'a Vec<f32>)> {
        const OP: &str = "attention_rows";
        let (spec, k, v) = self.row_spec(i)?;
        let (nq, nkv, _) = spec.check(OP)?;
        check_len(OP, "k", k.len(), nkv)?;
        check_len(OP, "v", v.len(), nkv)?;
        let rows = product(OP, &[self.rows.len(), nq])?;
        if self.q.len() < rows || self.out.len() < rows {
            return Err(CoreError::InvalidArgument {
                op: OP,
                message: alloc::format!(
                    "q ({}) and out ({}) need {} rows of {nq}",
                    self.q.len(),
                    self.out.len(),
                    self.rows.len()
                ),
            });
        }
        Ok((spec, k, v))
    }
}

/// [`AttentionOps::attention_rows`] a row at a time: the query into `scratch`,
/// `attention_forward` over its sequence's caches, the output copied to its row. The
/// definition, and every backend's way unless it runs the rows as one job.
pub fn attention_rows_each<B: AttentionOps + ?Sized>(b: &B, a: AttentionRows<'_, B::Buffer>) -> Result<()> {
    let qd = a.spec.q_heads * a.spec.head_dim;
    // Every row's sequence and span first: a bad one leaves `out` as it was.
    let rows = (0..a.rows.len()).map(|i| a.row_spec(i)).collect::<Result<Vec<_>>>()?;
    let [q1, att, lse] = a.scratch;
    for (i, (spec, k, v)) in rows.into_iter().enumerate() {
        b.copy_range(q1, 0, a.q, i * qd, qd)?;
        b.attention_forward(att, lse, q1, k, v, &spec)?;
        b.copy_range(a.out, i * qd, att, 0, qd)?;
    }
    Ok(())
}

impl AttentionOps for ReferenceBackend {
    fn attention_forward(
        &self, out: &mut Vec<f32>, lse: &mut Vec<f32>, q: &Vec<f32>, k: &Vec<f32>, v: &Vec<f32>,
        spec: &AttentionSpec,
    ) -> Result<()> {
        in_f64([out, lse], |[o, l]| attention_forward(o, l, &wide(q), &wide(k), &wide(v), spec))
    }
    fn attention_backward(
        &self, dq: &mut Vec<f32>, dk: &mut Vec<f32>, dv: &mut Vec<f32>, dout: &Vec<f32>, q: &Vec<f32>,
        k: &Vec<f32>, v: &Vec<f32>, out: &Vec<f32>, lse: &Vec<f32>, spec: &AttentionSpec,
    ) -> Result<()> {
        in_f64([dq, dk, dv], |[dq, dk, dv]| {
            let (q, k, v) = (wide(q), wide(k), wide(v));
            attention_backward(dq, dk, dv, &wide(dout), &q, &k, &v, &wide(out), &wide(lse), spec)
        })
    }
}
