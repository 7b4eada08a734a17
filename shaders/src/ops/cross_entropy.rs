//! Softmax cross-entropy with its gradient in place (`cross_entropy.wgsl`); twin of
//! `rusting_brain_core::ops::cross_entropy`.

use super::*;

/// The target word of a row that is not counted (masked out).
pub const NOT_COUNTED: u32 = u32::MAX;

impl Batch<'_> {
    /// Each row's loss `lse - logit[target]` into `loss` (0 for a row whose target is
    /// `NOT_COUNTED`); with `grad_scale`, the rows overwritten by their gradient.
    pub fn cross_entropy(
        &mut self,
        logits: &GpuBuffer,
        targets: &GpuBuffer,
        loss: &GpuBuffer,
        (rows, vocab): (usize, usize),
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
        self.dispatch(Kernel::CrossEntropy, &p, &[targets, logits, loss], grid(rows))?;
        Ok(())
    }
}
