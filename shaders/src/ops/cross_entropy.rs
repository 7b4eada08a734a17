//! Softmax cross-entropy with its gradient in place (`cross_entropy.wgsl`); twin of
//! `rusting_brain_core::ops::cross_entropy`.

use super::*;
use crate::backend::sum_losses;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::CrossEntropyOps;
use rusting_brain_core::backend::CrossEntropySum;
use rusting_brain_core::Result;

const CROSS_ENTROPY: Kernel = kernel!(
    "cross_entropy",
    { rows: u32, vocab: u32, grad: u32, scale: f32 },
    [read targets: u32, read_write logits: f32, read_write loss: f32], prelude "reduce"
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[CROSS_ENTROPY];

/// The target word of a row that is not counted (masked out).
pub const NOT_COUNTED: u32 = u32::MAX;

impl Batch<'_> {
    /// Each row's loss `lse - logit[target]` into `loss` (0 for a row whose target is
    /// `NOT_COUNTED`); with `grad_scale`, the rows overwritten by their gradient.
    pub fn cross_entropy(
        &mut self, logits: &GpuBuffer, targets: &GpuBuffer, loss: &GpuBuffer, (rows, vocab): (usize, usize),
        grad_scale: Option<f32>,
    ) -> Result<(), ShaderError> {
        need("cross_entropy", "logits", logits, rows * vocab)?;
        need("cross_entropy", "targets", targets, rows)?;
        need("cross_entropy", "loss", loss, rows)?;
        if rows == 0 || vocab == 0 {
            return Ok(());
        }
        let p = [
            u(rows, "rows")?,
            u(vocab, "vocab")?,
            grad_scale.is_some() as u32,
            grad_scale.unwrap_or(0.0).to_bits(),
        ];
        self.dispatch(&CROSS_ENTROPY, &p, &[targets, logits, loss], grid(rows))?;
        Ok(())
    }
}

impl CrossEntropyOps for WgpuBackend {
    fn cross_entropy(
        &self, logits: &mut GpuBuffer, targets: &[u32], mask: Option<&[bool]>, rows: usize, vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum> {
        rusting_brain_core::ops::cross_entropy::check_cross_entropy(
            logits.len(),
            targets,
            mask,
            rows,
            vocab,
        )?;
        let counted = |r: usize| mask.is_none_or(|m| m[r]);
        let words: Vec<u32> = (0..rows).map(|r| if counted(r) { targets[r] } else { NOT_COUNTED }).collect();
        self.record(|b, pools| {
            let targets = pools.stage(&words)?;
            let loss = pools.scratch("cross-entropy losses", rows)?;
            b.cross_entropy(logits, &targets, &loss, (rows, vocab), grad_scale)
        })?;
        {
            let mut rec = self.lock();
            if rec.defer_losses {
                let flags: Vec<bool> = (0..rows).map(counted).collect();
                let count = flags.iter().filter(|&&c| c).count();
                rec.deferred = Some(flags);
                return Ok(CrossEntropySum { loss_sum: 0.0, count });
            }
        }
        let losses = self.read_scratch("cross-entropy losses", rows)?;
        sum_losses(&losses, counted)
    }
}
