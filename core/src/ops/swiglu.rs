//! SiLU and the SwiGLU gate of a Llama feed-forward: `out = silu(gate) * up`.

use crate::backend::Memory;
use crate::error::check_len;
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{Real, Result};
use alloc::vec::Vec;

/// 1 / (1 + e^-x), without overflow for large |x|.
pub fn sigmoid<T: Real>(x: T) -> T {
    // Both branches avoid exp of a large positive number, so neither overflows.
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

/// x * sigmoid(x).
pub fn silu<T: Real>(x: T) -> T {
    x * sigmoid(x)
}

/// d silu / dx = s(x) * (1 + x * (1 - s(x))).
pub fn silu_grad<T: Real>(x: T) -> T {
    let s = sigmoid(x);
    s * (T::ONE + x * (T::ONE - s))
}

/// out = silu(inp), element-wise.
pub fn silu_forward<T: Real>(out: &mut [T], inp: &[T]) -> Result<()> {
    check_len("silu_forward", "out", out.len(), inp.len())?;
    for (o, &x) in out.iter_mut().zip(inp) {
        *o = silu(x);
    }
    Ok(())
}

/// dinp = dout * silu'(inp) (overwritten).
pub fn silu_backward<T: Real>(dinp: &mut [T], dout: &[T], inp: &[T]) -> Result<()> {
    check_len("silu_backward", "dinp", dinp.len(), inp.len())?;
    check_len("silu_backward", "dout", dout.len(), inp.len())?;
    for i in 0..inp.len() {
        dinp[i] = dout[i] * silu_grad(inp[i]);
    }
    Ok(())
}

/// The shape contract of `swiglu_forward`: every buffer as long as `gate`.
pub fn check_swiglu_forward(out: usize, gate: usize, up: usize) -> Result<()> {
    check_len("swiglu_forward", "up", up, gate)?;
    check_len("swiglu_forward", "out", out, gate)
}

/// The shape contract of `swiglu_backward`: every buffer as long as `gate`.
pub fn check_swiglu_backward(dgate: usize, dup: usize, dout: usize, gate: usize, up: usize) -> Result<()> {
    for (what, len) in [("up", up), ("dout", dout), ("dgate", dgate), ("dup", dup)] {
        check_len("swiglu_backward", what, len, gate)?;
    }
    Ok(())
}

/// out = silu(gate) * up, element-wise; all the same length.
pub fn swiglu_forward<T: Real>(out: &mut [T], gate: &[T], up: &[T]) -> Result<()> {
    check_swiglu_forward(out.len(), gate.len(), up.len())?;
    for i in 0..gate.len() {
        out[i] = silu(gate[i]) * up[i];
    }
    Ok(())
}

/// dgate = dout * up * silu'(gate), dup = dout * silu(gate) (both overwritten).
pub fn swiglu_backward<T: Real>(
    dgate: &mut [T], dup: &mut [T], dout: &[T], gate: &[T], up: &[T],
) -> Result<()> {
    check_swiglu_backward(dgate.len(), dup.len(), dout.len(), gate.len(), up.len())?;
    for i in 0..gate.len() {
        dgate[i] = dout[i] * up[i] * silu_grad(gate[i]);
        dup[i] = dout[i] * silu(gate[i]);
    }
    Ok(())
}

/// The SwiGLU gate `silu(gate) * up`, forward and backward: see [`crate::ops::swiglu`].
pub trait SwigluOps: Memory {
    /// `out = silu(gate) * up`.
    fn swiglu_forward(&self, out: &mut Self::Buffer, gate: &Self::Buffer, up: &Self::Buffer) -> Result<()>;
    /// SwiGLU's backward: the gradients of `gate` and `up` (overwritten).
    fn swiglu_backward(
        &self, dgate: &mut Self::Buffer, dup: &mut Self::Buffer, dout: &Self::Buffer, gate: &Self::Buffer,
        up: &Self::Buffer,
    ) -> Result<()>;
}

impl SwigluOps for ReferenceBackend {
    fn swiglu_forward(&self, out: &mut Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>) -> Result<()> {
        in_f64([out], |[o]| swiglu_forward(o, &wide(gate), &wide(up)))
    }
    fn swiglu_backward(
        &self, dgate: &mut Vec<f32>, dup: &mut Vec<f32>, dout: &Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>,
    ) -> Result<()> {
        in_f64([dgate, dup], |[dg, du]| swiglu_backward(dg, du, &wide(dout), &wide(gate), &wide(up)))
    }
}
