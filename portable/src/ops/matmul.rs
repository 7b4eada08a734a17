//! The matmul family on this backend.

use crate::kernels;
use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::MatmulOps;
use rusting_brain_core::backend::MatmulSpec;
use rusting_brain_core::Result;

impl MatmulOps for PortableBackend {
    fn matmul(&self, c: &mut Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, spec: &MatmulSpec) -> Result<()> {
        kernels::matmul(c, a, b, spec)
    }
}
