//! f32 embedding lookup and its deterministic backward (`embedding.wgsl`,
//! `embedding_backward.wgsl`); twin of `rusting_brain_core::ops::embedding`. The int8 lookup
//! is in `q8.rs`.

use super::*;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::EmbeddingOps;
use rusting_brain_core::Result;

const EMBEDDING: Kernel = kernel!(
    "embedding",
    { rows: u32, dim: u32, pad0: u32, pad1: u32 },
    [read ids: u32, read table: f32, read_write out: f32]
);
const EMBEDDING_BACKWARD: Kernel = kernel!(
    "embedding_backward",
    { n_ids: u32, dim: u32, pad0: u32, pad1: u32 },
    [read groups: u32, read dout: f32, read_write dtable: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[EMBEDDING, EMBEDDING_BACKWARD];

impl Batch<'_> {
    /// `out[r] = table[ids[r]]`, rows of `dim`; ids must be in range (checked by the caller).
    pub fn embedding(
        &mut self, out: &GpuBuffer, ids: &GpuBuffer, table: &GpuBuffer, rows: usize, dim: usize,
    ) -> Result<(), ShaderError> {
        need("embedding", "ids", ids, rows)?;
        need("embedding", "out", out, rows * dim)?;
        if rows * dim == 0 {
            return Ok(());
        }
        self.dispatch(
            &EMBEDDING,
            &[u(rows, "rows")?, u(dim, "dim")?],
            &[ids, table, out],
            grid((rows * dim).div_ceil(WG)),
        )?;
        Ok(())
    }

    /// `dtable[id] += dout[position]` for every position of every id, from the grouping
    /// `embedding_groups` made on the host.
    pub fn embedding_backward(
        &mut self, dtable: &GpuBuffer, groups: &GpuBuffer, n_ids: usize, dout: &GpuBuffer, dim: usize,
    ) -> Result<(), ShaderError> {
        need("embedding_backward", "groups", groups, 2 * n_ids + 1)?;
        if n_ids * dim == 0 {
            return Ok(());
        }
        self.dispatch(
            &EMBEDDING_BACKWARD,
            &[u(n_ids, "ids")?, u(dim, "dim")?],
            &[groups, dout, dtable],
            grid((n_ids * dim).div_ceil(WG)),
        )?;
        Ok(())
    }
}

/// The positions of `ids` grouped by id for [`Batch::embedding_backward`]: the distinct ids
/// in first-seen order, `n_ids + 1` offsets, then the positions of each id in order, as one
/// list of words. Returns (words, number of distinct ids).
pub fn embedding_groups(ids: &[u32], vocab: usize) -> (Vec<u32>, usize) {
    let mut slot = vec![u32::MAX; vocab];
    let mut distinct: Vec<u32> = Vec::new();
    let mut counts: Vec<u32> = Vec::new();
    for &id in ids {
        let s = &mut slot[id as usize];
        if *s == u32::MAX {
            *s = distinct.len() as u32;
            distinct.push(id);
            counts.push(0);
        }
        counts[*s as usize] += 1;
    }
    let n = distinct.len();
    let mut words = Vec::with_capacity(2 * n + 1 + ids.len());
    words.extend_from_slice(&distinct);
    let mut at = 0u32;
    for &c in &counts {
        words.push(at);
        at += c;
    }
    words.push(at);
    let mut next: Vec<u32> = words[n..2 * n].to_vec();
    words.resize(2 * n + 1 + ids.len(), 0);
    for (p, &id) in ids.iter().enumerate() {
        let s = slot[id as usize] as usize;
        words[2 * n + 1 + next[s] as usize] = p as u32;
        next[s] += 1;
    }
    (words, n)
}

impl EmbeddingOps for WgpuBackend {
    fn embedding_forward(
        &self, out: &mut GpuBuffer, table: &GpuBuffer, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()> {
        rusting_brain_core::ops::embedding::check_embedding(
            "embedding_forward",
            ["table", "out"],
            table.len(),
            out.len(),
            ids,
            vocab,
            dim,
        )?;
        self.record(|b, pools| {
            let ids_buf = pools.stage(ids)?;
            b.embedding(out, &ids_buf, table, ids.len(), dim)
        })
    }
    fn embedding_backward(
        &self, dtable: &mut GpuBuffer, dout: &GpuBuffer, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()> {
        rusting_brain_core::ops::embedding::check_embedding(
            "embedding_backward",
            ["dtable", "dout"],
            dtable.len(),
            dout.len(),
            ids,
            vocab,
            dim,
        )?;
        let (groups, n_ids) = embedding_groups(ids, vocab);
        self.record(|b, pools| {
            let groups = pools.stage(&groups)?;
            b.embedding_backward(dtable, &groups, n_ids, dout, dim)
        })
    }
}
