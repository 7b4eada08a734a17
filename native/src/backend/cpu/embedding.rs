//! Embedding lookup and gradient on the CPU. Twin of `rusting_brain_core::ops::embedding`.
//!
//! The backward pass groups positions by token id (a stable counting sort), so each table
//! row is owned by one task and repeated ids sum in position order, as in the reference.

use rayon::prelude::*;
use rusting_brain_core::ops::embedding::check_embedding;
use rusting_brain_core::Result;

use super::simd;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::EmbeddingOps;

impl EmbeddingOps for CpuBackend {
    fn embedding_forward(
        &self, out: &mut Vec<f32>, table: &Vec<f32>, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()> {
        check_embedding("embedding_forward", ["table", "out"], table.len(), out.len(), ids, vocab, dim)?;
        out.par_chunks_mut(dim).zip(ids.par_iter()).with_min_len(64).for_each(|(o, &id)| {
            let id = id as usize;
            o.copy_from_slice(&table[id * dim..(id + 1) * dim]);
        });
        Ok(())
    }
    fn embedding_backward(
        &self, dtable: &mut Vec<f32>, dout: &Vec<f32>, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()> {
        check_embedding("embedding_backward", ["dtable", "dout"], dtable.len(), dout.len(), ids, vocab, dim)?;
        // CSR layout: positions of id v are order[start[v]..start[v + 1]], in position order.
        let mut start = vec![0usize; vocab + 1];
        for &id in ids {
            start[id as usize + 1] += 1;
        }
        for v in 0..vocab {
            start[v + 1] += start[v];
        }
        let mut fill = start.clone();
        let mut order = vec![0usize; ids.len()];
        for (pos, &id) in ids.iter().enumerate() {
            order[fill[id as usize]] = pos;
            fill[id as usize] += 1;
        }
        dtable.par_chunks_mut(dim).enumerate().with_min_len(256).for_each(|(v, row)| {
            for &pos in &order[start[v]..start[v + 1]] {
                simd::axpy(row, 1.0, &dout[pos * dim..(pos + 1) * dim]);
            }
        });
        Ok(())
    }
}
