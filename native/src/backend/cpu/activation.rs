//! The activation family on this backend.

use crate::backend::cpu::dense;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::ActivationOps;
use rusting_brain_core::Activation;
use rusting_brain_core::Result;

impl ActivationOps for CpuBackend {
    fn activation_forward(
        &self, act: Activation, out: &mut Vec<f32>, inp: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        dense::activation_forward(act, out, inp, rows, cols)
    }
    fn activation_backward(
        &self, act: Activation, dinp: &mut Vec<f32>, dout: &Vec<f32>, inp: &Vec<f32>, out: &Vec<f32>,
        rows: usize, cols: usize,
    ) -> Result<()> {
        dense::activation_backward(act, dinp, dout, inp, out, rows, cols)
    }
}
