//! The embedding family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::EmbeddingOps;
use rusting_brain_core::ops::embedding;
use rusting_brain_core::Result;

impl EmbeddingOps for PortableBackend {
    fn embedding_forward(
        &self, out: &mut Vec<f32>, table: &Vec<f32>, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()> {
        embedding::embedding_forward(out, table, ids, vocab, dim)
    }
    fn embedding_backward(
        &self, dtable: &mut Vec<f32>, dout: &Vec<f32>, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()> {
        embedding::embedding_backward(dtable, dout, ids, vocab, dim)
    }
}
