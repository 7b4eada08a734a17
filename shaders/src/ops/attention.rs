//! Causal GQA attention (`attention.wgsl`, `attention_backward_q.wgsl`,
//! `attention_backward_kv.wgsl`); twin of `rusting_brain_core::ops::attention`.

use super::*;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::AttentionOps;
use rusting_brain_core::backend::AttentionSpec;
use rusting_brain_core::Result;

/// The shape every attention kernel takes (`AttentionSpec`).
const ATTENTION_PARAMS: &str = "batch: u32, q_len: u32, kv_len: u32, kv_capacity: u32, q_heads: u32, kv_heads: u32, head_dim: u32, scale: f32";
const ATTENTION: Kernel = kernel!(
    "attention",
    ATTENTION_PARAMS,
    [read q: f32, read k: f32, read v: f32, read_write out: f32, read_write lse: f32,
         read_write scores: f32], prelude "reduce"
);
const ATTENTION_BACKWARD_Q: Kernel = kernel!(
    "attention_backward_q",
    ATTENTION_PARAMS,
    [read q: f32, read k: f32, read v: f32, read out: f32, read dout: f32, read lse: f32,
         read_write dq: f32, read_write delta: f32]
);
const ATTENTION_BACKWARD_KV: Kernel = kernel!(
    "attention_backward_kv",
    ATTENTION_PARAMS,
    [read q: f32, read k: f32, read v: f32, read dout: f32, read lse: f32, read delta: f32,
         read_write dk: f32, read_write dv: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[ATTENTION, ATTENTION_BACKWARD_Q, ATTENTION_BACKWARD_KV];

/// The largest head size the backward kernels hold in registers (four values a thread).
pub const MAX_HEAD_DIM: usize = 4 * WG;

/// The attention kernels' parameters, in the order of their `Params` structs.
fn attention_params(spec: &AttentionSpec) -> Result<[u32; 8], ShaderError> {
    let scale = 1.0 / (spec.head_dim as f32).sqrt();
    Ok([
        u(spec.batch, "batch")?,
        u(spec.q_len, "q_len")?,
        u(spec.kv_len, "kv_len")?,
        u(spec.kv_capacity, "kv_capacity")?,
        u(spec.q_heads, "q_heads")?,
        u(spec.kv_heads, "kv_heads")?,
        u(spec.head_dim, "head_dim")?,
        scale.to_bits(),
    ])
}

impl Batch<'_> {
    /// Backward of [`Batch::attention`]: `dq`, `dk`, `dv` overwritten (cache rows past
    /// `kv_len` get zeros); `delta` (`batch * q_len * q_heads` words) is scratch. Two
    /// passes, query side then key side, each summing in the reference's order; nothing
    /// of size T x T is stored.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        &mut self, [dq, dk, dv]: [&GpuBuffer; 3], dout: &GpuBuffer, [q, k, v, out, lse]: [&GpuBuffer; 5],
        delta: &GpuBuffer, spec: &AttentionSpec,
    ) -> Result<(), ShaderError> {
        const OP: &str = "attention_backward";
        let (nq, nkv, nl) = spec.check(OP)?;
        if spec.head_dim > MAX_HEAD_DIM {
            return Err(ShaderError::Invalid(format!(
                "{OP}: head size {} is over the wgpu kernels' {MAX_HEAD_DIM}",
                spec.head_dim
            )));
        }
        for (name, b, len) in [
            ("dq", dq, nq),
            ("dout", dout, nq),
            ("q", q, nq),
            ("out", out, nq),
            ("dk", dk, nkv),
            ("dv", dv, nkv),
            ("k", k, nkv),
            ("v", v, nkv),
            ("lse", lse, nl),
            ("delta", delta, nl),
        ] {
            need(OP, name, b, len)?;
        }
        let p = attention_params(spec)?;
        if nl > 0 {
            self.dispatch(&ATTENTION_BACKWARD_Q, &p, &[q, k, v, out, dout, lse, dq, delta], grid(nl))?;
        }
        let kv_rows = spec.batch * spec.kv_capacity * spec.kv_heads;
        if kv_rows > 0 {
            self.dispatch(&ATTENTION_BACKWARD_KV, &p, &[q, k, v, dout, lse, delta, dk, dv], grid(kv_rows))?;
        }
        Ok(())
    }

    /// Causal GQA attention over a cache (layouts of `rusting_brain_core::ops::attention`):
    /// writes `out` and the log-sum-exp `lse`; `scratch` holds the scores.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &mut self, out: &GpuBuffer, lse: &GpuBuffer, q: &GpuBuffer, k: &GpuBuffer, v: &GpuBuffer,
        scratch: &AttentionScratch, spec: &AttentionSpec,
    ) -> Result<(), ShaderError> {
        const OP: &str = "attention";
        let (nq, nkv, nl) = spec.check(OP)?;
        need(OP, "q", q, nq)?;
        need(OP, "out", out, nq)?;
        need(OP, "k", k, nkv)?;
        need(OP, "v", v, nkv)?;
        need(OP, "lse", lse, nl)?;
        need(OP, "scratch", scratch, nl * spec.kv_capacity)?;
        if nl == 0 {
            return Ok(());
        }
        let p = attention_params(spec)?;
        self.dispatch(&ATTENTION, &p, &[q, k, v, out, lse, scratch], grid(nl))?;
        Ok(())
    }
}

impl AttentionOps for WgpuBackend {
    fn attention_forward(
        &self, out: &mut GpuBuffer, lse: &mut GpuBuffer, q: &GpuBuffer, k: &GpuBuffer, v: &GpuBuffer,
        spec: &AttentionSpec,
    ) -> Result<()> {
        let (_, _, nl) = spec.check("attention_forward")?;
        spec.check_forward(out.len(), lse.len(), q.len(), k.len(), v.len())?;
        self.record(|b, pools| {
            let scratch = pools.scratch("attention scores", nl * spec.kv_capacity)?;
            b.attention(out, lse, q, k, v, &scratch, spec)
        })
    }
    fn attention_backward(
        &self, dq: &mut GpuBuffer, dk: &mut GpuBuffer, dv: &mut GpuBuffer, dout: &GpuBuffer, q: &GpuBuffer,
        k: &GpuBuffer, v: &GpuBuffer, out: &GpuBuffer, lse: &GpuBuffer, spec: &AttentionSpec,
    ) -> Result<()> {
        spec.check_backward([&*dq, &*dk, &*dv, dout, q, k, v, out, lse].map(|b| b.len()))?;
        let (_, _, nl) = spec.check("attention_backward")?;
        self.record(|b, pools| {
            let delta = pools.scratch("attention delta", nl)?;
            b.attention_backward([dq, dk, dv], dout, [q, k, v, out, lse], &delta, spec)
        })
    }
}
