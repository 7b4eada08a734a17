//! The swiglu family on this backend.

use crate::kernels;
use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::SwigluOps;
use rusting_brain_core::ops::swiglu;
use rusting_brain_core::Result;

impl SwigluOps for PortableBackend {
    fn swiglu_forward(&self, out: &mut Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>) -> Result<()> {
        kernels::swiglu_forward(out, gate, up)
    }
    fn swiglu_backward(
        &self, dgate: &mut Vec<f32>, dup: &mut Vec<f32>, dout: &Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>,
    ) -> Result<()> {
        swiglu::swiglu_backward(dgate, dup, dout, gate, up)
    }
}
