//! Rotary position embedding on CUDA (`kernels/cu/rope.cu`); twin of
//! `rusting_brain_core::ops::rope`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::RopeOps;
use rusting_brain_core::backend::RopeSpec;
use rusting_brain_core::Result;

/// The kernels of `kernels/cu/rope.cu` this family launches, loaded when the backend starts
/// (a missing one is an error then, not at the first step).
pub(super) const KERNELS: (&str, &[&str]) = ("rope", &["rope_forward", "rope_backward"]);

/// The kernels' shape arguments, after the spec is checked against `x`; `None` when there
/// is nothing to turn.
fn dims(x: &CudaBuffer, spec: &RopeSpec, op: &'static str) -> Result<Option<[i32; 5]>> {
    spec.check(op, x.len)?;
    if x.len == 0 {
        return Ok(None);
    }
    Ok(Some([
        i32_of("batch", spec.batch)?,
        i32_of("seq", spec.seq)?,
        i32_of("heads", spec.heads)?,
        i32_of("head_dim", spec.head_dim)?,
        i32_of("pos_offset", spec.pos_offset)?,
    ]))
}

pub(super) fn rope_forward(be: &CudaBackend, x: &mut CudaBuffer, spec: &RopeSpec) -> Result<()> {
    let Some(d) = dims(x, spec, "rope_forward")? else {
        return Ok(());
    };
    let (kind, k) = spec.scaling.kernel_constants();
    launch!(be, "rope_forward", grid(x.len / 2);
        &mut x.data, &d[0], &d[1], &d[2], &d[3], &d[4], &spec.theta,
        &kind, &k[0], &k[1], &k[2], &k[3], &k[4], &k[5])
}

pub(super) fn rope_backward(be: &CudaBackend, dx: &mut CudaBuffer, spec: &RopeSpec) -> Result<()> {
    let Some(d) = dims(dx, spec, "rope_backward")? else {
        return Ok(());
    };
    let (kind, k) = spec.scaling.kernel_constants();
    launch!(be, "rope_backward", grid(dx.len / 2);
        &mut dx.data, &d[0], &d[1], &d[2], &d[3], &d[4], &spec.theta,
        &kind, &k[0], &k[1], &k[2], &k[3], &k[4], &k[5])
}

impl RopeOps for CudaBackend {
    fn rope_forward(&self, x: &mut CudaBuffer, spec: &RopeSpec) -> Result<()> {
        rope_forward(self, x, spec)
    }
    fn rope_backward(&self, dx: &mut CudaBuffer, spec: &RopeSpec) -> Result<()> {
        rope_backward(self, dx, spec)
    }
}
