//! The activation family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::ActivationOps;
use rusting_brain_core::ops::activation;
use rusting_brain_core::Activation;
use rusting_brain_core::Result;

impl ActivationOps for PortableBackend {
    fn activation_forward(
        &self, act: Activation, out: &mut Vec<f32>, inp: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        activation::activation_forward(act, out, inp, rows, cols)
    }
    fn activation_backward(
        &self, act: Activation, dinp: &mut Vec<f32>, dout: &Vec<f32>, inp: &Vec<f32>, out: &Vec<f32>,
        rows: usize, cols: usize,
    ) -> Result<()> {
        activation::activation_backward(act, dinp, dout, inp, out, rows, cols)
    }
}
