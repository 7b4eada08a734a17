//! The cross_entropy family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::CrossEntropyOps;
use rusting_brain_core::backend::CrossEntropySum;
use rusting_brain_core::ops::cross_entropy;
use rusting_brain_core::Result;

impl CrossEntropyOps for PortableBackend {
    fn cross_entropy(
        &self, logits: &mut Vec<f32>, targets: &[u32], mask: Option<&[bool]>, rows: usize, vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum> {
        cross_entropy::cross_entropy(logits, targets, mask, rows, vocab, grad_scale)
    }
}
