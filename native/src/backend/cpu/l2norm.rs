//! The l2norm family on this backend.

use crate::backend::cpu::elementwise;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::L2normOps;
use rusting_brain_core::Result;

impl L2normOps for CpuBackend {
    fn sum_of_squares(&self, x: &Vec<f32>) -> Result<f64> {
        Ok(elementwise::sum_of_squares(x))
    }
}
