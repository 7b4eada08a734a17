//! The rope family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::RopeOps;
use rusting_brain_core::backend::RopeSpec;
use rusting_brain_core::Result;

impl RopeOps for PortableBackend {
    fn rope_forward(&self, x: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        crate::rope::rope_forward(x, spec)
    }
    fn rope_backward(&self, dx: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        crate::rope::rope_backward(dx, spec)
    }
}
