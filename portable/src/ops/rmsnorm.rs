//! The rmsnorm family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::RmsnormOps;
use rusting_brain_core::ops::rmsnorm;
use rusting_brain_core::Result;

impl RmsnormOps for PortableBackend {
    fn rmsnorm_forward(
        &self, out: &mut Vec<f32>, rstd: &mut Vec<f32>, inp: &Vec<f32>, weight: &Vec<f32>, rows: usize,
        dim: usize, eps: f32,
    ) -> Result<()> {
        rmsnorm::rmsnorm_forward(out, rstd, inp, weight, rows, dim, eps)
    }
    fn rmsnorm_backward(
        &self, dinp: &mut Vec<f32>, dweight: &mut Vec<f32>, dout: &Vec<f32>, inp: &Vec<f32>,
        weight: &Vec<f32>, rstd: &Vec<f32>, rows: usize, dim: usize,
    ) -> Result<()> {
        rmsnorm::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, rows, dim)
    }
}
