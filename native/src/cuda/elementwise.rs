//! `axpy` and `scale` on CUDA (`kernels/cu/elementwise.cu`); twins in
//! `rusting_brain_core::ops::elementwise`.

use super::*;

pub(super) fn axpy(be: &CudaBackend, y: &mut CudaBuffer, alpha: f32, x: &CudaBuffer) -> Result<()> {
    check_len("axpy", "x", x.len, y.len)?;
    let n = y.len;
    if n == 0 {
        return Ok(());
    }
    launch!(be, "axpy", grid(n); &mut y.data, &alpha, &x.data, &(n as i64))
}

pub(super) fn scale(be: &CudaBackend, x: &mut CudaBuffer, alpha: f32) -> Result<()> {
    let n = x.len;
    if n == 0 {
        return Ok(());
    }
    launch!(be, "scale", grid(n); &mut x.data, &alpha, &(n as i64))
}
