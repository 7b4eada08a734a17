//! Token embedding lookup and its gradient.

use crate::error::{check_len, nonzero, product};
use crate::{CoreError, Real, Result};

/// Checks every id against the table size, naming the first bad one.
pub fn check_ids(op: &'static str, ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().position(|&id| id as usize >= vocab) {
        Some(index) => Err(CoreError::IdOutOfRange {
            op,
            id: ids[index],
            index,
            vocab,
        }),
        None => Ok(()),
    }
}

/// out: (ids.len(), dim) = table[ids]; table: (vocab, dim).
pub fn embedding_forward<T: Real>(
    out: &mut [T],
    table: &[T],
    ids: &[u32],
    vocab: usize,
    dim: usize,
) -> Result<()> {
    const OP: &str = "embedding_forward";
    nonzero(OP, "dim", dim)?;
    check_len(OP, "table", table.len(), product(OP, &[vocab, dim])?)?;
    check_len(OP, "out", out.len(), product(OP, &[ids.len(), dim])?)?;
    check_ids(OP, ids, vocab)?;
    for (r, &id) in ids.iter().enumerate() {
        let id = id as usize;
        out[r * dim..(r + 1) * dim].copy_from_slice(&table[id * dim..(id + 1) * dim]);
    }
    Ok(())
}

/// dtable[ids[r]] += dout[r] (accumulated; repeated ids sum).
pub fn embedding_backward<T: Real>(
    dtable: &mut [T],
    dout: &[T],
    ids: &[u32],
    vocab: usize,
    dim: usize,
) -> Result<()> {
    const OP: &str = "embedding_backward";
    nonzero(OP, "dim", dim)?;
    check_len(OP, "dtable", dtable.len(), product(OP, &[vocab, dim])?)?;
    check_len(OP, "dout", dout.len(), product(OP, &[ids.len(), dim])?)?;
    check_ids(OP, ids, vocab)?;
    for (r, &id) in ids.iter().enumerate() {
        let id = id as usize;
        for i in 0..dim {
            dtable[id * dim + i] += dout[r * dim + i];
        }
    }
    Ok(())
}
