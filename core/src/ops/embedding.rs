//! Token embedding lookup and its gradient.

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};
use alloc::vec::Vec;

/// Checks every id against the table size, naming the first bad one.
pub fn check_ids(op: &'static str, ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().position(|&id| id as usize >= vocab) {
        Some(index) => Err(CoreError::IdOutOfRange { op, id: ids[index], index, vocab }),
        None => Ok(()),
    }
}

/// The shape contract of the embedding ops, shared by every backend: a `(vocab, dim)`
/// table, `(ids.len(), dim)` rows, every id below `vocab`. `names` are the table's and the
/// rows' argument names for the message.
pub fn check_embedding(
    op: &'static str, names: [&'static str; 2], table: usize, rows: usize, ids: &[u32], vocab: usize,
    dim: usize,
) -> Result<()> {
    nonzero(op, "dim", dim)?;
    check_len(op, names[0], table, product(op, &[vocab, dim])?)?;
    check_len(op, names[1], rows, product(op, &[ids.len(), dim])?)?;
    check_ids(op, ids, vocab)
}

/// `out: (ids.len(), dim) = table[ids]`; `table: (vocab, dim)`.
pub fn embedding_forward<T: Real>(
    out: &mut [T], table: &[T], ids: &[u32], vocab: usize, dim: usize,
) -> Result<()> {
    check_embedding("embedding_forward", ["table", "out"], table.len(), out.len(), ids, vocab, dim)?;
    for (r, &id) in ids.iter().enumerate() {
        let id = id as usize;
        out[r * dim..(r + 1) * dim].copy_from_slice(&table[id * dim..(id + 1) * dim]);
    }
    Ok(())
}

/// `dtable[ids[r]] += dout[r]` (accumulated; repeated ids sum).
pub fn embedding_backward<T: Real>(
    dtable: &mut [T], dout: &[T], ids: &[u32], vocab: usize, dim: usize,
) -> Result<()> {
    check_embedding("embedding_backward", ["dtable", "dout"], dtable.len(), dout.len(), ids, vocab, dim)?;
    for (r, &id) in ids.iter().enumerate() {
        let id = id as usize;
        for i in 0..dim {
            dtable[id * dim + i] += dout[r * dim + i];
        }
    }
    Ok(())
}

/// Token embeddings, forward and backward: see [`crate::ops::embedding`].
pub trait EmbeddingOps: Memory {
    /// Rows of `table` (`vocab x dim`) for `ids`; an id not below `vocab` is an error.
    fn embedding_forward(
        &self, out: &mut Self::Buffer, table: &Self::Buffer, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()>;
    /// Accumulates.
    fn embedding_backward(
        &self, dtable: &mut Self::Buffer, dout: &Self::Buffer, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()>;
}

impl EmbeddingOps for ReferenceBackend {
    fn embedding_forward(
        &self, out: &mut Vec<f32>, table: &Vec<f32>, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()> {
        embedding_forward(out, table, ids, vocab, dim)
    }
    fn embedding_backward(
        &self, dtable: &mut Vec<f32>, dout: &Vec<f32>, ids: &[u32], vocab: usize, dim: usize,
    ) -> Result<()> {
        in_f64([dtable], |[d]| embedding_backward(d, &wide(dout), ids, vocab, dim))
    }
}
