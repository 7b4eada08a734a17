//! The softmax family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::SoftmaxOps;
use rusting_brain_core::ops::softmax;
use rusting_brain_core::Result;

impl SoftmaxOps for PortableBackend {
    fn softmax_forward(&self, out: &mut Vec<f32>, inp: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        softmax::softmax_forward(out, inp, rows, cols)
    }
    fn softmax_backward(
        &self, dinp: &mut Vec<f32>, dout: &Vec<f32>, out: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        softmax::softmax_backward(dinp, dout, out, rows, cols)
    }
}
