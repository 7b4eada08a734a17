//! The unary family on this backend.

use crate::backend::cpu::elementwise;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::Unary;
use rusting_brain_core::backend::UnaryOps;
use rusting_brain_core::Result;

impl UnaryOps for CpuBackend {
    fn unary(&self, op: Unary, out: &mut Vec<f32>, inp: &Vec<f32>) -> Result<()> {
        elementwise::unary(op, out, inp)
    }
    fn gated(&self, op: Unary, out: &mut Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>) -> Result<()> {
        elementwise::gated(op, out, gate, up)
    }
}
