//! The elementwise family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::ElementwiseOps;
use rusting_brain_core::ops::elementwise;
use rusting_brain_core::Result;

impl ElementwiseOps for PortableBackend {
    fn axpy(&self, y: &mut Vec<f32>, alpha: f32, x: &Vec<f32>) -> Result<()> {
        elementwise::axpy(y, alpha, x)
    }
    fn scale(&self, x: &mut Vec<f32>, alpha: f32) -> Result<()> {
        elementwise::scale(x, alpha);
        Ok(())
    }
    fn add_bias(&self, out: &mut Vec<f32>, bias: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        elementwise::add_bias(out, bias, rows, cols)
    }
    fn bias_backward(&self, dbias: &mut Vec<f32>, dout: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        elementwise::bias_backward(dbias, dout, rows, cols)
    }
}
