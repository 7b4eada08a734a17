//! Sums of squares for the global gradient norm on CUDA (`kernels/cu/l2norm.cu`); twin of
//! `rusting_brain_core::ops::l2norm`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::L2normOps;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/l2norm.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) = ("l2norm", &["sum_of_squares"]);

impl CudaBackend {
    pub(super) fn sum_of_squares_into(
        &self, partials: &mut CudaSlice<f32>, slot: usize, x: &CudaBuffer,
    ) -> Result<()> {
        let mut view = partials.slice_mut(slot * REDUCE_BLOCKS..(slot + 1) * REDUCE_BLOCKS);
        launch!(self, "sum_of_squares", Self::reduce_cfg(x.len); &mut view, &x.data, &(x.len as i64))
    }
}

pub(super) fn sum_of_squares(be: &CudaBackend, x: &CudaBuffer) -> Result<f64> {
    be.sum_of_squares_many(&[x])
}

pub(super) fn sum_of_squares_many(be: &CudaBackend, xs: &[&CudaBuffer]) -> Result<f64> {
    // One partials slot range per tensor, one download for all: the global norm costs
    // one host round trip, not one per parameter.
    let mut guard = be.dev.partials.lock().map_err(|_| dev_err("scratch lock poisoned"))?;
    let slots = xs.len().max(1) * REDUCE_BLOCKS;
    let partials = be.scratch(&mut guard, slots, "reduction scratch")?;
    let mut zero = partials.slice_mut(0..slots);
    be.dev.stream.memset_zeros(&mut zero).map_err(drv("clearing partial sums"))?;
    for (i, x) in xs.iter().enumerate() {
        if x.len > 0 {
            be.sum_of_squares_into(partials, i, x)?;
        }
    }
    be.reduce_host(partials, slots)
}

impl L2normOps for CudaBackend {
    fn sum_of_squares(&self, x: &CudaBuffer) -> Result<f64> {
        sum_of_squares(self, x)
    }
    fn sum_of_squares_many(&self, xs: &[&CudaBuffer]) -> Result<f64> {
        sum_of_squares_many(self, xs)
    }
}
