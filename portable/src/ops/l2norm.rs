//! The l2norm family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::L2normOps;
use rusting_brain_core::ops::l2norm;
use rusting_brain_core::Result;

impl L2normOps for PortableBackend {
    fn sum_of_squares(&self, x: &Vec<f32>) -> Result<f64> {
        Ok(l2norm::sum_of_squares(x))
    }
}
