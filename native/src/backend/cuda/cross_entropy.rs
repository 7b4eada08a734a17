//! The fused cross-entropy on CUDA (`kernels/cu/cross_entropy.cu`); twin of
//! `rusting_brain_core::ops::cross_entropy`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::CrossEntropyOps;
use rusting_brain_core::backend::CrossEntropySum;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/cross_entropy.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) = ("cross_entropy", &["cross_entropy"]);

pub(super) fn cross_entropy(
    be: &CudaBackend, logits: &mut CudaBuffer, targets: &[u32], mask: Option<&[bool]>, rows: usize,
    vocab: usize, grad_scale: Option<f32>,
) -> Result<CrossEntropySum> {
    ops::cross_entropy::check_cross_entropy(logits.len, targets, mask, rows, vocab)?;
    let counted = mask.map_or(rows, |m| m.iter().filter(|&&b| b).count());
    let mut losses = be.alloc(rows)?;
    if rows > 0 {
        let tg = be.upload_u32(targets)?;
        let flags: Vec<u8> = match mask {
            Some(m) => m.iter().map(|&b| b as u8).collect(),
            None => vec![1; rows],
        };
        let mg = be.upload_any(&flags)?;
        let (r, v) = (i32_of("rows", rows)?, i32_of("vocab", vocab)?);
        let write = grad_scale.is_some() as i32;
        let gs = grad_scale.unwrap_or(0.0);
        launch!(be, "cross_entropy", rows_grid(rows, 256)?;
            &mut logits.data, &mut losses.data, &tg, &mg, &r, &v, &write, &gs)?;
    }
    // The per-row losses, added on the host in f64 in row order.
    let host = be.download(&losses)?;
    let loss_sum: f64 = host.iter().map(|&l| l as f64).sum();
    let sum = CrossEntropySum { loss_sum, count: counted };
    if !loss_sum.is_finite() {
        return Err(CoreError::NonFinite { op: "cross_entropy", value: loss_sum });
    }
    Ok(sum)
}

impl CrossEntropyOps for CudaBackend {
    fn cross_entropy(
        &self, logits: &mut CudaBuffer, targets: &[u32], mask: Option<&[bool]>, rows: usize, vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum> {
        cross_entropy(self, logits, targets, mask, rows, vocab, grad_scale)
    }
}
