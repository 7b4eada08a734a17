//! Embedding lookup and its grouped backward on CUDA (`kernels/cu/embedding.cu`); twin of
//! `rusting_brain_core::ops::embedding`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::EmbeddingOps;
use rusting_brain_core::ops::embedding::check_embedding;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/embedding.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) = ("embedding", &["embedding_forward", "embedding_backward"]);

pub(super) fn embedding_forward(
    be: &CudaBackend, out: &mut CudaBuffer, table: &CudaBuffer, ids: &[u32], vocab: usize, dim: usize,
) -> Result<()> {
    check_embedding("embedding_forward", ["table", "out"], table.len, out.len, ids, vocab, dim)?;
    if ids.is_empty() || dim == 0 {
        return Ok(());
    }
    let idg = be.upload_u32(ids)?;
    let (r, d) = (i32_of("rows", ids.len())?, i32_of("dim", dim)?);
    launch!(be, "embedding_forward", grid(ids.len() * dim); &mut out.data, &table.data, &idg, &r, &d)
}

pub(super) fn embedding_backward(
    be: &CudaBackend, dtable: &mut CudaBuffer, dout: &CudaBuffer, ids: &[u32], vocab: usize, dim: usize,
) -> Result<()> {
    check_embedding("embedding_backward", ["dtable", "dout"], dtable.len, dout.len, ids, vocab, dim)?;
    if ids.is_empty() || dim == 0 {
        return Ok(());
    }
    // Rows grouped by id on the host (a stable sort keeps each id's rows in order), so
    // the kernel is parallel over (id, column) and still adds in a fixed order.
    let mut order: Vec<u32> = (0..ids.len() as u32).collect();
    order.sort_by_key(|&r| ids[r as usize]);
    let (mut uniq, mut offsets) = (Vec::new(), Vec::new());
    for (p, &r) in order.iter().enumerate() {
        let id = ids[r as usize];
        if uniq.last() != Some(&id) {
            uniq.push(id);
            offsets.push(p as u32);
        }
    }
    offsets.push(order.len() as u32);
    let (ug, og, pg) = (be.upload_u32(&uniq)?, be.upload_u32(&offsets)?, be.upload_u32(&order)?);
    let (nu, d) = (i32_of("ids", uniq.len())?, i32_of("dim", dim)?);
    launch!(be, "embedding_backward", grid(uniq.len() * dim);
        &mut dtable.data, &dout.data, &ug, &og, &pg, &nu, &d)
}

impl EmbeddingOps for CudaBackend {
    fn embedding_forward(
        &self, out: &mut CudaBuffer, table: &CudaBuffer, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()> {
        embedding_forward(self, out, table, ids, vocab, dim)
    }
    fn embedding_backward(
        &self, dtable: &mut CudaBuffer, dout: &CudaBuffer, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()> {
        embedding_backward(self, dtable, dout, ids, vocab, dim)
    }
}
