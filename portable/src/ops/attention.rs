//! The attention family on this backend.

use crate::kernels;
use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::AttentionOps;
use rusting_brain_core::backend::AttentionSpec;
use rusting_brain_core::Result;

impl AttentionOps for PortableBackend {
    fn attention_forward(
        &self, out: &mut Vec<f32>, lse: &mut Vec<f32>, q: &Vec<f32>, k: &Vec<f32>, v: &Vec<f32>,
        spec: &AttentionSpec,
    ) -> Result<()> {
        kernels::attention_forward(out, lse, q, k, v, spec)
    }
    fn attention_backward(
        &self, dq: &mut Vec<f32>, dk: &mut Vec<f32>, dv: &mut Vec<f32>, dout: &Vec<f32>, q: &Vec<f32>,
        k: &Vec<f32>, v: &Vec<f32>, out: &Vec<f32>, lse: &Vec<f32>, spec: &AttentionSpec,
    ) -> Result<()> {
        rusting_brain_core::ops::attention::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, spec)
    }
}
