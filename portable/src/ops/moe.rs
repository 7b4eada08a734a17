//! The moe family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::MoeOps;
use rusting_brain_core::ops::moe;
use rusting_brain_core::Result;

impl MoeOps for PortableBackend {
    fn moe_combine(
        &self, out: &mut Vec<f32>, y: &Vec<f32>, row_of_slot: &[u32], weight: &[f32], top_k: usize,
        dim: usize,
    ) -> Result<()> {
        moe::moe_combine(out, y, row_of_slot, weight, top_k, dim)
    }
    fn moe_combine_backward(
        &self, dy: &mut Vec<f32>, dout: &Vec<f32>, y: &Vec<f32>, row_of_slot: &[u32], weight: &[f32],
        top_k: usize, dim: usize,
    ) -> Result<Vec<f32>> {
        moe::moe_combine_backward(dy, dout, y, row_of_slot, weight, top_k, dim)
    }
}
