//! The device side of sampling (`argmax.wgsl`, `penalize.wgsl`, `topk.wgsl`); twin of
//! `rusting_brain_core::sampler`.

use super::*;

const ARGMAX: Kernel = kernel!(
    "argmax",
    { rows: u32, cols: u32, pad0: u32, pad1: u32 },
    [read logits: f32, read_write ids: u32]
);
const PENALIZE: Kernel = kernel!(
    "penalize",
    { n_ids: u32, penalty: f32, pad0: u32, pad1: u32 },
    [read ids: u32, read_write logits: f32]
);
const TOPK: Kernel = kernel!(
    "topk",
    { cols: u32, k: u32, pad0: u32, pad1: u32 },
    [read logits: f32, read_write scratch: f32, read_write top_ids: u32,
         read_write top_vals: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[ARGMAX, PENALIZE, TOPK];

impl Batch<'_> {
    /// `ids[r]` = the index of row r's largest value (ties: the lower index).
    pub fn argmax(
        &mut self, ids: &GpuBuffer, logits: &GpuBuffer, rows: usize, cols: usize,
    ) -> Result<(), ShaderError> {
        need("argmax", "logits", logits, rows * cols)?;
        need("argmax", "ids", ids, rows)?;
        if rows > MAX_GROUPS {
            return Err(ShaderError::Invalid(format!("argmax: {rows} rows, over {MAX_GROUPS}")));
        }
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        self.dispatch(&ARGMAX, &[u(rows, "rows")?, u(cols, "cols")?], &[logits, ids], (rows as u32, 1))?;
        Ok(())
    }

    /// The repetition penalty on one row of `logits`, in place, at `n_ids` distinct ids
    /// (all inside the row; see [`context_ids`]).
    pub fn penalize(
        &mut self, logits: &GpuBuffer, ids: &GpuBuffer, n_ids: usize, penalty: f32,
    ) -> Result<(), ShaderError> {
        need("penalize", "ids", ids, n_ids)?;
        if n_ids == 0 || penalty == 1.0 {
            return Ok(());
        }
        self.dispatch(
            &PENALIZE,
            &[u(n_ids, "ids")?, penalty.to_bits()],
            &[ids, logits],
            grid(n_ids.div_ceil(WG)),
        )?;
        Ok(())
    }

    /// The `k` largest values of `logits` (one row of `cols`), most likely first, ties to
    /// the lower index: ids into `top_ids`, values into `top_vals`; `scratch` holds a copy.
    pub fn topk(
        &mut self, top_ids: &GpuBuffer, top_vals: &GpuBuffer, scratch: &GpuBuffer, logits: &GpuBuffer,
        cols: usize, k: usize,
    ) -> Result<(), ShaderError> {
        need("topk", "logits", logits, cols)?;
        need("topk", "scratch", scratch, cols)?;
        need("topk", "top_ids", top_ids, k)?;
        need("topk", "top_vals", top_vals, k)?;
        if k == 0 || cols == 0 {
            return Ok(());
        }
        self.dispatch(&TOPK, &[u(cols, "cols")?, u(k, "k")?], &[logits, scratch, top_ids, top_vals], (1, 1))?;
        Ok(())
    }
}

/// The ids a repetition penalty applies to: each id of `context` inside the vocabulary,
/// once, in first-seen order (the core sampler skips ids outside the row, and penalizes
/// each id once however often it occurs).
pub fn context_ids(context: &[u32], vocab: usize) -> Vec<u32> {
    let mut seen = vec![false; vocab];
    context
        .iter()
        .copied()
        .filter(|&id| seen.get_mut(id as usize).is_some_and(|s| !std::mem::replace(s, true)))
        .collect()
}

/// What an argmax or top-k id means when it is not an index: NaN in the row.
pub const NAN_ROW: u32 = 0xffff_fffe;

/// A top-k slot with nothing left to rank (fewer finite values than k).
pub const NO_ID: u32 = 0xffff_ffff;

/// Token ids the host hands the GPU, checked against the vocabulary.
pub fn check_ids(ids: &[u32], vocab: usize) -> Result<(), ShaderError> {
    rusting_brain_core::ops::embedding::check_ids("gpu embedding", ids, vocab)?;
    Ok(())
}
