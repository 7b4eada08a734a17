//! The weighted combine of a mixture-of-experts layer on the CPU. Twin of
//! `rusting_brain_core::ops::moe`.
//!
//! The forward pass runs over output tokens (each reads its `top_k` rows through the
//! inverse permutation), the backward pass over grouped rows, so no two tasks write the
//! same memory and the sums are taken in the reference's order.

use rayon::prelude::*;
use rusting_brain_core::error::check_len;
use rusting_brain_core::ops::moe::check_combine;
use rusting_brain_core::Result;

use super::simd;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::MoeOps;

pub fn moe_combine(
    out: &mut [f32], y: &[f32], row_of_slot: &[u32], weight: &[f32], top_k: usize, dim: usize,
) -> Result<()> {
    check_combine("moe_combine", out.len(), y.len(), row_of_slot, weight, top_k, dim)?;
    out.par_chunks_mut(dim).enumerate().with_min_len(16).for_each(|(t, o)| {
        for slot in t * top_k..(t + 1) * top_k {
            let r = row_of_slot[slot] as usize;
            simd::axpy(o, weight[slot], &y[r * dim..(r + 1) * dim]);
        }
    });
    Ok(())
}

pub fn moe_combine_backward(
    dy: &mut [f32], dout: &[f32], y: &[f32], row_of_slot: &[u32], weight: &[f32], top_k: usize, dim: usize,
) -> Result<Vec<f32>> {
    const OP: &str = "moe_combine_backward";
    let n = check_combine(OP, dout.len(), y.len(), row_of_slot, weight, top_k, dim)?;
    check_len(OP, "dy", dy.len(), y.len())?;
    // Token and slot of each grouped row, so the work can run over rows.
    let mut slot_of_row = vec![0usize; n * top_k];
    for (slot, &r) in row_of_slot.iter().enumerate() {
        slot_of_row[r as usize] = slot;
    }
    let mut dweight = vec![0.0f32; n * top_k];
    let per_row: Vec<f32> = dy
        .par_chunks_mut(dim)
        .enumerate()
        .with_min_len(16)
        .map(|(r, d)| {
            let slot = slot_of_row[r];
            let g = &dout[(slot / top_k) * dim..(slot / top_k + 1) * dim];
            for (di, &gi) in d.iter_mut().zip(g) {
                *di = weight[slot] * gi;
            }
            simd::dot(g, &y[r * dim..(r + 1) * dim])
        })
        .collect();
    for (r, v) in per_row.into_iter().enumerate() {
        dweight[slot_of_row[r]] = v;
    }
    Ok(dweight)
}

impl MoeOps for CpuBackend {
    fn moe_combine(
        &self, out: &mut Vec<f32>, y: &Vec<f32>, row_of_slot: &[u32], weight: &[f32], top_k: usize,
        dim: usize,
    ) -> Result<()> {
        moe_combine(out, y, row_of_slot, weight, top_k, dim)
    }
    fn moe_combine_backward(
        &self, dy: &mut Vec<f32>, dout: &Vec<f32>, y: &Vec<f32>, row_of_slot: &[u32], weight: &[f32],
        top_k: usize, dim: usize,
    ) -> Result<Vec<f32>> {
        moe_combine_backward(dy, dout, y, row_of_slot, weight, top_k, dim)
    }
}
