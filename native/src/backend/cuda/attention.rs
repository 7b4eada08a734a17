//! Attention on CUDA (`kernels/cu/attention.cu`, and the BF16 tensor-core kernels of
//! `flash_attention.cu` under mixed precision); twin of `rusting_brain_core::ops::attention`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::AttentionOps;
use rusting_brain_core::backend::AttentionSpec;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/attention.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) =
    ("attention", &["attention_forward", "attention_backward_dq", "attention_backward_dkv"]);

/// The kernels of `kernels/cu/flash_attention.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const FLASH_KERNELS: (&str, &[&str]) = (
    "flash_attention",
    &[
        "flash_forward_64",
        "flash_backward_kv_64",
        "flash_backward_q_64",
        "flash_forward_128",
        "flash_backward_kv_128",
        "flash_backward_q_128",
        "flash_delta",
    ],
);

/// The shape argument of the attention kernels (`struct Shape` in attention.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct AttnShape {
    batch: i32,
    q_len: i32,
    kv_len: i32,
    kv_capacity: i32,
    q_heads: i32,
    kv_heads: i32,
    head_dim: i32,
}
// SAFETY: plain-old-data of i32 fields, laid out as the C struct the kernels take.
unsafe impl DeviceRepr for AttnShape {}

/// `struct Shape` of flash_attention.cu (the head size is in the kernel's name).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct FlashShape {
    batch: i32,
    q_len: i32,
    kv_len: i32,
    kv_capacity: i32,
    q_heads: i32,
    kv_heads: i32,
}
// SAFETY: as for AttnShape.
unsafe impl DeviceRepr for FlashShape {}

impl CudaBackend {
    pub(super) fn attention_shape(spec: &AttentionSpec) -> Result<AttnShape> {
        Ok(AttnShape {
            batch: i32_of("batch", spec.batch)?,
            q_len: i32_of("q_len", spec.q_len)?,
            kv_len: i32_of("kv_len", spec.kv_len)?,
            kv_capacity: i32_of("kv_capacity", spec.kv_capacity)?,
            q_heads: i32_of("q_heads", spec.q_heads)?,
            kv_heads: i32_of("kv_heads", spec.kv_heads)?,
            head_dim: i32_of("head_dim", spec.head_dim)?,
        })
    }

    pub(super) fn flash_shape(s: &AttnShape) -> FlashShape {
        FlashShape {
            batch: s.batch,
            q_len: s.q_len,
            kv_len: s.kv_len,
            kv_capacity: s.kv_capacity,
            q_heads: s.q_heads,
            kv_heads: s.kv_heads,
        }
    }

    /// Whether this call takes the tensor-core kernels.
    pub(super) fn use_flash(&self, spec: &AttentionSpec) -> bool {
        self.bf16_attention() && (spec.head_dim == 64 || spec.head_dim == 128)
    }

    pub(super) fn warps_cfg(rows: usize) -> Result<LaunchConfig> {
        // 8 warps a block, one warp a row.
        let blocks = rows.div_ceil(8);
        if blocks > i32::MAX as usize {
            return Err(dev_err("too many rows for one launch"));
        }
        Ok(LaunchConfig {
            grid_dim: (blocks.max(1) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }

    pub(super) fn flash_cfg(blocks: usize, s: &FlashShape, heads: i32) -> Result<LaunchConfig> {
        if blocks > i32::MAX as usize || s.batch > 65_535 || heads > 65_535 {
            return Err(dev_err("attention grid too large for one launch"));
        }
        Ok(LaunchConfig {
            grid_dim: (blocks.max(1) as u32, heads as u32, s.batch as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        })
    }

    pub(super) fn check_f32_head(&self, spec: &AttentionSpec) -> Result<()> {
        // attention.cu holds at most 8 features a lane (32 lanes).
        if spec.head_dim > 256 {
            return Err(CoreError::InvalidDimension {
                op: "attention (cuda)",
                message: format!(
                    "head_dim {} is over 256, the most the CUDA attention kernels take",
                    spec.head_dim
                ),
            });
        }
        Ok(())
    }
}

pub(super) fn attention_forward(
    be: &CudaBackend, out: &mut CudaBuffer, lse: &mut CudaBuffer, q: &CudaBuffer, k: &CudaBuffer,
    v: &CudaBuffer, spec: &AttentionSpec,
) -> Result<()> {
    spec.check_forward(out.len, lse.len, q.len, k.len, v.len)?;
    if spec.batch == 0 || spec.q_len == 0 || spec.q_heads == 0 {
        return Ok(());
    }
    let s = CudaBackend::attention_shape(spec)?;
    if be.use_flash(spec) {
        let fs = CudaBackend::flash_shape(&s);
        let cfg = CudaBackend::flash_cfg(spec.q_len.div_ceil(64), &fs, s.q_heads)?;
        return if spec.head_dim == 64 {
            launch!(be, "flash_forward_64", cfg; &mut out.data, &mut lse.data, &q.data, &k.data, &v.data, &fs)
        } else {
            launch!(be, "flash_forward_128", cfg; &mut out.data, &mut lse.data, &q.data, &k.data, &v.data, &fs)
        };
    }
    be.check_f32_head(spec)?;
    let rows = spec.batch * spec.q_len * spec.q_heads;
    launch!(be, "attention_forward", CudaBackend::warps_cfg(rows)?;
        &mut out.data, &mut lse.data, &q.data, &k.data, &v.data, &s)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attention_backward(
    be: &CudaBackend, dq: &mut CudaBuffer, dk: &mut CudaBuffer, dv: &mut CudaBuffer, dout: &CudaBuffer,
    q: &CudaBuffer, k: &CudaBuffer, v: &CudaBuffer, out: &CudaBuffer, lse: &CudaBuffer, spec: &AttentionSpec,
) -> Result<()> {
    spec.check_backward([dq.len, dk.len, dv.len, dout.len, q.len, k.len, v.len, out.len, lse.len])?;
    if spec.batch == 0 || spec.q_heads == 0 {
        // No query sees a key: their gradients are zero, as the reference writes them.
        be.fill(dk, 0.0)?;
        return be.fill(dv, 0.0);
    }
    let s = CudaBackend::attention_shape(spec)?;
    if be.use_flash(spec) {
        let rows = spec.batch * spec.q_len * spec.q_heads;
        let mut delta = be.alloc(rows)?;
        let d = s.head_dim;
        launch!(be, "flash_delta", CudaBackend::warps_cfg(rows)?;
            &mut delta.data, &dout.data, &out.data, &(rows as i64), &d)?;
        let fs = CudaBackend::flash_shape(&s);
        let kv_cfg = CudaBackend::flash_cfg(spec.kv_capacity.div_ceil(64), &fs, s.kv_heads)?;
        let q_cfg = CudaBackend::flash_cfg(spec.q_len.div_ceil(64), &fs, s.q_heads)?;
        if spec.head_dim == 64 {
            launch!(be, "flash_backward_kv_64", kv_cfg;
                &mut dk.data, &mut dv.data, &dout.data, &q.data, &k.data, &v.data, &lse.data, &delta.data, &fs)?;
            return launch!(be, "flash_backward_q_64", q_cfg;
                &mut dq.data, &dout.data, &q.data, &k.data, &v.data, &lse.data, &delta.data, &fs);
        }
        launch!(be, "flash_backward_kv_128", kv_cfg;
            &mut dk.data, &mut dv.data, &dout.data, &q.data, &k.data, &v.data, &lse.data, &delta.data, &fs)?;
        return launch!(be, "flash_backward_q_128", q_cfg;
            &mut dq.data, &dout.data, &q.data, &k.data, &v.data, &lse.data, &delta.data, &fs);
    }
    be.check_f32_head(spec)?;
    let q_rows = spec.batch * spec.q_len * spec.q_heads;
    launch!(be, "attention_backward_dq", CudaBackend::warps_cfg(q_rows)?;
        &mut dq.data, &dout.data, &q.data, &k.data, &v.data, &out.data, &lse.data, &s)?;
    let kv_rows = spec.batch * spec.kv_capacity * spec.kv_heads;
    launch!(be, "attention_backward_dkv", CudaBackend::warps_cfg(kv_rows)?;
        &mut dk.data, &mut dv.data, &dout.data, &q.data, &k.data, &v.data, &out.data, &lse.data, &s)
}

impl AttentionOps for CudaBackend {
    fn attention_forward(
        &self, out: &mut CudaBuffer, lse: &mut CudaBuffer, q: &CudaBuffer, k: &CudaBuffer, v: &CudaBuffer,
        spec: &AttentionSpec,
    ) -> Result<()> {
        attention_forward(self, out, lse, q, k, v, spec)
    }
    fn attention_backward(
        &self, dq: &mut CudaBuffer, dk: &mut CudaBuffer, dv: &mut CudaBuffer, dout: &CudaBuffer,
        q: &CudaBuffer, k: &CudaBuffer, v: &CudaBuffer, out: &CudaBuffer, lse: &CudaBuffer,
        spec: &AttentionSpec,
    ) -> Result<()> {
        attention_backward(self, dq, dk, dv, dout, q, k, v, out, lse, spec)
    }
}
