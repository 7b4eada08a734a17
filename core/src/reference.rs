//! The reference backend: [`crate::ops`] on `Vec<f32>`, single-threaded. It is the
//! definition the other backends are tested against, and it runs anywhere `alloc` does.
//!
//! Every primitive that sums (matmul, norms, softmax, attention, losses, gradient
//! accumulation) runs in f64 on the f32 inputs and rounds once at the end, so the
//! reference is the exact answer to within one f32 rounding, whatever the summation order.
//! A backend's distance from it is then its own error alone, and tolerances can be tight.
//! The purely element-wise updates (optimizers, axpy, scale, bias add) run in f32: they do
//! not accumulate, and keeping them in f32 lets backends match them bit for bit.

use alloc::vec::Vec;

use crate::Result;

pub(crate) fn wide(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

pub(crate) fn narrow(dst: &mut [f32], src: &[f64]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s as f32;
    }
}

/// Runs `f` on f64 copies of the outputs (`outs`, read first so accumulating outputs
/// keep their values) and writes the rounded results back.
pub(crate) fn in_f64<const N: usize, R>(
    outs: [&mut Vec<f32>; N], f: impl FnOnce(&mut [Vec<f64>; N]) -> Result<R>,
) -> Result<R> {
    let mut wide_outs: [Vec<f64>; N] = core::array::from_fn(|i| wide(outs[i]));
    let r = f(&mut wide_outs)?;
    for (o, w) in outs.into_iter().zip(wide_outs.iter()) {
        narrow(o, w);
    }
    Ok(r)
}

/// Plain loops on the host; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceBackend;

crate::host_memory!(ReferenceBackend, "reference");
